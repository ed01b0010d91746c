"""KvikIO 26.x's documented Python behaviour (issue 23), item by item: settings, their errors,
the http_* settings, I/O errors that are OSErrors and RuntimeErrors, write-only files, the
functions KvikIO has, ``Mmap``, and the zarr store opened by concurrent first calls. Host buffers
everywhere; the same checks with CuPy buffers where a GPU is present (skipped visibly without)."""

from __future__ import annotations

import asyncio
import errno
import io
import os
import re

import numpy as np
import pytest

import gpumapio as kvikio
from conftest import need_gpu
from gpumapio import cufile_driver, defaults

# Buffer makers: NumPy always, CuPy on a GPU.
BUFFERS = ["numpy", "cupy"]


def _xp(kind):
    return np if kind == "numpy" else need_gpu("cupy")


def _host(array):
    return array.get() if hasattr(array, "get") else array


# Item 2: any positive bounce buffer size, and I/O correct through it.


@pytest.mark.parametrize("kind", BUFFERS)
@pytest.mark.parametrize("size", [1, 10, 100, 1000, 4097, 65537])
def test_any_positive_bounce_buffer_size_reads_and_writes_correctly(tmp_path, data_file, kind, size):
    xp = _xp(kind)
    path, data = data_file
    with defaults.set({"bounce_buffer_size": size, "auto_direct_io_read": True, "auto_direct_io_write": True}):
        assert defaults.get("bounce_buffer_size") == size
        with kvikio.CuFile(path, "r") as f:
            buf = xp.zeros(len(data) - 4099, dtype=xp.uint8)
            assert f.read(buf, file_offset=4099) == len(data) - 4099
            assert _host(buf).tobytes() == data[4099:]
        out = tmp_path / f"out-{size}.bin"
        with kvikio.CuFile(out, "w") as f:
            assert f.pwrite(xp.asarray(np.frombuffer(data, np.uint8)), file_offset=5).get() == len(data)
        assert out.read_bytes()[5:] == data


# Item 3: KvikIO's exception types and key phrases.


@pytest.mark.parametrize("name", ["num_threads", "task_size", "bounce_buffer_size", "http_max_attempts"])
def test_zero_is_a_value_error_naming_a_positive_integer(name):
    with pytest.raises(ValueError, match="positive integer"):
        defaults.set(name, 0)


@pytest.mark.parametrize(
    "name", ["num_threads", "task_size", "bounce_buffer_size", "gds_threshold", "http_max_attempts"]
)
def test_negative_is_an_overflow_error_naming_a_negative_value(name):
    before = defaults.get(name)
    with pytest.raises(OverflowError, match="negative value"):
        defaults.set(name, -1)
    assert defaults.get(name) == before


# A list of floats is truncated, as KvikIO 26.10 does (test_defaults covers it).
@pytest.mark.parametrize("bad", [(429,), "429", 429, ["429"], [None], {429: 1}])
def test_http_status_codes_not_a_list_of_ints_is_a_type_error(bad):
    with pytest.raises(TypeError):
        defaults.set("http_status_codes", bad)


# Item 4: the remote settings, with KvikIO's defaults.


def test_http_settings_have_kvikios_defaults_and_round_trip():
    assert defaults.get("http_max_attempts") == 3
    assert defaults.get("http_status_codes") == [429, 500, 502, 503, 504]
    assert defaults.get("http_timeout") == 60
    with defaults.set({"http_max_attempts": 7, "http_status_codes": [503], "http_timeout": 5}):
        assert defaults.get("http_max_attempts") == 7
        assert defaults.get("http_status_codes") == [503]
        assert defaults.get("http_timeout") == 5
    assert defaults.get("http_status_codes") == [429, 500, 502, 503, 504]
    for bad in (0, -1):
        with pytest.raises(ValueError, match="positive integer"):
            defaults.set("http_timeout", bad)


