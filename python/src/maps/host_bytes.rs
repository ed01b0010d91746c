//! Copies of a map's bytes into Python `bytes`, and host staging for device memory a map is
//! written from, in allocations that fail with `MemoryError` instead of aborting.

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::nogil_interruptibly;

/// A new `bytes` of `len` bytes, filled by `fill` with the GIL released. Python allocates it,
/// so memory that cannot be had is a `MemoryError`, as for Python's own objects (a Rust `Vec`
/// would abort the process).
pub(super) fn filled_bytes<'py, F>(
    py: Python<'py>,
    len: usize,
    fill: F,
) -> PyResult<Bound<'py, PyBytes>>
where
    F: FnOnce(&mut [u8]) -> gpumap::Result<()> + Send,
{
    // Not yet seen by any other Python code, so filling it without the GIL races with nothing.
    PyBytes::new_with(py, len, |bytes| nogil_interruptibly(py, len as u64, move || fill(bytes)))
}

/// A host copy of device memory `src`, in a buffer whose allocation may fail (`MemoryError`).
pub(super) fn host_copy(src: gpumap::memory::cuda::CudaView<'_>) -> PyResult<Vec<u8>> {
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(src.len()).map_err(|_| {
        PyMemoryError::new_err(format!("{} bytes of host memory for a copy", src.len()))
    })?;
    bytes.resize(src.len(), 0);
    Ok(bytes)
}
