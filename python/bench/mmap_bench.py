"""gpumapio.Mmap against kvikio.Mmap (where kvikio imports) or np.memmap + a CuPy copy, on the
same file in the same run: whole-file reads into device memory (host memory without CuPy),
warm, best of --repeat.

    python python/bench/mmap_bench.py FILE [--size 4GiB] [--threads 16] [--repeat 5] [--json]

FILE is created (random bytes) if missing. Figures go to docs/benchmarks.md, not here.
"""

import argparse
import json
import os
import time

import numpy as np


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = text.lower().removesuffix("ib").removesuffix("b")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    size = parse_size(args.size)
    if not os.path.exists(args.file) or os.path.getsize(args.file) < size:
        with open(args.file, "wb") as f:
            for _ in range(0, size, 64 << 20):
                f.write(np.random.default_rng(1).integers(0, 256, 64 << 20, dtype=np.uint8).tobytes())
    size = os.path.getsize(args.file)
    try:
        import cupy as xp

        xp.cuda.runtime.getDeviceCount()
        sync = xp.cuda.runtime.deviceSynchronize
    except Exception:
        xp, sync = np, (lambda: None)
    dst = xp.empty(size, dtype=xp.uint8)
    results = {}

    import gpumapio

    with gpumapio.defaults.set("num_threads", args.threads):
        m = gpumapio.Mmap(args.file)
        m.pread(dst).get()  # warm the page cache
        results["gpumapio.Mmap.pread"] = best(lambda: m.pread(dst).get(), args.repeat)
        m.close()
    try:
        import kvikio
        import kvikio.defaults

        kvikio.defaults.set("num_threads", args.threads)
        km = kvikio.Mmap(args.file)
        km.pread(dst).get()
        results["kvikio.Mmap.pread"] = best(lambda: km.pread(dst).get(), args.repeat)
        km.close()
    except ImportError:
        mm = np.memmap(args.file, dtype=np.uint8, mode="r")

        def memmap_copy():
            if xp is np:
                dst[:] = mm
            else:
                dst.set(mm)
            sync()

        memmap_copy()
        results["np.memmap + copy"] = best(memmap_copy, args.repeat)
    report = {name: {"seconds": t, "GB/s": size / t / 1e9} for name, t in results.items()}
    report["_"] = {"file": args.file, "bytes": size, "threads": args.threads, "memory": xp.__name__}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for name, r in report.items():
            if name != "_":
                print(f"{name:24s} {r['GB/s']:8.2f} GB/s")


if __name__ == "__main__":
    main()