def test_http_settings_come_from_kvikio_variables():
    from test_defaults import _in_child

    code = (
        "import json, gpumapio.defaults as d; "
        "print(json.dumps([d.get(n) for n in ('http_max_attempts', 'http_status_codes', 'http_timeout')]))"
    )
    out = _in_child(
        {"KVIKIO_HTTP_MAX_ATTEMPTS": "9", "KVIKIO_HTTP_STATUS_CODES": "500, 503", "KVIKIO_HTTP_TIMEOUT": "7"},
        code,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[9, [500, 503], 7]"
    out = _in_child({"KVIKIO_HTTP_TIMEOUT": "0"}, code)
    assert out.returncode != 0 and "KVIKIO_HTTP_TIMEOUT" in out.stderr


# Item 5: I/O errors are OSErrors with the errno and RuntimeErrors with KvikIO's phrases.


def test_missing_file_is_file_not_found_and_runtime_error(tmp_path):
    missing = tmp_path / "missing.bin"
    for call in (lambda: kvikio.CuFile(missing, "r"), lambda: kvikio.get_page_cache_info(missing),
                 lambda: kvikio.Mmap(missing)):
        with pytest.raises(RuntimeError, match="Unable to open file.*No such file or directory") as e:
            call()
        assert isinstance(e.value, FileNotFoundError) and e.value.errno == errno.ENOENT


@pytest.mark.parametrize("kind", BUFFERS)
def test_wrong_access_mode_is_operation_not_permitted(tmp_path, kind):
    xp = _xp(kind)
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 64)
    buf = xp.zeros(8, dtype=xp.uint8)
    with kvikio.CuFile(path, "r") as f:
        with pytest.raises(RuntimeError, match="Operation not permitted") as e:
            f.write(buf)
        assert isinstance(e.value, io.UnsupportedOperation) and e.value.errno == errno.EBADF
    with kvikio.CuFile(tmp_path / "w.bin", "w") as f:
        with pytest.raises(RuntimeError, match="Operation not permitted"):
            f.read(buf)
        with pytest.raises(OSError, match="Operation not permitted"):
            f.pread(buf).get()
    assert path.read_bytes() == b"x" * 64


def test_append_flags_are_refused_at_open_and_create_nothing(tmp_path):
    """As KvikIO: a CuFile's writes name their offset, which a file opened for appending
    refuses, so "a" is refused at open rather than on every write after it."""
    for flags in ("a", "a+", "ab"):
        path = tmp_path / f"{flags}.bin"
        with pytest.raises(ValueError, match=re.escape(f"Open flag '{flags}' isn't supported") + r".*r\+"):
            kvikio.CuFile(path, flags)
        assert not path.exists()


# Item 6: a write-only file.


@pytest.mark.parametrize("kind", BUFFERS)
def test_write_only_file_flags_and_stream_read_fail_when_checked(tmp_path, kind):
    xp = _xp(kind)
    with kvikio.CuFile(tmp_path / "w.bin", "w") as f:
        flags = f.open_flags()
        assert flags & os.O_ACCMODE == os.O_WRONLY
        assert flags & (os.O_CREAT | os.O_TRUNC) == 0  # F_GETFL keeps the access mode, not these
        future = f.raw_read_async(xp.zeros(16, dtype=xp.uint8), 0)  # no error yet
        with pytest.raises(RuntimeError, match="Operation not permitted"):
            future.check_bytes_done()
    with kvikio.CuFile(tmp_path / "w.bin", "w+") as f:
        assert f.open_flags() & os.O_ACCMODE == os.O_RDWR
    with kvikio.CuFile(tmp_path / "w.bin", "r") as f:
        assert f.open_flags() & os.O_ACCMODE == os.O_RDONLY
        future = f.raw_write_async(xp.zeros(16, dtype=xp.uint8), 0)
        with pytest.raises(RuntimeError, match="Operation not permitted"):
            future.check_bytes_done()


# Item 7: the functions and properties KvikIO has.


