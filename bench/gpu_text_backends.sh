#!/usr/bin/env bash
# The ensemble at a real engine's rate with postprocessing as the Python model and as its C++ twin
# (--text-backend cpp), side by side in one run on the GPU machine (16 cores), perf_analyzer as the load
# generator, the C++ replay engine sending one response a token (as NVIDIA's tensorrtllm backend does):
#   python, 8 instances, ordered    the build's plan at 128 streams
#   cpp, 8 instances, ordered       the same with the C++ detokenizer
#   cpp, 1 instance, unordered      one instance keeps each stream's order without preserve_ordering
# Each point is profiled (CPU by process, Triton's statistics) and every stream checked against its
# non-streamed answer. Needs tritonserver, perf_analyzer and g++ on PATH.
# Usage: bash bench/gpu_text_backends.sh RESULTS_DIR [--step-ms MS] [--variants "BACKEND:INSTANCES:ORDER ..."]
#          [extra options of bench/pipeline.py, e.g. --paths direct,ensemble,bls --stream-interval 3]
# The text backend chooses the BLS's backend too where the build has a C++ one for it.
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-bench/results}; shift || true
step_ms=4.25
if [ "${1:-}" = "--step-ms" ]; then step_ms=$2; shift 2; fi
variants="python:8:ordered cpp:8:ordered cpp:1:unordered"
if [ "${1:-}" = "--variants" ]; then variants=$2; shift 2; fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for variant in $variants; do
  IFS=: read -r backend instances order <<< "$variant"
  extra=()
  if [ "$order" = "unordered" ]; then extra=(--postprocessing-unordered); fi
  python3 -u bench/pipeline.py --engines replay --replay-native --replay-step-ms "$step_ms" --tool perf_analyzer \
    --engine-max-batch-size 128 --duration-s 6 --preprocessing-instances 8 --postprocessing-instances "$instances" \
    --bls-instances 8 --concurrency 128,256 --paths direct,ensemble --text-backend "$backend" "${extra[@]}" \
    --results-dir "$results" --name "text-backend-${step_ms}ms-${backend}-${instances}-${order}" \
    --note "postprocessing: $backend, $instances instances, $order; C++ replay engine, batch of 128, $step_ms ms a step" "$@"
done
