//! Low-level cuFile access, as cuda-python offers it, where gpumap has it: the driver and its
//! properties, file handle registration with blocking, batch and stream-ordered reads and
//! writes, buffer registration; and CUDA streams to order them on. Also what the machine
//! offers (devices, driver version, the reasons for every "no").

use std::fs::File;
use std::path::PathBuf;

use gpumap::io::gds::{open_for_cufile, BatchRead, CuFileDriver, CuFileHandle, RegisteredBuffer};
use gpumap::memory::cuda::{CudaDevice, CudaView, CudaViewMut, Stream as GpuStream};
use gpumap::sync::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::buffers::{memory, Keeper};
use crate::errors::{check, nogil, to_py};
use crate::future::{IOFutureStream, Pending};

/// Opens the cuFile driver (once per process; later calls return at once). Raises
/// `UnavailableError` with the reason when cuFile cannot be used here.
#[pyfunction]
pub fn driver_open(py: Python<'_>) -> PyResult<()> {
    nogil(py, || CuFileDriver::get().map(|_| ()))
}

/// The opened driver's library and properties (`cuFileDriverGetProperties`) as a dict.
#[pyfunction]
pub fn driver_properties(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let driver = nogil(py, CuFileDriver::get)?;
    let d = PyDict::new(py);
    d.set_item("library", driver.library())?;
    if let Some(p) = driver.properties() {
        d.set_item("nvfs_version", p.nvfs_version)?;
        d.set_item("max_direct_io_size", p.max_direct_io_size)?;
        d.set_item("max_batch_io_size", p.max_batch_io_size)?;
        d.set_item("status_flags", p.status_flags)?;
        d.set_item("feature_flags", p.feature_flags)?;
        d.set_item("poll_mode", p.poll_mode)?;
        d.set_item("allow_compat_mode", p.allow_compat_mode)?;
        d.set_item("poll_thresh_size_kb", p.poll_thresh_size_kb)?;
        d.set_item("max_device_cache_size_kb", p.max_device_cache_size_kb)?;
        d.set_item("per_buffer_cache_size_kb", p.per_buffer_cache_size_kb)?;
        d.set_item("max_pinned_memory_size_kb", p.max_pinned_memory_size_kb)?;
    }
    Ok(d)
}

/// `cuFileDriverSetPollMode`: whether reads and writes of up to `threshold_kb` KiB poll for
/// completion. Opens the driver; `UnavailableError` without cuFile or where the library lacks
/// the call, `CuFileError` where it refuses.
#[pyfunction]
pub fn driver_set_poll_mode(
    py: Python<'_>,
    poll: bool,
    #[pyo3(from_py_with = crate::counts::kvikio::threshold_kb)] threshold_kb: usize,
) -> PyResult<()> {
    nogil(py, move || CuFileDriver::get()?.set_poll_mode(poll, threshold_kb))
}

/// `cuFileDriverSetMaxDirectIOSize`, KiB (errors as `driver_set_poll_mode`).
#[pyfunction]
pub fn driver_set_max_direct_io_size(
    py: Python<'_>,
    #[pyo3(from_py_with = crate::counts::kvikio::kb)] kb: usize,
) -> PyResult<()> {
    nogil(py, move || CuFileDriver::get()?.set_max_direct_io_size_kb(kb))
}

/// `cuFileDriverSetMaxCacheSize`, KiB (errors as `driver_set_poll_mode`).
#[pyfunction]
pub fn driver_set_max_cache_size(
    py: Python<'_>,
    #[pyo3(from_py_with = crate::counts::kvikio::kb)] kb: usize,
) -> PyResult<()> {
    nogil(py, move || CuFileDriver::get()?.set_max_cache_size_kb(kb))
}

/// `cuFileDriverSetMaxPinnedMemSize`, KiB (errors as `driver_set_poll_mode`).
#[pyfunction]
pub fn driver_set_max_pinned_mem_size(
    py: Python<'_>,
    #[pyo3(from_py_with = crate::counts::kvikio::kb)] kb: usize,
) -> PyResult<()> {
    nogil(py, move || CuFileDriver::get()?.set_max_pinned_mem_size_kb(kb))
}