def test_top_level_functions_exist_and_behave():
    for name in ("Mmap", "bounce_buffer_free", "stream_register", "stream_deregister", "memory_register",
                 "memory_deregister", "get_page_cache_info", "drop_file_page_cache",
                 "drop_system_page_cache", "clear_page_cache"):
        assert callable(getattr(kvikio, name)), name
    assert kvikio.bounce_buffer_free() == 0
    assert kvikio.stream_register(0, 0) is None
    assert kvikio.stream_deregister(0) is None
    with pytest.raises(TypeError):
        kvikio.stream_register("stream", 0)


def test_libcufile_version_is_a_pair_of_ints():
    version = cufile_driver.libcufile_version()
    assert isinstance(version, tuple) and len(version) == 2 and all(isinstance(v, int) for v in version)
    if not kvikio.capabilities()["cufile_library"]:
        assert version == (0, 0)


def test_cufile_driver_get_set_and_properties():
    with pytest.raises(KeyError):
        cufile_driver.get("no_such_property")
    with pytest.raises(KeyError, match="read-only"):
        cufile_driver.set("major_version", 3)
    with pytest.raises(ValueError):
        cufile_driver.set(1, 2, 3)
    assert isinstance(cufile_driver.properties.is_gds_available, bool)
    assert set(dir(cufile_driver.properties)) >= {"poll_mode", "poll_thresh_size", "max_device_cache_size",
                                                  "max_pinned_memory_size", "allow_compat_mode"}
    if not kvikio.capabilities()["cufile_usable"]:
        # As KvikIO: reading or setting the driver's properties needs the driver.
        assert cufile_driver.get("is_gds_available") is False
        with pytest.raises(RuntimeError):
            cufile_driver.get("poll_mode")
        with pytest.raises(RuntimeError):
            cufile_driver.set("poll_mode", True)
        return
    old = cufile_driver.get("poll_thresh_size")
    with cufile_driver.set({"poll_mode": True, "poll_thresh_size": old + 4}):
        assert cufile_driver.get("poll_mode") is True
        assert cufile_driver.properties.poll_thresh_size == old + 4
    assert cufile_driver.get("poll_thresh_size") == old


def test_cuda_and_cufile_errors_are_runtime_errors_as_kvikio_raises():
    for cls, name in ((kvikio.CudaError, "CudaError"), (kvikio.CuFileError, "CuFileError")):
        assert cls.__name__ == name and cls.__module__ == "gpumapio"
        assert issubclass(cls, OSError) and issubclass(cls, RuntimeError)
        assert cls.__mro__.index(OSError) < cls.__mro__.index(RuntimeError)
        assert cls.__doc__ and "RuntimeError" in cls.__doc__
        error = cls("cuFileRead failed")
        error.op, error.code, error.name = "cuFileRead", 5011, "CU_FILE_IO_NOT_SUPPORTED"
        with pytest.raises(RuntimeError, match="cuFileRead failed"):
            raise error
    assert not issubclass(kvikio.CudaError, kvikio.CuFileError)
    assert not issubclass(kvikio.CuFileError, kvikio.CudaError)
    from gpumapio import _native

    assert _native.CudaError is kvikio.CudaError and _native.CuFileError is kvikio.CuFileError


def test_cufile_driver_setters_without_cufile_say_why():
    from gpumapio import _native

    if kvikio.capabilities()["cufile_usable"]:
        pytest.skip("cuFile is usable here: the setters reach the driver (test_gpu.py)")
    for call in (lambda: _native.driver_set_poll_mode(True, 4), lambda: _native.driver_set_max_cache_size(1024),
                 lambda: _native.driver_set_max_pinned_mem_size(1024),
                 lambda: _native.driver_set_max_direct_io_size(1024)):
        with pytest.raises(kvikio.UnavailableError):
            call()
    with pytest.raises(TypeError):
        _native.driver_set_poll_mode(True, "4")
    with pytest.raises(OverflowError):
        _native.driver_set_max_cache_size(-1)


