//! The class `View`: a resident, pinned range of a mapped file, exported without a copy
//! through `__cuda_array_interface__` and `__dlpack__` on a GPU.

use std::sync::Arc;

use gpumap::mapped::{View as ReadView, ViewMut};
use gpumap::sync::Mutex;
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use super::host_bytes::{filled_bytes, host_copy};
use super::map_handle::MapHandle;
use crate::buffers::memory;
use crate::dlpack::{self, DL_CUDA};
use crate::errors::nogil;

/// A view's pin.
pub(super) enum Pin {
    Read(ReadView),
    Write(Mutex<ViewMut>),
}

/// What a `View` (and each export of it) holds: its pin, then the binding's handle on the map,
/// so that the map is flushed only after the last view's bytes were let go.
pub(super) struct Held {
    pub(super) pin: Pin,
    pub(super) _map: Arc<MapHandle>,
}

impl Held {
    fn device(&self) -> Option<(u64, usize)> {
        match &self.pin {
            Pin::Read(v) => v.device().map(|d| (d.ptr(), d.device_ordinal())),
            Pin::Write(v) => {
                let v = v.lock();
                v.device().map(|d| (d.ptr(), d.device_ordinal()))
            }
        }
    }

    fn copy_to_host(&self, dst: &mut [u8]) -> gpumap::Result<()> {
        match &self.pin {
            Pin::Read(v) => v.copy_to_host(0, dst),
            Pin::Write(v) => v.lock().copy_to_host(0, dst),
        }
    }
}

/// A resident, pinned range of a mapped file. On a GPU it is device memory at `ptr`, exported
/// without a copy through `__cuda_array_interface__` (CuPy, torch, Numba) and `__dlpack__`.
#[pyclass(module = "gpumapio", name = "View", frozen)]
pub struct View {
    held: Mutex<Option<Arc<Held>>>,
    offset: u64,
    nbytes: u64,
    writable: bool,
    device: Option<(u64, usize)>,
}

impl View {
    pub(super) fn new(held: Held, offset: u64, nbytes: u64, writable: bool) -> View {
        let device = held.device();
        View { held: Mutex::new(Some(Arc::new(held))), offset, nbytes, writable, device }
    }

    fn held(&self) -> PyResult<Arc<Held>> {
        self.held.lock().clone().ok_or_else(|| PyValueError::new_err("the view was released"))
    }

    /// The device address and ordinal, for exports: GPU views only, not released.
    fn exportable(&self) -> PyResult<(u64, usize, Arc<Held>)> {
        let held = self.held()?;
        match self.device {
            Some((ptr, ordinal)) => Ok((ptr, ordinal, held)),
            None => Err(PyBufferError::new_err(
                "this view is in host memory (no GPU): use tobytes(), or gather into a NumPy array",
            )),
        }
    }
}

#[pymethods]
impl View {
    /// File offset of the view's first byte.
    #[getter]
    fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes in the view.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.nbytes
    }

    fn __len__(&self) -> usize {
        self.nbytes as usize
    }

    /// Whether writes through it are written back.
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    /// The device address of its first byte; `None` on host memory.
    #[getter]
    fn ptr(&self) -> Option<u64> {
        self.device.map(|(ptr, _)| ptr)
    }

    /// Version 3 of CUDA's array interface: a 1-D `uint8` array of the view's bytes. GPU
    /// views only (an `AttributeError` on host memory, so consumers fall back).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (ptr, _, _) =
            self.exportable().map_err(|e| PyAttributeError::new_err(e.to_string()))?;
        let d = PyDict::new(py);
        d.set_item("shape", (self.nbytes,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (ptr, !self.writable))?;
        d.set_item("version", 3)?;
        d.set_item("strides", py.None())?;
        // The bytes are in place when the view is made; no stream to wait for.
        d.set_item("stream", py.None())?;
        Ok(d)
    }

    /// A DLPack capsule of the view's bytes (1-D `uint8` on its GPU): the capsule, and the
    /// tensor a consumer makes of it, keep the view's memory pinned until it is deleted.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<Bound<'_, PyAny>>,
        dl_device: Option<Bound<'_, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (stream, max_version, dl_device);
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "a view is exported in place; copy=True is not offered",
            ));
        }
        let (ptr, ordinal, held) = self.exportable()?;
        dlpack::export_bytes(py, ptr, ordinal, self.nbytes, Box::new(held))
    }

    /// `(2, ordinal)`: CUDA memory of that GPU (DLPack's `kDLCUDA`).
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        let (_, ordinal, _) = self.exportable()?;
        Ok((DL_CUDA, ordinal as i32))
    }

    /// A copy of the view's bytes in host memory (works on both backends).
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let held = self.held()?;
        filled_bytes(py, self.nbytes as usize, move |bytes| held.copy_to_host(bytes))
    }

    /// Copies `data` (bytes-like) to `at` in a writable view.
    #[pyo3(signature = (data, at = 0))]
    fn write(
        &self,
        py: Python<'_>,
        data: Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::at)] at: u64,
    ) -> PyResult<()> {
        let held = self.held()?;
        if !matches!(&held.pin, Pin::Write(_)) {
            return Err(PyValueError::new_err("a read-only view; make it with writable=True"));
        }
        let src = memory(&data, false)?;
        let len = src.len();
        if at.checked_add(len as u64).is_none_or(|end| end > self.nbytes) {
            return Err(PyValueError::new_err(format!(
                "{len} bytes at {at} do not fit in the view of {} bytes",
                self.nbytes
            )));
        }
        let src = src.into_src(py, 0, len)?;
        let staging = match src.view() {
            gpumap::memory::DeviceView::Host(_) => Vec::new(),
            gpumap::memory::DeviceView::Cuda(v) => host_copy(v)?,
        };
        nogil(py, move || {
            let Pin::Write(view) = &held.pin else {
                return Err(gpumap::Error::InvalidArgument("a read-only view".into()));
            };
            let mut view = view.lock();
            match src.view() {
                gpumap::memory::DeviceView::Host(bytes) => view.copy_from_host(at, bytes),
                gpumap::memory::DeviceView::Cuda(v) => {
                    let mut bytes = staging;
                    v.copy_to_host(0, &mut bytes)?;
                    view.copy_from_host(at, &bytes)
                }
            }
        })
    }

    /// Gives the view up: its pin goes once no export holds it.
    fn release(&self) {
        // Let go outside the lock: the last hold on a writable map flushes it without the GIL,
        // while another thread may wait on this lock holding the GIL.
        let taken = self.held.lock().take();
        drop(taken);
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "<gpumapio.View {}+{}{}{}>",
            self.offset,
            self.nbytes,
            if self.writable { " writable" } else { "" },
            match self.device {
                Some((ptr, ordinal)) => format!(" at {ptr:#x} on GPU {ordinal}"),
                None => " in host memory".to_owned(),
            }
        )
    }
}
