//! Python objects as memory gpumap can move bytes into or out of.
//!
//! Accepted, in this order (KvikIO's order):
//!
//! 1. `__cuda_array_interface__` (CuPy, PyTorch, Numba, ...): device memory. The exporter's
//!    `stream`, when it names one, is synchronized before gpumap touches the memory, as version
//!    3 of the interface asks (gpumap's own streams do not wait for the legacy default stream).
//! 2. The buffer protocol (NumPy, `bytearray`, `memoryview`, `bytes` as a source, `mmap`): host
//!    memory. C- or Fortran-contiguous only.
//! 3. `__dlpack__` / `__dlpack_device__` (JAX, PyTorch CPU tensors, ...): device memory for CUDA
//!    and managed tensors (the consumer stream asked for is the legacy default stream, which is
//!    then synchronized), host memory for CPU and pinned tensors.
//!
//! Only plain data is taken (numbers, bools, bytes, records of them): gpumap moves raw bytes,
//! and bytes landing on Python objects' references (NumPy `dtype=object`, typestr `O`, a DLPack
//! opaque handle) would break their reference counts, while writing them would write heap
//! addresses to the file. Other formats are a `TypeError` naming the format.
//!
//! The Python object (or its buffer export, or its DLPack capsule) is kept alive by the
//! [`OwnedDst`] / [`OwnedSrc`] made from it, so the memory under a running transfer is not
//! freed with the object, and a buffer export cannot be resized (`bytearray` raises
//! `BufferError`). A torch tensor's storage can still be reallocated by `resize_()` under
//! either of its exports: torch offers an importer no lock on it (its `numpy()` marks the
//! storage not resizable, for good, which would change the caller's tensor), so that is
//! documented as the caller's to avoid. What Python code writes to the memory meanwhile is the
//! caller's business, as with KvikIO and C.

mod formats;

use std::ffi::{c_char, c_int, c_void};

