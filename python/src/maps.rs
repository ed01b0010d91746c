//! Maps: files in GPU memory with mmap semantics, through gpumap's `DeviceCache` — the classes
//! `DeviceCache`, `MappedFile` and `View` of `gpumapio.maps`.
//!
//! A `View` pins its range of the cache until it is released (`release()`, leaving a `with`
//! block, or garbage collection) *and* every export of it is gone: an array made through
//! `__cuda_array_interface__` keeps the view object alive, and a DLPack capsule holds the pin
//! itself until its consumer calls the deleter. So the memory under a CuPy array or a torch
//! tensor made from a view is never evicted while the array lives.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::Arc;

use gpumap::io::IoFuture;
use gpumap::mapped::{
    Advice, CacheOptions, CacheStats, DeviceCache as Cache, DeviceMappedFile, FileStats,
    View as ReadView, ViewMut, ZeroCopy,
};
use gpumap::memory::Device;
use parking_lot::Mutex;
use pyo3::exceptions::{
    PyAttributeError, PyBufferError, PyMemoryError, PyRuntimeWarning, PyValueError,
};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::buffers::memory;
use crate::dlpack::{self, DL_CUDA};
use crate::errors::{check, nogil, to_py};
use crate::future::{IOFuture, Pending};

/// `device`: `None`/`"auto"` (GPU 0 where there is one), an ordinal, or `"host"`.
fn device_arg(device: Option<&Bound<'_, PyAny>>) -> PyResult<Device> {
    let Some(device) = device else { return Ok(Device::auto()) };
    if let Ok(ordinal) = device.extract::<usize>() {
        return check(device.py(), Device::cuda(ordinal));
    }
    match device.extract::<String>()?.as_str() {
        "auto" => Ok(Device::auto()),
        "host" | "cpu" => Ok(Device::Host),
        other => match other.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
            Some(ordinal) => check(device.py(), Device::cuda(ordinal)),
            None => Err(PyValueError::new_err(format!(
                "device {other:?}: expected a GPU ordinal, \"cuda:N\", \"host\" or \"auto\""
            ))),
        },
    }
}

/// What both ways of opening a map take (`DeviceCache.open`, `MappedFile.open`).
fn map_options(
    writable: bool,
    advice: &str,
    zero_copy: bool,
    max_pinned: Option<u64>,
    read_ahead: Option<u64>,
) -> PyResult<gpumap::mapped::MapOptions> {
    let mut o = gpumap::mapped::MapOptions::new();
    o.writable(writable).advice(advice_arg(advice)?);
    if zero_copy {
        o.zero_copy(max_pinned.map_or(ZeroCopy::On, ZeroCopy::Within));
    }
    if let Some(bytes) = read_ahead {
        o.read_ahead(bytes);
    }
    Ok(o)
}

fn advice_arg(advice: &str) -> PyResult<Advice> {
    Ok(match advice {
        "normal" => Advice::Normal,
        "sequential" => Advice::Sequential,
        "random" => Advice::Random,
        "willneed" => Advice::WillNeed,
        "dontneed" => Advice::DontNeed,
        other => {
            return Err(PyValueError::new_err(format!(
                "advice {other:?}: expected normal, sequential, random, willneed or dontneed"
            )))
        }
    })
}

fn file_stats<'py>(py: Python<'py>, s: &FileStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("len", s.len)?;
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    d.set_item("fault_reads", s.fault_reads)?;
    d.set_item("bytes_faulted", s.bytes_faulted)?;
    d.set_item("rows_read_through", s.rows_read_through)?;
    d.set_item("evictions", s.evictions)?;
    d.set_item("bytes_written_back", s.bytes_written_back)?;
    d.set_item("write_errors", s.write_errors)?;
    d.set_item("resident_bytes", s.resident_bytes)?;
    d.set_item("dirty_bytes", s.dirty_bytes)?;
    d.set_item("frames", s.frames)?;
    d.set_item("slots", s.slots)?;
    Ok(d)
}

fn cache_stats<'py>(py: Python<'py>, s: &CacheStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("budget", s.budget)?;
    d.set_item("shards", s.shards)?;
    d.set_item("frame_size", s.frame_size)?;
    d.set_item("extent_size", s.extent_size)?;
    d.set_item("used_bytes", s.used_bytes)?;
    d.set_item("slots_in_use", s.slots_in_use)?;
    d.set_item("files", s.files)?;
    d.set_item("totals", file_stats(py, &s.totals)?)?;
    d.set_item("map_seconds", s.map_seconds)?;
    d.set_item("fault_seconds", s.fault_seconds)?;
    Ok(d)
}

