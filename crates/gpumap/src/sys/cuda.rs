//! Raw + result layer over the CUDA driver API (`libcuda`).
//!
//! Loading is guarded: cudarc's loaders panic when `libcuda` is missing, so the library is probed
//! once with [`cudarc::driver::sys::is_culib_present`] inside `catch_unwind` and the answer is
//! cached. Only after a positive probe is cudarc's library handle touched.
//!
//! The driver functions themselves are resolved here into a table of fn pointers whose return
//! type is a plain `c_int`, not cudarc's `CUresult` enum: a driver newer than the bindings can
//! return status codes the enum does not list, and reading such a value as a Rust enum would be
//! undefined behaviour. A missing symbol becomes [`Error::Unavailable`] naming it, never a panic.
//! cudarc's `sys` module is used for handle types, constants and layouts only.
//!
//! Device addresses (`u64`) are opaque to Rust: nothing here dereferences them, the driver
//! validates them, so functions taking them are safe. Host memory is only ever passed as Rust
//! slices or as owned pinned allocations ([`PinnedHost`]); asynchronous copies take ownership of
//! the host buffer ([`PendingCopy`]) so it cannot be freed or touched while the DMA runs.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys as cu;

use crate::error::{Error, Result};

/// A `CUresult` read as the integer it is (see the module docs for why not the enum).
type Status = c_int;

const CUDA_SUCCESS: Status = 0;
const CUDA_ERROR_DEINITIALIZED: Status = 4;
const CUDA_ERROR_CONTEXT_IS_DESTROYED: Status = 709;
const CUDA_ERROR_NOT_READY: Status = 600;
/// `CU_MEMORYTYPE_*` values as returned by `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
pub(crate) const MEMORYTYPE_HOST: u32 = 1;
/// See [`MEMORYTYPE_HOST`].
pub(crate) const MEMORYTYPE_DEVICE: u32 = 2;
/// See [`MEMORYTYPE_HOST`].
pub(crate) const MEMORYTYPE_UNIFIED: u32 = 4;

