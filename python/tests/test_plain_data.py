"""Only plain data is moved (issue 20): a buffer whose items are Python objects (NumPy
``dtype=object``, ``O`` in a ``__cuda_array_interface__`` typestr, a DLPack opaque handle) is
refused with a ``TypeError`` naming its format, by every call that takes a buffer.

Reading file bytes into an array of ``PyObject*`` overwrites its references (the process
crashes when the array is freed), and writing one writes heap addresses into the file, so each
case runs in a child process: a regression shows as a failed test, not a crashed pytest.
"""

from __future__ import annotations

import array
import mmap
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gpumapio

# Run in the child before each case: a 64 KiB file at PATH, and `refused(call)`, which expects
# the TypeError, prints it, and then frees everything the call touched (where the crash would
# happen had the call written into the objects).
PRELUDE = textwrap.dedent(
    """
    import ctypes, gc, os, sys
    import numpy as np
    import gpumapio
    from gpumapio import numpy as gnp

    PATH = sys.argv[1]
    ORIGINAL = open(PATH, "rb").read()

    def objects(n=16):
        a = np.empty(n, dtype=object)
        a[:] = [object() for _ in range(n)]
        return a

    def refused(call, *keep):
        try:
            call()
        except TypeError as e:
            print("TypeError:", e)
        else:
            print("NO ERROR")
        del keep
        gc.collect()
        assert open(PATH, "rb").read() == ORIGINAL, "the file was changed"
        print("survived")
    """
)

# (name, code): every entry point that takes a buffer, each given Python objects.
CASES = [
    ("CuFile.read", "a = objects(); f = gpumapio.CuFile(PATH, 'r'); refused(lambda: f.read(a), a)"),
    ("CuFile.pread", "a = objects(); f = gpumapio.CuFile(PATH, 'r'); refused(lambda: f.pread(a).get(), a)"),
    ("CuFile.raw_read", "a = objects(); f = gpumapio.CuFile(PATH, 'r'); refused(lambda: f.raw_read(a), a)"),
    (
        "CuFile.raw_read_async",
        "a = objects(); f = gpumapio.CuFile(PATH, 'r'); "
        "refused(lambda: f.raw_read_async(a, 0).check_bytes_done(), a)",
    ),
    ("CuFile.write", "a = objects(); f = gpumapio.CuFile(PATH, 'r+'); refused(lambda: f.write(a), a)"),
    ("CuFile.pwrite", "a = objects(); f = gpumapio.CuFile(PATH, 'r+'); refused(lambda: f.pwrite(a).get(), a)"),
    ("CuFile.raw_write", "a = objects(); f = gpumapio.CuFile(PATH, 'r+'); refused(lambda: f.raw_write(a), a)"),
    (
        "CuFile.raw_write_async",
        "a = objects(); f = gpumapio.CuFile(PATH, 'r+'); "
        "refused(lambda: f.raw_write_async(a, 0).check_bytes_done(), a)",
    ),
    (
        "memoryview of objects",
        "a = objects(); f = gpumapio.CuFile(PATH, 'r'); refused(lambda: f.read(memoryview(a)), a)",
    ),
    (
        "a record with an object field",
        "a = np.zeros(8, dtype=[('n', '<i8'), ('o', 'O')]); a['o'] = [object() for _ in range(8)]; "
        "f = gpumapio.CuFile(PATH, 'r'); refused(lambda: f.read(a), a)",
    ),
    (
        "ctypes py_object array",
        "a = (ctypes.py_object * 8)(*[object() for _ in range(8)]); "
        "f = gpumapio.CuFile(PATH, 'r'); refused(lambda: f.read(a), a)",
    ),
    (
        "MappedFile.write",
        "a = objects(); m = gpumapio.map(PATH, device='host', writable=True); "
        "refused(lambda: m.write(0, a), a); m.close()",
    ),
    (
        "MappedFile.gather",
        "a = objects(); m = gpumapio.map(PATH, device='host'); refused(lambda: m.gather([0, 8], 64, a), a)",
    ),
    (
        "gpumapio.gather(out=)",
        "a = objects(); m = gpumapio.map(PATH, device='host'); "
        "refused(lambda: gpumapio.gather(m, [0, 8], 64, out=a), a)",
    ),
    (
        "DeviceCache.gather",
        "a = objects(); c = gpumapio.DeviceCache(4 << 20, device='host', frame_size=2 << 20); "
        "m = c.open(PATH); refused(lambda: c.gather([(m, 0, 64), (m, 8, 64)], a), a)",
    ),
    (
        "View.write",
        "a = objects(); m = gpumapio.map(PATH, device='host', writable=True); v = m.view(0, 4096, writable=True); "
        "refused(lambda: v.write(a), a); v.release(); m.close()",
    ),
    ("cufile_driver.buf_register", "a = objects(); refused(lambda: gpumapio.cufile_driver.buf_register(a), a)"),
    ("numpy.fromfile(dtype=object)", "refused(lambda: gnp.fromfile(PATH, dtype=object, count=8))"),
    ("numpy.tofile(objects)", "a = objects(); refused(lambda: gnp.tofile(a, PATH), a)"),
    (
        "__cuda_array_interface__ typestr O",
        "class Fake:\n"
        "    __cuda_array_interface__ = {'shape': (4,), 'typestr': '|O8', 'data': (0xDEAD0000, False),"
        " 'version': 3, 'strides': None}\n"
        "f = gpumapio.CuFile(PATH, 'r'); refused(lambda: f.read(Fake()))",
    ),
    (
        "__cuda_array_interface__ record with an object field",
        "class Fake:\n"
        "    __cuda_array_interface__ = {'shape': (4,), 'typestr': '|V16', 'data': (0xDEAD0000, False),"
        " 'version': 3, 'strides': None, 'descr': [('n', '<i8'), ('o', '|O8')]}\n"
        "f = gpumapio.CuFile(PATH, 'r'); refused(lambda: f.read(Fake()))",
    ),
]

