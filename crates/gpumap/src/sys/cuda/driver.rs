//! The driver itself: `libcuda` loaded behind a guarded probe, its entry points resolved into a
//! table of functions returning plain integers, and the status codes read as such.
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys as cu;

use crate::error::{Error, Result};

/// A `CUresult` read as the integer it is (see the module docs for why not the enum).
pub(super) type Status = c_int;

pub(super) const CUDA_SUCCESS: Status = 0;
pub(super) const CUDA_ERROR_DEINITIALIZED: Status = 4;
pub(super) const CUDA_ERROR_CONTEXT_IS_DESTROYED: Status = 709;
pub(super) const CUDA_ERROR_NOT_READY: Status = 600;
/// `CU_MEMORYTYPE_*` values as returned by `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
pub(crate) const MEMORYTYPE_HOST: u32 = 1;
/// See [`MEMORYTYPE_HOST`].
pub(crate) const MEMORYTYPE_DEVICE: u32 = 2;
/// See [`MEMORYTYPE_HOST`].
pub(crate) const MEMORYTYPE_UNIFIED: u32 = 4;

/// The driver entry points gpumap calls, resolved once from `libcuda`.
#[allow(non_snake_case)]
pub(super) struct Api {
    pub(super) cuInit: unsafe extern "C" fn(c_uint) -> Status,
    pub(super) cuDriverGetVersion: unsafe extern "C" fn(*mut c_int) -> Status,
    pub(super) cuGetErrorName: unsafe extern "C" fn(Status, *mut *const c_char) -> Status,
    pub(super) cuDeviceGetCount: unsafe extern "C" fn(*mut c_int) -> Status,
    pub(super) cuDeviceGet: unsafe extern "C" fn(*mut cu::CUdevice, c_int) -> Status,
    pub(super) cuDeviceGetName: unsafe extern "C" fn(*mut c_char, c_int, cu::CUdevice) -> Status,
    pub(super) cuDeviceTotalMem_v2: unsafe extern "C" fn(*mut usize, cu::CUdevice) -> Status,
    pub(super) cuDeviceGetPCIBusId:
        unsafe extern "C" fn(*mut c_char, c_int, cu::CUdevice) -> Status,
    pub(super) cuDevicePrimaryCtxRetain:
        unsafe extern "C" fn(*mut cu::CUcontext, cu::CUdevice) -> Status,
    pub(super) cuDevicePrimaryCtxRelease_v2: unsafe extern "C" fn(cu::CUdevice) -> Status,
    pub(super) cuCtxSetCurrent: unsafe extern "C" fn(cu::CUcontext) -> Status,
    pub(super) cuCtxGetCurrent: unsafe extern "C" fn(*mut cu::CUcontext) -> Status,
    pub(super) cuCtxSynchronize: unsafe extern "C" fn() -> Status,
    pub(super) cuMemAlloc_v2: unsafe extern "C" fn(*mut cu::CUdeviceptr, usize) -> Status,
    pub(super) cuMemFree_v2: unsafe extern "C" fn(cu::CUdeviceptr) -> Status,
    pub(super) cuMemHostAlloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> Status,
    pub(super) cuMemFreeHost: unsafe extern "C" fn(*mut c_void) -> Status,
    pub(super) cuMemHostRegister_v2: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> Status,
    pub(super) cuMemHostUnregister: unsafe extern "C" fn(*mut c_void) -> Status,
    pub(super) cuMemHostGetDevicePointer_v2:
        unsafe extern "C" fn(*mut cu::CUdeviceptr, *mut c_void, c_uint) -> Status,
    pub(super) cuPointerGetAttributes:
        unsafe extern "C" fn(c_uint, *mut c_uint, *mut *mut c_void, cu::CUdeviceptr) -> Status,
    pub(super) cuMemGetAddressRange_v2:
        unsafe extern "C" fn(*mut cu::CUdeviceptr, *mut usize, cu::CUdeviceptr) -> Status,
    pub(super) cuStreamCreate: unsafe extern "C" fn(*mut cu::CUstream, c_uint) -> Status,
    pub(super) cuStreamSynchronize: unsafe extern "C" fn(cu::CUstream) -> Status,
    pub(super) cuStreamQuery: unsafe extern "C" fn(cu::CUstream) -> Status,
    pub(super) cuStreamGetCtx: unsafe extern "C" fn(cu::CUstream, *mut cu::CUcontext) -> Status,
    pub(super) cuStreamDestroy_v2: unsafe extern "C" fn(cu::CUstream) -> Status,
    pub(super) cuEventCreate: unsafe extern "C" fn(*mut cu::CUevent, c_uint) -> Status,
    pub(super) cuEventRecord: unsafe extern "C" fn(cu::CUevent, cu::CUstream) -> Status,
    pub(super) cuEventSynchronize: unsafe extern "C" fn(cu::CUevent) -> Status,
    pub(super) cuEventQuery: unsafe extern "C" fn(cu::CUevent) -> Status,
    pub(super) cuEventDestroy_v2: unsafe extern "C" fn(cu::CUevent) -> Status,
    pub(super) cuMemcpyHtoD_v2:
        unsafe extern "C" fn(cu::CUdeviceptr, *const c_void, usize) -> Status,
    pub(super) cuMemcpyDtoH_v2: unsafe extern "C" fn(*mut c_void, cu::CUdeviceptr, usize) -> Status,
    pub(super) cuMemcpyHtoDAsync_v2:
        unsafe extern "C" fn(cu::CUdeviceptr, *const c_void, usize, cu::CUstream) -> Status,
    pub(super) cuMemcpyDtoHAsync_v2:
        unsafe extern "C" fn(*mut c_void, cu::CUdeviceptr, usize, cu::CUstream) -> Status,
    pub(super) cuMemsetD8_v2: unsafe extern "C" fn(cu::CUdeviceptr, u8, usize) -> Status,
    pub(super) cuMemGetAllocationGranularity:
        unsafe extern "C" fn(*mut usize, *const cu::CUmemAllocationProp, c_uint) -> Status,
    pub(super) cuMemAddressReserve:
        unsafe extern "C" fn(*mut cu::CUdeviceptr, usize, usize, cu::CUdeviceptr, u64) -> Status,
    pub(super) cuMemAddressFree: unsafe extern "C" fn(cu::CUdeviceptr, usize) -> Status,
    pub(super) cuMemCreate: unsafe extern "C" fn(
        *mut cu::CUmemGenericAllocationHandle,
        usize,
        *const cu::CUmemAllocationProp,
        u64,
    ) -> Status,
    pub(super) cuMemRelease: unsafe extern "C" fn(cu::CUmemGenericAllocationHandle) -> Status,
    pub(super) cuMemMap: unsafe extern "C" fn(
        cu::CUdeviceptr,
        usize,
        usize,
        cu::CUmemGenericAllocationHandle,
        u64,
    ) -> Status,
    pub(super) cuMemUnmap: unsafe extern "C" fn(cu::CUdeviceptr, usize) -> Status,
    pub(super) cuMemSetAccess:
        unsafe extern "C" fn(cu::CUdeviceptr, usize, *const cu::CUmemAccessDesc, usize) -> Status,
    pub(super) cuMemcpyAsync:
        unsafe extern "C" fn(cu::CUdeviceptr, cu::CUdeviceptr, usize, cu::CUstream) -> Status,
    pub(super) cuDeviceGetAttribute:
        unsafe extern "C" fn(*mut c_int, c_uint, cu::CUdevice) -> Status,
    pub(super) cuModuleLoadData: unsafe extern "C" fn(*mut cu::CUmodule, *const c_void) -> Status,
    pub(super) cuModuleGetFunction:
        unsafe extern "C" fn(*mut cu::CUfunction, cu::CUmodule, *const c_char) -> Status,
    pub(super) cuLaunchKernel: unsafe extern "C" fn(
        cu::CUfunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        cu::CUstream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> Status,
}

/// What the one-time probe of the CUDA driver found.
pub(crate) struct DriverInfo {
    pub(super) api: Api,
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub(crate) version: i32,
    /// `cuDeviceGetCount` after a successful `cuInit`.
    pub(crate) device_count: usize,
}

/// Resolves one symbol from `lib` as a fn pointer of type `F`.
///
/// # Safety
/// `F` must be the exact C signature of `name` as the driver exports it.
unsafe fn symbol<F: Copy>(lib: &'static libloading::Library, name: &str) -> Result<F, String> {
    // SAFETY: the caller guarantees `F` matches the symbol's signature; the library is
    // `'static` (cudarc keeps it in a static), so the fn pointer never dangles.
    unsafe { lib.get::<F>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("libcuda lacks {name}: {e}"))
}

fn load_api() -> Result<Api, String> {
    let present = std::panic::catch_unwind(|| {
        // SAFETY: only tries to dlopen the candidate names; no symbol is called.
        unsafe { cu::is_culib_present() }
    })
    .unwrap_or(false);
    if !present {
        // cudarc's candidate list repeats names and includes Windows-style ones; report the
        // distinct `libcuda.so*` names it tried.
        let searched = std::panic::catch_unwind(|| cudarc::get_lib_name_candidates("cuda"))
            .map(|candidates| {
                let mut names: Vec<String> = Vec::new();
                for c in candidates {
                    if c.starts_with("libcuda.so") && !names.contains(&c) {
                        names.push(c);
                    }
                }
                names.join(", ")
            })
            .unwrap_or_else(|_| "libcuda.so".to_owned());
        return Err(format!("libcuda not found (searched: {searched})"));
    }
    let lib = std::panic::catch_unwind(|| {
        // SAFETY: loading libcuda runs its initialisers only; the probe above found it.
        unsafe { cu::culib() }
    })
    .map_err(|_| "libcuda was found but could not be loaded".to_owned())?;
    macro_rules! resolve {
        ($($name:ident),* $(,)?) => {
            Api { $(
                // SAFETY: each field's type is the driver API's C signature for that name
                // (cuda.h, with CUresult read as int and enums passed as unsigned int).
                $name: unsafe { symbol(lib, stringify!($name))? },
            )* }
        };
    }
    Ok(resolve!(
        cuInit,
        cuDriverGetVersion,
        cuGetErrorName,
        cuDeviceGetCount,
        cuDeviceGet,
        cuDeviceGetName,
        cuDeviceTotalMem_v2,
        cuDeviceGetPCIBusId,
        cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease_v2,
        cuCtxSetCurrent,
        cuCtxGetCurrent,
        cuCtxSynchronize,
        cuMemAlloc_v2,
        cuMemFree_v2,
        cuMemHostAlloc,
        cuMemFreeHost,
        cuMemHostRegister_v2,
        cuMemHostUnregister,
        cuMemHostGetDevicePointer_v2,
        cuPointerGetAttributes,
        cuMemGetAddressRange_v2,
        cuStreamCreate,
        cuStreamSynchronize,
        cuStreamQuery,
        cuStreamGetCtx,
        cuStreamDestroy_v2,
        cuEventCreate,
        cuEventRecord,
        cuEventSynchronize,
        cuEventQuery,
        cuEventDestroy_v2,
        cuMemcpyHtoD_v2,
        cuMemcpyDtoH_v2,
        cuMemcpyHtoDAsync_v2,
        cuMemcpyDtoHAsync_v2,
        cuMemsetD8_v2,
        cuMemGetAllocationGranularity,
        cuMemAddressReserve,
        cuMemAddressFree,
        cuMemCreate,
        cuMemRelease,
        cuMemMap,
        cuMemUnmap,
        cuMemSetAccess,
        cuMemcpyAsync,
        cuDeviceGetAttribute,
        cuModuleLoadData,
        cuModuleGetFunction,
        cuLaunchKernel,
    ))
}

fn probe() -> Result<DriverInfo, String> {
    let api = load_api()?;
    // SAFETY: cuInit takes flags (must be 0) and no pointers.
    let rc = unsafe { (api.cuInit)(0) };
    if rc != CUDA_SUCCESS {
        return Err(format!("cuInit: {} ({rc})", name_with(&api, rc)));
    }
    let mut version: c_int = 0;
    // SAFETY: `version` is a valid out-pointer for the duration of the call.
    let rc = unsafe { (api.cuDriverGetVersion)(&mut version) };
    if rc != CUDA_SUCCESS {
        return Err(format!("cuDriverGetVersion: {} ({rc})", name_with(&api, rc)));
    }
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-pointer for the duration of the call.
    let rc = unsafe { (api.cuDeviceGetCount)(&mut count) };
    if rc != CUDA_SUCCESS {
        return Err(format!("cuDeviceGetCount: {} ({rc})", name_with(&api, rc)));
    }
    Ok(DriverInfo { api, version, device_count: usize::try_from(count).unwrap_or(0) })
}

/// The CUDA driver, probed and initialised once per process; `Unavailable` with the reason when
/// the library is missing, lacks a symbol, or `cuInit` fails (e.g. `CUDA_ERROR_NO_DEVICE`).
pub(crate) fn driver() -> Result<&'static DriverInfo> {
    static DRIVER: OnceLock<Result<DriverInfo, String>> = OnceLock::new();
    DRIVER
        .get_or_init(probe)
        .as_ref()
        .map_err(|reason| Error::Unavailable { what: "CUDA driver", reason: reason.clone() })
}

