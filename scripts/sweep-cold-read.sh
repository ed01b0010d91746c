#!/usr/bin/env bash
# Tuning aid for the GPU machine: cold reads into GPU memory, buffered vs O_DIRECT, at several
# thread counts, beside dd with O_DIRECT, in one run on one file.
#   bash .gpu/on-device.sh run bash scripts/sweep-cold-read.sh [GIB]
set -uo pipefail
gib=${1:-4}
dir=${GPUMAP_BENCH_DIR:-/tmp/gpumap-bench}; mkdir -p "$dir"
file="$dir/sweep-cold-${gib}g.bin"
bin=.gpu/bin/gpumap
[ -s "$file" ] || "$bin" write "$file" --size "${gib}GiB" --truncate --host >/dev/null
rate() { python3 -c 'import json,sys; print("%.2f GB/s" % json.load(sys.stdin)["gbps"])'; }
for threads in 1 4 16; do
  for direct in false true; do
    "$bin" pagecache --evict "$file" >/dev/null
    printf 'gpumap threads=%-2s O_DIRECT=%-5s ' "$threads" "$direct"
    "$bin" read "$file" --threads "$threads" --direct "$direct" --json | rate
  done
done
sync; echo 3 > /proc/sys/vm/drop_caches
start=$(date +%s.%N); dd if="$file" of=/dev/null bs=16M iflag=direct status=none; end=$(date +%s.%N)
python3 -c "print('dd iflag=direct bs=16M: %.2f GB/s' % ($gib * 2**30 / ($end - $start) / 1e9))"
