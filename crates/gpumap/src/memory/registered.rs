//! Host memory the GPU reads in place: a file's read-only mapping registered with the driver
//! (`cuMemHostRegister`), which the zero-copy tier gathers from. The `unsafe` part lives in
//! `sys`.
#![forbid(unsafe_code)]

use crate::error::Result;
use crate::memory::cuda::CudaDevice;

pub(crate) use crate::sys::registered_file::RegisteredFile;

/// Whether `device` can read host memory registered read-only
/// (`CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED`).
pub(crate) fn reads_read_only_host_memory(device: &CudaDevice) -> Result<bool> {
    crate::sys::cuda::read_only_host_register_supported(device.ordinal())
}
