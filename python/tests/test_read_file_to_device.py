"""read_file_to_device without a GPU (NumPy) and the no-GPU answers of the low-level API."""

from __future__ import annotations

import numpy as np
import pytest

import gpumapio


def test_numpy_output(data_file):
    path, data = data_file
    out = gpumapio.read_file_to_device(path, output="numpy")
    assert isinstance(out, np.ndarray) and out.dtype == np.uint8
    assert out.tobytes() == data
    part = gpumapio.read_file_to_device(path, offset=4097, size=123_457, output="numpy")
    assert part.tobytes() == data[4097 : 4097 + 123_457]
    assert gpumapio.read_file_to_device(path, offset=len(data), output="numpy").size == 0


def test_auto_output_matches_the_machine(data_file):
    path, data = data_file
    out = gpumapio.read_file_to_device(path, size=1000)
    if gpumapio.gpu_count() == 0:
        assert isinstance(out, np.ndarray)
        assert out.tobytes() == data[:1000]
    else:
        assert type(out).__module__.split(".")[0] in ("cupy", "numpy")


def test_bad_arguments(data_file, tmp_path):
    path, _ = data_file
    with pytest.raises(ValueError):
        gpumapio.read_file_to_device(path, offset=-1, output="numpy")
    with pytest.raises(ValueError):
        gpumapio.read_file_to_device(path, output="jax")
    with pytest.raises(FileNotFoundError):
        gpumapio.read_file_to_device(tmp_path / "missing", output="numpy")


def test_capabilities_say_why():
    caps = gpumapio.capabilities()
    assert set(caps) >= {"cuda_driver_version", "devices", "cuda_reason", "cufile_usable", "cufile_reason"}
    if gpumapio.gpu_count() == 0:
        assert caps["devices"] == [] and caps["cuda_reason"]
    if not caps["cufile_usable"]:
        assert caps["cufile_reason"]


def test_low_level_cufile_without_cufile_says_why(data_file):
    from gpumapio import cufile_driver

    if gpumapio.capabilities()["cufile_usable"]:
        pytest.skip("cuFile is usable here (test_gpu.py covers it)")
    path, _ = data_file
    if gpumapio.gpu_count() == 0:
        with pytest.raises(gpumapio.UnavailableError):
            cufile_driver.driver_open()
        with pytest.raises(gpumapio.UnavailableError):
            cufile_driver.Stream()
    with pytest.raises((gpumapio.UnavailableError, gpumapio.CuFileError)):
        cufile_driver.Handle(path, "r")
    cufile_driver.driver_close()  # accepted, does nothing
    # KvikIO's buffer registration is a no-op where compat mode is preferred
    with gpumapio.defaults.set("compat_mode", "on"):
        gpumapio.buffer.memory_register(np.zeros(4, np.uint8))
    assert gpumapio.buffer.bounce_buffer_free() == 0


def test_kvikio_buffer_deregister_of_memory_never_registered_does_nothing(monkeypatch):
    # memory_register passes over host memory where compat mode is preferred; its
    # memory_deregister raised TypeError. KvikIO's does nothing there too.
    from gpumapio import buffer

    host = np.zeros(1 << 16, np.uint8)
    with gpumapio.defaults.set("compat_mode", "on"):
        buffer.memory_register(host)
        buffer.memory_deregister(host)
    buffer.memory_deregister(host)
    buffer.memory_deregister(b"bytes")

    # What was registered is still deregistered, once.
    class Registration:
        calls = 0

        def deregister(self):
            Registration.calls += 1

    class Device:
        __cuda_array_interface__ = {"data": (0xDEAD000, False), "shape": (16,), "typestr": "|u1", "version": 3}

    monkeypatch.setattr(buffer, "_registered", {0xDEAD000: Registration()})
    buffer.memory_deregister(Device())
    buffer.memory_deregister(Device())
    assert Registration.calls == 1 and buffer._registered == {}


def test_kvikio_numpy_fromfile_tofile(tmp_path):
    from gpumapio import numpy as gnp

    a = np.arange(1001, dtype="<i8")
    path = tmp_path / "a.bin"
    gnp.tofile(a, path)
    assert path.read_bytes() == a.tobytes()
    np.testing.assert_array_equal(gnp.fromfile(path, dtype="<i8"), a)
    np.testing.assert_array_equal(gnp.fromfile(path, dtype="<i8", count=10, offset=80), a[10:20])
    np.testing.assert_array_equal(gnp.fromfile(path, dtype="<i8", count=5000), a)  # truncated
    np.testing.assert_array_equal(np.fromfile(path, dtype="<i8", like=gnp.LikeWrapper(np.empty(()))), a)
    with open(path, "rb") as f:
        np.testing.assert_array_equal(gnp.fromfile(f, dtype="<i8"), a)
    gnp.tofile(np.arange(12, dtype="<u2").reshape(3, 4).T, path)  # written in C order
    assert path.read_bytes() == np.arange(12, dtype="<u2").reshape(3, 4).T.copy().tobytes()
    with pytest.raises(NotImplementedError):
        gnp.fromfile(path, sep=",")


def test_torch_cpu_tensors(data_file, tmp_path):
    torch = pytest.importorskip("torch")
    path, data = data_file
    if not torch.cuda.is_available():
        t = gpumapio.read_file_to_device(path, output="torch")
        assert t.device.type == "cpu" and t.numpy().tobytes() == data
    x = torch.zeros(100, 3, dtype=torch.float64)[:, 1:]  # not contiguous: refused
    with gpumapio.CuFile(path) as f:
        with pytest.raises(ValueError, match="contiguous"):
            f.read(x)
        y = torch.zeros(300, dtype=torch.float64)
        assert f.read(y[10:], file_offset=3) == 290 * 8  # a view with a storage offset (DLPack)
        assert y[10:].numpy().tobytes() == data[3 : 3 + 290 * 8] and not y[:10].any()
    with gpumapio.CuFile(tmp_path / "t.bin", "w") as f:
        assert f.write(y) == y.numel() * 8
    assert (tmp_path / "t.bin").read_bytes() == y.numpy().tobytes()
