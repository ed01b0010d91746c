//! A file's face on a cache: [`DeviceMappedFile`], its options, its views, its advice.
#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Arc;

use super::cache::{file_stats_all, CacheOptions, DeviceCache, FileEntry, FileStats};
use super::faults::{GatherRange, PinFor, Pins};
use super::store::Home;
use super::writeback::{self, write_back};
use crate::error::{Error, Result};
use crate::io::{HandleOptions, IoFuture};
use crate::memory::cuda::{CudaView, CudaViewMut, RawRegion};
use crate::memory::{Device, DeviceViewMut, OwnedDeviceMemory};

/// How far a walk reads ahead by default ([`MapOptions::read_ahead`]). A window read alone
/// leaves much of the pool idle between its tasks; windows read ahead run several at once. On
/// the H100 (2026-11-22): reading two windows ahead, once the current one was in, the pool's
/// threads sat idle 60 % of a walk and the bench's walk ran at 20.6–28.2 GB/s (runs 12–15);
/// 256 MiB ahead, from the moment a window is asked for, 32.8 GB/s (run 16); 512 MiB ahead in
/// 16 MiB pieces, 94–98 % of FileHandle's whole-file read (768 MiB: 92–100 %, within the
/// spread).
pub const DEFAULT_READ_AHEAD: u64 = 512 << 20;

/// The most windows (views' lengths) one view reads ahead.
const MAX_WINDOWS_AHEAD: u64 = 16;

/// Read-ahead is cut into pieces this long, each one job on the file's pool read as one task
/// by the thread that takes it (see `PinFor::ReadAhead`). Jobs are taken in file order, so
/// pieces come in in the order the walk wants them. H100, 2026-11-22, 4 GiB warm, 16 threads,
/// budget 1 GiB, 64 MiB windows, 512 MiB ahead, medians of seven passes against FileHandle's
/// whole-file read in the same process, two processes each: whole windows in 16 MiB tasks
/// 83.6 / 90.9 %; pieces of 16 MiB 93.8 / 98.4 %, of 32 MiB 94.8 / 95.9 %, of 64 MiB (too few
/// to keep 16 threads busy) 87.2 / 90.7 %; 32 MiB pieces in 16 MiB tasks 89.7 / 86.9 %.
const READ_AHEAD_PIECE: u64 = 16 << 20;

/// The most pieces one view starts (longer pieces beyond it), so that a view of a huge walk
/// queues a bounded number of pool jobs.
const MAX_PIECES_AHEAD: u64 = 64;

/// How a file will be accessed, as `madvise` advice tells the kernel about an `mmap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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

/// Options of a mapped file (builder, like `memmap2::MmapOptions`). The budget, extent, frame
/// and memory settings create the file's own cache in [`MapOptions::open`]; a file opened in a
/// shared [`DeviceCache`] uses the cache's.
#[derive(Debug, Clone, Default)]
pub struct MapOptions {
    pub(crate) writable: bool,
    pub(crate) handle: Option<HandleOptions>,
    pub(crate) advice: Advice,
    /// Gathers and views go through the zero-copy tier, within this pinned limit (`None`: the
    /// default).
    pub(crate) zero_copy: Option<Option<u64>>,
    /// Bytes a walk reads ahead (`None`: [`DEFAULT_READ_AHEAD`]).
    pub(crate) read_ahead: Option<u64>,
    cache: CacheOptions,
    budget: Option<u64>,
}

impl MapOptions {
    /// Read-only, a budget of the whole file up to 4 GiB, frames by budget (see
    /// [`CacheOptions::frame_size`]), 64 KiB extents, GPU 0 where there is one.
    pub fn new() -> MapOptions {
        MapOptions::default()
    }

    /// Allows writes through [`DeviceMappedFile::view_mut`] (the file is opened read-write).
    pub fn writable(&mut self, yes: bool) -> &mut Self {
        self.writable = yes;
        self
    }

    /// The most memory the file's own cache may use (see [`CacheOptions::budget`]).
    pub fn budget(&mut self, bytes: u64) -> &mut Self {
        self.budget = Some(bytes);
        self
    }

    /// See [`CacheOptions::extent_size`].
    pub fn extent_size(&mut self, bytes: u64) -> &mut Self {
        self.cache.extent_size(bytes);
        self
    }

    /// See [`CacheOptions::frame_size`].
    pub fn frame_size(&mut self, bytes: u64) -> &mut Self {
        self.cache.frame_size(bytes);
        self
    }

    /// Where the bytes live (default: [`Device::auto`]).
    pub fn memory(&mut self, memory: Device) -> &mut Self {
        self.cache.memory(memory);
        self
    }

    /// See [`CacheOptions::pin_wait`].
    pub fn pin_wait(&mut self, wait: std::time::Duration) -> &mut Self {
        self.cache.pin_wait(wait);
        self
    }

