//! `CuFile`: KvikIO's file handle, over [`gpumap::io::FileHandle`].

use std::os::fd::AsRawFd;
use std::path::PathBuf;

use gpumap::io::{FileHandle, OpenFlags};
use gpumap::sync::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::buffers::Keeper;
use crate::buffers::{destination, memory, source, span, OwnedDst, OwnedSrc};
use crate::cufile::Stream;
use crate::defaults;
use crate::errors::{check, nogil, wait_interruptibly};
use crate::future::{IOFuture, IOFutureStream, Pending};

/// A blocking read of `dst` at `offset`. One task's worth runs on the calling thread, as it
/// did; a longer read runs on the pool while this thread waits in steps, so that Ctrl-C stops
/// it between tasks (see [`wait_interruptibly`]).
pub(crate) fn read_blocking(
    py: Python<'_>,
    handle: &FileHandle,
    mut dst: OwnedDst,
    offset: u64,
) -> PyResult<usize> {
    if dst.view().len() as u64 <= handle.task_size() {
        let n = nogil(py, || handle.read_device(dst.view(), offset));
        drop(dst);
        return n;
    }
    let (dst, n) = wait_interruptibly(py, handle.pread_device(dst, offset))?;
    drop(dst);
    Ok(n)
}

/// A blocking write of `src` at `offset`, interruptible as [`read_blocking`] is.
fn write_blocking(
    py: Python<'_>,
    handle: &FileHandle,
    src: OwnedSrc,
    offset: u64,
) -> PyResult<usize> {
    if src.view().len() as u64 <= handle.task_size() {
        let n = nogil(py, || handle.write_device(src.view(), offset));
        drop(src);
        return n;
    }
    let (src, n) = wait_interruptibly(py, handle.pwrite_device(src, offset))?;
    drop(src);
    Ok(n)
}

/// The error of a stream-ordered transfer the file's open mode does not allow, if it is one.
/// KvikIO raises it when the result is checked (`check_bytes_done`), not when the transfer is
/// queued, so the stream calls hand it to their future instead of raising it.
fn refused_by_mode(handle: &FileHandle, mode: &str, read: bool) -> Option<gpumap::Error> {
    let flags = handle.flags();
    let allowed = if read { flags.read } else { flags.write };
    (!allowed).then(|| gpumap::Error::AccessMode {
        path: handle.path().to_path_buf(),
        mode: mode.to_string(),
        op: if read { "reading" } else { "writing" },
    })
}

/// A stream-ordered transfer on one of gpumap's streams, and the memory it uses.
struct StreamPending {
    transfer: gpumap::io::StreamTransfer<'static>,
    keep: Keeper,
}

impl Pending for StreamPending {
    fn is_done(&self) -> bool {
        false
    }

    fn wait(self: Box<Self>) -> (gpumap::Result<usize>, Option<Box<dyn std::any::Any + Send>>) {
        let StreamPending { transfer, keep } = *self;
        (transfer.wait(), Some(Box::new(keep)))
    }
}

/// A file opened for parallel reads and writes into and out of GPU memory (or host memory).
///
/// `CuFile(path, flags="r")` with `fopen` flags `r`, `w`, `r+`, `w+` (`b` ignored; `a` and
/// `a+` are refused, as KvikIO refuses them).
/// Buffers are anything with `__cuda_array_interface__` (CuPy, PyTorch, Numba) or
/// `__dlpack__`, or host memory through the buffer protocol (NumPy, bytearray, memoryview).
#[pyclass(module = "gpumapio", name = "CuFile", frozen)]
pub struct CuFile {
    path: PathBuf,
    flags: String,
    /// `None` once closed.
    handle: Mutex<Option<FileHandle>>,
    /// Handles on the same file with other task sizes / GDS thresholds (see `handle_for`).
    variants: Mutex<Vec<FileHandle>>,
}

fn closed_error() -> PyErr {
    PyValueError::new_err("I/O operation on a closed CuFile")
}

impl CuFile {
    pub(crate) fn handle(&self) -> PyResult<FileHandle> {
        self.handle.lock().clone().ok_or_else(closed_error)
    }

