#!/usr/bin/env bash
# Issue 25's remote-read table, in one run (python/bench/remote.py): a local HTTP range server
# (its own processes, sendfile from the page cache) serving one GIB-GiB object; the bound (a
# plain parallel http.client reading it), gpumapio.RemoteFile and kvikio.RemoteFile into GPU
# memory (and host memory), whole and in random 4 KiB and 1 MiB ranges, gpumap's and KvikIO's
# runs interleaved repeat by repeat, each client in a process of its own, with a summary table;
# then the same as an S3 object (open_s3 on both sides: every request signed), same server.
# Usage (on a GPU machine, from the repository root; on the lent machine through
# `bash .gpu/on-device.sh run bash python/bench/remote.sh`):
#   bash python/bench/remote.sh [GIB=4] [REPEATS=5]
# Results: $OUT/remote.jsonl (JSON lines) and $OUT/remote.txt (the log and its summary); the
# object in $GPUMAP_BENCH_DIR (kept for reruns).
set -euo pipefail
gib=${1:-4}
repeats=${2:-5}
out=${OUT:-/tmp/out}
dir=${GPUMAP_BENCH_DIR:-/tmp/gpumap-bench}
mkdir -p "$out" "$dir"
for protocol in http s3; do
  python3 python/bench/remote.py --jsonl "$out/remote.jsonl" --size "${gib}GiB" --dir "$dir" \
    --repeats "$repeats" --threads 32 --server-procs 8 --client-procs 4 --interleave --isolate \
    --protocol "$protocol" 2>&1 | tee -a "$out/remote.txt"
done