/// The driver entry points gpumap calls, resolved once from `libcuda`.
#[allow(non_snake_case)]
struct Api {
    cuInit: unsafe extern "C" fn(c_uint) -> Status,
    cuDriverGetVersion: unsafe extern "C" fn(*mut c_int) -> Status,
    cuGetErrorName: unsafe extern "C" fn(Status, *mut *const c_char) -> Status,
    cuDeviceGetCount: unsafe extern "C" fn(*mut c_int) -> Status,
    cuDeviceGet: unsafe extern "C" fn(*mut cu::CUdevice, c_int) -> Status,
    cuDeviceGetName: unsafe extern "C" fn(*mut c_char, c_int, cu::CUdevice) -> Status,
    cuDeviceTotalMem_v2: unsafe extern "C" fn(*mut usize, cu::CUdevice) -> Status,
    cuDeviceGetPCIBusId: unsafe extern "C" fn(*mut c_char, c_int, cu::CUdevice) -> Status,
    cuDevicePrimaryCtxRetain: unsafe extern "C" fn(*mut cu::CUcontext, cu::CUdevice) -> Status,
    cuDevicePrimaryCtxRelease_v2: unsafe extern "C" fn(cu::CUdevice) -> Status,
    cuCtxSetCurrent: unsafe extern "C" fn(cu::CUcontext) -> Status,
    cuCtxGetCurrent: unsafe extern "C" fn(*mut cu::CUcontext) -> Status,
    cuCtxSynchronize: unsafe extern "C" fn() -> Status,
    cuMemAlloc_v2: unsafe extern "C" fn(*mut cu::CUdeviceptr, usize) -> Status,
    cuMemFree_v2: unsafe extern "C" fn(cu::CUdeviceptr) -> Status,
    cuMemHostAlloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> Status,
    cuMemFreeHost: unsafe extern "C" fn(*mut c_void) -> Status,
    cuMemHostRegister_v2: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> Status,
    cuMemHostUnregister: unsafe extern "C" fn(*mut c_void) -> Status,
    cuMemHostGetDevicePointer_v2:
        unsafe extern "C" fn(*mut cu::CUdeviceptr, *mut c_void, c_uint) -> Status,
    cuPointerGetAttributes:
        unsafe extern "C" fn(c_uint, *mut c_uint, *mut *mut c_void, cu::CUdeviceptr) -> Status,
    cuMemGetAddressRange_v2:
        unsafe extern "C" fn(*mut cu::CUdeviceptr, *mut usize, cu::CUdeviceptr) -> Status,
    cuStreamCreate: unsafe extern "C" fn(*mut cu::CUstream, c_uint) -> Status,
    cuStreamSynchronize: unsafe extern "C" fn(cu::CUstream) -> Status,
    cuStreamDestroy_v2: unsafe extern "C" fn(cu::CUstream) -> Status,
    cuEventCreate: unsafe extern "C" fn(*mut cu::CUevent, c_uint) -> Status,
    cuEventRecord: unsafe extern "C" fn(cu::CUevent, cu::CUstream) -> Status,
    cuEventSynchronize: unsafe extern "C" fn(cu::CUevent) -> Status,
    cuEventQuery: unsafe extern "C" fn(cu::CUevent) -> Status,
    cuEventDestroy_v2: unsafe extern "C" fn(cu::CUevent) -> Status,
    cuMemcpyHtoD_v2: unsafe extern "C" fn(cu::CUdeviceptr, *const c_void, usize) -> Status,
    cuMemcpyDtoH_v2: unsafe extern "C" fn(*mut c_void, cu::CUdeviceptr, usize) -> Status,
    cuMemcpyHtoDAsync_v2:
        unsafe extern "C" fn(cu::CUdeviceptr, *const c_void, usize, cu::CUstream) -> Status,
    cuMemcpyDtoHAsync_v2:
        unsafe extern "C" fn(*mut c_void, cu::CUdeviceptr, usize, cu::CUstream) -> Status,
    cuMemsetD8_v2: unsafe extern "C" fn(cu::CUdeviceptr, u8, usize) -> Status,
    cuMemGetAllocationGranularity:
        unsafe extern "C" fn(*mut usize, *const cu::CUmemAllocationProp, c_uint) -> Status,
    cuMemAddressReserve:
        unsafe extern "C" fn(*mut cu::CUdeviceptr, usize, usize, cu::CUdeviceptr, u64) -> Status,
    cuMemAddressFree: unsafe extern "C" fn(cu::CUdeviceptr, usize) -> Status,
    cuMemCreate: unsafe extern "C" fn(
        *mut cu::CUmemGenericAllocationHandle,
        usize,
        *const cu::CUmemAllocationProp,
        u64,
    ) -> Status,
    cuMemRelease: unsafe extern "C" fn(cu::CUmemGenericAllocationHandle) -> Status,
    cuMemMap: unsafe extern "C" fn(
        cu::CUdeviceptr,
        usize,
        usize,
        cu::CUmemGenericAllocationHandle,
        u64,
    ) -> Status,
    cuMemUnmap: unsafe extern "C" fn(cu::CUdeviceptr, usize) -> Status,
    cuMemSetAccess:
        unsafe extern "C" fn(cu::CUdeviceptr, usize, *const cu::CUmemAccessDesc, usize) -> Status,
    cuMemcpyAsync:
        unsafe extern "C" fn(cu::CUdeviceptr, cu::CUdeviceptr, usize, cu::CUstream) -> Status,
    cuDeviceGetAttribute: unsafe extern "C" fn(*mut c_int, c_uint, cu::CUdevice) -> Status,
    cuModuleLoadData: unsafe extern "C" fn(*mut cu::CUmodule, *const c_void) -> Status,
    cuModuleGetFunction:
        unsafe extern "C" fn(*mut cu::CUfunction, cu::CUmodule, *const c_char) -> Status,
    cuLaunchKernel: unsafe extern "C" fn(
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
    api: Api,
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

fn api() -> Result<&'static Api> {
    driver().map(|d| &d.api)
}

fn name_with(api: &Api, code: Status) -> String {
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
fn release_failed(api: &Api, op: &str, rc: Status) {
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

fn check(op: &'static str, code: Status) -> Result<()> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda { op, code, name: error_name(code) })
    }
}

/// `cuDeviceGet`: the device handle for an ordinal, checked against the device count.
pub(crate) fn device_get(ordinal: usize) -> Result<cu::CUdevice> {
    let info = driver()?;
    if ordinal >= info.device_count {
        return Err(Error::Unavailable {
            what: "CUDA device",
            reason: format!("ordinal {ordinal} requested, {} device(s) present", info.device_count),
        });
    }
    let ordinal = c_int::try_from(ordinal)
        .map_err(|_| Error::InvalidArgument(format!("device ordinal {ordinal} too large")))?;
    let mut dev: cu::CUdevice = 0;
    // SAFETY: `dev` is a valid out-pointer.
    check("cuDeviceGet", unsafe { (info.api.cuDeviceGet)(&mut dev, ordinal) })?;
    Ok(dev)
}

fn c_string_query(
    op: &'static str,
    f: unsafe extern "C" fn(*mut c_char, c_int, cu::CUdevice) -> Status,
    dev: cu::CUdevice,
) -> Result<String> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: `buf` is writable for its full length, which is passed; the driver NUL-terminates.
    check(op, unsafe { f(buf.as_mut_ptr(), buf.len() as c_int - 1, dev) })?;
    // SAFETY: the buffer was zeroed and the driver writes at most len-1 bytes, so it ends in NUL.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// `cuDeviceGetName`.
pub(crate) fn device_name(dev: cu::CUdevice) -> Result<String> {
    c_string_query("cuDeviceGetName", api()?.cuDeviceGetName, dev)
}

/// `cuDeviceGetPCIBusId` (`domain:bus:device.function`).
pub(crate) fn device_pci_bus_id(dev: cu::CUdevice) -> Result<String> {
    c_string_query("cuDeviceGetPCIBusId", api()?.cuDeviceGetPCIBusId, dev)
}

/// `cuDeviceTotalMem`: bytes of device memory.
pub(crate) fn device_total_mem(dev: cu::CUdevice) -> Result<usize> {
    let mut bytes = 0usize;
    // SAFETY: `bytes` is a valid out-pointer.
    check("cuDeviceTotalMem", unsafe { (api()?.cuDeviceTotalMem_v2)(&mut bytes, dev) })?;
    Ok(bytes)
}

/// A retained primary context (`cuDevicePrimaryCtxRetain`), released on drop.
pub(crate) struct PrimaryContext {
    dev: cu::CUdevice,
    ctx: cu::CUcontext,
}

// SAFETY: a CUcontext handle may be used from any thread (the driver API is thread-safe);
// the struct only stores the handle.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; no method mutates the struct.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// `cuDevicePrimaryCtxRetain`.
    pub(crate) fn retain(dev: cu::CUdevice) -> Result<Self> {
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer; `dev` came from cuDeviceGet.
        check("cuDevicePrimaryCtxRetain", unsafe {
            (api()?.cuDevicePrimaryCtxRetain)(&mut ctx, dev)
        })?;
        Ok(Self { dev, ctx })
    }

    /// Makes this context current on the calling thread (`cuCtxSetCurrent`), unless it already
    /// is (`cuCtxGetCurrent` is a thread-local read in the driver, so this is cheap to repeat and
    /// stays right when other code switched the thread's context meanwhile).
    pub(crate) fn bind_to_thread(&self) -> Result<()> {
        let api = api()?;
        let mut current: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: `current` is a valid out-pointer.
        check("cuCtxGetCurrent", unsafe { (api.cuCtxGetCurrent)(&mut current) })?;
        if current == self.ctx {
            return Ok(());
        }
        // SAFETY: `self.ctx` is a retained, live primary context.
        check("cuCtxSetCurrent", unsafe { (api.cuCtxSetCurrent)(self.ctx) })
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: balances the retain in `PrimaryContext::retain`.
            let rc = unsafe { (api.cuDevicePrimaryCtxRelease_v2)(self.dev) };
            if rc != CUDA_SUCCESS {
                release_failed(api, "cuDevicePrimaryCtxRelease", rc);
            }
        }
    }
}