use gpumap::memory::cuda::{CudaDevice, CudaView, CudaViewMut};
use gpumap::memory::{DeviceView, DeviceViewMut, OwnedDeviceMemory, OwnedDeviceSource, StreamRef};
use pyo3::exceptions::{PyAttributeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::dlpack::{self, DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED, DL_INT};
use crate::errors::check;
use formats::{
    check_descr, check_format, check_typestr, format_signed_int, typestr_signed_int, PLAIN_DATA,
};

/// The buffer protocol's `Py_buffer`, as CPython defines it. pyo3 declares it only for the
/// limited API of Python 3.11 (when it became part of the stable ABI); its layout has been the
/// same since Python 3.3, so a 3.10 interpreter fills in this very struct. Declared here so one
/// abi3 wheel serves Python 3.10 and later.
#[repr(C)]
struct PyBufferView {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

const PYBUF_WRITABLE: c_int = 0x0001;
const PYBUF_FORMAT: c_int = 0x0004;
const PYBUF_STRIDES: c_int = 0x0010 | 0x0008;
const PYBUF_ANY_CONTIGUOUS: c_int = 0x0080 | PYBUF_STRIDES;

extern "C" {
    fn PyObject_CheckBuffer(obj: *mut ffi::PyObject) -> c_int;
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut PyBufferView, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut PyBufferView);
}

/// A buffer export, released (with the GIL) on drop.
struct HostExport {
    view: Box<PyBufferView>,
}

// SAFETY: the export is only a claim on the exporter's memory; it is released under the GIL
// (`attach_unless_exiting` in `Drop`), whichever thread drops it.
unsafe impl Send for HostExport {}
// SAFETY: nothing reads or writes the export through a shared reference; only `Drop` (which
// has `&mut`) touches it.
unsafe impl Sync for HostExport {}

impl Drop for HostExport {
    fn drop(&mut self) {
        // Past the interpreter's exit (a transfer that outlived it) the export stays held.
        crate::interpreter::attach_unless_exiting(|_| {
            // SAFETY: `view` was filled in by a successful `PyObject_GetBuffer` and is released
            // exactly once, here, with the GIL held.
            unsafe { PyBuffer_Release(&mut *self.view) }
        });
    }
}

/// What keeps the memory alive.
enum Keep {
    /// The exporting object (`__cuda_array_interface__`) or the DLPack capsule: holding it keeps
    /// the memory allocated (a capsule that is not renamed "used_dltensor" calls its deleter
    /// when it is freed).
    Object(#[allow(dead_code)] Py<PyAny>),
    /// A buffer-protocol export: the exporter may not free or resize the memory until released.
    Export(#[allow(dead_code)] HostExport),
}

enum Kind {
    Host {
        ptr: *mut u8,
    },
    /// Device memory at `ptr`; `placed` once the driver has been asked about the whole range,
    /// so that the views made from it later need not ask again.
    Device {
        ptr: u64,
        placed: Option<Placed>,
    },
}

/// Device memory the driver has placed (`cuPointerGetAttributes`): the whole range inside one
/// allocation, on a known GPU. Writable when the memory was found for reading into.
enum Placed {
    Read(CudaView<'static>),
    Write(CudaViewMut<'static>),
}

impl Placed {
    fn ordinal(&self) -> usize {
        match self {
            Placed::Read(view) => view.device_ordinal(),
            Placed::Write(view) => view.device_ordinal(),
        }
    }
}

/// `len` bytes from `offset` of the device memory at `ptr`, to write into: a slice of the
/// range the driver placed, or placed now. `offset + len` is within the memory.
fn device_dst(
    py: Python<'_>,
    ptr: u64,
    placed: Option<Placed>,
    offset: usize,
    len: usize,
) -> PyResult<CudaViewMut<'static>> {
    match placed {
        Some(Placed::Write(view)) => check(py, view.into_slice(offset..offset + len)),
        // SAFETY: the range lies in the exporter's writable memory (the caller checked it
        // against the memory's length), kept alive by the `Keep` that every caller stores
        // beside the view and that outlives every use of it; `from_raw` checks with the driver
        // that the range is device memory inside one allocation. Python code that touches the
        // memory during the transfer races with it, as in KvikIO.
        _ => check(py, unsafe { CudaViewMut::from_raw(ptr + offset as u64, len) }),
    }
}

/// `len` bytes from `offset` of the device memory at `ptr`, to read from (see [`device_dst`]).
fn device_src(
    py: Python<'_>,
    ptr: u64,
    placed: Option<Placed>,
    offset: usize,
    len: usize,
) -> PyResult<CudaView<'static>> {
    match placed {
        Some(Placed::Write(view)) => check(py, CudaView::from(view).slice(offset..offset + len)),
        Some(Placed::Read(view)) => check(py, view.slice(offset..offset + len)),
        // SAFETY: as in `device_dst`, for reading.
        None => check(py, unsafe { CudaView::from_raw(ptr + offset as u64, len) }),
    }
}

/// Memory found in a Python object: where, how long, whether writable, and its keeper.
pub struct Memory {
    kind: Kind,
    len: usize,
    readonly: bool,
    /// Whether the memory was found for reading into (the views it makes are then writable).
    for_writing: bool,
    keep: Keep,
    /// `Some(4 | 8)` when the items are signed integers of that many bytes in the machine's
    /// byte order (what row indices must be).
    signed_int: Option<u32>,
}

// SAFETY: `kind` holds addresses, not references; the memory they point to is kept alive by
// `keep`, which is Send (see `HostExport`).
unsafe impl Send for Memory {}

/// What keeps a Python object's memory alive, apart from a view of it.
pub struct Keeper(#[allow(dead_code)] Keep);

/// Destination memory of a transfer that may run in the background: a view of a Python
/// object's memory, with what keeps it alive.
pub struct OwnedDst {
    view: DeviceViewMut<'static>,
    _keep: Keep,
}

/// Source memory of a transfer that may run in the background.
pub struct OwnedSrc {
    view: DeviceView<'static>,
    _keep: Keep,
}

impl OwnedDeviceMemory for OwnedDst {
    fn device_view_mut(&mut self) -> DeviceViewMut<'_> {
        self.view.reborrow()
    }
}

impl OwnedDeviceSource for OwnedSrc {
    fn device_view(&self) -> DeviceView<'_> {
        self.view
    }
}

impl OwnedDst {
    /// The memory, for a call that blocks until the transfer is done.
    pub fn view(&mut self) -> DeviceViewMut<'_> {
        self.view.reborrow()
    }
}

impl OwnedSrc {
    /// The memory, for a call that blocks until the transfer is done.
    pub fn view(&self) -> DeviceView<'_> {
        self.view
    }
}

