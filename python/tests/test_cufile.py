"""CuFile with host buffers: round trips at odd sizes and offsets, futures, KvikIO's sizes,
offsets and return values."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import gpumapio
import gpumapio as kvikio  # the way KvikIO code imports it

ODD = [0, 1, 7, 4095, 4096, 4097, 65537, (1 << 20) + 3]


@pytest.mark.parametrize("size", ODD)
@pytest.mark.parametrize("offset", [0, 1, 4095, 12345, (1 << 20) + 1])
def test_read_odd_sizes_and_offsets(data_file, size, offset):
    path, data = data_file
    buf = np.zeros(size, dtype=np.uint8)
    with kvikio.CuFile(path, "r") as f:
        assert f.read(buf, size, offset) == size
    assert buf.tobytes() == data[offset : offset + size]


@pytest.mark.parametrize("size", ODD)
@pytest.mark.parametrize("offset", [0, 3, 4096, 77777])
def test_write_then_read_back(tmp_path, rng, size, offset):
    payload = rng.integers(0, 256, size=size, dtype="u1")
    path = tmp_path / "w.bin"
    with kvikio.CuFile(path, "w") as f:
        assert f.write(payload, size, offset) == size
    got = path.read_bytes()
    if size == 0:  # a write of nothing does not extend the file (pwrite's rule)
        assert got == b""
        return
    assert len(got) == offset + size
    assert got[:offset] == b"\0" * offset
    assert got[offset:] == payload.tobytes()


def test_task_sizes_per_call_and_from_defaults(data_file):
    path, data = data_file
    with kvikio.CuFile(path, "r") as f:
        for task_size in (1, 4096, 12289, 1 << 20):
            buf = np.zeros(len(data) - 5, dtype=np.uint8)
            assert f.pread(buf, file_offset=5, task_size=task_size).get() == len(buf)
            assert buf.tobytes() == data[5:]
        with kvikio.defaults.set("task_size", 8191):
            buf = np.zeros(len(data), dtype=np.uint8)
            assert f.read(buf) == len(data)
            assert buf.tobytes() == data
        # 0 is the default, as KvikIO reads it (`task_size if task_size else ...`).
        buf = np.zeros(len(data), dtype=np.uint8)
        assert f.read(buf, task_size=0) == len(data) and buf.tobytes() == data
        with pytest.raises(OverflowError, match="task_size -1 is negative"):
            f.read(buf, task_size=-1)
    with kvikio.Mmap(path) as m:
        buf = np.zeros(len(data), dtype=np.uint8)
        assert m.pread(buf, task_size=0).get() == len(data) and buf.tobytes() == data


def test_buffer_kinds(data_file):
    path, data = data_file
    with kvikio.CuFile(path, "r") as f:
        ba = bytearray(10_000)
        assert f.read(ba, file_offset=3) == 10_000
        assert bytes(ba) == data[3:10_003]
        mv = memoryview(bytearray(5000))[100:4100]
        assert f.read(mv, file_offset=7) == 4000
        assert mv.tobytes() == data[7:4007]
        words = np.zeros(1000, dtype=np.float64)  # sizes are bytes, whatever the dtype
        assert f.read(words) == 8000
        assert words.tobytes() == data[:8000]
        fortran = np.zeros((64, 32), dtype=np.uint16, order="F")
        assert f.read(fortran) == fortran.nbytes
        assert fortran.tobytes(order="A") == data[: fortran.nbytes]
        empty = np.zeros(0, dtype=np.uint8)
        assert f.read(empty) == 0
    out = path.with_suffix(".out")
    with kvikio.CuFile(out, "w") as f:
        assert f.write(b"hello, world") == 12  # bytes are fine to write from
        assert f.write(memoryview(b"HELLO"), file_offset=7) == 5
    assert out.read_bytes() == b"hello, HELLO"


class DLPackOnly:
    """An object that offers its memory through DLPack only (a CPU tensor, as far as gpumap
    can tell)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, *args, **kwargs):
        return self.array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_host_memory(data_file):
    path, data = data_file
    target = np.zeros(3 * 4099, dtype=np.uint8)[::3]  # not contiguous: refused
    with kvikio.CuFile(path, "r") as f:
        with pytest.raises(ValueError, match="contiguous"):
            f.read(DLPackOnly(target))
        dst = np.zeros((100, 41), dtype=np.int32)
        assert f.read(DLPackOnly(dst), file_offset=11) == dst.nbytes
        assert dst.tobytes() == data[11 : 11 + dst.nbytes]
    out = path.with_suffix(".dl")
    with kvikio.CuFile(out, "w") as f:
        assert f.write(DLPackOnly(dst)) == dst.nbytes
    assert out.read_bytes() == dst.tobytes()