/// Binds a context current if the thread has none, so that calls which need *a* context (frees
/// at drop time) work on threads that never bound one. Errors are ignored: callers report the
/// failure of the call that follows.
fn ensure_some_context(api: &Api, fallback: cu::CUcontext) {
    let mut current: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: `current` is a valid out-pointer.
    let rc = unsafe { (api.cuCtxGetCurrent)(&mut current) };
    if rc == CUDA_SUCCESS && current.is_null() && !fallback.is_null() {
        // SAFETY: `fallback` is a live context owned by the caller's allocation.
        let _ = unsafe { (api.cuCtxSetCurrent)(fallback) };
    }
}

/// An owned device allocation (`cuMemAlloc`), freed (`cuMemFree`) on drop.
pub(crate) struct DeviceAlloc {
    ptr: cu::CUdeviceptr,
    len: usize,
    ctx: cu::CUcontext,
}

// SAFETY: holds a device address and a context handle; the driver API is thread-safe.
unsafe impl Send for DeviceAlloc {}
// SAFETY: as above; no method mutates the struct.
unsafe impl Sync for DeviceAlloc {}

impl DeviceAlloc {
    /// `cuMemAlloc` of `len` bytes in `ctx`, which the caller has made current. A zero length
    /// allocates nothing (the driver rejects it) and yields a null address.
    pub(crate) fn new(ctx: &PrimaryContext, len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Self { ptr: 0, len: 0, ctx: ctx.ctx });
        }
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        check("cuMemAlloc", unsafe { (api()?.cuMemAlloc_v2)(&mut ptr, len) })?;
        Ok(Self { ptr, len, ctx: ctx.ctx })
    }

    /// The device address.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes allocated.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        if let Ok(api) = api() {
            ensure_some_context(api, self.ctx);
            // Work still queued on the memory (a copy whose guard was leaked, say) must finish
            // before the driver can hand the addresses to another allocation.
            // SAFETY: takes no arguments; a context is current (bound above).
            let rc = unsafe { (api.cuCtxSynchronize)() };
            if rc != CUDA_SUCCESS {
                release_failed(api, "cuCtxSynchronize before cuMemFree", rc);
            }
            // SAFETY: `ptr` came from cuMemAlloc and is freed exactly once, here.
            let rc = unsafe { (api.cuMemFree_v2)(self.ptr) };
            if rc != CUDA_SUCCESS {
                release_failed(api, &format!("cuMemFree({:#x})", self.ptr), rc);
            }
        }
    }
}

/// `cuMemcpyHtoD`: copy of `src` to device address `dst`, on the device when it returns.
pub(crate) fn memcpy_htod(dst: u64, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: `src` is readable for its length; the call returns after the source was consumed.
    check("cuMemcpyHtoD", unsafe {
        (api()?.cuMemcpyHtoD_v2)(dst, src.as_ptr().cast(), src.len())
    })?;
    // From pageable memory the call may return once the bytes are staged, before they reach
    // the device; gpumap's own streams are non-blocking and would not wait for them.
    legacy_stream_synchronize()
}

/// `cuStreamSynchronize` on the legacy default stream, where the synchronous copy and memset
/// calls run: after it, their effects are visible to work on any stream.
fn legacy_stream_synchronize() -> Result<()> {
    // SAFETY: the null handle names the legacy default stream of the current context.
    check("cuStreamSynchronize", unsafe { (api()?.cuStreamSynchronize)(std::ptr::null_mut()) })
}

/// `cuMemcpyDtoH`: synchronous copy from device address `src` into `dst`.
pub(crate) fn memcpy_dtoh(dst: &mut [u8], src: u64) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    // SAFETY: `dst` is writable for its length and exclusively borrowed; the call returns after
    // the copy completed.
    check("cuMemcpyDtoH", unsafe {
        (api()?.cuMemcpyDtoH_v2)(dst.as_mut_ptr().cast(), src, dst.len())
    })
}

/// `cuMemsetD8`: sets `len` bytes at device address `dst` to `value`; done when it returns.
pub(crate) fn memset_d8(dst: u64, value: u8, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: no host memory is involved; the driver validates the device range.
    check("cuMemsetD8", unsafe { (api()?.cuMemsetD8_v2)(dst, value, len) })?;
    // cuMemsetD8 is asynchronous to the host; make it done before anything else touches the
    // memory from a non-blocking stream.
    legacy_stream_synchronize()
}

