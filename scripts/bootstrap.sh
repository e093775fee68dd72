#!/usr/bin/env bash
# Create .venv (once) and install tritonforge with the Triton 2.51 server bundle and the test tools.
# torch is pinned to the CPU build that these machines carry on disk; a bare "torch" would pull CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import tritonforge, torch, pytriton, fastapi, uvloop, httptools, openai, helm_python, kubernetes_validate, mkdocs, material" 2>/dev/null; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[server,test,bench,openai]"
fi
