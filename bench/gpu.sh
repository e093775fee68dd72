#!/usr/bin/env bash
# The pipeline measurement on the GPU machine (16 cores), perf_analyzer as the load generator, against the
# replay engine at a real engine's rate, as a C++ backend (--replay-native: like NVIDIA's tensorrtllm backend
# it sends each response from C++, so the cores it leaves are the pipeline's), one batch of 128 slots:
#   8.5 ms a step  ~15k tokens/s at 128 streams (the rate the pipeline was first tuned for)
#   4.25 ms a step ~29k tokens/s (Llama-3.1-8B FP8 on one H200, trtllm-bench)
# with the Python instances the build plans at 128 streams and above (8 pre, 8 post, 8 BLS). Each point is
# profiled (CPU by process, Triton's statistics). The build's default (postprocessing keeps each stream's
# order); with --unordered, postprocessing without preserve_ordering (NVIDIA's setting) instead.
# Needs tritonserver, perf_analyzer and g++ on PATH and this tree importable by the server's Python stub.
# With --gateway, the OpenAI gateway (4 workers) in front of the BLS against the ensemble over gRPC instead
# (bench/gateway.py; add --gateway-model ensemble for the gateway in front of the ensemble).
# Usage: bash bench/gpu.sh RESULTS_DIR [--step-ms MS] [--unordered | --gateway] [extra options of the script]
#   e.g. bash bench/gpu.sh "$OUT" --step-ms 4.25 --concurrency 128,256 --stream-interval 3
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-bench/results}; shift || true
step_ms=8.5
if [ "${1:-}" = "--step-ms" ]; then step_ms=$2; shift 2; fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
run=(python3 -u bench/pipeline.py --engines replay --replay-native --replay-step-ms "$step_ms" --tool perf_analyzer
     --engine-max-batch-size 128 --duration-s 6 --preprocessing-instances 8 --postprocessing-instances 8
     --bls-instances 8 --results-dir "$results")
if [ "${1:-}" = "--gateway" ]; then
  shift
  python3 -u bench/gateway.py --replay-native --replay-step-ms "$step_ms" --engine-max-batch-size 128 \
    --postprocessing-instances 8 --bls-instances 8 --gateway-workers 4 --tool perf_analyzer --duration-s 6 \
    --concurrency 1,32,128 --results-dir "$results" --name "gateway-gpu-${step_ms}ms" "$@"
elif [ "${1:-}" = "--unordered" ]; then
  shift
  "${run[@]}" --concurrency 128,256 --paths direct,ensemble --postprocessing-unordered \
    --name "pipeline-gpu-replay-${step_ms}ms-unordered" \
    --note "postprocessing without preserve_ordering (NVIDIA's setting); C++ replay engine, batch of 128, $step_ms ms a step" "$@"
else
  "${run[@]}" --concurrency 1,8,32,128,256 --name "pipeline-gpu-replay-${step_ms}ms" \
    --note "postprocessing with preserve_ordering (the build's default); C++ replay engine, batch of 128, $step_ms ms a step" "$@"
fi
