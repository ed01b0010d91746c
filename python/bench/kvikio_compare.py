"""The peer side of ``on-device.sh bench``: KvikIO, and the NumPy + CuPy code a Python user
writes today, on the same file in the same run as gpumap's bench binaries, appending the same
JSON lines (docs/benchmarks.md, "The JSON-lines format") so that scripts/gpu/ratio.py can put
them side by side.

    python3 python/bench/kvikio_compare.py FILE --jsonl OUT.jsonl [--threads 1,4,8,16] [--quick]

Workloads, named as the bench binaries name theirs:

- ``seq_read_cold`` / ``seq_read_warm``: the whole file into device memory, through KvikIO's
  POSIX path (``kvikio-posix``), cuFile (``kvikio-cufile``, at the largest thread count only),
  ``kvikio.Mmap`` (``kvikio-mmap``) and ``np.fromfile`` + ``cupy.asarray`` (``numpy-cupy``);
- ``rand_read_4k_*`` / ``rand_read_64k_*``: random block-aligned reads, all in flight together,
  beside ``np.memmap`` fancy indexing + ``cupy.asarray`` in batches of 1024 rows
  (``numpy-memmap-cupy``, one thread); the first reads are checked against the file;
- ``seq_write`` / ``seq_write_durable``: up to 1 GiB from device memory to a new file, without
  and with ``fsync``.

Cold means the page cache was dropped first (root only; elsewhere the figure is warm).
"""

import argparse
import json
import os
import subprocess
import sys
import time

import cupy
import kvikio
import kvikio.defaults
import numpy as np

# The same seed every run, so that runs read the same offsets.
SEED = 12345
# Rows per np.memmap gather: what a user batching by hand would pick.
NUMPY_BATCH = 1024


def drop_caches():
    """Empties the page cache (root only); False where the figure will be warm."""
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


class Recorder:
    """Appends one JSON line per measurement to the JSONL file and echoes it."""

    def __init__(self, path):
        self.out = open(path, "a")

    def emit(self, impl, workload, threads, nbytes, seconds, ops=None):
        record = {"impl": impl, "workload": workload, "threads": threads, "bytes": nbytes,
                  "seconds": round(seconds, 6), "gbps": round(nbytes / seconds / 1e9, 3)}
        if ops:
            record["ops"] = ops
            record["iops"] = round(ops / seconds, 1)
        line = json.dumps(record)
        print(line, flush=True)
        self.out.write(line + "\n")
        self.out.flush()


def timed(fn):
    """Seconds `fn` takes, the device idle before and after, so queued GPU work counts."""
    cupy.cuda.runtime.deviceSynchronize()
    start = time.perf_counter()
    fn()
    cupy.cuda.runtime.deviceSynchronize()
    return time.perf_counter() - start


def usable_modes(path, buf):
    """KvikIO's paths that work here. Its POSIX path (compat mode on) is its fastest on the lent
    machine; cuFile (compat mode off) only where cuFile registers the file."""
    usable = []
    for impl, mode in [("kvikio-posix", kvikio.CompatMode.ON),
                       ("kvikio-cufile", kvikio.CompatMode.OFF)]:
        kvikio.defaults.set({"compat_mode": mode})
        try:
            with kvikio.CuFile(path, "r") as f:
                f.read(buf[:4096], 4096, 0)
            usable.append((impl, mode))
        except Exception as e:  # noqa: BLE001 - report it and measure the other path
            print(f"{impl}: unusable here ({e})", flush=True)
    return usable


def sequential_reads(rec, path, size, buf, usable, threads):
    for n in threads:
        kvikio.defaults.set({"num_threads": n})
        for temperature in ("cold", "warm"):
            for impl, mode in usable:
                # cuFile's compatibility mode is slow here: one thread count is enough to show it.
                if impl == "kvikio-cufile" and n != max(threads):
                    continue
                kvikio.defaults.set({"compat_mode": mode})
                if temperature == "cold":
                    drop_caches()

                def read():
                    with kvikio.CuFile(path, "r") as f:
                        assert f.pread(buf).get() == size

                rec.emit(impl, f"seq_read_{temperature}", n, size, timed(read))
            if temperature == "cold":
                drop_caches()

            def read_mmap():
                m = kvikio.Mmap(path, "r")
                assert m.pread(buf).get() == size
                m.close()

            rec.emit("kvikio-mmap", f"seq_read_{temperature}", n, size, timed(read_mmap))
    for temperature in ("cold", "warm"):
        if temperature == "cold":
            drop_caches()

        def read_numpy():
            buf[:] = cupy.asarray(np.fromfile(path, dtype=np.uint8))

        rec.emit("numpy-cupy", f"seq_read_{temperature}", 1, size, timed(read_numpy))


