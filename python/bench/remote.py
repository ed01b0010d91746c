"""Issue 25's remote-read bench: ``gpumapio.RemoteFile`` beside ``kvikio.RemoteFile`` on one
local HTTP range server, and the bound: the rate at which that server serves the same bytes to
a plain parallel client (``http.client``), all measured in one run on the same object.
``--protocol s3`` reads it as an S3 object instead: both clients open it with ``open_s3``
(credentials and endpoint from the AWS environment variables, which the bench sets), so each
request is signed (SigV4) as against any S3 server; the server answers S3's path-style GETs
and HEADs, with an ETag and a Last-Modified, and does not check the signatures.

    python3 python/bench/remote.py --jsonl OUT.jsonl [--size 4GiB] [--dir DIR] [--repeats 3]
        [--threads 32] [--client-procs N] [--server-procs N] [--request-size 4MiB]
        [--ops-4k 4096] [--ops-1m 2048] [--rows 100000] [--only plain,gpumap,kvikio,rows]
        [--rows-memory device|host] [--gpumap-request-size SIZE] [--interleave [--isolate]]
        [--protocol http|s3]

The server runs in its own processes (``--server-procs``, one listening socket each on a
shared port through SO_REUSEPORT, a thread per connection, bodies sent with ``os.sendfile``
from the page cache), so that the clients' GIL does not slow it. Workloads (``impl`` ours when
it starts with ``gpumap``; ``memory`` says where the bytes land):

- ``remote_read_whole`` (``remote_s3_read_whole`` with ``--protocol s3``, and so for the
  others): the whole object, one ``read`` (the plain client: ranged GETs of
  ``--request-size`` over ``--threads`` keep-alive connections in ``--client-procs`` processes);
- ``remote_rand_4k`` / ``remote_rand_1m``: aligned ranges at offsets from a fixed seed, the
  same for every client, all issued as ``pread`` futures at once and then waited.

- ``remote_rows_512_cold`` / ``remote_rows_512_hot`` (``--rows``, the ``rows`` part of
  ``--only``): random 512-byte rows of the object as a table, gathered into one array:
  ``gpumapio.map(url)`` (the GPU page cache over the object; cold: a fresh map each run, every
  row's 4 KiB extent fetched; hot: the same rows again, resident) beside one ``pread`` future
  per row of ``gpumapio.RemoteFile`` and ``kvikio.RemoteFile`` (what a reader without a cache
  does, every time). In GPU memory where CuPy is; ``--rows-memory host`` puts the cache and the
  rows in host memory. Over HTTP only.

Each case runs once untimed and verified (sampled blocks compared with the file; a mismatch
fails the run), then ``--repeats`` timed runs; ``seconds`` is their median, ``best_seconds``
their minimum. With ``--interleave``, gpumap's and KvikIO's runs of a workload alternate repeat
by repeat (the order reversed each time), so that both see the same machine; their records add
``paired_ratios``, each repeat's KvikIO time over gpumap's (above 1: gpumap faster). With
``--isolate`` too, each client runs in a process of its own, the parent taking turns between
them as before (records add ``isolated``), so that neither client's threads run beside the
other's runs. Every client gets the same parallelism, ``--threads``: the plain client's
connections, gpumap's ``max_in_flight``, KvikIO's ``num_threads``.
"""

from __future__ import annotations

import argparse
import functools
import json
import mmap
import multiprocessing as mp
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from email.utils import formatdate
from http.client import HTTPConnection

# NumPy's OpenBLAS threads spin after use: in the server's processes and the clients they took
# cores from every reader (a profile on the H200 put them at 13-20 % of all samples). Nothing
# here does linear algebra.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

RANGE = re.compile(rb"bytes=(\d+)-(\d*)")
SAMPLE = 4096
BUCKET, KEY = "bench", "obj"  # ``--protocol s3``: the object's bucket and key


def parse_size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    m = re.fullmatch(r"(\d+)\s*([kmgt]?)(i?b)?", text.strip().lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text}")
    return int(m.group(1)) * units[m.group(2)]


# ---- the server (its own processes) ----