    /// Options of the file handle faults and write-backs go through (threads, compat mode,
    /// O_DIRECT); default: the process defaults.
    pub fn handle_options(&mut self, options: HandleOptions) -> &mut Self {
        self.handle = Some(options);
        self
    }

    /// How the file will be accessed (see [`Advice`]; `WillNeed`/`DontNeed` act on ranges and
    /// are for [`DeviceMappedFile::advise`]).
    pub fn advice(&mut self, advice: Advice) -> &mut Self {
        self.advice = advice;
        self
    }

    /// How far ahead of a walk to read, in bytes (default [`DEFAULT_READ_AHEAD`], 512 MiB; 0 turns
    /// read-ahead off): a view that continues a walk (or any wide view of a `Sequential` file)
    /// starts reading the next windows of its size on the pool, from 2 up to 16 of them, as
    /// far as the budget holds them beside the current one, in pieces of 16 MiB (at most a
    /// window) that pool threads each read whole. Deeper read-ahead keeps more of the pool busy
    /// at once; each piece in flight holds its frames of the budget.
    pub fn read_ahead(&mut self, bytes: u64) -> &mut Self {
        self.read_ahead = Some(bytes);
        self
    }

    /// Serves this read-only file's gathers ([`DeviceMappedFile::gather`], `gather_rows`, and
    /// [`DeviceCache::gather`] calls whose ranges are all of such files) from the zero-copy tier
    /// ([`ZeroCopyFile`](super::ZeroCopyFile)): rows are read by the GPU in place from the
    /// host's page cache, with no cache memory, no faults and no evictions: 6.2–6.6 M random
    /// 4 KiB rows/s against the cache's 1.5–1.8 M in the same H100 runs (docs/benchmarks.md).
    /// Opening reads and pins the whole file in host memory, within `max_pinned` bytes across
    /// the process (`None`: half of physical memory). Views are the registered file itself
    /// (`View::device` points into it: kernels read the page cache over the bus; nothing is
    /// pinned in the cache), and `read` reads with `pread`. A writable map refuses it.
    pub fn zero_copy(&mut self, max_pinned: Option<u64>) -> &mut Self {
        self.zero_copy = Some(max_pinned);
        self
    }

    /// Maps the file at `path` in a cache of its own (see [`DeviceMappedFile`]).
    pub fn open(&self, path: impl AsRef<Path>) -> Result<DeviceMappedFile> {
        let path = path.as_ref();
        let mut cache = self.cache.clone();
        let budget = match self.budget {
            Some(b) => b,
            None => {
                let len = std::fs::metadata(path)
                    .map_err(|e| Error::Io {
                        op: "stat",
                        path: Some(path.to_path_buf()),
                        offset: None,
                        source: e,
                    })?
                    .len();
                // Whole frames of the size this budget gets by default, so that the file fits.
                let len = len.clamp(1, 4 << 30);
                let frame = match self.cache.frame() {
                    Some(frame) => frame,
                    None => {
                        let frame = CacheOptions::default_frame_size(len);
                        cache.frame_size(frame);
                        frame
                    }
                };
                // (A zero frame is the build's error to report, with its value.)
                len.checked_next_multiple_of(frame.max(1)).unwrap_or(len)
            }
        };
        cache.budget(budget).build()?.open_with(path, self)
    }
}

struct MapInner {
    cache: DeviceCache,
    entry: Arc<FileEntry>,
}

impl Drop for MapInner {
    fn drop(&mut self) {
        // The last handle and the last view are gone: write back what is dirty (errors can only
        // be logged here; `close` returns them), then give the memory back.
        let shared = &self.cache.shared;
        if self.entry.writable {
            let all = 0..shared.geometry.extents(self.entry.len);
            if let Err(e) = write_back(shared, &self.entry, all) {
                tracing::warn!(
                    "flushing {} on drop failed: {}",
                    self.entry.path.display(),
                    crate::error::Report(&e)
                );
            }
        }
        for shard in shared.shards.iter() {
            let mut state = shard.state.lock();
            let frames = state.books.remove_file(self.entry.id);
            state.files.remove(&self.entry.id);
            // Unmapped before the lock goes, so that memory in use never exceeds the budget.
            for index in frames {
                if let Err(e) = shared.store.unmap_frame(&self.entry.memory, index) {
                    tracing::warn!("unmapping frame {index} of a closing file failed: {e}");
                }
            }
            drop(state);
            shard.changed.notify_all();
        }
        // Anything the books no longer named (none expected).
        shared.store.release_file(&self.entry.memory);
    }
}

