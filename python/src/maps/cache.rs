//! The classes `DeviceCache` (one memory budget) and `MappedFile` (a file in it). They live in
//! one module because each hands out the other: a cache opens files, a file names its cache.
//!
//! Both are their process's: a child forked from the process that made them (a `DataLoader`'s
//! worker, whose dataset opened its map in `__init__`) gets a cache of its own, empty, made with
//! the same options, and opens the file again in it on first use. The parent's are forgotten
//! there, never used nor dropped: their books were copied at the fork with whatever the
//! parent's threads were doing half done (an extent being read, a call in flight), and their
//! dirty bytes are the parent's to write back (see `gpumap::per_process`).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use gpumap::io::IoFuture;
use gpumap::mapped::{CacheOptions, DeviceCache as Cache, DeviceMappedFile, FileStats, MapOptions};
use gpumap::memory::Device;
use gpumap::per_process::ForkLocal;
use gpumap::sync::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use super::close_gate::{CloseGate, Passage};
use super::host_bytes::{filled_bytes, host_copy};
use super::lookups::LookupScope;
use super::map_handle::MapHandle;
use super::options::{advice_arg, device_arg, map_options};
use super::stats::{cache_stats, file_stats};
use super::view::{Held, Pin, View};
use crate::buffers::memory;
use crate::errors::{nogil, nogil_interruptibly, to_py};
use crate::future::{IOFuture, Pending};

/// What a map is opened from: a local path, or an `s3://` / `http(s)://` URL (mapped
/// read-only, its extents fetched with ranged GETs).
enum Location {
    Path(PathBuf),
    Url(String),
}

impl<'a, 'py> FromPyObject<'a, 'py> for Location {
    type Error = PyErr;

    fn extract(ob: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(text) = ob.extract::<String>() {
            if gpumap::remote::is_remote_url(&text) {
                return Ok(Location::Url(text));
            }
        }
        Ok(Location::Path(crate::paths::path(&ob)?))
    }
}

/// A map's source once opened: a local path and its length, or a remote object.
enum Opened {
    Local(PathBuf, u64),
    Remote(gpumap::remote::RemoteFile),
}

