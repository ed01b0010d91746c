"""KvikIO's ``kvikio.cufile`` module: :class:`CuFile` and its futures."""

from gpumapio._native import CuFile, IOFuture, IOFutureStream

__all__ = ["CuFile", "IOFuture", "IOFutureStream"]
