//! The CUDA backend: devices, device allocations and regions, pinned host memory, streams and
//! the double-buffering copy primitive ([`Stream::upload`] / [`Stream::download`]).
//!
//! Everything here is safe Rust over `crate::sys::cuda`. On a machine without CUDA every
//! constructor returns [`Error::Unavailable`](crate::error::Error::Unavailable) with the
//! probe's reason and [`classify_pointer`] answers [`PointerKind::PageableHost`].
//!
//! One file per concept, every public item re-exported here: `device` ([`CudaDevice`]),
//! `buffer` ([`CudaBuffer`]), `region` (the crate's internal address range and bounds checks),
//! `view` ([`CudaView`], [`CudaViewMut`]), `pointer` ([`classify_pointer`], [`PointerKind`], [`device_ordinal_of`]),
//! `pinned` ([`PinnedBuffer`]), `stream` ([`Stream`], [`InFlight`], [`StagingBuffer`]), `vmm`
//! (reserved address ranges and the physical frames mapped into them) and `batch_copy` (many
//! small copies in one kernel launch).
// Each module below forbids `unsafe` but view.rs, which holds the `from_raw` constructors.
#![deny(unsafe_code)]

mod batch_copy;
mod buffer;
mod device;
mod pinned;
mod pointer;
mod region;
mod stream;
mod view;
mod vmm;

pub use buffer::CudaBuffer;
pub use device::CudaDevice;
pub use pinned::PinnedBuffer;
pub use pointer::{classify_pointer, device_ordinal_of, PointerKind};
pub use stream::{InFlight, StagingBuffer, Stream};
pub use view::{CudaView, CudaViewMut};

pub(crate) use crate::sys::cuda::CopyDirection;
pub(crate) use batch_copy::{BatchCopier, DeviceCopy};
pub(crate) use pointer::validate_device_range;
pub(crate) use region::{resolve_range, RawRegion};
pub(crate) use vmm::{PhysFrame, VaRange};
