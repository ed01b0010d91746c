"""A process forked after its parent used gpumap (multiprocessing's default start method on
Linux, and DataLoader workers) reads as its parent did: it makes its own I/O pool and remote
runtime instead of waiting for ever on threads that a child does not have.

Each case runs in a process of its own that forks: a child that hangs is killed and fails the
test, rather than hanging the suite."""

from __future__ import annotations

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
            sys.exit(0 if os.waitstatus_to_exitcode(status) == 0 else "the child failed")
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    sys.exit("the child hung")
"""


def run_forking(code: str, *args: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", FORK_AND_CHECK + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=180,
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
