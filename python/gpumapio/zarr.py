"""A Zarr v3 store whose chunks gpumap reads straight into the buffers zarr asks for — GPU
buffers with zarr's GPU buffer prototype (``zarr.config.enable_gpu()``), host buffers
otherwise — like KvikIO's ``kvikio.zarr.GDSStore`` (also importable under that name here).

    import zarr
    from gpumapio.zarr import GpumapStore

    zarr.config.enable_gpu()                      # chunks as CuPy arrays
    z = zarr.open_array(GpumapStore("data.zarr"), mode="r")
    block = z[:1024]

It is zarr's ``LocalStore`` (the same files on disk, the same listing, deleting, ...) with reads
and writes of chunk data going through :class:`gpumapio.CuFile`. Needs ``zarr>=3``.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import zarr.storage
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.core.buffer.core import default_buffer_prototype

from gpumapio._native import CuFile

__all__ = ["GpumapStore", "GDSStore"]

_BYTE = np.dtype("B")


def _span(size: int, byte_range: ByteRequest | None) -> tuple[int, int]:
    """``(start, stop)`` of a request in a file of ``size`` bytes, clipped like a slice."""
    if byte_range is None:
        start, stop = 0, size
    elif isinstance(byte_range, RangeByteRequest):
        start, stop = byte_range.start, byte_range.end
    elif isinstance(byte_range, OffsetByteRequest):
        start, stop = byte_range.offset, size
    elif isinstance(byte_range, SuffixByteRequest):
        start, stop = max(0, size - byte_range.suffix), size
    else:
        raise TypeError(f"Unexpected byte_range, got {byte_range}.")
    start = min(max(start, 0), size)
    return start, max(start, min(stop, size))


def _empty(prototype: BufferPrototype, n: int) -> Any:
    nd = prototype.nd_buffer
    made = nd.empty(shape=(n,), dtype=_BYTE) if hasattr(nd, "empty") else nd.create(shape=(n,), dtype=_BYTE)
    return made.as_ndarray_like()


def _get(path: Path, prototype: BufferPrototype, byte_range: ByteRequest | None) -> Buffer:
    with CuFile(path, "r") as f:
        start, stop = _span(f.nbytes(), byte_range)
        raw = _empty(prototype, stop - start)
        if stop > start:
            got = f.read(raw, stop - start, start)
            if got != stop - start:
                raise EOFError(f"{path} shrank while it was read")
    return prototype.buffer.from_array_like(raw)


def _put(path: Path, value: Buffer, exclusive: bool = False) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = value.as_array_like()
    tmp = path.with_suffix(f".{uuid.uuid4().hex}.partial")
    try:
        with CuFile(tmp, "w") as f:
            written = f.write(data)
        if exclusive:
            os.link(tmp, path)  # FileExistsError if it exists
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return written


class GpumapStore(zarr.storage.LocalStore):
    """zarr's ``LocalStore`` with chunk reads and writes through :class:`gpumapio.CuFile`, into
    and out of whatever buffers the prototype makes (CuPy for zarr's GPU prototype, NumPy for
    the default one)."""

    def __repr__(self) -> str:
        return f"GpumapStore('{self}')"

    async def get(
        self,
        key: str,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        if prototype is None:
            prototype = default_buffer_prototype()
        if not self._is_open:
            await self._open()
        try:
            return await asyncio.to_thread(_get, self.root / key, prototype, byte_range)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def get_sync(
        self,
        key: str,
        *,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        if prototype is None:
            prototype = default_buffer_prototype()
        self._ensure_open_sync()
        try:
            return _get(self.root / key, prototype, byte_range)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        return list(
            await asyncio.gather(*(self.get(key, prototype, byte_range) for key, byte_range in key_ranges))
        )

    async def _set(self, key: str, value: Buffer, exclusive: bool = False) -> None:
        if not self._is_open:
            await self._open()
        self._check_writable()
        if not isinstance(value, Buffer):
            raise TypeError(f"GpumapStore.set(): `value` must be a Buffer instance, not {type(value)}")
        await asyncio.to_thread(_put, self.root / key, value, exclusive)

    def set_sync(self, key: str, value: Buffer) -> None:
        self._ensure_open_sync()
        self._check_writable()
        if not isinstance(value, Buffer):
            raise TypeError(f"GpumapStore.set(): `value` must be a Buffer instance, not {type(value)}")
        _put(self.root / key, value)


#: KvikIO's name for the same store.
GDSStore = GpumapStore