/// The cuFile library's version as `(major, minor)` (`cuFileGetVersion`, no driver opened);
/// `(0, 0)` where no cuFile library loads or it is older than that call (1.8).
#[pyfunction]
pub fn library_version(py: Python<'_>) -> (u32, u32) {
    py.detach(|| CuFileDriver::library_version().ok().flatten().unwrap_or((0, 0)))
}

/// What the machine offers, every "no" with its reason, as a dict.
#[pyfunction]
pub fn capabilities(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let caps = py.detach(gpumap::Capabilities::probe);
    let d = PyDict::new(py);
    let devices = PyList::empty(py);
    if let Some(cuda) = caps.cuda.available() {
        d.set_item("cuda_driver_version", cuda.driver_version)?;
        for dev in &cuda.devices {
            let e = PyDict::new(py);
            e.set_item("ordinal", dev.ordinal)?;
            e.set_item("name", &dev.name)?;
            e.set_item("total_memory", dev.total_memory)?;
            e.set_item("pci_bus_id", &dev.pci_bus_id)?;
            e.set_item("error", dev.error.clone())?;
            devices.append(e)?;
        }
    } else {
        d.set_item("cuda_driver_version", py.None())?;
    }
    d.set_item("devices", devices)?;
    d.set_item("cuda_reason", caps.cuda.reason())?;
    d.set_item("cufile_library", caps.cufile.available().map(|c| c.library.clone()))?;
    d.set_item("cufile_usable", caps.cufile_usable().is_ok())?;
    d.set_item("cufile_reason", caps.cufile_usable().err())?;
    d.set_item("run_udev", caps.run_udev.is_available())?;
    d.set_item("wsl", caps.wsl)?;
    Ok(d)
}

/// Number of CUDA devices (0 without a driver).
#[pyfunction]
pub fn gpu_count(py: Python<'_>) -> usize {
    py.detach(|| CudaDevice::count().unwrap_or(0))
}

/// A CUDA stream of gpumap's on device `device` (non-blocking: it does not wait for the legacy
/// default stream), to order `Handle.read_async` / `write_async` and `CuFile.raw_read_async`
/// on.
#[pyclass(module = "gpumapio.cufile_driver", name = "Stream", frozen)]
pub struct Stream {
    pub(crate) stream: GpuStream,
}

#[pymethods]
impl Stream {
    #[new]
    #[pyo3(signature = (device = 0))]
    fn new(
        py: Python<'_>,
        #[pyo3(from_py_with = crate::counts::kvikio::device)] device: usize,
    ) -> PyResult<Stream> {
        let stream = nogil(py, move || GpuStream::new(&CudaDevice::new(device)?))?;
        Ok(Stream { stream })
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.stream.device().ordinal()
    }

    /// Waits for all work queued on the stream.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        nogil(py, || self.stream.synchronize())
    }
}

/// A file registered with cuFile (`cuFileHandleRegister`), opened with `O_DIRECT` where the
/// file system allows it. Raises `UnavailableError` without cuFile, `CuFileError` when cuFile
/// refuses the file.
#[pyclass(module = "gpumapio.cufile_driver", name = "Handle", frozen)]
pub struct Handle {
    /// Declared first: deregistered before the file closes.
    registration: Mutex<Option<CuFileHandle>>,
    _file: File,
    path: PathBuf,
}

impl Handle {
    fn registration(&self) -> PyResult<CuFileHandle> {
        self.registration
            .lock()
            .clone()
            .ok_or_else(|| PyValueError::new_err("the cuFile handle is deregistered"))
    }
}

/// `size` (default: the rest of the buffer after `dev_offset`) checked against `len`.
fn span(len: usize, size: Option<usize>, dev_offset: usize) -> PyResult<usize> {
    let available = len.checked_sub(dev_offset).ok_or_else(|| {
        PyValueError::new_err(format!("dev_offset {dev_offset} is past the buffer of {len} bytes"))
    })?;
    match size {
        None => Ok(available),
        Some(n) if n <= available => Ok(n),
        Some(n) => Err(PyValueError::new_err(format!(
            "{n} bytes at dev_offset {dev_offset} do not fit in the buffer of {len} bytes"
        ))),
    }
}