/// The remote object at `url`, with `gpumapio.defaults`' retry settings and the AWS
/// environment's credentials.
fn open_remote(url: &str) -> gpumap::Result<gpumap::remote::RemoteFile> {
    let options = crate::remote::RemoteSettings::default().options()?;
    gpumap::remote::RemoteFile::open_with(url, &options)
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

/// A cache of the process that uses it: the one built, or in a forked child one of its own
/// built with the same options on first use.
pub(super) struct ProcessCache {
    options: CacheOptions,
    cache: ForkLocal<Cache>,
}

impl ProcessCache {
    fn build(options: CacheOptions) -> gpumap::Result<Arc<ProcessCache>> {
        let cache = ForkLocal::new(options.build()?);
        Ok(Arc::new(ProcessCache { options, cache }))
    }

    /// This process's cache.
    pub(super) fn get(&self) -> gpumap::Result<Cache> {
        self.cache.get(|| self.options.build())
    }
}

/// One budget of GPU memory (host memory without a GPU) shared by the files opened in it,
/// least recently used memory evicted first across them.
#[pyclass(module = "gpumapio", name = "DeviceCache", frozen)]
pub struct DeviceCache {
    inner: Arc<ProcessCache>,
}

impl DeviceCache {
    /// This process's cache.
    fn cache(&self, py: Python<'_>) -> PyResult<Cache> {
        self.inner.get().map_err(|e| to_py(py, &e))
    }
}

#[pymethods]
impl DeviceCache {
    #[new]
    #[pyo3(signature = (budget, *, extent_size = 65536, frame_size = None, device = None, shards = None))]
    fn new(
        py: Python<'_>,
        #[pyo3(from_py_with = crate::counts::budget)] budget: u64,
        #[pyo3(from_py_with = crate::counts::extent_size)] extent_size: u64,
        #[pyo3(from_py_with = crate::counts::frame_size_or_none)] frame_size: Option<u64>,
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
            ProcessCache::build(o)
        })?;
        Ok(DeviceCache { inner })
    }

    /// The frame size a cache of `budget` bytes gets when `frame_size` is not given: a
    /// thirty-second of the budget as a power of two, from 8 MiB to 64 MiB.
    #[staticmethod]
    fn default_frame_size(#[pyo3(from_py_with = crate::counts::budget)] budget: u64) -> u64 {
        gpumap::mapped::CacheOptions::default_frame_size(budget)
    }

    /// Opens `path` in this cache (read-only unless `writable`). `zero_copy`: gathers and views
    /// read the file in place from the host's page cache (registered for the GPU; the whole
    /// file is read and pinned, within `max_pinned` bytes across the process). `read_ahead`:
    /// bytes a walk reads ahead (default 512 MiB; 0: none). An `s3://` or `http(s)://` URL is
    /// mapped read-only, its missing extents fetched with ranged GETs.
    #[pyo3(signature = (path, *, writable = false, advice = "normal", zero_copy = None, max_pinned = None, read_ahead = None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        &self,
        py: Python<'_>,
        path: Location,
        writable: bool,
        advice: &str,
        zero_copy: Option<Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::counts::max_pinned_or_none)] max_pinned: Option<u64>,
        #[pyo3(from_py_with = crate::counts::read_ahead_or_none)] read_ahead: Option<u64>,
    ) -> PyResult<MappedFile> {
        let o = map_options(writable, advice, zero_copy.as_ref(), max_pinned, read_ahead)?;
        let cache = self.inner.clone();
        let options = o.clone();
        let (inner, source) = nogil(py, move || {
            let source = match path {
                Location::Path(path) => Source::Local(path),
                Location::Url(url) => Source::Remote(open_remote(&url)?),
            };
            Ok((source.open_in(&cache.get()?, &o)?, source))
        })?;
        Ok(MappedFile::new(inner, self.inner.clone(), source, options))
    }

    /// `{"budget", "used_bytes", "slots_in_use", "files", "totals": {...}, ...}`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cache_stats(py, &self.cache(py)?.stats())
    }

    /// Writes back every dirty extent of every file.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let cache = self.cache(py)?;
        nogil(py, move || cache.flush())
    }

    /// `flush`, then fdatasync of every written file.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let cache = self.cache(py)?;
        nogil(py, move || cache.sync())
    }

    /// Waits until rows that gathers read past the full cache have been admitted to it.
    fn wait_for_admissions(&self, py: Python<'_>) -> PyResult<()> {
        let cache = self.cache(py)?;
        nogil(py, move || {
            cache.wait_for_admissions();
            Ok(())
        })
    }

    /// The cache's directory for kernels of one's own queued on `stream` (torch, CuPy, a raw
    /// `CUstream`, or `None`: the default stream), as a context manager (`LookupScope`).
    #[pyo3(signature = (stream = None))]
    fn lookup_scope(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
    ) -> PyResult<LookupScope> {
        LookupScope::begin(py, &self.cache(py)?, stream, None)
    }

    /// Copies `ranges` (`(file, offset, length)`, files of this cache) packed one after another
    /// into `out` (a CuPy/torch/Numba array, or host memory).
    fn gather(
        &self,
        py: Python<'_>,
        ranges: Bound<'_, PyAny>,
        out: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let ranges = gather_ranges(&ranges)?;
        let total =
            ranges.iter().try_fold(0u64, |sum, r| sum.checked_add(r.2)).ok_or_else(|| {
                PyValueError::new_err("the lengths of the ranges overflow 64 bits when added up")
            })?;
        let total = usize::try_from(total)
            .map_err(|_| PyValueError::new_err(format!("{total} bytes do not fit in memory")))?;
        let mut dst = memory(&out, true)?.into_dst(py, 0, total)?;
        // Each file's passage held for the gather: a closed file is refused, as its own calls are.
        let mut maps: Vec<(DeviceMappedFile, u64, u64)> = Vec::with_capacity(ranges.len());
        let mut _open = Vec::with_capacity(ranges.len());
        for (m, o, l) in &ranges {
            let (map, passage) = m.open_map()?;
            maps.push((map, *o, *l));
            _open.push(passage);
        }
        let cache = self.cache(py)?;
        nogil_interruptibly(py, total as u64, move || {
            let ranges: Vec<_> = maps.iter().map(|(m, o, l)| m.range(*o, *l)).collect();
            cache.gather(&ranges, dst.view())
        })
    }

    /// `"GPU 0 (NVIDIA H100 PCIe)"` or `"host memory"`.
    #[getter]
    fn device(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.cache(py)?.device().describe())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let cache = self.cache(py)?;
        let s = cache.stats();
        Ok(format!(
            "<gpumapio.DeviceCache on {}: {} of {} bytes used, {} files>",
            cache.device().describe(),
            s.used_bytes,
            s.budget,
            s.files
        ))
    }
}

