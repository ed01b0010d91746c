"""KvikIO's ``kvikio.numpy``: ``numpy.fromfile`` / ``tofile`` through :class:`gpumapio.CuFile`,
into CuPy (or any array type) with NumPy's ``like=`` argument."""

from __future__ import annotations

import fcntl
import io
import os
from typing import Any

import numpy as np

from gpumapio._arguments import whole_number
from gpumapio._native import CuFile

__all__ = ["LikeWrapper", "fromfile", "tofile"]


def _opened(file: Any) -> bool:
    """Whether ``file`` is an open file object (read and written at its position, as NumPy
    does), rather than a path."""
    return hasattr(file, "fileno") and hasattr(file, "name") and hasattr(file, "tell")


def _path(file: Any, write: bool) -> str:
    """The path to open for ``file``. An open file object is reached through its descriptor
    (``/proc/self/fd/N`` opens the very file it has open, even renamed, unlinked or named
    relative to another working directory, where its ``name`` may by then be another file's),
    and only for what its mode allows, as NumPy does."""
    if not _opened(file):
        return os.fspath(file)
    fd = file.fileno()
    access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    if access not in ((os.O_WRONLY, os.O_RDWR) if write else (os.O_RDONLY, os.O_RDWR)):
        doing = "tofile" if write else "fromfile"
        raise io.UnsupportedOperation(
            f"{doing}: the file object of {file.name!r} is not open for {'writing' if write else 'reading'}"
        )
    return f"/proc/self/fd/{fd}"


def _bytes_of(array: Any) -> Any:
    """A NumPy array's bytes as a flat uint8 view (the buffer protocol has no format for
    datetime64 and timedelta64, which CuFile would refuse); any other array as it is."""
    if isinstance(array, np.ndarray) and array.dtype.kind in "mM" and array.flags.c_contiguous:
        return array.reshape(-1).view(np.uint8)
    return array


def fromfile(file: Any, dtype: Any = float, count: int = -1, sep: str = "", offset: int = 0, *, like: Any = None) -> Any:
    """``numpy.fromfile`` for binary files, read in parallel by gpumap into an array of the type
    of ``like`` (a CuPy array for ``like=cupy.empty(())``; NumPy without ``like``). ``count``
    items (-1: all) of ``dtype`` from byte ``offset``, truncated to the file as NumPy does. An
    open file object (the file it has open, which must be open for reading) is read from its
    position plus ``offset``, and left after what was read, as NumPy does."""
    if sep != "":
        raise NotImplementedError(
            "Non-default value of the `sep` argument is not supported (gpumapio reads binary files only)"
        )
    offset, count = whole_number("offset", offset), whole_number("count", count)
    if offset < 0:
        raise ValueError(f"offset {offset} is negative")
    if count < -1:
        raise ValueError(f"count {count}: expected -1 (all) or a number of items")
    path = _path(file, write=False)
    shown = repr(file.name) if _opened(file) else path
    if _opened(file):
        offset += file.tell()
    itemsize = np.dtype(dtype).itemsize
    if itemsize == 0:
        raise ValueError(f"dtype {np.dtype(dtype)} has items of no size")
    # The count comes from the file, so the array is never larger than what it holds.
    available = max(os.path.getsize(path) - offset, 0) // itemsize
    count = available if count == -1 else min(count, available)
    out = np.empty_like(like, shape=(count,), dtype=dtype) if like is not None else np.empty(count, dtype=dtype)
    with CuFile(path, "r") as f:
        got = f.read(_bytes_of(out), file_offset=offset)
    if _opened(file):
        file.seek(offset + got)
    if got != out.nbytes:
        # The file was cut after its size was taken: what it held then is not all there.
        raise EOFError(f"{shown}: read {got} of {out.nbytes} bytes at {offset} (the file shrank while it was read)")
    return out


def tofile(ary: Any, file: Any) -> None:
    """``ndarray.tofile``: the array's bytes in C order, written in parallel by gpumap. A path
    is written anew (truncated); an open file object (the file it has open, which must be open
    for writing) at its position, without truncating it, and left after what was written, as
    NumPy does."""
    dtype = getattr(ary, "dtype", None)
    try:
        holds_objects = dtype is not None and np.dtype(dtype).hasobject
    except TypeError:  # not a NumPy dtype (torch's): CuFile judges the buffer
        holds_objects = False
    if holds_objects:
        # Refused before the file is opened (and truncated); gpumap would refuse it after.
        raise TypeError(
            f"tofile: dtype {dtype} holds Python objects (buffer format 'O'); gpumap writes only plain data"
        )
    contiguous = ary if getattr(ary, "flags", None) is not None and ary.flags.c_contiguous else None
    if contiguous is None:
        contiguous = np.ascontiguousarray(ary, like=ary) if hasattr(ary, "__array_function__") else ary
    if not _opened(file):
        with CuFile(_path(file, write=True), "w") as f:
            f.write(_bytes_of(contiguous))
        return
    path = _path(file, write=True)
    # What the file object holds in its buffer goes first, then the array after it.
    file.flush()
    at = file.tell()
    with CuFile(path, "r+") as f:
        written = f.write(_bytes_of(contiguous), file_offset=at)
    file.seek(at + written)


class LikeWrapper:
    """Makes ``numpy.fromfile(..., like=LikeWrapper(cupy.empty(())))`` read through gpumap into
    a CuPy array (NumPy's ``like=`` dispatch); every other NumPy function passes through."""

    def __init__(self, like: Any) -> None:
        self._like = like

    def __array_function__(self, func, types, args, kwargs):
        if func is np.fromfile:
            return fromfile(*args, like=self._like, **kwargs)
        return func(*args, **kwargs)
