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
//!
//! Split by concept: `driver` (loading and status codes), `device` (devices and contexts),
//! `memory` (allocations, pinned and registered host memory, pointer queries), `stream`
//! (streams, events, queued copies), `vmm` (reserved ranges and physical frames), `kernels`
//! (gpumap's PTX kernels).

mod device;
mod driver;
mod kernels;
mod memory;
mod stream;
mod vmm;

pub(crate) use device::*;
pub(crate) use driver::{
    driver, error_name, MEMORYTYPE_DEVICE, MEMORYTYPE_HOST, MEMORYTYPE_UNIFIED,
};
pub(crate) use kernels::*;
pub(crate) use memory::*;
pub(crate) use stream::*;
pub(crate) use vmm::*;
