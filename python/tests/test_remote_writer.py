"""gpumapio.RemoteWriter against moto's S3 server on 127.0.0.1: objects written as multipart
uploads (or one PUT) read back byte for byte, from many threads, holes refused, and aborted
uploads leaving no object (docs/remote.md)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gpumapio import RemoteFile, RemoteWriter

from conftest import need_gpu

PART = 5 << 20


def _writer(endpoint, key, **kw):
    return RemoteWriter(f"s3://gpumap-bucket/{key}", aws_endpoint_url=endpoint, part_size=PART, **kw)


def _read_back(endpoint, key):
    f = RemoteFile.open_s3("gpumap-bucket", key, aws_endpoint_url=endpoint)
    out = np.empty(f.nbytes(), dtype="u1")
    f.read(out)
    return out.tobytes()


def _open_uploads(endpoint):
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return client.list_multipart_uploads(Bucket="gpumap-bucket").get("Uploads", [])


def test_parts_written_out_of_order_and_from_threads_read_back(moto_s3):
    endpoint, _, _ = moto_s3
    data = np.random.default_rng(3).integers(0, 256, size=2 * PART + 4099, dtype="u1")
    w = _writer(endpoint, "out/threads.bin")
    assert w.part_size == PART
    cuts = list(range(0, len(data), 999_983)) + [len(data)]
    pieces = list(zip(cuts[:-1], cuts[1:]))
    with ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(lambda p: w.write(data[p[0] : p[1]], file_offset=p[0]), pieces[::-1]))
    assert sum(counts) == len(data) == w.nbytes()
    assert w.finish() == len(data)
    assert _read_back(endpoint, "out/threads.bin") == data.tobytes()
    assert _open_uploads(endpoint) == []
    with pytest.raises(ValueError, match="finished"):
        w.write(b"x", file_offset=0)


def test_the_context_manager_finishes_or_aborts(moto_s3):
    endpoint, _, _ = moto_s3
    with _writer(endpoint, "small.bin") as w:
        assert w.write(b"world", file_offset=6) == 5
        w.write(bytearray(b"hello "), size=6)
    assert _read_back(endpoint, "small.bin") == b"hello world"
    big = np.ones(PART + 10, dtype="u1")
    with pytest.raises(KeyError):
        with _writer(endpoint, "abandoned.bin") as w:
            w.write(big)
            raise KeyError("the caller's own error goes on")
    with pytest.raises(FileNotFoundError):
        RemoteFile.open("s3://gpumap-bucket/abandoned.bin", aws_endpoint_url=endpoint)
    assert _open_uploads(endpoint) == []


def test_a_hole_is_a_value_error_naming_its_byte_and_nothing_is_written(moto_s3):
    endpoint, _, _ = moto_s3
    w = _writer(endpoint, "holed.bin")
    w.write(np.zeros(PART + 100, dtype="u1"))
    w.write(b"tail", file_offset=PART + 200)
    with pytest.raises(ValueError, match=f"byte {PART + 100} of the {PART + 204} bytes"):
        w.finish()
    with pytest.raises(FileNotFoundError):
        RemoteFile.open("s3://gpumap-bucket/holed.bin", aws_endpoint_url=endpoint)
    assert _open_uploads(endpoint) == []
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.nbytes()
    a = _writer(endpoint, "aborted.bin")
    a.write(np.zeros(PART, dtype="u1"))
    a.abort()
    assert _open_uploads(endpoint) == []
    with pytest.raises(ValueError, match="http"):
        RemoteWriter("https://example.org/x.bin")
    with pytest.raises(ValueError, match="part_size 1048576"):
        RemoteWriter("s3://gpumap-bucket/x.bin", aws_endpoint_url=endpoint, part_size=1 << 20)


def test_writes_from_gpu_memory(moto_s3):
    cupy = need_gpu("cupy")
    endpoint, _, _ = moto_s3
    host = np.random.default_rng(4).integers(0, 256, size=PART + 4097, dtype="u1")
    src = cupy.asarray(host)
    with _writer(endpoint, "gpu.bin") as w:
        w.write(src[PART // 2 :], file_offset=PART // 2)
        w.write(src[: PART // 2])
    assert _read_back(endpoint, "gpu.bin") == host.tobytes()


@pytest.mark.parametrize(
    "url_key, key",
    [
        ("ckpt/epoch~1.bin", "ckpt/epoch~1.bin"),
        ("ckpt/new\u00e9.bin", "ckpt/new\u00e9.bin"),
        ("ckpt/new%C3%A9.bin", "ckpt/new\u00e9.bin"),
        ("ckpt/shard[0].bin", "ckpt/shard[0].bin"),
        ("ckpt/a%20b.bin", "ckpt/a b.bin"),
        ("ckpt/100%25.bin", "ckpt/100%.bin"),
    ],
)
def test_objects_are_written_and_read_under_the_key_named(moto_s3, url_key, key):
    """The key is the URL's path percent-decoded once: keys with ~, [ ], %, non-ASCII letters
    or spaces were sent encoded twice, so the object landed under another key (`epoch%7E1`),
    with success reported, and objects written by other tools could not be opened."""
    boto3 = pytest.importorskip("boto3")
    endpoint, _, put = moto_s3
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    put(key, b"OLD")
    w = RemoteWriter(f"s3://gpumap-bucket/{url_key}", aws_endpoint_url=endpoint)
    w.write(b"NEW")
    assert w.finish() == 3
    assert client.get_object(Bucket="gpumap-bucket", Key=key)["Body"].read() == b"NEW"
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="gpumap-bucket", Prefix="ckpt/")["Contents"]]
    assert keys == [key], keys
    f = RemoteFile.open(f"s3://gpumap-bucket/{url_key}", aws_endpoint_url=endpoint)
    out = bytearray(3)
    assert f.read(out) == 3 and out == b"NEW"
    assert RemoteFile.open_s3("gpumap-bucket", key, aws_endpoint_url=endpoint).nbytes() == 3
    from gpumapio import RemotePrefix

    prefix = RemotePrefix("s3://gpumap-bucket/ckpt/", aws_endpoint_url=endpoint)
    name = key.removeprefix("ckpt/")
    assert [n for n, _ in prefix.list()] == [name]
    assert prefix.size(name) == 3
    client.delete_object(Bucket="gpumap-bucket", Key=key)


def test_a_replaced_object_fails_reads_rather_than_mix_versions(moto_s3):
    """An object replaced by another of the same size while open: reads ask If-Match of the
    ETag seen at open, so the read fails (412) where it returned old and new bytes mixed."""
    endpoint, _, put = moto_s3
    put("dir/replaced.bin", b"\x55" * 100_000)
    f = RemoteFile.open_s3("gpumap-bucket", "dir/replaced.bin", aws_endpoint_url=endpoint)
    first = bytearray(50_000)
    assert f.read(first, 50_000, 0) == 50_000 and first == b"\x55" * 50_000
    put("dir/replaced.bin", b"\xaa" * 100_000)
    with pytest.raises(OSError, match="changed since it was opened") as e:
        f.read(bytearray(50_000), 50_000, 50_000)
    assert e.value.status == 412


def test_dropping_an_unfinished_writer_waits_without_the_gil(moto_s3):
    """A writer collected unfinished aborts its upload as it goes, which waits on the server:
    it held the GIL meanwhile, so an in-process server (moto's, here) could not answer and the
    drop waited for its timeouts. Now the server answers at once."""
    import gc
    import time

    endpoint, _, _ = moto_s3
    w = _writer(endpoint, "out/dropped.bin", http_timeout=5)
    w.write(np.zeros(PART + 10, dtype="u1"))  # one part sent: an upload exists
    t = time.perf_counter()
    del w
    gc.collect()
    assert time.perf_counter() - t < 4, "the drop waited for a timeout"
    assert _open_uploads(endpoint) == []
