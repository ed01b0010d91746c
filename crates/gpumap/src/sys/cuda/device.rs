//! Devices and their primary contexts: handles, names, memory, attributes.
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::{c_char, c_int, c_uint, CStr};

use cudarc::driver::sys as cu;

use super::driver::{api, check, release_failed, Status, CUDA_SUCCESS};
use super::driver::{driver, Api};
use crate::error::{Error, Result};

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
    pub(super) ctx: cu::CUcontext,
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
pub(super) fn ensure_some_context(api: &Api, fallback: cu::CUcontext) {
    let mut current: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: `current` is a valid out-pointer.
    let rc = unsafe { (api.cuCtxGetCurrent)(&mut current) };
    if rc == CUDA_SUCCESS && current.is_null() && !fallback.is_null() {
        // SAFETY: `fallback` is a live context owned by the caller's allocation.
        let _ = unsafe { (api.cuCtxSetCurrent)(fallback) };
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