/// A file mapped into device memory: mmap semantics on the GPU, in a [`DeviceCache`].
///
/// The file is one contiguous range of device addresses, `base() + offset`. Nothing is resident
/// at first; a [`View`] of a range faults in what is missing and pins it until dropped. Memory
/// comes from the cache's budget, shared by its files and evicted least recently used first,
/// after its dirty extents were written back. [`flush`](Self::flush) writes every dirty extent
/// back; [`sync`](Self::sync) also makes it durable.
///
/// Without a GPU (or with [`Device::Host`]) host memory stands in: the same books, faults and
/// write-backs; there is no device address range then, so [`View::device`] is `None` and data
/// moves with [`View::copy_to_host`] / [`ViewMut::copy_from_host`] (which work on both).
///
/// Semantics, as users of mmap expect them:
/// - A read-write map never changes the file's length. The partial last extent reads as the
///   file's bytes, then zeros.
/// - Bytes written through a live [`ViewMut`] count as dirty until a write-back that started
///   after the view was dropped has finished; a flush while it lives writes them but keeps them
///   dirty. Finish the work that writes through a view (synchronize its stream) before dropping
///   it.
/// - A failed write-back keeps its extents dirty, returns the error, and makes every later
///   flush return it until a [`sync`](Self::sync) writes every byte ([`Error::WriteBack`]).
/// - Dropping the last handle (and view) flushes, logging errors; [`close`](Self::close)
///   returns them.
/// - A file that shrank under the map: a fault past its new end is an error, never zeros, and
///   dirty bytes past it are not written back ([`Error::FileShrank`]).
/// - Memory never exceeds the budget; a view needing more than the budget, or more than views
///   leave unpinned, is [`Error::OutOfBudget`].
/// - Two threads faulting the same extent cause one read; views pin their memory, so eviction
///   never takes it from under a live view.
/// - A single-extent read view may be served from a slot (random-access residency); if the
///   extent is later written through a writable view, a read view taken before keeps the bytes
///   it had.
///
/// ```
/// use gpumap::mapped::MapOptions;
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("weights.bin");
/// # std::fs::write(&path, vec![7u8; 3 << 20])?;
/// let map = MapOptions::new().budget(64 << 20).open(&path)?;
/// let view = map.view(4096, 1 << 20)?;          // faults in what is missing, pins it
/// if let Some(device) = view.device() {           // GPU memory, for kernels
///     println!("{:#x}", device.ptr());
/// }
/// let mut first = [0u8; 16];
/// view.copy_to_host(0, &mut first)?;               // works on both backends
/// assert_eq!(first, [7u8; 16]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct DeviceMappedFile {
    inner: Arc<MapInner>,
}

impl std::fmt::Debug for DeviceMappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMappedFile")
            .field("path", &self.inner.entry.path)
            .field("len", &self.len())
            .field("writable", &self.inner.entry.writable)
            .field("memory", &self.memory())
            .finish()
    }
}

/// A range of a mapped file, for [`DeviceCache::gather`].
#[derive(Debug, Clone, Copy)]
pub struct MapRange<'a> {
    map: &'a DeviceMappedFile,
    offset: u64,
    len: u64,
}

impl DeviceMappedFile {
    pub(crate) fn new(cache: DeviceCache, entry: Arc<FileEntry>) -> Self {
        DeviceMappedFile { inner: Arc::new(MapInner { cache, entry }) }
    }

    /// Maps `path` read-only with the default [`MapOptions`] (a cache of its own).
    pub fn open(path: impl AsRef<Path>) -> Result<DeviceMappedFile> {
        MapOptions::new().open(path)
    }

    fn entry(&self) -> &FileEntry {
        &self.inner.entry
    }

    fn shared(&self) -> &super::cache::CacheShared {
        &self.inner.cache.shared
    }

    /// The cache the file is in.
    pub fn cache(&self) -> &DeviceCache {
        &self.inner.cache
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.entry().path
    }

    /// Bytes mapped: the file's length when it was mapped.
    pub fn len(&self) -> u64 {
        self.entry().len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether writes are allowed.
    pub fn is_writable(&self) -> bool {
        self.entry().writable
    }

    /// The device address of the file's first byte; the file's byte `o` is at `base() + o`
    /// while a view pins it (on a zero-copy map: always, in the registered page cache). `None`
    /// on the host backend.
    pub fn base(&self) -> Option<u64> {
        match &self.entry().zero_copy {
            Some(file) => file.device_ptr(),
            None => self.shared().store.base(&self.entry().memory),
        }
    }

    /// The cache's frame size.
    pub fn frame_size(&self) -> u64 {
        self.shared().geometry.frame
    }

    /// The cache's extent size.
    pub fn extent_size(&self) -> u64 {
        self.shared().geometry.extent
    }

    /// Where the bytes live: `"GPU 0 (NVIDIA H100 PCIe)"` or `"host memory"`.
    pub fn memory(&self) -> String {
        self.shared().store.describe()
    }

    /// What this file has done so far.
    pub fn stats(&self) -> FileStats {
        file_stats_all(self.shared(), self.entry().id)
    }

    /// `[offset, offset + len)` of this file, for [`DeviceCache::gather`].
    pub fn range(&self, offset: u64, len: u64) -> MapRange<'_> {
        MapRange { map: self, offset, len }
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        crate::align::check_range(offset, len, self.len())
    }