impl Memory {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `Some(4 | 8)` when the items are signed integers of that many bytes, in the machine's
    /// byte order.
    pub fn signed_int(&self) -> Option<u32> {
        self.signed_int
    }

    /// The address of the first byte (a device address for GPU memory).
    pub fn address(&self) -> u64 {
        match self.kind {
            Kind::Host { ptr } => ptr as u64,
            Kind::Device { ptr, .. } => ptr,
        }
    }

    /// The GPU that holds the memory, or `None` for host or empty memory. The first call asks
    /// the driver about the whole range (one `cuPointerGetAttributes`), and every view made
    /// later is cut from that answer.
    fn place_on_device(&mut self, py: Python<'_>) -> PyResult<Option<usize>> {
        let Kind::Device { ptr, placed } = &mut self.kind else { return Ok(None) };
        if self.len == 0 {
            return Ok(None);
        }
        if placed.is_none() {
            *placed = Some(if self.for_writing {
                Placed::Write(device_dst(py, *ptr, None, 0, self.len)?)
            } else {
                Placed::Read(device_src(py, *ptr, None, 0, self.len)?)
            });
        }
        Ok(placed.as_ref().map(Placed::ordinal))
    }

    fn check_range(&self, offset: usize, len: usize) -> PyResult<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(PyValueError::new_err(format!(
                "{len} bytes at offset {offset} do not fit in the buffer of {} bytes",
                self.len
            ))),
        }
    }

    /// `len` bytes from `offset`, to write into.
    pub fn into_dst(self, py: Python<'_>, offset: usize, len: usize) -> PyResult<OwnedDst> {
        self.check_range(offset, len)?;
        if self.readonly {
            return Err(PyTypeError::new_err("cannot read into a read-only buffer"));
        }
        let view = if len == 0 {
            DeviceViewMut::Host(&mut [])
        } else {
            match self.kind {
                // SAFETY: `ptr..ptr + self.len` is the exporter's writable memory, kept alive
                // (and, for buffer exports, from being resized) by `keep`, which lives in the
                // same `OwnedDst` as the slice and outlives every use of it. Python code that
                // touches the memory during the transfer races with it, as in KvikIO.
                Kind::Host { ptr } => DeviceViewMut::Host(unsafe {
                    std::slice::from_raw_parts_mut(ptr.add(offset), len)
                }),
                Kind::Device { ptr, placed } => {
                    DeviceViewMut::Cuda(device_dst(py, ptr, placed, offset, len)?)
                }
            }
        };
        Ok(OwnedDst { view, _keep: self.keep })
    }

    /// The device address and what the driver said of it; host memory is a `TypeError`.
    fn into_device(self) -> PyResult<(u64, Option<Placed>, Keep)> {
        match self.kind {
            Kind::Device { ptr, placed } => Ok((ptr, placed, self.keep)),
            Kind::Host { .. } => Err(PyTypeError::new_err(
                "cuFile moves data to and from device memory; this buffer is host memory",
            )),
        }
    }

    /// `len` bytes of device memory from `offset`, to write into, and their keeper (which must
    /// outlive every use of the view).
    pub fn into_cuda_dst(
        self,
        py: Python<'_>,
        offset: usize,
        len: usize,
    ) -> PyResult<(CudaViewMut<'static>, Keeper)> {
        self.check_range(offset, len)?;
        let readonly = self.readonly;
        let (ptr, placed, keep) = self.into_device()?;
        if readonly {
            return Err(PyTypeError::new_err("cannot read into a read-only buffer"));
        }
        // The caller keeps the `Keeper` for as long as it uses the view (the pyclasses that
        // hold both declare the view's user first, so it drops first).
        let view = device_dst(py, ptr, placed, offset, len)?;
        Ok((view, Keeper(keep)))
    }

    /// `len` bytes of device memory from `offset`, to read from, and their keeper.
    pub fn into_cuda_src(
        self,
        py: Python<'_>,
        offset: usize,
        len: usize,
    ) -> PyResult<(CudaView<'static>, Keeper)> {
        self.check_range(offset, len)?;
        let (ptr, placed, keep) = self.into_device()?;
        let view = device_src(py, ptr, placed, offset, len)?;
        Ok((view, Keeper(keep)))
    }

    /// `len` bytes from `offset`, to read from.
    pub fn into_src(self, py: Python<'_>, offset: usize, len: usize) -> PyResult<OwnedSrc> {
        self.check_range(offset, len)?;
        let view = if len == 0 {
            DeviceView::Host(&[])
        } else {
            match self.kind {
                // SAFETY: as in `into_dst`, for reading.
                Kind::Host { ptr } => DeviceView::Host(unsafe {
                    std::slice::from_raw_parts(ptr.add(offset) as *const u8, len)
                }),
                Kind::Device { ptr, placed } => {
                    DeviceView::Cuda(device_src(py, ptr, placed, offset, len)?)
                }
            }
        };
        Ok(OwnedSrc { view, _keep: self.keep })
    }
}

