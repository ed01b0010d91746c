//! Explicit file I/O: the thread pool, compat-mode decisions, and [`FileHandle`].
#![forbid(unsafe_code)]

pub mod compat;
mod device_io;
pub use device_io::{BatchPiece, DeviceRead, StreamTransfer};
pub mod file_handle;
pub mod gds;
pub mod pool;
pub mod scratch;

pub use compat::{CompatDecision, IoPath};
pub use file_handle::{FileHandle, HandleOptions, OpenFlags};
pub use pool::{IoFuture, IoPool};
pub use scratch::ScratchFile;

/// Bytes this process may still write to the file system holding `path` (a file or a
/// directory): `statvfs(2)`'s blocks available to unprivileged users times the block size. For
/// checking that a write fits before it starts.
#[doc(alias = "statvfs")]
pub fn available_space(path: &std::path::Path) -> crate::Result<u64> {
    crate::sys::posix::available_bytes(path)
}
