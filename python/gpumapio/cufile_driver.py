"""Low-level cuFile (GPUDirect Storage), as cuda-python's cuFile bindings and KvikIO's
``kvikio.cufile_driver`` offer it, where gpumap has it.

- :func:`driver_open` / :func:`driver_close` / :func:`initialize`; :func:`properties`.
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

from gpumapio import _native
from gpumapio._native import BufferRegistration, Handle, Stream

__all__ = [
    "BufferRegistration",
    "DriverProperties",
    "Handle",
    "Stream",
    "buf_register",
    "driver_close",
    "driver_open",
    "initialize",
    "properties",
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


def properties() -> DriverProperties:
    """The opened driver's library and properties."""
    return DriverProperties(**_native.driver_properties())


def buf_register(buf) -> BufferRegistration:
    """Registers the device memory of ``buf`` with cuFile until ``deregister()`` (or the end of
    a ``with`` block)."""
    return _native.buf_register(buf)