pub(super) fn api() -> Result<&'static Api> {
    driver().map(|d| &d.api)
}

pub(super) fn name_with(api: &Api, code: Status) -> String {
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: `name` is a valid out-pointer; an unknown code yields an error and leaves it null.
    let rc = unsafe { (api.cuGetErrorName)(code, &mut name) };
    if rc != CUDA_SUCCESS || name.is_null() {
        // A driver shutting down answers no name: the number still says which.
        return match code {
            CUDA_ERROR_DEINITIALIZED => "CUDA_ERROR_DEINITIALIZED".to_owned(),
            CUDA_ERROR_CONTEXT_IS_DESTROYED => "CUDA_ERROR_CONTEXT_IS_DESTROYED".to_owned(),
            _ => "unknown".to_owned(),
        };
    }
    // SAFETY: the driver returns a pointer to a static NUL-terminated string.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

/// Logs a failed release (a destroy or free in a `Drop`). One the driver refused because it is
/// shutting down, or because the context went first — threads of a pool ending while the
/// process exits — is only a debug note: the driver frees everything with itself.
pub(super) fn release_failed(api: &Api, op: &str, rc: Status) {
    if matches!(rc, CUDA_ERROR_DEINITIALIZED | CUDA_ERROR_CONTEXT_IS_DESTROYED) {
        tracing::debug!("{op} after the driver or context went: {} ({rc})", name_with(api, rc));
    } else {
        tracing::warn!("{op} failed: {} ({rc})", name_with(api, rc));
    }
}

/// The symbolic name of a `CUresult` (`CUDA_ERROR_OUT_OF_MEMORY`), or `"unknown"`.
pub(crate) fn error_name(code: i32) -> String {
    match api() {
        Ok(api) => name_with(api, code),
        Err(_) => "unknown".to_owned(),
    }
}

pub(super) fn check(op: &'static str, code: Status) -> Result<()> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda { op, code, name: error_name(code) })
    }
}