# DLPack producers of host memory made with ctypes: `code` and `bits` of the dtype are the
# case's. A capsule named "dltensor" over a DLManagedTensor whose deleter is never needed (the
# memory is the producer's own ctypes buffer).
DLPACK = textwrap.dedent(
    """
    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                    ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                    ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                    ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.c_void_p),
                    ("byte_offset", ctypes.c_uint64)]

    class Managed(ctypes.Structure):
        _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                    ("deleter", ctypes.c_void_p)]

    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    class Producer:
        def __init__(self, code, bits, n=8):
            self.memory = (ctypes.c_uint8 * 64)()
            self.shape = (ctypes.c_int64 * 1)(n)
            self.managed = Managed(DLTensor(ctypes.addressof(self.memory), 1, 0, 1, code, bits, 1,
                                            self.shape, None, 0), None, None)

        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, *args, **kwargs):
            return new_capsule(ctypes.addressof(self.managed), b"dltensor", None)
    """
)

CASES += [
    (
        "DLPack opaque handle",
        DLPACK + "f = gpumapio.CuFile(PATH, 'r'); p = Producer(3, 64); refused(lambda: f.read(p), p)",
    ),
    (
        "DLPack unknown dtype code",
        DLPACK + "f = gpumapio.CuFile(PATH, 'r'); p = Producer(99, 8); refused(lambda: f.read(p), p)",
    ),
    (
        "DLPack packed 4-bit items",
        DLPACK + "f = gpumapio.CuFile(PATH, 'r'); p = Producer(1, 4, n=64); refused(lambda: f.read(p), p)",
    ),
]


@pytest.fixture
def small_file(tmp_path):
    path = tmp_path / "plain.bin"
    path.write_bytes(os.urandom(64 << 10))
    return path


@pytest.mark.parametrize("name,code", CASES, ids=[name for name, _ in CASES])
def test_buffers_of_python_objects_are_refused(small_file, name, code):
    run = subprocess.run(
        [sys.executable, "-c", PRELUDE + code, str(small_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, (
        f"{name}: the child died with status {run.returncode} (a negative status is a signal: "
        f"the call wrote into Python objects)\n{run.stdout}\n{run.stderr[-3000:]}"
    )
    assert "NO ERROR" not in run.stdout, f"{name}: a buffer of Python objects was accepted\n{run.stdout}"
    assert "TypeError:" in run.stdout and "survived" in run.stdout, run.stdout + run.stderr
    message = run.stdout.split("TypeError:", 1)[1].splitlines()[0]
    assert "format" in message or "typestr" in message or "DLPack" in message, message


def test_plain_data_of_every_kind_is_still_moved(tmp_path):
    data = os.urandom(4096)
    path = tmp_path / "kinds.bin"
    path.write_bytes(data)
    record = np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "S3"), ("d", "<c8", (2,))])
    arrays = [
        np.zeros(512, np.float64),
        np.zeros(1024, np.float16),
        np.zeros(256, np.complex128),
        np.zeros(4096, np.bool_),
        np.zeros(4096, np.int8),
        np.zeros(64, "S64"),
        np.zeros(32, "U32"),
        np.zeros(64, "V64"),
        np.zeros(4096 // record.itemsize, record),
        np.zeros((16, 32), ">u8"),
        memoryview(bytearray(4096)).cast("c"),
    ]
    others = [array.array("H", bytes(4096)), array.array("d", bytes(4096)), mmap.mmap(-1, 4096)]
    with gpumapio.CuFile(path, "r") as f:
        for a in arrays:
            n = f.read(a)
            raw = a.tobytes() if isinstance(a, memoryview) else a.tobytes(order="A")
            assert n == len(raw) and raw == data[:n], a
        for o in others:  # exporters other than NumPy, asked for their format too
            assert f.read(o) == 4096 and bytes(memoryview(o).cast("B")) == data, o
    with gpumapio.CuFile(tmp_path / "out.bin", "w") as f:
        assert f.write(arrays[-2]) == arrays[-2].nbytes
    assert (tmp_path / "out.bin").read_bytes() == arrays[-2].tobytes()