    /// A read-only view of `[offset, offset + len)`, resident and pinned until dropped.
    ///
    /// A range within one extent is served from wherever the extent is, and a missing one is
    /// read into a slot (one extent of memory) unless the file is advised `Sequential`; a wider
    /// range is one contiguous piece of memory at `base() + offset`, its frames mapped as
    /// needed. A view starting where the previous one ended (or any view of a `Sequential`
    /// file) reads the next window ahead in the background. On a map opened with
    /// [`MapOptions::zero_copy`] the view is the registered file itself: no cache memory.
    pub fn view(&self, offset: u64, len: u64) -> Result<View> {
        self.check(offset, len)?;
        if self.entry().zero_copy.is_some() {
            return Ok(View { map: self.clone(), offset, len, pins: Pins::ZeroCopy });
        }
        let g = self.shared().geometry;
        let advice = self.entry().access.lock().advice;
        let extents = g.extents_covering(offset, len);
        let pins = if extents.end - extents.start == 1 && advice != Advice::Sequential {
            self.shared().pin_extent(self.entry(), extents.start)?
        } else {
            // Before this window is waited for, so that the pool reads the next ones meanwhile.
            self.read_ahead(offset, len, advice);
            self.shared().pin_frames(self.entry(), offset, len, PinFor::Read)?
        };
        Ok(View { map: self.clone(), offset, len, pins })
    }

    /// A writable view of `[offset, offset + len)` (always contiguous, in the file's frames);
    /// its extents count as dirty until written back after it is dropped. `AccessMode` on a
    /// read-only map.
    pub fn view_mut(&self, offset: u64, len: u64) -> Result<ViewMut> {
        if !self.is_writable() {
            return Err(Error::AccessMode {
                path: self.path().to_path_buf(),
                mode: "r".to_owned(),
                op: "writing (open the map writable)",
            });
        }
        self.check(offset, len)?;
        let pins = self.shared().pin_frames(self.entry(), offset, len, PinFor::Write)?;
        Ok(ViewMut { view: View { map: self.clone(), offset, len, pins } })
    }

    /// Views of many ranges: the missing extents of all of them are read together first (one
    /// batch, as [`DeviceCache::gather`] does), then each view is taken.
    pub fn views(&self, ranges: &[(u64, u64)]) -> Result<Vec<View>> {
        for &(offset, len) in ranges {
            self.check(offset, len)?;
        }
        if self.entry().zero_copy.is_none() {
            let batch: Vec<GatherRange<'_>> = ranges
                .iter()
                .map(|&(offset, len)| GatherRange { entry: self.entry(), offset, len })
                .collect();
            self.shared().gather(&batch, None)?;
        }
        ranges.iter().map(|&(offset, len)| self.view(offset, len)).collect()
    }

    /// A view of `[offset, offset + len)` in the file's frames, whatever its size: the windows
    /// of `read`, which walk a range, want its frames rather than slots.
    fn window(&self, offset: u64, len: u64) -> Result<View> {
        let pins = self.shared().pin_frames(self.entry(), offset, len, PinFor::Read)?;
        Ok(View { map: self.clone(), offset, len, pins })
    }

    /// Starts reading the windows after `[offset, offset + len)` when the access is a walk, as
    /// the walk asks for this one: the file's read-ahead bytes ahead (two to
    /// [`MAX_WINDOWS_AHEAD`] windows; none when it is 0), as far as the budget holds them
    /// beside this one, in pieces of [`READ_AHEAD_PIECE`] (see [`read_ahead_piece`]).
    fn read_ahead(&self, offset: u64, len: u64, advice: Advice) {
        if advice == Advice::Random || len == 0 {
            return;
        }
        let g = self.shared().geometry;
        let budget = self.shared().max_frames as u64 * g.frame;
        let bytes = self.entry().read_ahead;
        let depth = if bytes == 0 { 0 } else { bytes.div_ceil(len).clamp(2, MAX_WINDOWS_AHEAD) }
            .min((budget / len.next_multiple_of(g.frame)).saturating_sub(1));
        let end = offset + len;
        let pieces: Vec<(u64, u64)> = {
            let mut access = self.entry().access.lock();
            let continuing = access.last_end == Some(offset);
            if !continuing {
                // A walk starting again (the next pass over the file) or jumping: what earlier
                // read-ahead reached says nothing about what is resident now.
                access.ahead_until = 0;
            }
            let walking = advice == Advice::Sequential || continuing;
            access.last_end = Some(end);
            if !walking || depth == 0 {
                return;
            }
            let until = (end + depth * len).min(self.len());
            let from = end.max(access.ahead_until);
            access.ahead_until = access.ahead_until.max(until);
            let piece = read_ahead_piece(until.saturating_sub(from), len, g.extent);
            (from..until).step_by(piece as usize).map(|at| (at, piece.min(until - at))).collect()
        };
        for (from, n) in pieces {
            let map = self.clone();
            self.entry().file.pool().spawn_detached(move || {
                // A piece the walk has passed by the time the pool gets here is not read: it
                // would only push out what the walk needs next.
                if map.entry().access.lock().last_end.is_some_and(|end| end > from) {
                    return;
                }
                if let Err(e) = map.shared().pin_frames(map.entry(), from, n, PinFor::ReadAhead) {
                    tracing::debug!(
                        "read-ahead of {from}+{n} in {} skipped: {e}",
                        map.path().display()
                    );
                }
            });
        }
    }

