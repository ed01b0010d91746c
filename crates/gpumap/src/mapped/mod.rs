//! The GPU page cache: files mapped into device memory with mmap semantics, under a budget
//! shared by many files.
//!
//! - [`DeviceCache`]: one memory budget on one GPU (or host memory standing in), shared by the
//!   files opened in it, least recently used memory evicted first across files; built from
//!   [`CacheOptions`].
//! - [`DeviceMappedFile`]: a file's face on a cache — one contiguous device address range
//!   (`base() + offset`), [views](View) that fault in what they lack and pin it, writable
//!   views ([`ViewMut`]) written back by [`flush`](DeviceMappedFile::flush), gathers of many
//!   ranges into one buffer, prefetch and advice; opened with [`MapOptions`].
//!   [`DeviceMappedFile::open`] maps a file in a cache of its own.
//! - [`ZeroCopyFile`]: a warm read-only file the GPU reads in place from the host's page cache.
//!
//! # Residency at two granularities
//!
//! Device memory comes from the driver in frames of at least 2 MiB (CUDA virtual memory
//! management; the driver serialises the calls). Frames mapped at their place in a file's
//! address range make any view of the file one contiguous piece of memory — right for
//! sequential and clustered access. For random access to a file far larger than the budget they
//! are the wrong unit: a 4 KiB read would cost 2 MiB or more. So frames can also be cut into
//! *slots* of one extent, holding extents of any file wherever they fall: a 1 GiB budget holds
//! 262,144 random 4 KiB extents. Single-extent views and gathers use slots; wider views, writes
//! and sequential walks use file frames. Both come out of one budget.
//!
//! # Shards
//!
//! The books are split into independent *shards* ([`CacheOptions::shards`]), each with its own
//! lock and LRU list, all drawing on one budget; frame *i* of a file and everything in it
//! belong to one shard, consecutive frames to consecutive shards. Eviction is then
//! least-recently-used within each shard, and a shard with nothing left to evict takes what
//! another holds idle (docs/decisions/0003-books-in-shards.md).
//!
//! # Layout
//!
//! The engine (`engine`: state, books, faults, gathers, eviction, write-back) knows nothing of
//! the public types; the faces are `cache` ([`DeviceCache`]), `file` ([`DeviceMappedFile`],
//! [`MapRange`]), `view` ([`View`], [`ViewMut`]), `handle` (an open file: opening, closing,
//! gathers), the options (`cache_options`, `map_options`, checked by `sizing`), `stats`,
//! `read_ahead` (what a walk reads ahead: pure) and `zero_copy` ([`ZeroCopyFile`]).
#![forbid(unsafe_code)]

mod cache;
mod cache_options;
mod engine;
mod file;
mod handle;
mod lookups;
mod map_options;
mod read_ahead;
mod row_indices;
mod sizing;
mod stats;
mod view;
mod zero_copy;

pub use cache::DeviceCache;
pub use cache_options::CacheOptions;
pub use file::{DeviceMappedFile, MapRange};
pub use lookups::LookupScope;
pub use map_options::{Advice, MapOptions, ZeroCopy, DEFAULT_READ_AHEAD};
pub use row_indices::{IndexWidth, RowIndices};
pub use stats::{CacheStats, FileStats};
pub use view::{View, ViewMut};
pub use zero_copy::{ZeroCopyFile, ZeroCopyOptions};
