//! The page cache as a tool: `gpumap::pagecache` for Python (wrapped into dataclasses in
//! `gpumapio/pagecache.py`).

use std::fs::File;
use std::os::fd::RawFd;
use std::path::PathBuf;

use gpumap::pagecache::{self as pc, ByteRange, MethodChoice, Residency, Target, WarmMode};
use gpumap::sync::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt};

use crate::errors::nogil;

/// The file a call is about: a path, or (duplicated, so it stays open through the call) a
/// descriptor given as an int or by an object with `fileno()`.
enum FileArg {
    Path(PathBuf),
    Fd(File),
}

impl FileArg {
    fn target(&self) -> Target<'_> {
        match self {
            FileArg::Path(p) => Target::Path(p),
            FileArg::Fd(f) => Target::File(f),
        }
    }
}

fn file_arg(file: &Bound<'_, PyAny>) -> PyResult<FileArg> {
    // A bool is an int to Python: True would be descriptor 1 (stdout).
    if file.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "file {file}: a bool is not a file (a path, a file descriptor, or an object with \
             fileno())"
        )));
    }
    let fd: RawFd = if file.is_instance_of::<PyInt>() {
        descriptor(file)?
    } else if let Ok(path) = crate::paths::path(file) {
        return Ok(FileArg::Path(path));
    } else if file.hasattr("fileno")? {
        descriptor(&file.call_method0("fileno")?)?
    } else {
        return Err(PyTypeError::new_err(
            "file must be a path (str or os.PathLike), a file descriptor, or an object with \
             fileno()",
        ));
    };
    if fd < 0 {
        return Err(PyValueError::new_err(format!("file descriptor {fd} is negative")));
    }
    // Duplicated while the GIL is held, so no Python code can close it in between; a closed
    // descriptor fails (EBADF).
    Ok(FileArg::Fd(gpumap::io::descriptor::duplicate(fd)?))
}

/// `number` as a descriptor; past what one can be, a `ValueError` naming it (PyO3's own
/// conversion raises a bare `OverflowError`).
fn descriptor(number: &Bound<'_, PyAny>) -> PyResult<RawFd> {
    number.extract::<RawFd>().map_err(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(number.py()) {
            PyValueError::new_err(format!("file descriptor {number} is not one a file can have"))
        } else {
            e
        }
    })
}

fn range(offset: u64, length: Option<u64>) -> ByteRange {
    match length {
        Some(len) => ByteRange::new(offset, len),
        None => ByteRange::from_offset(offset),
    }
}

fn residency_dict<'py>(py: Python<'py>, r: &Residency) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("offset", r.offset)?;
    d.set_item("length", r.len)?;
    d.set_item("file_size", r.file_size)?;
    d.set_item("page_size", r.page_size)?;
    d.set_item("total_pages", r.total_pages)?;
    d.set_item("cached_pages", r.cached_pages)?;
    d.set_item("dirty_pages", r.dirty_pages)?;
    d.set_item("writeback_pages", r.writeback_pages)?;
    d.set_item("evicted_pages", r.evicted_pages)?;
    d.set_item("recently_evicted_pages", r.recently_evicted_pages)?;
    d.set_item(
        "method",
        match r.method {
            pc::Method::Cachestat => "cachestat",
            pc::Method::Mincore => "mincore",
        },
    )?;
    d.set_item("unknown_reason", r.unknown_reason.clone())?;
    Ok(d)
}

/// How much of a range of a file is in the page cache, as a dict (see `gpumapio.pagecache`).
#[pyfunction]
#[pyo3(signature = (file, offset = 0, length = None, method = "auto"))]
pub fn residency<'py>(
    py: Python<'py>,
    file: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::counts::offset)] offset: u64,
    #[pyo3(from_py_with = crate::counts::length_or_none)] length: Option<u64>,
    method: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let choice = match method {
        "auto" => MethodChoice::Auto,
        "cachestat" => MethodChoice::Cachestat,
        "mincore" => MethodChoice::Mincore,
        other => {
            return Err(PyValueError::new_err(format!(
                "method {other:?}: expected \"auto\", \"cachestat\" or \"mincore\""
            )))
        }
    };
    let file = file_arg(file)?;
    let r = nogil(py, || pc::residency_with(file.target(), range(offset, length), choice))?;
    residency_dict(py, &r)
}

