//! gpumap's errors as Python exceptions, in one place.
//!
//! KvikIO raises `RuntimeError` for every failed I/O ("Unable to open file: ...", "Operation not
//! permitted"); Python code expects `OSError` subclasses with an errno. Both work here: each
//! `OSError` below is an instance of a class made from the `OSError` subclass Python picks for
//! the errno *and* `RuntimeError` (named like its `OSError` base, in module `gpumapio`), and its
//! message holds KvikIO's phrase.
//!
//! | gpumap | Python |
//! |---|---|
//! | `Io` with an errno | `OSError(errno, message, filename)` as Python makes it for that errno (`FileNotFoundError`, `PermissionError`, `IsADirectoryError`, ...), also a `RuntimeError`; failed opens say "Unable to open file" |
//! | `Io` without one | `OSError(message)`, also a `RuntimeError` |
//! | `UnexpectedEof` | `EOFError` |
//! | `RowIndex` (a row index out of range) | `IndexError` |
//! | `AccessMode` | `io.UnsupportedOperation` (an `OSError` and a `ValueError`, as for Python's own files) with errno `EBADF`, also a `RuntimeError` saying "Operation not permitted" |
//! | bad arguments, ranges, sizes, flags, settings | `ValueError` |
//! | `Unavailable` (no CUDA, no cuFile, no such GPU) | `gpumapio.UnavailableError` (a `RuntimeError`, as KvikIO raises) |
//! | `Cuda` | `gpumapio.CudaError` (an `OSError` and a `RuntimeError`, as KvikIO raises; `.code`, `.name`, `.op`) |
//! | `CuFile` | `gpumapio.CuFileError` (an `OSError` and a `RuntimeError`, as KvikIO raises; `.code`, `.name`, `.op`, `.filename`) |
//! | `OutOfBudget` | `gpumapio.OutOfBudgetError` (a `MemoryError`) |
//! | `WriteBack` (a map's write-back failed) | as `Io` |
//! | `FileShrank` (a mapped file was cut under the map) | `OSError(message)`, also a `RuntimeError` |
//! | `NotRegularFile` (a FIFO, a device, a /proc file) | `OSError(EINVAL, "a FIFO, not a regular file", filename)`, also a `RuntimeError` |
//! | `ResourceLimit` (RLIMIT_MEMLOCK, available memory) | `MemoryError` |
//! | `Remote` (an S3 or HTTP object) | by kind: a bad URL `ValueError`; not found `FileNotFoundError`; refused credentials `PermissionError`; a timeout `TimeoutError`; a failed or broken connection `ConnectionError`; any other status or a malformed answer `OSError` — each but the first also a `RuntimeError` (as KvikIO raises), and each with `.url` (no credentials) and `.status` (the HTTP status or `None`) |
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
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

pyo3::create_exception!(
    gpumapio,
    UnavailableError,
    PyRuntimeError,
    "What the call needs is missing on this machine (the CUDA driver, a GPU, cuFile); the \
     message says why."
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
        // A path no system call can take: Python's own calls say `ValueError: embedded null
        // byte` for it, before any I/O.
        Error::Io { path: Some(path), .. } if path.as_os_str().as_encoded_bytes().contains(&0) => {
            PyValueError::new_err(format!("embedded null byte in the path {path:?}"))
        }
        Error::Io { op, path, source, .. } => {
            let filename = path.as_ref().map(|p| p.display().to_string());
            let message = match (*op, &filename) {
                ("open", Some(f)) => format!("Unable to open file {f:?}: {source}"),
                ("open", None) => format!("Unable to open file: {message}"),
                _ => message,
            };
            os_error(py, source.raw_os_error(), message, filename)
        }
        Error::UnexpectedEof { .. } => PyEOFError::new_err(message),
        Error::RowIndex { .. } => PyIndexError::new_err(message),
        Error::AccessMode { .. } => unsupported_operation(py, message),
        // KvikIO's phrase first, for `match=` written for it.
        Error::InvalidFlags(_) => {
            PyValueError::new_err(format!("Unknown file open flag: {message}"))
        }
        Error::OutOfRange { .. }
        | Error::OutOfView { .. }
        | Error::Overflow { .. }
        | Error::Unaligned { .. }
        | Error::BufferTooSmall { .. }
        | Error::InvalidConfig { .. }
        | Error::InvalidArgument(_) => PyValueError::new_err(message),
        Error::Unavailable { .. } => UnavailableError::new_err(message),
        Error::Cuda { op, code, name } => {
            let err = cuda_error(py, message);
            let value = err.value(py);
            let _ = value.setattr("op", *op);
            let _ = value.setattr("code", *code);
            let _ = value.setattr("name", name.as_str());
            err
        }
        Error::CuFile { op, code, name, path, .. } => {
            let err = named_runtime_too(py, Named::CuFile, message);
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
        Error::WriteBack { path, .. } => {
            os_error(py, e.raw_os_error(), message, Some(path.display().to_string()))
        }
        Error::FileShrank { .. } => os_error(py, None, message, None),
        // As Python words an error of a named file: "[Errno 22] a FIFO, not a regular file:
        // 'path'", with `errno` and `filename` set.
        Error::NotRegularFile { path: Some(path), what } => os_error(
            py,
            Some(libc::EINVAL),
            format!("{what}, not a regular file"),
            Some(path.display().to_string()),
        ),
        Error::NotRegularFile { path: None, .. } => os_error(py, Some(libc::EINVAL), message, None),
        Error::ResourceLimit { .. } => PyMemoryError::new_err(message),
        Error::TaskPanicked(_) => PyRuntimeError::new_err(message),
        Error::Remote { url, kind, status, .. } => {
            // Failed transfers are also `RuntimeError`s, as KvikIO's `RemoteFile` raises them.
            let err = match kind {
                RemoteErrorKind::InvalidUrl => PyValueError::new_err(message),
                RemoteErrorKind::NotFound => {
                    runtime_too(&py.get_type::<PyFileNotFoundError>(), message)
                }
                RemoteErrorKind::AccessDenied => {
                    runtime_too(&py.get_type::<PyPermissionError>(), message)
                }
                RemoteErrorKind::Timeout => runtime_too(&py.get_type::<PyTimeoutError>(), message),
                RemoteErrorKind::Connection => {
                    runtime_too(&py.get_type::<PyConnectionError>(), message)
                }
                _ => runtime_too(&py.get_type::<PyOSError>(), message),
            };
            let value = err.value(py);
            let _ = value.setattr("url", url.as_str());
            let _ = value.setattr("status", *status);
            err
        }
        _ => PyRuntimeError::new_err(message),
    }
}

