"""Type stubs of the Rust extension module ``gpumapio._native`` (see python/src/)."""

import builtins
import os
from collections.abc import Sequence
from typing import IO, Any, Literal, Union, final

from typing_extensions import Self

from gpumapio.remote_file import RemoteEndpointType

_Path = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
_File = Union[_Path, int, IO[bytes]]
#: CuPy / PyTorch / Numba arrays (``__cuda_array_interface__``), DLPack producers, or host
#: memory through the buffer protocol (NumPy, bytearray, memoryview; bytes as a source).
_Buffer = Any

__all__ = [
    "UnavailableError",
    "CudaError",
    "CuFileError",
    "OutOfBudgetError",
    "CuFile",
    "IOFuture",
    "IOFutureStream",
    "Mmap",
    "RemoteFile",
    "RemoteObjects",
    "RemotePrefix",
    "RemoteWriter",
    "infer_endpoint_kind",
    "defaults_get",
    "defaults_set",
    "defaults_saved",
    "defaults_put_back",
    "is_compat_mode_preferred",
    "settings_table",
    "Stream",
    "Handle",
    "BufferRegistration",
    "driver_open",
    "driver_properties",
    "driver_set_max_cache_size",
    "driver_set_max_direct_io_size",
    "driver_set_max_pinned_mem_size",
    "driver_set_poll_mode",
    "library_version",
    "buf_register",
    "capabilities",
    "gpu_count",
    "flush_writable_maps",
    "stop_attaching",
    "wait_for_all_writes",
    "read_files",
    "start_read_files",
    "FilesRead",
    "plain_header",
    "plain_index",
    "plain_index_files",
    "plain_headers",
    "LockedRange",
    "residency",
    "warm",
    "evict",
    "drop_all",
    "lock",
    "page_size",
    "DeviceCache",
    "MappedFile",
    "View",
    "LookupScope",
    "__version__",
]

__version__: str

class UnavailableError(RuntimeError):
    """What the call needs is missing here (CUDA driver, GPU, cuFile); the message says why."""

class CudaError(OSError, RuntimeError):
    """A CUDA driver call failed (a RuntimeError too, as KvikIO raises)."""

    op: str
    code: int
    name: str

class CuFileError(OSError, RuntimeError):
    """A cuFile call failed (a RuntimeError too, as KvikIO raises)."""

    op: str
    code: int
    name: str

class OutOfBudgetError(MemoryError):
    """Device memory for a mapping or cache would exceed its budget."""

@final
class IOFuture:
    """The result of ``CuFile.pread`` / ``pwrite``."""

    def get(self) -> int:
        """Waits (GIL released) and returns the bytes moved; raises the transfer's error. Any
        thread, any number of times."""
    def done(self) -> bool:
        """Whether the transfer is done."""

@final
class IOFutureStream:
    """The result of a stream-ordered transfer; keep it alive until ``check_bytes_done()``."""

    def check_bytes_done(self) -> int:
        """Waits for the transfer and returns the bytes moved."""
    def done(self) -> bool: ...

