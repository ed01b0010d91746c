"""A process forked after its parent used gpumap (multiprocessing's default start method on
Linux, and DataLoader workers) reads as its parent did: it makes its own I/O pool and remote
runtime instead of waiting for ever on threads that a child does not have.

Each case runs in a process of its own that forks: a child that hangs is killed and fails the
test, rather than hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

FORK_AND_CHECK = """
import os, sys, time
def in_child(work):
    pid = os.fork()
    if pid == 0:
        try:
            work()
        except BaseException as e:
            print("child:", repr(e), flush=True)
            os._exit(1)
        os._exit(0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.waitstatus_to_exitcode(status) != 0:
                sys.exit("the child failed")
            return
        time.sleep(0.001)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    sys.exit("the child hung")

def forks_beside(busy, work, rounds, threads=1):
    # `rounds` children, one after another, each doing `work`, while `threads` threads of the
    # parent run `busy(stop)` until the last child is done.
    import threading
    stop = threading.Event()
    workers = [threading.Thread(target=busy, args=(stop,)) for _ in range(threads)]
    for worker in workers:
        worker.start()
    try:
        for _ in range(rounds):
            in_child(work)
    finally:
        stop.set()
        for worker in workers:
            worker.join()

def the_file_and_a_handle():
    # The file named by the first argument, as bytes, and a CuFile of it.
    import numpy, gpumapio
    return numpy.fromfile(sys.argv[1], dtype=numpy.uint8), gpumapio.CuFile(sys.argv[1], "r")

def preads_whole(f, want):
    import numpy
    out = numpy.zeros_like(want)
    assert f.pread(out, task_size=1 << 16).get() == want.nbytes
    assert numpy.array_equal(out, want)
"""


# The forks of the tests that fork many times; more for a longer hunt.
FORK_ROUNDS = int(os.environ.get("GPUMAP_FORK_ROUNDS", "1000"))


def run_forking(code: str, *args: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", FORK_AND_CHECK + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=180 * max(1, FORK_ROUNDS // 1000),
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_forked_child_reads_files_and_checkpoints_after_its_parent(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    data = np.arange(1 << 20, dtype=np.float32)
    checkpoint = tmp_path / "model.safetensors"
    safetensors.save_file({"w": data, "b": data[:7]}, str(checkpoint))
    run_forking(
        """
        import numpy as np, gpumapio
        path = sys.argv[1]
        def read():
            loaded = gpumapio.load_checkpoint(path, "cpu", framework="numpy")
            assert np.array_equal(loaded["w"], np.arange(1 << 20, dtype=np.float32))
            with gpumapio.CuFile(path, "r") as f:
                out = np.empty(1 << 20, dtype=np.uint8)
                assert f.pread(out, out.nbytes, 0).get() == out.nbytes
            with open(path, "rb") as raw:
                assert out.tobytes() == raw.read(1 << 20)
        read()  # the parent's pool is made
        in_child(read)
        read()  # and still serves the parent
        """,
        str(checkpoint),
    )


def test_a_forked_child_reads_remote_objects_after_its_parent(server):
    data = np.random.default_rng(5).integers(0, 256, size=(3 << 20) + 5, dtype="u1").tobytes()
    server.objects["/obj"] = data
    run_forking(
        """
        import numpy as np, gpumapio
        url, want = sys.argv[1], bytes.fromhex(sys.argv[2])
        def read():
            with gpumapio.RemoteFile.open_http(url) as f:
                out = np.empty(f.nbytes(), dtype=np.uint8)
                assert f.read(out) == out.nbytes  # a read of several requests: the lanes
                one = np.empty(4096, dtype=np.uint8)
                assert f.pread(one, 4096, 1 << 20).get() == 4096  # one request: the runtime
            assert out[:16].tobytes() == want[:16] and one[:16].tobytes() == want[16:]
        read()
        in_child(read)
        read()
        """,
        f"{server.url}/obj",
        (data[:16] + data[1 << 20 : (1 << 20) + 16]).hex(),
    )


def test_a_file_opened_before_the_fork_reads_in_the_child(tmp_path):
    """A DataLoader's dataset opens its file in __init__, then its workers fork: a read of
    several tasks on the inherited handle waited for ever on the parent's pool threads."""
    path = tmp_path / "data.bin"
    np.random.default_rng(7).integers(0, 256, size=16 << 20, dtype="u1").tofile(path)
    run_forking(
        """
        import numpy as np, gpumapio
        path = sys.argv[1]
        want = np.fromfile(path, dtype=np.uint8)
        f, m = gpumapio.CuFile(path, "r"), gpumapio.Mmap(path)
        def read():
            for how in ("read", "pread", "mmap"):
                out = np.zeros_like(want)
                got = f.read(out) if how == "read" else f.pread(out).get() if how == "pread" else m.read(out)
                assert got == want.nbytes and np.array_equal(out, want), how
        in_child(read)  # before the parent read anything through the pool
        read()
        in_child(read)
        read()
        """,
        str(path),
    )


def test_a_child_forked_as_the_first_file_opens_reads(tmp_path):
    """Opening the first file starts the I/O threads, and a fork straight after it (a
    DataLoader's workers, forked once the dataset has opened its file) could land while they
    were starting: one of them half way through making crossbeam-epoch's collector left it
    half made for ever in the child, whose own threads then waited on it at their start. Each
    process here opens, forks at once, and the child reads through its own threads."""
    path = tmp_path / "data.bin"
    np.random.default_rng(17).integers(0, 256, size=4 << 20, dtype="u1").tofile(path)
    code = FORK_AND_CHECK + textwrap.dedent(
        """
        import numpy as np, gpumapio
        path = sys.argv[1]
        f = gpumapio.CuFile(path, "r")
        in_child(lambda: preads_whole(f, np.fromfile(path, dtype=np.uint8)))
        """
    )
    for _ in range(6):
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(path)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(4)
        ]
        for run in runs:
            output, _ = run.communicate(timeout=180)
            assert run.returncode == 0, output


