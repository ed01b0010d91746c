"""Process-wide settings, as KvikIO 26.x's ``kvikio.defaults`` has them.

``get(name)`` reads a setting; ``set(name, value)`` or ``set({name: value, ...})`` changes it at
once and returns a context manager that puts the old values back when its ``with`` block ends
(nesting works). Unknown names raise ``KeyError``.

==========================  ===========================================================
name                        meaning
==========================  ===========================================================
``compat_mode``             ``CompatMode.ON`` (POSIX only), ``OFF`` (cuFile or fail),
                            ``AUTO`` (cuFile where it is real GDS); also a bool or str
``num_threads``             threads of the shared I/O pool, 1 to 1024 (resized in place)
``task_size``               largest piece one task moves, bytes (at least 1)
``gds_threshold``           device transfers below this use POSIX, bytes
``bounce_buffer_size``      pinned staging buffer size, any size above zero (rounded up
                            to whole pages where a file opens, as ``O_DIRECT`` needs)
``auto_direct_io_read``     ``O_DIRECT`` for reads: bool, or ``"uncached"`` (only where
                            the page cache holds almost nothing)
``auto_direct_io_write``    ``O_DIRECT`` for writes: bool
``http_max_attempts``       attempts of a remote request before it fails (default 3)
``http_status_codes``       list of HTTP statuses that are retried (default
                            ``[429, 500, 502, 503, 504]``)
``http_timeout``            seconds a remote request may take (default 60)
==========================  ===========================================================

``SETTINGS_TABLE`` holds the same settings as the library's table: each one's variable, KvikIO
alias, default and a line of documentation.

Values are taken as KvikIO 26.10 takes them: an int setting takes ints, NumPy's integers, a bool
as 0 or 1 and a float truncated toward zero (``4.7`` is 4); the ``O_DIRECT`` switches take bools,
0 and 1 and words such as ``"on"`` and ``"off"`` (where KvikIO takes any object's truth, so
that ``"off"`` is true there, gpumap refuses what it does not know). ``compat_mode`` also takes
the words its environment variable takes (``"on"``, ``"auto"``), which KvikIO's ``set`` refuses. The
evidence: ``python/bench/kvikio_defaults_probe.py`` and its output beside KvikIO 26.10 in
``docs/results/2026-11-25-h100-kvikio-defaults-probe.txt``.

Bad values raise what KvikIO raises, with its key phrases: ``TypeError`` for a wrong type,
``ValueError`` ("must be a positive integer") for a zero count or size, ``OverflowError``
("can't convert negative value") for a negative one and ("too large to convert") for one
beyond 64 bits. gpumap's own limit of 1024 threads is a ``ValueError`` naming it.

The starting values come from ``GPUMAP_*`` environment variables, with KvikIO's ``KVIKIO_*``
names accepted as aliases (``KVIKIO_COMPAT_MODE``, ``KVIKIO_NTHREADS``, ``KVIKIO_TASK_SIZE``,
``KVIKIO_GDS_THRESHOLD``, ``KVIKIO_BOUNCE_BUFFER_SIZE``, ``KVIKIO_AUTO_DIRECT_IO_READ``,
``KVIKIO_AUTO_DIRECT_IO_WRITE``, ``KVIKIO_HTTP_MAX_ATTEMPTS``, ``KVIKIO_HTTP_STATUS_CODES``
(comma-separated), ``KVIKIO_HTTP_TIMEOUT``). A ``CuFile`` takes compat mode, bounce buffer size and the
``O_DIRECT`` settings when it is opened, task size and GDS threshold at each call.
"""

from __future__ import annotations

import enum
from typing import Any, overload

from gpumapio import _native
from gpumapio._restoring import Restoring, config_of

__all__ = [
    "SETTINGS_TABLE",
    "CompatMode",
    "ConfigContextManager",
    "get",
    "set",
    "is_compat_mode_preferred",
    "compat_mode",
    "compat_mode_reset",
    "set_compat_mode",
    "num_threads",
    "get_num_threads",
    "num_threads_reset",
    "reset_num_threads",
    "set_num_threads",
    "task_size",
    "task_size_reset",
    "set_task_size",
    "gds_threshold",
    "gds_threshold_reset",
    "set_gds_threshold",
    "bounce_buffer_size",
    "bounce_buffer_size_reset",
    "set_bounce_buffer_size",
]


class CompatMode(enum.IntEnum):
    """KvikIO's compatibility mode (same values): ``ON`` uses POSIX only and never loads cuFile;
    ``OFF`` uses cuFile or fails with the reason; ``AUTO`` uses cuFile where it is real GPUDirect
    Storage and gpumap's pipelined POSIX path elsewhere."""

    OFF = 0
    ON = 1
    AUTO = 2


