"""``gpumapio.RemotePrefix`` — an S3 prefix used as a directory — against moto's S3 server on
127.0.0.1: listings in key order, one level at a time, sizes, reads and writes through the
prefix, deletes, and names that could leave the prefix refused before any request."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from gpumapio import RemotePrefix


@pytest.fixture
def prefix(moto_s3):
    endpoint, data, put = moto_s3
    for key, body in [("t/a.bin", b"abc"), ("t/sub/b.bin", b"hello"), ("t/sub/c/d.bin", b"x" * 7),
                      ("tx/e.bin", b"neighbour")]:
        put(key, body)
    return RemotePrefix("s3://gpumap-bucket/t/", aws_endpoint_url=endpoint), endpoint


def test_listings_hold_the_prefixs_objects_in_key_order(prefix):
    p, endpoint = prefix
    assert p.url == "s3://gpumap-bucket/t/"
    assert list(p.list()) == [("a.bin", 3), ("sub/b.bin", 5), ("sub/c/d.bin", 7)]
    assert list(p.list("sub/")) == [("sub/b.bin", 5), ("sub/c/d.bin", 7)]
    assert p.list_dir() == ([("a.bin", 3)], ["sub"])
    assert p.list_dir("sub") == ([("sub/b.bin", 5)], ["sub/c"])
    # The whole bucket (moto keeps other tests' objects in it too): every key, in key order.
    whole = [name for name, _ in RemotePrefix("s3://gpumap-bucket", aws_endpoint_url=endpoint).list()]
    assert whole == sorted(whole)
    assert {"dir/object.bin", "t/a.bin", "t/sub/b.bin", "t/sub/c/d.bin", "tx/e.bin"} <= set(whole)


def test_objects_are_sized_read_written_and_deleted_through_the_prefix(prefix):
    p, _ = prefix
    assert p.size("sub/b.bin") == 5 and p.size("missing") is None
    with p.open("sub/b.bin") as f:
        buf = bytearray(5)
        assert f.read(buf) == 5 and bytes(buf) == b"hello"
    with pytest.raises(FileNotFoundError, match="missing"):
        p.open("missing")
    data = np.random.default_rng(1).integers(0, 256, size=123_457, dtype="u1")
    with p.create("new/obj.bin") as w:
        w.write(data[1000:], file_offset=1000)
        w.write(data[:1000])
    assert p.size("new/obj.bin") == data.size
    back = np.empty_like(data)
    with p.open("new/obj.bin", nbytes=data.size) as f:
        f.read(back)
    np.testing.assert_array_equal(back, data)
    p.delete(["a.bin", "new/obj.bin", "never-there"])
    assert [name for name, _ in p.list()] == ["sub/b.bin", "sub/c/d.bin"]


@pytest.mark.parametrize("name", ["", "../tx/e.bin", "a//b", "./a.bin", "sub/../../x"])
def test_names_that_could_leave_the_prefix_are_refused(prefix, name):
    p, _ = prefix
    for call in (lambda: p.size(name), lambda: p.open(name), lambda: p.create(name), lambda: p.delete([name, "a.bin"])):
        with pytest.raises(ValueError):
            call()
    assert p.size("a.bin") == 3, "nothing was deleted"


def test_listings_from_many_threads_at_once(prefix):
    p, _ = prefix
    got, errors = [], []

    def run():
        try:
            got.append(list(p.list()))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == 8 and all(g == got[0] for g in got)


def test_bad_prefix_urls_are_value_errors(moto_s3):
    for url in ["s3://Bad_Bucket/", "https://host/dir/", "s3://gpumap-bucket/a//b/", "gpumap-bucket/x"]:
        with pytest.raises(ValueError):
            RemotePrefix(url)