/// Page-locked host memory from `cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE)` (page-aligned,
/// usable from every context), zero-initialised, freed on drop.
pub(crate) struct PinnedHost {
    /// Page-aligned start of the `len` usable bytes.
    ptr: NonNull<u8>,
    len: usize,
    /// What `cuMemHostAlloc` returned (what `cuMemFreeHost` takes).
    base: NonNull<u8>,
}

// SAFETY: owns its allocation exclusively (like a Box<[u8]>).
unsafe impl Send for PinnedHost {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// `cuMemHostAlloc`; needs a current context (the caller binds one).
    pub(crate) fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Self::empty());
        }
        // The driver does not promise page alignment (small pinned allocations may be carved
        // out of larger ones), and O_DIRECT needs it: ask for a page more and start at the
        // first page boundary.
        let page = crate::align::PAGE_SIZE as usize;
        let padded = len.checked_add(page - 1).ok_or_else(|| {
            Error::InvalidArgument(format!("a pinned buffer of {len} bytes is too large"))
        })?;
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("cuMemHostAlloc", unsafe {
            (api()?.cuMemHostAlloc)(&mut raw, padded, cu::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        let base = NonNull::new(raw.cast::<u8>()).ok_or(Error::Cuda {
            op: "cuMemHostAlloc",
            code: 0,
            name: "returned a null pointer".to_owned(),
        })?;
        let skew = (page - base.as_ptr() as usize % page) % page;
        // SAFETY: `skew < page`, so `base + skew` and the `len` bytes after it lie inside the
        // `len + page - 1` bytes allocated.
        let ptr = unsafe { base.add(skew) };
        // SAFETY: the `len` bytes at `ptr` are allocated and writable; zeroing makes every byte
        // initialised before a `&[u8]` to them can exist.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Ok(Self { ptr, len, base })
    }

    /// A zero-length placeholder; allocates nothing and never calls the driver.
    pub(crate) fn empty() -> Self {
        Self { ptr: NonNull::dangling(), len: 0, base: NonNull::dangling() }
    }

    /// Bytes allocated.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The host address (page-aligned).
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The memory as a slice.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes for the life of `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The memory as a mutable slice.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        if let Ok(api) = api() {
            // SAFETY: `base` came from cuMemHostAlloc and is freed exactly once, here.
            let rc = unsafe { (api.cuMemFreeHost)(self.base.as_ptr().cast()) };
            if rc != CUDA_SUCCESS {
                release_failed(api, "cuMemFreeHost", rc);
            }
        }
    }
}

/// What `cuPointerGetAttributes` says about an address.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PointerAttributes {
    /// `CU_MEMORYTYPE_*`, or 0 when the address is not known to CUDA.
    pub(crate) memory_type: u32,
    /// Whether the allocation is managed (unified) memory.
    pub(crate) is_managed: bool,
    /// The device the memory lives on (or was allocated for).
    pub(crate) device_ordinal: i32,
    /// The owning context, 0 when none.
    pub(crate) context: usize,
    /// Start of the allocation containing the address (0 when unknown).
    pub(crate) range_start: u64,
    /// Size of that allocation (0 when unknown).
    pub(crate) range_size: u64,
}

/// `cuPointerGetAttributes`: unlike `cuPointerGetAttribute`, it does not fail for addresses CUDA
/// does not know (freed, pageable host) but reports memory type 0, which is what lets
/// classification tell them apart without an error path.
pub(crate) fn pointer_attributes(addr: u64) -> Result<PointerAttributes> {
    let api = api()?;
    let attrs: [c_uint; 6] = [
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as c_uint,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED as c_uint,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as c_uint,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT as c_uint,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR as c_uint,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE as c_uint,
    ];
    // Each result gets a zeroed 8-byte slot: the driver writes 4 bytes for the int-typed
    // attributes and up to 8 for the others, so zero-extension reads every one correctly
    // (little-endian). The device ordinal is pre-set to -1 for "none".
    let mut slots: [u64; 6] = [0, 0, u32::MAX as u64, 0, 0, 0];
    let mut data: [*mut c_void; 6] = [std::ptr::null_mut(); 6];
    for (d, s) in data.iter_mut().zip(slots.iter_mut()) {
        *d = (s as *mut u64).cast();
    }
    let mut attr_copy = attrs;
    // SAFETY: `attr_copy` and `data` have 6 entries each, every data pointer points at an
    // 8-byte slot that outlives the call; `addr` is only inspected, never dereferenced.
    check("cuPointerGetAttributes", unsafe {
        (api.cuPointerGetAttributes)(6, attr_copy.as_mut_ptr(), data.as_mut_ptr(), addr)
    })?;
    Ok(PointerAttributes {
        memory_type: slots[0] as u32,
        is_managed: slots[1] != 0,
        device_ordinal: slots[2] as u32 as i32,
        context: slots[3] as usize,
        range_start: slots[4],
        range_size: slots[5],
    })
}

/// `cuMemGetAddressRange`: base and size of the allocation containing `addr` (binds `context`,
/// the one the pointer attributes named, because the call is answered for the current context).
pub(crate) fn mem_get_address_range(addr: u64, context: usize) -> Result<(u64, usize)> {
    let api = api()?;
    if context != 0 {
        // SAFETY: `context` was reported by the driver as the owner of a live allocation.
        check("cuCtxSetCurrent", unsafe { (api.cuCtxSetCurrent)(context as cu::CUcontext) })?;
    }
    let mut base: cu::CUdeviceptr = 0;
    let mut size = 0usize;
    // SAFETY: both out-pointers are valid; `addr` is only looked up.
    check("cuMemGetAddressRange", unsafe {
        (api.cuMemGetAddressRange_v2)(&mut base, &mut size, addr)
    })?;
    Ok((base, size))
}

/// A non-blocking stream (`cuStreamCreate(CU_STREAM_NON_BLOCKING)`), destroyed on drop.
pub(crate) struct RawStream {
    stream: cu::CUstream,
    /// Completed events kept for the stream's next copies: creating and destroying an event
    /// per copy costs two more driver calls on every bounce-buffer chunk.
    spare_events: parking_lot::Mutex<Vec<RawEvent>>,
}

/// Spare events a stream keeps (a double-buffered loop needs two or three).
const SPARE_EVENTS: usize = 8;

// SAFETY: CUDA streams may be used from any thread; the struct only stores the handle.
unsafe impl Send for RawStream {}
// SAFETY: as above.
unsafe impl Sync for RawStream {}

impl RawStream {
    /// `cuStreamCreate` in the current context (the caller binds it).
    pub(crate) fn new() -> Result<Self> {
        let mut stream: cu::CUstream = std::ptr::null_mut();
        // SAFETY: `stream` is a valid out-pointer.
        check("cuStreamCreate", unsafe {
            (api()?.cuStreamCreate)(
                &mut stream,
                cu::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint,
            )
        })?;
        Ok(Self { stream, spare_events: parking_lot::Mutex::new(Vec::new()) })
    }

    /// A spare event of this stream, or a new one (`cuEventCreate`).
    fn take_event(&self) -> Result<RawEvent> {
        match self.spare_events.lock().pop() {
            Some(event) => Ok(event),
            None => RawEvent::new(),
        }
    }

    /// Keeps a completed event for a later copy (or destroys it when enough are kept).
    fn keep_event(&self, event: RawEvent) {
        let mut spare = self.spare_events.lock();
        if spare.len() < SPARE_EVENTS {
            spare.push(event);
        }
    }

    /// `cuStreamSynchronize`.
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live for the life of `self`.
        check("cuStreamSynchronize", unsafe { (api()?.cuStreamSynchronize)(self.stream) })
    }

    /// The raw handle, for cuFile's stream-ordered calls.
    pub(crate) fn handle(&self) -> cu::CUstream {
        self.stream
    }
}

impl Drop for RawStream {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: destroyed exactly once; the driver lets queued work finish first.
            let rc = unsafe { (api.cuStreamDestroy_v2)(self.stream) };
            if rc != CUDA_SUCCESS {
                release_failed(api, "cuStreamDestroy", rc);
            }
        }
    }
}

/// An event created with `CU_EVENT_DISABLE_TIMING` (the cheap kind), destroyed on drop.
pub(crate) struct RawEvent {
    event: cu::CUevent,
}

// SAFETY: CUDA events may be used from any thread; the struct only stores the handle.
unsafe impl Send for RawEvent {}
// SAFETY: as above.
unsafe impl Sync for RawEvent {}

impl RawEvent {
    /// `cuEventCreate` in the current context.
    pub(crate) fn new() -> Result<Self> {
        let mut event: cu::CUevent = std::ptr::null_mut();
        // SAFETY: `event` is a valid out-pointer.
        check("cuEventCreate", unsafe {
            (api()?.cuEventCreate)(&mut event, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint)
        })?;
        Ok(Self { event })
    }

    /// `cuEventRecord` on `stream`.
    pub(crate) fn record(&self, stream: &RawStream) -> Result<()> {
        // SAFETY: both handles are live.
        check("cuEventRecord", unsafe { (api()?.cuEventRecord)(self.event, stream.stream) })
    }

    /// `cuEventSynchronize`: blocks until the work recorded before the event completed.
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live.
        check("cuEventSynchronize", unsafe { (api()?.cuEventSynchronize)(self.event) })
    }

    /// `cuEventQuery`: `Ok(true)` when complete, `Ok(false)` while pending.
    pub(crate) fn is_complete(&self) -> Result<bool> {
        // SAFETY: the handle is live.
        let rc = unsafe { (api()?.cuEventQuery)(self.event) };
        match rc {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            code => check("cuEventQuery", code).map(|()| false),
        }
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: destroyed exactly once.
            let rc = unsafe { (api.cuEventDestroy_v2)(self.event) };
            if rc != CUDA_SUCCESS {
                release_failed(api, "cuEventDestroy", rc);
            }
        }
    }
}

/// Direction of a [`PendingCopy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyDirection {
    /// Host buffer -> device (`cuMemcpyHtoDAsync`).
    HostToDevice,
    /// Device -> host buffer (`cuMemcpyDtoHAsync`).
    DeviceToHost,
}

/// An asynchronous copy between a pinned host buffer and device memory that owns the host buffer
/// until the copy is known complete. The buffer is handed back by [`PendingCopy::wait`]; dropping
/// the guard waits too. Because the guard owns `B` (and `B: 'static`), nothing else can free,
/// read or write the host memory while the DMA engine uses it — not even after `mem::forget`,
/// which leaks the buffer instead.
pub(crate) struct PendingCopy<B: Send + 'static> {
    buffer: Option<B>,
    /// Recorded after the copy; back to the stream's spares once it completed.
    event: Option<RawEvent>,
    /// Kept alive so the fallback synchronize in `drop` never touches a destroyed stream.
    stream: Arc<RawStream>,
}

impl<B: Send + 'static> PendingCopy<B> {
    /// Enqueues a copy of `len` bytes between the start of `buffer`'s pinned memory (found with
    /// `host`, called exactly once) and device address `device` on `stream`, then records an
    /// event. The caller has made the stream's context current and checked the device range.
    pub(crate) fn start(
        stream: &Arc<RawStream>,
        mut buffer: B,
        host: fn(&mut B) -> &mut PinnedHost,
        host_offset: usize,
        direction: CopyDirection,
        device: u64,
        len: usize,
    ) -> Result<Self> {
        let api = api()?;
        let event = stream.take_event()?;
        let pinned = host(&mut buffer);
        let needed = host_offset
            .checked_add(len)
            .ok_or(Error::Overflow { offset: host_offset as u64, len: len as u64 })?;
        if needed > pinned.len() {
            return Err(Error::BufferTooSmall {
                needed: needed as u64,
                available: pinned.len() as u64,
            });
        }
        // SAFETY: `host_offset + len <= pinned.len()` (checked above), so the offset pointer
        // stays inside the allocation.
        let host_ptr = unsafe { pinned.ptr.as_ptr().add(host_offset) };
        if len > 0 {
            let (op, rc) = match direction {
                CopyDirection::HostToDevice => (
                    "cuMemcpyHtoDAsync",
                    // SAFETY: `host_ptr` is valid for `len` bytes (checked above) and stays valid
                    // and untouched until the event completes: `buffer` moves into the guard.
                    unsafe {
                        (api.cuMemcpyHtoDAsync_v2)(device, host_ptr.cast(), len, stream.stream)
                    },
                ),
                CopyDirection::DeviceToHost => (
                    "cuMemcpyDtoHAsync",
                    // SAFETY: as above; the guard also holds the only access to the memory, so
                    // the device's writes race with nothing.
                    unsafe {
                        (api.cuMemcpyDtoHAsync_v2)(host_ptr.cast(), device, len, stream.stream)
                    },
                ),
            };
            check(op, rc)?;
        }
        // An event that was never recorded would report "complete" at once: keep it only if
        // recording worked, so that otherwise the guard's drop synchronizes the whole stream.
        let (event, recorded) = match event.record(stream) {
            Ok(()) => (Some(event), Ok(())),
            Err(e) => (None, Err(e)),
        };
        let pending = Self { buffer: Some(buffer), event, stream: Arc::clone(stream) };
        if let Err(e) = recorded {
            // The copy is queued but unrecorded: the guard's drop falls back to a stream sync
            // before releasing the buffer.
            drop(pending);
            return Err(e);
        }
        Ok(pending)
    }

    /// Blocks until the copy completed and returns the buffer.
    pub(crate) fn wait(mut self) -> Result<B> {
        match self.event.take() {
            Some(event) => {
                event.synchronize()?;
                self.stream.keep_event(event);
            }
            None => self.stream.synchronize()?,
        }
        self.buffer.take().ok_or_else(|| Error::InvalidArgument("copy already waited".to_owned()))
    }

    /// Whether the copy has completed (`cuEventQuery`), without blocking.
    pub(crate) fn is_complete(&self) -> Result<bool> {
        match &self.event {
            Some(event) => event.is_complete(),
            None => Ok(true),
        }
    }
}