    /// Reads `[offset, offset + len)` in the background (in the file's frames); the future
    /// completes when it is resident. It does not pin: later requests may evict it.
    pub fn prefetch(&self, offset: u64, len: u64) -> IoFuture<()> {
        let map = self.clone();
        let (future, completer) = IoFuture::pending();
        // On a thread of its own: a prefetch may wait for memory others are reading, and the
        // I/O pool's threads must stay free for those reads.
        std::thread::spawn(move || {
            let result = map.check(offset, len).and_then(|()| {
                map.shared().pin_frames(map.entry(), offset, len, PinFor::Prefetch)?;
                Ok(())
            });
            completer.complete(result);
        });
        future
    }

    /// Advice about `[offset, offset + len)` (see [`Advice`]): `Normal`, `Sequential` and
    /// `Random` set how the whole file is read; `WillNeed` prefetches the range in the
    /// background; `DontNeed` writes back and evicts it.
    pub fn advise(&self, offset: u64, len: u64, advice: Advice) -> Result<()> {
        self.check(offset, len)?;
        match advice {
            Advice::Normal | Advice::Sequential | Advice::Random => {
                let mut access = self.entry().access.lock();
                access.advice = advice;
                access.ahead_until = 0;
                access.last_end = None;
                Ok(())
            }
            Advice::WillNeed => {
                // Fire and forget: its outcome shows in the stats.
                drop(self.prefetch(offset, len));
                Ok(())
            }
            Advice::DontNeed => self.evict_range(offset, len),
        }
    }