@final
class RemoteFile:
    """A read-only S3, GCS or Azure object or HTTP(S) URL, read with parallel ranged GETs into
    host or device memory. Open it with a constructor."""

    @staticmethod
    def open_http(
        url: str,
        nbytes: int | None = None,
        *,
        http_max_attempts: int | None = None,
        http_status_codes: Sequence[int] | None = None,
        http_timeout: float | None = None,
        max_in_flight: int | None = None,
        request_size: int | None = None,
    ) -> RemoteFile: ...
    @staticmethod
    def open_s3(
        bucket_name: str,
        object_name: str,
        nbytes: int | None = None,
        aws_region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_endpoint_url: str | None = None,
        aws_session_token: str | None = None,
        *,
        aws_region: str | None = None,
        http_max_attempts: int | None = None,
        http_status_codes: Sequence[int] | None = None,
        http_timeout: float | None = None,
        max_in_flight: int | None = None,
        request_size: int | None = None,
    ) -> RemoteFile: ...
    @staticmethod
    def open_s3_url(
        url: str,
        nbytes: int | None = None,
        aws_region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_endpoint_url: str | None = None,
        aws_session_token: str | None = None,
        *,
        aws_region: str | None = None,
        http_max_attempts: int | None = None,
        http_status_codes: Sequence[int] | None = None,
        http_timeout: float | None = None,
        max_in_flight: int | None = None,
        request_size: int | None = None,
    ) -> RemoteFile: ...
    @staticmethod
    def open_s3_public(
        url: str,
        nbytes: int | None = None,
        *,
        aws_region: str | None = None,
        aws_endpoint_url: str | None = None,
        http_max_attempts: int | None = None,
        http_status_codes: Sequence[int] | None = None,
        http_timeout: float | None = None,
        max_in_flight: int | None = None,
        request_size: int | None = None,
    ) -> RemoteFile:
        """An S3 object anyone may read (``s3://`` or an ``http(s)://`` S3 URL), unsigned."""
    @staticmethod
    def open_s3_presigned_url(
        presigned_url: str,
        nbytes: int | None = None,
        *,
        http_max_attempts: int | None = None,
        http_status_codes: Sequence[int] | None = None,
        http_timeout: float | None = None,
        max_in_flight: int | None = None,
        request_size: int | None = None,
    ) -> RemoteFile: ...
    @staticmethod
    def open_webhdfs(
        url: str,
        nbytes: int | None = None,
        *,
        http_max_attempts: int | None = None,
        http_status_codes: Sequence[int] | None = None,
        http_timeout: float | None = None,
        max_in_flight: int | None = None,
        request_size: int | None = None,
    ) -> RemoteFile:
        """A WebHDFS file (``http(s)://namenode:port/webhdfs/v1/<path>`` or ``webhdfs://``)."""
    @staticmethod
    def open(
        url: str,
        remote_endpoint_type: object = None,
        allow_list: Sequence[object] | None = None,
        nbytes: int | None = None,
        *,
        aws_region: str | None = None,
        aws_endpoint_url: str | None = None,
        http_max_attempts: int | None = None,
        http_status_codes: Sequence[int] | None = None,
        http_timeout: float | None = None,
        max_in_flight: int | None = None,
        request_size: int | None = None,
    ) -> RemoteFile: ...
    def nbytes(self) -> int:
        """The object's size in bytes."""
    def remote_endpoint_type(self) -> RemoteEndpointType:
        """How the file is read (``S3``, ``S3_PUBLIC``, ``S3_PRESIGNED_URL``, ``WEBHDFS``, ``HTTP``)."""
    @property
    def url(self) -> str:
        """The URL, without credentials or query string."""
    def read(self, buf: _Buffer, size: int | None = None, file_offset: int = 0) -> int:
        """Reads ``size`` bytes (default: the buffer's) at ``file_offset``; returns the count."""
    def pread(self, buf: _Buffer, size: int | None = None, file_offset: int = 0) -> IOFuture:
        """Starts ``read`` in the background."""
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> None: ...

@final
class RemotePrefix:
    """The objects under ``s3://bucket/prefix/`` (or ``gs://``, ``az://``) as a directory: listed, sized, opened,
    written and deleted through one client (docs/remote.md). ``unsigned`` left out: signed
    where credentials are configured, else unsigned where the bucket lists to anyone."""

    def __new__(
        cls,
        url: str,
        *,
        unsigned: bool | None = None,
        aws_region: str | None = None,
        aws_endpoint_url: str | None = None,
        http_max_attempts: int | None = None,
        http_status_codes: Sequence[int] | None = None,
        http_timeout: float | None = None,
        max_in_flight: int | None = None,
        request_size: int | None = None,
    ) -> Self: ...
    @property
    def url(self) -> str:
        """``s3://bucket/prefix/``."""
    @property
    def unsigned(self) -> bool:
        """Whether its requests go unsigned."""
    def url_of(self, name: str) -> str:
        """The URL of the object ``name``."""
    def open(self, name: str, nbytes: int | None = None) -> RemoteFile:
        """Opens the object ``name`` for reading."""
    def create(self, name: str, *, part_size: int | None = None) -> RemoteWriter:
        """Starts writing the object ``name``."""
    def size(self, name: str) -> int | None:
        """The object's size, or ``None`` where there is none."""
    def list(self, under: str = "") -> RemoteObjects:
        """``(name, size)`` of every object under ``under``, in key order."""
    def list_dir(self, under: str = "") -> tuple[builtins.list[tuple[str, int]], builtins.list[str]]:
        """One level: its objects' ``(name, size)`` and the names of the levels below."""
    def delete(self, names: Sequence[str]) -> None:
        """Deletes the named objects; names with no object are no error."""

