"""The host page cache as a tool, as ``fincore`` / ``vmtouch`` users expect it.

``file`` is a path (str or ``os.PathLike``), a file descriptor, or an object with ``fileno()``;
``offset`` / ``length`` select a byte range (``length=None``: to the end of the file). Counts
are in pages of :func:`page_size` bytes, for the pages covering the range.

- :func:`residency`: how much of a range is cached (``cachestat(2)`` where the kernel has it,
  ``mincore(2)`` elsewhere). ``cached_pages`` is ``None`` when the kernel will not tell (it
  reports real residency only for files the caller owns or may write), with the reason.
- :func:`warm`: readahead advice, or (``wait=True``) read it and return when cached.
- :func:`evict`: ``fdatasync`` + ``POSIX_FADV_DONTNEED``; returns what was cached before and
  after (best effort: mapped, locked or re-dirtied pages stay).
- :func:`drop_all`: the whole system's clean page cache (``/proc/sys/vm/drop_caches``; root).
- :func:`lock`: ``mmap`` + ``mlock`` until unlocked (limited by ``RLIMIT_MEMLOCK``).

KvikIO's ``get_page_cache_info``, ``drop_file_page_cache`` and ``drop_system_page_cache`` are
here too.
"""

from __future__ import annotations

import dataclasses
import os
from typing import IO, Literal, Union

from gpumapio import _native
from gpumapio._native import LockedRange

__all__ = [
    "clear_page_cache",
    "EvictReport",
    "LockedRange",
    "Residency",
    "drop_all",
    "drop_file_page_cache",
    "drop_system_page_cache",
    "evict",
    "get_page_cache_info",
    "lock",
    "page_size",
    "residency",
    "warm",
]

FileLike = Union[str, "os.PathLike[str]", int, IO[bytes]]


@dataclasses.dataclass(frozen=True)
class Residency:
    """How much of ``[offset, offset + length)`` of a file is in the page cache."""

    offset: int
    length: int
    file_size: int
    page_size: int
    total_pages: int
    cached_pages: int | None
    dirty_pages: int | None
    writeback_pages: int | None
    evicted_pages: int | None
    recently_evicted_pages: int | None
    method: Literal["cachestat", "mincore"]
    unknown_reason: str | None

    @property
    def cached_bytes(self) -> int | None:
        """Cached bytes in whole pages (as ``fincore`` counts them)."""
        return None if self.cached_pages is None else self.cached_pages * self.page_size

    @property
    def fraction(self) -> float | None:
        """Cached share of the range's pages, 0.0 to 1.0 (1.0 for an empty range)."""
        if self.cached_pages is None:
            return None
        return 1.0 if self.total_pages == 0 else self.cached_pages / self.total_pages


@dataclasses.dataclass(frozen=True)
class EvictReport:
    """Residency before and after :func:`evict`."""

    before: Residency
    after: Residency


def page_size() -> int:
    """The base page size the counts are in."""
    return _native.page_size()


def residency(
    file: FileLike,
    offset: int = 0,
    length: int | None = None,
    *,
    method: Literal["auto", "cachestat", "mincore"] = "auto",
) -> Residency:
    """How much of the range is in the page cache."""
    return Residency(**_native.residency(file, offset, length, method))


def warm(file: FileLike, offset: int = 0, length: int | None = None, *, wait: bool = False) -> None:
    """Brings the range into the page cache: readahead advice (returns before it is done), or
    with ``wait=True`` by reading it."""
    _native.warm(file, offset, length, wait)


def evict(file: FileLike, offset: int = 0, length: int | None = None) -> EvictReport:
    """Drops the range from the page cache (written back first); returns before and after."""
    before, after = _native.evict(file, offset, length)
    return EvictReport(Residency(**before), Residency(**after))


def drop_all(reclaim_dentries: bool = False) -> None:
    """Drops the whole system's clean page cache (and dentries and inodes with
    ``reclaim_dentries``). Needs root and a writable ``/proc/sys``: ``PermissionError`` (or
    ``OSError`` with ``EROFS``) otherwise."""
    _native.drop_all(reclaim_dentries)


def lock(file: FileLike, offset: int = 0, length: int | None = None) -> LockedRange:
    """Reads the range into the page cache and keeps it there until the returned
    :class:`LockedRange` is unlocked (``unlock()``, or the end of a ``with`` block)."""
    return _native.lock(file, offset, length)


def get_page_cache_info(file: FileLike, offset: int = 0, length: int = 0) -> tuple[int, int]:
    """KvikIO's call: ``(cached_pages, total_pages)`` of the range (``length=0``: to the end of
    the file). Raises ``OSError`` where the kernel will not tell."""
    r = residency(file, offset, None if length == 0 else length)
    if r.cached_pages is None:
        raise PermissionError(r.unknown_reason)
    return r.cached_pages, r.total_pages


def drop_file_page_cache(
    file: FileLike, offset: int = 0, length: int = 0, sync_first: bool = True
) -> None:
    """KvikIO's call: evicts the range (``length=0``: to the end of the file). gpumap always
    writes dirty pages back first (they could not be dropped otherwise)."""
    evict(file, offset, None if length == 0 else length)


def drop_system_page_cache(reclaim_dentries_and_inodes: bool = True, sync_first: bool = True) -> bool:
    """KvikIO's call: :func:`drop_all`; returns whether it worked instead of raising."""
    try:
        drop_all(reclaim_dentries_and_inodes)
    except OSError:
        return False
    return True


def clear_page_cache(reclaim_dentries_and_inodes: bool = True, clear_dirty_pages: bool = True) -> bool:
    """KvikIO's older name (deprecated there since 26.04) for
    :func:`drop_system_page_cache`."""
    import warnings

    warnings.warn(
        "clear_page_cache is deprecated; use drop_system_page_cache", DeprecationWarning, stacklevel=2
    )
    return drop_system_page_cache(reclaim_dentries_and_inodes, sync_first=clear_dirty_pages)
