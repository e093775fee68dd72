#!/usr/bin/env bash
# Create .venv (once) and install tritonforge with the Triton 2.51 server bundle and the test tools.
# torch is pinned to the CPU build that these machines carry on disk; a bare "torch" would pull CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $PYTHON" >&2
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import tritonforge, torch, xgrammar, accelerate, gguf, pytriton, fastapi, uvloop, httptools, openai, agents, langchain_openai, helm_python, kubernetes_validate, mkdocs, material, xdist" 2>/dev/null; then
  echo "bootstrap: installing into .venv (pip, torch for CPUs, tritonforge and its Triton server bundle; a few minutes)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  echo "bootstrap: torch" >&2
  .venv/bin/python -m pip install -q "torch==2.13.0"
  echo "bootstrap: tritonforge (editable) with its server, test, bench and openai extras" >&2
  .venv/bin/python -m pip install -q -e ".[server,test,bench,openai]"
  echo "bootstrap: done; the commands are .venv/bin/tritonforge and .venv/bin/python build_engine.py" >&2
fi