def test_children_forked_while_another_thread_reads_and_resizes_the_pool_read(tmp_path):
    """A thread of the parent that held the I/O pool's lock at the fork (resizing the pool, or
    starting a read on it) held it for ever in the child, whose first read then waited for it:
    each generation of processes now keeps its threads behind a lock of its own. And a fork in
    the middle of the parent's `pthread_create` (the pool's threads end and start without
    pause here) gave the child a stack whose thread-local blocks glibc then freed twice, at the
    child's first thread: "double free or corruption", about once in 7,500 forks (0047)."""
    path = tmp_path / "data.bin"
    np.random.default_rng(19).integers(0, 256, size=1 << 20, dtype="u1").tofile(path)
    run_forking(
        """
        import numpy as np, gpumapio
        want, f = the_file_and_a_handle()
        def resizing_and_reading(stop):
            out = np.empty_like(want)
            nthreads = 2
            while not stop.is_set():
                nthreads = 5 - nthreads
                gpumapio.defaults.set("num_threads", nthreads)
                assert f.pread(out, task_size=1 << 16).get() == want.nbytes
        forks_beside(resizing_and_reading, lambda: preads_whole(f, want), rounds=int(sys.argv[2]))
        """,
        str(path),
        str(FORK_ROUNDS),
    )


