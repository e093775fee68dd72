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
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ $# -gt 0 ]; then
  exec "${PYTEST[@]}" "$@"
fi
# TEST_WORKERS=N: the suite in N processes, a test module per process at a time (a module's servers stay in
# its process), then the fault-injection module alone (its probes and restarts are timed against heartbeats
# that a loaded machine delays). One by default. On the 2-core CI machine TEST_WORKERS=4 took the suite from
# 10-11 to 8 min, CPU-bound (about 800 CPU-s; 17% idle); server starts that Triton 2.51's Python backend
# wedged under that load are now found and made again (TritonServer.start), but in two of four such runs a
# server of test_serve_lifecycle aborted at its start (an uncaught boost::interprocess::lock_exception in
# tritonserver), which no serial run has shown: the cause is not found yet.
# `bash scripts/test.sh tests/...` runs what it names, in one process.
WORKERS=()
if [ "${TEST_WORKERS:-1}" -gt 1 ]; then
  WORKERS=(-n "$TEST_WORKERS" --dist loadfile)
  FAULTS=tests/integration/test_faults.py
  "${PYTEST[@]}" "${WORKERS[@]}" --ignore="$FAULTS"
  "${PYTEST[@]}" "$FAULTS"
else
  "${PYTEST[@]}"
fi
echo "--- again on the container's transformers ($(grep '^transformers' scripts/container-transformers.txt)) ---"
# The tests that run transformers or tokenizers code (tests/conftest.py marks them), unit and ensemble.
PYTHONPATH="$TRITONFORGE_CONTAINER_TRANSFORMERS" "${PYTEST[@]}" "${WORKERS[@]}" -m transformers \
    tests/unit tests/integration/test_ensemble.py
