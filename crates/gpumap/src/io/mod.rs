//! Explicit file I/O: [`FileHandle`] and its options, the thread pool, compat-mode decisions,
//! cuFile, and scratch files.
//!
//! # Layout
//!
//! [`FileHandle`]'s methods (in `file_handle`, beside [`HandleOptions`]) are thin calls into
//! the modules that do the work, as functions over the state a handle's clones share
//! (`handle_state`: descriptors, settings, pool, compat decision):
//!
//! - `host_io`: file <-> host memory, in parallel tasks or on the calling thread;
//! - `direct`: when a transfer goes around the page cache (`O_DIRECT`, the `uncached` policy);
//! - `device_io`: file <-> device memory, one region at a time (cuFile, or the pipelined
//!   bounce path);
//! - `batch`: many small reads in one call ([`DeviceRead`], [`BatchPiece`]);
//! - `multi_file`: reads from many files in one pipeline ([`read_files`], [`pread_files`]:
//!   a checkpoint's shards);
//! - `small_reads` and `small_read_queue`: `pread_device` futures, the small ones coalesced;
//!   `lone_reads` and `lone_buffer`: a lone small read the page cache holds, read as it is
//!   submitted;
//! - `stream`: transfers ordered on a CUDA stream ([`StreamTransfer`]);
//! - `flags`: [`OpenFlags`], the `fopen` flags parsed;
//! - `thread_descriptors`: a descriptor of its own for each pool thread's small reads.
//!
//! Beside them: [`pool`] ([`IoPool`], [`IoFuture`]), [`compat`] (cuFile or POSIX, and why),
//! [`descriptor`] (descriptors handed over by number: duplicated, their open flags read),
//! `gds_probe` (whether cuFile can be used here, and why not; reported by
//! `Capabilities`), [`gds`] (cuFile's safe layer) and [`scratch`]
//! ([`ScratchFile`]).
#![forbid(unsafe_code)]

mod batch;
pub mod compat;
pub mod descriptor;
mod device_io;
mod direct;
pub mod file_handle;
mod flags;
pub mod gds;
pub(crate) mod gds_probe;
mod handle_state;
mod host_io;
mod lone_buffer;
mod lone_reads;
mod multi_file;
pub mod pool;
pub mod scratch;
mod small_read_queue;
mod small_reads;
mod stream;
mod thread_descriptors;
mod writes_in_flight;

pub use batch::{BatchPiece, DeviceRead};
pub use compat::{CompatDecision, IoPath};
pub use file_handle::{FileHandle, HandleOptions, OpenFlags};
pub use handle_state::check_regular_file;
pub use multi_file::{pread_files, read_files, FilePiece, FileRead, SMALL_READ};
pub use pool::{Cancel, IoFuture, IoPool};
pub use scratch::ScratchFile;
pub use stream::StreamTransfer;
pub use writes_in_flight::wait_for_all_writes;

/// Bytes this process may still write to the file system holding `path` (a file or a
/// directory): `statvfs(2)`'s blocks available to unprivileged users times the block size. For
/// checking that a write fits before it starts.
#[doc(alias = "statvfs")]
pub fn available_space(path: &std::path::Path) -> crate::error::Result<u64> {
    crate::sys::posix::available_bytes(path)
}

/// Makes a write past the file size limit (`ulimit -f`) fail with `EFBIG`, reported with its
/// file and offset like any failed write, instead of `SIGXFSZ` killing the process (no report,
/// scratch files left behind). For programs (the `gpumap` command) that own their signals; a
/// handler already installed is kept. Returns whether the disposition was changed.
pub fn file_size_limit_as_error() -> std::io::Result<bool> {
    crate::sys::signals::file_size_limit_as_error()
}
