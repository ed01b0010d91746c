//! gpumap's row kernels on a device (`kernels/rows.cu`), loaded once per device, and the types
//! their launches take. The launches themselves are `sys`'s; this is where the rest of the
//! crate finds them.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use crate::sync::Mutex;

use crate::error::Result;
use crate::memory::cuda::CudaDevice;

pub(crate) use crate::sys::cuda::{RawEvent, RowJob, RowKernels, StreamHandle, TableParams};

/// The row kernels of `device`, loaded into its primary context on first use; the reason they
/// cannot be loaded is an error each time it is asked.
pub(crate) fn row_kernels(device: &CudaDevice) -> Result<Arc<RowKernels>> {
    static LOADED: OnceLock<Mutex<HashMap<usize, Arc<RowKernels>>>> = OnceLock::new();
    let mut loaded = LOADED.get_or_init(|| Mutex::new(HashMap::new())).lock();
    if let Some(k) = loaded.get(&device.ordinal()) {
        return Ok(Arc::clone(k));
    }
    device.bind_to_thread()?;
    let kernels = Arc::new(RowKernels::load(device.ordinal())?);
    loaded.insert(device.ordinal(), Arc::clone(&kernels));
    Ok(kernels)
}