/// `buf`'s device memory to read into, whole from byte 0 (cuFile takes `dev_offset` itself),
/// with its keeper and the `size` bytes (default: the rest after `dev_offset`) to move.
fn cuda_destination(
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    size: Option<usize>,
    dev_offset: usize,
) -> PyResult<(CudaViewMut<'static>, Keeper, usize)> {
    let mem = memory(buf, true)?;
    let len = span(mem.len(), size, dev_offset)?;
    let (view, keep) = mem.into_cuda_dst(py, 0, dev_offset + len)?;
    Ok((view, keep, len))
}

/// `buf`'s device memory to write from, as [`cuda_destination`] gives it to read into.
fn cuda_source(
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    size: Option<usize>,
    dev_offset: usize,
) -> PyResult<(CudaView<'static>, Keeper, usize)> {
    let mem = memory(buf, false)?;
    let len = span(mem.len(), size, dev_offset)?;
    let (view, keep) = mem.into_cuda_src(py, 0, dev_offset + len)?;
    Ok((view, keep, len))
}

/// A stream-ordered cuFile operation and the memory it uses.
struct AsyncPending {
    io: gpumap::io::gds::AsyncIo<'static>,
    keep: Keeper,
}

impl Pending for AsyncPending {
    fn is_done(&self) -> bool {
        false
    }

    fn wait(self: Box<Self>) -> (gpumap::Result<usize>, Option<Box<dyn std::any::Any + Send>>) {
        let AsyncPending { io, keep } = *self;
        (io.wait(), Some(Box::new(keep)))
    }
}

#[pymethods]
impl Handle {
    #[new]
    #[pyo3(signature = (file, flags = "r"))]
    fn new(
        py: Python<'_>,
        #[pyo3(from_py_with = crate::paths::path)] file: PathBuf,
        flags: &str,
    ) -> PyResult<Handle> {
        let path = file.clone();
        let flags = flags.to_string();
        let (file_obj, registration) = nogil(py, move || {
            CuFileDriver::get()?;
            let f = open_for_cufile(&path, &flags)?;
            let registration = CuFileHandle::register(&f, &path)?;
            Ok((f, registration))
        })?;
        Ok(Handle { registration: Mutex::new(Some(registration)), _file: file_obj, path: file })
    }

    /// The path registered.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Deregisters the file (`cuFileHandleDeregister`, once operations using it are done).
    fn deregister(&self) {
        self.registration.lock().take();
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
        self.deregister();
        false
    }