@final
class RemoteObjects:
    """``(name, size)`` pairs of a listing, one page asked at a time."""

    def __iter__(self) -> Self: ...
    def __next__(self) -> tuple[str, int]: ...

@final
class RemoteWriter:
    """A new S3, GCS or Azure object written from host or device memory as a multipart upload:
    whole at ``finish()``, or not at all (docs/remote.md)."""

    def __new__(
        cls,
        url: str,
        *,
        part_size: int | None = None,
        max_in_flight: int | None = None,
        aws_region: str | None = None,
        aws_endpoint_url: str | None = None,
        http_max_attempts: int | None = None,
        http_status_codes: Sequence[int] | None = None,
        http_timeout: float | None = None,
    ) -> Self: ...
    def write(self, buf: _Buffer, size: int | None = None, file_offset: int = 0) -> int:
        """Writes ``size`` bytes (default: the buffer's) at ``file_offset``; returns the count."""
    def finish(self) -> int:
        """Completes the upload; returns the object's size."""
    def abort(self) -> None:
        """Abandons the upload: no object is written."""
    def nbytes(self) -> int:
        """One past the highest byte written so far."""
    @property
    def part_size(self) -> int: ...
    @property
    def url(self) -> str:
        """The URL, without credentials."""
    def close(self) -> None:
        """Aborts an unfinished upload and lets the writer go."""
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool: ...

@final
class CuFile:
    """A file opened for parallel reads and writes into and out of GPU or host memory.

    ``flags``: ``"r"``, ``"w"``, ``"r+"``, ``"w+"`` (``b`` ignored); ``"a"`` and ``"a+"`` are
    refused (``ValueError``), as KvikIO refuses them: every write names its offset.
    """

    def __new__(cls, file: _Path, flags: str = "r") -> Self: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def fileno(self) -> int: ...
    def open_flags(self) -> int:
        """``fcntl(fd, F_GETFL)``."""
    def nbytes(self) -> int:
        """Size of the file in bytes."""
    def is_direct_io_supported(self) -> bool: ...
    def compat_decision(self) -> tuple[Literal["cufile", "posix"], str]:
        """Which path device transfers take, and why."""
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool: ...
    def pread(
        self, buf: _Buffer, size: int | None = None, file_offset: int = 0, task_size: int | None = None
    ) -> IOFuture:
        """Starts reading ``size`` bytes (default: the buffer's size) at ``file_offset``."""
    def pwrite(
        self, buf: _Buffer, size: int | None = None, file_offset: int = 0, task_size: int | None = None
    ) -> IOFuture:
        """Starts writing ``size`` bytes (default: the buffer's size) at ``file_offset``."""
    def read(
        self, buf: _Buffer, size: int | None = None, file_offset: int = 0, task_size: int | None = None
    ) -> int:
        """Blocking ``pread``: returns the bytes read (fewer only at the end of the file)."""
    def write(
        self, buf: _Buffer, size: int | None = None, file_offset: int = 0, task_size: int | None = None
    ) -> int:
        """Blocking ``pwrite``: returns the bytes written."""
    def raw_read(self, buf: _Buffer, size: int | None = None, file_offset: int = 0, dev_offset: int = 0) -> int: ...
    def raw_write(self, buf: _Buffer, size: int | None = None, file_offset: int = 0, dev_offset: int = 0) -> int: ...
    def raw_read_async(
        self,
        buf: _Buffer,
        raw_stream: Union[int, Stream],
        size: int | None = None,
        file_offset: int = 0,
        dev_offset: int = 0,
    ) -> IOFutureStream: ...
    def raw_write_async(
        self,
        buf: _Buffer,
        raw_stream: Union[int, Stream],
        size: int | None = None,
        file_offset: int = 0,
        dev_offset: int = 0,
    ) -> IOFutureStream: ...