/// The class that is both `base` (an `OSError` subclass) and `RuntimeError`, made once per base.
fn also_runtime_error<'py>(base: &Bound<'py, PyType>) -> PyResult<Bound<'py, PyType>> {
    static MADE: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    let py = base.py();
    let made = MADE.get_or_init(py, || PyDict::new(py).unbind()).bind(py);
    if let Some(class) = made.get_item(base)? {
        return Ok(class.cast_into::<PyType>()?);
    }
    let name = base.name()?.to_string();
    let doc = format!("{name}, and a RuntimeError as KvikIO raises for failed I/O.");
    let class = runtime_class(base, &name, &doc)?;
    made.set_item(base, &class)?;
    Ok(class)
}

/// A new class `name` in module `gpumapio` with bases `base` (an `OSError` subclass) and
/// `RuntimeError`.
fn runtime_class<'py>(
    base: &Bound<'py, PyType>,
    name: &str,
    doc: &str,
) -> PyResult<Bound<'py, PyType>> {
    let py = base.py();
    let namespace = PyDict::new(py);
    namespace.set_item("__module__", "gpumapio")?;
    namespace.set_item("__doc__", doc)?;
    let bases = PyTuple::new(py, [base.as_any(), py.get_type::<PyRuntimeError>().as_any()])?;
    py.get_type::<PyType>()
        .call1((name, bases, namespace))?
        .cast_into::<PyType>()
        .map_err(Into::into)
}

/// gpumap's own exception classes that are both an `OSError` and a `RuntimeError` (KvikIO
/// raises `RuntimeError` for CUDA and cuFile failures; Python code expects `OSError`s).
#[derive(Clone, Copy)]
enum Named {
    Cuda,
    CuFile,
}

impl Named {
    fn name(self) -> &'static str {
        match self {
            Named::Cuda => "CudaError",
            Named::CuFile => "CuFileError",
        }
    }

    fn doc(self) -> &'static str {
        match self {
            Named::Cuda => {
                "A CUDA driver call failed; `.op` is the call, `.code` the CUresult, `.name` its \
                 name. An OSError, and a RuntimeError as KvikIO raises."
            }
            Named::CuFile => {
                "A cuFile call failed; `.op` is the call, `.code` the cuFile status, `.name` its \
                 name. An OSError, and a RuntimeError as KvikIO raises."
            }
        }
    }

    /// The class, made once: `class <name>(OSError, RuntimeError)` in module `gpumapio`.
    fn class(self, py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
        static CUDA: PyOnceLock<Py<PyType>> = PyOnceLock::new();
        static CUFILE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
        let cell = match self {
            Named::Cuda => &CUDA,
            Named::CuFile => &CUFILE,
        };
        let class = cell.get_or_try_init(py, || {
            runtime_class(&py.get_type::<PyOSError>(), self.name(), self.doc()).map(Bound::unbind)
        })?;
        Ok(class.bind(py).clone())
    }
}

/// `gpumapio.CudaError(message)`: an `OSError` and a `RuntimeError`.
pub fn cuda_error(py: Python<'_>, message: String) -> PyErr {
    named_runtime_too(py, Named::Cuda, message)
}

/// `message` as an instance of the class `named`; a plain `OSError` should the class not be
/// made (Python out of memory).
fn named_runtime_too(py: Python<'_>, named: Named, message: String) -> PyErr {
    match named.class(py).and_then(|cls| cls.call1((message.clone(),))) {
        Ok(instance) => PyErr::from_value(instance),
        Err(_) => PyOSError::new_err(message),
    }
}

