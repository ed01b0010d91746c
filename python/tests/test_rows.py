"""MappedFile.gather_rows / gpumapio.gather_rows: rows of a file seen as a table, by index,
checked byte for byte against the file — on host memory here, and on the GPU (indices and
output in CuPy or torch, on the caller's stream) where there is one."""

from __future__ import annotations

import array
import threading

import numpy as np
import pytest

import gpumapio
from conftest import need_gpu

MIB = 1 << 20


@pytest.fixture
def table(tmp_path, rng):
    """A file of 3000 rows of 512 bytes and 77 bytes more (a partial row, not a row)."""
    data = rng.integers(0, 256, size=3000 * 512 + 77, dtype="u1")
    path = tmp_path / "rows.bin"
    data.tofile(path)
    return path, data


def host_map(path, **kw):
    kw.setdefault("budget", 4 * MIB)
    return gpumapio.map(path, device="host", frame_size=2 * MIB, extent_size=4096, **kw)


def expected(data, indices, row_size):
    return np.stack([data[i * row_size : (i + 1) * row_size] for i in indices])


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_rows_by_index_match_the_file(table, rng, dtype):
    path, data = table
    m = host_map(path)
    indices = rng.integers(0, 3000, size=5000).astype(dtype)
    rows = gpumapio.gather_rows(m, indices, 512)
    assert rows.shape == (5000, 512) and rows.dtype == np.uint8
    assert np.array_equal(rows, expected(data, indices, 512))
    # Into a caller's array, any shape holding the bytes; indices of any shape, memory order.
    out = np.zeros((10, 512), dtype=np.uint8)
    m.gather_rows(indices[:10].reshape(2, 5), 512, out)
    assert np.array_equal(out, expected(data, indices[:10], 512))


def test_typed_rows_come_shaped(table, rng):
    """512 B rows as float32 come as (n, 128) float32, the bytes the file's."""
    path, data = table
    m = host_map(path)
    indices = rng.integers(0, 3000, size=100)
    rows = gpumapio.gather_rows(m, indices, 512, dtype="float32")
    assert rows.shape == (100, 128) and rows.dtype == np.float32
    assert rows.tobytes() == expected(data, indices, 512).tobytes()
    with pytest.raises(ValueError, match="whole number"):
        gpumapio.gather_rows(m, indices, 510, dtype="float64")