impl<B: Send + 'static> Drop for PendingCopy<B> {
    fn drop(&mut self) {
        let Some(buffer) = self.buffer.take() else { return };
        if self.event.as_ref().is_some_and(|event| event.synchronize().is_ok()) {
            return;
        }
        if self.stream.synchronize().is_err() {
            // The DMA may still be using the memory: leak it rather than free or reuse it.
            tracing::warn!("could not confirm an async copy finished; leaking its buffer");
            std::mem::forget(buffer);
        }
    }
}

/// Physical memory on device `ordinal`, pinned (not migratable), no shareable handle.
fn allocation_prop(ordinal: c_int) -> cu::CUmemAllocationProp {
    cu::CUmemAllocationProp {
        type_: cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: cu::CUmemLocation {
            type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: cu::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The unit of physical device memory for virtual memory management on device `ordinal`
/// (`cuMemGetAllocationGranularity`, minimum granularity; 2 MiB on current GPUs).
pub(crate) fn allocation_granularity(ordinal: usize) -> Result<usize> {
    let prop = allocation_prop(ordinal as c_int);
    let mut granularity = 0usize;
    // SAFETY: both pointers are valid for the call; option 0 = CU_MEM_ALLOC_GRANULARITY_MINIMUM.
    check("cuMemGetAllocationGranularity", unsafe {
        (api()?.cuMemGetAllocationGranularity)(&mut granularity, &prop, 0)
    })?;
    Ok(granularity)
}

/// A range of device virtual addresses (`cuMemAddressReserve`) with no memory behind it until
/// [`PhysicalFrame`]s are mapped into it; released on drop (`cuMemAddressFree`). Everything
/// mapped must be unmapped first: the owner does that before dropping it.
pub(crate) struct AddressReservation {
    base: cu::CUdeviceptr,
    len: usize,
}

impl AddressReservation {
    /// Reserves `len` bytes (a multiple of the allocation granularity) aligned to `alignment`;
    /// the caller has bound a context.
    pub(crate) fn new(len: usize, alignment: usize) -> Result<Self> {
        let mut base: cu::CUdeviceptr = 0;
        // SAFETY: `base` is a valid out-pointer; no fixed address is requested.
        check("cuMemAddressReserve", unsafe {
            (api()?.cuMemAddressReserve)(&mut base, len, alignment, 0, 0)
        })?;
        Ok(Self { base, len })
    }

    /// The first address.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// Maps all of `frame` at `offset` into the reservation and makes it readable and writable
    /// from device `ordinal` (`cuMemMap` + `cuMemSetAccess`).
    pub(crate) fn map(&self, offset: usize, frame: &PhysicalFrame, ordinal: usize) -> Result<()> {
        self.check_inside(offset, frame.len)?;
        let api = api()?;
        let at = self.base + offset as u64;
        // SAFETY: `[at, at + frame.len)` lies inside our reservation (checked above); the
        // handle is live; the driver refuses a range that is already mapped.
        check("cuMemMap", unsafe { (api.cuMemMap)(at, frame.len, 0, frame.handle, 0) })?;
        let access = cu::CUmemAccessDesc {
            location: cu::CUmemLocation {
                type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal as c_int,
            },
            flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; `access` is one valid descriptor.
        let rc = unsafe { (api.cuMemSetAccess)(at, frame.len, &access, 1) };
        if rc != CUDA_SUCCESS {
            // SAFETY: undoes the map above; nothing can have used the inaccessible range.
            unsafe { (api.cuMemUnmap)(at, frame.len) };
            return check("cuMemSetAccess", rc);
        }
        Ok(())
    }

    /// Unmaps `len` bytes at `offset` (`cuMemUnmap`). The caller guarantees that no copy or
    /// kernel still uses the range.
    pub(crate) fn unmap(&self, offset: usize, len: usize) -> Result<()> {
        self.check_inside(offset, len)?;
        // SAFETY: the range lies inside our reservation; the caller guarantees it is idle.
        check("cuMemUnmap", unsafe { (api()?.cuMemUnmap)(self.base + offset as u64, len) })
    }

    fn check_inside(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfRange {
                offset: offset as u64,
                len: len as u64,
                file_len: self.len as u64,
            }),
        }
    }
}

impl Drop for AddressReservation {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: freed exactly once; the owner unmapped every frame before dropping it.
            let rc = unsafe { (api.cuMemAddressFree)(self.base, self.len) };
            if rc != CUDA_SUCCESS {
                release_failed(api, "cuMemAddressFree", rc);
            }
        }
    }
}