    /// Copies `[offset, offset + dst.len())` of the file (through the cache) into `dst`, in
    /// windows of at most half the budget.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len() as u64)?;
        self.entry().file.expect_ranges([(offset, dst.len() as u64)])?;
        if let Some(file) = &self.entry().zero_copy {
            return file.read_at(offset, dst);
        }
        let mut done = 0usize;
        while done < dst.len() {
            let at = offset + done as u64;
            let n = self.window_at(at).min((dst.len() - done) as u64) as usize;
            let view = self.window(at, n as u64)?;
            view.copy_to_host(0, &mut dst[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// Copies `src` to `[offset, offset + src.len())` of the map (written back later, like a
    /// write to an mmap), in windows of at most half the budget.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.check(offset, src.len() as u64)?;
        let mut done = 0usize;
        while done < src.len() {
            let at = offset + done as u64;
            let n = self.window_at(at).min((src.len() - done) as u64) as usize;
            let mut view = self.view_mut(at, n as u64)?;
            view.copy_from_host(0, &src[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// The longest window from `offset` that lies in at most half the budget's frames (at least
    /// one): it ends at a frame border, so it never needs more frames than that.
    fn window_at(&self, offset: u64) -> u64 {
        let g = self.shared().geometry;
        let frames = (self.shared().max_frames as u64 / 2).max(1);
        frames * g.frame - offset % g.frame
    }

    /// Copies ranges of this file, packed one after another, into `dst` (see
    /// [`DeviceCache::gather`]).
    pub fn gather<'a>(
        &self,
        ranges: &[(u64, u64)],
        dst: impl Into<DeviceViewMut<'a>>,
    ) -> Result<()> {
        let ranges: Vec<MapRange<'_>> = ranges.iter().map(|&(o, l)| self.range(o, l)).collect();
        self.cache().gather(&ranges, dst)
    }

    /// Copies `len` bytes at each of `offsets` (rows of a table), packed in order, into `dst`.
    pub fn gather_rows<'a>(
        &self,
        offsets: &[u64],
        len: u64,
        dst: impl Into<DeviceViewMut<'a>>,
    ) -> Result<()> {
        let ranges: Vec<MapRange<'_>> = offsets.iter().map(|&o| self.range(o, len)).collect();
        self.cache().gather(&ranges, dst)
    }

    /// [`gather`](Self::gather) into the owned `dst` in the background; the future gives `dst`
    /// back.
    pub fn gather_async<B: OwnedDeviceMemory>(
        &self,
        ranges: Vec<(u64, u64)>,
        dst: B,
    ) -> IoFuture<B> {
        let map = self.clone();
        let (future, completer) = IoFuture::pending();
        // On a thread of its own, like `prefetch`: a gather may wait for memory.
        std::thread::spawn(move || {
            let mut dst = dst;
            let result = map.gather(&ranges, dst.device_view_mut());
            completer.complete(result.map(|()| dst));
        });
        future
    }

    /// Writes every dirty extent back and waits: when it returns `Ok`, the file (through the
    /// page cache, or the disk with O_DIRECT) holds everything written before the call. Not
    /// durable against a crash: see [`sync`](Self::sync). After a failed write-back it returns
    /// that error until a `sync` succeeds.
    pub fn flush(&self) -> Result<()> {
        self.flush_range(0, self.len())
    }

    /// Like [`flush`](Self::flush) for the extents overlapping `[offset, offset + len)`.
    pub fn flush_range(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        let extents = self.shared().geometry.extents_covering(offset, len);
        writeback::flush(self.shared(), self.entry(), extents)
    }

    /// [`flush`](Self::flush), then `fdatasync`: when it returns `Ok`, the data survive a crash.
    /// It retries what earlier failed write-backs left dirty; when every byte is written and
    /// `fdatasync` succeeds, the file's sticky error is cleared.
    pub fn sync(&self) -> Result<()> {
        writeback::sync(self.shared(), self.entry())
    }

    /// Flushes and unmaps, returning the flush's error (dropping the map logs it instead).
    pub fn close(self) -> Result<()> {
        if self.is_writable() {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes back what is dirty, then gives up the memory of every frame and slot of the file
    /// no view pins; the next view of those ranges reads them again. Like `POSIX_FADV_DONTNEED`
    /// for the map.
    pub fn evict(&self) -> Result<()> {
        self.evict_range(0, self.len())
    }

    fn evict_range(&self, offset: u64, len: u64) -> Result<()> {
        let shared = self.shared();
        let g = shared.geometry;
        let extents = g.extents_covering(offset, len);
        if self.is_writable() {
            write_back(shared, self.entry(), extents.clone())?;
        }
        let frames = g.frames_covering(offset, len);
        for shard in shared.shards.iter() {
            let mut state = shard.state.lock();
            for index in state.books.idle_frames(self.entry().id) {
                if frames.contains(&index) {
                    shared.store.unmap_frame(&self.entry().memory, index)?;
                    state.books.remove_frame(self.entry().id, index);
                }
            }
            for slot in state.books.idle_slots(self.entry().id) {
                if extents.contains(&state.books.slot_owner(slot).1) {
                    state.books.evict_slot(slot);
                }
            }
            drop(state);
            shard.changed.notify_all();
        }
        Ok(())
    }
}

impl DeviceCache {
    /// Copies `ranges` — of any files open in this cache — packed one after another into
    /// `dst` (device memory on the cache's GPU for the fast path; any memory works).
    ///
    /// Resident extents are copied from wherever they are; missing ones are read in groups
    /// through pinned buffers on the pool (adjacent pieces of a file in one read) and placed
    /// — into cache slots and into `dst` — by one kernel launch per group, in rounds that each
    /// pin at most a quarter of the budget. When every range is of a file opened with
    /// [`MapOptions::zero_copy`], the rows are read in place from the host's page cache
    /// instead (one kernel launch, no cache memory; not counted in the stats). `dst` shorter
    /// than the ranges together is `BufferTooSmall`; a range past its file's end is
    /// `OutOfRange`.
    pub fn gather<'a>(
        &self,
        ranges: &[MapRange<'_>],
        dst: impl Into<DeviceViewMut<'a>>,
    ) -> Result<()> {
        let dst = dst.into();
        let _range = crate::profiling::Range::new(c"gpumap::cache::gather");
        let total = self.check_ranges(ranges)?;
        if (dst.len() as u64) < total {
            return Err(Error::BufferTooSmall { needed: total, available: dst.len() as u64 });
        }
        let zero_copy: Option<Vec<_>> = ranges
            .iter()
            .map(|r| Some((r.map.entry().zero_copy.as_ref()?, r.offset, r.len)))
            .collect();
        if let Some(rows) = zero_copy.filter(|rows| !rows.is_empty()) {
            // Checked above: every range within its file, `dst` long enough.
            return super::zero_copy::copy_rows(&rows, dst);
        }
        let batch: Vec<GatherRange<'_>> = ranges
            .iter()
            .map(|r| GatherRange { entry: r.map.entry(), offset: r.offset, len: r.len })
            .collect();
        self.shared.gather(&batch, Some(dst))
    }

    /// Views of many ranges of files in this cache: the missing extents of all of them are
    /// read together first (as [`gather`](Self::gather) does), then each view is taken.
    pub fn views(&self, ranges: &[MapRange<'_>]) -> Result<Vec<View>> {
        self.check_ranges(ranges)?;
        let batch: Vec<GatherRange<'_>> = ranges
            .iter()
            .map(|r| GatherRange { entry: r.map.entry(), offset: r.offset, len: r.len })
            .collect();
        self.shared.gather(&batch, None)?;
        ranges.iter().map(|r| r.map.view(r.offset, r.len)).collect()
    }
}

impl DeviceCache {
    /// Checks that every range is of a file open in this cache, and within it; returns their
    /// total length. A map of another cache must never reach these books: file ids are
    /// numbered per cache, so its extents would be filed under another file of this one (whose
    /// reads would then return them, and whose write-back would write them into that file).
    fn check_ranges(&self, ranges: &[MapRange<'_>]) -> Result<u64> {
        let mut total = 0u64;
        // (file, the furthest end asked of it): each file's length is checked once.
        let mut ends: Vec<(&DeviceMappedFile, u64, u64)> = Vec::new();
        for r in ranges {
            if !Arc::ptr_eq(&r.map.inner.cache.shared, &self.shared) {
                return Err(Error::InvalidArgument(format!(
                    "{} is open in another cache",
                    r.map.path().display()
                )));
            }
            r.map.check(r.offset, r.len)?;
            total =
                total.checked_add(r.len).ok_or(Error::Overflow { offset: total, len: r.len })?;
            let end = r.offset + r.len;
            match ends.iter_mut().find(|(map, ..)| Arc::ptr_eq(&map.inner, &r.map.inner)) {
                Some(furthest) if furthest.1 + furthest.2 < end => {
                    *furthest = (r.map, r.offset, r.len)
                }
                Some(_) => {}
                None => ends.push((r.map, r.offset, r.len)),
            }
        }
        // A file cut under its map reads as cut, whatever the cache still holds of it.
        for (map, offset, len) in ends {
            map.entry().file.expect_ranges([(offset, len)])?;
        }
        Ok(total)
    }
}

/// A resident, pinned, read-only range of a [`DeviceMappedFile`]; unpinned when dropped. It
/// cannot be written through: writes take a [`ViewMut`].
///
/// ```compile_fail
/// # fn f(map: gpumap::mapped::DeviceMappedFile) -> gpumap::Result<()> {
/// let view = map.view(0, 4096)?;
/// view.copy_from_host(0, b"no")?; // a read view has no way to write
/// # Ok(()) }
/// ```
pub struct View {
    map: DeviceMappedFile,
    offset: u64,
    len: u64,
    pins: Pins,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View").field("offset", &self.offset).field("len", &self.len).finish()
    }
}

impl View {
    /// File offset of the view's first byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes in the view.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where byte `at` of the view is.
    fn home(&self, at: u64) -> Home<'_> {
        let offset = self.offset + at;
        match self.pins {
            Pins::Slot(slot) => Home::Slot(slot, offset % self.map.extent_size()),
            Pins::Frames(_) | Pins::Nothing | Pins::ZeroCopy => {
                Home::Frame(&self.map.entry().memory, offset)
            }
        }
    }

    fn raw(&self) -> Option<RawRegion> {
        if self.len == 0 {
            return None;
        }
        if let (Pins::ZeroCopy, Some(file)) = (&self.pins, &self.map.entry().zero_copy) {
            return file.region(self.offset, self.len as usize);
        }
        self.map.shared().store.region(self.home(0), self.len as usize)
    }

    /// The view's GPU memory, for kernels: valid while the view lives (the borrow says so).
    /// `None` on the host backend (and for an empty view).
    ///
    /// Work queued on a stream does not hold the pin: synchronise the stream (or an event after
    /// the last kernel that reads this memory) before dropping the view, because once it is
    /// dropped the memory may be evicted and reused for other data. The address works in the
    /// device's primary context, which gpumap and cudarc's `CudaContext::new` both use.
    pub fn device(&self) -> Option<CudaView<'_>> {
        self.raw().map(CudaView::assume_valid)
    }

    /// Copies `dst.len()` bytes from `at` (relative to the view) into `dst`.
    pub fn copy_to_host(&self, at: u64, dst: &mut [u8]) -> Result<()> {
        if let (Pins::ZeroCopy, Some(file)) = (&self.pins, &self.map.entry().zero_copy) {
            self.check_within(at, dst.len() as u64)?;
            return file.read_at(self.offset + at, dst);
        }
        self.pieces(at, dst.len() as u64, |home, range| {
            self.map.shared().store.copy_out(home, &mut dst[range])
        })
    }

    /// `OutOfView` unless `[at, at + len)` lies within the view.
    fn check_within(&self, at: u64, len: u64) -> Result<()> {
        match at.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfView {
                offset: at,
                len,
                view_offset: self.offset,
                view_len: self.len,
            }),
        }
    }

    /// Calls `f(home, range of the caller's buffer)` for each piece of `[at, at + len)` of the
    /// view that lies in one frame (host frames are separate allocations).
    fn pieces(
        &self,
        at: u64,
        len: u64,
        mut f: impl FnMut(Home<'_>, std::ops::Range<usize>) -> Result<()>,
    ) -> Result<()> {
        self.check_within(at, len)?;
        let frame = self.map.frame_size();
        let mut done = 0u64;
        while done < len {
            let offset = self.offset + at + done;
            let n = (frame - offset % frame).min(len - done);
            f(self.home(at + done), done as usize..(done + n) as usize)?;
            done += n;
        }
        Ok(())
    }
}

impl Drop for View {
    fn drop(&mut self) {
        let extents = self.map.shared().geometry.extents_covering(self.offset, self.len);
        self.map.shared().unpin_view(self.map.entry(), &self.pins, extents, false);
    }
}

/// A resident, pinned, writable range of a [`DeviceMappedFile`] (see
/// [`DeviceMappedFile::view_mut`]); its bytes are written back after it is dropped.
pub struct ViewMut {
    view: View,
}

impl std::fmt::Debug for ViewMut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewMut")
            .field("offset", &self.view.offset)
            .field("len", &self.view.len)
            .finish()
    }
}

impl ViewMut {
    /// File offset of the view's first byte.
    pub fn offset(&self) -> u64 {
        self.view.offset
    }

    /// Bytes in the view.
    pub fn len(&self) -> u64 {
        self.view.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.view.len == 0
    }

    /// The view's GPU memory, to read.
    pub fn device(&self) -> Option<CudaView<'_>> {
        self.view.device()
    }

    /// The view's GPU memory, for kernels that write it: valid while this borrow lives. `None`
    /// on the host backend.
    pub fn device_mut(&mut self) -> Option<CudaViewMut<'_>> {
        self.view.raw().map(CudaViewMut::assume_valid)
    }