/// `[offset, offset + len)` checked against a map of `file_len` bytes, with the library's
/// error, before anything is allocated for it: a caller's length must not size an allocation
/// until it is known to be inside the file.
fn check_range(py: Python<'_>, offset: u64, len: u64, file_len: u64) -> PyResult<()> {
    match offset.checked_add(len) {
        Some(end) if end <= file_len => Ok(()),
        _ => Err(to_py(py, &gpumap::Error::OutOfRange { offset, len, file_len })),
    }
}

/// A new `bytes` of `len` bytes, filled by `fill` with the GIL released. Python allocates it,
/// so memory that cannot be had is a `MemoryError`, as for Python's own objects (a Rust `Vec`
/// would abort the process).
fn filled_bytes<'py, F>(py: Python<'py>, len: usize, fill: F) -> PyResult<Bound<'py, PyBytes>>
where
    F: FnOnce(&mut [u8]) -> gpumap::Result<()> + Send,
{
    // Not yet seen by any other Python code, so filling it without the GIL races with nothing.
    PyBytes::new_with(py, len, |bytes| nogil(py, move || fill(bytes)))
}

/// A host copy of device memory `src`, in a buffer whose allocation may fail (`MemoryError`).
fn host_copy(src: gpumap::memory::cuda::CudaView<'_>) -> PyResult<Vec<u8>> {
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(src.len()).map_err(|_| {
        PyMemoryError::new_err(format!("{} bytes of host memory for a copy", src.len()))
    })?;
    bytes.resize(src.len(), 0);
    Ok(bytes)
}

/// One budget of GPU memory (host memory without a GPU) shared by the files opened in it,
/// least recently used memory evicted first across them.
#[pyclass(module = "gpumapio", name = "DeviceCache", frozen)]
pub struct DeviceCache {
    inner: Cache,
}

#[pymethods]
impl DeviceCache {
    #[new]
    #[pyo3(signature = (budget, *, extent_size = 65536, frame_size = None, device = None, shards = None))]
    fn new(
        py: Python<'_>,
        budget: u64,
        extent_size: u64,
        frame_size: Option<u64>,
        device: Option<Bound<'_, PyAny>>,
        shards: Option<usize>,
    ) -> PyResult<Self> {
        let device = device_arg(device.as_ref())?;
        let inner = nogil(py, move || {
            let mut o = CacheOptions::new();
            o.budget(budget).extent_size(extent_size).memory(device);
            if let Some(frame) = frame_size {
                o.frame_size(frame);
            }
            if let Some(shards) = shards {
                o.shards(shards);
            }
            o.build()
        })?;
        Ok(DeviceCache { inner })
    }

    /// The frame size a cache of `budget` bytes gets when `frame_size` is not given: a
    /// thirty-second of the budget as a power of two, from 8 MiB to 64 MiB.
    #[staticmethod]
    fn default_frame_size(budget: u64) -> u64 {
        gpumap::mapped::CacheOptions::default_frame_size(budget)
    }