/// Physical device memory (`cuMemCreate`) to map into an [`AddressReservation`]; released on
/// drop (`cuMemRelease`; the driver keeps it alive while it is still mapped somewhere).
pub(crate) struct PhysicalFrame {
    handle: cu::CUmemGenericAllocationHandle,
    len: usize,
}

impl PhysicalFrame {
    /// `len` bytes (a multiple of the allocation granularity) on device `ordinal`.
    pub(crate) fn new(ordinal: usize, len: usize) -> Result<Self> {
        let prop = allocation_prop(ordinal as c_int);
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` and `prop` are valid for the call; flags must be 0.
        check("cuMemCreate", unsafe { (api()?.cuMemCreate)(&mut handle, len, &prop, 0) })?;
        Ok(Self { handle, len })
    }
}

impl Drop for PhysicalFrame {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: released exactly once.
            let rc = unsafe { (api.cuMemRelease)(self.handle) };
            if rc != CUDA_SUCCESS {
                release_failed(api, "cuMemRelease", rc);
            }
        }
    }
}

/// Host memory registered with the driver for the GPU to read (`cuMemHostRegister` with
/// `CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_READ_ONLY`): its pages are pinned, and
/// kernels read them over the bus at [`device_ptr`](Self::device_ptr). Unregistered on drop.
pub(crate) struct HostRegistration {
    ptr: NonNull<u8>,
    device_ptr: u64,
}

// SAFETY: holds an address and a registration, no data; the driver call that ends it may come
// from any thread.
unsafe impl Send for HostRegistration {}
// SAFETY: nothing is reached through a shared reference but the two addresses.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `len` bytes at `ptr` read-only. Pinning faults in and locks every page, so
    /// this costs about 0.1 s per GiB of page-cached file (H100 machine) and fails where the
    /// locked-memory limit or a page that cannot be read (the file shrank) stops it. Needs a
    /// current context (the caller binds one).
    ///
    /// # Safety
    /// `ptr..ptr + len` is mapped, readable, and stays mapped until the registration is
    /// dropped.
    pub(crate) unsafe fn read_only(ptr: NonNull<u8>, len: usize) -> Result<Self> {
        let flags = cu::CU_MEMHOSTREGISTER_DEVICEMAP | cu::CU_MEMHOSTREGISTER_READ_ONLY;
        let api = api()?;
        // SAFETY: the caller promises the range is mapped and stays so while registered.
        check("cuMemHostRegister", unsafe {
            (api.cuMemHostRegister_v2)(ptr.as_ptr().cast(), len, flags)
        })?;
        let mut device_ptr: cu::CUdeviceptr = 0;
        // SAFETY: `device_ptr` is a valid out-pointer; `ptr` was registered just above.
        let rc = check("cuMemHostGetDevicePointer", unsafe {
            (api.cuMemHostGetDevicePointer_v2)(&mut device_ptr, ptr.as_ptr().cast(), 0)
        });
        if let Err(e) = rc {
            // SAFETY: registered above, unregistered once, here.
            let _ = unsafe { (api.cuMemHostUnregister)(ptr.as_ptr().cast()) };
            return Err(e);
        }
        Ok(Self { ptr, device_ptr })
    }

    /// Where kernels on the device read the first byte.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.device_ptr
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        match api() {
            Ok(api) => {
                // SAFETY: registered in `read_only`, unregistered exactly once, here.
                let rc = unsafe { (api.cuMemHostUnregister)(self.ptr.as_ptr().cast()) };
                if rc != CUDA_SUCCESS {
                    tracing::warn!("cuMemHostUnregister failed: {}", error_name(rc));
                }
            }
            Err(e) => tracing::warn!("cuMemHostUnregister not called: {e}"),
        }
    }
}

/// Whether device `ordinal` can read host memory registered read-only
/// (`CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED`).
pub(crate) fn read_only_host_register_supported(ordinal: usize) -> Result<bool> {
    device_attribute(
        ordinal,
        cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
    )
    .map(|v| v != 0)
}

/// `cuDeviceGetAttribute`: an integer attribute of device `ordinal`.
pub(crate) fn device_attribute(ordinal: usize, attribute: cu::CUdevice_attribute) -> Result<i32> {
    let dev = device_get(ordinal)?;
    let mut value: c_int = 0;
    // SAFETY: `value` is a valid out-pointer; the attribute is passed as the enum's value.
    check("cuDeviceGetAttribute", unsafe {
        (api()?.cuDeviceGetAttribute)(&mut value, attribute as c_uint, dev)
    })?;
    Ok(value)
}

/// `cuMemcpyAsync` of `len` bytes from `src` to `dst` on `stream`; with unified addressing the
/// driver tells host from device memory by the addresses. The caller keeps both ranges valid
/// and otherwise untouched until the stream is synchronized.
pub(crate) fn memcpy_async(dst: u64, src: u64, len: usize, stream: &RawStream) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: the addresses are only handed to the driver, which validates them; the caller
    // upholds the lifetime contract above.
    check("cuMemcpyAsync", unsafe { (api()?.cuMemcpyAsync)(dst, src, len, stream.stream) })
}

/// The batched-copy kernel of `kernels/copy_batch.cu`, as PTX built by `scripts/build-ptx.py`.
const COPY_BATCH_PTX: &str = concat!(include_str!("../../kernels/copy_batch.ptx"), "\0");

/// Threads per block of the copy kernel: 256 threads move a 4 KiB copy 16 bytes each.
const COPY_BLOCK: u32 = 256;
/// Most blocks one launch uses; blocks stride over the copies beyond it.
const COPY_GRID_MAX: u32 = 8192;

/// The batched-copy kernel loaded into one context (`cuModuleLoadData` + `cuModuleGetFunction`).
/// The module stays loaded for the life of the process (one per device), so the function
/// handle never dangles.
pub(crate) struct CopyKernel {
    function: cu::CUfunction,
}

// SAFETY: a CUfunction handle may be used from any thread; the driver API is thread-safe.
unsafe impl Send for CopyKernel {}
// SAFETY: as above; nothing mutates the handle.
unsafe impl Sync for CopyKernel {}

impl CopyKernel {
    /// Loads the kernel into the current context (the caller binds the device's). Fails when the
    /// driver cannot JIT the PTX (too old a driver), or when the device has no unified
    /// addressing (the kernel reads pinned host memory through its host address).
    pub(crate) fn load(ordinal: usize) -> Result<CopyKernel> {
        let unified = device_attribute(
            ordinal,
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
        )?;
        if unified == 0 {
            return Err(Error::Unavailable {
                what: "copy kernel",
                reason: format!("GPU {ordinal} has no unified addressing"),
            });
        }
        let api = api()?;
        let mut module: cu::CUmodule = std::ptr::null_mut();
        // SAFETY: `module` is a valid out-pointer; the image is a NUL-terminated PTX string
        // that lives for the whole program.
        check("cuModuleLoadData", unsafe {
            (api.cuModuleLoadData)(&mut module, COPY_BATCH_PTX.as_ptr().cast())
        })?;
        let mut function: cu::CUfunction = std::ptr::null_mut();
        let name = c"gpumap_copy_batch";
        // SAFETY: `function` is a valid out-pointer, `module` was just loaded, `name` is a
        // NUL-terminated string. The module is never unloaded (see the type's docs).
        check("cuModuleGetFunction", unsafe {
            (api.cuModuleGetFunction)(&mut function, module, name.as_ptr())
        })?;
        Ok(CopyKernel { function })
    }

    /// Runs `count` copies described in `descriptors` — `count` source addresses (u64), then
    /// `count` destination addresses (u64), then `count` lengths (u32), packed from its first
    /// byte — on `stream`, and waits for them.
    ///
    /// The crate's contract (it is `pub(crate)`): every source and destination range is memory
    /// the device can reach (device memory, or pinned host memory as a source) that stays valid
    /// and is not otherwise accessed until this returns, and destinations do not overlap.
    pub(crate) fn run(
        &self,
        stream: &RawStream,
        descriptors: &PinnedHost,
        count: usize,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let needed =
            count.checked_mul(20).ok_or(Error::Overflow { offset: 0, len: count as u64 })?;
        if needed > descriptors.len() {
            return Err(Error::BufferTooSmall {
                needed: needed as u64,
                available: descriptors.len() as u64,
            });
        }
        let count32 = u32::try_from(count)
            .map_err(|_| Error::InvalidArgument(format!("{count} copies in one launch")))?;
        let base = descriptors.addr() as u64;
        let mut src = base;
        let mut dst = base + 8 * count as u64;
        let mut len = base + 16 * count as u64;
        let mut n = count32;
        let mut params: [*mut c_void; 4] = [
            (&mut src as *mut u64).cast(),
            (&mut dst as *mut u64).cast(),
            (&mut len as *mut u64).cast(),
            (&mut n as *mut u32).cast(),
        ];
        let grid = count32.min(COPY_GRID_MAX);
        // SAFETY: the four parameters match the kernel's signature (three pointers, one
        // unsigned int) and live until the call returns (the driver copies them at launch).
        // The descriptor arrays lie inside `descriptors` (checked above), which stays borrowed
        // until the stream is synchronized below; the copies' own ranges are the caller's
        // contract.
        check("cuLaunchKernel", unsafe {
            (api()?.cuLaunchKernel)(
                self.function,
                grid,
                1,
                1,
                COPY_BLOCK,
                1,
                1,
                0,
                stream.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })?;
        stream.synchronize()
    }
}
