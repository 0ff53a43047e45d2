#!/bin/sh
# Container entrypoint of the radixmesh image.
#   <service> [flags]   python -m services.<service> (gateway, tokenizer, cache_index, scheduler, gpu_worker)
#   models [model]      prepare the model into $RADIXMESH_CACHE (progress in the log), then exit
#   health [service]    the container health check (python -m radixmesh.health)
#   anything else       run as a command
set -eu

case "${1:-}" in
  gateway|tokenizer|cache_index|scheduler|gpu_worker)
    service=$1
    shift
    # NOTE: radixmesh.health.container_instance() derives the same id: keep them in step.
    host=$(printf '%s' "${HOSTNAME:-$(cat /proc/sys/kernel/hostname)}" | tr -c 'A-Za-z0-9_-' '-')
    RADIXMESH_INSTANCE=${RADIXMESH_INSTANCE:-$service-$host}
    export RADIXMESH_INSTANCE
    exec python -m "services.$service" "$@"
    ;;
  models)
    shift
    exec python -m libs.models "$@"
    ;;
  health)
    shift
    exec python -m radixmesh.health "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
