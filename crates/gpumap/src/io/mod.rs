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
