"""gpumapio.maps: files in GPU memory (host memory without a GPU) through the GPU page cache,
checked byte for byte against the files; on a GPU, zero-copy views into CuPy and torch."""

from __future__ import annotations

import errno
import gc
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest

import gpumapio
from conftest import need_gpu

MIB = 1 << 20


@pytest.fixture
def table(tmp_path, rng):
    data = rng.integers(0, 256, size=(24 * MIB) + 123, dtype="u1").tobytes()
    path = tmp_path / "table.bin"
    path.write_bytes(data)
    return path, data


def host_map(path, **kw):
    return gpumapio.map(path, device="host", frame_size=2 * MIB, **kw)


def random_file(directory, name, size, seed):
    """A file of ``size`` random bytes in ``directory``: its path and its bytes (a NumPy array)."""
    data = np.random.default_rng(seed).integers(0, 256, size=size, dtype="u1")
    path = directory / name
    data.tofile(path)
    return path, data


def test_views_and_reads_match_the_file(table):
    path, data = table
    m = host_map(path, budget=4 * MIB, extent_size=4096)
    assert len(m) == m.nbytes == len(data)
    assert m.base is None
    for offset, length in [(0, 1), (4095, 2), (7 * MIB + 3, 100_000), (len(data) - 10, 10)]:
        with m.view(offset, length) as v:
            assert v.offset == offset and v.nbytes == length and len(v) == length
            assert v.tobytes() == data[offset : offset + length]
            assert v.ptr is None
            assert not hasattr(v, "__cuda_array_interface__"), "host views have no device pointer"
        assert m.read(offset, length) == data[offset : offset + length]
    with pytest.raises(ValueError, match="outside"):
        m.view(len(data) - 1, 2)
    released = m.view(0, 10)
    released.release()
    with pytest.raises(ValueError, match="released"):
        released.tobytes()


def test_a_closed_map_refuses_calls_and_its_views_stay_valid(table):
    path, data = table
    m = host_map(path)
    view = m.view(4096, 64)
    assert not m.closed
    m.close()
    assert m.closed
    calls = [
        lambda: m.read(0, 4),
        lambda: m.view(0, 4),
        lambda: m.write(0, b"x"),
        lambda: m.gather([0], 4, np.empty(4, np.uint8)),
        lambda: m.gather_rows(np.array([0]), 4, np.empty(4, np.uint8)),
        lambda: m.prefetch(0, 4096),
        lambda: m.advise(0, 4096, "willneed"),
        m.flush,
        m.sync,
        m.evict,
    ]
    for call in calls:
        with pytest.raises(ValueError, match="closed MappedFile"):
            call()
    m.close()  # a second close is a no-op
    assert view.tobytes() == data[4096 : 4096 + 64]
    assert len(m) == len(data) and "MappedFile" in repr(m)


def _descriptors_of(path):
    """How many of this process's descriptors are open on ``path``."""
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            held += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            pass  # closed since it was listed
    return held


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("writable", [False, True])
def test_close_lets_go_of_the_file_once_its_views_are_released(table, writable):
    """close() closes the file where no view holds it, and the last view's release where one
    does, while the MappedFile object lives on; its stats stay readable."""
    path, data = table
    m = host_map(path, writable=writable)
    m.read(0, 3 * MIB)
    if writable:
        m.write(5, b"new")
    assert _descriptors_of(path) >= 1
    view = m.view(MIB, 100)
    m.close()
    assert _descriptors_of(path) >= 1, "a view made before close still reads the file"
    assert view.tobytes() == data[MIB : MIB + 100]
    view.release()
    assert _descriptors_of(path) == 0
    assert m.closed and m.base is None and m.stats()["bytes_faulted"] >= 3 * MIB
    expected = data[:5] + b"new" + data[8:] if writable else data
    assert path.read_bytes() == expected
    m2 = host_map(path)
    m2.close()
    assert _descriptors_of(path) == 0, "closed with no view: the file goes at once"


