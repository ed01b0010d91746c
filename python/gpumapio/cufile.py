"""KvikIO's ``kvikio.cufile`` module: :class:`CuFile` and its futures, and the stream
registration calls."""

from __future__ import annotations

import operator

from gpumapio._native import CuFile, IOFuture, IOFutureStream

__all__ = ["CuFile", "IOFuture", "IOFutureStream", "stream_register", "stream_deregister"]


def stream_register(raw_stream: int, flags: int) -> None:
    """Accepted for KvikIO compatibility (``cuFileStreamRegister``): gpumap's stream-ordered
    transfers need no registration, so this checks its arguments (ints, as KvikIO's are) and
    does nothing more."""
    operator.index(raw_stream)
    operator.index(flags)


def stream_deregister(raw_stream: int) -> None:
    """Accepted for KvikIO compatibility (``cuFileStreamDeregister``); see
    :func:`stream_register`."""
    operator.index(raw_stream)
