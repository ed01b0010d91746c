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

Unlike ``LocalStore``, it checks every key before it touches the file system: a key is
``/``-separated names, none of them empty, ``.`` or ``..``, with no NUL, no backslash, no lone
surrogate and no name over 255 bytes; anything else (``../x``, ``/etc/passwd``, ``a//b``) is a
``ValueError`` naming the key, so no key reaches outside the store's root. Prefixes (listing,
``delete_dir``) may end with ``/``, and ``""`` names the root there and in ``get`` / ``exists``.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Iterable

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
    # A name of its own length, beside the target: the target's name plus a suffix (as zarr's
    # LocalStore names it) passes the 255-byte limit where the target's name is near it.
    tmp = path.with_name(f".{uuid.uuid4().hex}.partial")
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


# The longest name (NAME_MAX) and path (PATH_MAX) Linux file systems take, in bytes.
_NAME_MAX = 255
_PATH_MAX = 4096


def _checked(root: Path, key: str, *, prefix: bool = False) -> tuple[str, Path]:
    """``key`` as it names a path inside ``root`` (a trailing ``/`` of a prefix dropped) and that
    path, or ``ValueError`` for a key that could name anything else. ``prefix``: a trailing ``/``
    is allowed, and ``""`` (or ``"/"``) is the root itself.

    Callers hand LocalStore the key returned here, never the one they were given: LocalStore
    joins it to the root as it is, and ``root / "/"`` is the file system's root."""
    if not isinstance(key, str):
        raise TypeError(f"a zarr key is a str, not {type(key).__name__}: {key!r}")
    text = key[:-1] if prefix and key.endswith("/") else key
    shown = repr(key) if len(key) <= 100 else f"{key[:80]!r}... ({len(key)} characters)"
    if text == "":
        if prefix:
            return "", root
        raise ValueError("the empty key names the store's root, not a value in it")
    if "\0" in text or "\\" in text:
        raise ValueError(f"zarr key {shown} holds a {'NUL' if chr(0) in text else 'backslash'}")
    if text.startswith("/"):
        raise ValueError(f"zarr key {shown} is absolute (keys are relative to the store's root)")
    names = text.split("/")
    for name in names:
        if name in ("", ".", ".."):
            raise ValueError(f"zarr key {shown} has a name {name!r} (empty, '.' and '..' are not names)")
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"zarr key {shown} is not Unicode text (it holds a lone surrogate)") from None
        if size > _NAME_MAX:
            raise ValueError(f"zarr key {shown}: a name of {size} bytes (file names take {_NAME_MAX})")
    path = root.joinpath(*names)
    if len(os.fsencode(path)) >= _PATH_MAX:
        raise ValueError(f"zarr key {shown}: its path is longer than the {_PATH_MAX} bytes paths take")
    return text, path


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
        await self._ensure_open_concurrently()
        _, path = _checked(self.root, key, prefix=key == "")
        try:
            return await asyncio.to_thread(_get, path, prototype, byte_range)
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
        _, path = _checked(self.root, key, prefix=key == "")
        try:
            return _get(path, prototype, byte_range)
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

    async def _ensure_open_concurrently(self) -> None:
        """Opens the store if it is not open. Concurrent first calls (every ``get`` of a
        ``get_partial_values``, every ``set`` of a ``set_many``) all find it closed before any
        has opened it, and zarr's ``_open`` raises "store is already open" for all but the
        first: that refusal is fine once the store is open."""
        if self._is_open:
            return
        try:
            await self._open()
        except ValueError:
            if not self._is_open:
                raise

    async def _set(self, key: str, value: Buffer, exclusive: bool = False) -> None:
        await self._ensure_open_concurrently()
        self._check_writable()
        if not isinstance(value, Buffer):
            raise TypeError(f"GpumapStore.set(): `value` must be a Buffer instance, not {type(value)}")
        await asyncio.to_thread(_put, _checked(self.root, key)[1], value, exclusive)

    def set_sync(self, key: str, value: Buffer) -> None:
        self._ensure_open_sync()
        self._check_writable()
        if not isinstance(value, Buffer):
            raise TypeError(f"GpumapStore.set(): `value` must be a Buffer instance, not {type(value)}")
        _put(_checked(self.root, key)[1], value)

    # The rest of LocalStore's key-taking methods: each does what LocalStore does, with the
    # key checked and in the form _checked returns.

    async def delete(self, key: str) -> None:
        await super().delete(_checked(self.root, key)[0])

    def delete_sync(self, key: str) -> None:
        super().delete_sync(_checked(self.root, key)[0])

    async def delete_dir(self, prefix: str) -> None:
        await super().delete_dir(_checked(self.root, prefix, prefix=True)[0])

    async def exists(self, key: str) -> bool:
        return await super().exists(_checked(self.root, key, prefix=key == "")[0])

    async def getsize(self, key: str) -> int:
        return await asyncio.to_thread(os.path.getsize, _checked(self.root, key)[1])

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        async for key in super().list_prefix(_checked(self.root, prefix, prefix=True)[0]):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        async for key in super().list_dir(_checked(self.root, prefix, prefix=True)[0]):
            yield key


#: KvikIO's name for the same store.
GDSStore = GpumapStore