def test_size_larger_than_buffer_is_value_error(data_file):
    path, _ = data_file
    with kvikio.CuFile(path, "r") as f:
        with pytest.raises(ValueError, match="greater than the size of the buffer"):
            f.read(np.zeros(10, np.uint8), 11)
        with pytest.raises(ValueError):
            f.pread(np.zeros(10, np.uint8), 11)
        with pytest.raises(ValueError):
            f.raw_read(np.zeros(10, np.uint8), 5, 0, 6)


def test_read_past_end_returns_what_there_is(data_file):
    path, data = data_file
    buf = np.full(1000, 7, dtype=np.uint8)
    with kvikio.CuFile(path, "r") as f:
        assert f.read(buf, file_offset=len(data) - 10) == 10
        assert buf[:10].tobytes() == data[-10:]
        assert (buf[10:] == 7).all()
        assert f.pread(buf, file_offset=len(data) + 5).get() == 0


def test_futures_many_in_flight(data_file, rng):
    path, data = data_file
    offsets = rng.integers(0, len(data) - 4096, size=500)
    dst = np.zeros((500, 4096), dtype=np.uint8)
    with kvikio.CuFile(path, "r") as f:
        futures = [f.pread(dst[i], 4096, int(o)) for i, o in enumerate(offsets)]
        assert [fu.get() for fu in futures] == [4096] * 500
        assert all(fu.done() for fu in futures)
    for i, o in enumerate(offsets):
        assert dst[i].tobytes() == data[o : o + 4096]


