#!/usr/bin/env bash
# The pipeline measurement on a GPU machine, perf_analyzer as the load generator: the replay engine at a
# TensorRT-LLM token rate (as built, then with more Python-step instances for 16 CPU cores), then a
# ~1B-parameter Llama (random weights, bf16) on the transformers engine.
# Needs tritonserver and perf_analyzer on PATH and this tree importable by the server's Python stub.
# Usage: bash bench/gpu.sh RESULTS_DIR [extra bench/pipeline.py options]
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-bench/results}; shift || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -u bench/pipeline.py --engines replay --tool perf_analyzer --duration-s 3 \
  --name pipeline-gpu-replay --results-dir "$results" "$@"
python3 -u bench/pipeline.py --engines replay --tool perf_analyzer --duration-s 3 --concurrency 32,128 \
  --preprocessing-instances 4 --postprocessing-instances 8 --bls-instances 4 \
  --name pipeline-gpu-replay-tuned --results-dir "$results" "$@"
python3 -u bench/pipeline.py --engines transformers --model-size 1b --dtype bfloat16 --tool perf_analyzer \
  --duration-s 3 --name pipeline-gpu-transformers --results-dir "$results" "$@"
