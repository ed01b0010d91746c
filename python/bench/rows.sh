#!/usr/bin/env bash
# The row-gather table of docs/benchmarks.md, on one file, in one process per case:
#   1. warm page cache, 512 B rows, uniform and skewed: gpumap (budget file/4), its zero-copy
#      tier, the cache in front of the zero-copy tier (misses read in place), np.memmap + torch,
#      and the CuPy kernel over a cudaHostRegister'ed mmap;
#   2. the process limited to less memory than the file (cgroup v2 memory.max): gpumap
#      (budget --limit-budget) against np.memmap, skewed, and FileHandle's random 4 KiB reads
#      from the disk (before and after them) as the yardstick of a first pass's misses;
#   3. the Rust engine without Python: `gpumap map --rows` (GPUMAP_BIN) on the same file.
# Usage (on a GPU machine, from the repository root; on the lent machine through
# `bash .gpu/on-device.sh run bash python/bench/rows.sh`):
#   python/bench/rows.sh [GIB=8] [MEMORY_MAX=3GiB in bytes] [LIMIT_BUDGET bytes]
# Results: $OUT/rows.jsonl (JSON lines), the file in $GPUMAP_BENCH_DIR (kept for reruns).
set -uo pipefail
gib=${1:-8}
memory_max=${2:-$((3 << 30))}
limit_budget=${3:-$((2 << 30))}
out=${OUT:-/tmp/out}
dir=${GPUMAP_BENCH_DIR:-/tmp/gpumap-bench}
mkdir -p "$out" "$dir"
file="$dir/rows-${gib}g.bin"
if [ ! -s "$file" ]; then
  echo "== making $file ($gib GiB of random bytes)"
  head -c "$((gib << 30))" /dev/urandom > "$file" && sync
fi
# Warm: the file in the page cache before any case runs.
cat "$file" > /dev/null
echo "== 1. warm, uniform and skewed, batches of 100000 rows of 512 B"
python3 python/bench/rows.py "$file" --jsonl "$out/rows.jsonl" --batches 20 --max-seconds 40
echo "== 2. memory.max $memory_max (the file is $((gib << 30)) bytes), skewed"
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
python3 python/bench/rows.py "$file" --jsonl "$out/rows.jsonl" --batches 10 --max-seconds 30 \
  --workloads skewed --only filehandle,gpumap,numpy,filehandle --budget "$limit_budget" --memory-max "$memory_max" \
  --numpy-batch 2000
if [ -x "${GPUMAP_BIN:-}" ]; then
  # Case 2 dropped the page cache: warm it again, as case 1 had it.
  cat "$file" > /dev/null
  echo "== 3. the Rust engine: gpumap map --rows (512 B rows, uniform, budget file/4)"
  for case in "1 100000 off" "16 64 off" "1 100000 misses"; do
    set -- $case
    "$GPUMAP_BIN" map --rows 2000000 --row-size 512 --extent 4KiB --budget "$(((gib << 30) / 4))" \
      --threads "$1" --batch "$2" --zero-copy "$3" --json "$file" | tee -a "$out/rows-cli.jsonl"
  done
fi
