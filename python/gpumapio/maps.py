"""Files in GPU memory with mmap semantics: gpumap's GPU page cache.

A :class:`MappedFile` is a file as one range of device addresses (``base + offset``). Nothing is
resident at first; a :class:`View` of a range faults in what is missing and pins it until it is
released, and exports it without a copy — ``cupy.asarray(view)`` (``__cuda_array_interface__``)
or ``torch.from_dlpack(view)`` (``__dlpack__``), each keeping the pin for as long as the array
lives. Many files can share one budget (:class:`DeviceCache`); memory is evicted least recently
used first, after dirty bytes were written back. :meth:`MappedFile.gather` copies many rows —
even of a file far larger than the GPU — into one array.

Without a GPU, host memory stands in: the same calls work, gathers fill NumPy arrays, and views
give their bytes with ``tobytes()``.

>>> import gpumapio
>>> table = gpumapio.map("embeddings.bin", budget=1 << 30, extent_size=4096)   # doctest: +SKIP
>>> rows = gpumapio.gather_rows(table, [0, 10, 200], 4096)                      # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

from gpumapio._arguments import first_outside, whole_numbers
from gpumapio._device import Output, empty_bytes, gpu_count
from gpumapio._native import DeviceCache, LookupScope, MappedFile, View

__all__ = ["DeviceCache", "MappedFile", "View", "gather", "gather_rows", "map"]

Advice = Literal["normal", "sequential", "random", "willneed", "dontneed"]


def include_dir() -> str:
    """The folder of ``gpumap_table.h``: the layout of a cache's directory, for kernels of one's
    own that look rows up themselves (pass it as ``-I`` to NVRTC, CuPy's ``RawKernel`` or nvcc;
    see :meth:`MappedFile.lookup_scope` and python/examples/lookup_kernel.py)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def map(  # noqa: A001 - the name users reach for, as mmap.mmap / np.memmap
    path: str | os.PathLike[str],
    *,
    budget: int | None = None,
    writable: bool = False,
    extent_size: int = 65536,
    frame_size: int | None = None,
    device: int | str | None = None,
    advice: Advice = "normal",
    cache: DeviceCache | None = None,
    zero_copy: bool | Literal["misses"] = False,
    max_pinned: int | None = None,
    read_ahead: int | None = None,
) -> MappedFile:
    """Maps ``path`` into GPU memory (host memory without a GPU).

    With ``cache``, the file joins that :class:`DeviceCache` and shares its budget; otherwise it
    gets a cache of its own of ``budget`` bytes (default: the file's size, up to 4 GiB, in whole
    frames). ``extent_size`` (a power of two from 4096) is the unit of I/O and of random-access
    residency: small records want 4096. ``device``: a GPU ordinal, ``"host"``, or ``None`` for
    GPU 0 where there is one. ``advice``: ``"sequential"`` reads ahead on walks, ``"random"``
    does not. ``zero_copy`` (read-only files that fit in RAM): gathers and views read the file
    in place from the host's page cache, registered for the GPU — faster than the cache for warm
    files that fit in RAM (docs/decisions/0010-zero-copy-on-request.md) — at the price of
    reading and pinning the whole file in host memory (within ``max_pinned`` bytes across the
    process). ``zero_copy="misses"`` keeps the cache in front of that tier for row gathers: rows
    resident in GPU memory come from there, the others are read in place by the same kernel and
    made resident in the background (docs/decisions/0013-misses-in-place.md). ``read_ahead``:
    bytes a walk reads ahead (default 512 MiB; 0: none). ``path`` may be an ``s3://`` or
    ``http(s)://`` URL: the object is mapped read-only, its missing extents fetched with ranged
    GETs (docs/remote.md).
    """
    # Without a cache, a cache of its own, sized by the library (MapOptions::open).
    open_in: Callable[..., MappedFile] = cache.open if cache is not None else functools.partial(
        MappedFile.open,
        budget=budget,
        extent_size=extent_size,
        frame_size=frame_size,
        device=device,
    )
    return open_in(
        os.fspath(path),
        writable=writable,
        advice=advice,
        zero_copy=zero_copy,
        max_pinned=max_pinned,
        read_ahead=read_ahead,
    )


def _output_for(mapped: MappedFile, output: Output) -> Output:
    if output != "auto":
        return output
    on_gpu = mapped.base is not None and gpu_count() > 0
    return "auto" if on_gpu else "numpy"


def _check_rows(mapped: MappedFile, offsets: list[int], length: int) -> None:
    size = mapped.nbytes
    if length < 0:
        raise ValueError(f"row length {length} is negative")
    for o in offsets:
        if o < 0:
            raise ValueError(f"row offset {o} is negative")
        if o + length > size:
            raise ValueError(f"row {o}..{o + length} is outside the file of {size} bytes")


def gather(
    mapped: MappedFile,
    offsets: Sequence[int],
    length: int,
    *,
    out: Any = None,
    output: Output = "auto",
    device: int = 0,
) -> Any:
    """``length`` bytes at each of ``offsets`` of ``mapped``, packed in order in one ``uint8``
    array: ``out`` if given, else a new CuPy array (torch with ``output="torch"``) on the GPU,
    or a NumPy array on host memory. Missing extents are read in one batch and placed by one
    kernel launch per group; resident ones are copied from the cache."""
    offsets = whole_numbers("offsets", offsets)
    if out is None:
        # The rows are checked against the file before memory is allocated for them.
        _check_rows(mapped, offsets, length)
        out = empty_bytes(len(offsets) * length, _output_for(mapped, output), device)
    mapped.gather(offsets, length, out)
    return out