@final
class Mmap:
    """KvikIO's host-mmap reader, over gpumap's parallel page-cache reads."""

    def __new__(
        cls,
        file_path: _Path,
        flags: str = "r",
        initial_map_size: int | None = None,
        initial_map_offset: int = 0,
        mode: int = 0o644,
        map_flags: int | None = None,
    ) -> Self: ...
    def initial_map_size(self) -> int: ...
    def initial_map_offset(self) -> int: ...
    def file_size(self) -> int: ...
    def close(self) -> None: ...
    def closed(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool: ...
    def read(self, buf: _Buffer, size: int | None = None, offset: int = 0) -> int: ...
    def pread(self, buf: _Buffer, size: int | None = None, offset: int = 0, task_size: int | None = None) -> IOFuture: ...
def wait_for_all_writes() -> None:
    """Waits for every write a file's futures started in this process before the call (run at
    exit)."""
def stop_attaching() -> None:
    """From now on gpumap's own threads never ask for the GIL (run last at exit)."""
def flush_writable_maps() -> None:
    """Flushes every writable map still alive in this process (run at exit); a failure is a
    ``RuntimeWarning``."""
def read_files(buf: _Buffer, files: Sequence[CuFile], pieces: Sequence[tuple[int, int, int, int, int, int]]) -> list[int]:
    """Reads ``pieces`` — ``(file index, file offset, size, buffer offset, count, stride)``
    each: ``count`` runs of ``size`` bytes, the ``k``-th at ``file offset + k * stride``, back
    to back in the buffer — of ``files`` into ``buf``, every file's reads in flight together in
    one pipeline; returns each piece's count (short only where its file ends first)."""

def start_read_files(buf: _Buffer, files: Sequence[CuFile], pieces: Sequence[tuple[int, int, int, int, int, int]]) -> FilesRead:
    """``read_files`` started and left running; ``wait()`` gives the counts."""

@final
class FilesRead:
    """A ``read_files`` in flight; the buffer and files stay referenced until it ends. Close
    the files only after ``wait()``."""

    def wait(self) -> list[int]:
        """Waits (GIL released, Ctrl-C cancels) and returns each piece's count; only once."""
    def cancel(self) -> None:
        """Skips the tasks not started; ``wait()`` then raises the cancellation."""

def plain_header(
    raw: bytes, data_start: int, file_size: int
) -> tuple[list[str], list[str], list[tuple[int, ...]], list[int], list[int], dict[str, str] | None] | None:
    """The tensors of a safetensors header in the common case, as columns in file order —
    names, dtypes, shapes, starts, ends (absolute) — and its metadata; None for any other
    header."""

def plain_index(raw: bytes) -> dict[str, Any] | None:
    """A checkpoint index as ``json.loads`` reads it, for the common case (a ``weight_map`` of
    names to files, a ``metadata`` of strings and sizes, no escapes); None for any other."""

def plain_index_files(raw: bytes) -> list[str] | None:
    """The files an index names, each once, in the order of their first tensor (no object per
    tensor), for an index ``plain_index`` reads or declines only for a name given twice; None
    for any other."""

def plain_headers(
    headers: list[tuple[bytes, int, int]], index: tuple[bytes, dict[str, int]] | None = None, threads: int | None = None
) -> tuple[
    list[tuple[list[str], list[str], list[tuple[int, ...]], list[int], list[int], dict[str, str] | None] | None],
    tuple[dict[str, Any] | None] | None,
]:
    """Each of ``headers`` (``(raw, data_start, file_size)``) as ``plain_header`` reads it,
    read on several threads without the GIL; with ``index`` (an index's bytes, and each file
    name it uses to its shard's number, numbered as ``headers``): ``(metadata,)`` where it maps
    every header's names to that header's shard and no other name, else None. ``threads``: at
    most this many parse (1: the calling one alone)."""

def infer_endpoint_kind(url: str, allow_list: Sequence[object] | None = None) -> str:
    """The ``RemoteEndpointType`` name ``RemoteFile.open`` takes ``url`` as; ``ValueError`` if none."""
def defaults_get(name: str) -> Any: ...
def defaults_set(name: str, value: Any) -> None: ...
def defaults_saved(name: str) -> tuple[Any, str, str | None]: ...
def defaults_put_back(name: str, value: Any, kind: str, var: str | None = None) -> None: ...
def is_compat_mode_preferred() -> bool: ...
def settings_table() -> list[dict[str, str]]: ...

@final
class Stream:
    """A CUDA stream of gpumap's (non-blocking) on ``device``."""

    def __new__(cls, device: int = 0) -> Self: ...
    @property
    def device(self) -> int: ...
    def synchronize(self) -> None: ...

@final
class Handle:
    """A file registered with cuFile."""

    def __new__(cls, file: _Path, flags: str = "r") -> Self: ...
    @property
    def path(self) -> str: ...
    def deregister(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool: ...
    def read(self, buf: _Buffer, size: int | None = None, file_offset: int = 0, dev_offset: int = 0) -> int: ...
    def write(self, buf: _Buffer, size: int | None = None, file_offset: int = 0, dev_offset: int = 0) -> int: ...
    def read_batch(
        self, entries: list[Union[tuple[_Buffer, int], tuple[_Buffer, int, int]]]
    ) -> list[Union[int, BaseException]]: ...
    def read_async(
        self, buf: _Buffer, stream: Stream, size: int | None = None, file_offset: int = 0, dev_offset: int = 0
    ) -> IOFutureStream: ...
    def write_async(
        self, buf: _Buffer, stream: Stream, size: int | None = None, file_offset: int = 0, dev_offset: int = 0
    ) -> IOFutureStream: ...

@final
class BufferRegistration:
    """Device memory registered with cuFile."""

    @property
    def address(self) -> int: ...
    @property
    def length(self) -> int: ...
    def deregister(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool: ...

def driver_open() -> None: ...
def driver_properties() -> dict[str, Any]: ...
def driver_set_poll_mode(poll: bool, threshold_kb: int) -> None: ...
def driver_set_max_direct_io_size(kb: int) -> None: ...
def driver_set_max_cache_size(kb: int) -> None: ...
def driver_set_max_pinned_mem_size(kb: int) -> None: ...
def library_version() -> tuple[int, int]: ...
def buf_register(buf: _Buffer) -> BufferRegistration: ...
def capabilities() -> dict[str, Any]: ...
def gpu_count() -> int: ...

@final
class LockedRange:
    """A range held in the page cache with ``mlock``."""

    @property
    def offset(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def locked_bytes(self) -> int: ...
    @property
    def locked(self) -> bool: ...
    def unlock(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool: ...

def residency(
    file: _File, offset: int = 0, length: int | None = None, method: str = "auto"
) -> dict[str, Any]: ...
def warm(file: _File, offset: int = 0, length: int | None = None, wait: bool = False) -> None: ...
def evict(file: _File, offset: int = 0, length: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]: ...
def drop_all(reclaim_dentries: bool = False) -> None: ...
def lock(file: _File, offset: int = 0, length: int | None = None) -> LockedRange: ...
def page_size() -> int: ...

_Advice = Literal["normal", "sequential", "random", "willneed", "dontneed"]

@final
class DeviceCache:
    """One budget of GPU memory (host memory without a GPU) shared by the files opened in it."""

    def __new__(
        cls,
        budget: int,
        *,
        extent_size: int = 65536,
        frame_size: int | None = None,
        device: int | str | None = None,
        shards: int | None = None,
    ) -> Self:
        """``shards``: independent parts of the budget, each with its own lock and LRU list (a
        power of two dividing the budget's frames, two frames or more each); default: one
        under 8 frames, else up to 16. ``frame_size``: default :meth:`default_frame_size`."""
    @staticmethod
    def default_frame_size(budget: int) -> int:
        """The frame size a cache of ``budget`` bytes gets by default: a thirty-second of the
        budget as a power of two, from 8 MiB to 64 MiB."""
    def open(
        self,
        path: _Path,
        *,
        writable: bool = False,
        advice: _Advice = "normal",
        zero_copy: bool | Literal["misses"] | None = None,
        max_pinned: int | None = None,
        read_ahead: int | None = None,
    ) -> MappedFile:
        """Opens ``path`` in this cache. ``zero_copy``: gathers and views read the read-only
        file in place from the host's page cache (the whole file is read and pinned, within
        ``max_pinned`` bytes across the process; default half of physical memory);
        ``"misses"``: row gathers look in the cache first and read only their misses in place.
        ``read_ahead``: bytes a walk reads ahead (default 512 MiB; 0: none)."""
    def stats(self) -> dict[str, Any]: ...
    def flush(self) -> None: ...
    def sync(self) -> None: ...
    def wait_for_admissions(self) -> None: ...
    def lookup_scope(self, stream: object | None = None) -> LookupScope:
        """The directory for kernels of one's own queued on ``stream`` (see
        :class:`LookupScope`)."""
    def gather(self, ranges: Sequence[tuple[MappedFile, int, int]], out: _Buffer) -> None: ...
    @property
    def device(self) -> str: ...

@final
class MappedFile:
    """A file mapped into GPU memory: views, gathers, write-back."""

    @staticmethod
    def open(
        path: _Path,
        *,
        budget: int | None = None,
        writable: bool = False,
        extent_size: int = 65536,
        frame_size: int | None = None,
        device: int | str | None = None,
        advice: _Advice = "normal",
        zero_copy: bool | Literal["misses"] | None = None,
        max_pinned: int | None = None,
        read_ahead: int | None = None,
    ) -> MappedFile:
        """Maps ``path`` in a cache of its own of ``budget`` bytes (default: the file's size, up
        to 4 GiB, in whole frames of the size that budget gets) — :func:`gpumapio.map` without
        ``cache``."""
    def __len__(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def path(self) -> os.PathLike[str] | str:
        """The path it was opened with (a ``pathlib.Path``), or a remote object's URL (``str``)."""
    @property
    def writable(self) -> bool: ...
    @property
    def base(self) -> int | None: ...
    @property
    def cache(self) -> DeviceCache: ...
    def view(self, offset: int, length: int, *, writable: bool = False) -> View: ...
    def read(self, offset: int, length: int) -> bytes: ...
    def write(self, offset: int, data: _Buffer) -> None: ...
    def gather(self, offsets: Sequence[int], length: int, out: _Buffer) -> None: ...
    def gather_rows(
        self, indices: _Buffer, row_size: int, out: _Buffer, *, stream: object | None = None
    ) -> None: ...
    def prefetch(self, offset: int, length: int) -> IOFuture: ...
    def advise(self, offset: int, length: int, advice: _Advice) -> None: ...
    def flush(self) -> None: ...
    def flush_range(self, offset: int, length: int) -> None: ...
    def sync(self) -> None: ...
    def evict(self) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def stats(self) -> dict[str, Any]: ...
    def wait_for_admissions(self) -> None: ...
    def lookup_scope(self, stream: object | None = None) -> LookupScope:
        """The directory of the file's cache for kernels of one's own, with ``file``."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> bool: ...

@final
class LookupScope:
    """A GPU cache's directory handed to kernels of one's own (``gpumap_table.h`` in
    :func:`gpumapio.include_dir`): while it lives no slot a lookup can find is reused; leaving
    it (or :meth:`end`) waits for its stream."""

    @property
    def table(self) -> int:
        """The device address of the cache's ``gpumap_table``."""
    @property
    def file(self) -> int:
        """The number a :class:`MappedFile` scope's extents are keyed by."""
    def file_number(self, mapped: MappedFile) -> int: ...
    def end(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> bool: ...

@final
class View:
    """A resident, pinned range of a mapped file, exported without a copy."""

    @property
    def offset(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...
    @property
    def writable(self) -> bool: ...
    @property
    def ptr(self) -> int | None: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def tobytes(self) -> bytes: ...
    def write(self, data: _Buffer, at: int = 0) -> None: ...
    def release(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> bool: ...