def test_cufile_driver_set_applies_through_the_driver_api(monkeypatch):
    """With the driver stood in for: each settable property goes to its cuFile call (the poll
    mode and its threshold as a pair), is recorded and read back, and comes back at the end of
    a ``with`` block; a refused value raises and is not recorded; a library without the call
    has the value recorded only."""
    from gpumapio import _native

    record = cufile_driver.DriverProperties(
        library="libcufile.so.0 (stand-in)", nvfs_version=(2, 17), poll_mode=False, poll_thresh_size_kb=4,
        max_device_cache_size_kb=131072, per_buffer_cache_size_kb=1024, max_pinned_memory_size_kb=33554432,
        allow_compat_mode=True)
    calls = []
    refuse = {}

    def setter(name):
        def call(*args):
            if name in refuse:
                raise refuse[name]
            calls.append((name, *args))
        return call

    monkeypatch.setattr(cufile_driver, "_record", lambda: record)
    for name in ("driver_set_poll_mode", "driver_set_max_cache_size", "driver_set_max_pinned_mem_size"):
        monkeypatch.setattr(_native, name, setter(name))
    props = cufile_driver.properties
    saved = dict(props._set)
    props._set.clear()
    try:
        with cufile_driver.set({"poll_mode": True, "max_device_cache_size": 65536}):
            assert cufile_driver.get("poll_mode") is True
            assert props.max_device_cache_size == 65536
            props.poll_thresh_size = 16
            props.max_pinned_memory_size = 1 << 20
            assert props.poll_thresh_size == 16
        assert calls[:4] == [("driver_set_poll_mode", True, 4), ("driver_set_max_cache_size", 65536),
                             ("driver_set_poll_mode", True, 16), ("driver_set_max_pinned_mem_size", 1 << 20)]
        # The block's end puts back what was there before it: the driver's values.
        assert ("driver_set_poll_mode", False, 16) in calls[4:]
        assert ("driver_set_max_cache_size", 131072) in calls[4:]
        assert props.poll_mode is False and props.max_device_cache_size == 131072
        # Refused by cuFile: raised (a RuntimeError, as KvikIO raises), not recorded.
        refuse["driver_set_max_cache_size"] = kvikio.CuFileError("cuFileDriverSetMaxCacheSize: refused")
        with pytest.raises(RuntimeError, match="refused"):
            props.max_device_cache_size = 7
        assert props.max_device_cache_size == 131072
        # A library without the call: recorded only.
        refuse["driver_set_max_cache_size"] = kvikio.UnavailableError("libcufile lacks cuFileDriverSetMaxCacheSize")
        props.max_device_cache_size = 7
        assert props.max_device_cache_size == 7
        with pytest.raises(TypeError):
            props.poll_thresh_size = 1.5
        with pytest.raises(OverflowError):
            props.max_pinned_memory_size = -1
    finally:
        props._set.clear()
        props._set.update(saved)


def test_numpy_fromfile_refuses_sep_with_kvikios_phrase(data_file):
    from gpumapio import numpy as knp

    path, data = data_file
    with pytest.raises(NotImplementedError, match="Non-default value of the `sep`"):
        knp.fromfile(path, sep=",")
    assert knp.fromfile(path, dtype="u1", count=5, offset=3).tobytes() == data[3:8]


# Item 1: Mmap.


@pytest.mark.parametrize("kind", BUFFERS)
def test_mmap_reads_like_kvikio(data_file, kind):
    xp = _xp(kind)
    path, data = data_file
    m = kvikio.Mmap(path)
    assert (m.file_size(), m.closed(), m.initial_map_offset(), m.initial_map_size()) == (len(data), False, 0, len(data))
    whole = xp.zeros(len(data), dtype=xp.uint8)
    assert m.read(whole) == len(data)  # size defaults to the rest of the file
    assert _host(whole).tobytes() == data
    part = xp.zeros(1000, dtype=xp.uint8)
    assert m.read(part, 100, 12345) == 100
    assert _host(part)[:100].tobytes() == data[12345:12445]
    future = m.pread(part, 1000, 777, task_size=64)
    assert isinstance(future, kvikio.IOFuture) and future.get() == 1000
    assert _host(part).tobytes() == data[777:1777]
    assert m.read(part, 0, len(data)) == 0
    with pytest.raises(ValueError, match="Size is greater than the size of the buffer"):
        m.read(part)
    with pytest.raises(IndexError, match="Offset is past the end of file"):
        m.read(part, 1, len(data) + 1)
    with pytest.raises(IndexError, match="Read is out of bound"):
        m.pread(part, 100, len(data) - 50)
    m.close()
    m.close()
    assert m.closed() and m.file_size() == 0
    with pytest.raises(RuntimeError, match="closed"):
        m.read(part)