def random_reads(rec, path, size, usable, nthreads, quick):
    kvikio.defaults.set({"num_threads": nthreads})
    rng = np.random.default_rng(SEED)
    for io in (4096, 65536):
        if io == 4096:
            count = 4096 if quick else 32768
        else:
            count = 1024 if quick else 8192
        offsets = (rng.integers(0, size // io, count) * io).tolist()
        dst = cupy.empty(count * io, dtype=cupy.uint8)
        label = f"rand_read_{io // 1024}k"
        for impl, mode in usable:
            kvikio.defaults.set({"compat_mode": mode})
            for temperature in ("cold", "warm"):
                if temperature == "cold":
                    drop_caches()

                def read_all():
                    with kvikio.CuFile(path, "r") as f:
                        futures = [f.pread(dst[i * io:(i + 1) * io], io, o)
                                   for i, o in enumerate(offsets)]
                        for future in futures:
                            future.get()

                rec.emit(impl, f"{label}_{temperature}", nthreads, count * io, timed(read_all),
                         ops=count)
        # What a Python user writes today for random rows: np.memmap fancy indexing (through
        # the page cache), then cupy.asarray, in batches, on one thread.
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        rows = np.asarray(offsets, dtype=np.int64) // io
        table = mm[: (size // io) * io].reshape(-1, io)
        for temperature in ("cold", "warm"):
            if temperature == "cold":
                drop_caches()

            def gather():
                for i in range(0, count, NUMPY_BATCH):
                    batch = table[rows[i:i + NUMPY_BATCH]]
                    dst[i * io:(i + NUMPY_BATCH) * io] = cupy.asarray(batch).ravel()

            rec.emit("numpy-memmap-cupy", f"{label}_{temperature}", 1, count * io, timed(gather),
                     ops=count)
        del table, mm
        # A figure of wrong bytes is no figure: the first reads must match the file.
        host = np.fromfile(path, dtype=np.uint8)
        got = cupy.asnumpy(dst)
        for i, o in enumerate(offsets[:64]):
            assert (got[i * io:(i + 1) * io] == host[o:o + io]).all(), "random read mismatch"
        del host


def writes(rec, path, size, buf, usable, nthreads):
    wsize = min(size, 1 << 30)
    wpath = path + ".kvikio-write"
    for impl, mode in usable:
        kvikio.defaults.set({"compat_mode": mode})
        for n in (1, nthreads):
            kvikio.defaults.set({"num_threads": n})
            for durable in (False, True):
                def write():
                    with kvikio.CuFile(wpath, "w") as f:
                        assert f.pwrite(buf[:wsize]).get() == wsize
                        if durable:
                            os.fsync(f.fileno())

                workload = "seq_write_durable" if durable else "seq_write"
                rec.emit(impl, workload, n, wsize, timed(write))
    os.unlink(wpath)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--threads", default="1,4,8,16")
    ap.add_argument("--quick", action="store_true", help="fewer random reads")
    args = ap.parse_args()
    path, size = args.file, os.path.getsize(args.file)
    threads = [int(t) for t in args.threads.split(",")]
    rec = Recorder(args.jsonl)
    print(f"kvikio {kvikio.__version__} file {size} bytes, compat preferred: "
          f"{kvikio.defaults.is_compat_mode_preferred()}", flush=True)
    buf = cupy.empty(size, dtype=cupy.uint8)
    usable = usable_modes(path, buf)
    sequential_reads(rec, path, size, buf, usable, threads)
    random_reads(rec, path, size, usable, max(threads), args.quick)
    writes(rec, path, size, buf, usable, max(threads))


if __name__ == "__main__":
    sys.exit(main())