    /// The handle whose task size and GDS threshold are those of this call: `task_size` when
    /// given, else the current default (KvikIO reads both at each call).
    fn handle_for(&self, py: Python<'_>, task_size: Option<u64>) -> PyResult<FileHandle> {
        let handle = self.handle()?;
        let settings = check(py, defaults::current())?;
        let task_size = match task_size {
            // KvikIO reads 0 as "the default" (`task_size if task_size else ...`).
            Some(n) if n > 0 => n,
            _ if settings.is_explicit("task_size") => settings.task_size,
            _ => handle.task_size(), // as opened: tuned for its file system where not set
        };
        let threshold = settings.gds_threshold;
        if handle.task_size() == task_size && handle.gds_threshold() == threshold {
            return Ok(handle);
        }
        let mut variants = self.variants.lock();
        if let Some(v) =
            variants.iter().find(|v| v.task_size() == task_size && v.gds_threshold() == threshold)
        {
            return Ok(v.clone());
        }
        let variant = check(py, handle.with_transfer_sizes(task_size, threshold))?;
        if variants.len() >= 8 {
            variants.remove(0);
        }
        variants.push(variant.clone());
        Ok(variant)
    }
}

#[pymethods]
impl CuFile {
    #[new]
    #[pyo3(signature = (file, flags = "r"))]
    fn new(
        py: Python<'_>,
        #[pyo3(from_py_with = crate::paths::path)] file: PathBuf,
        flags: &str,
    ) -> PyResult<CuFile> {
        // Every write of a CuFile names its offset, which a file opened for appending refuses;
        // KvikIO refuses the flag at open too.
        match flags.parse::<OpenFlags>() {
            Ok(parsed) if parsed.append => {
                return Err(PyValueError::new_err(format!(
                    "Open flag '{flags}' isn't supported: CuFile writes at offsets, which a \
                     file opened for appending cannot; open it \"r+\" and write at its size \
                     (nbytes())"
                )))
            }
            Ok(_) => {}
            // The library's own list names the appending flags, which a CuFile refuses.
            Err(_) => {
                return Err(PyValueError::new_err(format!(
                    "Unknown file open flag: invalid open flags {flags:?}: expected one of r, \
                     w, r+, w+"
                )))
            }
        }
        let options = check(py, defaults::handle_options())?;
        let path = file.clone();
        let flags_text = flags.to_string();
        let handle = nogil(py, move || options.open(&path, &flags_text))?;
        Ok(CuFile {
            path: file,
            flags: flags.to_string(),
            handle: Mutex::new(Some(handle)),
            variants: Mutex::new(Vec::new()),
        })
    }

    /// Closes the file, once the writes its futures started have ended (waited for or not):
    /// after `close`, the file holds them. Reads still running keep it open until they are
    /// done.
    fn close(&self, py: Python<'_>) {
        let handle = self.handle.lock().take();
        self.variants.lock().clear();
        if let Some(handle) = handle {
            py.detach(move || handle.wait_for_writes());
        }
    }