def test_mmap_mapped_range_and_bad_arguments(data_file):
    path, data = data_file
    m = kvikio.Mmap(path, "r", 8192, 4096)
    buf = np.zeros(100, np.uint8)
    assert m.read(buf, 100, 4096 + 8000) == 100 and buf.tobytes() == data[12096:12196]
    with pytest.raises(IndexError, match="Read is out of bound"):
        m.read(buf, 100, 0)
    with pytest.raises(IndexError, match="Read is out of bound"):
        m.read(buf, 100, 4096 + 8100)
    with pytest.raises(ValueError, match="should not be zero byte"):
        kvikio.Mmap(path, "r", 0)
    with pytest.raises(IndexError, match="Offset must be less than the file size"):
        kvikio.Mmap(path, initial_map_offset=len(data))
    with pytest.raises(IndexError, match="past the end of file"):
        kvikio.Mmap(path, "r", len(data), 1)
    with pytest.raises(RuntimeError, match="not supported"):
        kvikio.Mmap(path, "w")
    assert path.read_bytes() == data  # nothing truncated
    with pytest.raises(OverflowError):
        m.read(buf, 1, -1)
    with kvikio.Mmap(path, "r", None, 0, 0o600, 0) as m2:
        assert m2.read(bytearray(4), 4, 1) == 4
    assert m2.closed()


# Item 8: the zarr store, opened by concurrent first calls.


def test_zarr_store_opened_by_concurrent_first_calls(tmp_path):
    pytest.importorskip("zarr")
    from zarr.core.buffer import cpu, default_buffer_prototype

    from gpumapio.zarr import GDSStore

    async def run():
        store = GDSStore(str(tmp_path))
        assert not store._is_open
        await asyncio.gather(*(store.set(f"k{i}", cpu.Buffer.from_bytes(bytes([i]) * 10)) for i in range(16)))
        reader = GDSStore(str(tmp_path))
        got = await asyncio.gather(*(reader.get(f"k{i}", default_buffer_prototype()) for i in range(16)))
        return [g.to_bytes() for g in got]

    assert asyncio.run(run()) == [bytes([i]) * 10 for i in range(16)]


# The program written for KvikIO 26.10's API runs unchanged with gpumapio.


