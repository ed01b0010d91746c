//! Where bytes live: host memory, device memory, pinned bounce buffers.
#![forbid(unsafe_code)]

pub mod bounce;
pub mod cuda;
pub mod host;

pub use host::HostBuffer;