    /// Whether the file is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.handle.lock().is_none()
    }

    /// The file descriptor.
    fn fileno(&self) -> PyResult<i32> {
        Ok(self.handle()?.file().as_raw_fd())
    }

    /// The descriptor's flags (`fcntl(fd, F_GETFL)`: `os.O_RDONLY`, `os.O_WRONLY` or
    /// `os.O_RDWR`, with `os.O_APPEND` and the like).
    fn open_flags(&self) -> PyResult<i32> {
        Ok(gpumap::io::descriptor::open_flags(self.handle()?.file())?)
    }

    /// Size of the file in bytes.
    fn nbytes(&self, py: Python<'_>) -> PyResult<u64> {
        let handle = self.handle()?;
        nogil(py, move || handle.len())
    }

    /// Whether the page-aligned middle of transfers can bypass the page cache (`O_DIRECT`).
    fn is_direct_io_supported(&self) -> PyResult<bool> {
        Ok(self.handle()?.direct_io_status().is_ok())
    }

    /// Which path device transfers take and why: `("cufile" | "posix", reason)`. Made at the
    /// first device transfer, or here.
    fn compat_decision(&self, py: Python<'_>) -> PyResult<(String, String)> {
        let handle = self.handle()?;
        nogil(py, move || {
            let d = handle.compat_decision();
            let path = match d.path {
                gpumap::io::IoPath::CuFile => "cufile",
                gpumap::io::IoPath::Posix => "posix",
            };
            Ok((path.to_string(), d.reason.clone()))
        })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: &Bound<'_, PyAny>,
        _exc: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { " (closed)" } else { "" };
        format!("<gpumapio.CuFile {:?} {:?}{state}>", self.path.display().to_string(), self.flags)
    }

    /// Starts reading `size` bytes (default: the buffer's size) at `file_offset` into `buf`, in
    /// parallel; returns an `IOFuture` whose `get()` gives the bytes read (fewer only where the
    /// file ends first).
    #[pyo3(signature = (buf, size = None, file_offset = 0, task_size = None))]
    fn pread(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::kvikio::size_in_memory)] size: Option<usize>,
        #[pyo3(from_py_with = crate::counts::kvikio::file_offset)] file_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::task_size)] task_size: Option<u64>,
    ) -> PyResult<IOFuture> {
        let handle = self.handle_for(py, task_size)?;
        let dst = destination(py, buf, size, 0)?;
        Ok(IOFuture::pending(Box::new(handle.pread_device(dst, file_offset))))
    }

    /// Starts writing `size` bytes (default: the buffer's size) of `buf` at `file_offset`, in
    /// parallel; returns an `IOFuture` whose `get()` gives the bytes written.
    #[pyo3(signature = (buf, size = None, file_offset = 0, task_size = None))]
    fn pwrite(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::kvikio::size_in_memory)] size: Option<usize>,
        #[pyo3(from_py_with = crate::counts::kvikio::file_offset)] file_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::task_size)] task_size: Option<u64>,
    ) -> PyResult<IOFuture> {
        let handle = self.handle_for(py, task_size)?;
        let src = source(py, buf, size, 0)?;
        Ok(IOFuture::pending(Box::new(handle.pwrite_device(src, file_offset))))
    }

    /// Reads `size` bytes (default: the buffer's size) at `file_offset` into `buf`, in
    /// parallel, and returns the bytes read (the blocking `pread`).
    #[pyo3(signature = (buf, size = None, file_offset = 0, task_size = None))]
    fn read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::kvikio::size_in_memory)] size: Option<usize>,
        #[pyo3(from_py_with = crate::counts::kvikio::file_offset)] file_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::task_size)] task_size: Option<u64>,
    ) -> PyResult<usize> {
        let handle = self.handle_for(py, task_size)?;
        let dst = destination(py, buf, size, 0)?;
        read_blocking(py, &handle, dst, file_offset)
    }

    /// Writes `size` bytes (default: the buffer's size) of `buf` at `file_offset`, in parallel,
    /// and returns the bytes written (the blocking `pwrite`).
    #[pyo3(signature = (buf, size = None, file_offset = 0, task_size = None))]
    fn write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::kvikio::size_in_memory)] size: Option<usize>,
        #[pyo3(from_py_with = crate::counts::kvikio::file_offset)] file_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::task_size)] task_size: Option<u64>,
    ) -> PyResult<usize> {
        let handle = self.handle_for(py, task_size)?;
        let src = source(py, buf, size, 0)?;
        write_blocking(py, &handle, src, file_offset)
    }

    /// Reads `size` bytes (default: the rest of the buffer after `dev_offset`) at `file_offset`
    /// into `buf` at `dev_offset`; returns the bytes read. KvikIO's low-level read: gpumap runs
    /// it like `read` (host buffers are accepted too).
    #[pyo3(signature = (buf, size = None, file_offset = 0, dev_offset = 0))]
    fn raw_read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::kvikio::size_in_memory)] size: Option<usize>,
        #[pyo3(from_py_with = crate::counts::kvikio::file_offset)] file_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::dev_offset)] dev_offset: usize,
    ) -> PyResult<usize> {
        let handle = self.handle()?;
        let dst = destination(py, buf, size, dev_offset)?;
        read_blocking(py, &handle, dst, file_offset)
    }

    /// Writes `size` bytes (default: the rest of the buffer after `dev_offset`) of `buf` from
    /// `dev_offset` at `file_offset`; returns the bytes written.
    #[pyo3(signature = (buf, size = None, file_offset = 0, dev_offset = 0))]
    fn raw_write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::kvikio::size_in_memory)] size: Option<usize>,
        #[pyo3(from_py_with = crate::counts::kvikio::file_offset)] file_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::dev_offset)] dev_offset: usize,
    ) -> PyResult<usize> {
        let handle = self.handle()?;
        let src = source(py, buf, size, dev_offset)?;
        write_blocking(py, &handle, src, file_offset)
    }

    /// A read ordered on a CUDA stream. `raw_stream` is a `gpumapio.cufile_driver.Stream` —
    /// then on the cuFile path this is `cuFileReadAsync` and runs when the stream reaches it —
    /// or another stack's stream handle as an int (`cudaStream_t`; 0 or 1 for the legacy
    /// default stream), which is synchronized first so the read sees the work queued on it;
    /// the read is then done when this returns, as KvikIO does on its POSIX path. Device
    /// memory only for a `Stream`. Returns an `IOFutureStream`; `check_bytes_done()` gives the
    /// bytes read.
    #[pyo3(signature = (buf, raw_stream, size = None, file_offset = 0, dev_offset = 0))]
    fn raw_read_async(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        raw_stream: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::kvikio::size_in_memory)] size: Option<usize>,
        #[pyo3(from_py_with = crate::counts::kvikio::file_offset)] file_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::dev_offset)] dev_offset: usize,
    ) -> PyResult<IOFutureStream> {
        let handle = self.handle()?;
        let mut mem = memory(buf, true)?;
        if let Some(refused) = refused_by_mode(&handle, &self.flags, true) {
            return Ok(IOFutureStream::ready(Err(refused)));
        }
        if let Ok(stream) = raw_stream.cast::<Stream>() {
            let len = span(&mem, size, dev_offset)?;
            let (view, keep) = mem.into_cuda_dst(py, dev_offset, len)?;
            let stream: &Stream = stream.get();
            // On the POSIX path the transfer runs before this returns: without the GIL.
            let transfer = nogil(py, || handle.read_async(view, file_offset, &stream.stream))?;
            return Ok(IOFutureStream::pending(Box::new(StreamPending { transfer, keep })));
        }
        let raw_stream = crate::counts::kvikio_count("raw_stream", raw_stream)?;
        crate::buffers::synchronize_foreign(py, &mut mem, raw_stream)?;
        let len = span(&mem, size, dev_offset)?;
        let dst = mem.into_dst(py, dev_offset, len)?;
        Ok(IOFutureStream::ready(Ok(read_blocking(py, &handle, dst, file_offset)?)))
    }

    /// A write ordered on the CUDA stream `raw_stream` (see `raw_read_async`).
    #[pyo3(signature = (buf, raw_stream, size = None, file_offset = 0, dev_offset = 0))]
    fn raw_write_async(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        raw_stream: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::kvikio::size_in_memory)] size: Option<usize>,
        #[pyo3(from_py_with = crate::counts::kvikio::file_offset)] file_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::dev_offset)] dev_offset: usize,
    ) -> PyResult<IOFutureStream> {
        let handle = self.handle()?;
        let mut mem = memory(buf, false)?;
        if let Some(refused) = refused_by_mode(&handle, &self.flags, false) {
            return Ok(IOFutureStream::ready(Err(refused)));
        }
        if let Ok(stream) = raw_stream.cast::<Stream>() {
            let len = span(&mem, size, dev_offset)?;
            let (view, keep) = mem.into_cuda_src(py, dev_offset, len)?;
            let stream: &Stream = stream.get();
            // On the POSIX path the transfer runs before this returns: without the GIL.
            let transfer = nogil(py, || handle.write_async(view, file_offset, &stream.stream))?;
            return Ok(IOFutureStream::pending(Box::new(StreamPending { transfer, keep })));
        }
        let raw_stream = crate::counts::kvikio_count("raw_stream", raw_stream)?;
        crate::buffers::synchronize_foreign(py, &mut mem, raw_stream)?;
        let len = span(&mem, size, dev_offset)?;
        let src = mem.into_src(py, dev_offset, len)?;
        Ok(IOFutureStream::ready(Ok(write_blocking(py, &handle, src, file_offset)?)))
    }
}

/// Waits, without the GIL, for every write a file's futures started in this process (run at
/// exit, registered by `gpumapio`: the pool's threads end with the process, and a `pwrite`
/// whose future was never waited for would be cut short, silently).
#[pyfunction]
pub fn wait_for_all_writes(py: Python<'_>) {
    py.detach(gpumap::io::wait_for_all_writes);
}