/// `OSError(errno, message[, filename])` — of the subclass Python picks for the errno — that
/// is also a `RuntimeError`.
fn os_error(
    py: Python<'_>,
    errno: Option<i32>,
    message: String,
    filename: Option<String>,
) -> PyErr {
    let made = (|| -> PyResult<Bound<'_, PyAny>> {
        let args = match (errno, filename) {
            (Some(n), Some(f)) => (n, message.clone(), f).into_pyobject(py)?.into_any(),
            (Some(n), None) => (n, message.clone()).into_pyobject(py)?.into_any(),
            (None, _) => (message.clone(),).into_pyobject(py)?.into_any(),
        };
        let args = args.cast_into::<PyTuple>()?;
        // OSError's constructor picks the subclass for the errno (FileNotFoundError, ...).
        let plain = py.get_type::<PyOSError>().call1(args.clone())?;
        also_runtime_error(&plain.get_type())?.call1(args)
    })();
    match made {
        Ok(instance) => PyErr::from_value(instance),
        Err(_) => PyOSError::new_err(message),
    }
}

/// `base(message)` — an `OSError` subclass — that is also a `RuntimeError`.
fn runtime_too(base: &Bound<'_, PyType>, message: String) -> PyErr {
    match also_runtime_error(base).and_then(|cls| cls.call1((message.clone(),))) {
        Ok(instance) => PyErr::from_value(instance),
        Err(_) => PyOSError::new_err(message),
    }
}

/// `io.UnsupportedOperation(EBADF, message)`, also a `RuntimeError`: what Python's own files
/// raise for reading a file opened for writing only, and the reverse; the message holds
/// KvikIO's "Operation not permitted".
fn unsupported_operation(py: Python<'_>, message: String) -> PyErr {
    let message = format!("Operation not permitted: {message}");
    // Python's own errno module names EBADF, so the binding needs no C constants of its own.
    let made = py
        .import("io")
        .and_then(|io| io.getattr("UnsupportedOperation"))
        .and_then(|cls| also_runtime_error(cls.cast::<PyType>()?))
        .and_then(|cls| {
            let ebadf = py.import("errno")?.getattr("EBADF")?;
            cls.call1((ebadf, message.clone()))
        });
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

/// Work at least this large (bytes, and 4 KiB per row of a row gather) runs on a thread of its
/// own in [`nogil_interruptibly`]: the start of a thread costs tens of microseconds, a few
/// percent of even a warm call of this size.
pub const INTERRUPTIBLE_MIN: u64 = 64 << 20;

/// [`nogil`] that Ctrl-C can stop, for reads that may take long (a map's read, gather or view
/// of much that is not resident, from a slow disk or a server). Work estimated at `size`
/// bytes of at least [`INTERRUPTIBLE_MIN`] runs on a thread of its own under a
/// [`Cancel`](gpumap::io::Cancel) token while this one waits in steps of [`SIGNAL_POLL`],
/// running Python's signal handlers between them. When one raises, the token is cancelled,
/// the work is waited for (it stops at its next I/O task, and must end before the memory it
/// writes into may be freed), and the handler's exception is raised. Smaller work runs here.
pub fn nogil_interruptibly<T, F>(py: Python<'_>, size: u64, work: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce() -> gpumap::Result<T> + Send,
{
    if size < INTERRUPTIBLE_MIN {
        return nogil(py, work);
    }
    let cancel = gpumap::io::Cancel::new();
    let done = (gpumap::sync::Mutex::new(false), gpumap::sync::Condvar::new());
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new().name("gpumap-call".into());
        let worker = gpumap::per_process::spawn_apart_from_fork(|| {
            thread.spawn_scoped(scope, {
                let (cancel, done) = (cancel.clone(), &done);
                move || {
                    let outcome = catch_unwind(AssertUnwindSafe(|| cancel.run(work)));
                    *done.0.lock() = true;
                    done.1.notify_all();
                    outcome
                }
            })
        });
        let worker = match worker {
            Ok(worker) => worker,
            // No thread to be had (the work went with the failed spawn): say so.
            Err(source) => {
                let e =
                    gpumap::Error::Io { op: "start a thread", path: None, offset: None, source };
                return Err(to_py(py, &e));
            }
        };
        loop {
            let finished = py.detach(|| {
                let mut finished = done.0.lock();
                if !*finished {
                    let _ = done.1.wait_for(&mut finished, SIGNAL_POLL);
                }
                *finished
            });
            if finished {
                break;
            }
            if let Err(signal) = py.check_signals() {
                cancel.cancel();
                let outcome = py.detach(|| worker.join());
                drop(outcome);
                return Err(signal);
            }
        }
        match py.detach(|| worker.join()) {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(e))) => Err(to_py(py, &e)),
            Ok(Err(payload)) | Err(payload) => Err(panicked(payload)),
        }
    })
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
    m.add("CudaError", Named::Cuda.class(py)?)?;
    m.add("CuFileError", Named::CuFile.class(py)?)?;
    m.add("OutOfBudgetError", py.get_type::<OutOfBudgetError>())?;
    Ok(())
}
