//! Copies of a map's bytes into Python `bytes`, and host staging for device memory a map is
//! written from, in allocations that fail with `MemoryError` instead of aborting.

use pyo3::exceptions::PyMemoryError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::nogil_interruptibly;

/// A new `bytes` of `len` bytes, filled by `fill` with the GIL released. Python allocates it,
/// so memory that cannot be had is a `MemoryError`, as for Python's own objects (a Rust `Vec`
/// would abort the process). It is zeroed (a slice of it must be initialised) on the call's
/// own thread, in pieces between which a Ctrl-C is honoured: zeroing a large result takes
/// long enough to be noticed.
pub(super) fn filled_bytes<'py, F>(
    py: Python<'py>,
    len: usize,
    fill: F,
) -> PyResult<Bound<'py, PyBytes>>
where
    F: FnOnce(&mut [u8]) -> gpumap::Result<()> + Send,
{
    let Ok(size) = ffi::Py_ssize_t::try_from(len) else {
        return Err(PyMemoryError::new_err(format!("{len} bytes for a bytes object")));
    };
    // SAFETY: a null source asks Python for an uninitialised object of `size` bytes; the
    // result is a new reference or null with an exception set.
    let bytes = unsafe {
        Bound::from_owned_ptr_or_err(py, ffi::PyBytes_FromStringAndSize(std::ptr::null(), size))?
            .cast_into_unchecked::<PyBytes>()
    };
    // SAFETY: `bytes` is a bytes object; its buffer of `len` bytes lives as long as it does.
    let start = Start(unsafe { ffi::PyBytes_AsString(bytes.as_ptr()) }.cast::<u8>());
    // Not yet seen by any other Python code, so filling it without the GIL races with nothing;
    // `bytes` outlives the call, which ends (joined, also on Ctrl-C) before this returns.
    nogil_interruptibly(py, len as u64, move || {
        let start = start;
        for at in (0..len).step_by(ZEROED_AT_ONCE) {
            if gpumap::io::Cancel::current_is_cancelled() {
                return Err(gpumap::Error::Io {
                    op: "prepare the result",
                    path: None,
                    offset: None,
                    source: std::io::Error::from(std::io::ErrorKind::Interrupted),
                });
            }
            // SAFETY: `at + piece <= len`, inside the buffer; nothing else touches it yet.
            unsafe { start.0.add(at).write_bytes(0, ZEROED_AT_ONCE.min(len - at)) };
        }
        // SAFETY: every byte was just initialised, and the buffer is this call's alone.
        fill(unsafe { std::slice::from_raw_parts_mut(start.0, len) })
    })?;
    Ok(bytes)
}

/// How much of a result is zeroed between two checks for Ctrl-C.
const ZEROED_AT_ONCE: usize = 64 << 20;

/// The first byte of a new `bytes` object's buffer, sent to the thread that fills it.
#[derive(Clone, Copy)]
struct Start(*mut u8);

// SAFETY: the buffer is reached from one thread at a time: the filling thread, joined before
// the object is handed to Python.
unsafe impl Send for Start {}

/// A host copy of device memory `src`, in a buffer whose allocation may fail (`MemoryError`).
pub(super) fn host_copy(src: gpumap::memory::cuda::CudaView<'_>) -> PyResult<Vec<u8>> {
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(src.len()).map_err(|_| {
        PyMemoryError::new_err(format!("{} bytes of host memory for a copy", src.len()))
    })?;
    bytes.resize(src.len(), 0);
    Ok(bytes)
}
