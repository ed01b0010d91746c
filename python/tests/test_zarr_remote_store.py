"""``gpumapio.zarr.RemoteStore`` — a Zarr store over an S3 prefix — against moto's S3 server on
127.0.0.1: zarr's own conformance suite (``zarr.testing.store.StoreTests``) with host buffers
here and GPU buffers (CuPy) where a GPU is present, then arrays written and read through zarr,
keys refused, and the store carried to another process by pickle."""

from __future__ import annotations

import pickle
import subprocess
import sys
import uuid

import numpy as np
import pytest

pytest.importorskip("zarr")
pytest.importorskip("pytest_asyncio", reason="zarr's StoreTests are async tests (pytest-asyncio)")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

import zarr  # noqa: E402
from zarr.core.buffer import cpu  # noqa: E402
from zarr.testing.store import StoreTests  # noqa: E402

from gpumapio.zarr import GpumapStore, RemoteStore, open_store  # noqa: E402


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server for this module's tests, credentials in the environment."""
    saved = {}
    import os

    for name, value in [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")]:
        saved[name] = os.environ.get(name)
        os.environ[name] = value
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    srv.start()
    host, port = srv.get_host_and_port()
    yield f"http://{host}:{port}"
    srv.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def bucket(s3_endpoint):
    """A new, empty bucket for one test, and a boto3 client of the same server."""
    name = f"zarr-{uuid.uuid4().hex[:16]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    return name, client


class _RemoteStoreSuite(StoreTests[RemoteStore, cpu.Buffer]):
    """What zarr leaves to each store: how the suite reads and writes keys behind the store's
    back (boto3, straight to the bucket), and what the store says about itself."""

    store_cls = RemoteStore

    async def get(self, store: RemoteStore, key: str) -> cpu.Buffer:
        bucket, prefix = store.url.removeprefix("s3://").split("/", 1)
        body = self.client.get_object(Bucket=bucket, Key=prefix + key)["Body"].read()
        return self.buffer_cls.from_bytes(body)

    async def set(self, store: RemoteStore, key: str, value) -> None:
        bucket, prefix = store.url.removeprefix("s3://").split("/", 1)
        self.client.put_object(Bucket=bucket, Key=prefix + key, Body=value.to_bytes())

    @pytest.fixture
    def store_kwargs(self, bucket, s3_endpoint) -> dict:
        name, self.client = bucket
        return {"url": f"s3://{name}/root.zarr/", "aws_endpoint_url": s3_endpoint}

    def test_store_repr(self, store: RemoteStore) -> None:
        assert repr(store) == f"RemoteStore('{store.url}')"
        assert str(store) == store.url and store.url.endswith("/root.zarr/")

    def test_store_supports_writes(self, store: RemoteStore) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: RemoteStore) -> None:
        assert store.supports_listing


class TestRemoteStoreHostBuffers(_RemoteStoreSuite):
    buffer_cls = cpu.Buffer


class TestRemoteStoreGPUBuffers(_RemoteStoreSuite):
    """The same suite with the values the tests write held in GPU memory (CuPy)."""

    @pytest.fixture(autouse=True)
    def _gpu_buffers(self):
        from conftest import need_gpu

        need_gpu("cupy")
        from zarr.core.buffer import gpu

        type(self).buffer_cls = gpu.Buffer
        yield


def _store(bucket, s3_endpoint, **kwargs) -> RemoteStore:
    return RemoteStore(f"s3://{bucket[0]}/data.zarr", aws_endpoint_url=s3_endpoint, **kwargs)


def test_arrays_round_trip_through_zarr_byte_for_byte(bucket, s3_endpoint):
    store = _store(bucket, s3_endpoint)
    data = np.random.default_rng(3).standard_normal((301, 77)).astype("f4")
    z = zarr.create_array(store, shape=data.shape, chunks=(64, 32), dtype="f4")
    z[:] = data
    # Keys as zarr lays them out, and every chunk an object of the bucket.
    keys = {o["Key"] for o in bucket[1].list_objects_v2(Bucket=bucket[0])["Contents"]}
    assert "data.zarr/zarr.json" in keys and len(keys) == 1 + 5 * 3
    back = zarr.open_array(_store(bucket, s3_endpoint, read_only=True), mode="r")
    np.testing.assert_array_equal(back[:], data)
    np.testing.assert_array_equal(back[17:250, 5:70], data[17:250, 5:70])


def test_arrays_read_into_gpu_buffers(bucket, s3_endpoint):
    from conftest import need_gpu

    cp = need_gpu("cupy")
    store = _store(bucket, s3_endpoint)
    data = np.arange(100_000, dtype="i8").reshape(1000, 100)
    zarr.create_array(store, shape=data.shape, chunks=(128, 100), dtype="i8")[:] = data
    with zarr.config.enable_gpu():
        got = zarr.open_array(_store(bucket, s3_endpoint, read_only=True), mode="r")[100:900]
    assert isinstance(got, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(got), data[100:900])


