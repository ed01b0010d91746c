//! `Mmap`: KvikIO's host-mmap reader (`kvikio.Mmap`), with its signature, methods and errors.
//!
//! KvikIO copies out of a mapping of the file; gpumap reads the same bytes through its own
//! parallel page-cache path ([`FileHandle`] on POSIX, never cuFile), which is faster into device
//! memory and cannot fault (`SIGBUS`) when the file shrinks. What a mapping would bound is kept:
//! reads outside `[initial_map_offset, initial_map_offset + initial_map_size)` raise KvikIO's
//! `IndexError`. `mode` and `map_flags` are taken and checked, and need nothing more here.

use std::path::PathBuf;

use gpumap::config::CompatMode;
use gpumap::io::FileHandle;
use gpumap::sync::Mutex;
use pyo3::exceptions::{PyIndexError, PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::buffers::memory;
use crate::defaults;
use crate::errors::{check, nogil};
use crate::file::read_blocking;
use crate::future::IOFuture;

/// A file opened for reads bounded like KvikIO's memory mapping of it, into host or device
/// buffers: `read` (blocking) and `pread` (an `IOFuture`), in parallel.
#[pyclass(module = "gpumapio", name = "Mmap", frozen)]
pub struct Mmap {
    /// `None` once closed.
    handle: Mutex<Option<FileHandle>>,
    file_size: u64,
    initial_map_size: u64,
    initial_map_offset: u64,
}

fn closed_error() -> PyErr {
    PyRuntimeError::new_err("Cannot read from a closed MmapHandle (gpumapio.Mmap is closed)")
}

impl Mmap {
    fn handle(&self) -> PyResult<FileHandle> {
        self.handle.lock().clone().ok_or_else(closed_error)
    }

    /// The bytes a read of `size` (default: to the end of the file) at `offset` moves, checked
    /// as KvikIO checks it: against the file, the buffer of `buf_len` bytes and the mapped range.
    fn checked_size(&self, size: Option<u64>, offset: u64, buf_len: usize) -> PyResult<u64> {
        if offset > self.file_size {
            return Err(PyIndexError::new_err(format!(
                "Offset is past the end of file. offset: {offset}, file size: {}",
                self.file_size
            )));
        }
        let size = size.unwrap_or(self.file_size - offset);
        if size > buf_len as u64 {
            return Err(PyValueError::new_err(format!(
                "Size is greater than the size of the buffer: {size} bytes asked, the buffer has \
                 {buf_len}"
            )));
        }
        if size == 0 {
            return Ok(0);
        }
        let map_end = self.initial_map_offset + self.initial_map_size;
        if offset < self.initial_map_offset || offset.saturating_add(size) > map_end {
            return Err(PyIndexError::new_err(format!(
                "Read is out of bound. offset: {offset}, actual size to read: {size}, initial \
                 map offset: {}, initial map size: {}",
                self.initial_map_offset, self.initial_map_size
            )));
        }
        Ok(size)
    }
}

#[pymethods]
impl Mmap {
    #[new]
    #[pyo3(signature = (file_path, flags = "r", initial_map_size = None, initial_map_offset = 0,
                        mode = 0o644, map_flags = None))]
    fn new(
        py: Python<'_>,
        #[pyo3(from_py_with = crate::paths::path)] file_path: PathBuf,
        flags: &str,
        #[pyo3(from_py_with = crate::counts::kvikio::initial_map_size)] initial_map_size: Option<
            u64,
        >,
        #[pyo3(from_py_with = crate::counts::kvikio::initial_map_offset)] initial_map_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::mode)] mode: u32,
        #[pyo3(from_py_with = crate::counts::kvikio::map_flags)] map_flags: Option<i32>,
    ) -> PyResult<Mmap> {
        let _ = (mode, map_flags); // a read-only reader creates nothing and maps nothing
        match flags.trim_end_matches('b') {
            "r" | "r+" => {}
            "w" | "w+" | "a" | "a+" => {
                return Err(PyNotImplementedError::new_err(format!(
                    "File-backed mmap write is not supported yet (flags {flags:?}); gpumapio.Mmap \
                     reads, gpumapio.CuFile writes"
                )))
            }
            _ => {
                return Err(PyValueError::new_err(format!(
                    "Unknown file open flag: {flags:?} (expected \"r\")"
                )))
            }
        }
        if initial_map_size == Some(0) {
            return Err(PyValueError::new_err("Mapped region should not be zero byte"));
        }
        let mut options = check(py, defaults::handle_options())?;
        // The page-cache path, never cuFile: what a mapping reads from.
        options.compat_mode(CompatMode::On);
        let path = file_path.clone();
        let (handle, file_size) = nogil(py, move || {
            let handle = options.open(&path, "r")?;
            let len = handle.len()?;
            Ok((handle, len))
        })?;
        if file_size > 0 && initial_map_offset >= file_size {
            return Err(PyIndexError::new_err(format!(
                "Offset must be less than the file size. initial_map_offset: \
                 {initial_map_offset}, file size: {file_size}"
            )));
        }
        let available = file_size.saturating_sub(initial_map_offset);
        let map_size = initial_map_size.unwrap_or(available);
        if map_size > available {
            return Err(PyIndexError::new_err(format!(
                "Mapped region is past the end of file. initial map offset: \
                 {initial_map_offset}, initial map size: {map_size}, file size: {file_size}"
            )));
        }
        Ok(Mmap {
            handle: Mutex::new(Some(handle)),
            file_size,
            initial_map_size: map_size,
            initial_map_offset,
        })
    }

    /// Size in bytes of the mapped region given when the handle was made.
    fn initial_map_size(&self) -> u64 {
        self.initial_map_size
    }

    /// File offset of the mapped region given when the handle was made.
    fn initial_map_offset(&self) -> u64 {
        self.initial_map_offset
    }

    /// The file's size in bytes when it was opened; 0 once closed.
    fn file_size(&self) -> u64 {
        if self.closed() {
            0
        } else {
            self.file_size
        }
    }

    /// Closes the file; again: nothing. Reads still running keep it open until they are done.
    fn close(&self) {
        self.handle.lock().take();
    }

    /// Whether the handle is closed.
    fn closed(&self) -> bool {
        self.handle.lock().is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _exc_type: &Bound<'_, PyAny>,
        _exc: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.close();
        false
    }

    /// Reads `size` bytes (default: from `offset` to the end of the file) at `offset` into the
    /// start of `buf` (host or device memory), in parallel; returns the bytes read.
    #[pyo3(signature = (buf, size = None, offset = 0))]
    fn read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::kvikio::size)] size: Option<u64>,
        #[pyo3(from_py_with = crate::counts::kvikio::offset)] offset: u64,
    ) -> PyResult<usize> {
        let handle = self.handle()?;
        let mem = memory(buf, true)?;
        let size = self.checked_size(size, offset, mem.len())?;
        if size == 0 {
            return Ok(0);
        }
        let dst = mem.into_dst(py, 0, size as usize)?;
        read_blocking(py, &handle, dst, offset)
    }

    /// Starts reading `size` bytes (default: from `offset` to the end of the file) at `offset`
    /// into `buf` in tasks of `task_size` (default: the setting); returns an `IOFuture` whose
    /// `get()` gives the bytes read. Bad ranges raise here, not at `get()`.
    #[pyo3(signature = (buf, size = None, offset = 0, task_size = None))]
    fn pread(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::kvikio::size)] size: Option<u64>,
        #[pyo3(from_py_with = crate::counts::kvikio::offset)] offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::task_size)] task_size: Option<u64>,
    ) -> PyResult<IOFuture> {
        let handle = self.handle()?;
        let settings = check(py, defaults::current())?;
        let task_size = match task_size {
            // 0 is "the default", as CuFile's calls read it (KvikIO's `task_size if task_size`).
            Some(n) if n > 0 => n,
            _ if settings.is_explicit("task_size") => settings.task_size,
            _ => handle.task_size(), // as opened: tuned for its file system where not set
        };
        let mem = memory(buf, true)?;
        let size = self.checked_size(size, offset, mem.len())?;
        if size == 0 {
            return Ok(IOFuture::ready(Ok(0)));
        }
        let handle = if handle.task_size() == task_size {
            handle
        } else {
            check(py, handle.with_transfer_sizes(task_size, handle.gds_threshold()))?
        };
        let dst = mem.into_dst(py, 0, size as usize)?;
        Ok(IOFuture::pending(Box::new(handle.pread_device(dst, offset))))
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { " (closed)" } else { "" };
        format!(
            "<gpumapio.Mmap bytes {}..{}{state}>",
            self.initial_map_offset,
            self.initial_map_offset + self.initial_map_size
        )
    }
}
