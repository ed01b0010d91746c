//! gpumap's errors as Python exceptions, in one place.
//!
//! | gpumap | Python |
//! |---|---|
//! | `Io` with an errno | `OSError(errno, message, filename)`, which Python turns into its subclass for that errno (`FileNotFoundError`, `PermissionError`, `IsADirectoryError`, ...) |
//! | `Io` without one | `OSError(message)` |
//! | `UnexpectedEof` | `EOFError` |
//! | `RowIndex` (a row index out of range) | `IndexError` |
//! | `AccessMode` | `io.UnsupportedOperation` (an `OSError` and a `ValueError`, as for Python's own files) |
//! | bad arguments, ranges, sizes, flags, settings | `ValueError` |
//! | `Unavailable` (no CUDA, no cuFile, no such GPU) | `gpumapio.UnavailableError` (a `RuntimeError`, as KvikIO raises) |
//! | `Cuda` | `gpumapio.CudaError` (an `OSError`; `.code`, `.name`, `.op`) |
//! | `CuFile` | `gpumapio.CuFileError` (an `OSError`; `.code`, `.name`, `.op`, `.filename`) |
//! | `OutOfBudget` | `gpumapio.OutOfBudgetError` (a `MemoryError`) |
//! | `WriteBack` (a map's write-back failed) | `OSError(errno, message, filename)`, as `Io` |
//! | `FileShrank` (a mapped file was cut under the map) | `OSError(message, filename)` |
//! | `NotRegularFile` (a FIFO, a device, a /proc file) | `OSError(message)` |
//! | `ResourceLimit` (RLIMIT_MEMLOCK, available memory) | `MemoryError` |
//! | `Remote` (an S3 or HTTP object) | by kind: a bad URL `ValueError`; not found `FileNotFoundError`; refused credentials `PermissionError`; a timeout `TimeoutError`; a failed or broken connection `ConnectionError`; any other status or a malformed answer `OSError` — each with `.url` (no credentials) and `.status` (the HTTP status or `None`) |
//! | a panic, in gpumap or here | `RuntimeError` with the panic message (never unwinds into Python) |

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use gpumap::error::RemoteErrorKind;
use gpumap::io::IoFuture;
use gpumap::Error;
use pyo3::exceptions::{
    PyConnectionError, PyEOFError, PyFileNotFoundError, PyIndexError, PyMemoryError, PyOSError,
    PyPermissionError, PyRuntimeError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

pyo3::create_exception!(
    gpumapio,
    UnavailableError,
    PyRuntimeError,
    "What the call needs is missing on this machine (the CUDA driver, a GPU, cuFile); the \
     message says why."
);
pyo3::create_exception!(
    gpumapio,
    CudaError,
    PyOSError,
    "A CUDA driver call failed; `.op` is the call, `.code` the CUresult, `.name` its name."
);
pyo3::create_exception!(
    gpumapio,
    CuFileError,
    PyOSError,
    "A cuFile call failed; `.op` is the call, `.code` the cuFile status, `.name` its name."
);
pyo3::create_exception!(
    gpumapio,
    OutOfBudgetError,
    PyMemoryError,
    "Device memory for a mapping or cache would exceed its budget."
);

/// The Python exception for a gpumap error.
pub fn to_py(py: Python<'_>, e: &Error) -> PyErr {
    // The whole chain ("write-back of x failed; 4096 bytes stay dirty: pwrite failed on x: Input/output error"), once.
    let message = gpumap::error::Report(e).to_string();
    match e {
        Error::Io { path, source, .. } => match source.raw_os_error() {
            Some(errno) => {
                let filename = path.as_ref().map(|p| p.display().to_string());
                match filename {
                    Some(f) => PyOSError::new_err((errno, message, f)),
                    None => PyOSError::new_err((errno, message)),
                }
            }
            None => PyOSError::new_err(message),
        },
        Error::UnexpectedEof { .. } => PyEOFError::new_err(message),
        Error::RowIndex { .. } => PyIndexError::new_err(message),
        Error::AccessMode { .. } => unsupported_operation(py, message),
        Error::OutOfRange { .. }
        | Error::OutOfView { .. }
        | Error::Overflow { .. }
        | Error::Unaligned { .. }
        | Error::BufferTooSmall { .. }
        | Error::InvalidFlags(_)
        | Error::InvalidConfig { .. }
        | Error::InvalidArgument(_) => PyValueError::new_err(message),
        Error::Unavailable { .. } => UnavailableError::new_err(message),
        Error::Cuda { op, code, name } => {
            let err = CudaError::new_err(message);
            let value = err.value(py);
            let _ = value.setattr("op", *op);
            let _ = value.setattr("code", *code);
            let _ = value.setattr("name", name.as_str());
            err
        }
        Error::CuFile { op, code, name, path, .. } => {
            let err = CuFileError::new_err(message);
            let value = err.value(py);
            let _ = value.setattr("op", *op);
            let _ = value.setattr("code", *code);
            let _ = value.setattr("name", name.as_str());
            if let Some(p) = path {
                let _ = value.setattr("filename", p.display().to_string());
            }
            err
        }
        Error::OutOfBudget { .. } => OutOfBudgetError::new_err(message),
        Error::WriteBack { path, .. } => match e.raw_os_error() {
            Some(errno) => PyOSError::new_err((errno, message, path.display().to_string())),
            None => PyOSError::new_err(message),
        },
        Error::FileShrank { .. } | Error::NotRegularFile { .. } => PyOSError::new_err(message),
        Error::ResourceLimit { .. } => PyMemoryError::new_err(message),
        Error::TaskPanicked(_) => PyRuntimeError::new_err(message),
        Error::Remote { url, kind, status, .. } => {
            let err = match kind {
                RemoteErrorKind::InvalidUrl => PyValueError::new_err(message),
                RemoteErrorKind::NotFound => PyFileNotFoundError::new_err(message),
                RemoteErrorKind::AccessDenied => PyPermissionError::new_err(message),
                RemoteErrorKind::Timeout => PyTimeoutError::new_err(message),
                RemoteErrorKind::Connection => PyConnectionError::new_err(message),
                _ => PyOSError::new_err(message),
            };
            let value = err.value(py);
            let _ = value.setattr("url", url.as_str());
            let _ = value.setattr("status", *status);
            err
        }
        _ => PyRuntimeError::new_err(message),
    }
}

/// `io.UnsupportedOperation(message)`: what Python's own files raise for reading a file opened
/// for writing only, and the reverse.
fn unsupported_operation(py: Python<'_>, message: String) -> PyErr {
    let made = py
        .import("io")
        .and_then(|io| io.getattr("UnsupportedOperation"))
        .and_then(|cls| cls.call1(PyTuple::new(py, [message.clone()])?));
    match made {
        Ok(instance) => PyErr::from_value(instance),
        Err(_) => PyValueError::new_err(message),
    }
}

/// A panic's message.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `work` with the GIL released (other Python threads run meanwhile), catches a panic,
/// and turns a gpumap error into its Python exception once the GIL is back.
pub fn nogil<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce() -> gpumap::Result<T> + Send,
{
    match py.detach(|| catch_unwind(AssertUnwindSafe(work))) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(to_py(py, &e)),
        Err(payload) => Err(panicked(payload)),
    }
}