/// `DeviceCache.gather`'s ranges: `(file, offset, length)` each, the counts checked as
/// [`crate::counts`] checks one (a negative offset is a `ValueError` naming its range).
fn gather_ranges<'py>(
    ranges: &Bound<'py, PyAny>,
) -> PyResult<Vec<(PyRef<'py, MappedFile>, u64, u64)>> {
    let mut out = Vec::new();
    for (position, item) in ranges.try_iter()?.enumerate() {
        let (file, offset, length): (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>) =
            item?.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "ranges[{position}] is not a (file, offset, length) tuple"
                ))
            })?;
        let file = file.extract::<PyRef<'py, MappedFile>>()?;
        let offset = crate::counts::count(&format!("ranges[{position}] offset"), &offset)?;
        let length = crate::counts::count(&format!("ranges[{position}] length"), &length)?;
        out.push((file, offset, length));
    }
    Ok(out)
}

/// What a map is opened from, kept to open it again in a forked child.
enum Source {
    Local(PathBuf),
    Remote(gpumap::remote::RemoteFile),
}

impl Source {
    fn open_in(&self, cache: &Cache, options: &MapOptions) -> gpumap::Result<DeviceMappedFile> {
        match self {
            Source::Local(path) => cache.open_with(path, options),
            Source::Remote(file) => cache.open_remote(file.clone(), options),
        }
    }
}

/// A file mapped into GPU memory (host memory without a GPU): views, gathers, write-back.
#[pyclass(module = "gpumapio", name = "MappedFile", frozen)]
pub struct MappedFile {
    /// What the map is, answered after `close` too.
    facts: Facts,
    /// The cache the file is in (a cache of its own for `MappedFile.open`).
    cache: Arc<ProcessCache>,
    /// What it was opened from, and how: a forked child opens it again so.
    source: Source,
    options: MapOptions,
    /// The map as this process has it (see the module's docs).
    state: ForkLocal<Arc<MapState>>,
    /// What the map had done when a close ended: a child forked after finds it closed too.
    closed: OnceLock<FileStats>,
}

/// A map as one process has it.
struct MapState {
    /// The map, and the hold its views share (the last of them to go flushes, see
    /// [`MapHandle`]), until `close`: its file is closed once the views made before let go of
    /// it too.
    hold: Mutex<Option<(DeviceMappedFile, Arc<MapHandle>)>>,
    /// Shut by `close`: every later call that reads, writes or flushes is refused, as a closed
    /// Python file's are (views made before stay valid).
    gate: Arc<CloseGate>,
}

impl MapState {
    fn open(map: DeviceMappedFile) -> Arc<MapState> {
        let handle = MapHandle::new(map.clone());
        Arc::new(MapState {
            hold: Mutex::new(Some((map, handle))),
            gate: Arc::new(CloseGate::default()),
        })
    }

    fn closed() -> Arc<MapState> {
        Arc::new(MapState { hold: Mutex::new(None), gate: Arc::new(CloseGate::closed()) })
    }
}

/// A map's attributes, fixed when it is opened.
struct Facts {
    path: PathBuf,
    remote: bool,
    len: u64,
    writable: bool,
    memory: String,
}

impl MappedFile {
    fn new(
        map: DeviceMappedFile,
        cache: Arc<ProcessCache>,
        source: Source,
        options: MapOptions,
    ) -> MappedFile {
        let facts = Facts {
            path: map.path().to_path_buf(),
            remote: map.is_remote(),
            len: map.len(),
            writable: map.is_writable(),
            memory: map.memory(),
        };
        let state = ForkLocal::new(MapState::open(map));
        MappedFile { facts, cache, source, options, state, closed: OnceLock::new() }
    }

    /// This process's map: in a forked child that has not used it yet, the file opened again
    /// in the child's cache (or a closed map, where the parent had closed it).
    fn state(&self) -> PyResult<Arc<MapState>> {
        let reopen = || {
            if self.closed.get().is_some() {
                return Ok(MapState::closed());
            }
            let map = self.source.open_in(&self.cache.get()?, &self.options)?;
            Ok(MapState::open(map))
        };
        self.state.get(reopen).map_err(|e: gpumap::Error| Python::attach(|py| to_py(py, &e)))
    }