def test_gather_rows_into_numpy_and_the_stats_say_what_happened(table):
    path, data = table
    m = host_map(path, budget=2 * MIB, extent_size=4096, advice="random")
    offsets = [(i * 2_654_435_761) % (len(data) - 4096) for i in range(500)]
    rows = gpumapio.gather(m, offsets, 4096)
    assert isinstance(rows, np.ndarray) and rows.dtype == np.uint8 and rows.size == 500 * 4096
    for i, o in enumerate(offsets):
        assert rows[i * 4096 : (i + 1) * 4096].tobytes() == data[o : o + 4096]
    stats = m.stats()
    assert stats["misses"] > 0 and stats["frames"] == 0, stats
    cache = m.cache.stats()
    assert cache["used_bytes"] <= cache["budget"] == 2 * MIB
    out = bytearray(3 * 10)
    m.gather([5, 100, 99_999], 10, out)
    assert bytes(out) == data[5:15] + data[100:110] + data[99_999:100_009]
    with pytest.raises(ValueError):
        m.gather([0], 100, bytearray(10))


def test_files_share_one_cache(tmp_path, table):
    path, data = table
    other = tmp_path / "other.bin"
    other.write_bytes(bytes(range(256)) * 40_000)
    cache = gpumapio.DeviceCache(4 * MIB, extent_size=4096, frame_size=2 * MIB, device="host")
    a = cache.open(path)
    b = gpumapio.map(other, cache=cache)
    out = np.zeros(200, dtype=np.uint8)
    cache.gather([(a, 10, 100), (b, 256 * 7 + 3, 100)], out)
    assert out[:100].tobytes() == data[10:110]
    assert out[100:].tobytes() == (bytes(range(256)) * 2)[3:103]
    stats = cache.stats()
    assert stats["files"] == 2 and stats["totals"]["misses"] >= 2
    assert "host memory" in repr(cache) and cache.device == "host memory"
    b.close()
    with pytest.raises(ValueError, match="closed MappedFile"):
        cache.gather([(a, 10, 100), (b, 0, 100)], out)


def test_a_cache_in_shards(tmp_path, table):
    path, data = table
    cache = gpumapio.DeviceCache(8 * MIB, extent_size=4096, frame_size=2 * MIB, device="host", shards=2)
    m = cache.open(path)
    out = np.zeros(300, dtype=np.uint8)
    m.gather([0, 2 * MIB + 5, len(data) - 100], 100, out)
    assert out.tobytes() == data[:100] + data[2 * MIB + 5 : 2 * MIB + 105] + data[-100:]
    assert cache.stats()["shards"] == 2
    with pytest.raises(ValueError, match="3 shards"):
        gpumapio.DeviceCache(8 * MIB, frame_size=2 * MIB, device="host", shards=3)


def test_read_ahead_can_be_turned_off(table):
    path, data = table
    cache = gpumapio.DeviceCache(8 * MIB, frame_size=2 * MIB, device="host")
    m = cache.open(path, read_ahead=0)
    window = 2 * MIB
    for offset in range(0, len(data) - window, window):
        with m.view(offset, window) as v:
            assert v.tobytes() == data[offset : offset + window]
    stats = m.stats()
    # Every window read when asked for: nothing was there before it.
    assert stats["hits"] == 0 and stats["bytes_faulted"] == 12 * window, stats


