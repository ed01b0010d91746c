//! DLPack's C ABI (dlpack.h, version 0.8: the layout consumers and producers of the legacy
//! "dltensor" capsule share), defined once for both directions the binding uses it: reading the
//! tensor of a capsule another library made ([`read_capsule`], for `buffers`), and exporting
//! device memory as a capsule ([`export_bytes`], for `maps`' `View.__dlpack__`).

use std::any::Any;
use std::ffi::{c_void, CStr};

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;

/// `DLDevice`: where the tensor's memory is.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`: what the items are.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DlDataType {
    /// The type code (`kDLInt`, `kDLUInt`, `kDLFloat`, ...).
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes per item (1 but for vector types).
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor`: what a "dltensor" capsule points to (its first member is the tensor).
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `kDLCPU`: ordinary host memory.
pub const DL_CPU: i32 = 1;
/// `kDLCUDA`: device memory.
pub const DL_CUDA: i32 = 2;
/// `kDLCUDAHost`: pinned host memory.
pub const DL_CUDA_HOST: i32 = 3;
/// `kDLCUDAManaged`: managed (unified) memory.
pub const DL_CUDA_MANAGED: i32 = 13;
/// `kDLInt`: signed integers.
pub const DL_INT: u8 = 0;
/// `kDLUInt`: unsigned integers.
const DL_UINT: u8 = 1;
/// `kDLOpaqueHandle`: pointers.
const DL_OPAQUE_HANDLE: u8 = 3;
/// `kDLFloat4_e2m1fn`, the last type code dlpack.h 1.1 defines.
const DL_LAST_KNOWN: u8 = 17;

/// The name of a capsule no consumer has taken yet (a consumer renames it "used_dltensor").
const CAPSULE_NAME: &CStr = c"dltensor";

/// Checks a DLPack dtype: the type codes of dlpack.h 1.1 for numbers and bools pass (ints,
/// unsigned, floats, bfloat16, complex, bool, the float8 family), in whole bytes; an opaque
/// handle is a pointer, an unknown code may be anything, and items of fewer than eight bits
/// are packed, so that the size in bytes would be wrong.
pub fn check_dtype(dtype: DlDataType) -> Result<(), String> {
    let DlDataType { code, bits, lanes } = dtype;
    let described = format!("dtype code {code}, {bits} bits, {lanes} lanes");
    if code == DL_OPAQUE_HANDLE {
        return Err(format!("{described} is an opaque handle (a pointer)"));
    }
    if code > DL_LAST_KNOWN {
        return Err(format!("{described} is not a type gpumap knows"));
    }
    let item_bits = u32::from(bits) * u32::from(lanes);
    if item_bits == 0 || item_bits % 8 != 0 {
        return Err(format!("{described}: items that are not whole bytes"));
    }
    Ok(())
}

/// What the binding needs of a producer's tensor, copied out of its capsule.
pub struct ImportedTensor {
    /// The address of the first item: `data + byte_offset`.
    pub address: u64,
    /// The item type.
    pub dtype: DlDataType,
    /// Items per dimension.
    pub shape: Vec<i64>,
    /// Items (not bytes) to step per dimension; `None`: C-contiguous.
    pub strides: Option<Vec<i64>>,
}

/// Reads the tensor of a "dltensor" capsule (what `__dlpack__` returns). The memory it
/// describes stays valid while the capsule lives, which the caller keeps.
pub fn read_capsule(capsule: &Bound<'_, PyAny>) -> PyResult<ImportedTensor> {
    let py = capsule.py();
    // SAFETY: `capsule` is live and the GIL is held; a capsule not named "dltensor" makes this
    // return NULL with an exception set, which is turned into the error below.
    let managed = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), CAPSULE_NAME.as_ptr()) };
    if managed.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| {
            PyValueError::new_err("__dlpack__ did not return a \"dltensor\" capsule")
        }));
    }
    // SAFETY: a "dltensor" capsule points to a `DLManagedTensor`, whose first member is the
    // `DLTensor`; it stays valid while the capsule lives (borrowed here), and `shape` /
    // `strides` have `ndim` entries each (strides may be NULL: C-contiguous).
    let tensor = unsafe { &*(managed as *const DlTensor) };
    let ndim = usize::try_from(tensor.ndim).unwrap_or(0);
    // SAFETY: see above.
    let shape = (0..ndim).map(|i| unsafe { *tensor.shape.add(i) }).collect();
    let strides = (!tensor.strides.is_null())
        // SAFETY: see above.
        .then(|| (0..ndim).map(|i| unsafe { *tensor.strides.add(i) }).collect());
    Ok(ImportedTensor {
        address: (tensor.data as u64).wrapping_add(tensor.byte_offset),
        dtype: tensor.dtype,
        shape,
        strides,
    })
}

/// What an exported tensor keeps: the exporter's hold on the memory, and the tensor's shape
/// (which the tensor points into).
struct Export {
    _keep: Box<dyn Any + Send>,
    shape: [i64; 1],
}

/// DLPack's deleter: frees the tensor and its context, which lets go of what kept the memory.
/// Called by the consumer, with or without the GIL: it touches no Python.
unsafe extern "C" fn delete_tensor(tensor: *mut DlManagedTensor) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: `tensor` was made by `Box::into_raw` in `export_bytes`, and its `manager_ctx` by
    // `Box::into_raw` of an `Export`; DLPack calls the deleter once.
    unsafe {
        let tensor = Box::from_raw(tensor);
        drop(Box::from_raw(tensor.manager_ctx.cast::<Export>()));
    }
}

/// The capsule's destructor: a capsule no consumer took (still named "dltensor") deletes its
/// tensor; a consumer renames it "used_dltensor" and owns the tensor from then on.
unsafe extern "C" fn destroy_capsule(capsule: *mut ffi::PyObject) {
    let name = CAPSULE_NAME.as_ptr();
    // SAFETY: `capsule` is the capsule being destroyed (CPython calls this with it, GIL held);
    // `name` is NUL-terminated.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, name) == 1 {
            let tensor = ffi::PyCapsule_GetPointer(capsule, name).cast::<DlManagedTensor>();
            delete_tensor(tensor);
        } else {
            ffi::PyErr_Clear();
        }
    }
}

/// A "dltensor" capsule of `len` bytes of device memory at `ptr` on GPU `ordinal`, as a 1-D
/// `uint8` tensor. `keep` (what keeps the memory allocated) is held until the consumer deletes
/// the tensor, or until the capsule goes untaken.
pub fn export_bytes(
    py: Python<'_>,
    ptr: u64,
    ordinal: usize,
    len: u64,
    keep: Box<dyn Any + Send>,
) -> PyResult<Py<PyAny>> {
    let mut export = Box::new(Export { _keep: keep, shape: [len as i64] });
    let tensor = Box::new(DlManagedTensor {
        dl_tensor: DlTensor {
            data: ptr as *mut c_void,
            device: DlDevice { device_type: DL_CUDA, device_id: ordinal as i32 },
            ndim: 1,
            dtype: DlDataType { code: DL_UINT, bits: 8, lanes: 1 },
            shape: export.shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        },
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(delete_tensor),
    });
    let tensor = Box::into_raw(tensor);
    // SAFETY: `tensor` was just made by `Box::into_raw`; `export` goes with it (its shape
    // array is what `shape` points to, and it moves to the heap unmoved from here on).
    unsafe { (*tensor).manager_ctx = Box::into_raw(export).cast() };
    // SAFETY: a valid pointer, a NUL-terminated static name and a destructor that frees the
    // tensor unless a consumer took it; called with the GIL held.
    let capsule =
        unsafe { ffi::PyCapsule_New(tensor.cast(), CAPSULE_NAME.as_ptr(), Some(destroy_capsule)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so the tensor is still ours to free.
        unsafe { delete_tensor(tensor) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference, just checked non-null.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
}