def test_children_forked_while_other_threads_start_and_end_threads_read(tmp_path):
    """Each prefetch of a map runs on a thread of its own. Forks landing while four parent
    threads prefetch without pause met two locks held for ever in the child: the allocator's
    (mimalloc registers a thread's heap under one, and has no fork handlers: 0043) and a bucket
    of `parking_lot`'s process-wide table of parked threads (0044), on which the child's own
    I/O threads then waited. Every child must read."""
    path = tmp_path / "data.bin"
    np.random.default_rng(23).integers(0, 256, size=1 << 20, dtype="u1").tofile(path)
    run_forking(
        """
        import gpumapio
        want, f = the_file_and_a_handle()
        m = gpumapio.map(sys.argv[1], device="host", budget=64 << 20, extent_size=65536)
        prefetches = []
        def prefetching(stop):
            while not stop.is_set():
                assert m.prefetch(0, want.nbytes).get() == want.nbytes
                prefetches.append(1)
        forks_beside(prefetching, lambda: preads_whole(f, want), int(sys.argv[2]), threads=4)
        assert prefetches, "no prefetch ran beside the forks: this run proves nothing"
        """,
        str(path),
        str(FORK_ROUNDS),
    )


def test_a_child_forked_during_a_write_does_not_wait_for_it_at_exit(tmp_path):
    """The process-wide count of writes in flight, which the interpreter's exit waits on, was
    inherited: a child forked while its parent's pwrite ran waited at exit for a write of
    threads it does not have, for ever."""
    run_forking(
        """
        import numpy as np, gpumapio
        from gpumapio import _native
        path = sys.argv[1]
        data = np.ones(256 << 20, dtype=np.uint8)
        with gpumapio.CuFile(path, "w") as f:
            future = f.pwrite(data)
            in_flight = not future.done()
            in_child(_native.wait_for_all_writes)  # what the child's exit runs (atexit)
            assert future.get() == data.nbytes
        assert in_flight, "the write ended before the fork: this run proves nothing"
        """,
        str(tmp_path / "out.bin"),
    )


def test_a_remote_file_opened_before_the_fork_reads_in_the_child(server):
    """An inherited RemoteFile's requests went to connections driven by the parent's runtime,
    which the child does not have: they waited for ever. The child now makes its own."""
    data = np.random.default_rng(9).integers(0, 256, size=(3 << 20) + 7, dtype="u1").tobytes()
    server.objects["/inherited"] = data
    run_forking(
        """
        import numpy as np, gpumapio
        url, want = sys.argv[1], bytes.fromhex(sys.argv[2])
        f = gpumapio.RemoteFile.open_http(url)
        m = gpumapio.map(url, device="host", budget=8 << 20, extent_size=4096)
        def read():
            out = np.empty(f.nbytes(), dtype=np.uint8)
            assert f.read(out) == out.nbytes  # the lanes
            one = np.empty(4096, dtype=np.uint8)
            assert f.pread(one, 4096, 1 << 20).get() == 4096  # one request: the file's store
            assert out[:16].tobytes() == want[:16] and one[:16].tobytes() == want[16:]
            assert m.read(1 << 20, 16) == want[16:]  # the cache over the object
        in_child(read)  # before the parent read anything
        read()
        in_child(read)
        read()
        """,
        f"{server.url}/inherited",
        (data[:16] + data[1 << 20 : (1 << 20) + 16]).hex(),
    )


