#!/usr/bin/env bash
# The pipeline measurement on the GPU machine (16 cores), perf_analyzer as the load generator, against the
# replay engine at a real engine's rate: 16 Python engine-step instances sharing one batch of 128 at 8.5 ms a
# step (~15k tokens/s), with the Python instances of the README's table (4 pre, 8 post, 16 BLS; the build
# now plans 8 BLS, which kept more side by side: bench/results/gpu-bls-instances/). Each
# point is profiled (CPU by process, Triton's statistics). The build's default (postprocessing keeps each
# stream's order) at 1-256 streams; with --unordered, postprocessing without preserve_ordering (NVIDIA's
# setting) at 128 and 256 streams instead.
# Needs tritonserver and perf_analyzer on PATH and this tree importable by the server's Python stub.
# Usage: bash bench/gpu.sh RESULTS_DIR [--unordered] [extra bench/pipeline.py options, e.g. --stacks-dir DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-bench/results}; shift || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
run=(python3 -u bench/pipeline.py --engines replay --tool perf_analyzer --engine-instances 16
     --engine-max-batch-size 128 --duration-s 4 --preprocessing-instances 4 --postprocessing-instances 8
     --bls-instances 16 --results-dir "$results")
if [ "${1:-}" = "--unordered" ]; then
  shift
  "${run[@]}" --concurrency 128,256 --paths direct,ensemble --postprocessing-unordered \
    --name pipeline-gpu-replay-unordered --note "postprocessing without preserve_ordering (NVIDIA's setting)" "$@"
else
  "${run[@]}" --concurrency 1,8,32,128,256 --name pipeline-gpu-replay \
    --note "postprocessing with preserve_ordering (the build's default); 16 replay instances sharing a batch of 128 at 8.5 ms a step" "$@"
fi
