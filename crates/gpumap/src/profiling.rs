//! NVTX ranges around gpumap's transfers, for profilers.
//!
//! With `GPUMAP_NVTX=1`, or when a profiler that reads NVTX is attached (it names its injection
//! library in `NVTX_INJECTION64_PATH`, as Nsight Systems does), gpumap marks its work on each
//! thread's timeline: `gpumap::read_device`, `gpumap::write_device`, `gpumap::read_device_batch`,
//! `gpumap::cache::gather`, `gpumap::cache::fault`, `gpumap::cache::write_back` and
//! `gpumap::zero_copy::gather`. The NVTX library comes with the CUDA toolkit
//! (`libnvtx3interop.so.1` in CUDA 13, `libnvToolsExt.so.1` before) and is loaded only then;
//! otherwise a range costs one atomic load.
#![forbid(unsafe_code)]

use std::ffi::CStr;
use std::marker::PhantomData;

use crate::sys::nvtx;

/// Whether gpumap emits NVTX ranges in this process: `Ok(false)` when they were not asked for,
/// `Err` with the reason when they were and the NVTX library could not be loaded.
pub fn nvtx_status() -> Result<bool, String> {
    nvtx::status()
}

/// A range open on this thread until dropped (NVTX ranges are per thread: not `Send`).
pub(crate) struct Range {
    open: bool,
    _thread: PhantomData<*const ()>,
}

impl Range {
    /// Opens `name` where ranges are on.
    pub(crate) fn new(name: &'static CStr) -> Range {
        Range { open: nvtx::push(name), _thread: PhantomData }
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        if self.open {
            nvtx::pop();
        }
    }
}