/// Brings a range into the page cache: readahead advice (`wait=False`), or reading it
/// (`wait=True`, returns when it is cached).
#[pyfunction]
#[pyo3(signature = (file, offset = 0, length = None, wait = false))]
pub fn warm(
    py: Python<'_>,
    file: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = crate::counts::offset)] offset: u64,
    #[pyo3(from_py_with = crate::counts::length_or_none)] length: Option<u64>,
    wait: bool,
) -> PyResult<()> {
    let file = file_arg(file)?;
    let mode = if wait { WarmMode::Read } else { WarmMode::Advise };
    nogil(py, || pc::warm(file.target(), range(offset, length), mode))
}

/// Drops a range from the page cache (`fdatasync`, then `POSIX_FADV_DONTNEED`); returns the
/// residency before and after, as dicts.
#[pyfunction]
#[pyo3(signature = (file, offset = 0, length = None))]
pub fn evict<'py>(
    py: Python<'py>,
    file: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::counts::offset)] offset: u64,
    #[pyo3(from_py_with = crate::counts::length_or_none)] length: Option<u64>,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyDict>)> {
    let file = file_arg(file)?;
    let report = nogil(py, || pc::evict(file.target(), range(offset, length)))?;
    Ok((residency_dict(py, &report.before)?, residency_dict(py, &report.after)?))
}

/// Drops the whole system's clean page cache (`/proc/sys/vm/drop_caches`; needs root).
#[pyfunction]
#[pyo3(signature = (reclaim_dentries = false))]
pub fn drop_all(py: Python<'_>, reclaim_dentries: bool) -> PyResult<()> {
    nogil(py, move || pc::drop_system(reclaim_dentries))
}

/// A range held in the page cache with `mlock`, until `unlock()` (or the end of a `with`
/// block, or garbage collection).
#[pyclass(module = "gpumapio.pagecache", name = "LockedRange", frozen)]
pub struct LockedRange {
    locked: Mutex<Option<pc::LockedRange>>,
    offset: u64,
    length: u64,
    locked_bytes: u64,
}

#[pymethods]
impl LockedRange {
    /// First byte of the locked range.
    #[getter]
    fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes in the locked range.
    #[getter]
    fn length(&self) -> u64 {
        self.length
    }

    /// Bytes pinned, in whole pages.
    #[getter]
    fn locked_bytes(&self) -> u64 {
        self.locked_bytes
    }

    /// Whether the range is still locked.
    #[getter]
    fn locked(&self) -> bool {
        self.locked.lock().is_some()
    }

    /// Unlocks the range (again: nothing); raises the OS error, if any.
    fn unlock(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.locked.lock().take();
        match taken {
            Some(range) => nogil(py, move || range.unlock()),
            None => Ok(()),
        }
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
    ) -> PyResult<bool> {
        self.unlock(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "LockedRange(offset={}, length={}, locked_bytes={}, locked={})",
            self.offset,
            self.length,
            self.locked_bytes,
            if self.locked() { "True" } else { "False" }
        )
    }
}

/// Reads a range into the page cache and keeps it there (`mmap` + `mlock`) until the returned
/// `LockedRange` is unlocked.
#[pyfunction]
#[pyo3(signature = (file, offset = 0, length = None))]
pub fn lock(
    py: Python<'_>,
    file: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = crate::counts::offset)] offset: u64,
    #[pyo3(from_py_with = crate::counts::length_or_none)] length: Option<u64>,
) -> PyResult<LockedRange> {
    let file = file_arg(file)?;
    let locked = nogil(py, || pc::lock(file.target(), range(offset, length)))?;
    Ok(LockedRange {
        offset: locked.offset(),
        length: locked.len(),
        locked_bytes: locked.locked_bytes(),
        locked: Mutex::new(Some(locked)),
    })
}

/// The base page size the counts are in.
#[pyfunction]
pub fn page_size() -> u64 {
    pc::page_size()
}
