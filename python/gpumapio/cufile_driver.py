"""Low-level cuFile (GPUDirect Storage), as cuda-python's cuFile bindings and KvikIO's
``kvikio.cufile_driver`` offer it, where gpumap has it.

- :func:`driver_open` / :func:`driver_close` / :func:`initialize`; :func:`libcufile_version`.
- :data:`properties`: KvikIO's property accessors (``properties.is_gds_available``,
  ``major_version``, ``minor_version``, ``allow_compat_mode``, ``per_buffer_cache_size``, and the
  settable ``poll_mode``, ``poll_thresh_size``, ``max_device_cache_size``,
  ``max_pinned_memory_size``); :func:`get` and :func:`set` by name, ``set`` returning a context
  manager that restores the old values, as :func:`gpumapio.defaults.set` does. Calling
  ``properties()`` gives gpumap's :class:`DriverProperties` record.
- :class:`Handle`: a file registered with cuFile (``cuFileHandleRegister``): ``read`` /
  ``write`` (``cuFileRead`` / ``cuFileWrite``), ``read_batch`` (the batch API),
  ``read_async`` / ``write_async`` on a :class:`Stream` (``cuFileReadAsync`` /
  ``cuFileWriteAsync``).
- :func:`buf_register`: device memory registered with cuFile (``cuFileBufRegister``).

Everything here needs cuFile; without it calls raise :class:`gpumapio.UnavailableError` with
the reason. :class:`gpumapio.CuFile` needs none of this: it picks cuFile or POSIX by itself.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, overload

from gpumapio import _native
from gpumapio._restoring import Restoring, config_of
from gpumapio._native import BufferRegistration, Handle, Stream

__all__ = [
    "BufferRegistration",
    "DriverProperties",
    "Handle",
    "Stream",
    "ConfigContextManager",
    "buf_register",
    "driver_close",
    "driver_open",
    "get",
    "initialize",
    "libcufile_version",
    "properties",
    "set",
]


@dataclasses.dataclass(frozen=True)
class DriverProperties:
    """What ``cuFileDriverGetProperties`` reports (``None`` fields: the library does not say)."""

    library: str
    nvfs_version: tuple[int, int] | None = None
    max_direct_io_size: int | None = None
    max_batch_io_size: int | None = None
    status_flags: int | None = None
    feature_flags: int | None = None
    poll_mode: bool | None = None
    allow_compat_mode: bool | None = None
    poll_thresh_size_kb: int | None = None
    max_device_cache_size_kb: int | None = None
    per_buffer_cache_size_kb: int | None = None
    max_pinned_memory_size_kb: int | None = None

    @property
    def is_gds_available(self) -> bool:
        """Whether the nvidia-fs module is loaded (real GPUDirect Storage DMA)."""
        return self.nvfs_version is not None and self.nvfs_version != (0, 0)


def driver_open() -> None:
    """Opens the cuFile driver (once per process; later calls return at once)."""
    _native.driver_open()


def driver_close() -> None:
    """Accepted for KvikIO compatibility; gpumap keeps the driver open for the life of the
    process (handles and registrations may still use it), so this does nothing."""
    return None


def initialize() -> None:
    """Opens the driver now rather than at the first transfer."""
    driver_open()


def libcufile_version() -> tuple[int, int]:
    """The cuFile library's version as ``(major, minor)`` (``cuFileGetVersion``; the driver is
    not opened). ``(0, 0)`` where no cuFile library loads, or one older than 1.8."""
    return tuple(_native.library_version())  # type: ignore[return-value]


def _record() -> DriverProperties:
    return DriverProperties(**_native.driver_properties())


class _Properties:
    """KvikIO's ``cufile_driver.properties``: the opened driver's properties as attributes.

    Reading one opens the driver (``UnavailableError``, a ``RuntimeError``, with the reason
    where cuFile cannot be used), except ``is_gds_available``, which is then ``False``. The
    sizes are in KiB, as cuFile and KvikIO give them.

    Setting one opens the driver too (so without cuFile it raises as reading does, as KvikIO
    does), applies the value through cuFile's driver API, as KvikIO does
    (``cuFileDriverSetPollMode`` for ``poll_mode`` and ``poll_thresh_size``, with the other of
    the two as it stands; ``cuFileDriverSetMaxCacheSize``; ``cuFileDriverSetMaxPinnedMemSize``),
    and records it: reading it back gives the value set, since cuFile reports its properties
    as they were when the driver opened. A ``CuFileError`` (a ``RuntimeError``) where cuFile
    refuses the value, which is then not recorded. Where the cuFile library is too old to have
    the call, the value is only recorded. gpumap moves data in its own tasks and buffers, so
    these change only what cuFile does in the transfers gpumap hands it.
    """

    _SETTABLE = {
        "poll_mode": "poll_mode",
        "poll_thresh_size": "poll_thresh_size_kb",
        "max_device_cache_size": "max_device_cache_size_kb",
        "max_pinned_memory_size": "max_pinned_memory_size_kb",
    }
    _READ_ONLY = ("is_gds_available", "major_version", "minor_version", "allow_compat_mode",
                  "per_buffer_cache_size")

    def __init__(self) -> None:
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_set", {})

    def __call__(self) -> DriverProperties:
        """gpumap's record of the opened driver (its older ``properties()`` function)."""
        return _record()

    def __dir__(self) -> list[str]:
        return sorted([*self._SETTABLE, *self._READ_ONLY])

    def __getattr__(self, name: str) -> Any:
        if name == "is_gds_available":
            try:
                return _record().is_gds_available
            except RuntimeError:
                return False
        if name in ("major_version", "minor_version"):
            version = _record().nvfs_version or (0, 0)
            return version[0] if name == "major_version" else version[1]
        if name in ("allow_compat_mode", "per_buffer_cache_size"):
            field = "allow_compat_mode" if name == "allow_compat_mode" else "per_buffer_cache_size_kb"
            return getattr(_record(), field)
        if name in self._SETTABLE:
            record = _record()  # opens the driver, or says why it cannot
            with self._lock:
                return self._current(name, record)
        raise AttributeError(f"cuFile driver property {name!r} does not exist")

    def _current(self, name: str, record: DriverProperties) -> Any:
        """The value set last, else the driver's; the caller holds the lock."""
        if name in self._set:
            return self._set[name]
        return getattr(record, self._SETTABLE[name])

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._READ_ONLY:
            raise AttributeError(f"cuFile driver property {name!r} is read-only")
        if name not in self._SETTABLE:
            raise AttributeError(f"cuFile driver property {name!r} does not exist")
        if name == "poll_mode":
            if not isinstance(value, (bool, int)):
                raise TypeError(f"poll_mode has incorrect type (expected bool, got {type(value).__name__})")
            value = bool(value)
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} has incorrect type (expected int, got {type(value).__name__})")
            if value < 0:
                raise OverflowError(f"{name} {value}: can't convert negative value to an unsigned size")
        record = _record()  # as KvikIO: setting needs the driver
        # Under the lock, so that the poll mode and its threshold go to cuFile as a pair.
        with self._lock:
            try:
                if name == "poll_mode":
                    _native.driver_set_poll_mode(value, self._current("poll_thresh_size", record) or 0)
                elif name == "poll_thresh_size":
                    _native.driver_set_poll_mode(bool(self._current("poll_mode", record)), value)
                elif name == "max_device_cache_size":
                    _native.driver_set_max_cache_size(value)
                else:
                    _native.driver_set_max_pinned_mem_size(value)
            except _native.UnavailableError:
                pass  # the driver is open (above), so the library lacks the call: recorded only
            self._set[name] = value