/// The memory of `obj`, for reading into it (`writable`) or writing from it.
pub fn memory(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Memory> {
    let py = obj.py();
    match obj.getattr(intern!(py, "__cuda_array_interface__")) {
        Ok(cai) => return cuda_array_interface(obj, &cai, writable),
        Err(e) if e.is_instance_of::<PyAttributeError>(py) => {}
        Err(e) => return Err(e),
    }
    // SAFETY: `obj` is a live object (we hold a reference) and the GIL is held.
    if unsafe { PyObject_CheckBuffer(obj.as_ptr()) } != 0 {
        return buffer_protocol(obj, writable);
    }
    if obj.hasattr(intern!(py, "__dlpack__"))? {
        return dlpack(obj, writable);
    }
    Err(PyTypeError::new_err(format!(
        "{} is not a buffer gpumap can use: expected an object with __cuda_array_interface__ \
         (CuPy, PyTorch, Numba), the buffer protocol (NumPy, bytearray, memoryview) or \
         __dlpack__",
        obj.get_type().name()?
    )))
}

fn buffer_protocol(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Memory> {
    let py = obj.py();
    let mut view = Box::new(PyBufferView {
        buf: std::ptr::null_mut(),
        obj: std::ptr::null_mut(),
        len: 0,
        itemsize: 0,
        readonly: 0,
        ndim: 0,
        format: std::ptr::null_mut(),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        suboffsets: std::ptr::null_mut(),
        internal: std::ptr::null_mut(),
    });
    // PYBUF_FORMAT: the exporter must say what its items are, so that objects can be refused.
    let readable = PYBUF_ANY_CONTIGUOUS | PYBUF_FORMAT;
    let flags = readable | if writable { PYBUF_WRITABLE } else { 0 };
    // SAFETY: `obj` is live, the GIL is held, and `view` is a valid `Py_buffer` to fill in.
    if unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } != 0 {
        let err = PyErr::fetch(py);
        let why = err.value(py).str().map(|s| s.to_string()).unwrap_or_default();
        // Asked again with fewer demands, to say which one failed; a successful export is
        // released at once.
        let exports = |view: &mut PyBufferView, flags: c_int| {
            // SAFETY: as above.
            let ok = unsafe { PyObject_GetBuffer(obj.as_ptr(), view, flags) } == 0;
            if ok {
                // SAFETY: `view` was just filled in by a successful export.
                unsafe { PyBuffer_Release(view) };
            } else {
                let _ = PyErr::take(py);
            }
            ok
        };
        if writable && exports(&mut view, readable) {
            return Err(PyTypeError::new_err(format!(
                "cannot read into a read-only buffer ({why})"
            )));
        }
        if exports(&mut view, PYBUF_STRIDES | PYBUF_FORMAT) {
            return Err(PyValueError::new_err(format!("Array must be contiguous ({why})")));
        }
        // Neither: the exporter's own reason (NumPy's datetimes, for one, have no buffer).
        return Err(err);
    }
    let len = usize::try_from(view.len).unwrap_or(0);
    let ptr = view.buf as *mut u8;
    let readonly = view.readonly != 0;
    let format = if view.format.is_null() {
        None
    } else {
        // SAFETY: a non-NULL `format` is a NUL-terminated string owned by the export, which is
        // alive until `HostExport` releases it below.
        Some(unsafe { std::ffi::CStr::from_ptr(view.format) }.to_string_lossy().into_owned())
    };
    let signed_int = format.as_deref().and_then(|f| format_signed_int(f, view.itemsize));
    let export = HostExport { view };
    // A NULL format means unsigned bytes ("B").
    if let Some(format) = format {
        if let Err(why) = check_format(&format) {
            drop(export);
            return Err(PyTypeError::new_err(format!(
                "{} has items of buffer format {format:?}, {why}; {PLAIN_DATA}",
                obj.get_type().name()?
            )));
        }
    }
    Ok(Memory {
        kind: Kind::Host { ptr },
        len,
        readonly,
        for_writing: writable,
        keep: Keep::Export(export),
        signed_int,
    })
}

fn cuda_array_interface(
    obj: &Bound<'_, PyAny>,
    cai: &Bound<'_, PyAny>,
    writable: bool,
) -> PyResult<Memory> {
    let py = obj.py();
    let cai = cai
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("__cuda_array_interface__ is not a dict"))?;
    // Keys interned: this runs for every transfer, and a `&str` key is a new Python string
    // each time.
    let get = |key| required(cai, key);
    let shape: Vec<usize> = get(intern!(py, "shape"))?.extract()?;
    let typestr: String = get(intern!(py, "typestr"))?.extract()?;
    let mut plain = check_typestr(&typestr);
    if plain.is_ok() {
        if let Some(descr) = cai.get_item(intern!(py, "descr"))? {
            if !descr.is_none() {
                plain = check_descr(&descr)?;
            }
        }
    }
    if let Err(why) = plain {
        return Err(PyTypeError::new_err(format!(
            "__cuda_array_interface__ of {}: {why}; {PLAIN_DATA}",
            obj.get_type().name()?
        )));
    }
    let itemsize: usize = typestr.get(2..).and_then(|n| n.parse().ok()).ok_or_else(|| {
        PyValueError::new_err(format!("__cuda_array_interface__ typestr {typestr:?}"))
    })?;
    let (ptr, readonly): (u64, bool) = get(intern!(py, "data"))?.extract()?;
    if let Some(mask) = cai.get_item(intern!(py, "mask"))? {
        if !mask.is_none() {
            return Err(PyValueError::new_err("masked arrays are not supported"));
        }
    }
    let strides: Option<Vec<isize>> = match cai.get_item(intern!(py, "strides"))? {
        Some(s) if !s.is_none() => Some(s.extract()?),
        _ => None,
    };
    if let Some(strides) = &strides {
        if !contiguous(&shape, strides, itemsize) {
            return Err(PyValueError::new_err("Array must be contiguous"));
        }
    }
    let len = shape
        .iter()
        .try_fold(itemsize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| PyValueError::new_err("__cuda_array_interface__ shape overflows"))?;
    if writable && readonly {
        return Err(PyTypeError::new_err("cannot read into a read-only buffer"));
    }
    let stream: Option<u64> = match cai.get_item(intern!(py, "stream"))? {
        Some(s) if !s.is_none() => Some(s.extract()?),
        _ => None,
    };
    if len > 0 && stream == Some(0) {
        return Err(PyValueError::new_err(
            "__cuda_array_interface__ stream 0 is ambiguous (the interface disallows it)",
        ));
    }
    let mut mem = Memory {
        kind: Kind::Device { ptr, placed: None },
        len,
        readonly,
        for_writing: writable,
        keep: Keep::Object(obj.clone().unbind()),
        signed_int: typestr_signed_int(&typestr),
    };
    if let Some(stream) = stream {
        synchronize_foreign(py, &mut mem, stream)?;
    }
    Ok(mem)
}

