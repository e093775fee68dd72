#!/usr/bin/env bash
# The pipeline measurement on the GPU machine (16 cores), perf_analyzer as the load generator, against the
# replay engine at a real engine's rate: 8 Python engine-step instances sharing a batch of 128 at 8.5 ms a
# step (~15k tokens/s). Profiles each point (CPU by process, Triton's statistics; py-spy stacks at the
# largest concurrency when py-spy is on PATH).
# Needs tritonserver and perf_analyzer on PATH and this tree importable by the server's Python stub.
# Usage: bash bench/gpu.sh RESULTS_DIR [extra bench/pipeline.py options]
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-bench/results}; shift || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -u bench/pipeline.py --engines replay --tool perf_analyzer --engine-instances 8 --engine-max-batch-size 128 \
  --concurrency 1,8,32,128,256 --duration-s 4 --name pipeline-gpu-replay --results-dir "$results" \
  --stacks-dir "$results/stacks" "$@"