properties = _Properties()


class ConfigContextManager(Restoring):
    """Returned by :func:`set`: the new values are in force already; used in a ``with``
    statement, the old values come back when the block ends."""

    __slots__ = ()

    def __init__(self, config: dict[str, Any]) -> None:
        for name in config:
            if name in _Properties._READ_ONLY:
                raise KeyError("This property is read-only.")
            if name not in _Properties._SETTABLE:
                raise KeyError(name)
        super().__init__(
            config,
            lambda name: getattr(properties, name),
            lambda name, value: setattr(properties, name, value),
        )


@overload
def set(config: dict[str, Any], /) -> ConfigContextManager: ...
@overload
def set(key: str, value: Any, /) -> ConfigContextManager: ...


def set(*config: Any) -> ConfigContextManager:
    """Sets settable driver properties (``set(name, value)`` or ``set({name: value})``) now;
    the result restores the old values at the end of a ``with`` block. Unknown and read-only
    names raise ``KeyError``."""
    return ConfigContextManager(config_of(config, "gpumapio.cufile_driver.set"))


def get(config_name: str) -> Any:
    """A driver property by name (``KeyError`` for unknown names)."""
    if config_name not in _Properties._SETTABLE and config_name not in _Properties._READ_ONLY:
        raise KeyError(config_name)
    return getattr(properties, config_name)


def buf_register(buf) -> BufferRegistration:
    """Registers the device memory of ``buf`` with cuFile until ``deregister()`` (or the end of
    a ``with`` block)."""
    return _native.buf_register(buf)
