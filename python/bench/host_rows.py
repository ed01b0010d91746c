"""Random rows gathered into host memory: ``gpumapio.map(FILE, device="host")`` and
``gather_rows`` (the page cache on host memory, no GPU needed) against ``np.memmap(FILE)[idx]``,
on the same file and the same indices, in the shared JSON-lines format (``impl``, ``workload``,
``rows``, ``rows_per_s``).

    python3 python/bench/host_rows.py FILE --jsonl OUT.jsonl [--row-size 512] [--batch 100000]
        [--batches 10] [--budget BYTES]

FILE is read, never written; the page cache should hold it (the bench reads it once first).
Each implementation gathers ``batches`` batches of ``batch`` uniformly random int64 indices, a
new NumPy array for each batch as a caller would get: ``first`` is a first pass over a fresh
cache (its misses read with ``pread``), ``hot`` the same batches again. The figure is the median
batch. Rows are checked against NumPy's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import gpumapio


def emit(out, impl: str, workload: str, rows: int, row_size: int, times: list[float]) -> None:
    seconds = max(statistics.median(times), 1e-9)
    rec = {
        "impl": impl,
        "workload": workload,
        "rows": rows,
        "row_size": row_size,
        "seconds": round(seconds, 6),
        "rows_per_s": round(rows / seconds, 1),
        "best_rows_per_s": round(rows / max(min(times), 1e-9), 1),
        "cpus": os.cpu_count(),
    }
    line = json.dumps(rec)
    print(line, flush=True)
    out.write(line + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--row-size", type=int, default=512)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--budget", type=int, default=None, help="the cache's (default: every batch's extents)")
    ap.add_argument("--seed", type=int, default=22)
    a = ap.parse_args()
    size = os.path.getsize(a.file)
    rows = size // a.row_size
    with open(a.file, "rb") as f:
        while f.read(64 << 20):
            pass
    rng = np.random.default_rng(a.seed)
    batches = [rng.integers(0, rows, a.batch, dtype=np.int64) for _ in range(a.batches)]
    table = np.memmap(a.file, dtype=np.uint8, mode="r", shape=(rows, a.row_size))
    expected = [table[b] for b in batches]
    budget = a.budget or max(64 << 20, 2 * a.batch * a.batches * 4096)

    def timed(run, b):
        t = time.perf_counter()
        got = run(b)
        return time.perf_counter() - t, got

    with open(a.jsonl, "a") as out:
        m = gpumapio.map(a.file, budget=budget, extent_size=4096, device="host")
        for workload in ("first", "hot"):
            times = []
            for b, want in zip(batches, expected):
                seconds, got = timed(lambda b: gpumapio.gather_rows(m, b, a.row_size), b)
                if not np.array_equal(got, want):
                    raise SystemExit(f"gpumap-host-rows {workload}: rows differ")
                times.append(seconds)
            emit(out, "gpumap-host-rows", f"rows_{a.row_size}_{workload}", a.batch, a.row_size, times)
        m.close()
        times = []
        for b in batches:
            seconds, _ = timed(lambda b: table[b], b)
            times.append(seconds)
        emit(out, "numpy-memmap", f"rows_{a.row_size}_hot", a.batch, a.row_size, times)


if __name__ == "__main__":
    main()