/// The value of `key` in a `__cuda_array_interface__`, which must have it.
fn required<'py>(
    cai: &Bound<'py, PyDict>,
    key: &Bound<'py, pyo3::types::PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    cai.get_item(key)?.ok_or_else(|| {
        PyValueError::new_err(format!("__cuda_array_interface__ has no {:?}", key.to_string()))
    })
}

/// Whether an array of `shape` with byte `strides` is C- or Fortran-contiguous.
fn contiguous(shape: &[usize], strides: &[isize], itemsize: usize) -> bool {
    if shape.len() != strides.len() {
        return false;
    }
    if shape.contains(&0) {
        return true;
    }
    let order_ok = |dims: &mut dyn Iterator<Item = usize>| {
        let mut expected = itemsize as isize;
        for i in dims {
            if shape[i] != 1 && strides[i] != expected {
                return false;
            }
            // An overflowing size is refused where the length is computed.
            expected = expected.saturating_mul(shape[i] as isize);
        }
        true
    };
    order_ok(&mut (0..shape.len()).rev()) || order_ok(&mut (0..shape.len()))
}

/// Waits for the work queued on `stream` (a CUDA stream handle of the exporter, or 1 / 2 for
/// the legacy / per-thread default stream) in the context of the GPU `ordinal`.
fn synchronize_stream(py: Python<'_>, ordinal: usize, stream: u64) -> PyResult<()> {
    let failed = |e: String| {
        crate::errors::cuda_error(
            py,
            format!("cuStreamSynchronize on the exporter's stream {stream:#x} failed: {e}"),
        )
    };
    // SAFETY: `stream` is the exporter's stream handle (or a special default-stream value),
    // valid while the exporter is, which the caller holds.
    let stream_ref = |device: &CudaDevice| unsafe { StreamRef::from_raw(device, stream) };
    // Most often the exporter's work is done: asking costs less than letting go of the GIL.
    let device = CudaDevice::new(ordinal).map_err(|e| failed(e.to_string()))?;
    let idle = stream_ref(&device).and_then(|s| s.is_idle());
    if idle.map_err(|e| failed(e.to_string()))? {
        return Ok(());
    }
    // The wait may be long (the exporter's queued kernels): other Python threads run meanwhile.
    py.detach(move || stream_ref(&device).and_then(|s| s.synchronize()).map_err(|e| e.to_string()))
        .map_err(failed)
}

