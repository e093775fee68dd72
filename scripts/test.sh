#!/usr/bin/env bash
# Lint, then every test (unit tests, then integration tests against a real tritonserver).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check tritonforge tests bench preprocessing postprocessing tensorrt_llm_transformers tensorrt_llm_bls \
    tensorrt_llm_replay_benchmark build_engine.py
# pytest exits 5 when it collected no test: that is a failure here, as any non-zero code is.
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