def test_a_map_busy_at_the_fork_reads_and_closes_in_the_child(tmp_path):
    """A map whose prefetch, or another thread's gathers, ran at the fork: the child got the
    parent's books with extents marked as being read by threads it does not have, and waited
    for ever on the first read of them, and on close. The child now opens the file again in a
    cache of its own; a future of the parent's work fails there instead of waiting."""
    path = tmp_path / "data.bin"
    np.random.default_rng(11).integers(0, 256, size=64 << 20, dtype="u1").tofile(path)
    run_forking(
        """
        import threading, numpy as np, gpumapio
        path = sys.argv[1]
        want = np.fromfile(path, dtype=np.uint8)
        m = gpumapio.map(path, device="host", budget=64 << 20, extent_size=65536)
        cache = gpumapio.DeviceCache(16 << 20, device="host", extent_size=4096)
        c = cache.open(path)
        rows = np.arange(0, want.nbytes // 4096, 5, dtype=np.int64)
        stop = threading.Event()
        def gathers():
            out = np.empty(len(rows) * 4096, dtype=np.uint8)
            while not stop.is_set():
                c.gather_rows(rows, 4096, out)
        thread = threading.Thread(target=gathers, daemon=True)
        thread.start()
        time.sleep(0.05)
        future = m.prefetch(0, want.nbytes)
        busy = not future.done()
        def child():
            assert m.read(0, want.nbytes) == want.tobytes()
            out = np.empty(len(rows) * 4096, dtype=np.uint8)
            c.gather_rows(rows, 4096, out)
            assert np.array_equal(out.reshape(-1, 4096), want.reshape(-1, 4096)[rows])
            assert cache.stats()["files"] == 1  # the child's own cache, with the child's file
            try:
                future.get()
            except OSError as e:
                assert "forked" in str(e), e
            m.close()
            c.close()
            assert m.closed and c.closed
        in_child(child)
        stop.set()
        thread.join()
        assert future.get() == want.nbytes
        assert m.read(4096, 16) == want[4096:4112].tobytes()
        assert busy, "the prefetch ended before the fork: this run proves nothing"
        """,
        str(path),
    )


def test_a_child_never_writes_back_its_parents_dirty_bytes(tmp_path):
    """A child forked while its parent's map held dirty bytes wrote them back when it let go
    of its copy of the map (or of a writable view made before the fork), over what the parent
    had written since: the parent's newer bytes were lost. A child's copy is now forgotten."""
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(64 << 10))
    run_forking(
        """
        import gc, numpy as np, gpumapio
        path = sys.argv[1]
        m = gpumapio.map(path, writable=True, device="host", budget=16 << 20, extent_size=4096)
        m.write(0, b"A" * 4096)  # dirty at the fork
        view = m.view(8192, 4096, writable=True)  # a writable view pinned at the fork
        def let_go(close):
            def work():
                global m, view
                os.read(ready, 1)  # the parent has written newer bytes
                if close:
                    assert m.read(0, 4) == b"BBBB"  # the child's own map reads the file
                    m.close()
                del view, m
                gc.collect()
            return work
        for close in (False, True):
            ready, go = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(go)
                try:
                    let_go(close)()
                except BaseException as e:
                    print("child:", repr(e), flush=True)
                    os._exit(1)
                os._exit(0)
            os.close(ready)
            m.write(0, b"B" * 4096)
            m.flush()
            os.write(go, b"x")
            os.close(go)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, "the child failed"
            with open(path, "rb") as f:
                assert f.read(4) == b"BBBB", "the child wrote its parent's old bytes back"
            m.write(0, b"A" * 4096)  # dirty again for the next child
        view.release()
        m.close()
        """,
        str(path),
    )


def test_a_child_maps_the_file_as_it_is_when_it_first_uses_it(tmp_path):
    """A child opens its parent's map's file again: its length is the file's then, which
    len() and nbytes report (they reported the parent's, while the child's map had another)."""
    path = tmp_path / "grows.bin"
    first = np.random.default_rng(13).integers(0, 256, size=4 << 20, dtype="u1").tobytes()
    path.write_bytes(first)
    run_forking(
        """
        import numpy as np, gpumapio
        path = sys.argv[1]
        m = gpumapio.map(path, device="host")
        assert len(m) == 4 << 20
        with open(path, "ab") as f:
            f.write(b"more" * (1 << 20))
        def grown():
            assert m.read(0, 16) == open(path, "rb").read(16)
            assert len(m) == m.nbytes == 8 << 20 == m.stats()["len"], (len(m), m.stats())
            assert m.read((8 << 20) - 4, 4) == b"more"
        in_child(grown)
        assert len(m) == 4 << 20  # the parent's map keeps its length
        os.truncate(path, 1 << 20)
        def cut():
            assert len(m) == m.nbytes == 1 << 20 == m.stats()["len"], (len(m), m.stats())
        in_child(cut)
        """,
        str(path),
    )