def test_kvikio_program_runs_with_gpumapio(tmp_path):
    pytest.importorskip("zarr")
    import pathlib
    import subprocess
    import sys

    program = pathlib.Path(__file__).parents[1] / "examples" / "kvikio_program.py"
    run = subprocess.run([sys.executable, str(program), str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all checks passed with gpumapio" in run.stdout


def test_paths_as_bytes_and_pathlike_bytes_open(tmp_path):
    """KvikIO runs os.fsencode on its paths; CuFile and Mmap refused bytes, naming str."""
    path = tmp_path / "bytes.bin"
    path.write_bytes(b"0123456789")

    class BytesPath:
        def __fspath__(self):
            return os.fsencode(path)

    for given in (os.fsencode(path), BytesPath()):
        with kvikio.CuFile(given, "r") as f:
            assert f.nbytes() == 10
        with kvikio.Mmap(given) as m:
            out = np.zeros(4, dtype=np.uint8)
            assert m.read(out, 4, 3) == 4 and out.tobytes() == b"3456"
    with pytest.raises(TypeError, match="not int"):
        kvikio.CuFile(3, "r")


def test_negative_and_huge_arguments_are_overflow_errors_naming_them(tmp_path):
    """PyO3's conversions raised bare OverflowErrors ("can't convert negative int to unsigned")
    naming neither the argument nor the value. Still OverflowErrors, as KvikIO raises."""
    path = tmp_path / "args.bin"
    path.write_bytes(bytes(4096))
    buf = np.zeros(16, dtype=np.uint8)
    with kvikio.CuFile(path, "r+") as f:
        for call, message in [
            (lambda: f.read(buf, size=-1), "size -1 is negative"),
            (lambda: f.write(buf, file_offset=2**64), "file_offset 18446744073709551616 is past the largest value"),
            (lambda: f.pread(buf, file_offset=-3), "file_offset -3 is negative"),
            (lambda: f.raw_read(buf, dev_offset=-1), "dev_offset -1 is negative"),
            (lambda: f.raw_read_async(buf, -1), "raw_stream -1 is negative"),
            (lambda: f.pread(buf, task_size=-5), "task_size -5 is negative"),
        ]:
            with pytest.raises(OverflowError, match=message):
                call()
    for kwargs, message in [
        ({"mode": -1}, "mode -1 is negative"),
        ({"mode": 2**40}, "is not a file mode"),
        ({"map_flags": 2**40}, "map_flags 1099511627776 is not a C int"),
        ({"initial_map_offset": -1}, "initial_map_offset -1 is negative"),
        ({"initial_map_size": -2}, "initial_map_size -2 is negative"),
    ]:
        with pytest.raises(OverflowError, match=message):
            kvikio.Mmap(path, **kwargs)
    with kvikio.Mmap(path) as m:
        with pytest.raises(OverflowError, match="offset -1 is negative"):
            m.read(buf, 4, -1)


def test_reads_of_other_task_sizes_take_no_descriptors(tmp_path):
    """Each task size a CuFile or Mmap was read with duplicated its descriptors (and opened
    its threads' own again): with the descriptor table full, such reads failed with EMFILE,
    and the duplicates stayed, taking descriptors from the rest of the program."""
    path = tmp_path / "fds.bin"
    data = np.random.default_rng(3).integers(0, 256, size=4 << 20, dtype=np.uint8)
    data.tofile(path)

    def descriptors():
        return len(os.listdir("/proc/self/fd"))

    out = np.zeros_like(data)
    before = descriptors()
    with kvikio.CuFile(path, "r") as f, kvikio.Mmap(path) as m:
        for task_size in (4096, 65536, 12289, 1 << 20, 3 << 20, 8191, 100_000, 5000, 2 << 20):
            out[:] = 0
            assert f.pread(out, task_size=task_size).get() == data.nbytes
            assert np.array_equal(out, data), task_size
            out[:] = 0
            assert m.pread(out, task_size=task_size).get() == data.nbytes
            assert np.array_equal(out, data), task_size
        # Each object's own descriptor, and at most one per I/O thread that read it in small
        # pieces (decision 0022): nothing per task size.
        assert descriptors() - before <= 2 * (1 + defaults.num_threads())


def test_environment_bounce_buffer_size_past_the_ceiling_is_refused_at_once(tmp_path):
    """defaults.set refused a size that whole pages cannot hold; the environment took it, and
    every CuFile's open then failed rounding it up."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", "import gpumapio; gpumapio.defaults.bounce_buffer_size()"],
        env={**{k: v for k, v in os.environ.items() if not k.endswith("BOUNCE_BUFFER_SIZE")},
             "KVIKIO_BOUNCE_BUFFER_SIZE": str(2**64 - 1)},
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "KVIKIO_BOUNCE_BUFFER_SIZE" in run.stderr, run.stderr


def test_messages_name_what_they_refuse(tmp_path):
    with pytest.raises(ValueError, match=r'invalid open flags "rw": expected one of r, w, r\+, w\+$'):
        kvikio.CuFile(tmp_path / "x", "rw")
    with pytest.raises(ValueError, match="task_size nan: cannot convert float NaN"):
        defaults.set("task_size", float("nan"))
