"""Dask over gpumap's Zarr stores on a ``distributed.LocalCluster`` (worker processes): arrays
written by the workers and read back by them, from a local directory and from an S3 prefix
(moto's server on 127.0.0.1), checked against NumPy; host chunks everywhere, CuPy chunks where
a GPU is present. The example (python/examples/dask_zarr.py) runs too."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("zarr")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import zarr  # noqa: E402

from gpumapio.zarr import GpumapStore, RemoteStore  # noqa: E402

EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "dask_zarr.py"


@pytest.fixture
def client():
    """Two worker processes (made after the test's environment is set, so they inherit it)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as c:
            yield c


def _round_trip(client, writer_store, reader_store):
    data = np.random.default_rng(11).integers(-1000, 1000, size=(1000, 48), dtype="i4")
    da.to_zarr(da.from_array(data, chunks=(128, 48)), writer_store, overwrite=True)
    x = da.from_zarr(zarr.open_array(reader_store, mode="r"))
    assert x.numblocks == (8, 1)
    np.testing.assert_array_equal(x.sum(axis=0).compute(), data.sum(axis=0))
    np.testing.assert_array_equal(x[123:877:3].compute(), data[123:877:3])
    # The tasks ran on the workers, not in this process.
    assert len(client.scheduler_info()["workers"]) == 2
    return data


def test_a_local_store_written_and_read_by_worker_processes(client, tmp_path):
    path = tmp_path / "a.zarr"
    _round_trip(client, GpumapStore(path), GpumapStore(path, read_only=True))


def test_an_s3_store_written_and_read_by_worker_processes(moto_s3, client):
    endpoint, _, _ = moto_s3
    url = "s3://gpumap-bucket/dask/a.zarr/"
    data = _round_trip(
        client,
        RemoteStore(url, aws_endpoint_url=endpoint),
        RemoteStore(url, read_only=True, aws_endpoint_url=endpoint),
    )
    back = zarr.open_array(RemoteStore(url, aws_endpoint_url=endpoint), mode="r")[:]
    np.testing.assert_array_equal(back, data)


def test_cupy_chunks_on_the_workers(client, tmp_path):
    from conftest import need_gpu

    cp = need_gpu("cupy")
    path = tmp_path / "g.zarr"
    data = np.random.default_rng(2).standard_normal((2048, 64)).astype("f4")
    zarr.create_array(GpumapStore(path), shape=data.shape, chunks=(256, 64), dtype="f4")[:] = data

    def on_gpu():
        zarr.config.enable_gpu()

    client.run(on_gpu)
    x = da.from_zarr(zarr.open_array(GpumapStore(path, read_only=True), mode="r"))
    assert isinstance(x.blocks[3, 0].compute(), cp.ndarray), "a chunk is not a CuPy array"
    sums = x.sum(axis=0).compute()
    np.testing.assert_allclose(cp.asnumpy(sums), data.sum(axis=0), rtol=1e-4, atol=1e-3)


def test_the_example_runs(tmp_path):
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path / "ex.zarr")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "sums equal NumPy's" in run.stdout