#: The library's one table of settings: a dict per setting with its ``name`` (as ``get`` and
#: ``set`` take it), ``field``, ``env`` (``GPUMAP_*``), ``alias`` (``KVIKIO_*``), ``default``,
#: ``scope`` and ``doc``. The names below, and the tests of this module's documentation, are
#: derived from it.
SETTINGS_TABLE: tuple[dict[str, str], ...] = tuple(_native.settings_table())

_NAMES = tuple(row["name"] for row in SETTINGS_TABLE)


def get(config_name: str) -> Any:
    """The current value of the setting ``config_name`` (``KeyError`` for unknown names)."""
    if not isinstance(config_name, str):
        raise TypeError(f"setting names are str, not {type(config_name).__name__}")
    value = _native.defaults_get(config_name)
    if config_name == "compat_mode":
        return CompatMode(value)
    return value


class ConfigContextManager(Restoring):
    """Returned by :func:`set`: the new values are in force already; used in a ``with``
    statement, the old values come back when the block ends."""

    __slots__ = ()

    def __init__(self, config: dict[str, Any]):
        for name in config:
            if not isinstance(name, str) or name not in _NAMES:
                _native.defaults_get(name if isinstance(name, str) else repr(name))
        # The old value and where it came from: a setting back at its default is again left
        # to the choices made for each file's file system.
        super().__init__(config, _native.defaults_saved, _native.defaults_set, _put_back)


def _put_back(name: str, saved: tuple[Any, str, str | None]) -> None:
    _native.defaults_put_back(name, *saved)


@overload
def set(config: dict[str, Any], /) -> ConfigContextManager: ...
@overload
def set(key: str, value: Any, /) -> ConfigContextManager: ...


def set(*config: Any) -> ConfigContextManager:
    """Sets one setting (``set(name, value)``) or several (``set({name: value, ...})``) now, and
    returns a context manager that restores the old values at the end of a ``with`` block.
    Unknown names raise ``KeyError``; bad values ``ValueError`` or ``TypeError``, and negative
    or huge sizes ``OverflowError``, as KvikIO raises them (and nothing is changed). Sizes and
    counts given as floats are truncated toward zero, as KvikIO takes them."""
    return ConfigContextManager(config_of(config, "gpumapio.defaults.set"))


def is_compat_mode_preferred() -> bool:
    """Whether a file opened now would move device data over POSIX rather than cuFile."""
    return _native.is_compat_mode_preferred()


# KvikIO's older functions (deprecated there since 25.04, still used by much code).


def compat_mode() -> CompatMode:
    """The compat mode (``get("compat_mode")``)."""
    return get("compat_mode")


def compat_mode_reset(compatmode: CompatMode | bool | str) -> None:
    """Sets the compat mode."""
    set("compat_mode", compatmode)


def set_compat_mode(compatmode: CompatMode | bool | str) -> ConfigContextManager:
    """Sets the compat mode; usable as a context manager that restores it."""
    return set("compat_mode", compatmode)


def num_threads() -> int:
    """Threads of the I/O pool (``get("num_threads")``)."""
    return get("num_threads")


get_num_threads = num_threads


def num_threads_reset(nthreads: int) -> None:
    """Resizes the I/O pool."""
    set("num_threads", nthreads)


reset_num_threads = num_threads_reset


def set_num_threads(nthreads: int) -> ConfigContextManager:
    """Resizes the I/O pool; usable as a context manager that restores the size."""
    return set("num_threads", nthreads)


def task_size() -> int:
    """The default task size in bytes."""
    return get("task_size")


def task_size_reset(nbytes: int) -> None:
    """Sets the default task size."""
    set("task_size", nbytes)


def set_task_size(nbytes: int) -> ConfigContextManager:
    """Sets the default task size; usable as a context manager."""
    return set("task_size", nbytes)


def gds_threshold() -> int:
    """Device transfers smaller than this use POSIX even where cuFile is chosen."""
    return get("gds_threshold")


def gds_threshold_reset(nbytes: int) -> None:
    """Sets the GDS threshold."""
    set("gds_threshold", nbytes)


def set_gds_threshold(nbytes: int) -> ConfigContextManager:
    """Sets the GDS threshold; usable as a context manager."""
    return set("gds_threshold", nbytes)


def bounce_buffer_size() -> int:
    """Size of each pinned bounce buffer in bytes."""
    return get("bounce_buffer_size")


def bounce_buffer_size_reset(nbytes: int) -> None:
    """Sets the bounce buffer size (any size above zero)."""
    set("bounce_buffer_size", nbytes)


def set_bounce_buffer_size(nbytes: int) -> ConfigContextManager:
    """Sets the bounce buffer size; usable as a context manager."""
    return set("bounce_buffer_size", nbytes)