    /// Copies `dst.len()` bytes from `at` (relative to the view) into `dst`.
    pub fn copy_to_host(&self, at: u64, dst: &mut [u8]) -> Result<()> {
        self.view.copy_to_host(at, dst)
    }

    /// Copies `src` to `at` (relative to the view).
    pub fn copy_from_host(&mut self, at: u64, src: &[u8]) -> Result<()> {
        let store = &self.view.map.shared().store;
        self.view.pieces(at, src.len() as u64, |home, range| store.copy_in(home, &src[range]))
    }
}

impl Drop for ViewMut {
    fn drop(&mut self) {
        let view = &mut self.view;
        let extents = view.map.shared().geometry.extents_covering(view.offset, view.len);
        view.map.shared().unpin_view(view.map.entry(), &view.pins, extents, true);
        // The inner view must not unpin again.
        view.pins = Pins::Nothing;
    }
}

/// The length of the pieces `bytes` of read-ahead in windows of `window` bytes are cut into:
/// [`READ_AHEAD_PIECE`], longer where that would make more than [`MAX_PIECES_AHEAD`] of them,
/// in whole extents (a piece border inside an extent would leave it to whichever piece claims
/// it first) — but never longer than a window: a piece pins all its frames until it is in, and
/// a small budget read ahead in pieces longer than the walk's windows evicted windows read
/// ahead before the walk got to them (the host's walk test read 4 MiB of 16 twice in at least
/// 2 of 100 runs; with the cap, in none of 100).
fn read_ahead_piece(bytes: u64, window: u64, extent: u64) -> u64 {
    let piece =
        bytes.div_ceil(MAX_PIECES_AHEAD).max(READ_AHEAD_PIECE).next_multiple_of(extent.max(1));
    piece.min(window)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn read_ahead_pieces_fit_windows_and_are_bounded_in_number(
            window in 1u64..(1 << 36),
            windows in 1u64..=MAX_WINDOWS_AHEAD,
            extent_pages in 1u64..=4096,
        ) {
            let extent = extent_pages * 4096;
            let bytes = window * windows;
            let piece = read_ahead_piece(bytes, window, extent);
            prop_assert!(piece <= window);
            prop_assert!(piece >= READ_AHEAD_PIECE.min(window));
            prop_assert!(piece == window || piece.is_multiple_of(extent));
            prop_assert!(bytes.div_ceil(piece) <= MAX_PIECES_AHEAD.max(MAX_WINDOWS_AHEAD));
            // No longer than it needs to be: the least whole extents at or past the target.
            let target = bytes.div_ceil(MAX_PIECES_AHEAD).max(READ_AHEAD_PIECE);
            prop_assert!(piece == window || piece - target < extent);
        }
    }
}
