"""gpumapio.map over remote objects: an HTTP(S) URL (the range server on 127.0.0.1) and an S3
object (moto), mapped read-only into the GPU page cache (host memory without a GPU) — reads,
views, gathers and row gathers byte for byte against the object; a second gather of the same
rows makes no request; writable maps refused."""

from __future__ import annotations

import numpy as np
import pytest

import gpumapio
from conftest import need_gpu

MIB = 1 << 20


@pytest.fixture
def published(server, rng):
    data = rng.integers(0, 256, size=3 * MIB + 321, dtype="u1").tobytes()
    server.objects["/t/table.bin"] = data
    return f"{server.url}/t/table.bin", data


def test_reads_views_and_gathers_match_the_object(published):
    url, data = published
    with gpumapio.map(url, device="host", budget=8 * MIB, frame_size=2 * MIB, extent_size=4096) as m:
        assert m.nbytes == len(data) and m.path == url and not m.writable
        for offset, length in [(0, 1), (4095, 2), (12_345, 100_000), (len(data) - 7, 7)]:
            assert m.read(offset, length) == data[offset : offset + length]
        out = np.zeros(3 * 512, dtype="u1")
        m.gather([0, 4096 * 100 + 3, len(data) - 512], 512, out)
        expected = data[:512] + data[4096 * 100 + 3 :][:512] + data[-512:]
        assert out.tobytes() == expected


def test_a_hot_set_of_rows_is_served_with_no_request(server, published):
    url, data = published
    m = gpumapio.map(url, device="host", budget=8 * MIB, frame_size=2 * MIB, extent_size=4096)
    rows = len(data) // 256
    indices = (np.arange(2000, dtype=np.int64) * 7919) % rows
    first = gpumapio.gather_rows(m, indices, 256, output="numpy")
    table = np.frombuffer(data[: rows * 256], dtype="u1").reshape(rows, 256)
    np.testing.assert_array_equal(first, table[indices])
    gets = server.gets
    second = gpumapio.gather_rows(m, indices, 256, output="numpy")
    np.testing.assert_array_equal(second, first)
    assert server.gets == gets, "resident rows were fetched again"
    m.close()


def test_writable_and_zero_copy_maps_of_urls_are_refused(published):
    url, _ = published
    with pytest.raises(ValueError, match="read-only"):
        gpumapio.map(url, device="host", writable=True)
    with pytest.raises(ValueError, match="zero-copy"):
        gpumapio.map(url, device="host", zero_copy=True)
    with pytest.raises(FileNotFoundError):
        gpumapio.map(url.replace("table", "missing"), device="host")


def test_an_s3_object_joins_a_cache_beside_a_local_file(moto_s3, tmp_path):
    endpoint, data, _ = moto_s3
    import os

    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        local = tmp_path / "local.bin"
        local.write_bytes(data[::-1])
        cache = gpumapio.DeviceCache(budget=8 * MIB, device="host", frame_size=2 * MIB)
        remote = cache.open("s3://gpumap-bucket/dir/object.bin")
        mine = cache.open(local)
        assert remote.read(100, 5000) == data[100:5100]
        assert mine.read(100, 5000) == data[::-1][100:5100]
        out = np.zeros(2000, dtype="u1")
        cache.gather([(remote, 7, 1000), (mine, 9, 1000)], out)
        assert out.tobytes() == data[7:1007] + data[::-1][9:1009]
    finally:
        del os.environ["AWS_ENDPOINT_URL"]


def test_rows_of_a_url_land_in_gpu_memory(published):
    cp = need_gpu("cupy")
    url, data = published
    m = gpumapio.map(url, budget=8 * MIB, extent_size=4096)
    indices = cp.arange(0, 1000, 3, dtype=cp.int64)
    rows = gpumapio.gather_rows(m, indices, 512)
    table = np.frombuffer(data[: (len(data) // 512) * 512], dtype="u1").reshape(-1, 512)
    np.testing.assert_array_equal(cp.asnumpy(rows), table[cp.asnumpy(indices)])
