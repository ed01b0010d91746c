#!/usr/bin/env bash
# Tuning aid for the GPU machine (run through .gpu/on-device.sh run): warm reads of one file
# into GPU memory over a grid of threads x bounce-buffer size x task size, beside KvikIO's POSIX
# path at the same thread counts, all in one run on one file. Prints one line per point.
#   bash .gpu/on-device.sh run bash tools/sweep-device-read.sh [GIB]
# THREADS="8 16" CONFIGS="1MiB:64MiB 4MiB:64MiB" (bounce:task) narrow the grid.
set -uo pipefail
gib=${1:-4}
dir=${GPUMAP_BENCH_DIR:-/tmp/gpumap-bench}; mkdir -p "$dir"
file="$dir/sweep-${gib}g.bin"
bin=.gpu/bin/gpumap
[ -s "$file" ] || "$bin" write "$file" --size "${gib}GiB" --truncate --host >/dev/null
cat "$file" > /dev/null # warm
for threads in ${THREADS:-4 8 16}; do
  for cfg in ${CONFIGS:-1MiB:4MiB 4MiB:4MiB 4MiB:16MiB 16MiB:16MiB 4MiB:64MiB 16MiB:256MiB}; do
    bounce=${cfg%%:*}; task=${cfg##*:}
    printf 'gpumap threads=%-2s bounce=%-6s task=%-7s ' "$threads" "$bounce" "$task"
    GPUMAP_BOUNCE_BUFFER_SIZE=$bounce "$bin" read "$file" --threads "$threads" --task-size "$task" \
      --repeat 3 --json | python3 -c 'import json,sys; print("%.2f GB/s" % json.load(sys.stdin)["gbps"])'
  done
done
if python3 -c 'import kvikio' 2>/dev/null; then
  python3 - "$file" <<'PY'
import sys, time, cupy, kvikio, kvikio.defaults
path = sys.argv[1]
import os; size = os.path.getsize(path)
buf = cupy.empty(size, dtype=cupy.uint8)
kvikio.defaults.set({"compat_mode": kvikio.CompatMode.ON})
for n in [int(t) for t in os.environ.get("THREADS", "4 8 16").split()]:
    kvikio.defaults.set({"num_threads": n})
    best = 1e9
    for _ in range(3):
        cupy.cuda.runtime.deviceSynchronize(); t = time.perf_counter()
        with kvikio.CuFile(path, "r") as f:
            assert f.pread(buf).get() == size
        cupy.cuda.runtime.deviceSynchronize(); best = min(best, time.perf_counter() - t)
    print(f"kvikio-posix threads={n:<2} best of 3: {size / best / 1e9:.2f} GB/s", flush=True)
PY
fi
