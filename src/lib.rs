//! gpumap: file data into and out of GPU memory, as fast as the hardware allows.
//!
//! (The concept essay is written in `docs` below; see the README for the quick start.)
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod align;
pub mod bench;
pub mod capabilities;
pub mod config;
pub mod error;
pub mod io;
pub mod memory;
pub mod pagecache;
mod sys;

pub use capabilities::Capabilities;
pub use config::Config;
pub use error::{Error, Result};
