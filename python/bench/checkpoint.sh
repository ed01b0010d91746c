#!/usr/bin/env bash
# The checkpoint table of docs/benchmarks.md, in one run (python/bench/checkpoint.py):
#   a Llama-like bf16 checkpoint of >= 4 GB in 4 shards, as transformers writes one, and a
#   checkpoint of 10,000 tensors of 64 KiB; gpumap's whole-file read of the same bytes,
#   load_checkpoint warm, in a fresh process, TP 1/4, the small tensors, safetensors per shard,
#   transformers' from_pretrained, the peers where they import, and the page cache dropped.
# Usage (on a GPU machine, from the repository root):
#   bash python/bench/checkpoint.sh [GB=4] [SHARDS=4] [more arguments of checkpoint.py run, e.g. --no-peers]
# Results: $OUT/checkpoint.json and $OUT/checkpoint.md; the checkpoints in $GPUMAP_BENCH_DIR
# (kept for reruns).
set -euo pipefail
gb=${1:-4}
shards=${2:-4}
shift $(( $# < 2 ? $# : 2 ))
out=${OUT:-/tmp/out}
dir=${GPUMAP_BENCH_DIR:-/tmp/gpumap-bench}
mkdir -p "$out" "$dir"
big="$dir/llama-${gb}g-${shards}"
small="$dir/small-10000x64k"
if [ ! -s "$big/model.safetensors.index.json" ]; then
  echo "== making $big"
  python3 python/bench/checkpoint.py make "$big" --gb "$gb" --shards "$shards"
fi
if [ ! -s "$small/model.safetensors.index.json" ]; then
  echo "== making $small"
  python3 python/bench/checkpoint.py make-small "$small" --tensors 10000
fi
whole="$dir/llama-${gb}g-${shards}.concatenated"
if [ ! -s "$whole" ]; then
  cat "$big"/model-*.safetensors > "$whole"
fi
sync
python3 python/bench/checkpoint.py run "$big" --small "$small" --whole "$whole" --repeat 3 --cold \
  --json "$out/checkpoint.json" --markdown "$out/checkpoint.md" "$@"