def _index_array(indices: Sequence[int], rows: int) -> Any:
    """A list, tuple or range of row indices as an int64 array: integers only, as an array of
    indices must be (1.9 or True is not a row number), and one past int64 refused as outside
    the file, naming it (NumPy would make such a list uint64 or float64)."""
    import numpy

    if isinstance(indices, range):
        outside = first_outside(indices, rows)
        if outside is not None:
            position, value = outside
            raise IndexError(f"row index {value} at position {position} is outside the file's {rows} rows")
        return numpy.arange(indices.start, indices.stop, indices.step, dtype=numpy.int64)
    if len(indices) == 0:
        return numpy.zeros(0, numpy.int64)
    as_given = numpy.asarray(indices)
    if as_given.dtype.kind == "i":
        return as_given.astype(numpy.int64, copy=False)
    for position, value in enumerate(whole_numbers("indices", indices)):
        if not -(2**63) <= value < 2**63:
            raise IndexError(f"row index {value} at position {position} is outside the file's {rows} rows")
    return as_given.astype(numpy.int64)


def _index_count(indices: Any) -> int:
    """How many indices a NumPy, CuPy or torch array, or a buffer, holds."""
    numel = getattr(indices, "numel", None)
    if callable(numel):
        return int(numel())
    size = getattr(indices, "size", None)
    if isinstance(size, int):
        return size
    view = memoryview(indices)
    return view.nbytes // max(view.itemsize, 1)


def _current_stream(indices: Any, out: Any, output: Output) -> Any:
    """The stream a framework's code would run on now: torch's current stream when the indices
    or the output are torch CUDA tensors (or ``output="torch"``), CuPy's when they are CuPy
    arrays; None (gpumap's own) otherwise."""
    for obj in (indices, out):
        module = type(obj).__module__
        if module.startswith("torch") and getattr(obj, "is_cuda", False):
            import torch

            return torch.cuda.current_stream(obj.device)
        if module.startswith("cupy"):
            import cupy

            return cupy.cuda.get_current_stream()
    if output == "torch":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.current_stream()
    return None


def gather_rows(
    mapped: MappedFile,
    indices: Any,
    row_size: int,
    *,
    out: Any = None,
    dtype: Any = None,
    output: Output = "auto",
    stream: Any = None,
    device: int = 0,
) -> Any:
    """Rows ``indices`` of ``mapped`` seen as a table of ``row_size``-byte rows (row ``i`` is
    bytes ``[i * row_size, (i + 1) * row_size)``; a partial last row is not a row), in order.

    Returns ``out`` if given (any array or buffer holding the rows' bytes), else a new array of
    shape ``(len(indices), row_size // itemsize)`` and type ``dtype`` (default ``uint8``, with
    ``row_size`` a multiple of its size): CuPy on the GPU (torch with ``output="torch"``), NumPy
    on host memory.

    ``indices``: int32 or int64 on the host (NumPy, ``array.array``; a list is converted) or on
    the GPU (CuPy, torch), taken in memory order. On the GPU, resident rows are copied by one
    kernel and only missing extents are read. The kernel runs on ``stream`` (a torch or CuPy
    stream), by default the framework's current stream when the indices or the output are
    torch or CuPy arrays, so a training loop can overlap it with its own work. An index outside
    the file raises ``IndexError`` naming it and its position, and reads nothing for it (what
    ``out`` then holds is unspecified)."""
    if isinstance(indices, (list, tuple, range)):
        indices = _index_array(indices, mapped.nbytes // max(row_size, 1))
    if row_size <= 0:
        raise ValueError(f"row_size {row_size} must be at least 1")
    if stream is None:
        stream = _current_stream(indices, out, output)
    if out is None:
        count = _index_count(indices)
        if count > 0 and row_size > mapped.nbytes:
            raise IndexError(f"rows of {row_size} bytes: the file of {mapped.nbytes} bytes has none")
        out = empty_bytes(count * row_size, _output_for(mapped, output), device)
        out = out.reshape(count, row_size)
        if dtype is not None:
            out = _as_dtype(out, dtype, row_size)
    mapped.gather_rows(indices, row_size, out, stream=stream)
    return out


def _as_dtype(rows: Any, dtype: Any, row_size: int) -> Any:
    """``rows`` (uint8, ``(n, row_size)``) seen as ``dtype``: ``(n, row_size // itemsize)``."""
    if type(rows).__module__.startswith("torch"):
        import torch

        if not isinstance(dtype, torch.dtype):
            dtype = getattr(torch, str(getattr(dtype, "__name__", dtype)))
        itemsize = torch.empty(0, dtype=dtype).element_size()
    else:
        import numpy

        itemsize = numpy.dtype(dtype).itemsize
    if itemsize == 0:
        raise ValueError(f"dtype {dtype!r} has items of no size: rows cannot be seen as it")
    if row_size % itemsize:
        raise ValueError(f"row_size {row_size} is not a whole number of {dtype} items of {itemsize} bytes")
    return rows.view(dtype)
