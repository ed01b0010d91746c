//! How one file is mapped: [`MapOptions`] (writable, the handle's I/O settings, advice,
//! read-ahead, the zero-copy tier). The cache it is mapped in has its own options
//! ([`CacheOptions`](super::CacheOptions)).
#![forbid(unsafe_code)]

use crate::io::HandleOptions;

/// How far a walk reads ahead by default ([`MapOptions::read_ahead`]): deep enough to keep the
/// pool busy between windows (docs/decisions/0002-read-ahead-in-pieces.md).
pub const DEFAULT_READ_AHEAD: u64 = 512 << 20;

/// How a file will be accessed, as `madvise` advice tells the kernel about an `mmap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Advice {
    /// No expectation: single-extent views are served from slots, wider ones from frames; a
    /// view starting where the last one ended starts read-ahead.
    #[default]
    Normal,
    /// Windows one after another: every view reads the next window ahead while the caller
    /// uses this one.
    Sequential,
    /// Scattered small reads: no read-ahead.
    Random,
    /// The range will be needed soon: read it in the background now.
    WillNeed,
    /// The range is not needed: write back what is dirty and give up its memory.
    DontNeed,
}

/// Whether a read-only map's gathers go through the zero-copy tier
/// ([`ZeroCopyFile`](super::ZeroCopyFile)): rows read by the GPU in place from the host's page
/// cache, with no cache memory, no faults and no evictions. Opening reads and pins the whole
/// file in host memory, within a limit across the process; a writable map refuses it.
///
/// [`Misses`](Self::Misses) keeps the cache in front of the tier for row gathers
/// ([`DeviceMappedFile::gather_rows`](super::DeviceMappedFile::gather_rows)): the rows resident
/// in the cache come from device memory, the others are read in place by the same kernel launch,
/// and their extents are made resident in the background, so that the rows gathered most end up
/// in device memory (docs/decisions/0013-misses-in-place.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ZeroCopy {
    /// Gathers go through the cache.
    #[default]
    Off,
    /// The zero-copy tier, within the default limit of pinned memory (half of physical
    /// memory, across every zero-copy file of the process).
    On,
    /// The zero-copy tier, within this many pinned bytes across the process.
    Within(u64),
    /// The cache in front of the zero-copy tier (within the default limit of pinned memory):
    /// row gathers read their misses in place. Views, reads and byte-range gathers read in
    /// place, as with [`On`](Self::On).
    Misses,
    /// [`Misses`](Self::Misses), within this many pinned bytes across the process.
    MissesWithin(u64),
}

/// Options of one mapped file (builder, like `memmap2::MmapOptions`): read-only unless
/// [`writable`](Self::writable), the process's I/O settings, [`Advice::Normal`], read-ahead of
/// [`DEFAULT_READ_AHEAD`], no zero-copy tier.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct MapOptions {
    writable: bool,
    handle: Option<HandleOptions>,
    advice: Advice,
    zero_copy: ZeroCopy,
    read_ahead: Option<u64>,
}

impl MapOptions {
    /// The defaults (see the type).
    pub fn new() -> MapOptions {
        MapOptions::default()
    }

    /// Allows writes through [`DeviceMappedFile::view_mut`](super::DeviceMappedFile::view_mut)
    /// (the file is opened read-write).
    pub fn writable(&mut self, yes: bool) -> &mut Self {
        self.writable = yes;
        self
    }

    /// Options of the file handle faults and write-backs go through (threads, compat mode,
    /// O_DIRECT); default: the process defaults, with write-back through the page cache.
    pub fn handle_options(&mut self, options: HandleOptions) -> &mut Self {
        self.handle = Some(options);
        self
    }

    /// How the file will be accessed (see [`Advice`]; `WillNeed`/`DontNeed` act on ranges and
    /// are for [`DeviceMappedFile::advise`](super::DeviceMappedFile::advise)).
    pub fn advice(&mut self, advice: Advice) -> &mut Self {
        self.advice = advice;
        self
    }

    /// How far ahead of a walk to read, in bytes (default [`DEFAULT_READ_AHEAD`]; 0 turns
    /// read-ahead off): a view that continues a walk (or any wide view of a `Sequential` file)
    /// starts reading the next windows of its size on the pool, from 2 up to 16 of them, as
    /// far as the budget holds them beside the current one, in pieces of 16 MiB (at most a
    /// window) that pool threads each read whole. Each piece in flight holds its frames of the
    /// budget.
    pub fn read_ahead(&mut self, bytes: u64) -> &mut Self {
        self.read_ahead = Some(bytes);
        self
    }

    /// Whether this read-only file's gathers go through the zero-copy tier (see [`ZeroCopy`]).
    /// Its views are then the registered file itself (`View::device` points into it: kernels
    /// read the page cache over the bus; nothing is pinned in the cache), and `read` reads with
    /// `pread`.
    pub fn zero_copy(&mut self, mode: ZeroCopy) -> &mut Self {
        self.zero_copy = mode;
        self
    }

    pub(crate) fn is_writable(&self) -> bool {
        self.writable
    }

    pub(crate) fn handle(&self) -> Option<&HandleOptions> {
        self.handle.as_ref()
    }

    pub(crate) fn access_advice(&self) -> Advice {
        self.advice
    }

    pub(crate) fn zero_copy_mode(&self) -> ZeroCopy {
        self.zero_copy
    }

    pub(crate) fn read_ahead_bytes(&self) -> u64 {
        self.read_ahead.unwrap_or(DEFAULT_READ_AHEAD)
    }
}
