"""Where bytes are read from: a local path or an ``s3://`` / ``gs://`` / ``az://`` / ``http(s)://`` URL,
opened as the reader that serves it (``CuFile`` or ``RemoteFile``, which read and pread alike),
and the few path operations the loaders need on either."""

from __future__ import annotations

import os
import posixpath
import urllib.parse
from typing import Any, TypeGuard, Union

from gpumapio._native import CuFile, RemoteFile

__all__ = ["is_bucket_url", "is_url", "join", "open_source", "read_bytes", "read_pieces", "shown", "url_path"]

Source = Union[str, "os.PathLike[str]"]

# The stores whose objects live in buckets (containers, for Azure; abfs and abfss are fsspec's
# names for az), which a prefix of lists.
_BUCKET_SCHEMES = ("s3", "gs", "az", "abfs", "abfss")
_SCHEMES = (*_BUCKET_SCHEMES, "http", "https", "webhdfs", "swebhdfs")


def _scheme(source: Any) -> str | None:
    """The scheme of ``source`` where it is a string with ``://`` in it, lowercased."""
    return source.split("://", 1)[0].lower() if isinstance(source, str) and "://" in source else None


def is_url(source: Any) -> bool:
    """Whether ``source`` is an object-store or HTTP(S) URL rather than a local path."""
    return _scheme(source) in _SCHEMES


def is_bucket_url(source: Any) -> TypeGuard[str]:
    """Whether ``source`` is a URL of a bucket store (``s3://``, ``gs://``, ``az://``), whose
    prefixes can be listed."""
    return _scheme(source) in _BUCKET_SCHEMES


def open_source(source: Source, nbytes: int | None = None) -> Any:
    """A reader of ``source`` opened for reading: ``RemoteFile`` for a URL (credentials from
    the AWS environment), else ``CuFile``. Both have ``nbytes``, ``read``, ``pread``, ``close``
    and are context managers. ``nbytes``, the object's size where the caller already knows it
    (from a header it checked), spares a URL the request that would ask for it."""
    if is_url(source):
        return RemoteFile.open(source, nbytes=nbytes)
    return CuFile(source, "r")


def read_bytes(reader: Any, offset: int, size: int) -> bytes:
    """``size`` bytes of an open reader from ``offset`` (fewer where it ends first)."""
    buf = bytearray(size)
    got = reader.read(buf, size, offset) if size else 0
    return bytes(buf[:got])


def join(base: str, name: str) -> str:
    """``name`` (relative, ``/``-separated) beside ``base``'s directory: a path or a URL. A
    URL's query string (an access token) is kept for the URL made; ``name`` goes in its path,
    percent-encoded (a file or key named ``a b%.bin`` is ``a%20b%25.bin`` there)."""
    if is_url(base):
        parts = urllib.parse.urlsplit(base)
        quoted = urllib.parse.quote(name, safe="/")
        path = posixpath.normpath(posixpath.join(posixpath.dirname(parts.path) or "/", quoted))
        return urllib.parse.urlunsplit(parts._replace(path=path, fragment=""))
    return os.path.join(os.path.dirname(base), name)


def url_path(url: str) -> str:
    """A URL's path, without its query string: what says whether it names a directory (a
    trailing ``/``) or an index (``.json``)."""
    return urllib.parse.urlsplit(url).path


def shown(source: Any) -> str:
    """``source`` as errors and logs show it: a URL without its credentials and query string
    (a presigned URL's signature is a credential), as ``RemoteFile.url`` shows it; a path as
    it is."""
    text = os.fspath(source) if isinstance(source, os.PathLike) else str(source)
    if not is_url(text):
        return text
    parts = urllib.parse.urlsplit(text)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host if port is None else f"{host}:{port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query="…" if parts.query else "", fragment=""))


def read_pieces(flat: Any, readers: list[Any], pieces: list[tuple[int, int, int, int, int, int]]) -> list[int]:
    """Reads ``pieces`` — ``(reader index, offset, bytes per run, buffer offset, runs, stride)``,
    as the native ``read_files`` takes them — of readers that are not local files into the
    uint8 array ``flat``, every run in flight at once; each piece's count, as ``read_files``
    gives it (short where the object ends first)."""
    futures = []
    for slot, offset, size, at, count, stride in pieces:
        runs = []
        for k in range(count):
            dst = flat[at + k * size : at + (k + 1) * size]
            runs.append((readers[slot].pread(dst, size, offset + k * stride), size))
        futures.append(runs)
    counts = []
    for runs in futures:
        total, short = 0, False
        for future, size in runs:
            got = future.get()
            if not short:
                total += got
                short = got < size
        counts.append(total)
    return counts
