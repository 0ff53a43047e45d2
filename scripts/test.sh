#!/usr/bin/env bash
# Install everything, then run the whole test suite (unit + integration + slow).
#
# With no arguments it runs in two parts: the unit tests (no stack: kernels, models, the services'
# modules) spread over every core by pytest-xdist, one test file per worker at a time; then every
# test that starts a stack, a cluster or a host, one at a time (they use the cores themselves, and
# their timeouts assume it). Arguments are passed to one ordinary pytest run instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PYTEST=(.venv/bin/python -m pytest -ra)
if [ $# -gt 0 ]; then
  exec "${PYTEST[@]}" --durations=40 "$@"
fi
UNIT=(tests/kernels tests/gpu_worker tests/scheduler tests/gateway tests/tokenizer tests/cache_index
      tests/grammar tests/simulate tests/benchmarks tests/test_bench_imports.py tests/test_import_cycles.py)
unit_args=()
for path in "${UNIT[@]}"; do unit_args+=(--ignore "$path"); done
status=0
"${PYTEST[@]}" --durations=20 -n "${RADIXMESH_TEST_WORKERS:-auto}" --dist loadfile "${UNIT[@]}" || status=$?
"${PYTEST[@]}" --durations=40 tests "${unit_args[@]}" || status=$?
exit "$status"
