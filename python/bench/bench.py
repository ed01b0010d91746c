"""gpumapio's Python API on the workloads of ``on-device.sh bench``, in the shared JSON-lines
format (``docs/benchmarks.md``; ``impl`` = ``gpumap-py``), plus the Python overhead of a
small read and safetensors loading beside ``safetensors.torch.load_file(device="cuda")``.

    python3 python/bench/bench.py FILE --jsonl OUT.jsonl [--quick] [--only seq,rand,write,small,safetensors]

FILE is read, never written (writes go to FILE.gpumap-py-write, removed afterwards). The
safetensors workloads make FILE.safetensors (64 float32 tensors over FILE's bytes, up to
4 GiB) and remove it. Needs a GPU with CuPy (and PyTorch for safetensors); KvikIO's Python,
where it imports, is measured on the small-read overhead in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np

import gpumapio
from gpumapio import defaults, pagecache

IMPL = "gpumap-py"


class Out:
    def __init__(self, path: str):
        self.f = open(path, "a")

    def emit(self, impl, workload, threads, nbytes, seconds, ops=None, **extra):
        seconds = max(seconds, 1e-9)
        rec = {
            "impl": impl,
            "workload": workload,
            "threads": threads,
            "bytes": nbytes,
            "seconds": round(seconds, 6),
            "gbps": round(nbytes / seconds / 1e9, 3),
        }
        if ops:
            rec["ops"] = ops
            rec["iops"] = round(ops / seconds, 1)
        rec.update(extra)
        line = json.dumps(rec)
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def drop_caches(path: str) -> None:
    """Cold: the whole page cache where we may (root), else the file's pages."""
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        pagecache.evict(path)


def synced(cp, fn):
    cp.cuda.runtime.deviceSynchronize()
    t = time.perf_counter()
    fn()
    cp.cuda.runtime.deviceSynchronize()
    return time.perf_counter() - t


def best_of(n, measure):
    return min(measure() for _ in range(max(n, 1)))