def handle(conn: socket.socket, fd: int, size: int, s3_head: str) -> None:
    """One keep-alive connection: HEAD and ranged GETs, until the client closes it. A request for
    the S3 path (``/bucket/key``) is answered with ``s3_head`` too: the ETag and Last-Modified an
    S3 client expects."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rfile = conn.makefile("rb")
    try:
        while True:
            line = rfile.readline(65537)
            if not line:
                return
            method, path, *_ = line.split(b" ") + [b""]
            rng, close = None, False
            while (h := rfile.readline(65537)) not in (b"\r\n", b"\n", b""):
                name, _, value = h.partition(b":")
                name = name.strip().lower()
                if name == b"range":
                    rng = value.strip()
                elif name == b"connection":
                    close = value.strip().lower() == b"close"
            start, end, status = 0, size - 1, "200 OK"
            if method not in (b"GET", b"HEAD"):
                conn.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                continue
            if rng is not None:
                m = RANGE.fullmatch(rng)
                start = int(m.group(1)) if m else size
                end = min(int(m.group(2)), size - 1) if m and m.group(2) else size - 1
                if start >= size or end < start:
                    conn.sendall(f"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{size}"
                                 f"\r\nContent-Length: 0\r\n\r\n".encode())
                    continue
                status = "206 Partial Content"
            n = end - start + 1
            head = f"HTTP/1.1 {status}\r\nContent-Length: {n}\r\nAccept-Ranges: bytes\r\n"
            if status[0] == "2" and rng is not None:
                head += f"Content-Range: bytes {start}-{end}/{size}\r\n"
            if path == f"/{BUCKET}/{KEY}".encode():
                head += s3_head
            if method == b"HEAD":
                conn.sendall((head + "\r\n").encode())
                continue
            # MSG_MORE: the header leaves in the same segment as the body's first bytes.
            conn.sendall((head + "\r\n").encode(), socket.MSG_MORE)
            while n:
                sent = os.sendfile(conn.fileno(), fd, start, n)
                if sent == 0:
                    return
                start, n = start + sent, n - sent
            if close:
                return
    except OSError:
        pass  # the client went away mid-request; nothing to answer
    finally:
        conn.close()


def listener(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", port))
    s.listen(4096)
    return s


def serve(path: str, procs: int) -> None:
    fd, size = os.open(path, os.O_RDONLY), os.path.getsize(path)
    mtime = os.path.getmtime(path)
    s3_head = f'ETag: "{size:x}-{int(mtime):x}"\r\nLast-Modified: {formatdate(mtime, usegmt=True)}\r\n'
    s = listener(0)
    port = s.getsockname()[1]
    for _ in range(procs - 1):
        if os.fork() == 0:
            s.close()  # each process accepts on its own socket, the kernel spreads connections
            s = listener(port)
            break
    else:
        print(port, flush=True)  # the parent's socket is listening: clients may connect
    while True:
        conn, _ = s.accept()
        threading.Thread(target=handle, args=(conn, fd, size, s3_head), daemon=True).start()


# ---- the plain parallel client (its own processes, so one GIL does not bound it) ----

def get_range(conn: HTTPConnection, off: int, dst: memoryview) -> None:
    conn.request("GET", "/obj", headers={"Range": f"bytes={off}-{off + len(dst) - 1}"})
    r = conn.getresponse()
    if r.status != 206:
        raise RuntimeError(f"GET {off}: status {r.status}")
    got = 0
    while got < len(dst):
        n = r.readinto(dst[got:])
        if not n:
            raise RuntimeError(f"GET {off}: short body")
        got += n


def client_proc(port, path, jobs, threads, repeats, barrier, errors):
    """``jobs``: (file offset, length); they land one after another in this process's buffer."""
    dst = np.zeros(sum(n for _, n in jobs), dtype=np.uint8)
    mv = memoryview(dst)
    places = np.cumsum([0] + [n for _, n in jobs]).tolist()
    conns = [HTTPConnection("127.0.0.1", port) for _ in range(threads)]
    for c in conns:  # connected before the clock starts, as the other clients' pools are
        c.connect()

    def work(conn, it):
        try:
            for i in it:
                off, n = jobs[i]
                get_range(conn, off, mv[places[i]:places[i] + n])
        except Exception as e:  # reported, not raised: the process must still meet the barrier
            errors.put(f"plain client: {e!r}")

    for _ in range(repeats + 1):
        barrier.wait()
        it = iter(range(len(jobs)))  # next() on it is atomic under the GIL: a shared queue
        ts = [threading.Thread(target=work, args=(c, it)) for c in conns]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        barrier.wait()
    with open(path, "rb") as f:
        for i in range(0, len(jobs), max(len(jobs) // 16, 1)):
            off, n = jobs[i]
            f.seek(off)
            if f.read(n) != mv[places[i]:places[i] + n]:
                errors.put(f"plain client: bytes differ at {off}")


def plain_client(a, jobs):
    ctx = mp.get_context("spawn")
    procs = min(a.client_procs, a.threads)
    barrier, errors = ctx.Barrier(procs + 1), ctx.Queue()
    ps = [ctx.Process(target=client_proc, args=(a.port, a.file, jobs[p::procs], a.threads // procs,
                                                a.repeats, barrier, errors)) for p in range(procs)]
    for p in ps:
        p.start()
    times = []
    for _ in range(a.repeats + 1):
        barrier.wait()
        t = time.perf_counter()
        barrier.wait()
        times.append(time.perf_counter() - t)
    for p in ps:
        p.join()
    if not errors.empty() or any(p.exitcode for p in ps):
        sys.exit(errors.get() if not errors.empty() else "plain client: a process failed")
    return times[1:]  # the first was the untimed pass


# ---- the bench ----

class Out:
    def __init__(self, path: str):
        self.f, self.recs = open(path, "a"), []

    def emit(self, impl, workload, threads, nbytes, times, ops=None, **extra):
        seconds = max(statistics.median(times), 1e-9)
        rec = {"impl": impl, "workload": workload, "threads": threads, "bytes": nbytes,
               "seconds": round(seconds, 6), "gbps": round(nbytes / seconds / 1e9, 3)}
        if ops:
            rec["ops"], rec["iops"] = ops, round(ops / seconds, 1)
        rec.update(best_seconds=round(min(times), 6), repeats=len(times), **extra)
        self.recs.append(rec)
        print(json.dumps(rec), flush=True)
        print(json.dumps(rec), file=self.f, flush=True)


def check(mm, dst, ranges, what):
    """Compares sampled ranges (dst offset, file offset, length) of ``dst`` with the file."""
    for d, f, n in ranges:
        got = dst[d:d + n]
        got = got.get() if hasattr(got, "get") else got  # a CuPy array comes to the host first
        if bytes(got) != mm[f:f + n]:
            sys.exit(f"{what}: bytes differ at file offset {f}")


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU so far, from /proc/stat's first line ((0, 0) where
    there is none)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def machine_busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Cores kept busy on average between two :func:`machine_cpu` readings."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return busy / total * (os.cpu_count() or 1) if total > 0 else 0.0


def make_case(f, xp, a, impl, offsets, block):
    """One workload on an open file: its destination, ``once()`` (a run) and the sampled ranges
    that :func:`check` compares."""
    dst = xp.zeros(a.size if block is None else len(offsets) * block, dtype=xp.uint8)
    if block is None:
        def once():
            if f.read(dst) != a.size:
                sys.exit(f"{impl}: short read")
        sample = [(o, o, SAMPLE) for o in np.linspace(0, a.size - SAMPLE, 64, dtype=np.int64).tolist()]
    else:
        views = [dst[i * block:(i + 1) * block] for i in range(len(offsets))]

        def once():
            futs = [f.pread(v, block, o) for v, o in zip(views, offsets)]
            if sum(fu.get() for fu in futs) != len(offsets) * block:
                sys.exit(f"{impl}: short pread")
        sample = [(i * block, offsets[i], block) for i in range(0, len(offsets), max(len(offsets) // 8, 1))]
    return dst, once, sample


class Timings:
    """A case's timed runs: wall seconds, the client's CPU seconds, the machine's busy cores."""

    def __init__(self):
        self.times, self.cpu, self.busy = [], [], []

    def run(self, once, sync):
        sync()
        machine, c, t = machine_cpu(), time.process_time(), time.perf_counter()
        once()
        sync()
        self.times.append(time.perf_counter() - t)
        self.cpu.append(time.process_time() - c)
        self.busy.append(machine_busy(machine, machine_cpu()))

    def emit(self, out, a, impl, name, dst, offsets, block, memory, **extra):
        # The client's CPU seconds a run (all its threads), and the cores the whole machine kept
        # busy meanwhile: the server shares the machine, so a client's CPU is the server's loss.
        ops = None if block is None else len(offsets)
        out.emit(impl, name, a.threads, dst.nbytes, self.times, ops=ops, memory=memory, size=a.size,
                 cpu_seconds=round(statistics.median(self.cpu), 4),
                 machine_busy_cores=round(statistics.median(self.busy), 2), **extra)


def opened(a, impl, opener):
    f = opener(BUCKET, KEY) if a.protocol == "s3" else opener(f"http://127.0.0.1:{a.port}/obj")
    if f.nbytes() != a.size:
        sys.exit(f"{impl}: nbytes() {f.nbytes()} != {a.size}")
    return f


def syncer(cp, xp):
    return cp.cuda.runtime.deviceSynchronize if xp is cp and cp is not None else (lambda: None)


def run_client(a, mm, cp, impl, opener, memory, workloads, out, **extra):
    xp = cp if memory == "device" else np
    f = opened(a, impl, opener)
    sync = syncer(cp, xp)
    for name, offsets, block in workloads:
        dst, once, sample = make_case(f, xp, a, impl, offsets, block)
        timings = Timings()
        for r in range(a.repeats + 1):
            timings.run(once, sync)
            if r in (0, a.repeats):
                check(mm, dst, sample, impl)
        timings.times, timings.cpu, timings.busy = timings.times[1:], timings.cpu[1:], timings.busy[1:]
        timings.emit(out, a, impl, name, dst, offsets, block, memory, **extra)
        del dst
    f.close()


def run_interleaved(a, mm, cp, clients, memory, workloads, out):
    """``clients``: (impl, opener, extra) each. Per workload, every client runs once untimed and
    checked, then each repeat runs every client in turn, the order reversed each repeat, so that
    a machine that drifts during the run weighs on every client alike; records carry
    ``interleaved`` and each repeat's ratio of the first client's time to each other's
    (``paired_ratios``: above 1, the first client was faster)."""
    xp = cp if memory == "device" else np
    sync = syncer(cp, xp)
    files = [(impl, opened(a, impl, opener), extra) for impl, opener, extra in clients]
    for name, offsets, block in workloads:
        cases = [(impl, *make_case(f, xp, a, impl, offsets, block), extra) for impl, f, extra in files]
        timings = [Timings() for _ in cases]
        for impl, dst, once, sample, _ in cases:
            once()
            sync()
            check(mm, dst, sample, impl)
        for r in range(a.repeats):
            order = range(len(cases)) if r % 2 == 0 else reversed(range(len(cases)))
            for i in order:
                timings[i].run(cases[i][2], sync)
        first = timings[0].times
        for (impl, dst, _, sample, extra), t in zip(cases, timings):
            check(mm, dst, sample, impl)
            ratios = [round(b / g, 3) for g, b in zip(first, t.times)]
            t.emit(out, a, impl, name, dst, offsets, block, memory, interleaved=True, paired_ratios=ratios, **extra)
        del cases
    for _, f, _ in files:
        f.close()


class Captured:
    """An ``Out`` that keeps what a worker process would emit, for its parent to write."""

    def __init__(self):
        self.calls = []

    def emit(self, *args, **kwargs):
        self.calls.append((args, kwargs))


def client_opener(a, kind):
    """The opener of client ``kind`` ("gpumap" or "kvikio"), set up in this process, and the
    fields its records carry."""
    sized = {} if a.gpumap_request_size is None else {"request_size": a.gpumap_request_size}
    if kind == "kvikio":
        import kvikio
        import kvikio.defaults

        kvikio.defaults.set({"num_threads": a.threads})
        return getattr(kvikio.RemoteFile, opener_name(a)), \
            {"kvikio_version": kvikio.__version__, "kvikio_threads": a.threads}
    import gpumapio

    return functools.partial(getattr(gpumapio.RemoteFile, opener_name(a)), max_in_flight=a.threads, **sized), \
        {"max_in_flight": a.threads, **sized}


def opener_name(a):
    """The ``RemoteFile`` constructor both clients open the object with."""
    return "open_s3" if a.protocol == "s3" else "open_http"


def isolated_client(conn, a, impl, kind, memory, workloads):
    """A worker process of ``--isolate``: one client's file and cases, each run when its parent
    says (``prepare``: a run untimed and checked; ``run``: a timed run, its time sent back;
    ``finish``: checked again, the record sent back; ``close``)."""
    cp = None
    if memory == "device":
        import cupy as cp
    xp = cp if memory == "device" else np
    sync = syncer(cp, xp)
    mm = mmap.mmap(os.open(a.file, os.O_RDONLY), 0, prot=mmap.PROT_READ)
    opener, extra = client_opener(a, kind)
    f = opened(a, impl, opener)
    case = None
    while True:
        command, i = conn.recv()
        if command == "prepare":
            name, offsets, block = workloads[i]
            dst, once, sample = make_case(f, xp, a, impl, offsets, block)
            case = (name, offsets, block, dst, once, sample, Timings())
            once()
            sync()
            check(mm, dst, sample, impl)
            conn.send(None)
        elif command == "run":
            case[6].run(case[4], sync)
            conn.send(case[6].times[-1])
        elif command == "finish":
            name, offsets, block, dst, _, sample, timings = case
            check(mm, dst, sample, impl)
            captured = Captured()
            timings.emit(captured, a, impl, name, dst, offsets, block, memory, **extra)
            case = None
            conn.send(captured.calls)
        else:
            f.close()
            conn.send(None)
            return


def run_isolated(a, clients, memory, workloads, out):
    """``--interleave --isolate``: as :func:`run_interleaved`, but each client in a process of
    its own (``clients``: (impl, kind) each), so that neither's threads run beside the other's
    runs; the parent says which runs when, repeat by repeat, the order reversed each time."""
    context = mp.get_context("spawn")  # CUDA does not survive a fork
    workers = []
    for impl, kind in clients:
        parent, child = context.Pipe()
        proc = context.Process(target=isolated_client, args=(child, a, impl, kind, memory, workloads))
        proc.start()
        workers.append((parent, proc))

    def ask(worker, command, i=None):
        worker[0].send((command, i))
        if not worker[0].poll(300):
            sys.exit(f"a client process did not answer {command}")
        return worker[0].recv()

    try:
        for i in range(len(workloads)):
            for w in workers:
                ask(w, "prepare", i)
            times = [[] for _ in workers]
            for r in range(a.repeats):
                order = range(len(workers)) if r % 2 == 0 else reversed(range(len(workers)))
                for k in order:
                    times[k].append(ask(workers[k], "run", i))
            for k, w in enumerate(workers):
                ratios = [round(b / g, 3) for g, b in zip(times[0], times[k])]
                for args, kwargs in ask(w, "finish", i):
                    out.emit(*args, **kwargs, interleaved=True, isolated=True, paired_ratios=ratios)
        for w in workers:
            ask(w, "close")
    finally:
        for _, proc in workers:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


def rows_cases(a, mm, cp, out):
    """Random 512 B rows of the object: through gpumap's cache over the URL (cold and hot), and
    one pread future per row from gpumapio's and KvikIO's RemoteFile."""
    import gpumapio

    row = 512
    url = f"http://127.0.0.1:{a.port}/obj"
    rng = np.random.default_rng(a.seed + 1)
    indices = rng.integers(0, a.size // row, a.rows)
    table = np.frombuffer(mm, dtype=np.uint8, count=(a.size // row) * row).reshape(-1, row)
    expected = table[indices[:: max(len(indices) // 64, 1)]]
    if a.rows_memory == "host":
        cp = None  # the cache and the rows in host memory, as on a machine without a GPU
    xp = cp if cp is not None else np
    memory = "device" if cp is not None else "host"
    on_device = xp.asarray(indices)
    sync = cp.cuda.runtime.deviceSynchronize if cp is not None else (lambda: None)
    nbytes = len(indices) * row

    def verify(got, impl):
        got = got.get() if hasattr(got, "get") else got
        if not np.array_equal(np.asarray(got)[:: max(len(indices) // 64, 1)], expected):
            sys.exit(f"{impl}: rows differ")

    def timed(run):
        sync()
        t = time.perf_counter()
        got = run()
        sync()
        return time.perf_counter() - t, got

    # The cache: a budget holding every row's extent; cold runs each on a fresh map.
    budget = max(64 << 20, 2 * len(indices) * 4096)
    cold, hot = [], []
    for r in range(a.repeats):
        m = gpumapio.map(url, budget=budget, extent_size=4096, device=None if cp is not None else "host")
        seconds, got = timed(lambda: gpumapio.gather_rows(m, on_device, row))
        verify(got, "gpumapio-map")
        cold.append(seconds)
        for _ in range(2):
            seconds, got = timed(lambda: gpumapio.gather_rows(m, on_device, row))
            hot.append(seconds)
        verify(got, "gpumapio-map hot")
        m.close()
    out.emit("gpumap-map", "remote_rows_512_cold", a.threads, nbytes, cold, ops=len(indices), memory=memory,
             size=a.size, extent_size=4096)
    out.emit("gpumap-map", "remote_rows_512_hot", a.threads, nbytes, hot, ops=len(indices), memory=memory,
             size=a.size, extent_size=4096)

    def per_row(f, impl, **extra):
        dst = xp.zeros((len(indices), row), dtype=xp.uint8)
        offsets = (indices * row).tolist()

        def run():
            futs = [f.pread(dst[i], row, o) for i, o in enumerate(offsets)]
            if sum(fu.get() for fu in futs) != nbytes:
                sys.exit(f"{impl}: short pread")
            return dst

        times = []
        for _ in range(a.repeats):
            seconds, got = timed(run)
            times.append(seconds)
        verify(got, impl)
        out.emit(impl, "remote_rows_512_cold", a.threads, nbytes, times, ops=len(indices), memory=memory,
                 size=a.size, **extra)
        f.close()

    per_row(gpumapio.RemoteFile.open_http(url, max_in_flight=a.threads), "gpumap-remote-preads")
    try:
        import kvikio
        import kvikio.defaults

        kvikio.defaults.set({"num_threads": a.threads})
        per_row(kvikio.RemoteFile.open_http(url), "kvikio-remote-preads", kvikio_version=kvikio.__version__)
    except ImportError as e:
        print(f"== kvikio rows skipped: {e}", flush=True)


def summary(recs):
    bound = {r["workload"]: r["gbps"] for r in recs if r["impl"] == "plain-parallel-client"}
    kv = {(r["workload"], r["memory"]): r["gbps"] for r in recs if r["impl"].startswith("kvikio")}
    print(f"\n{'workload':<21} {'impl':<22} {'memory':<7} {'GB/s':>8} {'ops/s':>10} {'/kvikio':>8} {'/bound':>7}")
    for r in recs:
        k = kv.get((r["workload"], r["memory"]))
        b = bound.get(r["workload"])
        vk = f"{r['gbps'] / k:.2f}" if k else "-"
        vb = f"{r['gbps'] / b:.2f}" if b else "-"
        ops = f"{r['iops']:.0f}" if "iops" in r else "-"
        print(f"{r['workload']:<21} {r['impl']:<22} {r['memory']:<7} {r['gbps']:>8.3f} {ops:>10} {vk:>8} {vb:>7}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jsonl", required=True)
    p.add_argument("--size", type=parse_size, default=4 << 30)
    p.add_argument("--dir", default=os.environ.get("GPUMAP_BENCH_DIR", "/tmp/gpumap-bench"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=32)
    cores = os.cpu_count() or 2
    p.add_argument("--client-procs", type=int, default=max(1, cores // 4))
    p.add_argument("--server-procs", type=int, default=max(2, cores // 2))
    p.add_argument("--request-size", type=parse_size, default=4 << 20)
    p.add_argument("--ops-4k", type=int, default=4096)
    p.add_argument("--ops-1m", type=int, default=2048)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=25)
    p.add_argument("--only", default="plain,gpumap,kvikio,rows")
    p.add_argument("--gpumap-request-size", type=parse_size, default=None,
                   help="gpumapio.RemoteFile's request_size (its default where not given)")
    p.add_argument("--rows-memory", choices=("device", "host"), default="device",
                   help="where the rows cases' cache and rows are (device: where CuPy is)")
    p.add_argument("--interleave", action="store_true",
                   help="run gpumap and KvikIO in turn, repeat by repeat (records carry paired_ratios)")
    p.add_argument("--isolate", action="store_true",
                   help="with --interleave: each client in a process of its own, the parent taking turns")
    p.add_argument("--protocol", choices=("http", "s3"), default="http",
                   help="open the object by its HTTP URL, or as an S3 object (open_s3, signed requests)")
    p.add_argument("--serve", metavar="FILE", help=argparse.SUPPRESS)  # the server's own process
    a = p.parse_args()
    if a.serve:
        return serve(a.serve, a.server_procs)
    only = set(a.only.split(","))

    os.makedirs(a.dir, exist_ok=True)
    a.file = os.path.join(a.dir, f"remote-{a.size}.bin")
    if not os.path.exists(a.file) or os.path.getsize(a.file) != a.size:
        print(f"== making {a.file} ({a.size} random bytes)", flush=True)
        rng = np.random.default_rng(a.seed)
        with open(a.file + ".tmp", "wb") as f:
            for o in range(0, a.size, 64 << 20):
                f.write(rng.bytes(min(64 << 20, a.size - o)))
        os.replace(a.file + ".tmp", a.file)
    mm = mmap.mmap(os.open(a.file, os.O_RDONLY), 0, prot=mmap.PROT_READ)
    mm.madvise(mmap.MADV_WILLNEED)
    sum(mm[o:o + 1][0] for o in range(0, a.size, 4096))  # warm: every case reads from the page cache

    rng = np.random.default_rng(a.seed)
    prefix = "remote_s3_" if a.protocol == "s3" else "remote_"
    workloads = [(prefix + "read_whole", None, None)]
    for name, block, ops in (("rand_4k", 4096, a.ops_4k), ("rand_1m", 1 << 20, a.ops_1m)):
        if ops:
            workloads.append((prefix + name, (rng.integers(0, a.size // block, ops) * block).tolist(), block))
    if a.protocol == "s3" and "rows" in only:
        print("== rows: over HTTP only, not run with --protocol s3", flush=True)
        only.discard("rows")

    server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", a.file, "--jsonl", "-",
                               "--server-procs", str(a.server_procs)], stdout=subprocess.PIPE,
                              start_new_session=True)  # its own group: ended with its forks below
    try:
        a.port = int(server.stdout.readline())
        print(f"== server: {a.server_procs} processes on 127.0.0.1:{a.port}; median of {a.repeats}", flush=True)
        if a.protocol == "s3":
            # What an S3 client finds in the environment; the spawned clients inherit it.
            os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{a.port}", AWS_DEFAULT_REGION="us-east-1",
                              AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret")
            os.environ.pop("AWS_SESSION_TOKEN", None)
        out = Out(a.jsonl)
        if "plain" in only:
            for name, offsets, block in workloads:
                if block is None:
                    jobs = [(o, min(a.request_size, a.size - o)) for o in range(0, a.size, a.request_size)]
                else:
                    jobs = [(o, block) for o in offsets]
                times = plain_client(a, jobs)
                out.emit("plain-parallel-client", name, a.threads, sum(n for _, n in jobs), times,
                         ops=None if block is None else len(jobs), memory="host", size=a.size,
                         client_procs=min(a.client_procs, a.threads), request_size=a.request_size)
        try:
            import cupy as cp
        except ImportError as e:
            cp = None
            print(f"== device cases skipped: CuPy does not import ({e})", flush=True)
        memories = ["host"] + (["device"] if cp is not None else [])
        kvikio = None
        if "kvikio" in only:
            try:
                import kvikio
                import kvikio.defaults
                if not kvikio.is_remote_file_available():
                    raise ImportError("this KvikIO was built without RemoteFile")
                kvikio.defaults.set({"num_threads": a.threads})
            except ImportError as e:
                kvikio = None
                print(f"== kvikio-remote skipped: no KvikIO RemoteFile here ({e})", flush=True)
        if a.interleave and a.isolate and "gpumap" in only and kvikio is not None:
            for memory in memories:
                suffix = "-host" if memory == "host" else ""
                clients = [("gpumap-remote" + suffix, "gpumap"), ("kvikio-remote" + suffix, "kvikio")]
                run_isolated(a, clients, memory, workloads, out)
            only -= {"gpumap", "kvikio"}
        if a.interleave and "gpumap" in only and kvikio is not None:
            for memory in memories:
                suffix = "-host" if memory == "host" else ""
                clients = [("gpumap-remote" + suffix, *client_opener(a, "gpumap")),
                           ("kvikio-remote" + suffix, *client_opener(a, "kvikio"))]
                run_interleaved(a, mm, cp, clients, memory, workloads, out)
            only -= {"gpumap", "kvikio"}
        for kind in ("gpumap", "kvikio"):
            if kind in only and (kind == "gpumap" or kvikio is not None):
                opener, extra = client_opener(a, kind)
                for memory in memories:
                    impl = f"{kind}-remote" + ("-host" if memory == "host" else "")
                    run_client(a, mm, cp, impl, opener, memory, workloads, out, **extra)
        if "rows" in only and a.rows:
            rows_cases(a, mm, cp, out)
        summary(out.recs)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait()


if __name__ == "__main__":
    main()
