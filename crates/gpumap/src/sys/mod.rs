//! The raw and result layers: every `unsafe` block of the crate lives below this module, each
//! with a `// SAFETY:` comment. Functions here map one-to-one onto a system or library call and
//! turn its status into [`crate::Error`]; everything above is safe Rust.

pub mod cuda;
pub mod cufile;
mod dynlib;
pub(crate) mod host_memory;
pub(crate) mod nvtx;
pub mod pagecache;
pub mod posix;
pub(crate) mod registered_file;
pub mod signals;
