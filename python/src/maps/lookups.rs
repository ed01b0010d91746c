//! The class `LookupScope`: a cache's directory handed to kernels of one's own (the library's
//! `LookupScope`), as a context manager. Leaving it (or `end()`) waits for its stream, then lets
//! the cache reuse slots again; the stream object is kept alive until then.

use gpumap::mapped::{DeviceCache as Cache, LookupScope as Scope};
use gpumap::memory::{Device, StreamRef};
use gpumap::sync::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::{nogil, to_py};

/// A hold on a GPU cache's directory for kernels of one's own: `table` is the device address of
/// its `gpumap_table` (`gpumapio.include_dir()`), `file_number(mapped)` (or `file`, for a
/// `MappedFile`'s scope) the number its extents are keyed by.
#[pyclass(module = "gpumapio", name = "LookupScope", frozen)]
pub struct LookupScope {
    scope: Mutex<Option<Scope<'static>>>,
    table: u64,
    file: Option<u64>,
    /// The caller's stream object, alive as long as the scope may wait for it.
    stream: Mutex<Option<Py<PyAny>>>,
}

impl LookupScope {
    /// Begins a scope of `cache` on `stream` (a torch or CuPy stream, a raw `CUstream`, or
    /// `None` for the default stream), numbering `file`'s extents where one is given.
    pub(super) fn begin(
        py: Python<'_>,
        cache: &Cache,
        stream: Option<Bound<'_, PyAny>>,
        file: Option<&gpumap::mapped::DeviceMappedFile>,
    ) -> PyResult<LookupScope> {
        let Device::Cuda(device) = cache.device() else {
            return Err(to_py(
                py,
                &gpumap::Error::Unavailable {
                    what: "lookup scope",
                    reason: "the cache is in host memory; kernels look rows up in a GPU cache"
                        .into(),
                },
            ));
        };
        let stream_ref = match &stream {
            Some(s) => crate::rows::stream_arg(py, s, &device)?,
            None => StreamRef::legacy(&device),
        };
        let cache = cache.clone();
        let scope = nogil(py, move || cache.lookup_scope(stream_ref))?;
        let file = file.map(|f| scope.file_number(f)).transpose().map_err(|e| to_py(py, &e))?;
        Ok(LookupScope {
            table: scope.table_ptr(),
            scope: Mutex::new(Some(scope)),
            file,
            stream: Mutex::new(stream.map(Bound::unbind)),
        })
    }
}

#[pymethods]
impl LookupScope {
    /// The device address of the cache's `gpumap_table`: pass it as `const gpumap_table*`.
    #[getter]
    fn table(&self) -> u64 {
        self.table
    }

    /// The number the scope's map is keyed by (`gpumap_key(file, extent)`); a `MappedFile`'s
    /// scope only (a `DeviceCache`'s scope: `file_number(mapped)`).
    #[getter]
    fn file(&self) -> PyResult<u64> {
        self.file.ok_or_else(|| {
            PyValueError::new_err("a DeviceCache's lookup scope: use file_number(mapped)")
        })
    }

    /// The number `mapped`'s extents are keyed by; `ValueError` for a file of another cache.
    fn file_number(&self, py: Python<'_>, mapped: PyRef<'_, super::MappedFile>) -> PyResult<u64> {
        let scope = self.scope.lock();
        let Some(scope) = scope.as_ref() else {
            return Err(PyValueError::new_err("the lookup scope has ended"));
        };
        let (map, _open) = mapped.open_map()?;
        scope.file_number(&map).map_err(|e| to_py(py, &e))
    }

    /// Waits for the scope's stream, then lets the cache reuse slots again (idempotent).
    fn end(&self, py: Python<'_>) -> PyResult<()> {
        let scope = self.scope.lock().take();
        let ended = match scope {
            Some(scope) => nogil(py, move || scope.end()),
            None => Ok(()),
        };
        self.stream.lock().take();
        ended
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.end(py)?;
        Ok(false)
    }
}