    /// Bytes mapped: in a forked child, as long as the file is when the child first uses the
    /// map (it may have grown or been cut since the parent opened it), asking being a use.
    fn len(&self) -> PyResult<u64> {
        self.state()?;
        Ok(self.known_len())
    }

    /// [`len`](Self::len) as far as this process knows it without opening anything: the
    /// parent's length in a forked child that has not used the map yet (for `repr`).
    fn known_len(&self) -> u64 {
        let own = self.state.made_here();
        let held = own.as_ref().and_then(|state| state.hold.lock().as_ref().map(|(m, _)| m.len()));
        held.unwrap_or(self.facts.len)
    }

    /// The map, for one call, unless `close` was called: `close` waits for the passage to go.
    pub(super) fn open_map(&self) -> PyResult<(DeviceMappedFile, Passage)> {
        let (map, _, passage) = self.open_hold()?;
        Ok((map, passage))
    }

    /// [`open_map`](Self::open_map) with the hold a view keeps.
    fn open_hold(&self) -> PyResult<(DeviceMappedFile, Arc<MapHandle>, Passage)> {
        let closed = || PyValueError::new_err("I/O operation on a closed MappedFile");
        let state = self.state()?;
        let passage = state.gate.enter().ok_or_else(closed)?;
        // The gate lets no call in once a close has begun, and the hold is taken only after.
        let held = state.hold.lock().clone();
        match held {
            Some((map, handle)) => Ok((map, handle, passage)),
            None => Err(closed()),
        }
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

    fn cancel(&self) {
        self.0.cancel()
    }
}

#[pymethods]
impl MappedFile {
    /// Maps `path` in a cache of its own (`gpumapio.map` without a cache): `budget` bytes,
    /// by default the file's size up to 4 GiB in whole frames of the size that budget gets —
    /// the library's `CacheOptions::for_file`, so Python and Rust size the cache alike.
    #[staticmethod]
    #[pyo3(signature = (path, *, budget = None, writable = false, extent_size = 65536, frame_size = None, device = None, advice = "normal", zero_copy = None, max_pinned = None, read_ahead = None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        path: Location,
        #[pyo3(from_py_with = crate::counts::budget_or_none)] budget: Option<u64>,
        writable: bool,
        #[pyo3(from_py_with = crate::counts::extent_size)] extent_size: u64,
        #[pyo3(from_py_with = crate::counts::frame_size_or_none)] frame_size: Option<u64>,
        device: Option<Bound<'_, PyAny>>,
        advice: &str,
        zero_copy: Option<Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::counts::max_pinned_or_none)] max_pinned: Option<u64>,
        #[pyo3(from_py_with = crate::counts::read_ahead_or_none)] read_ahead: Option<u64>,
    ) -> PyResult<MappedFile> {
        let o = map_options(writable, advice, zero_copy.as_ref(), max_pinned, read_ahead)?;
        let device = device_arg(device.as_ref())?;
        let options = o.clone();
        let (inner, cache, source) = nogil(py, move || {
            // A URL's object is opened first: its size sizes the cache.
            let opened = match path {
                Location::Path(path) => {
                    let len = std::fs::metadata(&path).map(|m| m.len()).map_err(|e| {
                        gpumap::Error::Io {
                            op: "stat",
                            path: Some(path.clone()),
                            offset: None,
                            source: e,
                        }
                    })?;
                    Opened::Local(path, len)
                }
                Location::Url(url) => Opened::Remote(open_remote(&url)?),
            };
            let len = match &opened {
                Opened::Local(_, len) => *len,
                Opened::Remote(file) => file.len(),
            };
            let mut c = match budget {
                Some(budget) => {
                    let mut c = CacheOptions::new();
                    c.budget(budget);
                    c
                }
                None => CacheOptions::for_file(len),
            };
            c.extent_size(extent_size).memory(device);
            if let Some(frame) = frame_size {
                c.frame_size(frame);
            }
            let cache = ProcessCache::build(c)?;
            let source = match opened {
                Opened::Local(path, _) => Source::Local(path),
                Opened::Remote(file) => Source::Remote(file),
            };
            let map = source.open_in(&cache.get()?, &o)?;
            Ok((map, cache, source))
        })?;
        Ok(MappedFile::new(inner, cache, source, options))
    }

    fn __len__(&self) -> PyResult<usize> {
        Ok(self.len()? as usize)
    }

    /// Bytes mapped.
    #[getter]
    fn nbytes(&self) -> PyResult<u64> {
        self.len()
    }

    /// The path it was opened with (a `pathlib.Path`), or the URL (a `str`, without
    /// credentials) of a remote object.
    #[getter]
    fn path<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.facts.remote {
            return Ok(self.facts.path.to_string_lossy().into_pyobject(py)?.into_any());
        }
        Ok(self.facts.path.clone().into_pyobject(py)?.into_any())
    }

    /// Whether writes are allowed.
    #[getter]
    fn writable(&self) -> bool {
        self.facts.writable
    }

    /// The device address of the file's byte 0 (byte `o` is at `base + o` while a view pins
    /// it); `None` on host memory, and once closed.
    #[getter]
    fn base(&self) -> PyResult<Option<u64>> {
        if self.closed.get().is_some() {
            return Ok(None);
        }
        Ok(self.state()?.hold.lock().as_ref().and_then(|(map, _)| map.base()))
    }

    /// The cache the file is in.
    #[getter]
    fn cache(&self) -> DeviceCache {
        DeviceCache { inner: self.cache.clone() }
    }

    /// A view of `[offset, offset + length)`, resident and pinned until released; `writable`
    /// views need a writable map, and their bytes are written back after release.
    #[pyo3(signature = (offset, length, *, writable = false))]
    fn view(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::counts::offset)] offset: u64,
        #[pyo3(from_py_with = crate::counts::length)] length: u64,
        writable: bool,
    ) -> PyResult<View> {
        let (map, handle, _open) = self.open_hold()?;
        let pin = nogil_interruptibly(py, length, move || {
            Ok(if writable {
                Pin::Write(Mutex::new(map.view_mut(offset, length)?))
            } else {
                Pin::Read(map.view(offset, length)?)
            })
        })?;
        let held = Held { pin, _map: handle };
        Ok(View::new(held, offset, length, writable))
    }

    /// The bytes of `[offset, offset + length)`, through the cache.
    fn read<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = crate::counts::offset)] offset: u64,
        #[pyo3(from_py_with = crate::counts::length_in_memory)] length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let (map, _open) = self.open_map()?;
        check_range(py, offset, length as u64, map.len())?;
        filled_bytes(py, length, move |bytes| map.read(offset, bytes))
    }

    /// Copies `data` (bytes-like) to `offset` of the map; written back later (or by `flush`).
    fn write(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::counts::offset)] offset: u64,
        data: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (map, _open) = self.open_map()?;
        let src = memory(&data, false)?;
        let len = src.len();
        check_range(py, offset, len as u64, map.len())?;
        let src = src.into_src(py, 0, len)?;
        let staging = match src.view() {
            gpumap::memory::DeviceView::Host(_) => Vec::new(),
            gpumap::memory::DeviceView::Cuda(view) => host_copy(view)?,
        };
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
        #[pyo3(from_py_with = crate::counts::offsets)] offsets: Vec<u64>,
        #[pyo3(from_py_with = crate::counts::length)] length: u64,
        out: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (map, _open) = self.open_map()?;
        let total = (offsets.len() as u64).checked_mul(length).ok_or_else(|| {
            PyValueError::new_err(format!("{} rows of {length} bytes overflow", offsets.len()))
        })?;
        let mut dst = memory(&out, true)?.into_dst(py, 0, total as usize)?;
        let ranges: Vec<(u64, u64)> = offsets.iter().map(|&offset| (offset, length)).collect();
        nogil_interruptibly(py, total, move || map.gather(&ranges, dst.view()))
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
        #[pyo3(from_py_with = crate::counts::row_size)] row_size: u64,
        out: Bound<'_, PyAny>,
        stream: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (map, _open) = self.open_map()?;
        let rows = crate::rows::Rows::new(py, &indices, row_size, &out)?;
        let stream = match (&stream, map.device()) {
            (Some(s), Device::Cuda(device)) => Some(crate::rows::stream_arg(py, s, &device)?),
            _ => None,
        };
        rows.run(py, move |indices, dst| match stream {
            Some(stream) => map.gather_rows_on(indices, row_size, dst, stream),
            None => map.gather_rows(indices, row_size, dst),
        })
    }

    /// Reads `[offset, offset + length)` in the background; the future's `get()` returns the
    /// length when it is resident.
    fn prefetch(
        &self,
        #[pyo3(from_py_with = crate::counts::offset)] offset: u64,
        #[pyo3(from_py_with = crate::counts::length)] length: u64,
    ) -> PyResult<IOFuture> {
        let (map, _open) = self.open_map()?;
        let started = map.prefetch(offset, length);
        Ok(IOFuture::pending(Box::new(Prefetch(started, length as usize))))
    }

    /// madvise-like advice for a range: "normal", "sequential", "random", "willneed",
    /// "dontneed".
    fn advise(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::counts::offset)] offset: u64,
        #[pyo3(from_py_with = crate::counts::length)] length: u64,
        advice: &str,
    ) -> PyResult<()> {
        let advice = advice_arg(advice)?;
        let (map, _open) = self.open_map()?;
        nogil(py, move || map.advise(offset, length, advice))
    }

    /// Writes every dirty extent back (raises the error of an earlier failed write-back until
    /// a `sync` succeeds).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let (map, _open) = self.open_map()?;
        nogil(py, move || map.flush())
    }

    /// Like `flush`, for `[offset, offset + length)`.
    fn flush_range(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::counts::offset)] offset: u64,
        #[pyo3(from_py_with = crate::counts::length)] length: u64,
    ) -> PyResult<()> {
        let (map, _open) = self.open_map()?;
        nogil(py, move || map.flush_range(offset, length))
    }

    /// `flush`, then fdatasync: durable when it returns.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let (map, _open) = self.open_map()?;
        nogil(py, move || map.sync())
    }

    /// Writes back, then gives up the memory no view pins.
    fn evict(&self, py: Python<'_>) -> PyResult<()> {
        let (map, _open) = self.open_map()?;
        nogil(py, move || map.evict())
    }

    /// Waits until rows that gathers read past the cache have been admitted to it.
    fn wait_for_admissions(&self, py: Python<'_>) -> PyResult<()> {
        let (map, _open) = self.open_map()?;
        nogil(py, move || {
            map.wait_for_admissions();
            Ok(())
        })
    }

    /// The directory of the file's cache for kernels of one's own queued on `stream` (see
    /// `DeviceCache.lookup_scope`), with `file`, the number this file's extents are keyed by.
    #[pyo3(signature = (stream = None))]
    fn lookup_scope(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
    ) -> PyResult<LookupScope> {
        let (map, _open) = self.open_map()?;
        let cache = self.cache.get().map_err(|e| to_py(py, &e))?;
        LookupScope::begin(py, &cache, stream, Some(&map))
    }

    /// Flushes (for a writable map) and closes it: later reads, writes, gathers and flushes
    /// raise `ValueError`, as a closed file's do, and calls already running end first, so that
    /// every write it let in is written back when it returns; views already made stay valid,
    /// and the file and memory go when the last of them does (at once where there are none).
    /// A flush that fails is raised and leaves the map open (its dirty bytes kept, for `sync`
    /// to try again); closing twice is a no-op.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(state) = self.state.made_here() else {
            // A forked child that never used its parent's map: nothing of its own to close.
            let _ = self.closed.set(FileStats::default());
            return Ok(());
        };
        let (gate, hold, closed) = (&state.gate, &state.hold, &self.closed);
        if gate.held_here() {
            // It would wait for the call it runs inside: refused, the map left open.
            return Err(PyRuntimeError::new_err(
                "close() of a MappedFile inside a call on it (from a buffer's export, or a \
                 __del__ the garbage collector ran during the call): close it after the call \
                 returns",
            ));
        }
        nogil(py, move || {
            gate.close(|| {
                let map = match &*hold.lock() {
                    Some((map, _)) => map.clone(),
                    None => return Ok(()),
                };
                if map.is_writable() {
                    map.flush()?;
                }
                let _ = closed.set(map.stats());
                // Dropped outside the lock: the last hold of a map closes its file.
                let released = hold.lock().take();
                drop(released);
                Ok(())
            })
        })
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.closed.get().is_some()
    }

    /// `{"hits", "misses", "bytes_faulted", "evictions", "resident_bytes", ...}`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = match self.closed.get() {
            Some(stats) => *stats,
            None => match &*self.state()?.hold.lock() {
                Some((map, _)) => map.stats(),
                None => FileStats::default(),
            },
        };
        file_stats(py, &stats)
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
            "<gpumapio.MappedFile {} ({} bytes) in {}{}>",
            self.facts.path.display(),
            self.known_len(),
            self.facts.memory,
            if self.closed.get().is_some() { ", closed" } else { "" }
        )
    }
}
