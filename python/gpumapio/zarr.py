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

:class:`RemoteStore` is the same over an S3, GCS or Azure prefix
(``RemoteStore("s3://bucket/data.zarr/")``, ``gs://...``, ``az://...``): chunks read with ranged GETs straight
into the buffers zarr asks for, written as objects (multipart uploads where large), listed and
deleted through :class:`gpumapio.RemotePrefix`; :func:`open_store` picks the store for a path
or an ``s3://`` / ``gs://`` / ``az://`` URL.

Unlike ``LocalStore``, it checks every key before it touches the file system: a key is
``/``-separated names, none of them empty, ``.`` or ``..``, with no NUL, no backslash, no lone
surrogate and no name over 255 bytes; anything else (``../x``, ``/etc/passwd``, ``a//b``) is a
``ValueError`` naming the key, so no key reaches outside the store's root. Nor does a symlink
inside the root: a key whose path resolves outside the root's real path is refused the same way
(symlinks that stay inside keep working). The check resolves the path when the call begins, so
a symlink swapped in while a call runs may still be followed. Prefixes (listing,
``delete_dir``) may end with ``/``, and ``""`` names the root there and in ``get`` / ``exists``.

A write goes to a temporary file beside its target (``.<32 hex digits>.partial``), renamed over
it when complete: listings never show such names (an interrupted write may leave one behind),
and no key may hold one.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import re
import stat
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Iterable

import numpy as np
import zarr.abc.store
import zarr.storage
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.core.buffer.core import default_buffer_prototype

from gpumapio._native import CuFile, RemotePrefix
from gpumapio._sources import is_bucket_url

__all__ = ["GpumapStore", "GDSStore", "RemoteStore", "open_store"]

_BYTE = np.dtype("B")


def _span(size: int, byte_range: ByteRequest | None) -> tuple[int, int]:
    """``(start, stop)`` of a request in a file of ``size`` bytes, its end clipped to the
    file's; a negative or inverted range is a ``ValueError`` (zarr's ``LocalStore`` refuses
    them too), never a slice's silent reinterpretation."""
    if byte_range is None:
        start, stop = 0, size
    elif isinstance(byte_range, RangeByteRequest):
        start, stop = byte_range.start, byte_range.end
        if start < 0 or stop < start:
            raise ValueError(f"byte range {start}..{stop}: expected 0 <= start <= end")
    elif isinstance(byte_range, OffsetByteRequest):
        start, stop = byte_range.offset, size
        if start < 0:
            raise ValueError(f"byte offset {start}: expected a non-negative offset")
    elif isinstance(byte_range, SuffixByteRequest):
        if byte_range.suffix < 0:
            raise ValueError(f"byte suffix {byte_range.suffix}: expected a non-negative length")
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


# The temporary file of a write, beside its target: a name of its own length (the target's name
# plus a suffix, as zarr's LocalStore names it, passes the 255-byte limit where the target's name
# is near it). Written by _put, skipped by listings, refused as a key's name.
_TEMP_PREFIX, _TEMP_DIGITS, _TEMP_SUFFIX = ".", 32, ".partial"
_TEMP_LEN = len(_TEMP_PREFIX) + _TEMP_DIGITS + len(_TEMP_SUFFIX)
_TEMP_NAME = re.compile(f"{re.escape(_TEMP_PREFIX)}[0-9a-f]{{{_TEMP_DIGITS}}}{re.escape(_TEMP_SUFFIX)}")


def _temp_name() -> str:
    return f"{_TEMP_PREFIX}{uuid.uuid4().hex[:_TEMP_DIGITS]}{_TEMP_SUFFIX}"


def _is_temp(name: str) -> bool:
    return _TEMP_NAME.fullmatch(name) is not None


def _make_dirs(directory: Path) -> None:
    """``directory`` and its missing parents, one level at a time: ``Path.mkdir(parents=True)``
    recurses once per level."""
    missing = []
    while not directory.is_dir():
        missing.append(directory)
        directory = directory.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            if not d.is_dir():
                raise


def _put(path: Path, value: Buffer, exclusive: bool = False) -> int:
    _make_dirs(path.parent)
    data = value.as_array_like()
    tmp = path.with_name(_temp_name())
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
# The most names in a key: Python's walks of a tree (listing, deleting) recurse once per level,
# and zarr's keys are a few groups deep plus one name per dimension of a chunk.
_DEPTH_MAX = 256


def _checked(root: Path, key: str, *, prefix: bool = False) -> tuple[str, Path]:
    """``key`` as it names a path inside ``root`` (a trailing ``/`` of a prefix dropped) and that
    path, or ``ValueError`` for a key that could name anything else: :func:`_checked_name`'s
    rules, the file system's limits on names and paths (a write's temporary file included), at
    most ``_DEPTH_MAX`` names, and no symlink on the way that leads outside the root.
    ``prefix``: a trailing ``/`` is allowed, and ``""`` (or ``"/"``) is the root itself.

    Callers hand LocalStore the key returned here, never the one they were given: LocalStore
    joins it to the root as it is, and ``root / "/"`` is the file system's root."""
    text = _checked_name(key, prefix=prefix)
    if text == "":
        return "", root
    names = text.split("/")
    if len(names) > _DEPTH_MAX:
        raise ValueError(f"zarr key {_shown(key)}: {len(names)} names deep (keys take {_DEPTH_MAX})")
    for name in names:
        size = len(name.encode("utf-8"))
        if size > _NAME_MAX:
            raise ValueError(f"zarr key {_shown(key)}: a name of {size} bytes (file names take {_NAME_MAX})")
    path = root.joinpath(*names)
    longest = len(os.fsencode(path)) + max(0, _TEMP_LEN - len(names[-1].encode("utf-8")))
    if longest >= _PATH_MAX:
        raise ValueError(
            f"zarr key {_shown(key)}: its path, or that of the temporary file a write makes beside "
            f"it, is longer than the {_PATH_MAX} bytes paths take"
        )
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
        raise ValueError(f"zarr key {_shown(key)} leads outside the store's root (through a symlink)")
    return text, path


def _shown(key: str) -> str:
    return repr(key) if len(key) <= 100 else f"{key[:80]!r}... ({len(key)} characters)"


def _checked_name(key: str, *, prefix: bool = False) -> str:
    """``key`` as a name relative to a store's root (a trailing ``/`` of a prefix dropped), or
    ``ValueError`` for one that is not a key: ``/``-separated names, none of them empty, ``.`` or
    ``..``, with no NUL, no backslash and no lone surrogate, not absolute, none the name of a
    write's temporary file. The same rules for a directory and a bucket, so a store copied
    between them takes the same keys. ``prefix``: a trailing ``/`` is allowed, and ``""`` names
    the root."""
    if not isinstance(key, str):
        raise TypeError(f"a zarr key is a str, not {type(key).__name__}: {key!r}")
    text = key[:-1] if prefix and key.endswith("/") else key
    if text == "":
        if prefix:
            return ""
        raise ValueError("the empty key names the store's root, not a value in it")
    if "\0" in text or "\\" in text:
        raise ValueError(f"zarr key {_shown(key)} holds a {'NUL' if chr(0) in text else 'backslash'}")
    if text.startswith("/"):
        raise ValueError(f"zarr key {_shown(key)} is absolute (keys are relative to the store's root)")
    for name in text.split("/"):
        if name in ("", ".", ".."):
            raise ValueError(f"zarr key {_shown(key)} has a name {name!r} (empty, '.' and '..' are not names)")
        if _is_temp(name):
            raise ValueError(f"zarr key {_shown(key)} has a name {name!r} kept for a write's temporary files")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"zarr key {_shown(key)} is not Unicode text (it holds a lone surrogate)") from None
    return text


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
        return await asyncio.to_thread(_size, _checked(self.root, key)[1])

    # Listings skip the temporary files of writes, in flight or left by a writer that died.

    async def list(self) -> AsyncIterator[str]:
        async for key in super().list():
            if not _is_temp(key.rsplit("/", 1)[-1]):
                yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        async for key in super().list_prefix(_checked(self.root, prefix, prefix=True)[0]):
            if not _is_temp(key.rsplit("/", 1)[-1]):
                yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        async for name in super().list_dir(_checked(self.root, prefix, prefix=True)[0]):
            if not _is_temp(name):
                yield name


def _size(path: Path) -> int:
    """The size of the value at ``path``; ``FileNotFoundError`` where there is none, as for a
    directory (which ``get`` reads as no value)."""
    try:
        st = os.stat(path)
    except NotADirectoryError:
        raise FileNotFoundError(errno.ENOENT, "no such value (a parent is a file)", os.fspath(path)) from None
    if not stat.S_ISREG(st.st_mode):
        raise FileNotFoundError(errno.ENOENT, "no such value (a directory)", os.fspath(path))
    return st.st_size


#: KvikIO's name for the same store.
GDSStore = GpumapStore


def _remote_get(prefix: RemotePrefix, name: str, prototype: BufferPrototype, byte_range: ByteRequest | None) -> Buffer | None:
    size = prefix.size(name)
    if size is None:
        return None
    start, stop = _span(size, byte_range)
    raw = _empty(prototype, stop - start)
    if stop > start:
        try:
            with prefix.open(name, nbytes=size) as f:
                f.read(raw, stop - start, start)
        except FileNotFoundError:
            return None  # deleted since it was sized
    return prototype.buffer.from_array_like(raw)


def _remote_put(prefix: RemotePrefix, name: str, value: Buffer) -> None:
    data = value.as_array_like()
    with prefix.create(name) as writer:
        if len(data):
            writer.write(data)


# Keys taken from a listing per trip to a worker thread, so that the event loop never waits on
# the network and a listing of millions of keys is not held whole.
_LIST_BATCH = 1000


class RemoteStore(zarr.abc.store.Store):
    """A Zarr v3 store over an S3 (or GCS, or Azure) prefix, read and written by gpumap: chunks go straight into
    the buffers zarr asks for (GPU buffers with ``zarr.config.enable_gpu()``), with ranged GETs
    in parallel; values are written as whole objects (a multipart upload where large), listed
    and deleted through one :class:`gpumapio.RemotePrefix`.

        store = RemoteStore("s3://bucket/data.zarr/", read_only=True)
        z = zarr.open_array(store, mode="r")

    ``settings`` go to :class:`gpumapio.RemotePrefix` (``aws_endpoint_url``, ``aws_region``,
    ``http_max_attempts``, ..., and ``unsigned=True`` for a public bucket); credentials come
    from the AWS environment, and where there are none a bucket that lists to anyone is read
    unsigned. The store pickles as its URL and settings, and each process that unpickles it (a
    Dask worker) opens its own connections. Keys follow :class:`GpumapStore`'s rules.
    """

    supports_writes = True
    supports_deletes = True
    supports_listing = True
    supports_partial_writes = False

    def __init__(self, url: str, *, read_only: bool = False, **settings: Any) -> None:
        super().__init__(read_only=read_only)
        self._settings = dict(settings)
        self._prefix = RemotePrefix(url, **self._settings)
        self.url = self._prefix.url

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "read_only": self.read_only, "settings": self._settings, "is_open": self._is_open}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], read_only=state["read_only"], **state["settings"])  # type: ignore[misc]
        self._is_open = state["is_open"]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RemoteStore)
            and (self.url, self.read_only, self._settings) == (other.url, other.read_only, other._settings)
        )

    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemoteStore('{self.url}')"

    def with_read_only(self, read_only: bool = False) -> RemoteStore:
        return type(self)(self.url, read_only=read_only, **self._settings)

    async def get(
        self,
        key: str,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        return await asyncio.to_thread(self.get_sync, key, prototype=prototype, byte_range=byte_range)

    def get_sync(
        self,
        key: str,
        *,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        if prototype is None:
            prototype = default_buffer_prototype()
        if byte_range is not None and not isinstance(byte_range, (RangeByteRequest, OffsetByteRequest, SuffixByteRequest)):
            raise TypeError(f"Unexpected byte_range, got {byte_range}.")
        name = _checked_name(key, prefix=key == "")
        if name == "":
            return None  # the root: no value, as GpumapStore's directory
        return _remote_get(self._prefix, name, prototype, byte_range)

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        return list(await asyncio.gather(*(self.get(key, prototype, byte_range) for key, byte_range in key_ranges)))

    async def exists(self, key: str) -> bool:
        name = _checked_name(key, prefix=key == "")
        if name == "":
            return False  # the root: no value, as GpumapStore's directory
        return await asyncio.to_thread(self._prefix.size, name) is not None

    async def getsize(self, key: str) -> int:
        name = _checked_name(key)
        size = await asyncio.to_thread(self._prefix.size, name)
        if size is None:
            raise FileNotFoundError(f"{self._prefix.url_of(name)}: no such object")
        return int(size)

    async def set(self, key: str, value: Buffer) -> None:
        await asyncio.to_thread(self.set_sync, key, value)

    def set_sync(self, key: str, value: Buffer) -> None:
        self._check_writable()
        if not isinstance(value, Buffer):
            raise TypeError(f"RemoteStore.set(): `value` must be a Buffer instance, not {type(value)}")
        _remote_put(self._prefix, _checked_name(key), value)

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self.delete_sync, key)

    def delete_sync(self, key: str) -> None:
        self._check_writable()
        self._prefix.delete([_checked_name(key)])

    async def delete_dir(self, prefix: str) -> None:
        self._check_writable()
        under = _checked_name(prefix, prefix=True)
        objects = self._prefix.list(under)
        while batch := await asyncio.to_thread(lambda: [name for name, _ in itertools.islice(objects, _LIST_BATCH)]):
            await asyncio.to_thread(self._prefix.delete, batch)

    async def list(self) -> AsyncIterator[str]:
        async for key in self.list_prefix(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        objects = self._prefix.list(_checked_name(prefix, prefix=True))
        while batch := await asyncio.to_thread(lambda: [name for name, _ in itertools.islice(objects, _LIST_BATCH)]):
            for key in batch:
                yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        under = _checked_name(prefix, prefix=True)
        objects, dirs = await asyncio.to_thread(self._prefix.list_dir, under)
        for name in [name for name, _ in objects] + dirs:
            yield name.rsplit("/", 1)[-1]


def open_store(location: str | os.PathLike[str], *, read_only: bool = False, **settings: Any) -> zarr.abc.store.Store:
    """The gpumap store for ``location``: a :class:`RemoteStore` for an ``s3://``, ``gs://`` or
    ``az://`` URL (with ``settings``), else a :class:`GpumapStore` of the local directory."""
    if is_bucket_url(location):
        return RemoteStore(location, read_only=read_only, **settings)
    if settings:
        raise TypeError(
            f"settings {sorted(settings)} are for s3://, gs:// and az:// stores; {location!r} is a local path"
        )
    return GpumapStore(location, read_only=read_only)
