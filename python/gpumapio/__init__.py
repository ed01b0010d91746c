"""gpumapio: file data into and out of NVIDIA GPU memory as fast as the hardware allows — the
Python face of the Rust library gpumap. Host memory stands in where there is no GPU, so the
same code runs on any Linux machine.

KvikIO's API (code written for ``kvikio`` runs with ``import gpumapio as kvikio``):

- :class:`CuFile` (``read``, ``write``, ``pread``/``pwrite`` returning :class:`IOFuture`,
  ``raw_read``, ``raw_write``, ``raw_read_async``, ``raw_write_async``, ``close``, context
  manager, ``fileno``, ``open_flags``), :class:`CompatMode`, :mod:`gpumapio.defaults`,
  :mod:`gpumapio.cufile_driver`, :mod:`gpumapio.buffer`, :mod:`gpumapio.zarr` (``GDSStore``),
  and the ``KVIKIO_*`` environment variables (``GPUMAP_*`` win where both are set).

- :class:`RemoteFile` and :class:`RemoteEndpointType` (``open_http``, ``open_s3``, ``open_s3_url``, ``open_s3_presigned_url``,
  ``open``; ``read``, ``pread``, ``nbytes``): S3 and HTTP objects read with parallel ranged
  GETs into host or device memory (docs/remote.md).

And beyond it: :func:`read_file_to_device` (a whole file as one CuPy / torch / NumPy array),
:func:`load_safetensors` (a checkpoint as torch tensors, one read into one allocation),
:mod:`gpumapio.pagecache` (residency, warm, evict, drop, lock), :mod:`gpumapio.maps`: files
in GPU memory with mmap semantics under a budget shared by many files (:func:`map`,
:class:`DeviceCache`, views exported through ``__cuda_array_interface__`` and ``__dlpack__``,
:func:`gather` of rows of files far larger than the GPU), and :mod:`gpumapio.pyg`: a PyTorch
Geometric ``FeatureStore`` of tables in mapped files (``import gpumapio.pyg``; not imported
here, as torch and torch_geometric are optional).

Buffers: anything with ``__cuda_array_interface__`` (CuPy, PyTorch, Numba) or ``__dlpack__``,
and host memory through the buffer protocol (NumPy, bytearray, memoryview).
"""

from gpumapio import buffer, cufile_driver, defaults, maps, pagecache
from gpumapio._device import capabilities, gpu_count, read_file_to_device
from gpumapio._native import (
    CudaError,
    CuFile,
    CuFileError,
    IOFuture,
    IOFutureStream,
    OutOfBudgetError,
    RemoteFile,
    UnavailableError,
    __version__,
)
from gpumapio.defaults import CompatMode
from gpumapio.maps import DeviceCache, MappedFile, View, gather, gather_rows, map
from gpumapio.pagecache import drop_file_page_cache, drop_system_page_cache, get_page_cache_info
from gpumapio.remote_file import RemoteEndpointType
from gpumapio.safetensors import load_safetensors

__all__ = [
    "CompatMode",
    "CuFile",
    "CuFileError",
    "CudaError",
    "DeviceCache",
    "IOFuture",
    "IOFutureStream",
    "RemoteEndpointType",
    "RemoteFile",
    "MappedFile",
    "OutOfBudgetError",
    "UnavailableError",
    "View",
    "__version__",
    "buffer",
    "capabilities",
    "cufile_driver",
    "defaults",
    "drop_file_page_cache",
    "drop_system_page_cache",
    "gather",
    "gather_rows",
    "get_page_cache_info",
    "gpu_count",
    "load_safetensors",
    "map",
    "maps",
    "pagecache",
    "read_file_to_device",
]