@pytest.mark.parametrize("row_size", [1, 3, 4096, 4096 + 7, 3 * MIB])
def test_rows_of_any_size(tmp_path, rng, row_size):
    data = rng.integers(0, 256, size=3 * MIB + 4099, dtype="u1")
    path = tmp_path / "any.bin"
    data.tofile(path)
    m = host_map(path, budget=8 * MIB)
    rows = (len(data)) // row_size
    indices = np.array([0, rows - 1, rows // 2, 0], dtype=np.int64)
    got = gpumapio.gather_rows(m, indices, row_size)
    assert np.array_equal(got, expected(data, indices, row_size))


def test_lists_and_array_array_and_unaligned_indices(table):
    path, data = table
    m = host_map(path)
    want = expected(data, [7, 2999, 0], 512)
    assert np.array_equal(gpumapio.gather_rows(m, [7, 2999, 0], 512), want)
    for code in "iq":
        out = bytearray(3 * 512)
        m.gather_rows(array.array(code, [7, 2999, 0]), 512, out)
        assert bytes(out) == want.tobytes()
    # int64 indices at an odd address (a view one byte into a buffer) are copied, not misread.
    raw = bytearray(1 + 3 * 8)
    raw[1:] = np.array([7, 2999, 0], dtype=np.int64).tobytes()
    odd = np.frombuffer(raw, dtype=np.int64, offset=1)
    assert odd.ctypes.data % 8 != 0
    assert np.array_equal(gpumapio.gather_rows(m, odd, 512), want)


def test_bad_indices_raise_index_error_naming_them(table):
    path, _ = table
    m = host_map(path)
    out = np.zeros((4, 512), dtype=np.uint8)
    for bad, shown in [(-1, "-1"), (3000, "3000"), (2**40, str(2**40))]:
        indices = np.array([0, 1, bad, 2], dtype=np.int64)
        with pytest.raises(IndexError, match=rf"row index {shown} at position 2 .* 3000 rows"):
            m.gather_rows(indices, 512, out)
    with pytest.raises(IndexError):
        gpumapio.gather_rows(m, np.array([0], dtype=np.int32), path.stat().st_size + 1)


def test_bad_arguments_are_typed_errors(table):
    path, _ = table
    m = host_map(path)
    out = np.zeros((2, 512), dtype=np.uint8)
    for wrong in [
        np.array([0, 1], dtype=np.uint64),
        np.array([0, 1], dtype=np.float64),
        np.array([0, 1], dtype=np.int16),
        b"\0" * 16,
    ]:
        with pytest.raises(TypeError, match="int32 or int64"):
            m.gather_rows(wrong, 512, out)
    with pytest.raises(TypeError, match="plain data"):
        m.gather_rows(np.array([0, 1], dtype=object), 512, out)
    with pytest.raises(TypeError):
        m.gather_rows([0, 1], 512, out)  # the method takes buffers; gpumapio.gather_rows lists
    ok = np.array([0, 1], dtype=np.int64)
    with pytest.raises(ValueError, match="row_size"):
        m.gather_rows(ok, 0, out)
    with pytest.raises(ValueError):
        m.gather_rows(ok, 512, np.zeros(1023, dtype=np.uint8))
    with pytest.raises(ValueError):
        m.gather_rows(ok, 2**62, out)
    with pytest.raises(ValueError, match="contiguous"):
        m.gather_rows(np.arange(4, dtype=np.int64)[::2], 512, out)
    with pytest.raises((TypeError, ValueError)):
        m.gather_rows(ok, 512, bytes(1024))  # read-only output
    with pytest.raises(TypeError):
        m.gather_rows(ok, 512, np.zeros(2, dtype=object))
    # No index, no row: a valid empty gather.
    m.gather_rows(np.zeros(0, dtype=np.int64), 512, bytearray())


def test_writes_are_seen_by_the_next_gather_and_reach_the_file(table):
    path, data = table
    m = host_map(path, writable=True)
    rows = np.array([5, 6, 2999], dtype=np.int64)
    before = gpumapio.gather_rows(m, rows, 512)
    assert np.array_equal(before, expected(data, rows, 512))
    m.write(6 * 512 + 10, b"written")
    after = gpumapio.gather_rows(m, rows, 512)
    assert after[1, 10:17].tobytes() == b"written"
    m.sync()
    assert path.read_bytes()[6 * 512 + 10 : 6 * 512 + 17] == b"written"


def test_a_file_cut_under_the_map_reads_as_cut(table):
    """Cut to 100 rows (12.5 extents of 4 KiB): rows in extents the file still wholly holds read
    as before; a row past the end, or in the extent the cut went through, is an EOFError (the
    cache never stands zeros in for bytes the file lost); past the rows mapped, an IndexError."""
    path, data = table
    m = host_map(path)
    with open(path, "r+b") as f:
        f.truncate(100 * 512)
    assert np.array_equal(gpumapio.gather_rows(m, [95, 0], 512), expected(data, [95, 0], 512))
    for row in (99, 100, 2999):
        with pytest.raises(EOFError):
            gpumapio.gather_rows(m, [row], 512)
    with pytest.raises(IndexError):
        gpumapio.gather_rows(m, [3000], 512)


def test_threads_gather_while_one_writes(table):
    """Eight threads gather under a small budget while one rewrites every 97th row with 0xAA
    or 0x55 bytes: the other rows read as the file's, and no byte of a rewritten row is other
    than the file's, 0xAA or 0x55 (a gather racing a write may see part of it)."""
    path, data = table
    m = host_map(path, writable=True, budget=2 * MIB)
    stop = threading.Event()
    failures = []

    def writer():
        v = 0xAA
        while not stop.is_set():
            v ^= 0xFF
            for r in range(0, 3000, 97):
                m.write(r * 512, bytes([v]) * 512)

    def reader(seed):
        g = np.random.default_rng(seed)
        for _ in range(30):
            indices = g.integers(0, 3000, size=700)
            rows = gpumapio.gather_rows(m, indices, 512)
            for i, row in zip(indices, rows):
                if i % 97 == 0:
                    file_row = data[i * 512 : (i + 1) * 512]
                    if not ((row == file_row) | (row == 0xAA) | (row == 0x55)).all():
                        failures.append((int(i), "alien bytes"))
                elif not np.array_equal(row, data[i * 512 : (i + 1) * 512]):
                    failures.append((int(i), "wrong bytes"))

    w = threading.Thread(target=writer)
    w.start()
    readers = [threading.Thread(target=reader, args=(s,)) for s in range(8)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    stop.set()
    w.join()
    assert not failures, failures[:5]


def test_gpu_indices_and_output_on_the_callers_stream(table, rng):
    cupy = need_gpu("cupy")
    path, data = table
    m = gpumapio.map(path, budget=64 * MIB, extent_size=4096)
    for dtype in (cupy.int32, cupy.int64):
        indices = cupy.asarray(rng.integers(0, 3000, size=20_000), dtype=dtype)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            out = cupy.empty((20_000, 512), dtype=cupy.uint8)
            m.gather_rows(indices, 512, out, stream=stream)
            stream.synchronize()
        want = expected(data, cupy.asnumpy(indices), 512)
        assert np.array_equal(cupy.asnumpy(out), want)
    bad = cupy.asarray([0, 3000], dtype=cupy.int64)
    with pytest.raises(IndexError, match="row index 3000 at position 1"):
        gpumapio.gather_rows(m, bad, 512)


def test_gpu_torch_and_zero_copy(table, rng):
    torch = need_gpu("torch")
    path, data = table
    indices_host = rng.integers(0, 3000, size=4096)
    want = expected(data, indices_host, 512)
    for zero_copy in (False, True):
        m = gpumapio.map(path, budget=64 * MIB, extent_size=4096, zero_copy=zero_copy)
        indices = torch.as_tensor(indices_host, device="cuda")
        stream = torch.cuda.Stream()
        out = gpumapio.gather_rows(m, indices, 512, output="torch", stream=stream)
        torch.cuda.synchronize()
        assert np.array_equal(out.cpu().numpy(), want), f"zero_copy={zero_copy}"
        # Host indices into GPU memory, and GPU indices into host memory.
        host_out = np.zeros((4096, 512), dtype=np.uint8)
        m.gather_rows(indices, 512, host_out)
        assert np.array_equal(host_out, want)
        gpu_out = torch.empty((4096, 512), dtype=torch.uint8, device="cuda")
        m.gather_rows(indices_host.astype(np.int64), 512, gpu_out)
        assert np.array_equal(gpu_out.cpu().numpy(), want)
