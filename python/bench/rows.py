"""Random rows gathered from Python onto the GPU: ``MappedFile.gather_rows`` against the peers
people use for it today, on the same file and the same indices, in the shared JSON-lines format
(``impl``, ``workload``, ``rows``, ``rows_per_s``).

    python3 python/bench/rows.py FILE --jsonl OUT.jsonl [--row-size 512] [--batch 100000]
        [--batches 20] [--budget BYTES] [--memory-max BYTES] [--numpy-batch N]
        [--max-seconds S] [--only gpumap,zero-copy,in-place,numpy,uva,filehandle]
        [--workloads uniform,skewed]

FILE is read, never written; it is a table of ``row_size``-byte rows. Each workload gathers
``batches`` batches of ``batch`` rows, chosen uniformly (``uniform``) or with a power law
(``skewed``: 80 % of the ids in the first 10 % of the rows, as hot nodes of a graph), with int64
indices already on the GPU and the rows landing in a CuPy array:

- ``gpumap-rows``: ``gpumapio.map(FILE, budget=...)`` and ``gather_rows`` (resident rows copied
  by one kernel, missing extents read and placed); ``first`` is the first pass over a fresh
  cache, ``hot`` the passes after it;
- ``gpumap-rows-zero-copy``: ``gather_rows`` on a zero-copy map (a kernel reading the file's
  host-registered pages);
- ``gpumap-rows-misses-in-place``: ``gpumapio.map(FILE, budget=..., zero_copy="misses")``: the
  cache in front of the zero-copy tier, one kernel copying the resident rows from GPU memory and
  reading the others in place, their extents admitted into the cache in the background; as the
  cache fills only through those admissions, ``settled`` times a pass after ``--settle-seconds``
  of untimed gathers, as a training loop's later epochs would see it;
- ``numpy-memmap``: ``np.memmap(FILE)[indices]`` then ``torch.from_numpy(...).pin_memory()
  .cuda()`` (``cupy.asarray`` without torch), the indices copied to the host first, as such code
  must;
- ``cupy-uva-kernel``: the 20-line kernel people write: ``mmap`` the file,
  ``cudaHostRegister`` it read-only, one warp per row reading host memory over PCIe;
- ``gpumap-filehandle-batch`` (``--only filehandle``, workload ``rand_read_4k_cold``): not a row
  gather but the yardstick of a first pass from disk: random 4 KiB blocks of the file, dropped
  from the page cache first, read into GPU memory by ``FileHandle``'s batch path in one call
  (``read_files``), as fast as the disk answers random reads. ``rows_per_s`` is reads per second.
  A first pass's misses are compared with it: each ``gpumap-rows`` ``*_first`` record says
  ``misses_per_s`` (the cache's misses over the pass's time).

Under ``--memory-max`` every implementation starts with the file dropped from the page cache,
so each first pass reads from the disk.

``--memory-max`` runs the bench in a cgroup (v2) of that much memory, page cache included, so
that the file is larger than the memory the process may use: the case the GPU cache exists
for. The UVA peer pins the whole file and cannot run there; it is reported as refused.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import time

import numpy as np

import gpumapio

UVA_KERNEL = r"""
extern "C" __global__ void gather(const unsigned long long* table, long long rows,
                                  const long long* indices, long long count,
                                  unsigned long long* out, int words, int* bad) {
    long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (warp >= count) return;
    long long row = indices[warp];
    if (row < 0 || row >= rows) { if (lane == 0) atomicExch(bad, 1); return; }
    const unsigned long long* src = table + row * words;
    unsigned long long* dst = out + warp * words;
    for (int w = lane; w < words; w += 32) dst[w] = src[w];
}
"""


class Out:
    def __init__(self, path: str):
        self.f = open(path, "a")

    def emit(self, impl, workload, rows, row_size, seconds, **extra):
        seconds = max(seconds, 1e-9)
        rec = {
            "impl": impl,
            "workload": workload,
            "rows": rows,
            "row_size": row_size,
            "bytes": rows * row_size,
            "seconds": round(seconds, 6),
            "rows_per_s": round(rows / seconds, 1),
            "gbps": round(rows * row_size / seconds / 1e9, 3),
        }
        rec.update(extra)
        line = json.dumps(rec)
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def enter_cgroup(limit: int) -> str:
    """Moves this process into a new cgroup v2 of ``limit`` bytes; returns its path."""
    root = "/sys/fs/cgroup"
    path = os.path.join(root, f"gpumap-rows-{os.getpid()}")
    try:
        with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
            f.write("+memory")
    except OSError:
        pass  # already on, or not ours to change: the memory.max write below tells
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "memory.max"), "w") as f:
        f.write(str(limit))
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    return path


def index_batches(rows: int, batch: int, batches: int, skewed: bool, seed: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    if not skewed:
        return g.integers(0, rows, size=(batches, batch), dtype=np.int64)
    # The skew: 80 % of the ids in the first 10 % of the rows, the rest anywhere.
    hot = g.random(size=(batches, batch)) < 0.8
    head = g.integers(0, max(rows // 10, 1), size=(batches, batch), dtype=np.int64)
    anywhere = g.integers(0, rows, size=(batches, batch), dtype=np.int64)
    return np.where(hot, head, anywhere)


MAX_SECONDS = [60.0]  # per pass; --max-seconds sets it
SETTLE_SECONDS = [10.0]  # in-place: untimed gathers before the settled pass; --settle-seconds sets it


def timed_batches(cp, run, batches) -> list[float]:
    """Each batch's seconds; stops early once a pass has taken MAX_SECONDS (a thrashing peer
    would otherwise take hours), so the report says how many batches were timed."""
    times = []
    for b in batches:
        if sum(times) > MAX_SECONDS[0]:
            break
        cp.cuda.runtime.deviceSynchronize()
        t = time.perf_counter()
        run(b)
        cp.cuda.runtime.deviceSynchronize()
        times.append(time.perf_counter() - t)
    return times


def report(out, impl, workload, times, batch, row_size, **extra):
    # Median batch: one slow batch (a page-cache miss burst, a GC) does not set the rate.
    med = float(np.median(times))
    out.emit(impl, workload, batch, row_size, med, batches=len(times), total_s=round(sum(times), 3), **extra)


def bench_gpumap(cp, out, path, row_size, workloads, budget, zero_copy):
    impl = {False: "gpumap-rows", True: "gpumap-rows-zero-copy", "misses": "gpumap-rows-misses-in-place"}[zero_copy]
    for name, host_batches in workloads:
        m = gpumapio.map(path, budget=budget, extent_size=4096, zero_copy=zero_copy)
        batches = [cp.asarray(b) for b in host_batches]
        batch = host_batches.shape[1]
        dst = cp.empty((batch, row_size), dtype=cp.uint8)
        stream = cp.cuda.Stream(non_blocking=True)

        def run(idx):
            m.gather_rows(idx, row_size, dst, stream=stream)

        first = timed_batches(cp, run, batches)
        # The last batch gathered checked against the file (sampled rows, byte for byte).
        check(path, row_size, host_batches[len(first) - 1], cp.asnumpy(dst))
        hot = timed_batches(cp, run, batches)
        settled = None
        if zero_copy == "misses" and SETTLE_SECONDS[0] > 0:
            # Misses read in place reach the cache only through admissions in the background:
            # gather (untimed) for a while, as a training loop would, then time a pass.
            until = time.perf_counter() + SETTLE_SECONDS[0]
            while time.perf_counter() < until:
                for idx in batches:
                    run(idx)
            cp.cuda.Device().synchronize()
            m.wait_for_admissions()
            settled = timed_batches(cp, run, batches)
        extra = {"budget": budget}
        if zero_copy is not True:
            extra["stats"] = {k: v for k, v in m.stats().items() if isinstance(v, int)}
            extra["misses_per_s"] = round(extra["stats"]["misses"] / max(sum(first), 1e-9), 1)
        report(out, impl, f"{name}_first", first, batch, row_size, **extra)
        report(out, impl, f"{name}_hot", hot, batch, row_size, budget=budget)
        if settled is not None:
            stats = {k: v for k, v in m.stats().items() if isinstance(v, int)}
            report(out, impl, f"{name}_settled", settled, batch, row_size, budget=budget,
                   settle_s=SETTLE_SECONDS[0], stats=stats)
        m.close()


def check(path, row_size, indices, got):
    with open(path, "rb") as f:
        for k in range(0, len(indices), max(len(indices) // 64, 1)):
            f.seek(int(indices[k]) * row_size)
            if f.read(row_size) != got[k].tobytes():
                sys.exit(f"row {indices[k]} (position {k}) differs from the file")


def bench_numpy(cp, out, path, row_size, workloads, numpy_batch):
    try:
        import torch
    except ImportError:
        torch = None
    rows = os.path.getsize(path) // row_size
    table = np.memmap(path, dtype=np.uint8, mode="r", shape=(rows, row_size))
    for name, host_batches in workloads:
        # A thrashing memmap would take minutes a batch: --numpy-batch takes the first rows.
        host_batches = host_batches[:, :numpy_batch]
        batches = [cp.asarray(b) for b in host_batches]
        holder = {}

        if torch is not None:

            def run(idx):
                holder["rows"] = torch.from_numpy(table[cp.asnumpy(idx)]).pin_memory().cuda()

        else:

            def run(idx):
                holder["rows"] = cp.asarray(table[cp.asnumpy(idx)])

        first = timed_batches(cp, run, batches)
        check(path, row_size, host_batches[len(first) - 1], cp.asnumpy(cp.asarray(holder["rows"])))
        hot = timed_batches(cp, run, batches)
        batch = host_batches.shape[1]
        report(out, "numpy-memmap", f"{name}_first", first, batch, row_size)
        report(out, "numpy-memmap", f"{name}_hot", hot, batch, row_size)


def bench_uva(cp, out, path, row_size, workloads):
    size = os.path.getsize(path)
    rows = size // row_size
    if row_size % 8:
        print("cupy-uva-kernel: rows must be whole 8-byte words; skipped", flush=True)
        return
    fd = os.open(path, os.O_RDONLY)
    region = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    host = np.frombuffer(region, dtype=np.uint8)
    ptr = host.ctypes.data
    t = time.perf_counter()
    try:
        # cudaHostRegisterMapped | cudaHostRegisterReadOnly
        cp.cuda.runtime.hostRegister(ptr, size, 2 | 8)
    except Exception as e:  # noqa: BLE001 - the peer's own failure is the result
        out.emit("cupy-uva-kernel", "register", 0, row_size, time.perf_counter() - t, refused=str(e))
        os.close(fd)
        return
    register_s = time.perf_counter() - t
    # cudaDevAttrCanUseHostPointerForRegisteredMem (91): the kernel may use the host address
    # itself (every current GPU on Linux); else the driver's device alias of the pages.
    if cp.cuda.runtime.deviceGetAttribute(91, cp.cuda.Device().id):
        device_ptr = ptr
    else:
        import ctypes

        alias = ctypes.c_uint64()
        driver = ctypes.CDLL("libcuda.so.1")
        if driver.cuMemHostGetDevicePointer_v2(ctypes.byref(alias), ctypes.c_void_p(ptr), 0) != 0:
            sys.exit("cupy-uva-kernel: no device address for the registered file")
        device_ptr = alias.value
    kernel = cp.RawKernel(UVA_KERNEL, "gather")
    bad = cp.zeros(1, dtype=cp.int32)
    words = row_size // 8
    for name, host_batches in workloads:
        batches = [cp.asarray(b) for b in host_batches]
        batch = host_batches.shape[1]
        dst = cp.empty((batch, row_size), dtype=cp.uint8)

        def run(idx):
            threads = 256
            blocks = (batch * 32 + threads - 1) // threads
            kernel((blocks,), (threads,), (device_ptr, rows, idx, batch, dst, np.int32(words), bad))

        first = timed_batches(cp, run, batches)
        check(path, row_size, host_batches[len(first) - 1], cp.asnumpy(dst))
        hot = timed_batches(cp, run, batches)
        report(out, "cupy-uva-kernel", f"{name}_first", first, batch, row_size, register_s=round(register_s, 3))
        report(out, "cupy-uva-kernel", f"{name}_hot", hot, batch, row_size)
    cp.cuda.runtime.hostUnregister(ptr)
    del host
    region.close()
    os.close(fd)


def bench_filehandle_cold(cp, out, path, reads, seed):
    """``reads`` random 4 KiB blocks of ``path``, dropped from the page cache first, read into
    GPU memory in one batch by ``FileHandle``'s batch path."""
    from gpumapio._native import CuFile, read_files

    blocks = os.path.getsize(path) // 4096
    offsets = np.random.default_rng(seed).choice(blocks, size=min(reads, blocks), replace=False) * 4096
    pieces = [(0, int(o), 4096, i * 4096, 1, 0) for i, o in enumerate(offsets)]
    dst = cp.empty(len(pieces) * 4096, dtype=cp.uint8)
    with CuFile(path, "r") as f:
        gpumapio.pagecache.evict(path)
        cp.cuda.runtime.deviceSynchronize()
        t = time.perf_counter()
        counts = read_files(dst, [f], pieces)
        cp.cuda.runtime.deviceSynchronize()
        seconds = time.perf_counter() - t
    assert all(n == 4096 for n in counts), "short reads"
    # A sample of the blocks checked against the file, byte for byte.
    got = cp.asnumpy(dst).reshape(-1, 4096)
    with open(path, "rb") as f:
        for i in range(0, len(offsets), max(len(offsets) // 64, 1)):
            f.seek(int(offsets[i]))
            assert f.read(4096) == got[i].tobytes(), f"block at {offsets[i]} differs"
    out.emit("gpumap-filehandle-batch", "rand_read_4k_cold", len(pieces), 4096, seconds,
             threads=gpumapio.defaults.get("num_threads"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--row-size", type=int, default=512)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--budget", type=int, default=None, help="the GPU cache's (default: a quarter of the file)")
    ap.add_argument("--memory-max", type=int, default=None)
    ap.add_argument("--only", default="gpumap,zero-copy,in-place,numpy,uva")
    ap.add_argument("--numpy-batch", type=int, default=None, help="rows per NumPy batch (default --batch)")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="per pass of one implementation")
    ap.add_argument("--workloads", default="uniform,skewed")
    ap.add_argument("--filehandle-reads", type=int, default=100_000,
                    help="random 4 KiB reads of --only filehandle")
    ap.add_argument("--settle-seconds", type=float, default=10.0,
                    help="in-place: seconds of untimed gathers before the settled pass")
    a = ap.parse_args()
    import cupy as cp

    MAX_SECONDS[0] = a.max_seconds
    SETTLE_SECONDS[0] = a.settle_seconds
    size = os.path.getsize(a.file)
    rows = size // a.row_size
    budget = a.budget or size // 4
    budget = max(budget // (64 << 20), 1) * (64 << 20)
    tag = {}
    if a.memory_max:
        tag["cgroup"] = enter_cgroup(a.memory_max)
        print(f"in {tag['cgroup']}: memory.max {a.memory_max} bytes, file {size} bytes", flush=True)
    workloads = [
        (w, index_batches(rows, a.batch, a.batches, w == "skewed", seed=i))
        for i, w in enumerate(a.workloads.split(","))
    ]
    out = Out(a.jsonl)
    only = a.only.split(",")
    print(f"gpumapio {gpumapio.__version__}: {rows} rows of {a.row_size} B, batches of {a.batch}", flush=True)
    for which in only:
        if a.memory_max:
            gpumapio.pagecache.evict(a.file)
        if which == "gpumap":
            bench_gpumap(cp, out, a.file, a.row_size, workloads, budget, zero_copy=False)
        elif which == "zero-copy":
            bench_gpumap(cp, out, a.file, a.row_size, workloads, budget, zero_copy=True)
        elif which == "in-place":
            bench_gpumap(cp, out, a.file, a.row_size, workloads, budget, zero_copy="misses")
        elif which == "numpy":
            bench_numpy(cp, out, a.file, a.row_size, workloads, a.numpy_batch or a.batch)
        elif which == "uva":
            bench_uva(cp, out, a.file, a.row_size, workloads)
        elif which == "filehandle":
            bench_filehandle_cold(cp, out, a.file, a.filehandle_reads, seed=99)
        else:
            sys.exit(f"--only {which}: expected gpumap, zero-copy, in-place, numpy, uva or filehandle")


if __name__ == "__main__":
    main()