/// Synchronizes `stream` (a caller's CUDA stream handle; 0 is the legacy default stream) in the
/// context of the device `mem` lives on, before a stream-ordered call runs. Nothing to do for
/// empty or host memory.
pub fn synchronize_foreign(py: Python<'_>, mem: &mut Memory, stream: u64) -> PyResult<()> {
    match mem.place_on_device(py)? {
        Some(ordinal) => synchronize_stream(py, ordinal, stream),
        None => Ok(()),
    }
}

fn dlpack(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Memory> {
    let py = obj.py();
    let (device_type, _device_id): (i32, i32) =
        obj.call_method0(intern!(py, "__dlpack_device__"))?.extract()?;
    let on_gpu = matches!(device_type, DL_CUDA | DL_CUDA_MANAGED);
    if !on_gpu && !matches!(device_type, DL_CPU | DL_CUDA_HOST) {
        return Err(PyTypeError::new_err(format!(
            "DLPack device type {device_type} is neither CPU nor CUDA memory"
        )));
    }
    let capsule = if on_gpu {
        // The legacy default stream: the producer makes it wait for the tensor's work, and we
        // wait for it below.
        let kwargs = PyDict::new(py);
        kwargs.set_item("stream", 1)?;
        obj.call_method(intern!(py, "__dlpack__"), PyTuple::empty(py), Some(&kwargs))?
    } else {
        obj.call_method0(intern!(py, "__dlpack__"))?
    };
    let tensor = dlpack::read_capsule(&capsule)?;
    if let Err(why) = dlpack::check_dtype(tensor.dtype) {
        return Err(PyTypeError::new_err(format!(
            "DLPack tensor of {}: {why}; {PLAIN_DATA}",
            obj.get_type().name()?
        )));
    }
    let dtype = tensor.dtype;
    let itemsize = (dtype.bits as usize * dtype.lanes as usize).div_ceil(8);
    let shape: Vec<usize> = tensor.shape.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(strides) = &tensor.strides {
        // DLPack strides count items, not bytes.
        let strides: Vec<isize> =
            strides.iter().map(|&s| (s as isize).saturating_mul(itemsize as isize)).collect();
        if !contiguous(&shape, &strides, itemsize) {
            return Err(PyValueError::new_err("Array must be contiguous"));
        }
    }
    let len = shape
        .iter()
        .try_fold(itemsize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| PyValueError::new_err("DLPack shape overflows"))?;
    let address = tensor.address;
    let kind = if on_gpu {
        Kind::Device { ptr: address, placed: None }
    } else {
        Kind::Host { ptr: address as usize as *mut u8 }
    };
    // kDLInt, one lane, 32 or 64 bits.
    let signed_int = (dtype.code == DL_INT && dtype.lanes == 1)
        .then_some(u32::from(dtype.bits) / 8)
        .filter(|&n| n == 4 || n == 8);
    // DLPack 0.x has no read-only flag.
    let mut mem = Memory {
        kind,
        len,
        readonly: false,
        for_writing: writable,
        keep: Keep::Object(capsule.unbind()),
        signed_int,
    };
    // The legacy default stream, which the producer was asked to make wait for its work.
    synchronize_foreign(py, &mut mem, 1)?;
    Ok(mem)
}

/// `size` (default: the whole buffer, after `offset`) checked against the buffer.
pub(crate) fn span(mem: &Memory, size: Option<usize>, offset: usize) -> PyResult<usize> {
    let available = mem.len().checked_sub(offset).ok_or_else(|| {
        PyValueError::new_err(format!(
            "offset {offset} is past the end of the buffer of {} bytes",
            mem.len()
        ))
    })?;
    match size {
        None => Ok(available),
        Some(n) if n <= available => Ok(n),
        Some(n) => {
            let after = if offset > 0 { format!(" after offset {offset}") } else { String::new() };
            Err(PyValueError::new_err(format!(
                "Size is greater than the size of the buffer: {n} bytes asked, the buffer has {}{after}",
                mem.len()
            )))
        }
    }
}

/// `buf`'s memory to read into: `size` bytes (default: the rest of the buffer) from `offset`.
pub(crate) fn destination(
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    size: Option<usize>,
    offset: usize,
) -> PyResult<OwnedDst> {
    let mem = memory(buf, true)?;
    let len = span(&mem, size, offset)?;
    mem.into_dst(py, offset, len)
}

/// `buf`'s memory to write from: `size` bytes (default: the rest of the buffer) from `offset`.
pub(crate) fn source(
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    size: Option<usize>,
    offset: usize,
) -> PyResult<OwnedSrc> {
    let mem = memory(buf, false)?;
    let len = span(&mem, size, offset)?;
    mem.into_src(py, offset, len)
}