    /// Opens `path` in this cache (read-only unless `writable`). `zero_copy`: gathers and views
    /// read the file in place from the host's page cache (registered for the GPU; the whole
    /// file is read and pinned, within `max_pinned` bytes across the process). `read_ahead`:
    /// bytes a walk reads ahead (default 512 MiB; 0: none).
    #[pyo3(signature = (path, *, writable = false, advice = "normal", zero_copy = false, max_pinned = None, read_ahead = None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        &self,
        py: Python<'_>,
        path: PathBuf,
        writable: bool,
        advice: &str,
        zero_copy: bool,
        max_pinned: Option<u64>,
        read_ahead: Option<u64>,
    ) -> PyResult<MappedFile> {
        let o = map_options(writable, advice, zero_copy, max_pinned, read_ahead)?;
        let cache = self.inner.clone();
        let inner = nogil(py, move || cache.open_with(&path, &o))?;
        Ok(MappedFile::new(inner, self.inner.clone()))
    }

    /// `{"budget", "used_bytes", "slots_in_use", "files", "totals": {...}, ...}`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cache_stats(py, &self.inner.stats())
    }

    /// Writes back every dirty extent of every file.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let cache = self.inner.clone();
        nogil(py, move || cache.flush())
    }

    /// `flush`, then fdatasync of every written file.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let cache = self.inner.clone();
        nogil(py, move || cache.sync())
    }

    /// Waits until rows that gathers read past the full cache have been admitted to it.
    fn wait_for_admissions(&self, py: Python<'_>) -> PyResult<()> {
        let cache = self.inner.clone();
        nogil(py, move || {
            cache.wait_for_admissions();
            Ok(())
        })
    }

    /// Copies `ranges` (`(file, offset, length)`, files of this cache) packed one after another
    /// into `out` (a CuPy/torch/Numba array, or host memory).
    fn gather(
        &self,
        py: Python<'_>,
        ranges: Vec<(PyRef<'_, MappedFile>, u64, u64)>,
        out: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let total =
            ranges.iter().try_fold(0u64, |sum, r| sum.checked_add(r.2)).ok_or_else(|| {
                PyValueError::new_err("the lengths of the ranges overflow 64 bits when added up")
            })?;
        let total = usize::try_from(total)
            .map_err(|_| PyValueError::new_err(format!("{total} bytes do not fit in memory")))?;
        let mut dst = memory(&out, true)?.into_dst(py, 0, total)?;
        let maps: Vec<(DeviceMappedFile, u64, u64)> =
            ranges.iter().map(|(m, o, l)| (m.inner.clone(), *o, *l)).collect();
        let cache = self.inner.clone();
        nogil(py, move || {
            let ranges: Vec<_> = maps.iter().map(|(m, o, l)| m.range(*o, *l)).collect();
            cache.gather(&ranges, dst.view())
        })
    }

    /// `"GPU 0 (NVIDIA H100 PCIe)"` or `"host memory"`.
    #[getter]
    fn device(&self) -> String {
        self.inner.device().describe()
    }

    fn __repr__(&self) -> String {
        let s = self.inner.stats();
        format!(
            "<gpumapio.DeviceCache on {}: {} of {} bytes used, {} files>",
            self.inner.device().describe(),
            s.used_bytes,
            s.budget,
            s.files
        )
    }
}

/// A file mapped into GPU memory (host memory without a GPU): views, gathers, write-back.
#[pyclass(module = "gpumapio", name = "MappedFile", frozen)]
pub struct MappedFile {
    inner: DeviceMappedFile,
    /// The cache the file is in (a cache of its own for `MappedFile.open`).
    cache: Cache,
    /// Shared with the views: the last of them to go flushes (see [`MapHandle`]).
    handle: Arc<MapHandle>,
}

impl MappedFile {
    fn new(map: DeviceMappedFile, cache: Cache) -> MappedFile {
        MappedFile { handle: Arc::new(MapHandle { map: map.clone() }), inner: map, cache }
    }
}

/// The binding's hold on a map, shared by its `MappedFile` and its views. When the last of
/// them goes, a writable map with dirty bytes is flushed here, and a failure is raised as a
/// `RuntimeWarning`: the library's own flush when its last handle drops can only log (through
/// `tracing`, which Python users do not see). Python code is the only writer of a map it
/// opened, so after this flush nothing dirties it again.
struct MapHandle {
    map: DeviceMappedFile,
}

impl Drop for MapHandle {
    fn drop(&mut self) {
        if !self.map.is_writable() {
            return;
        }
        let dirty = self.map.stats().dirty_bytes;
        // SAFETY: a plain query, valid at any time.
        if dirty == 0 || unsafe { ffi::Py_IsInitialized() } == 0 {
            return; // nothing to lose, or no interpreter left to tell (the library still logs)
        }
        // The last holder may be a DLPack deleter run by a consumer without the GIL.
        Python::attach(|py| {
            let map = self.map.clone();
            let Err(e) = py.detach(move || map.flush()) else { return };
            let message = format!(
                "{dirty} dirty bytes of {} could not be written back when its last MappedFile and \
                 views were released: {}; the cache tries once more as it closes the file, and \
                 what that cannot write is lost (flush() or close() raise such errors)",
                self.map.path().display(),
                gpumap::error::Report(&e)
            );
            let message = CString::new(message.replace('\0', "")).unwrap_or_default();
            let category = py.get_type::<PyRuntimeWarning>();
            if let Err(raised) = PyErr::warn(py, &category, &message, 1) {
                // Warnings made errors: there is no caller to raise into from here.
                raised.write_unraisable(py, None);
            }
        });
    }
}

/// A prefetch in flight, for `IOFuture`.
struct Prefetch(IoFuture<()>, usize);

impl Pending for Prefetch {
    fn is_done(&self) -> bool {
        self.0.is_done()
    }

    fn wait_timeout(&self, timeout: std::time::Duration) -> bool {
        self.0.wait_timeout(timeout)
    }

