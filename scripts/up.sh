#!/usr/bin/env bash
# Install everything, then start the local stack on the default model (Ctrl-C stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/radixmesh up "$@"