/// How long a wait for I/O goes without letting Python run its signal handlers (Ctrl-C).
pub const SIGNAL_POLL: Duration = Duration::from_millis(20);

/// Waits for `future` with the GIL released, taking the GIL back every [`SIGNAL_POLL`] to run
/// Python's signal handlers. When one raises (`KeyboardInterrupt` for Ctrl-C), the transfer is
/// cancelled — its tasks not yet started are skipped — and once the tasks already running have
/// finished, so that nothing writes into memory Python may free, that exception is raised.
pub fn wait_interruptibly<T: Send>(py: Python<'_>, future: IoFuture<T>) -> PyResult<T> {
    while !py.detach(|| future.wait_timeout(SIGNAL_POLL)) {
        if let Err(signal) = py.check_signals() {
            future.cancel();
            // Dropped with the GIL held: what the work owned may be Python's memory.
            let outcome = py.detach(move || future.wait());
            drop(outcome);
            return Err(signal);
        }
    }
    match py.detach(move || future.wait()) {
        Ok(value) => Ok(value),
        Err(e) => Err(to_py(py, &e)),
    }
}

/// The `RuntimeError` for a panic caught at the boundary.
pub fn panicked(payload: Box<dyn std::any::Any + Send>) -> PyErr {
    PyRuntimeError::new_err(format!(
        "gpumap panicked (a bug; please report it): {}",
        panic_message(payload)
    ))
}

/// Converts a gpumap result, with the GIL held.
pub fn check<T>(py: Python<'_>, result: gpumap::Result<T>) -> PyResult<T> {
    result.map_err(|e| to_py(py, &e))
}

/// Registers the exception classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("UnavailableError", py.get_type::<UnavailableError>())?;
    m.add("CudaError", py.get_type::<CudaError>())?;
    m.add("CuFileError", py.get_type::<CuFileError>())?;
    m.add("OutOfBudgetError", py.get_type::<OutOfBudgetError>())?;
    Ok(())
}
