"""gpumapio: file data into and out of NVIDIA GPU memory as fast as the hardware allows — the
Python face of the Rust library gpumap. Host memory stands in where there is no GPU, so the
same code runs on any Linux machine.

KvikIO's API (code written for ``kvikio`` runs with ``import gpumapio as kvikio``):

- :class:`Mmap` (KvikIO's host-mmap reader: ``read``, ``pread``, ``file_size``, ``close``,
  ``closed``), :func:`bounce_buffer_free`, :func:`stream_register` / :func:`stream_deregister`,
  :func:`memory_register` / :func:`memory_deregister`, the page-cache helpers;
- :class:`CuFile` (``read``, ``write``, ``pread``/``pwrite`` returning :class:`IOFuture`,
  ``raw_read``, ``raw_write``, ``raw_read_async``, ``raw_write_async``, ``close``, context
  manager, ``fileno``, ``open_flags``), :class:`CompatMode`, :mod:`gpumapio.defaults`,
  :mod:`gpumapio.cufile_driver`, :mod:`gpumapio.buffer`, :mod:`gpumapio.zarr` (``GDSStore``),
  and the ``KVIKIO_*`` environment variables (``GPUMAP_*`` win where both are set).

- :class:`RemoteFile` and :class:`RemoteEndpointType` (``open_http``, ``open_s3``, ``open_s3_url``, ``open_s3_public``,
  ``open_s3_presigned_url``, ``open_webhdfs``, ``open``; ``read``, ``pread``, ``nbytes``,
  ``remote_endpoint_type``): S3, GCS, Azure, HTTP and WebHDFS objects read with parallel
  ranged GETs into host or device memory (docs/remote.md); :class:`RemoteWriter` (``write``,
  ``finish``, ``abort``, context manager): S3, GCS and Azure objects written from host or
  device memory as multipart uploads, whole or not at all; :class:`RemotePrefix` (``list``,
  ``list_dir``, ``size``, ``open``, ``create``, ``delete``): an S3, GCS or Azure prefix used as
  a directory.

And beyond it: :func:`read_file_to_device` (a whole file as one CuPy / torch / NumPy array),
:func:`load_safetensors` (a checkpoint as torch tensors, one read into one allocation),
:func:`load_checkpoint` (a sharded checkpoint — file, directory or index — in one pipeline
into one allocation, with filters, tensor-parallel slices and casts; :func:`load_into_model`),
:mod:`gpumapio.pagecache` (residency, warm, evict, drop, lock), :mod:`gpumapio.maps`: files
in GPU memory with mmap semantics under a budget shared by many files (:func:`map`,
:class:`DeviceCache`, views exported through ``__cuda_array_interface__`` and ``__dlpack__``,
:func:`gather` of rows of files far larger than the GPU), and :mod:`gpumapio.pyg`: a PyTorch
Geometric ``FeatureStore`` of tables in mapped files (``import gpumapio.pyg``; not imported
here, as torch and torch_geometric are optional).

Buffers: anything with ``__cuda_array_interface__`` (CuPy, PyTorch, Numba) or ``__dlpack__``,
and host memory through the buffer protocol (NumPy, bytearray, memoryview).
"""

import atexit

from gpumapio import _native, buffer, cufile_driver, defaults, maps, pagecache, tensor_parallel
from gpumapio._device import capabilities, gpu_count, read_file_to_device
from gpumapio._native import (
    CudaError,
    CuFile,
    CuFileError,
    IOFuture,
    IOFutureStream,
    Mmap,
    OutOfBudgetError,
    RemoteFile,
    RemoteObjects,
    RemotePrefix,
    RemoteWriter,
    UnavailableError,
    __version__,
)
from gpumapio.buffer import bounce_buffer_free, memory_deregister, memory_register
from gpumapio.checkpoint import CheckpointError, load_checkpoint
from gpumapio.cufile import stream_deregister, stream_register
from gpumapio.defaults import CompatMode
from gpumapio.maps import DeviceCache, LookupScope, MappedFile, View, gather, gather_rows, include_dir, map
from gpumapio.models import empty_weights, load_into_model
from gpumapio.pagecache import (
    clear_page_cache,
    drop_file_page_cache,
    drop_system_page_cache,
    get_page_cache_info,
)
from gpumapio.remote_file import RemoteEndpointType
from gpumapio.safetensors import load_safetensors
from gpumapio.tensor_parallel import TensorParallel

__all__ = [
    "CheckpointError",
    "CompatMode",
    "CuFile",
    "CuFileError",
    "CudaError",
    "DeviceCache",
    "IOFuture",
    "IOFutureStream",
    "LookupScope",
    "RemoteEndpointType",
    "RemoteFile",
    "RemoteObjects",
    "RemotePrefix",
    "RemoteWriter",
    "MappedFile",
    "Mmap",
    "OutOfBudgetError",
    "TensorParallel",
    "UnavailableError",
    "View",
    "__version__",
    "bounce_buffer_free",
    "buffer",
    "capabilities",
    "clear_page_cache",
    "cufile_driver",
    "defaults",
    "drop_file_page_cache",
    "empty_weights",
    "drop_system_page_cache",
    "gather",
    "gather_rows",
    "get_page_cache_info",
    "include_dir",
    "gpu_count",
    "load_checkpoint",
    "load_into_model",
    "load_safetensors",
    "map",
    "maps",
    "memory_deregister",
    "memory_register",
    "pagecache",
    "read_file_to_device",
    "stream_deregister",
    "stream_register",
    "tensor_parallel",
]

# A pwrite whose future was never waited for (nor its file closed) runs on the pool's threads,
# which end with the process: the interpreter's exit waits for it, as KvikIO's pool does. A
# writable map that is never released (a daemon thread's, or in a cycle) is flushed at exit,
# as a buffered file is; the exit runs these last registered first. Last of all, gpumap's own
# threads stop asking for the GIL: Python ends a thread that asks for it while the interpreter
# finalizes, which crashes the process (a write started after the exit began ends after that).
atexit.register(_native.stop_attaching)
atexit.register(_native.wait_for_all_writes)
atexit.register(_native.flush_writable_maps)