    /// `cuFileRead`: reads `size` bytes (default: the rest of the buffer after `dev_offset`) at
    /// `file_offset` into device memory `buf` at `dev_offset`; blocks; returns the bytes read.
    #[pyo3(signature = (buf, size = None, file_offset = 0, dev_offset = 0))]
    fn read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::kvikio::size_in_memory)] size: Option<usize>,
        #[pyo3(from_py_with = crate::counts::kvikio::file_offset)] file_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::dev_offset)] dev_offset: usize,
    ) -> PyResult<usize> {
        let reg = self.registration()?;
        let (view, keep, len) = cuda_destination(py, buf, size, dev_offset)?;
        let n = nogil(py, move || reg.read(view, dev_offset, len, file_offset));
        drop(keep);
        n
    }

    /// `cuFileWrite`: writes `size` bytes of device memory `buf` from `dev_offset` at
    /// `file_offset`; blocks; returns the bytes written.
    #[pyo3(signature = (buf, size = None, file_offset = 0, dev_offset = 0))]
    fn write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::counts::kvikio::size_in_memory)] size: Option<usize>,
        #[pyo3(from_py_with = crate::counts::kvikio::file_offset)] file_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::dev_offset)] dev_offset: usize,
    ) -> PyResult<usize> {
        let reg = self.registration()?;
        let (view, keep, len) = cuda_source(py, buf, size, dev_offset)?;
        let n = nogil(py, move || reg.write(view, dev_offset, len, file_offset));
        drop(keep);
        n
    }

    /// cuFile's batch API: each entry `(buf, file_offset)` or `(buf, file_offset, size)` reads
    /// into device memory `buf` (all on one device). Blocks until all completed; returns, per
    /// entry, the bytes read or the exception that entry failed with (not raised).
    fn read_batch<'py>(
        &self,
        py: Python<'py>,
        entries: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyList>> {
        let reg = self.registration()?;
        let mut views = Vec::with_capacity(entries.len());
        let mut keeps = Vec::with_capacity(entries.len());
        for entry in entries.iter() {
            let (buf, file_offset, size): (Bound<'_, PyAny>, u64, Option<usize>) =
                match entry.extract::<(Bound<'_, PyAny>, u64)>() {
                    Ok((b, o)) => (b, o, None),
                    Err(_) => entry.extract().map_err(|_| {
                        PyTypeError::new_err("batch entries are (buf, file_offset[, size])")
                    })?,
                };
            let mem = memory(&buf, true)?;
            let len = span(mem.len(), size, 0)?;
            let (view, keep) = mem.into_cuda_dst(py, 0, len)?;
            views.push(BatchRead { dst: view, dst_offset: 0, len, file_offset });
            keeps.push(keep);
        }
        let results = nogil(py, move || reg.read_batch(&mut views))?;
        drop(keeps);
        let out = PyList::empty(py);
        for r in results {
            match r {
                Ok(n) => out.append(n)?,
                Err(e) => out.append(to_py(py, &e).into_value(py))?,
            }
        }
        Ok(out)
    }

    /// `cuFileReadAsync` on `stream`: enqueues a read of `size` bytes at `file_offset` into
    /// `buf` at `dev_offset`; it runs when the stream reaches it. `check_bytes_done()` on the
    /// result waits for it (keep the result alive until then).
    #[pyo3(signature = (buf, stream, size = None, file_offset = 0, dev_offset = 0))]
    fn read_async(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        stream: &Stream,
        #[pyo3(from_py_with = crate::counts::kvikio::size_in_memory)] size: Option<usize>,
        #[pyo3(from_py_with = crate::counts::kvikio::file_offset)] file_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::dev_offset)] dev_offset: usize,
    ) -> PyResult<IOFutureStream> {
        let reg = self.registration()?;
        let (view, keep, len) = cuda_destination(py, buf, size, dev_offset)?;
        let io = check(py, reg.read_async(&stream.stream, view, dev_offset, len, file_offset))?;
        Ok(IOFutureStream::pending(Box::new(AsyncPending { io, keep })))
    }

    /// `cuFileWriteAsync` on `stream` (see `read_async`).
    #[pyo3(signature = (buf, stream, size = None, file_offset = 0, dev_offset = 0))]
    fn write_async(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        stream: &Stream,
        #[pyo3(from_py_with = crate::counts::kvikio::size_in_memory)] size: Option<usize>,
        #[pyo3(from_py_with = crate::counts::kvikio::file_offset)] file_offset: u64,
        #[pyo3(from_py_with = crate::counts::kvikio::dev_offset)] dev_offset: usize,
    ) -> PyResult<IOFutureStream> {
        let reg = self.registration()?;
        let (view, keep, len) = cuda_source(py, buf, size, dev_offset)?;
        let io = check(py, reg.write_async(&stream.stream, view, dev_offset, len, file_offset))?;
        Ok(IOFutureStream::pending(Box::new(AsyncPending { io, keep })))
    }
}

/// Device memory registered with cuFile (`cuFileBufRegister`) until `deregister()` or the end
/// of a `with` block.
#[pyclass(module = "gpumapio.cufile_driver", name = "BufferRegistration", frozen)]
pub struct BufferRegistration {
    /// Declared first: deregistered before the memory's owner is let go.
    registration: Mutex<Option<RegisteredBuffer<'static>>>,
    _keep: Keeper,
    address: u64,
    length: usize,
}

#[pymethods]
impl BufferRegistration {
    /// The device address registered.
    #[getter]
    fn address(&self) -> u64 {
        self.address
    }

    /// Bytes registered.
    #[getter]
    fn length(&self) -> usize {
        self.length
    }

    /// Deregisters (`cuFileBufDeregister`); again: nothing.
    fn deregister(&self) {
        self.registration.lock().take();
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
        self.deregister();
        false
    }
}

/// Registers the device memory of `buf` with cuFile (`cuFileBufRegister`).
#[pyfunction]
pub fn buf_register(py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<BufferRegistration> {
    let mem = memory(buf, false)?;
    let (address, length) = (mem.address(), mem.len());
    let (view, keep) = mem.into_cuda_src(py, 0, length)?;
    let registration = nogil(py, move || CuFileHandle::register_buffer(view))?;
    Ok(BufferRegistration {
        registration: Mutex::new(Some(registration)),
        _keep: keep,
        address,
        length,
    })
}
