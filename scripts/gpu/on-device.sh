#!/usr/bin/env bash
# The GPU machine's side of docs/gpu.md. scripts/stage-gpu.sh copies it to .gpu/on-device.sh;
# run it there from the project root, with .gpu carried beside the working tree:
#   bash .gpu/on-device.sh tests [ARGS]    every staged test binary (ARGS to each, e.g.
#                                          --include-ignored); logs in $OUT
#   bash .gpu/on-device.sh bench [GIB]     the bench binaries, then KvikIO, on one GIB-GiB random
#                                          file (default 4); the side-by-side table;
#                                          $OUT/results.jsonl holds the raw lines
#   bash .gpu/on-device.sh env             what the machine offers (GPU, driver, disk, libraries)
#   bash .gpu/on-device.sh run CMD...      any command, in the environment below
# The environment every command gets:
#   GPUMAP_REQUIRE_GPU=1  a test that needs a GPU fails instead of skipping
#   GPUMAP_BENCH_DIR      a folder on a real disk (cuFile refuses tmpfs); default /tmp/gpumap-bench
#   OUT                   where results go (the lent machine sets it; default /tmp/out)
#   LD_LIBRARY_PATH       gains the CUDA folder that holds libcufile.so.0
#   PYTHONPATH=/tmp/site  the staged wheels, installed there
#   a udev entry          the machine has no udev database, without which cuFileHandleRegister
#                         fails ("udev property not found: ID_FS_USAGE"); a minimal entry for the
#                         disk of GPUMAP_BENCH_DIR lets cuFile register files and run in its
#                         compatibility mode (there is no nvidia-fs). GPUMAP_NO_UDEV_SHIM=1 leaves
#                         it out, to see what a machine without one does.
set -uo pipefail
cd "$(dirname "$0")/.."

# The executables travel packed (unpacked they exceed what the machine takes). Unpacked again
# whenever the archive differs from the one unpacked, so a machine kept warm never runs stale
# binaries.
if [ -f .gpu/bin.tar.xz ]; then
  packed=$(md5sum < .gpu/bin.tar.xz | cut -d' ' -f1)
  if [ "$(cat .gpu/bin/.unpacked-from 2>/dev/null)" != "$packed" ]; then
    rm -rf .gpu/bin
    tar -xJf .gpu/bin.tar.xz -C .gpu || { echo "on-device.sh: cannot unpack .gpu/bin.tar.xz" >&2; exit 1; }
    echo "$packed" > .gpu/bin/.unpacked-from
  fi
fi

export GPUMAP_REQUIRE_GPU=1
export GPUMAP_BENCH_DIR=${GPUMAP_BENCH_DIR:-/tmp/gpumap-bench}
export OUT=${OUT:-/tmp/out}
mkdir -p "$GPUMAP_BENCH_DIR" "$OUT"
for lib in /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/targets/x86_64-linux/lib; do
  if [ -e "$lib/libcufile.so.0" ]; then export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"; break; fi
done
if [ "${GPUMAP_NO_UDEV_SHIM:-0}" != 1 ] && [ ! -e /run/udev/data ]; then
  devno=$(python3 -c "import os, sys; d = os.stat(sys.argv[1]).st_dev; print(f'{os.major(d)}:{os.minor(d)}')" "$GPUMAP_BENCH_DIR")
  mkdir -p /run/udev/data
  printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\nE:DEVTYPE=disk\n' > "/run/udev/data/b$devno"
fi
# The peers' wheels and our own, reinstalled every run so that a fresh build is the one used.
wheels=$(ls .gpu/whl/*.whl .gpu/pywhl/*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
  # shellcheck disable=SC2086 # one argument per wheel
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $wheels
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site

cmd=${1:-tests}
shift || true
case "$cmd" in
  env)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    uname -r; nproc; free -g | head -2; df -h "$GPUMAP_BENCH_DIR"
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; ls /run/udev/data 2>/dev/null
    ;;
  tests)
    pass=0; fail=0; failed=""
    for t in .gpu/bin/test-*; do
      [ -x "$t" ] || continue
      echo "=== $t"
      "$t" --test-threads=4 "$@" 2>&1 | tee "$OUT/$(basename "$t").log" | tail -n 25
      if [ "${PIPESTATUS[0]}" -eq 0 ]; then
        pass=$((pass + 1))
      else
        fail=$((fail + 1)); failed="$failed $(basename "$t")"
      fi
    done
    echo "test binaries: $pass passed, $fail failed${failed:+ (failed:$failed)}"
    [ "$fail" -eq 0 ]
    ;;
  bench)
    gib=${1:-4}
    file="$GPUMAP_BENCH_DIR/bench-${gib}g.bin"
    if [ ! -s "$file" ]; then head -c "$((gib << 30))" /dev/urandom > "$file"; sync; fi
    : > "$OUT/results.jsonl"
    for b in .gpu/bin/bench-*; do
      [ -x "$b" ] || continue
      # Every bench binary takes BENCH --jsonl OUT FILE and appends JSON lines
      # (docs/benchmarks.md, "The JSON-lines format").
      echo "=== $b"; "$b" --jsonl "$OUT/results.jsonl" "$file" || echo "bench $b failed: $?"
    done
    if [ -d /tmp/site/kvikio ]; then
      echo "=== kvikio peer"
      PYTHONUNBUFFERED=1 python3 python/bench/kvikio_compare.py "$file" --jsonl "$OUT/results.jsonl"
    else
      echo "KvikIO wheels missing: no peer numbers"
    fi
    python3 scripts/gpu/ratio.py "$OUT/results.jsonl"
    ;;
  run) "$@" ;;
  *) echo "usage: on-device.sh tests [ARGS]|bench [GIB]|env|run CMD..." >&2; exit 2 ;;
esac
