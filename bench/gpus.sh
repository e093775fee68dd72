#!/usr/bin/env bash
# The transformers engine on several GPUs, for a 4-GPU machine (docs/design/transformers-engine.md#several-gpus):
#   1. one engine instance per GPU (build --gpus N), served by Triton, the engine model called directly: output
#      tokens/s at 128, 256 and 512 streams on 1, 2 and 4 GPUs (bench/pipeline.py); each instance has the
#      batch of the largest concurrency, so that however Triton spreads the streams no instance queues;
#   2. tensor parallelism in-process (bench/engine_gpu.py --tp-size 1,2,4): tokens/s with each prefill and decode
#      step timed apart, one GPU's CUDA graphs beside tp=1 (tensor-parallel decode steps run eagerly);
#   3. tensor parallelism served (build --gpus T --tp-size T: one instance over T GPUs), T = 2 and 4.
# The model is the 1b shape of tritonforge/tools/tiny_model.py (random bf16 weights; --model-size picks another).
# Needs tritonserver on PATH and this tree importable by the server's Python stub, with accelerate installed
# (transformers' tensor-parallel loading requires it).
# Usage: bash bench/gpus.sh RESULTS_DIR [--model-size SIZE] [--duration-s S]
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-bench/results}; shift || true
size=1b
duration=6
while [ $# -gt 0 ]; do
  case "$1" in
    --model-size) size=$2; shift 2 ;;
    --duration-s) duration=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
if [ "$gpus" -lt 4 ]; then
  echo "gpus.sh: $gpus GPUs visible; this measurement needs 4" >&2
  exit 2
fi
status=0
served=(python3 -u bench/pipeline.py --engines transformers --paths direct --model-size "$size"
        --concurrency 128,256,512 --duration-s "$duration" --results-dir "$results")
for n in 1 2 4; do
  "${served[@]}" --gpus "$n" --name "gpus-$size-instances-$n" \
    --note "one transformers engine instance on each of $n GPUs, each with 512 slots" || status=1
done
python3 -u bench/engine_gpu.py --model-size "$size" --concurrency 128,256,512 --duration-s "$duration" \
  --tp-size 1,2,4 --results-dir "$results" || status=1
for t in 2 4; do
  "${served[@]}" --gpus "$t" --tp-size "$t" --name "gpus-$size-tp-$t" \
    --note "one transformers engine instance over $t GPUs (tensor parallel, eager decode steps)" || status=1
done
exit $status
