"""A Dask array over a Zarr store served by gpumap, computed on a ``distributed.LocalCluster``:
written by the workers, read back by them, checked against NumPy.

    python python/examples/dask_zarr.py [--gpu] [LOCATION]

``LOCATION`` is a local directory (default: a temporary one) or an ``s3://bucket/prefix/`` URL
(credentials and endpoint from the AWS environment: ``AWS_ENDPOINT_URL`` for a server of your
own). ``--gpu`` makes every worker read chunks into GPU memory (CuPy arrays), with zarr's GPU
buffers.

Each worker gets its own reader: the store travels to a worker by pickle, as its location and
settings, and the worker opens its own files (``GpumapStore``) or its own connection pool
(``RemoteStore``) on first use. Nothing is shared between worker processes, so one worker's
reads never wait on another's; threads of one worker share its store. A ``DeviceCache`` (or
``gpumapio.map``) is likewise per process: make it inside the task that uses it, or once per
worker (``client.run``), never on the client to ship it.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np


def use_gpu_buffers() -> None:
    """Run on each worker: zarr hands out chunks as CuPy arrays from now on."""
    import zarr

    zarr.config.enable_gpu()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("location", nargs="?", help="a directory or s3://bucket/prefix/")
    parser.add_argument("--gpu", action="store_true", help="chunks as CuPy arrays on the workers")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    import dask.array as da
    import zarr
    from distributed import Client, LocalCluster

    from gpumapio.zarr import open_store

    scratch = None
    location = args.location
    if location is None:
        scratch = tempfile.TemporaryDirectory()
        location = f"{scratch.name}/example.zarr"

    rng = np.random.default_rng(0)
    data = rng.standard_normal((4096, 256)).astype("f4")
    with LocalCluster(n_workers=args.workers, threads_per_worker=2, dashboard_address=None) as cluster, Client(
        cluster
    ) as client:
        # Written by the workers: each chunk of the Dask array goes to the store from the
        # worker that holds it.
        source = da.from_array(data, chunks=(512, 256))
        store = open_store(location)
        da.to_zarr(source, store, overwrite=True)

        if args.gpu:
            client.run(use_gpu_buffers)
        x = da.from_zarr(zarr.open_array(open_store(location, read_only=True), mode="r"))
        column_sums = x.sum(axis=0).compute()
        squares = float((x.astype("f8") ** 2).sum().compute())
        if args.gpu:
            import cupy

            assert isinstance(column_sums, cupy.ndarray), type(column_sums)
            column_sums = cupy.asnumpy(column_sums)
    np.testing.assert_allclose(column_sums, data.sum(axis=0), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(squares, float((data.astype("f8") ** 2).sum()), rtol=1e-9)
    where = "GPU (CuPy)" if args.gpu else "host (NumPy)"
    print(f"dask_zarr: {location}: {data.shape} float32 in {x.numblocks[0]} chunks, {where} chunks on "
          f"{args.workers} workers, sums equal NumPy's")
    if scratch is not None:
        scratch.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
