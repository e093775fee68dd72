#!/usr/bin/env bash
# The ensemble with and without the coalescer, one after the other on the same GPU machine (bench/gpu.sh's
# pipeline: C++ replay engine, perf_analyzer, 128 and 256 streams), with tritonserver's busiest threads and
# their stacks sampled throughout (bench/thread_stacks.py, written beside the results as stacks-*.jsonl).
# Usage: bash bench/gpu_coalescer.sh RESULTS_DIR STEP_MS [options of bench/pipeline.py for both runs]
#   e.g. bash bench/gpu_coalescer.sh "$OUT" 2.125 --replay-sender-threads 8 --stream-interval 3
set -uo pipefail
cd "$(dirname "$0")/.."
results=$1; step_ms=$2; shift 2
tag="${step_ms}ms$(printf '%s' "$*" | tr -c 'a-z0-9' '-' | tr -s '-')"
mkdir -p "$results"
python3 -u bench/thread_stacks.py --duration-s 540 > "$results/stacks-$tag.jsonl" 2>&1 &
sampler=$!
bash bench/gpu.sh "$results" --step-ms "$step_ms" --concurrency 128,256 --paths direct,ensemble,bls \
  --name "coalescer-$tag" "$@"
bash bench/gpu.sh "$results" --step-ms "$step_ms" --concurrency 128,256 --paths direct,ensemble --no-coalescer \
  --name "no-coalescer-$tag" "$@"
kill "$sampler" 2>/dev/null
for f in "$results"/coalescer-"$tag".md "$results"/no-coalescer-"$tag".md; do
  echo "== $f"; sed -n '/^| engine | streams | path | output/,/^$/p' "$f"
done
