#!/usr/bin/env bash
# Tuning aid for the GPU machine: cold reads into GPU memory — buffered vs O_DIRECT, bounce
# buffer size, thread count — beside dd with O_DIRECT (one request in flight, and four dd
# processes on the four quarters of the file for a deeper queue). Every configuration runs
# once per round, rounds interleaved, so the disk's drift over the run shows instead of
# favouring whichever ran last.
#   bash .gpu/on-device.sh run bash tools/sweep-cold-read.sh [GIB] [ROUNDS]
set -uo pipefail
gib=${1:-4}
rounds=${2:-2}
dir=${GPUMAP_BENCH_DIR:-/tmp/gpumap-bench}; mkdir -p "$dir"
file="$dir/sweep-cold-${gib}g.bin"
bin=${GPUMAP_BIN:-.gpu/bin/gpumap}
[ -s "$file" ] || "$bin" write "$file" --size "${gib}GiB" --truncate --host >/dev/null
bytes=$((gib << 30))
now() { date +%s.%N; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || "$bin" pagecache --evict "$file" >/dev/null; }
report() { python3 -c "import sys; print('%-44s %6.2f GB/s' % (sys.argv[1], $bytes / (float(sys.argv[3]) - float(sys.argv[2])) / 1e9))" "$@"; }
dd_direct() { # block size, processes
  local bs=$1 procs=$2 quarter=$((bytes / $2)) start end
  drop; start=$(now)
  for ((p = 0; p < procs; p++)); do
    dd if="$file" of=/dev/null bs="$bs" iflag=direct,skip_bytes,count_bytes \
      skip=$((p * quarter)) count=$quarter status=none &
  done
  wait; end=$(now)
  report "dd iflag=direct bs=$bs x$procs" "$start" "$end"
}
ours() { # threads, O_DIRECT, bounce buffer size; two cold reads, the first also allocates
  drop
  GPUMAP_BOUNCE_BUFFER_SIZE=$3 "$bin" read "$file" --threads "$1" --direct "$2" --cold \
    --repeat 2 --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print("%-44s %6.2f GB/s (runs: %s)" % (sys.argv[1], r["gbps"], ", ".join("%.2f" % g for g in r["runs_gbps"])))' \
      "gpumap threads=$1 O_DIRECT=$2 bounce=$3"
}
for ((round = 1; round <= rounds; round++)); do
  echo "# round $round"
  dd_direct 16M 1
  dd_direct 64M 1
  dd_direct 16M 4
  for threads in 1 4 16; do
    for direct in false true; do
      ours "$threads" "$direct" 4M
    done
    ours "$threads" true 16M
  done
  dd_direct 16M 1
done