def test_a_store_copied_from_a_directory_reads_the_same(bucket, s3_endpoint, tmp_path):
    data = np.random.default_rng(5).integers(0, 1 << 30, size=(50, 40), dtype="i4")
    local = zarr.create_array(GpumapStore(tmp_path / "a.zarr"), shape=data.shape, chunks=(16, 16), dtype="i4")
    local[:] = data
    client = bucket[1]
    for path in (tmp_path / "a.zarr").rglob("*"):
        if path.is_file():
            key = "copied.zarr/" + path.relative_to(tmp_path / "a.zarr").as_posix()
            client.put_object(Bucket=bucket[0], Key=key, Body=path.read_bytes())
    store = open_store(f"s3://{bucket[0]}/copied.zarr/", read_only=True, aws_endpoint_url=s3_endpoint)
    assert isinstance(store, RemoteStore)
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[:], data)
    assert isinstance(open_store(tmp_path / "a.zarr"), GpumapStore)
    with pytest.raises(TypeError, match="s3://, gs:// and az:// stores"):
        open_store(tmp_path / "a.zarr", aws_region="us-east-1")


async def test_listings_and_deletes_page_through_thousands_of_keys(bucket, s3_endpoint):
    store = _store(bucket, s3_endpoint)
    client = bucket[1]
    names = [f"c/{i // 100}/{i % 100}" for i in range(2345)]
    for name in names:
        client.put_object(Bucket=bucket[0], Key=f"data.zarr/{name}", Body=b"x")
    client.put_object(Bucket=bucket[0], Key="data.zarrx/c/0", Body=b"neighbour")
    listed = [key async for key in store.list_prefix("c/")]
    assert sorted(listed) == sorted(names)
    assert sorted([key async for key in store.list_dir("c")]) == sorted({n.split("/")[1] for n in names})
    assert await store.getsize_prefix("c/1") == 100
    await store.delete_dir("c")
    assert await store.is_empty("")
    assert client.get_object(Bucket=bucket[0], Key="data.zarrx/c/0")["Body"].read() == b"neighbour"


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "a/./b", "a\\b", "nul\0", "/", f".{'0' * 32}.partial"])
async def test_keys_that_could_leave_the_prefix_are_refused(bucket, s3_endpoint, key):
    store = _store(bucket, s3_endpoint)
    with pytest.raises(ValueError, match="zarr key|empty key"):
        await store.get(key)
    with pytest.raises(ValueError, match="zarr key|empty key"):
        await store.set(key, cpu.Buffer.from_bytes(b"x"))
    with pytest.raises(ValueError, match="zarr key|empty key"):
        await store.exists(key)
    assert "Contents" not in bucket[1].list_objects_v2(Bucket=bucket[0])


async def test_the_empty_key_is_the_root_in_get_and_exists_as_in_a_directory(bucket, s3_endpoint, tmp_path):
    # GpumapStore's rules: "" names the root, which holds no value; it may not be set.
    store = _store(bucket, s3_endpoint)
    await store.set("a/b", cpu.Buffer.from_bytes(b"x"))
    local = GpumapStore(tmp_path / "s")
    for each in (store, local):
        assert await each.get("") is None
        assert await each.exists("") is False
        with pytest.raises(ValueError, match="empty key"):
            await each.set("", cpu.Buffer.from_bytes(b"x"))
        with pytest.raises(ValueError, match="empty key"):
            await each.getsize("")


def test_missing_buckets_and_bad_urls_are_typed_errors(s3_endpoint):
    with pytest.raises(ValueError, match="bucket name"):
        RemoteStore("s3://Not_A_Bucket/x/", aws_endpoint_url=s3_endpoint)
    with pytest.raises(ValueError, match="s3://"):
        RemoteStore("https://host/dir/", aws_endpoint_url=s3_endpoint)
    store = RemoteStore("s3://no-such-bucket-here/x/", aws_endpoint_url=s3_endpoint)
    with pytest.raises(FileNotFoundError, match="no-such-bucket-here"):
        store._prefix.list_dir("")


def test_a_pickled_store_reads_in_another_process(bucket, s3_endpoint):
    store = _store(bucket, s3_endpoint)
    data = np.arange(1000, dtype="u2")
    zarr.create_array(store, shape=data.shape, chunks=(300,), dtype="u2")[:] = data
    code = (
        "import pickle, sys, zarr\n"
        "store = pickle.loads(sys.stdin.buffer.read())\n"
        "z = zarr.open_array(store, mode='r')\n"
        "print(int(z[:].astype('i8').sum()))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(store), capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()
    assert int(run.stdout) == int(data.astype("i8").sum())
