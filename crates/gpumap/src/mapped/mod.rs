//! The GPU page cache: files mapped into device memory with mmap semantics, under a budget
//! shared by many files.
//!
//! - [`DeviceCache`]: one memory budget on one GPU (or host memory standing in), shared by the
//!   files opened in it, least recently used memory evicted first across files.
//! - [`DeviceMappedFile`]: a file's face on a cache — one contiguous device address range
//!   (`base() + offset`), [views](View) that fault in what they lack and pin it, writable
//!   views ([`ViewMut`]) written back by [`flush`](DeviceMappedFile::flush), gathers of many
//!   ranges into one buffer, prefetch and advice. [`DeviceMappedFile::open`] is a cache of one
//!   file.
//!
//! # Residency at two granularities
//!
//! Device memory comes from the driver in frames of at least 2 MiB (CUDA virtual memory
//! management; mapping one costs about 35 µs and the driver serialises the calls). Frames
//! mapped at their place in a file's address range make any view of the file one contiguous
//! piece of memory — right for sequential and clustered access. For random access to a file
//! far larger than the budget they are the wrong unit: a 4 KiB read would cost 2 MiB or more,
//! and a 1 GiB budget would hold 512 useful extents. So frames can also be cut into *slots* of
//! one extent, holding extents of any file wherever they fall: a 1 GiB budget holds 262,144
//! random 4 KiB extents. Single-extent views and gathers use slots; wider views, writes and
//! sequential walks use file frames. Both come out of one budget.
//!
//! # Shards
//!
//! The books are split into independent *shards* ([`CacheOptions::shards`]), each with its own
//! lock and LRU list, all drawing on one budget; frame *i* of a file and everything in it belong to
//! one shard, consecutive frames to consecutive shards. One lock measured as the limit of 16
//! threads (H100: 2.2 M gathered 4 KiB rows/s, 0.22 M single views/s); in four shards the same
//! threads gathered 4.0–4.2 M rows/s and took 0.59–0.60 M single views/s. Eviction is then
//! least-recently-used within each shard, and a shard with nothing left to evict takes what
//! another holds idle.
//!
//! # Layout
//!
//! `cache` (the cache, its shards and its stats), `books` (a shard's residency books: states,
//! pins, LRU, no I/O), `geometry` (extent and frame arithmetic), `store` (GPU or host memory:
//! mapping and moving bytes), `faults` (views, gathers and prefetches bringing extents in),
//! `writeback` (dirty extents out, sticky errors), `view` (files, views, advice), `zero_copy`
//! (warm read-only files read by the GPU in place from the page cache, with no device memory:
//! [`ZeroCopyFile`]).
#![forbid(unsafe_code)]

mod books;
mod cache;
mod faults;
mod geometry;
mod store;
mod view;
mod writeback;
mod zero_copy;

pub use cache::{CacheOptions, CacheStats, DeviceCache, FileStats};
pub use view::{Advice, DeviceMappedFile, MapOptions, MapRange, View, ViewMut, DEFAULT_READ_AHEAD};
pub use zero_copy::{ZeroCopyFile, ZeroCopyOptions};
