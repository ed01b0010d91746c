//! [`CacheOptions`]: the sizes of a [`DeviceCache`] — budget, extent, frame, shards — where its
//! memory is, and how long requests wait for pinned memory.
#![forbid(unsafe_code)]

use std::time::Duration;

use super::cache::DeviceCache;
use super::sizing::{default_frame, Requested, HOST_GRANULARITY};
use crate::error::Result;
use crate::memory::Device;

/// Options of a [`DeviceCache`] (builder, like `memmap2::MmapOptions`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CacheOptions {
    requested: Requested,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions { requested: Requested::new() }
    }
}

impl CacheOptions {
    /// 1 GiB budget, 64 KiB extents, frames by budget (32 MiB for 1 GiB), GPU 0 where there is
    /// one.
    pub fn new() -> CacheOptions {
        CacheOptions::default()
    }

    /// The options of a cache for one file of `len` bytes (what
    /// [`DeviceMappedFile::open`](super::DeviceMappedFile::open) builds): a budget of the whole
    /// file up to 4 GiB, in whole frames of the default size for it or of the size
    /// [`frame_size`](Self::frame_size) gives; the rest as [`new`](Self::new). Below the 4 GiB
    /// cap such a cache holds its file whole, so single-extent views are read into their
    /// frames, not slots (see [`DeviceMappedFile::view`](super::DeviceMappedFile::view)).
    pub fn for_file(len: u64) -> CacheOptions {
        CacheOptions { requested: Requested::for_file(len) }
    }

    /// The most memory the cache holds, in bytes: rounded down to whole frames; less than one
    /// frame, or more than the device has, is an error.
    pub fn budget(&mut self, bytes: u64) -> &mut Self {
        self.requested.budget = bytes;
        self.requested.file_len = None;
        self
    }

    /// The unit of validity, I/O and random-access residency: a power of two from 4 KiB up to
    /// the frame size. A slot of memory holds one extent, so random reads of small records
    /// want small extents (4 KiB); clustered reads want larger ones.
    pub fn extent_size(&mut self, bytes: u64) -> &mut Self {
        self.requested.extent = bytes;
        self
    }

    /// The unit in which memory is mapped, evicted and counted against the budget: a multiple
    /// of the GPU's allocation granularity (2 MiB) up to 1 GiB; default a thirty-second of the
    /// budget as a power of two, from 8 MiB to 64 MiB (8 MiB up to a 256 MiB budget, 32 MiB for
    /// 1 GiB). Larger frames mean fewer driver calls per byte (mapping, setting access and
    /// unmapping cost the same for any frame size), and coarser eviction of file ranges: a view
    /// of a few bytes past the slots' single extents holds a whole frame.
    pub fn frame_size(&mut self, bytes: u64) -> &mut Self {
        self.requested.frame = Some(bytes);
        self
    }

    /// The frame size a cache of `budget` bytes gets when none is set, on a device whose
    /// allocation granularity is 2 MiB (every current NVIDIA GPU, and the host backend): a
    /// thirty-second of the budget as a power of two, from 8 MiB to 64 MiB.
    pub fn default_frame_size(budget: u64) -> u64 {
        default_frame(budget, HOST_GRANULARITY)
    }

    /// Where the memory is (default: [`Device::auto`]).
    pub fn memory(&mut self, memory: Device) -> &mut Self {
        self.requested.memory = Some(memory);
        self
    }

    /// How long a request that fits the budget waits for other views to unpin memory before
    /// it fails with [`Error::OutOfBudget`](crate::Error::OutOfBudget) (default 2 s; zero:
    /// fail at once). Reads and gathers of other threads never make a request fail: they end
    /// by themselves, so it waits for them.
    pub fn pin_wait(&mut self, wait: Duration) -> &mut Self {
        self.requested.pin_wait = wait;
        self
    }

    /// How many independent parts (each with its own lock and LRU list, all drawing on the one
    /// budget) the cache's books are split into: a power of two dividing the budget's frames,
    /// with at least two frames each. Frame `i` of a file belongs to part `(i + f) mod shards`
    /// for a per-file `f`, so consecutive frames (a walk, a wide view) spread over all parts,
    /// and so do random rows. Default: one part while the budget is under 8 frames (exact LRU
    /// across the whole cache), else as many as fit the rule, up to 16: one lock is the limit
    /// of gathers from many threads (docs/decisions/0003-books-in-shards.md). Eviction is then
    /// least-recently-used within each part, as Linux's is within each memory node; a part
    /// with nothing left to evict takes what another holds idle.
    pub fn shards(&mut self, shards: usize) -> &mut Self {
        self.requested.shards = Some(shards);
        self
    }

    /// Builds the cache: every size checked against the others and the device.
    pub fn build(&self) -> Result<DeviceCache> {
        DeviceCache::from_config(&self.requested.resolve()?)
    }
}
