"""KvikIO's ``kvikio.buffer``: registering device memory with cuFile by buffer."""

from __future__ import annotations

import threading

from gpumapio import _native
from gpumapio.defaults import is_compat_mode_preferred

__all__ = ["memory_register", "memory_deregister", "bounce_buffer_free"]

_lock = threading.Lock()
_registered: dict[int, _native.BufferRegistration] = {}


def memory_register(buf) -> None:
    """Registers the device memory of ``buf`` with cuFile (as KvikIO: nothing happens where
    compat mode is preferred, since the POSIX path has nothing to register)."""
    if is_compat_mode_preferred():
        return
    registration = _native.buf_register(buf)
    with _lock:
        old = _registered.pop(registration.address, None)
        _registered[registration.address] = registration
    if old is not None:
        old.deregister()


def memory_deregister(buf) -> None:
    """Deregisters memory registered by :func:`memory_register` (unknown memory: nothing, host
    memory included, which :func:`memory_register` passes over where compat mode is preferred)."""
    address = _address(buf)
    if address is None:
        return
    with _lock:
        registration = _registered.pop(address, None)
    if registration is not None:
        registration.deregister()


def bounce_buffer_free() -> int:
    """Accepted for KvikIO compatibility; gpumap keeps its pinned bounce buffers for reuse
    (pinning costs milliseconds), so this frees nothing and returns 0."""
    return 0


def _address(buf) -> int | None:
    """The device address of ``buf``; None for memory without ``__cuda_array_interface__``
    (never registered, since registration takes only device memory)."""
    cai = getattr(buf, "__cuda_array_interface__", None)
    return None if cai is None else int(cai["data"][0])
