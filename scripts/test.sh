#!/usr/bin/env bash
# Lint, then every test (unit tests, then integration tests against a real tritonserver), then the
# tokenizer-dependent tests again on the transformers of NVIDIA's container (scripts/container-transformers.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check tritonforge tests bench scripts preprocessing postprocessing tensorrt_llm_transformers \
    tensorrt_llm_bls tensorrt_llm_replay_benchmark tensorrt_llm_pytorch build_engine.py
CONTAINER_TRANSFORMERS=.venv-container-transformers
# Installed again whenever the list changes: the marker holds the list it was installed from.
if ! cmp -s scripts/container-transformers.txt "$CONTAINER_TRANSFORMERS/.installed"; then
  rm -rf "$CONTAINER_TRANSFORMERS"
  .venv/bin/python -m pip install -q --no-deps --target "$CONTAINER_TRANSFORMERS" -r scripts/container-transformers.txt
  cp scripts/container-transformers.txt "$CONTAINER_TRANSFORMERS/.installed"
fi
export TRITONFORGE_CONTAINER_TRANSFORMERS="$PWD/$CONTAINER_TRANSFORMERS"
# pytest exits 5 when it collected no test: that is a failure here, as any non-zero code is.
# A line per test module as it ends, with the run's progress (tests/progress.py), instead of a dot per test; the
# reason of every skip (-rs: what is missing) and the slowest tests (--durations) at the end.
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider -p tests.progress -rs --durations=15)
if [ $# -gt 0 ]; then
  exec "${PYTEST[@]}" "$@"
fi
# TEST_WORKERS=N (one more than the cores by default: tests wait on servers): the suite in N processes, a test
# module per process at a time (a module's servers start once; tests/conftest.py keeps the modules on the
# session's shared servers in one process, hands out the longest modules first and has the processes load their
# servers one at a time), and beside it, in a process of its own, the tokenizer-dependent tests again on the
# container's transformers (tests/conftest.py marks them), reported after the suite.
# TEST_WORKERS=1: one process, one pass after the other.
# `bash scripts/test.sh tests/...` runs what it names, in one process.
WORKERS=${TEST_WORKERS:-$(( $(nproc) + 1 ))}
# test_container_transformers compares the running transformers with the container's: there they are one.
CONTAINER_PASS=("${PYTEST[@]}" -m transformers tests/unit tests/integration/test_ensemble.py
                --deselect tests/unit/builder/test_container_transformers.py)
CONTAINER_TITLE="--- again on the container's transformers ($(grep '^transformers' scripts/container-transformers.txt)) ---"
if [ "$WORKERS" -le 1 ]; then
  "${PYTEST[@]}"
  echo "$CONTAINER_TITLE"
  PYTHONPATH="$TRITONFORGE_CONTAINER_TRANSFORMERS" "${CONTAINER_PASS[@]}"
  exit 0
fi
CONTAINER_LOG=$(mktemp --suffix=.container-transformers.log)
PYTHONPATH="$TRITONFORGE_CONTAINER_TRANSFORMERS" "${CONTAINER_PASS[@]}" > "$CONTAINER_LOG" 2>&1 &
CONTAINER_PID=$!
# A run stopped from outside stops that pass too; its log goes either way.
trap 'kill "$CONTAINER_PID" 2>/dev/null || true; rm -f "$CONTAINER_LOG"' EXIT
SUITE_STATUS=0
"${PYTEST[@]}" -n "$WORKERS" --dist loadfile || SUITE_STATUS=$?
CONTAINER_STATUS=0
wait "$CONTAINER_PID" || CONTAINER_STATUS=$?
echo "$CONTAINER_TITLE"
cat "$CONTAINER_LOG"
if [ "$SUITE_STATUS" -ne 0 ]; then exit "$SUITE_STATUS"; fi
exit "$CONTAINER_STATUS"
