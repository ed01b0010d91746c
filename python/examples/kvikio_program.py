"""A program written for KvikIO 26.10's Python API, run with ``import gpumapio as kvikio``
(pass ``--kvikio`` to run it on KvikIO itself). CuFile, futures, defaults, Mmap, cufile_driver,
numpy, zarr and the page-cache helpers; CuPy buffers where CuPy has a GPU, NumPy otherwise.

    python python/examples/kvikio_program.py [--kvikio] [DIR]
"""

import os
import sys
import tempfile

import numpy as np

if "--kvikio" in sys.argv:
    import kvikio
    import kvikio.cufile_driver
    import kvikio.defaults
    import kvikio.numpy
    import kvikio.zarr
else:
    import gpumapio as kvikio
    import gpumapio.cufile_driver
    import gpumapio.defaults
    import gpumapio.numpy
    import gpumapio.zarr

try:
    import cupy as xp

    xp.cuda.runtime.getDeviceCount()
except Exception:
    xp = np


def host(a):
    return a.get() if hasattr(a, "get") else a


def main(workdir):
    path = os.path.join(workdir, "kvikio-program.bin")
    data = np.arange(1 << 20, dtype=np.uint32)

    # defaults: set as context managers, KvikIO's error types.
    with kvikio.defaults.set({"num_threads": 4, "task_size": 1 << 16, "bounce_buffer_size": 1000}):
        assert kvikio.defaults.get("bounce_buffer_size") == 1000
        # CuFile and futures.
        with kvikio.CuFile(path, "w") as f:
            assert f.pwrite(xp.asarray(data)).get() == data.nbytes
        with kvikio.CuFile(path, "r") as f:
            out = xp.empty_like(xp.asarray(data))
            quarter = len(data) // 4
            futures = [f.pread(out[i * quarter:(i + 1) * quarter], file_offset=i * quarter * 4) for i in range(4)]
            assert sum(fut.get() for fut in futures) == data.nbytes
            assert f.read(out) == data.nbytes
            assert (host(out) == data).all()
    for name, value, exc in [("num_threads", 0, ValueError), ("task_size", -1, OverflowError)]:
        try:
            kvikio.defaults.set(name, value)
            raise AssertionError(f"{name}={value} accepted")
        except exc:
            pass
    assert kvikio.defaults.get("http_max_attempts") == 3
    assert kvikio.defaults.get("http_status_codes") == [429, 500, 502, 503, 504]

    # Errors: RuntimeError, as KvikIO raises them.
    try:
        kvikio.CuFile(os.path.join(workdir, "missing"), "r")
        raise AssertionError("opened a missing file")
    except RuntimeError as e:
        assert "No such file or directory" in str(e)

    # Mmap.
    m = kvikio.Mmap(path)
    assert m.file_size() == data.nbytes
    dst = xp.empty(1024, dtype=xp.uint32)
    assert m.pread(dst, 4096, 4 * 100).get() == 4096
    assert (host(dst) == data[100:1124]).all()
    m.close()
    assert m.closed()

    # numpy.
    back = kvikio.numpy.fromfile(path, dtype=np.uint32, like=xp.empty(()))
    assert (host(back) == data).all()

    # cufile_driver.
    major, minor = kvikio.cufile_driver.libcufile_version()
    print(f"libcufile {major}.{minor}, GDS available: {kvikio.cufile_driver.properties.is_gds_available}")
    if kvikio.cufile_driver.properties.is_gds_available:
        with kvikio.cufile_driver.set("poll_mode", True):
            assert kvikio.cufile_driver.get("poll_mode")

    # Page-cache helpers.
    cached, total = kvikio.get_page_cache_info(path)
    assert 0 <= cached <= total
    kvikio.drop_file_page_cache(path)
    kvikio.bounce_buffer_free()

    # zarr.
    import zarr

    if xp is not np:
        zarr.config.enable_gpu()
    store = kvikio.zarr.GDSStore(os.path.join(workdir, "kvikio-program.zarr"))
    z = zarr.create_array(store, shape=(1 << 16,), chunks=(1 << 12,), dtype="u4", overwrite=True)
    z[:] = xp.asarray(data[: 1 << 16])
    assert (host(z[:]) == data[: 1 << 16]).all()
    print("kvikio_program: all checks passed with", kvikio.__name__, "on", xp.__name__, "buffers")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--kvikio"]
    if args:
        main(args[0])
    else:
        with tempfile.TemporaryDirectory(prefix="kvikio-program-") as d:
            main(d)