def test_default_frames_grow_with_the_budget_and_a_map_fits_its_file(tmp_path):
    assert gpumapio.DeviceCache.default_frame_size(64 * MIB) == 8 * MIB
    assert gpumapio.DeviceCache.default_frame_size(1 << 30) == 32 * MIB
    assert gpumapio.DeviceCache.default_frame_size(1 << 40) == 64 * MIB
    # A sparse file of 1 GiB + 1 byte: its own cache holds all of it in whole 32 MiB frames.
    path = tmp_path / "sparse.bin"
    with open(path, "wb") as f:
        f.truncate((1 << 30) + 1)
    with gpumapio.map(path, device="host") as m:
        stats = m.cache.stats()
        assert stats["budget"] >= (1 << 30) + 1 and stats["frame_size"] == 32 * MIB, stats
        assert m.read((1 << 30) - 4, 5) == bytes(5)
    # MappedFile.open sizes its own cache the same way (the library's MapOptions), in frames of
    # the size given, or of the budget given.
    with gpumapio.MappedFile.open(path, device="host", frame_size=16 * MIB) as m:
        stats = m.cache.stats()
        assert stats["budget"] == (1 << 30) + 16 * MIB and stats["frame_size"] == 16 * MIB, stats
    with gpumapio.MappedFile.open(path, device="host", budget=64 * MIB) as m:
        stats = m.cache.stats()
        assert stats["budget"] == 64 * MIB and stats["frame_size"] == 8 * MIB, stats
        assert m.read(1 << 30, 1) == bytes(1)


def test_a_map_of_its_own_holds_a_view_of_one_extent_beside_one_of_the_whole_file(tmp_path, rng):
    """A single-extent view was served from a slot, in a frame of its own: a cache of the file's
    size then had no room for a view of the whole file beside it (OutOfBudgetError). In a cache
    made for one file it is read into its frame."""
    data = rng.integers(0, 256, size=64 * MIB, dtype="u1").tobytes()
    path = tmp_path / "whole.bin"
    path.write_bytes(data)
    with gpumapio.map(path, device="host") as m:
        with m.view(4096, 4096) as one, m.view(0, len(data)) as whole:
            assert one.tobytes() == data[4096:8192]
            assert whole.nbytes == len(data)
            assert m.read(len(data) - 16, 16) == data[-16:]


def test_writes_are_written_back(tmp_path, rng):
    data = bytearray(rng.integers(0, 256, size=5 * MIB, dtype="u1").tobytes())
    path = tmp_path / "rw.bin"
    path.write_bytes(data)
    with host_map(path, budget=2 * MIB, writable=True, extent_size=4096) as m:
        m.write(MIB + 7, b"hello")
        data[MIB + 7 : MIB + 12] = b"hello"
        with m.view(3 * MIB, 4, writable=True) as v:
            v.write(b"WXYZ")
            data[3 * MIB : 3 * MIB + 4] = b"WXYZ"
        with pytest.raises(ValueError, match="read-only"):
            m.view(0, 4).write(b"nope")
        m.flush()
        assert path.read_bytes() == bytes(data)
        m.write(0, np.frombuffer(b"\x01\x02", dtype=np.uint8))
        data[0:2] = b"\x01\x02"
    assert path.read_bytes() == bytes(data), "close writes back"
    ro = host_map(path, budget=2 * MIB)
    with pytest.raises(OSError):
        ro.view(0, 1, writable=True)


