"""KvikIO's ``kvikio.numpy``: ``numpy.fromfile`` / ``tofile`` through :class:`gpumapio.CuFile`,
into CuPy (or any array type) with NumPy's ``like=`` argument."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from gpumapio._native import CuFile

__all__ = ["LikeWrapper", "fromfile", "tofile"]


def _path(file: Any) -> str:
    if hasattr(file, "fileno") and hasattr(file, "name"):
        return os.fspath(file.name)
    return os.fspath(file)


def _int_argument(name: str, value: Any) -> int:
    """``value`` as an int (Python's or NumPy's, not a bool), else a ``TypeError`` naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def fromfile(file: Any, dtype: Any = float, count: int = -1, sep: str = "", offset: int = 0, *, like: Any = None) -> Any:
    """``numpy.fromfile`` for binary files, read in parallel by gpumap into an array of the type
    of ``like`` (a CuPy array for ``like=cupy.empty(())``; NumPy without ``like``). ``count``
    items (-1: all) of ``dtype`` from byte ``offset``, truncated to the file as NumPy does."""
    if sep != "":
        raise NotImplementedError(
            "Non-default value of the `sep` argument is not supported (gpumapio reads binary files only)"
        )
    offset, count = _int_argument("offset", offset), _int_argument("count", count)
    if offset < 0:
        raise ValueError(f"offset {offset} is negative")
    if count < -1:
        raise ValueError(f"count {count}: expected -1 (all) or a number of items")
    path = _path(file)
    itemsize = np.dtype(dtype).itemsize
    if itemsize == 0:
        raise ValueError(f"dtype {np.dtype(dtype)} has items of no size")
    # The count comes from the file, so the array is never larger than what it holds.
    available = max(os.path.getsize(path) - offset, 0) // itemsize
    count = available if count == -1 else min(count, available)
    out = np.empty_like(like, shape=(count,), dtype=dtype) if like is not None else np.empty(count, dtype=dtype)
    with CuFile(path, "r") as f:
        got = f.read(out, file_offset=offset)
    if got != out.nbytes:
        # The file was cut after its size was taken: what it held then is not all there.
        raise EOFError(f"{path}: read {got} of {out.nbytes} bytes at {offset} (the file shrank while it was read)")
    return out


def tofile(ary: Any, file: Any) -> None:
    """``ndarray.tofile``: the array's bytes in C order, written in parallel by gpumap."""
    dtype = getattr(ary, "dtype", None)
    if dtype is not None and np.dtype(dtype).hasobject:
        # Refused before the file is opened (and truncated); gpumap would refuse it after.
        raise TypeError(
            f"tofile: dtype {dtype} holds Python objects (buffer format 'O'); gpumap writes only plain data"
        )
    contiguous = ary if getattr(ary, "flags", None) is not None and ary.flags.c_contiguous else None
    if contiguous is None:
        contiguous = np.ascontiguousarray(ary, like=ary) if hasattr(ary, "__array_function__") else ary
    with CuFile(_path(file), "w") as f:
        f.write(contiguous)


class LikeWrapper:
    """Makes ``numpy.fromfile(..., like=LikeWrapper(cupy.empty(())))`` read through gpumap into
    a CuPy array (NumPy's ``like=`` dispatch); every other NumPy function passes through."""

    def __init__(self, like: Any) -> None:
        self._like = like

    def __array_function__(self, func, types, args, kwargs):
        if func is np.fromfile:
            return fromfile(*args, like=self._like, **kwargs)
        return func(*args, **kwargs)