def test_future_waited_on_from_other_threads(data_file):
    path, data = data_file
    buf = np.zeros(len(data), dtype=np.uint8)
    f = kvikio.CuFile(path, "r")
    future = f.pread(buf)
    results = []
    threads = [threading.Thread(target=lambda: results.append(future.get())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [len(data)] * 8
    assert future.get() == len(data)  # again, from this thread
    assert buf.tobytes() == data
    f.close()


def test_futures_outlive_their_buffer_reference_and_the_file(data_file):
    path, data = data_file
    f = kvikio.CuFile(path, "r")
    future = f.pread(np.zeros(len(data), dtype=np.uint8))  # only the future holds the array
    f.close()  # transfers in flight keep the file open
    assert future.get() == len(data)
    assert f.closed


def test_pwrite_future(tmp_path, rng):
    payload = rng.integers(0, 256, size=(1 << 20) + 17, dtype="u1")
    path = tmp_path / "pw.bin"
    with kvikio.CuFile(path, "w+") as f:
        assert f.pwrite(payload, file_offset=1).get() == payload.nbytes
        back = np.zeros_like(payload)
        assert f.pread(back, file_offset=1).get() == payload.nbytes
    assert (back == payload).all()


def test_raw_read_write_with_dev_offset(data_file):
    path, data = data_file
    buf = np.zeros(10_000, dtype=np.uint8)
    with kvikio.CuFile(path, "r") as f:
        assert f.raw_read(buf, 1000, 50, 123) == 1000
        assert buf[123:1123].tobytes() == data[50:1050]
        assert not buf[:123].any() and not buf[1123:].any()
        assert f.raw_read(buf, None, 0, 9_000) == 1000  # the rest of the buffer
        assert buf[9000:].tobytes() == data[:1000]
    out = path.with_suffix(".raw")
    with kvikio.CuFile(out, "w") as f:
        assert f.raw_write(buf, 1000, 0, 123) == 1000
    assert out.read_bytes() == data[50:1050]


def test_raw_async_on_host_memory(data_file):
    path, data = data_file
    buf = np.zeros(4096, dtype=np.uint8)
    with kvikio.CuFile(path, "r") as f:
        fut = f.raw_read_async(buf, 0, 100, 1, 0)
        assert fut.check_bytes_done() == 100
        assert buf[:100].tobytes() == data[1:101]


def test_file_object_surface(data_file):
    path, data = data_file
    f = kvikio.CuFile(path, "r")
    assert not f.closed
    assert f.fileno() >= 0
    assert f.open_flags() & os.O_ACCMODE == os.O_RDONLY
    assert f.nbytes() == len(data)
    path_kind, reason = f.compat_decision()
    assert path_kind in ("posix", "cufile") and reason
    assert isinstance(f.is_direct_io_supported(), bool)
    assert "CuFile" in repr(f)
    f.close()
    f.close()  # twice is fine
    assert f.closed
    with pytest.raises(ValueError, match="closed"):
        f.read(np.zeros(1, np.uint8))
    with kvikio.CuFile(path, "r+") as g:
        assert g.open_flags() & os.O_ACCMODE == os.O_RDWR
    with pytest.raises(ValueError, match="isn't supported"):
        kvikio.CuFile(path.with_suffix(".a"), "a")  # as KvikIO: no offset write could run


def test_pathlike_and_str_paths(data_file):
    path, data = data_file
    for p in (path, str(path), os.fsencode(path).decode()):
        buf = bytearray(16)
        with gpumapio.CuFile(p) as f:
            assert f.read(buf) == 16
        assert bytes(buf) == data[:16]


def test_writes_of_unwaited_futures_are_in_the_file_at_close_and_at_exit(tmp_path):
    """A pwrite whose future is dropped runs on: close() (and the end of a with block) waits for
    it, and so does the interpreter's exit where the file is never closed; both once lost the
    write's tail (the file short, or its bytes wrong), silently."""
    import subprocess
    import sys
    import textwrap

    src = os.urandom(24 << 20)
    (tmp_path / "src.bin").write_bytes(src)
    # Small tasks, so that the write is still running when the call returns.
    with gpumapio.CuFile(tmp_path / "closed.bin", "w") as f:
        f.pwrite(src, task_size=65536)
    assert (tmp_path / "closed.bin").read_bytes() == src
    child = textwrap.dedent(
        """
        import sys, gpumapio
        src = open(sys.argv[1], "rb").read()
        for name in ("never-closed.bin", "closed.bin"):
            f = gpumapio.CuFile(sys.argv[2] + "/" + name, "w")
            f.pwrite(src, task_size=65536)
            if name == "closed.bin":
                f.close()
                del f
        """
    )
    for name in ("never-closed.bin", "closed.bin"):
        (tmp_path / name).unlink(missing_ok=True)
    run = subprocess.run([sys.executable, "-c", child, str(tmp_path / "src.bin"), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    for name in ("never-closed.bin", "closed.bin"):
        assert (tmp_path / name).read_bytes() == src, name


def test_exit_ends_while_a_daemon_thread_goes_on_writing(tmp_path):
    """The exit's wait for unwaited writes counted every write in flight, so a daemon thread
    that kept starting pwrites held the process up for ever. It now waits for the writes
    started before the exit, which are in the file."""
    import subprocess
    import sys
    import textwrap

    child = textwrap.dedent(
        """
        import sys, threading, time, numpy as np, gpumapio
        f = gpumapio.CuFile(sys.argv[1], "w")
        f.pwrite(np.full(16 << 20, 7, np.uint8), task_size=65536)  # before the exit: kept
        def writer():
            buf = np.ones(16 << 20, np.uint8)
            i = 0
            while True:
                f.pwrite(buf, file_offset=(16 << 20) + ((i % 4) << 24))
                i += 1
                time.sleep(0.001)
        threading.Thread(target=writer, daemon=True).start()
        time.sleep(0.3)
        """
    )
    path = tmp_path / "written.bin"
    run = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    with open(path, "rb") as f:
        assert f.read(16 << 20) == bytes([7]) * (16 << 20)


def test_writes_are_refused_once_the_exit_has_waited_for_them(tmp_path):
    """What the exit runs (wait_for_all_writes) waits for the writes in flight and refuses
    later ones: a daemon thread writing on would otherwise run writes into the process's
    teardown (cut short; on the GPU machine the exit crashed or hung)."""
    import subprocess
    import sys
    import textwrap

    child = textwrap.dedent(
        """
        import sys, numpy as np, gpumapio
        from gpumapio import _native
        f = gpumapio.CuFile(sys.argv[1], "w")
        assert f.pwrite(np.full(4096, 7, np.uint8)).get() == 4096
        _native.wait_for_all_writes()
        try:
            f.pwrite(np.full(4096, 8, np.uint8), file_offset=4096).get()
        except RuntimeError as e:
            assert "exiting" in str(e), e
            print("refused")
        """
    )
    path = tmp_path / "exiting.bin"
    run = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "refused", run.stdout + run.stderr
    assert path.read_bytes() == bytes([7]) * 4096