def test_close_waits_for_writes_in_flight_and_lets_none_in_after(tmp_path):
    """Writes from other threads racing close(): every write that returned is on disk when
    close() returns, every one after is refused, and nothing written later by other means is
    overwritten when the closed map goes."""
    size = 4 * MIB
    path = tmp_path / "race.bin"
    for trial in range(5):
        path.write_bytes(bytes(size))
        m = host_map(path, budget=size, writable=True, extent_size=4096)
        accepted: list[dict[int, bytes]] = [{} for _ in range(4)]
        started = threading.Barrier(5)

        def writer(k):
            started.wait()
            i = 0
            while True:
                offset = ((i * 4 + k) % 1024) * 4096
                value = bytes([(i // 256 + k + trial) % 250 + 1]) * 4096
                try:
                    m.write(offset, value)
                except ValueError:
                    return
                accepted[k][offset] = value
                i += 1

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        started.wait()
        m.close()
        on_disk = path.read_bytes()
        for t in threads:
            t.join()
        for writes in accepted:
            for offset, value in writes.items():
                assert on_disk[offset : offset + 4096] == value, (trial, offset)
        path.write_bytes(b"N" * size)  # the file rewritten by someone else
        del m
        gc.collect()
        assert path.read_bytes() == b"N" * size, "a closed map wrote back later"


def test_releasing_the_last_hold_on_a_dirty_map_beside_another_thread(tmp_path):
    """release() of a view that is the last hold on a dirty writable map flushes it, while
    another thread keeps calling the view's methods: it returns (it once deadlocked, the flush
    waiting for the GIL that the other thread held while it waited for the view). In a process
    of its own, so that a deadlock fails the test instead of hanging the suite."""
    path = tmp_path / "last.bin"
    script = f"""
import gc, threading
import gpumapio
size = 64 << 20
path = {str(path)!r}
open(path, "wb").truncate(size)
m = gpumapio.map(path, device="host", frame_size=2 << 20, budget=size, writable=True)
view = m.view(0, size, writable=True)
view.write(b"\\x07" * size)
del m
gc.collect()
def toucher():
    while True:
        try:
            view.__dlpack_device__()
        except BufferError:
            pass
        except ValueError:
            return
threading.Thread(target=toucher, daemon=True).start()
view.release()
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    with open(path, "rb") as f:
        assert f.read(4096) == b"\x07" * 4096
        f.seek((64 << 20) - 4096)
        assert f.read() == b"\x07" * 4096


def test_a_file_is_open_writable_in_one_cache_once(tmp_path, rng):
    """A cache refuses a second map of a file where either map is writable (each would write
    back its stale copy of the other's extents) and names both; read-only maps of a file
    share a cache, and the file opens again once the first map and its views are gone."""
    data = rng.integers(0, 256, size=MIB, dtype="u1").tobytes()
    path = tmp_path / "once.bin"
    path.write_bytes(data)
    link = tmp_path / "link.bin"
    link.symlink_to(path)
    cache = gpumapio.DeviceCache(4 * MIB, device="host", frame_size=2 * MIB, extent_size=4096)
    first = cache.open(path, writable=True)
    for other, writable in ((path, True), (path, False), (link, True), (link, False)):
        with pytest.raises(ValueError, match="already open in this cache") as refused:
            cache.open(other, writable=writable)
        assert str(path) in str(refused.value)
    first.write(0, b"A" * 10)
    del first
    gc.collect()
    again = cache.open(link, writable=True)
    assert again.read(0, 10) == b"A" * 10
    del again
    gc.collect()
    readers = [cache.open(path), cache.open(link)]
    assert all(r.read(0, 10) == b"A" * 10 for r in readers)
    with pytest.raises(ValueError, match="already open in this cache"):
        cache.open(path, writable=True)
    other_cache = gpumapio.DeviceCache(4 * MIB, device="host", frame_size=2 * MIB)
    other_cache.open(path, writable=True).close()  # another cache: not coherent, documented


def fault_injection():
    """gpumap's injected write faults, where the wheel was built with them (scripts/test.sh
    builds it with the feature fault-injection)."""
    native = gpumapio._native
    if not hasattr(native, "_arm_write_fault"):
        pytest.skip("the wheel was built without the fault-injection feature (scripts/test.sh has it)")
    return native


def test_a_failed_write_back_on_release_is_a_runtime_warning(tmp_path):
    """The library can only log a write-back that fails when a map is dropped; the last
    Python handle on a writable map (the MappedFile or a view of it) flushes it and warns."""
    native = fault_injection()
    path = tmp_path / "warned-target.bin"
    path.write_bytes(bytes(4 * MIB))

    m = host_map(path, budget=2 * MIB, writable=True, extent_size=4096)
    m.write(5, b"lost")
    native._arm_write_fault("warned-target", errno.EIO)
    try:
        with pytest.warns(RuntimeWarning, match="written back") as caught:
            del m
            gc.collect()
    finally:
        native._disarm_write_fault()
    message = str(caught[0].message)
    assert str(path) in message and "Input/output error" in message, message

    # A view outlives its MappedFile: the warning comes when the view goes.
    m = host_map(path, budget=2 * MIB, writable=True, extent_size=4096)
    view = m.view(MIB, 4096, writable=True)
    view.write(b"also lost")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del m
        gc.collect()  # the view still holds the map: nothing is flushed or lost yet
    native._arm_write_fault("warned-target", errno.ENOSPC)
    try:
        with pytest.warns(RuntimeWarning, match="written back"):
            view.release()
            del view
            gc.collect()
    finally:
        native._disarm_write_fault()

    # A write-back that works says nothing.
    m = host_map(path, budget=2 * MIB, writable=True, extent_size=4096)
    m.write(0, b"kept")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del m
        gc.collect()
    assert path.read_bytes()[:4] == b"kept"


def test_errors_are_python_exceptions(tmp_path, table):
    path, _ = table
    with pytest.raises(FileNotFoundError):
        gpumapio.map(tmp_path / "missing", device="host")
    with pytest.raises(ValueError, match="less than one frame"):
        gpumapio.map(path, device="host", budget=4096)
    with pytest.raises(ValueError, match="extent size"):
        gpumapio.map(path, device="host", extent_size=3000)
    with pytest.raises(ValueError, match="advice"):
        gpumapio.map(path, device="host", advice="soon")
    with pytest.raises(ValueError, match="device"):
        gpumapio.map(path, device="gpu7")
    with pytest.raises(ValueError, match="device -1"):
        gpumapio.map(path, device=-1)
    with pytest.raises(TypeError, match="device 1.5"):
        gpumapio.map(path, device=1.5)
    m = host_map(path, budget=2 * MIB)
    with pytest.raises(gpumapio.OutOfBudgetError):
        m.view(0, 5 * MIB)
    out = np.empty(4096, np.uint8)
    for indices in ([1.9], [True], (0, 0.5)):
        with pytest.raises(TypeError, match="integers"):
            gpumapio.gather_rows(m, indices, 4096, out=out)
    gpumapio.gather_rows(m, [], 4096, out=out)  # nothing to gather


def test_prefetch_and_advice(table):
    path, data = table
    m = host_map(path, budget=8 * MIB)
    assert m.prefetch(0, MIB).get() == MIB
    before = m.stats()["misses"]
    assert m.read(100, 1000) == data[100:1100]
    assert m.stats()["misses"] == before, "the prefetched range was read again"
    m.advise(0, len(data), "sequential")
    m.advise(0, MIB, "dontneed")
    with pytest.raises(ValueError):
        m.advise(0, 1, "later")


def test_threads_gather_at_once_with_the_gil_released(table):
    path, data = table
    m = host_map(path, budget=4 * MIB, extent_size=4096)
    errors = []

    def work(seed):
        try:
            offsets = [(seed * 7919 + i * 104_729) % (len(data) - 512) for i in range(300)]
            rows = gpumapio.gather(m, offsets, 512)
            for i, o in enumerate(offsets):
                assert rows[i * 512 : (i + 1) * 512].tobytes() == data[o : o + 512]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---- on a GPU --------------------------------------------------------------------------------


def test_gpu_views_export_without_a_copy_and_keep_their_pin(tmp_path):
    cupy = need_gpu("cupy")
    path, data = random_file(tmp_path, "gpu.bin", 8 * MIB + 5, 7)
    # Four frames: the CuPy array pins two, the DLPack tensor one, reads use the last.
    m = gpumapio.map(path, budget=8 * MIB, frame_size=2 * MIB, extent_size=4096)
    assert m.base is not None
    view = m.view(3 * MIB + 5, MIB)
    assert view.ptr == m.base + 3 * MIB + 5
    arr = cupy.asarray(view)
    assert arr.dtype == cupy.uint8 and arr.size == MIB
    assert arr.data.ptr == view.ptr, "a view is exported in place"
    np.testing.assert_array_equal(cupy.asnumpy(arr), data[3 * MIB + 5 : 4 * MIB + 5])
    # The array holds the view; the view holds the pin. Reading the rest of the file must
    # evict around it, never under it.
    del view
    gc.collect()
    m.read(0, 2 * MIB)
    m.read(6 * MIB, 2 * MIB)
    np.testing.assert_array_equal(cupy.asnumpy(arr), data[3 * MIB + 5 : 4 * MIB + 5])
    # DLPack: the capsule owns a pin of its own.
    dl = cupy.from_dlpack(m.view(100, 4096))
    gc.collect()
    m.read(6 * MIB, 2 * MIB)
    np.testing.assert_array_equal(cupy.asnumpy(dl), data[100:4196])
    assert m.view(0, 10).__dlpack_device__() == (2, 0)


def test_gpu_gather_into_cupy_and_torch(tmp_path):
    cupy = need_gpu("cupy")
    path, data = random_file(tmp_path, "rows.bin", 32 * MIB, 9)
    m = gpumapio.map(path, budget=2 * MIB, frame_size=2 * MIB, extent_size=4096, advice="random")
    offsets = [(i * 2_654_435_761) % (32 * MIB - 4096) for i in range(2000)]
    rows = gpumapio.gather(m, offsets, 4096)
    assert isinstance(rows, cupy.ndarray)
    host = cupy.asnumpy(rows)
    for i, o in enumerate(offsets):
        assert host[i * 4096 : (i + 1) * 4096].tobytes() == data[o : o + 4096].tobytes()
    torch = need_gpu("torch")
    t = gpumapio.gather(m, offsets[:64], 4096, output="torch")
    assert t.is_cuda and t.dtype == torch.uint8
    assert t.cpu().numpy().tobytes() == host[: 64 * 4096].tobytes()
    view = m.view(4096 * 3, 4096)
    tv = torch.from_dlpack(view)
    assert tv.data_ptr() == view.ptr
    assert tv.cpu().numpy().tobytes() == data[4096 * 3 : 4096 * 4].tobytes()


def test_zero_copy_maps_gather_and_view_around_the_cache(table):
    path, data = table
    m = host_map(path, budget=2 * MIB, extent_size=4096, zero_copy=True)
    offsets = [(i * 2_654_435_761) % (len(data) - 4096) for i in range(500)]
    rows = gpumapio.gather(m, offsets, 4096)
    assert isinstance(rows, np.ndarray)
    for i, o in enumerate(offsets):
        assert rows[i * 4096 : (i + 1) * 4096].tobytes() == data[o : o + 4096]
    with m.view(5 * MIB + 1, 70_000) as v:
        assert v.tobytes() == data[5 * MIB + 1 : 5 * MIB + 70_001]
    assert m.read(len(data) - 10, 10) == data[-10:]
    stats = m.stats()
    assert stats["misses"] == 0 and stats["hits"] == 0 and stats["frames"] == 0, stats
    with pytest.raises(ValueError, match="read-only"):
        host_map(path, writable=True, zero_copy=True)


def test_gpu_zero_copy_views_are_the_page_cache_in_place(tmp_path):
    cupy = need_gpu("cupy")
    path, data = random_file(tmp_path, "zc.bin", 16 * MIB + 7, 11)
    m = gpumapio.map(path, budget=2 * MIB, frame_size=2 * MIB, extent_size=4096, zero_copy=True)
    assert m.base is not None
    view = m.view(9 * MIB + 3, MIB)
    assert view.ptr == m.base + 9 * MIB + 3
    arr = cupy.asarray(view)
    assert arr.data.ptr == view.ptr, "exported in place"
    np.testing.assert_array_equal(cupy.asnumpy(arr), data[9 * MIB + 3 : 10 * MIB + 3])
    offsets = [(i * 2_654_435_761) % (16 * MIB - 4096) for i in range(3000)]
    rows = cupy.asnumpy(gpumapio.gather(m, offsets, 4096))
    for i, o in enumerate(offsets):
        assert rows[i * 4096 : (i + 1) * 4096].tobytes() == data[o : o + 4096].tobytes()
    assert m.stats()["misses"] == 0


def _ends_within(seconds, call):
    """What `call` returns or raises, run on a daemon thread; fails where it has not ended
    after `seconds` (a hang must fail the test, not the suite)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return outcome


def test_a_view_that_cannot_fit_beside_pinned_ones_is_out_of_budget_in_a_sharded_cache(tmp_path):
    """With more than one shard, a view that could not fit went round for ever at full CPU:
    waiting on one shard let it take the frames just let go in the others. It is refused
    after the pin wait, as with one shard."""
    frame = 2 * MIB  # the allocation granularity
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(os.urandom(8 * frame))
    b.write_bytes(os.urandom(12 * frame))
    cache = gpumapio.DeviceCache(16 * frame, extent_size=4096, frame_size=frame, device="host", shards=4)
    ma, mb = cache.open(a), cache.open(b)
    held = ma.view(0, 8 * frame)
    outcome = _ends_within(60, lambda: mb.view(0, 12 * frame))
    assert isinstance(outcome.get("error"), gpumapio.OutOfBudgetError), outcome
    # One shard's way, and a view that fits, still work.
    assert mb.view(0, 4 * frame).tobytes() == b.read_bytes()[: 4 * frame]
    del held


def test_close_inside_a_call_on_the_same_map_is_refused_not_a_deadlock(tmp_path):
    """A buffer's export, or a __del__ the garbage collector runs during a call, that closed
    the map waited for the call it ran inside, for ever."""
    path = tmp_path / "close.bin"
    path.write_bytes(bytes(64 << 10))
    m = gpumapio.map(path, writable=True, device="host", extent_size=4096)
    seen = []

    class ClosesTheMap:
        def __init__(self, array):
            self.array = array

        @property
        def __cuda_array_interface__(self):
            try:
                m.close()
            except RuntimeError as e:
                seen.append(str(e))
            raise AttributeError("host memory")

        def __buffer__(self, flags):
            return memoryview(self.array)

    for call in (
        lambda: m.write(0, ClosesTheMap(np.ones(16, np.uint8))),
        lambda: m.gather([0, 4096], 16, ClosesTheMap(np.zeros(32, np.uint8))),
    ):
        outcome = _ends_within(30, call)
        assert "error" not in outcome or not isinstance(outcome["error"], AssertionError), outcome
    assert seen and all("inside a call on it" in s for s in seen), seen
    assert not m.closed
    m.close()  # outside any call: closes
    assert m.closed


def test_no_warning_of_lost_bytes_when_the_last_flush_wrote_them(tmp_path):
    """A map whose close failed, let go once the cause was gone: the release's flush writes
    every byte but fails on the earlier write-back's sticky error, and warned that the bytes
    "could not be written back" (with "0 bytes stay dirty" in the same message). Nothing is
    lost then, and nothing is said."""
    native = fault_injection()
    path = tmp_path / "recovered.bin"
    path.write_bytes(bytes(MIB))
    m = host_map(path, writable=True, extent_size=4096)
    m.write(0, b"\x07" * 8192)
    native._arm_write_fault("recovered.bin", errno.ENOSPC)
    try:
        with pytest.raises(OSError):
            m.close()
    finally:
        native._disarm_write_fault()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del m
        gc.collect()
    assert [str(w.message) for w in caught] == []
    assert path.read_bytes()[:8192] == b"\x07" * 8192


def test_a_writable_map_a_daemon_thread_holds_is_flushed_at_exit(tmp_path):
    """A writable map that is never released (here a daemon thread holds it) was never written
    back: the writes it had reported were lost at the interpreter's exit, silently. The exit
    flushes every writable map still alive, as a buffered file is flushed."""
    path = tmp_path / "held.bin"
    path.write_bytes(bytes(MIB))
    child = textwrap.dedent(
        f"""
        import threading, time, gpumapio
        m = gpumapio.map({str(path)!r}, writable=True, device="host")
        m.write(0, b"X" * 4096)
        keep = [m]
        threading.Thread(target=lambda held: time.sleep(100), args=(keep,), daemon=True).start()
        """
    )
    run = subprocess.run([sys.executable, "-W", "error", "-c", child], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert path.read_bytes()[:4096] == b"X" * 4096