def random_offsets(file_len: int, block: int, count: int) -> list[int]:
    """The bench crate's generator (xorshift, same seed), so both pick the same blocks."""
    blocks = max(file_len // block, 1)
    x = 0x2545_F491_4F6C_DD1D
    mask = (1 << 64) - 1
    out = []
    for _ in range(count):
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        out.append((x % blocks) * block)
    return out


def seq(cp, out, path, size, threads, repeats):
    buf = cp.empty(size, dtype=cp.uint8)
    for n in threads:
        with defaults.set("num_threads", n):
            with gpumapio.CuFile(path, "r") as f:
                f.read(buf)  # bounce buffers, streams
                drop_caches(path)
                out.emit(IMPL, "seq_read_cold", n, size, synced(cp, lambda: f.read(buf)))
                f.read(buf)
                warm = best_of(repeats, lambda: synced(cp, lambda: f.read(buf)))
                out.emit(IMPL, "seq_read_warm", n, size, warm)
    host = np.fromfile(path, dtype=np.uint8, count=min(size, 64 << 20))
    assert (cp.asnumpy(buf[: host.size]) == host).all(), "gpumap-py sequential read mismatch"


def rand(cp, out, path, size, threads, ops):
    n = max(threads)
    for block, count in ((4096, ops), (65536, ops // 4)):
        if size < block:
            continue
        offsets = random_offsets(size, block, count)
        dst = cp.empty(count * block, dtype=cp.uint8)
        slices = [dst[i * block : (i + 1) * block] for i in range(count)]
        with defaults.set("num_threads", n), gpumapio.CuFile(path, "r") as f:
            for temperature in ("cold", "warm"):
                if temperature == "cold":
                    drop_caches(path)

                def run():
                    futures = [f.pread(s, block, o) for s, o in zip(slices, offsets)]
                    for fu in futures:
                        fu.get()

                secs = synced(cp, run)
                out.emit(IMPL, f"rand_read_{block // 1024}k_{temperature}", n, count * block, secs, ops=count)
        got = cp.asnumpy(dst)
        with open(path, "rb") as raw:
            for i, o in enumerate(offsets[:64]):
                raw.seek(o)
                assert got[i * block : (i + 1) * block].tobytes() == raw.read(block), "random read mismatch"


def write(cp, out, path, size, threads):
    wsize = min(size, 1 << 30)
    src = cp.zeros(wsize, dtype=cp.uint8)
    target = path + ".gpumap-py-write"
    try:
        for n in sorted({1, max(threads)}):
            with defaults.set("num_threads", n):
                for durable in (False, True):
                    def run():
                        with gpumapio.CuFile(target, "w") as f:
                            assert f.write(src) == wsize
                            if durable:
                                os.fsync(f.fileno())

                    out.emit(IMPL, "seq_write_durable" if durable else "seq_write", n, wsize, synced(cp, run))
    finally:
        if os.path.exists(target):
            os.unlink(target)


def small(cp, out, path, size, reps, rounds=3):
    """The cost of one small call: pread(4 KiB).get() and read(4 KiB), one at a time, at the
    bench crate's random offsets (read once first, so warm), beside KvikIO's pread(4 KiB).get()
    where it imports; ``rounds`` interleaved rounds, a record each. The Rust bench's
    ``pread_4k_sync_warm`` row (impl gpumap-filehandle) and ``bench-small_calls`` are the same
    loops without Python."""
    dst = cp.empty(4096, dtype=cp.uint8)
    offsets = random_offsets(size, 4096, reps)
    try:
        import kvikio
    except ImportError:
        kvikio = None
    with contextlib.ExitStack() as files:
        f = files.enter_context(gpumapio.CuFile(path, "r"))
        k = files.enter_context(kvikio.CuFile(path, "r")) if kvikio else None
        for o in offsets:
            f.pread(dst, 4096, o).get()
            if kvikio:
                k.pread(dst, 4096, o).get()
        for _ in range(rounds):
            t = time.perf_counter()
            for o in offsets:
                f.pread(dst, 4096, o).get()
            out.emit(IMPL, "pread_4k_sync_warm", 1, reps * 4096, time.perf_counter() - t, ops=reps)
            t = time.perf_counter()
            for o in offsets:
                f.read(dst, 4096, o)
            out.emit(IMPL, "read_4k_sync_warm", 1, reps * 4096, time.perf_counter() - t, ops=reps)
            if kvikio:
                t = time.perf_counter()
                for o in offsets:
                    k.pread(dst, 4096, o).get()
                out.emit("kvikio-py", "pread_4k_sync_warm", 1, reps * 4096, time.perf_counter() - t, ops=reps)


def make_safetensors(path: str, size: int) -> tuple[str, int]:
    """64 float32 tensors over the first (up to) 4 GiB of ``path``, as a safetensors file."""
    per = max((min(size, 4 << 30) // 64) // 4096 * 4096, 4096)
    header = {f"layer{i:02d}.weight": {"dtype": "F32", "shape": [per // 4], "data_offsets": [i * per, (i + 1) * per]} for i in range(64)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    target = path + ".safetensors"
    total = 64 * per
    with open(path, "rb") as src, open(target, "wb") as dst:
        dst.write(struct.pack("<Q", len(raw)) + raw)
        copied = 0
        while copied < total:
            chunk = src.read(min(64 << 20, total - copied)) or b"\0" * min(64 << 20, total - copied)
            dst.write(chunk)
            copied += len(chunk)
    return target, os.path.getsize(target)


FAST_PATH = """
import os, sys, time, torch
from safetensors import safe_open
torch.cuda.synchronize()
t = time.perf_counter()
with safe_open(sys.argv[1], framework="pt", device="cuda") as f:
    tensors = {k: f.get_tensor(k) for k in f.keys()}
torch.cuda.synchronize()
print(time.perf_counter() - t)
"""


def safetensors_bench(out, path, size, repeats):
    import torch
    import safetensors.torch as st

    target, nbytes = make_safetensors(path, size)
    threads = defaults.get("num_threads")
    try:
        def ours():
            torch.cuda.synchronize()
            t = time.perf_counter()
            got = gpumapio.load_safetensors(target, "cuda")
            torch.cuda.synchronize()
            return time.perf_counter() - t, got

        def theirs():
            torch.cuda.synchronize()
            t = time.perf_counter()
            got = st.load_file(target, device="cuda")
            torch.cuda.synchronize()
            return time.perf_counter() - t, got

        def plain_read():
            torch.cuda.synchronize()
            t = time.perf_counter()
            gpumapio.read_file_to_device(target, output="torch")
            torch.cuda.synchronize()
            return time.perf_counter() - t, None

        def fast_path():
            env = dict(os.environ, SAFETENSORS_FAST_CUDA="1", SAFETENSORS_FAST_GPU="1")
            run = subprocess.run([sys.executable, "-c", FAST_PATH, target], env=env, capture_output=True, text=True)
            if run.returncode != 0:
                raise RuntimeError(run.stderr.strip().splitlines()[-1] if run.stderr else "failed")
            return float(run.stdout.strip().splitlines()[-1]), None

        def fastsafetensors():
            from fastsafetensors import SafeTensorsFileLoader, SingleGroup

            torch.cuda.synchronize()
            t = time.perf_counter()
            loader = SafeTensorsFileLoader(SingleGroup(), torch.device("cuda:0"), nogds=True)
            loader.add_filenames({0: [target]})
            fb = loader.copy_files_to_device()
            got = {k: fb.get_tensor(k) for k in fb.key_to_rank_lidx}
            torch.cuda.synchronize()
            secs = time.perf_counter() - t
            del got
            fb.close()
            loader.close()
            return secs, None

        peers = [
            (IMPL, ours),
            ("gpumap-py-read", plain_read),
            ("safetensors-load_file", theirs),
            ("safetensors-fast", fast_path),
            ("fastsafetensors-nogds", fastsafetensors),
        ]
        for temperature in ("cold", "warm"):
            for impl, fn in peers:
                try:
                    if temperature == "cold":
                        drop_caches(target)
                        secs, _ = fn()
                    else:
                        fn()
                        secs = min(fn()[0] for _ in range(repeats))
                except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported
                    print(f"{impl}: {e}", flush=True)
                    continue
                out.emit(impl, f"safetensors_load_{temperature}", threads, nbytes, secs)
        _, a = ours()
        _, b = theirs()
        # Bitwise: the tensors are random bytes, so some floats are NaN, which never equal.
        same = all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)
        assert a.keys() == b.keys() and same, "safetensors mismatch"
    finally:
        os.unlink(target)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--threads", default="1,4,8,16")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="seq,rand,write,small,safetensors")
    a = ap.parse_args()
    import cupy as cp

    only = set(a.only.split(","))
    size = os.path.getsize(a.file)
    threads = [int(t) for t in a.threads.split(",")]
    out = Out(a.jsonl)
    repeats = 2 if a.quick else 3
    with gpumapio.CuFile(a.file, "r") as f:
        print(f"gpumapio {gpumapio.__version__}, {size} bytes, device path: {f.compat_decision()}", flush=True)
    if "seq" in only:
        seq(cp, out, a.file, size, threads, repeats)
    if "rand" in only:
        rand(cp, out, a.file, size, threads, 4096 if a.quick else 32768)
    if "write" in only:
        write(cp, out, a.file, size, threads)
    if "small" in only:
        small(cp, out, a.file, size, 2000 if a.quick else 20000)
    if "safetensors" in only:
        safetensors_bench(out, a.file, size, repeats)


if __name__ == "__main__":
    main()
