"""gpumap's errors as Python exceptions: OSError subclasses with errno, ValueError / TypeError
for bad arguments, gpumapio's own classes for CUDA / cuFile / missing capabilities."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys

import numpy as np
import pytest

import gpumapio


def test_missing_file_is_file_not_found_with_errno(tmp_path):
    missing = tmp_path / "nope.bin"
    with pytest.raises(FileNotFoundError) as e:
        gpumapio.CuFile(missing, "r")
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(missing)
    assert isinstance(e.value, OSError)


def test_a_path_with_a_null_byte_is_a_value_error_as_in_python(tmp_path):
    bad = str(tmp_path / "a\0b")
    for call in (lambda: gpumapio.CuFile(bad, "r"), lambda: gpumapio.map(bad, device="host")):
        with pytest.raises(ValueError, match="embedded null byte"):
            call()


def test_directory_is_is_a_directory_error(tmp_path):
    with pytest.raises(IsADirectoryError) as e:
        gpumapio.CuFile(tmp_path, "r")
    assert e.value.errno == errno.EISDIR


@pytest.mark.skipif(os.geteuid() == 0, reason="root may open any file")
def test_no_permission_is_permission_error(tmp_path):
    locked = tmp_path / "locked.bin"
    locked.write_bytes(b"x")
    locked.chmod(0)
    with pytest.raises(PermissionError) as e:
        gpumapio.CuFile(locked, "r")
    assert e.value.errno == errno.EACCES


def test_wrong_access_mode_is_unsupported_operation(tmp_path):
    path = tmp_path / "w.bin"
    with gpumapio.CuFile(path, "w") as f:
        with pytest.raises(io.UnsupportedOperation) as e:
            f.read(bytearray(4))
        assert isinstance(e.value, OSError) and isinstance(e.value, ValueError)
    with gpumapio.CuFile(path, "r") as f:
        with pytest.raises(io.UnsupportedOperation):
            f.write(b"abc")
    with pytest.raises(ValueError, match="offset"):  # refused at open, as KvikIO refuses it
        gpumapio.CuFile(path, "a")


@pytest.mark.parametrize("flags", ["", "x", "rw", "r++"])
def test_bad_flags_are_value_errors(tmp_path, flags):
    with pytest.raises(ValueError, match="flags"):
        gpumapio.CuFile(tmp_path / "f", flags)


def test_bad_buffers_are_type_errors(tmp_path):
    path = tmp_path / "d.bin"
    path.write_bytes(b"0123456789")
    with gpumapio.CuFile(path, "r") as f:
        with pytest.raises(TypeError, match="not a buffer"):
            f.read(12345)
        with pytest.raises(TypeError, match="not a buffer"):
            f.read("a string")
        with pytest.raises(TypeError, match="read-only"):
            f.read(b"immutable")
        ro = np.zeros(4, np.uint8)
        ro.flags.writeable = False
        with pytest.raises(TypeError, match="read-only"):
            f.read(ro)
        with pytest.raises(ValueError, match="contiguous"):
            f.read(np.zeros(20, np.uint8)[::2])
        with pytest.raises(OverflowError):
            f.read(bytearray(4), file_offset=-1)


class FakeDeviceArray:
    """Claims GPU memory at an address CUDA does not know."""

    def __init__(self, writable=True):
        self.__cuda_array_interface__ = {
            "shape": (16,),
            "typestr": "|u1",
            "data": (0xDEAD0000, not writable),
            "version": 3,
            "strides": None,
        }


def test_device_buffer_without_cuda_or_at_a_bad_address(tmp_path):
    path = tmp_path / "d.bin"
    path.write_bytes(b"x" * 64)
    with gpumapio.CuFile(path, "r") as f:
        if gpumapio.gpu_count() == 0:
            with pytest.raises(gpumapio.UnavailableError, match="libcuda"):
                f.read(FakeDeviceArray())
        else:
            with pytest.raises(ValueError):
                f.read(FakeDeviceArray())
        with pytest.raises(TypeError, match="read-only"):
            f.read(FakeDeviceArray(writable=False))
    assert issubclass(gpumapio.UnavailableError, RuntimeError)
    assert issubclass(gpumapio.CudaError, OSError)
    assert issubclass(gpumapio.CuFileError, OSError)
    assert issubclass(gpumapio.OutOfBudgetError, MemoryError)


def test_compat_mode_off_without_cufile_fails_with_the_reason(tmp_path):
    if gpumapio.capabilities()["cufile_usable"]:
        pytest.skip("cuFile is usable here: compat mode off opens")
    path = tmp_path / "d.bin"
    path.write_bytes(b"x")
    with gpumapio.defaults.set("compat_mode", gpumapio.CompatMode.OFF):
        with pytest.raises(gpumapio.UnavailableError, match="cuFile"):
            gpumapio.CuFile(path, "r")
    gpumapio.CuFile(path, "r").close()  # the old mode is back


def test_probing_after_torch_loaded_libcufile_returns():
    """torch's CUDA wheels load their own libcufile into the process; on a machine without a
    CUDA driver, that library's cuFileDriverOpen never returns, so probing (and any cuFile
    call) must not reach it. Run in a child, with a deadline, so a hang fails the test."""
    pytest.importorskip("torch")
    code = "import torch, gpumapio; c = gpumapio.capabilities(); print(c['cufile_usable'], gpumapio.gpu_count())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    usable, gpus = done.stdout.split()
    if gpus == "0":
        assert usable == "False"


def test_eof_error_for_short_files(tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(b"abc")
    with pytest.raises(EOFError):
        gpumapio.read_file_to_device(path, offset=0, size=10, output="numpy")


def test_errors_do_not_poison_the_future(tmp_path):
    path = tmp_path / "w.bin"
    with gpumapio.CuFile(path, "w") as f:
        with pytest.raises(io.UnsupportedOperation):
            f.pread(bytearray(8)).get()
        fut = f.pread(bytearray(8))
        for _ in range(3):  # the same error each time
            with pytest.raises(io.UnsupportedOperation):
                fut.get()
        assert fut.done()