    fn wait(self: Box<Self>) -> (gpumap::Result<usize>, Option<Box<dyn std::any::Any + Send>>) {
        let n = self.1;
        (self.0.wait().map(|()| n), None)
    }
}

#[pymethods]
impl MappedFile {
    /// Maps `path` in a cache of its own (`gpumapio.map` without a cache): `budget` bytes,
    /// by default the file's size up to 4 GiB in whole frames of the size that budget gets —
    /// the library's `CacheOptions::for_file`, so Python and Rust size the cache alike.
    #[staticmethod]
    #[pyo3(signature = (path, *, budget = None, writable = false, extent_size = 65536, frame_size = None, device = None, advice = "normal", zero_copy = false, max_pinned = None, read_ahead = None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        path: PathBuf,
        budget: Option<u64>,
        writable: bool,
        extent_size: u64,
        frame_size: Option<u64>,
        device: Option<Bound<'_, PyAny>>,
        advice: &str,
        zero_copy: bool,
        max_pinned: Option<u64>,
        read_ahead: Option<u64>,
    ) -> PyResult<MappedFile> {
        let o = map_options(writable, advice, zero_copy, max_pinned, read_ahead)?;
        let device = device_arg(device.as_ref())?;
        let (inner, cache) = nogil(py, move || {
            let mut c = match budget {
                Some(budget) => {
                    let mut c = CacheOptions::new();
                    c.budget(budget);
                    c
                }
                None => CacheOptions::for_file(std::fs::metadata(&path).map(|m| m.len()).map_err(
                    |e| gpumap::Error::Io {
                        op: "stat",
                        path: Some(path.clone()),
                        offset: None,
                        source: e,
                    },
                )?),
            };
            c.extent_size(extent_size).memory(device);
            if let Some(frame) = frame_size {
                c.frame_size(frame);
            }
            let cache = c.build()?;
            Ok((cache.open_with(&path, &o)?, cache))
        })?;
        Ok(MappedFile::new(inner, cache))
    }

    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    /// Bytes mapped.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.inner.len()
    }

    /// The path it was opened with.
    #[getter]
    fn path(&self) -> PathBuf {
        self.inner.path().to_path_buf()
    }

    /// Whether writes are allowed.
    #[getter]
    fn writable(&self) -> bool {
        self.inner.is_writable()
    }

    /// The device address of the file's byte 0 (byte `o` is at `base + o` while a view pins
    /// it); `None` on host memory.
    #[getter]
    fn base(&self) -> Option<u64> {
        self.inner.base()
    }

    /// The cache the file is in.
    #[getter]
    fn cache(&self) -> DeviceCache {
        DeviceCache { inner: self.cache.clone() }
    }

    /// A view of `[offset, offset + length)`, resident and pinned until released; `writable`
    /// views need a writable map, and their bytes are written back after release.
    #[pyo3(signature = (offset, length, *, writable = false))]
    fn view(&self, py: Python<'_>, offset: u64, length: u64, writable: bool) -> PyResult<View> {
        let map = self.inner.clone();
        let pin = nogil(py, move || {
            Ok(if writable {
                Pin::Write(Mutex::new(map.view_mut(offset, length)?))
            } else {
                Pin::Read(map.view(offset, length)?)
            })
        })?;
        let held = Held { pin, _map: self.handle.clone() };
        Ok(View::new(held, offset, length, writable))
    }

    /// The bytes of `[offset, offset + length)`, through the cache.
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        check_range(py, offset, length as u64, self.inner.len())?;
        let map = self.inner.clone();
        filled_bytes(py, length, move |bytes| map.read(offset, bytes))
    }

    /// Copies `data` (bytes-like) to `offset` of the map; written back later (or by `flush`).
    fn write(&self, py: Python<'_>, offset: u64, data: Bound<'_, PyAny>) -> PyResult<()> {
        let src = memory(&data, false)?;
        let len = src.len();
        check_range(py, offset, len as u64, self.inner.len())?;
        let src = src.into_src(py, 0, len)?;
        let staging = match src.view() {
            gpumap::memory::DeviceView::Host(_) => Vec::new(),
            gpumap::memory::DeviceView::Cuda(view) => host_copy(view)?,
        };
        let map = self.inner.clone();
        nogil(py, move || match src.view() {
            gpumap::memory::DeviceView::Host(bytes) => map.write(offset, bytes),
            gpumap::memory::DeviceView::Cuda(view) => {
                let mut bytes = staging;
                view.copy_to_host(0, &mut bytes)?;
                map.write(offset, &bytes)
            }
        })
    }

    /// Copies `length` bytes at each of `offsets` (rows of a table), packed in order, into
    /// `out` (a CuPy/torch/Numba array, or host memory).
    fn gather(
        &self,
        py: Python<'_>,
        offsets: Vec<u64>,
        length: u64,
        out: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let total = (offsets.len() as u64).checked_mul(length).ok_or_else(|| {
            PyValueError::new_err(format!("{} rows of {length} bytes overflow", offsets.len()))
        })?;
        let mut dst = memory(&out, true)?.into_dst(py, 0, total as usize)?;
        let map = self.inner.clone();
        let ranges: Vec<(u64, u64)> = offsets.iter().map(|&offset| (offset, length)).collect();
        nogil(py, move || map.gather(&ranges, dst.view()))
    }

    /// Copies rows `indices` of the file (row `i`: bytes `i * row_size .. (i + 1) *
    /// row_size`) in order into `out`, and returns when they are there. `indices`: int32 or
    /// int64, on the host (NumPy, array.array) or on the GPU (CuPy, torch), any shape (taken
    /// in C order). `out`: at least `len(indices) * row_size` bytes, GPU or host memory.
    /// `stream`: a torch or CuPy stream (or a raw `CUstream`) to run the gather's kernel on,
    /// after the work queued there; by default gpumap's own.
    #[pyo3(signature = (indices, row_size, out, *, stream = None))]
    fn gather_rows(
        &self,
        py: Python<'_>,
        indices: Bound<'_, PyAny>,
        row_size: u64,
        out: Bound<'_, PyAny>,
        stream: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let rows = crate::rows::Rows::new(py, &indices, row_size, &out)?;
        let stream = match (&stream, self.inner.device()) {
            (Some(s), Device::Cuda(device)) => Some(crate::rows::stream_arg(py, s, &device)?),
            _ => None,
        };
        let map = self.inner.clone();
        rows.run(py, move |indices, dst| match stream {
            Some(stream) => map.gather_rows_on(indices, row_size, dst, stream),
            None => map.gather_rows(indices, row_size, dst),
        })
    }

    /// Reads `[offset, offset + length)` in the background; the future's `get()` returns the
    /// length when it is resident.
    fn prefetch(&self, offset: u64, length: u64) -> IOFuture {
        IOFuture::pending(Box::new(Prefetch(self.inner.prefetch(offset, length), length as usize)))
    }

    /// madvise-like advice for a range: "normal", "sequential", "random", "willneed",
    /// "dontneed".
    fn advise(&self, py: Python<'_>, offset: u64, length: u64, advice: &str) -> PyResult<()> {
        let advice = advice_arg(advice)?;
        let map = self.inner.clone();
        nogil(py, move || map.advise(offset, length, advice))
    }

    /// Writes every dirty extent back (raises the error of an earlier failed write-back until
    /// a `sync` succeeds).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let map = self.inner.clone();
        nogil(py, move || map.flush())
    }

    /// Like `flush`, for `[offset, offset + length)`.
    fn flush_range(&self, py: Python<'_>, offset: u64, length: u64) -> PyResult<()> {
        let map = self.inner.clone();
        nogil(py, move || map.flush_range(offset, length))
    }

    /// `flush`, then fdatasync: durable when it returns.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let map = self.inner.clone();
        nogil(py, move || map.sync())
    }

    /// Writes back, then gives up the memory no view pins.
    fn evict(&self, py: Python<'_>) -> PyResult<()> {
        let map = self.inner.clone();
        nogil(py, move || map.evict())
    }

    /// Flushes (for a writable map) and raises its error; the memory goes when the last view
    /// and handle do.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.inner.is_writable() {
            self.flush(py)?;
        }
        Ok(())
    }

    /// `{"hits", "misses", "bytes_faulted", "evictions", "resident_bytes", ...}`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        file_stats(py, &self.inner.stats())
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<gpumapio.MappedFile {} ({} bytes) in {}>",
            self.inner.path().display(),
            self.inner.len(),
            self.inner.memory()
        )
    }
}

/// A view's pin.
enum Pin {
    Read(ReadView),
    Write(Mutex<ViewMut>),
}

/// What a `View` (and each export of it) holds: its pin, then the binding's handle on the map,
/// so that the map is flushed only after the last view's bytes were let go.
struct Held {
    pin: Pin,
    _map: Arc<MapHandle>,
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
    fn new(held: Held, offset: u64, nbytes: u64, writable: bool) -> View {
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
    fn write(&self, py: Python<'_>, data: Bound<'_, PyAny>, at: u64) -> PyResult<()> {
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
        self.held.lock().take();
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
