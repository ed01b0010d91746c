"""Whole files into GPU memory in one call, and what the machine offers."""

from __future__ import annotations

import os
from typing import Any, Literal

from gpumapio import _native
from gpumapio._arguments import whole_number

__all__ = ["capabilities", "gpu_count", "read_file_to_device"]

Output = Literal["auto", "cupy", "torch", "numpy"]


def gpu_count() -> int:
    """Number of CUDA devices (0 without a driver)."""
    return _native.gpu_count()


def capabilities() -> dict[str, Any]:
    """What this machine offers: CUDA driver and devices, cuFile, ``/run/udev``, WSL — every
    "no" with its reason (``cuda_reason``, ``cufile_reason``)."""
    return _native.capabilities()


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def empty_bytes(size: int, output: Output = "auto", device: int = 0) -> Any:
    """An uninitialised ``uint8`` array of ``size`` bytes where ``output`` says: ``"cupy"`` or
    ``"torch"`` on GPU ``device`` (a CPU tensor for torch without a GPU), ``"numpy"`` in host
    memory; ``"auto"`` is CuPy where CuPy imports and a GPU is present, else NumPy."""
    if output == "auto":
        output = "cupy" if gpu_count() > 0 and _cupy() is not None else "numpy"
    if output == "cupy":
        cupy = _cupy()
        if cupy is None:
            raise ImportError("output='cupy' needs CuPy, which does not import here")
        with cupy.cuda.Device(device):
            return cupy.empty(size, dtype=cupy.uint8)
    if output == "torch":
        import torch

        where = f"cuda:{device}" if torch.cuda.is_available() else "cpu"
        return torch.empty(size, dtype=torch.uint8, device=where)
    if output == "numpy":
        import numpy

        return numpy.empty(size, dtype=numpy.uint8)
    raise ValueError(f"output {output!r}: expected 'auto', 'cupy', 'torch' or 'numpy'")


def read_file_to_device(
    path: str | os.PathLike[str],
    *,
    offset: int = 0,
    size: int | None = None,
    output: Output = "auto",
    device: int = 0,
) -> Any:
    """Reads ``size`` bytes of ``path`` from ``offset`` (default: the rest of the file) into a
    new ``uint8`` array in one parallel read: a CuPy array on GPU ``device`` where CuPy imports
    and there is a GPU, a torch tensor with ``output="torch"``, a NumPy array without a GPU
    (or with ``output="numpy"``). Raises ``EOFError`` when the file is shorter than asked.

    This is the one call that replaces ``cupy.asarray(np.fromfile(path, dtype=np.uint8))``:
    no host copy where cuFile reaches the GPU directly, and a pipelined, parallel copy through
    pinned memory where it does not.

    ``path`` may also be an ``s3://bucket/key`` or ``http(s)://`` URL: the object is read with
    parallel ranged GETs (:class:`gpumapio.RemoteFile`, credentials from the AWS environment
    variables).
    """
    offset = whole_number("offset", offset)
    if size is not None:
        size = whole_number("size", size)
    if offset < 0:
        raise ValueError(f"offset {offset} is negative")
    if size is not None and size < 0:
        raise ValueError(f"size {size} is negative")
    from gpumapio._sources import open_source

    with open_source(path) as f:
        # The range is checked against the file before memory is allocated for it.
        file_size = f.nbytes()
        if size is None:
            if offset > file_size:
                raise EOFError(f"{os.fspath(path)} is {file_size} bytes long; offset {offset} is past its end")
            size = file_size - offset
        elif offset + size > file_size:
            raise EOFError(_past_the_end(path, file_size, offset, size))
        out = empty_bytes(size, output, device)
        got = f.read(out, size, offset)
        if got != size:
            # Cut by someone else since it was measured.
            raise EOFError(_past_the_end(path, f.nbytes(), offset, size))
    return out


def _past_the_end(path: str | os.PathLike[str], file_size: int, offset: int, size: int) -> str:
    return f"{os.fspath(path)} is {file_size} bytes long; bytes {offset}..{offset + size} were asked for"
