//! The host page cache as a tool: see it, fill it, empty it, pin it.
//!
//! Before a benchmark, or before loading a data set onto GPUs, it matters whether a file's
//! bytes are already in the host's page cache: a cached file is copied at memory speed, a cold
//! one at the disk's speed, which is far slower (figures in docs/pagecache.md). This module
//! answers "how much of this file is cached" and changes the answer, like util-linux
//! `fincore`, `vmtouch` and `pcstat`, and like KvikIO's `get_page_cache_info` /
//! `drop_file_page_cache` / `drop_system_page_cache`.
//!
//! # Concepts
//!
//! * **Pages.** The cache holds files in base pages of [`page_size`] bytes (4 KiB on x86_64,
//!   4, 16 or 64 KiB on aarch64). A byte range is reported for the pages that cover it, so
//!   a 1-byte file has one page and a fully cached 1-byte file reports 4096 resident bytes,
//!   as `fincore` does.
//! * **Two ways to ask.** `mincore(2)` needs the range mapped (we map it in windows of at most
//!   1 GiB, 128 MiB on 32-bit targets, so files larger than the address space work) and
//!   returns one byte per page: that is the per-page [`ResidencyMap`]. `cachestat(2)` (Linux
//!   6.5+, June 2023) needs no mapping and also counts dirty, under-writeback, evicted and
//!   recently evicted pages. [`residency`] uses `cachestat` where the kernel has it and falls
//!   back to `mincore` on `ENOSYS` (older kernels, or seccomp profiles that do not know it);
//!   [`Method`] records which one answered.
//! * **Warm** ([`warm`]): `POSIX_FADV_WILLNEED` starts asynchronous readahead and returns
//!   once the reads are queued; [`WarmMode::Read`] reads the range and returns when it is
//!   cached.
//! * **Evict** ([`evict`]): `fdatasync` where the range may hold dirty pages, then
//!   `POSIX_FADV_DONTNEED`. `cachestat` says when nothing is dirty; skipping the sync then
//!   makes evicting a tree of small files several times faster. This is best effort: the
//!   kernel keeps pages that are mapped by a process, locked, or dirtied again meanwhile, so
//!   [`EvictReport`] says what is still resident afterwards.
//! * **Drop everything** ([`drop_system`]): `sync`, then write `1` (page cache) or `3` (also
//!   dentries and inodes) to `/proc/sys/vm/drop_caches`. Needs `CAP_SYS_ADMIN` and a writable
//!   `/proc/sys` (containers usually mount it read-only).
//! * **Lock** ([`lock`]): map the range and `mlock` it, so it stays resident until the
//!   [`LockedRange`] is dropped. Limited by `RLIMIT_MEMLOCK` (often 8 MiB) without
//!   `CAP_IPC_LOCK`, and by the memory available: both are checked before anything is locked.
//!
//! # Traps
//!
//! * **`mincore` lies about files you may not write.** Since Linux 5.2 (the fix for the page
//!   cache side channel CVE-2019-5489) the kernel reports real residency only for files the
//!   caller owns, could open for writing, or has `CAP_FOWNER` over; for every other file it
//!   claims **every page is resident**. Kernels from 2025 on apply the same rule to
//!   `cachestat`, which then fails with `EPERM`. This module checks the same conditions
//!   before trusting `mincore` and reports [`Residency::cached_pages`] as `None` ("unknown",
//!   with [`Residency::unknown_reason`]) instead of a false 100%.
//! * **Zero-length files and empty ranges** have zero pages; nothing is mapped (`mmap` of zero
//!   bytes fails) and the answer is 0 of 0.
//! * **Sparse files**: holes are not cached until read; reading a hole caches zero-filled
//!   pages, so a sparse file can have more resident bytes than allocated blocks.
//! * **Ranges** must lie inside the file: a range past the end is an
//!   [`Error::OutOfRange`], not a silent clamp.
//! * **Readahead**: reading part of a file caches more than was read: up to the device's
//!   readahead window (`/sys/class/bdi/*/read_ahead_kb`: 128 KiB by default, 8 MiB on some
//!   virtual disks).
//! * **`WILLNEED` is capped**: one `POSIX_FADV_WILLNEED` call reads at most the readahead
//!   window (or the device's maximum I/O size, if larger) and silently drops the rest, so a
//!   single call on a file larger than the window caches only its start. [`warm`] advises one
//!   window at a time.
//! * **In-flight reads**: `cachestat` counts a page as soon as its read is queued, `mincore`
//!   only once the data has arrived; just after an asynchronous warm the two can differ.
//!
//! # Layout
//!
//! `range` ([`ByteRange`], rounded out to pages), `target` ([`Target`], opened for a call),
//! `residency` ([`residency`], [`residency_with`], [`Residency`], and when
//! `mincore` can be trusted), `map` ([`residency_map`], [`ResidencyMap`]), `warm`, `evict`
//! ([`EvictReport`]), `lock` ([`LockedRange`]), `drop_system`, and `proc` (what `/proc` says
//! about this process and machine). The system calls are in the private `sys::pagecache`.
//!
//! [`residency`]: residency()
//! [`warm`]: warm()
//! [`evict`]: evict()
//! [`drop_system`]: drop_system()
//! [`lock`]: lock()
//! [`Error::OutOfRange`]: crate::error::Error::OutOfRange
#![forbid(unsafe_code)]

mod drop_system;
mod evict;
mod lock;
mod map;
mod proc;
mod range;
mod residency;
mod target;
mod warm;

pub use drop_system::drop_system;
pub use evict::{evict, EvictReport};
pub use lock::{lock, LockedRange};
pub use map::{residency_map, ResidencyMap, ResidentRun};
pub use range::ByteRange;
pub use residency::{residency, residency_with, Method, MethodChoice, Residency};
pub use target::Target;
pub use warm::{warm, WarmMode};

/// The size of a base page, the unit every count in this module is in.
pub fn page_size() -> u64 {
    crate::sys::pagecache::page_size()
}
