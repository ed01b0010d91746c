"""What a process's first transfer pays before its first byte moves: the CUDA context, and
pinning the bounce buffers, pinned in the ways the driver offers. Each case runs in a fresh
process of its own, so that no case inherits another's pinned pages.

    python3 python/bench/pinning_probe.py [--buffers 32] [--size-mib 4] [--threads 16] [--json OUT]

Cases (times in ms, one line of JSON each):

- ``context``: ``cuInit`` and retaining the primary context (what torch's first CUDA call pays);
- ``alloc-each``: ``cuMemHostAlloc(PORTABLE)`` of every buffer in turn, on one thread (what
  gpumap's bounce pool does);
- ``alloc-threads``: the same buffers pinned by ``--threads`` threads at once (a 16-thread
  pool's first read);
- ``alloc-one``: one ``cuMemHostAlloc`` of all the buffers' bytes;
- ``register-thp``: ``mmap`` of all the bytes, ``madvise(MADV_HUGEPAGE)``, touched, then one
  ``cuMemHostRegister(PORTABLE)``;
- ``register-4k``: the same with ``MADV_NOHUGEPAGE``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import subprocess
import sys
import threading
import time

CASES = ["context", "alloc-each", "alloc-threads", "alloc-one", "register-thp", "register-4k"]
PORTABLE = 1
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15


def _check(what: str, status: int) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed: CUresult {status}")


def _context(cuda: ctypes.CDLL) -> ctypes.c_void_p:
    _check("cuInit", cuda.cuInit(0))
    device, ctx = ctypes.c_int(), ctypes.c_void_p()
    _check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), 0))
    _check("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device))
    _check("cuCtxSetCurrent", cuda.cuCtxSetCurrent(ctx))
    return ctx


def _alloc(cuda: ctypes.CDLL, size: int) -> None:
    ptr = ctypes.c_void_p()
    _check("cuMemHostAlloc", cuda.cuMemHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(size), PORTABLE))


def _register(cuda: ctypes.CDLL, size: int, advice: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    # 2 MiB more than asked, so that the region can start on a huge page's boundary.
    raw = libc.mmap(None, size + (2 << 20), mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if raw in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    start = -(-raw // (2 << 20)) * (2 << 20)
    libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(size), advice)
    ctypes.memset(start, 0, size)  # touched: the pages exist before they are pinned
    _check("cuMemHostRegister", cuda.cuMemHostRegister_v2(ctypes.c_void_p(start), ctypes.c_size_t(size), PORTABLE))


def one_case(case: str, buffers: int, size: int, threads: int) -> dict:
    cuda = ctypes.CDLL("libcuda.so.1")
    start = time.perf_counter()
    ctx = _context(cuda)
    out = {"case": case, "context_ms": (time.perf_counter() - start) * 1e3}
    start = time.perf_counter()
    if case == "alloc-each":
        for _ in range(buffers):
            _alloc(cuda, size)
    elif case == "alloc-threads":
        def pin(n: int) -> None:
            cuda.cuCtxSetCurrent(ctx)
            for _ in range(n):
                _alloc(cuda, size)

        per = -(-buffers // threads)
        workers = [threading.Thread(target=pin, args=(min(per, buffers - k * per),)) for k in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    elif case == "alloc-one":
        _alloc(cuda, buffers * size)
    elif case == "register-thp":
        _register(cuda, buffers * size, MADV_HUGEPAGE)
    elif case == "register-4k":
        _register(cuda, buffers * size, MADV_NOHUGEPAGE)
    out["pin_ms"] = (time.perf_counter() - start) * 1e3 if case != "context" else 0.0
    out["bytes"] = buffers * size if case != "context" else 0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--buffers", type=int, default=32)
    parser.add_argument("--size-mib", type=int, default=4)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # the child's case
    args = parser.parse_args()
    size = args.size_mib << 20
    if args.case:
        print(json.dumps(one_case(args.case, args.buffers, size, args.threads)))
        return
    rows = []
    for _ in range(args.repeat):
        for case in CASES:
            command = [sys.executable, __file__, "--case", case, "--buffers", str(args.buffers),
                       "--size-mib", str(args.size_mib), "--threads", str(args.threads)]
            child = subprocess.run(command, capture_output=True, text=True)
            if child.returncode != 0:
                print(f"{case}: failed: {child.stderr[-1500:]}", file=sys.stderr)
                continue
            row = json.loads(child.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{case:14s} context {row['context_ms']:7.1f} ms  pin {row['pin_ms']:7.1f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
