#!/usr/bin/env python3
"""A kernel of one's own that looks rows up in gpumap's GPU page cache itself (the BaM idea on
stock Linux): the GPU finds where each row is resident and reads it from GPU memory; only the
rows it misses go to the host, which gathers them through the cache (and so makes them resident
for the next batch).

    python python/examples/lookup_kernel.py            # 256 MiB table of 512 B float32 rows
    python python/examples/lookup_kernel.py --size 4GiB --budget 1GiB --batches 50

The kernel includes ``gpumap_table.h`` (shipped in the wheel: ``gpumapio.include_dir()``) and
calls ``gpumap_lookup`` for each row; here it sums each row's floats. It runs inside
``MappedFile.lookup_scope(stream)``: while the scope lives, no slot the kernel could find is
reused, and leaving it waits for the stream. Every sum is checked against NumPy. Needs a GPU
and CuPy.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import gpumapio

KERNEL = r"""
#include "gpumap_table.h"

// One thread a row: rows of `row_size` bytes that lie within one extent (row_size divides the
// extent size). A resident row is summed from GPU memory; a missing one is listed.
extern "C" __global__ void sum_rows(const gpumap_table* table, unsigned long long file,
                                    const long long* indices, long long count, long long rows,
                                    unsigned long long row_size, float* sums,
                                    unsigned int* misses, unsigned int* miss_count)
{
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= count) return;
    const long long index = indices[i];
    if (index < 0 || index >= rows) { sums[i] = __int_as_float(0x7fc00000); return; }
    const unsigned long long start = (unsigned long long)index * row_size;
    const long long slot = gpumap_lookup(table, gpumap_key(file, start >> table->extent_shift));
    if (slot < 0) {
        misses[atomicAdd(miss_count, 1u)] = (unsigned int)i;
        return;
    }
    const unsigned long long within = start & ((1ull << table->extent_shift) - 1);
    const float* row = (const float*)(table->arena + ((unsigned long long)slot << table->extent_shift) + within);
    float sum = 0.0f;
    for (unsigned long long k = 0; k < row_size / 4; ++k) sum += row[k];
    sums[i] = sum;
}
"""


def parse_size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(text[: -len(unit)]) * factor
    return int(text)


def sums_with_own_kernel(cp, kernel, mapped, indices, row_size, stream):
    """Row sums of `indices`: resident rows by the kernel, the rest gathered through the cache."""
    count = int(indices.size)
    sums = cp.empty(count, dtype=cp.float32)
    misses = cp.empty(count, dtype=cp.uint32)
    miss_count = cp.zeros(1, dtype=cp.uint32)
    rows = mapped.nbytes // row_size
    with mapped.lookup_scope(stream=stream) as scope:
        with stream:
            kernel(
                ((count + 255) // 256,),
                (256,),
                (cp.uint64(scope.table), cp.uint64(scope.file), indices, cp.int64(count),
                 cp.int64(rows), cp.uint64(row_size), sums, misses, miss_count),
            )
    # The scope has waited for the stream: the miss list is complete.
    missed = misses[: int(miss_count.get()[0])]
    if missed.size:
        rows_out = cp.empty((int(missed.size), row_size // 4), dtype=cp.float32)
        mapped.gather_rows(indices[missed], row_size, rows_out, stream=stream)
        stream.synchronize()
        sums[missed] = rows_out.sum(axis=1)
    return sums, int(missed.size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="256MiB", type=parse_size)
    ap.add_argument("--budget", default="64MiB", type=parse_size)
    ap.add_argument("--row-size", default=512, type=int)
    ap.add_argument("--batch", default=100_000, type=int)
    ap.add_argument("--batches", default=10, type=int)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    import cupy as cp

    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        path = os.path.join(tmp, "table.f32")
        table = rng.standard_normal(a.size // 4, dtype=np.float32)
        table.tofile(path)
        rows = a.size // a.row_size
        mapped = gpumapio.map(path, budget=a.budget, extent_size=4096)
        kernel = cp.RawKernel(KERNEL, "sum_rows", options=("-I" + gpumapio.include_dir(),))
        stream = cp.cuda.Stream(non_blocking=True)
        reference = table.reshape(rows, a.row_size // 4)
        # Skewed ids, as hot nodes of a graph: most rows come back, so they are found resident.
        hot = max(rows // 20, 1)
        for b in range(a.batches):
            ids = np.where(rng.random(a.batch) < 0.8, rng.integers(0, hot, a.batch), rng.integers(0, rows, a.batch))
            indices = cp.asarray(ids, dtype=cp.int64)
            start = time.perf_counter()
            sums, missed = sums_with_own_kernel(cp, kernel, mapped, indices, a.row_size, stream)
            seconds = time.perf_counter() - start
            want = reference[ids].sum(axis=1)
            if not np.allclose(cp.asnumpy(sums), want, rtol=1e-4, atol=1e-3):
                raise SystemExit(f"batch {b}: the kernel's sums differ from NumPy's")
            print(f"batch {b}: {a.batch} rows, {a.batch - missed} found resident by the kernel, "
                  f"{missed} gathered by the host, {a.batch / seconds / 1e6:.2f} M rows/s")
        mapped.close()
    print("every sum checked against NumPy")


if __name__ == "__main__":
    main()
