//! [`DeviceCache`]: one memory budget on one GPU (or host memory standing in), shared by every
//! file opened through it — a page cache for device memory, with no kernel module and no FUSE.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::books::{Books, FileCounters, FileId, FrameBudget, SlotId, Unit, Victim, Want};
use super::geometry::Geometry;
use super::store::{FileMemory, Store};
use super::view::{Advice, DeviceMappedFile, MapOptions};
use crate::align::PAGE_SIZE;
use crate::error::{Error, Result};
use crate::io::{FileHandle, HandleOptions};
use crate::memory::cuda::VaRange;
use crate::memory::Device;

/// The smallest default frame: mapping a frame costs about 35 µs whatever its size (H100,
/// 2026-11-21: 2048 frames of 2 MiB took 70 ms to map and unmap per 4 GiB, a third of a
/// whole-file fault at 24.5 GB/s). 8 MiB frames cut the calls fourfold and keep eviction
/// reasonably fine-grained for small budgets.
pub(crate) const DEFAULT_FRAME: u64 = 8 << 20;

/// The largest default frame.
const MAX_DEFAULT_FRAME: u64 = 64 << 20;

/// The default frame size aims at this many frames per budget.
const FRAMES_PER_BUDGET: u64 = 32;

/// The default frame for `budget`: a thirty-second of it as a power of two, from 8 to 64 MiB.
/// Each frame costs about 45 µs of driver calls (map, set access, unmap: H100, 2026-11-22,
/// the same for 2, 8 and 64 MiB frames), so a walk under 1 GiB in 64 MiB windows ran at
/// 27–31 GB/s with 8 MiB frames and 42–44 GB/s with 32 or 64 MiB ones (FileHandle 48–50 in the
/// same runs); 32 frames still leave 16 shards two frames each.
pub(crate) fn default_frame(budget: u64, granularity: u64) -> u64 {
    let share = budget / FRAMES_PER_BUDGET;
    let power = if share == 0 { 0 } else { 1u64 << share.ilog2() };
    power.clamp(DEFAULT_FRAME, MAX_DEFAULT_FRAME).next_multiple_of(granularity.max(1))
}

/// Default extent: 64 KiB reads are efficient for clustered access; random access to small
/// records wants 4 KiB ([`CacheOptions::extent_size`]).
pub(crate) const DEFAULT_EXTENT: u64 = 64 << 10;

/// How long a request waits for views to unpin memory, by default.
const DEFAULT_PIN_WAIT: Duration = Duration::from_secs(2);

/// How often a request waiting for room in a cache of several shards looks again (room another
/// shard makes wakes no one here).
const SHARED_BUDGET_POLL: Duration = Duration::from_millis(1);

/// The largest frame accepted: beyond it eviction is too coarse to be useful.
const MAX_FRAME: u64 = 1 << 30;

/// Allocation granularity of the host backend: the GPUs', so that both keep the same books.
const HOST_GRANULARITY: u64 = 2 << 20;

/// Options of a [`DeviceCache`] (builder, like `memmap2::MmapOptions`).
#[derive(Debug, Clone)]
pub struct CacheOptions {
    budget: u64,
    extent_size: u64,
    frame_size: Option<u64>,
    memory: Option<Device>,
    pin_wait: Duration,
    shards: Option<usize>,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            budget: 1 << 30,
            extent_size: DEFAULT_EXTENT,
            frame_size: None,
            memory: None,
            pin_wait: DEFAULT_PIN_WAIT,
            shards: None,
        }
    }
}

impl CacheOptions {
    /// 1 GiB budget, 64 KiB extents, frames by budget (32 MiB for 1 GiB), GPU 0 where there is
    /// one.
    pub fn new() -> CacheOptions {
        CacheOptions::default()
    }

    /// The most memory the cache holds, in bytes: rounded down to whole frames; less than one
    /// frame, or more than the device has, is an error.
    pub fn budget(&mut self, bytes: u64) -> &mut Self {
        self.budget = bytes;
        self
    }

    /// The unit of validity, I/O and random-access residency: a power of two from 4 KiB up to
    /// the frame size. A slot of memory holds one extent, so random reads of small records
    /// want small extents (4 KiB); clustered reads want larger ones.
    pub fn extent_size(&mut self, bytes: u64) -> &mut Self {
        self.extent_size = bytes;
        self
    }

    /// The unit in which memory is mapped, evicted and counted against the budget: a multiple
    /// of the GPU's allocation granularity (2 MiB) up to 1 GiB; default a thirty-second of the
    /// budget as a power of two, from 8 MiB to 64 MiB (8 MiB up to a 256 MiB budget, 32 MiB for
    /// 1 GiB). Larger frames mean fewer driver calls per byte (mapping, setting access and
    /// unmapping one costs about 45 µs, whatever its size), and coarser eviction of file ranges:
    /// a view of a few bytes past the slots' single extents holds a whole frame.
    pub fn frame_size(&mut self, bytes: u64) -> &mut Self {
        self.frame_size = Some(bytes);
        self
    }

    /// The frame size a cache of `budget` bytes gets when none is set, on a device whose
    /// allocation granularity is 2 MiB (every current NVIDIA GPU, and the host backend): a
    /// thirty-second of the budget as a power of two, from 8 MiB to 64 MiB.
    pub fn default_frame_size(budget: u64) -> u64 {
        default_frame(budget, HOST_GRANULARITY)
    }

    /// The frame size set, if one was.
    pub(crate) fn frame(&self) -> Option<u64> {
        self.frame_size
    }

    /// Where the memory is (default: [`Device::auto`]).
    pub fn memory(&mut self, memory: Device) -> &mut Self {
        self.memory = Some(memory);
        self
    }

    /// How long a request that fits the budget waits for other views to unpin memory before
    /// it fails with [`Error::OutOfBudget`] (default 2 s; zero: fail at once). Reads and
    /// gathers of other threads never make a request fail: they end by themselves, so it
    /// waits for them.
    pub fn pin_wait(&mut self, wait: Duration) -> &mut Self {
        self.pin_wait = wait;
        self
    }

    /// How many independent parts (each with its own lock and LRU list, all drawing on the one
    /// budget) the cache's books are split into: a power of two dividing the budget's frames,
    /// with at least two frames each. Frame `i` of a file belongs to part `(i + f) mod shards` for a
    /// per-file `f`, so consecutive frames (a walk, a wide view) spread over all parts, and so
    /// do random rows. Default: one part while the budget is under 8 frames (exact LRU across
    /// the whole cache), else as many as fit the rule, up to 16 — one lock measured as the
    /// limit of gathers from 16 threads (see docs/architecture.md). Eviction is then
    /// least-recently-used within each part, as Linux's is within each memory node; a part
    /// with nothing left to evict takes what another holds idle.
    pub fn shards(&mut self, shards: usize) -> &mut Self {
        self.shards = Some(shards);
        self
    }

    /// Builds the cache.
    pub fn build(&self) -> Result<DeviceCache> {
        DeviceCache::with_options(self)
    }
}

/// What one mapped file has done so far ([`DeviceMappedFile::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FileStats {
    /// Bytes mapped (the file's length when it was mapped).
    pub len: u64,
    /// Extents asked for (by views, gathers and prefetches) that were resident.
    pub hits: u64,
    /// Extents asked for that had to be read from the file.
    pub misses: u64,
    /// Reads issued to fill missing extents.
    pub fault_reads: u64,
    /// Bytes those reads brought in.
    pub bytes_faulted: u64,
    /// Frames and slots of this file given up to make room (or by `evict`).
    pub evictions: u64,
    /// Bytes written back (by flushes and evictions).
    pub bytes_written_back: u64,
    /// Write-backs that failed.
    pub write_errors: u64,
    /// Bytes of the file resident (clean or dirty).
    pub resident_bytes: u64,
    /// Bytes waiting to be written back.
    pub dirty_bytes: u64,
    /// Frames of the file mapped (contiguous homes).
    pub frames: u64,
    /// Slots holding extents of the file (random-access homes).
    pub slots: u64,
}

/// What a cache holds and has done ([`DeviceCache::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CacheStats {
    /// The budget, in bytes (whole frames).
    pub budget: u64,
    /// Independent parts the budget is split into ([`CacheOptions::shards`]).
    pub shards: u64,
    /// The frame size.
    pub frame_size: u64,
    /// The extent (and slot) size.
    pub extent_size: u64,
    /// Bytes of memory in use: mapped file frames and slot frames. Never above `budget`.
    pub used_bytes: u64,
    /// Slots in use across files.
    pub slots_in_use: u64,
    /// Files open in the cache.
    pub files: u64,
    /// The counters of every file (open now) added up; `len` is their total length.
    pub totals: FileStats,
    /// Seconds spent mapping and unmapping memory (summed over threads).
    pub map_seconds: f64,
    /// Seconds spent reading missing extents (summed over the threads that waited for them).
    pub fault_seconds: f64,
}

/// What the cache keeps of one open file: what eviction needs to write it back and unmap it.
pub(crate) struct FileEntry {
    pub(crate) id: FileId,
    pub(crate) path: PathBuf,
    pub(crate) file: FileHandle,
    pub(crate) writable: bool,
    pub(crate) len: u64,
    pub(crate) memory: FileMemory,
    pub(crate) sticky: Mutex<Option<super::writeback::StickyError>>,
    pub(crate) access: Mutex<AccessState>,
    /// Bytes a walk reads ahead ([`MapOptions::read_ahead`]).
    pub(crate) read_ahead: u64,
    /// The file registered for the GPU to read in place ([`MapOptions::zero_copy`]).
    pub(crate) zero_copy: Option<super::ZeroCopyFile>,
}

/// How a file is being read, for read-ahead.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AccessState {
    pub(crate) advice: Advice,
    /// Where the last contiguous view ended (a view starting there is the next of a walk).
    pub(crate) last_end: Option<u64>,
    /// Read-ahead has been started up to here.
    pub(crate) ahead_until: u64,
}

/// The state behind one lock: the books of a shard, and the files they name (every shard
/// names every open file).
pub(crate) struct State {
    pub(crate) books: Books,
    pub(crate) files: HashMap<FileId, Arc<FileEntry>>,
}

/// One independent part of a cache: its books under their own lock, drawing on the cache's one
/// budget, with its own stretch of the slot arena and its own LRU list. An extent and its frame are
/// always in the same shard (the shard of the frame), so everything the books decide about one
/// extent — where it is, one home, moves between slot and frame — stays inside one shard.
pub(crate) struct Shard {
    pub(crate) state: Mutex<State>,
    /// Signalled when loads finish and pins go in this shard.
    pub(crate) changed: Condvar,
}

/// A cache's shared innards.
pub(crate) struct CacheShared {
    pub(crate) shards: Box<[Shard]>,
    /// The id of the next file opened.
    next_file: AtomicU32,
    pub(crate) store: Store,
    pub(crate) geometry: Geometry,
    /// Nanoseconds spent mapping memory and reading missing extents, summed over threads:
    /// counters, not a lock, since every fault adds to them.
    pub(crate) map_nanos: AtomicU64,
    pub(crate) fault_nanos: AtomicU64,
    pub(crate) pin_wait: Duration,
    /// The budget in frames (the books' too; here to be read without the lock).
    pub(crate) max_frames: usize,
}

/// One budget of device memory on one GPU (or host memory standing in), shared by every file
/// opened through it: least-recently-used eviction across files, write-back before eviction,
/// single-flight faults, stats per file and in total. A cache serves one device; cheap to clone.
///
/// ```
/// use gpumap::mapped::CacheOptions;
/// # let dir = tempfile::tempdir()?;
/// # let (a, b) = (dir.path().join("a"), dir.path().join("b"));
/// # std::fs::write(&a, vec![1u8; 1 << 20])?;
/// # std::fs::write(&b, vec![2u8; 1 << 20])?;
/// let cache = CacheOptions::new().budget(64 << 20).extent_size(4096).build()?;
/// let first = cache.open(&a)?;
/// let second = cache.open(&b)?;
/// let mut rows = gpumap::memory::DeviceBuffer::zeroed(&cache.device(), 2 * 4096)?;
/// cache.gather(&[first.range(0, 4096), second.range(65536, 4096)], rows.view_mut())?;
/// assert_eq!(rows.to_vec()?[4096], 2);
/// println!("{:?}", cache.stats());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct DeviceCache {
    pub(crate) shared: Arc<CacheShared>,
}

impl std::fmt::Debug for DeviceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stats = self.stats();
        f.debug_struct("DeviceCache")
            .field("memory", &self.shared.store.describe())
            .field("budget", &stats.budget)
            .field("used_bytes", &stats.used_bytes)
            .field("files", &stats.files)
            .finish()
    }
}

impl DeviceCache {
    /// A cache with these options.
    pub fn new(options: &CacheOptions) -> Result<DeviceCache> {
        DeviceCache::with_options(options)
    }

    fn with_options(options: &CacheOptions) -> Result<DeviceCache> {
        let device = options.memory.clone().unwrap_or_else(Device::auto);
        let (granularity, capacity) = match &device {
            Device::Cuda(d) => (VaRange::granularity(d)? as u64, d.total_memory() as u64),
            Device::Host => (HOST_GRANULARITY, crate::sys::host_memory::physical_memory()),
        };
        let frame = options.frame_size.unwrap_or(default_frame(options.budget, granularity));
        if frame == 0 || !frame.is_multiple_of(granularity) || frame > MAX_FRAME {
            return Err(Error::InvalidArgument(format!(
                "frame size {frame}: expected a multiple of the allocation granularity \
                 {granularity} up to {MAX_FRAME}"
            )));
        }
        let extent = options.extent_size;
        if !extent.is_power_of_two() || extent < PAGE_SIZE || extent > frame {
            return Err(Error::InvalidArgument(format!(
                "extent size {extent}: expected a power of two from {PAGE_SIZE} to the frame \
                 size {frame}"
            )));
        }
        if options.budget < frame {
            return Err(Error::InvalidArgument(format!(
                "budget {} is less than one frame of {frame} bytes",
                options.budget
            )));
        }
        if options.budget > capacity {
            return Err(Error::InvalidArgument(format!(
                "budget {} exceeds the {capacity} bytes of {}",
                options.budget,
                device.describe()
            )));
        }
        let max_frames = (options.budget / frame) as usize;
        let shards = match options.shards {
            None => default_shards(max_frames),
            Some(n)
                if n.is_power_of_two() && max_frames.is_multiple_of(n) && max_frames / n >= 2 =>
            {
                n
            }
            Some(1) => 1,
            Some(n) => {
                return Err(Error::InvalidArgument(format!(
                    "{n} shards for a budget of {max_frames} frames: expected 1, or a power of \
                     two dividing the frames with at least two frames each"
                )))
            }
        };
        let geometry = Geometry { extent, frame };
        // Each shard's books own a stretch of the slot arena as long as the whole budget (one
        // shard may come to hold all of it); slot ids must fit in 32 bits.
        let positions = max_frames.saturating_mul(shards);
        if (positions as u64).saturating_mul(geometry.per_frame()) > u64::from(SlotId::MAX) {
            return Err(Error::InvalidArgument(format!(
                "a budget of {max_frames} frames of {} extents in {shards} shards: more than \
                 2^32 slots (use larger extents, or fewer shards)",
                geometry.per_frame()
            )));
        }
        let budget = FrameBudget::new(max_frames);
        let shards = (0..shards)
            .map(|i| Shard {
                state: Mutex::new(State {
                    books: Books::with_arena(geometry, Arc::clone(&budget), i * max_frames),
                    files: HashMap::new(),
                }),
                changed: Condvar::new(),
            })
            .collect();
        Ok(DeviceCache {
            shared: Arc::new(CacheShared {
                shards,
                next_file: AtomicU32::new(0),
                store: Store::new(&device, geometry, positions)?,
                geometry,
                map_nanos: AtomicU64::new(0),
                fault_nanos: AtomicU64::new(0),
                pin_wait: options.pin_wait,
                max_frames,
            }),
        })
    }

    /// Opens `path` read-only in this cache with the default [`MapOptions`].
    pub fn open(&self, path: impl AsRef<Path>) -> Result<DeviceMappedFile> {
        self.open_with(path.as_ref(), &MapOptions::new())
    }

    /// Opens `path` in this cache with `options` (their budget, extent, frame and memory
    /// settings are the cache's and are ignored here).
    pub fn open_with(
        &self,
        path: impl AsRef<Path>,
        options: &MapOptions,
    ) -> Result<DeviceMappedFile> {
        let path = path.as_ref();
        let handle_options = match options.handle.as_ref() {
            Some(o) => o.clone(),
            None => {
                // Write-backs go through the page cache, as an mmap's do: many small scattered
                // writes each made synchronous to the disk by O_DIRECT would crawl, and `sync`
                // makes them durable.
                let mut o = HandleOptions::from_config(crate::Config::global()?);
                o.direct_io_write = false;
                o
            }
        };
        if options.zero_copy.is_some() && options.writable {
            return Err(Error::InvalidArgument(format!(
                "{}: the zero-copy tier serves read-only maps; this one is writable",
                path.display()
            )));
        }
        let file = handle_options.open(path, if options.writable { "r+" } else { "r" })?;
        let zero_copy = match options.zero_copy {
            Some(max_pinned) => {
                let mut zero_copy = super::ZeroCopyOptions::new();
                zero_copy.device(self.device());
                if let Some(bytes) = max_pinned {
                    zero_copy.max_pinned(bytes);
                }
                Some(super::ZeroCopyFile::with_handle(file.clone(), &zero_copy)?)
            }
            None => None,
        };
        let len = file.len()?;
        let memory = self.shared.store.open_file(len)?;
        let id = self.shared.next_file.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(FileEntry {
            id,
            path: path.to_path_buf(),
            file,
            writable: options.writable,
            len,
            memory,
            sticky: Mutex::new(None),
            access: Mutex::new(AccessState { advice: options.advice, ..AccessState::default() }),
            read_ahead: options.read_ahead.unwrap_or(super::view::DEFAULT_READ_AHEAD),
            zero_copy,
        });
        for shard in self.shared.shards.iter() {
            let mut state = shard.state.lock();
            state.books.add_file(id, len);
            state.files.insert(id, Arc::clone(&entry));
        }
        Ok(DeviceMappedFile::new(self.clone(), entry))
    }

    /// Where the cache's memory is.
    pub fn device(&self) -> Device {
        self.shared.store.device()
    }

    /// What the cache holds and has done, over the files open now.
    pub fn stats(&self) -> CacheStats {
        let g = self.shared.geometry;
        let mut totals = FileStats::default();
        let (mut slots_in_use, mut files, mut frames_taken) = (0, 0, 0);
        // Shard by shard, one lock at a time: a sum of moments close together, not one moment.
        for (i, shard) in self.shared.shards.iter().enumerate() {
            let state = shard.state.lock();
            let books = &state.books;
            for (id, file) in books.files() {
                totals.add(&file_stats(books, id));
                if i == 0 {
                    // Every shard knows every file: its length is counted in one.
                    totals.len += file.len;
                }
            }
            // The budget's own count: a sum over shards read one after another could count a
            // frame twice as it moves from one shard to another.
            frames_taken = books.budget().used();
            slots_in_use += books.slots_in_use();
            files = books.files().count();
        }
        let seconds = |nanos: &AtomicU64| nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let (map_seconds, fault_seconds) =
            (seconds(&self.shared.map_nanos), seconds(&self.shared.fault_nanos));
        CacheStats {
            budget: self.shared.max_frames as u64 * g.frame,
            shards: self.shared.shards.len() as u64,
            frame_size: g.frame,
            extent_size: g.extent,
            used_bytes: frames_taken as u64 * g.frame,
            slots_in_use: slots_in_use as u64,
            files: files as u64,
            totals,
            map_seconds,
            fault_seconds,
        }
    }

    /// How many independent parts the cache's books are in ([`CacheOptions::shards`]).
    pub fn shards(&self) -> usize {
        self.shared.shards.len()
    }

    /// Writes back every dirty extent of every file (see [`DeviceMappedFile::flush`]); the
    /// first error is returned after every file was tried.
    pub fn flush(&self) -> Result<()> {
        let g = self.shared.geometry;
        self.each_file(|entry| {
            super::writeback::flush(&self.shared, entry, 0..g.extents(entry.len))
        })
    }

    /// Writes back every dirty extent of every file, then `fdatasync` of each written file (see
    /// [`DeviceMappedFile::sync`]).
    pub fn sync(&self) -> Result<()> {
        self.each_file(|entry| super::writeback::sync(&self.shared, entry))
    }

    /// Runs `f` on every open file; the first error is returned after all ran.
    fn each_file(&self, f: impl Fn(&FileEntry) -> Result<()>) -> Result<()> {
        let entries: Vec<Arc<FileEntry>> =
            self.shared.shards[0].state.lock().files.values().cloned().collect();
        let mut first = None;
        for entry in entries {
            if let Err(e) = f(&entry) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// The default number of shards for a budget of `max_frames` frames (see
/// [`CacheOptions::shards`]).
fn default_shards(max_frames: usize) -> usize {
    if max_frames < 8 {
        return 1;
    }
    let mut shards = 16;
    while shards > 1 && (!max_frames.is_multiple_of(shards) || max_frames / shards < 2) {
        shards /= 2;
    }
    shards
}

impl FileStats {
    /// Adds `other`'s counts (a file's stats from another shard, or another file's); the
    /// length is not a count and is left alone.
    fn add(&mut self, other: &FileStats) {
        self.hits += other.hits;
        self.misses += other.misses;
        self.fault_reads += other.fault_reads;
        self.bytes_faulted += other.bytes_faulted;
        self.evictions += other.evictions;
        self.bytes_written_back += other.bytes_written_back;
        self.write_errors += other.write_errors;
        self.resident_bytes += other.resident_bytes;
        self.dirty_bytes += other.dirty_bytes;
        self.frames += other.frames;
        self.slots += other.slots;
    }
}

/// One file's stats, summed over the shards (their length counted once).
pub(crate) fn file_stats_all(shared: &CacheShared, id: FileId) -> FileStats {
    let mut total = FileStats::default();
    for shard in shared.shards.iter() {
        let s = file_stats(&shard.state.lock().books, id);
        total.add(&s);
        total.len = s.len;
    }
    total
}

/// One file's stats from the books of one shard.
pub(crate) fn file_stats(books: &Books, id: FileId) -> FileStats {
    let Some(file) = books.file(id) else { return FileStats::default() };
    let FileCounters {
        hits,
        misses,
        fault_reads,
        bytes_faulted,
        evictions,
        bytes_written_back,
        write_errors,
    } = file.counters;
    let (resident_bytes, dirty_bytes) = books.resident_and_dirty(id);
    let (frames, slots) = books.units_of(id);
    FileStats {
        len: file.len,
        hits,
        misses,
        fault_reads,
        bytes_faulted,
        evictions,
        bytes_written_back,
        write_errors,
        resident_bytes,
        dirty_bytes,
        frames: frames as u64,
        slots: slots as u64,
    }
}

/// What giving up a victim did.
enum GaveUp {
    /// A unit went (a frame back to the budget, or a slot free).
    Unit,
    /// The lock was let go to write a dirty frame back.
    Released,
    /// Nothing can go.
    Nothing,
}

/// What one step of making room did.
pub(crate) enum Room {
    /// There is room for what was wanted.
    Ready,
    /// The lock was let go to write a dirty frame back: look at everything again.
    Released,
    /// Everything is pinned.
    Full,
}

fn nanos_since(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl CacheShared {
    /// The shard of frame `index` of `file` (and of every extent in it): consecutive frames go
    /// round the shards, each file starting at a different one.
    pub(crate) fn shard_of(&self, file: FileId, index: u64) -> usize {
        let n = self.shards.len() as u64;
        (index.wrapping_add(u64::from(file).wrapping_mul(7)) % n) as usize
    }

    /// The shard of extent `e` of `file`: its frame's.
    pub(crate) fn shard_of_extent(&self, file: FileId, e: u64) -> usize {
        self.shard_of(file, self.geometry.frame_of(e))
    }

    /// The shard whose books hold slot `slot` (each owns a stretch of the slot arena as long
    /// as the budget).
    pub(crate) fn shard_of_slot(&self, slot: SlotId) -> usize {
        let position = slot as usize / self.geometry.per_frame() as usize;
        (position / self.max_frames).min(self.shards.len() - 1)
    }

    /// The shards holding frames `frames` of `file`, each with those frames, in the order of
    /// their first frame.
    pub(crate) fn shards_of_frames(
        &self,
        file: FileId,
        frames: std::ops::Range<u64>,
    ) -> Vec<(usize, Vec<u64>)> {
        let mut parts: Vec<(usize, Vec<u64>)> = Vec::new();
        for index in frames {
            let shard = self.shard_of(file, index);
            match parts.iter_mut().find(|p| p.0 == shard) {
                Some(part) => part.1.push(index),
                None => parts.push((shard, vec![index])),
            }
        }
        parts
    }

    /// Adds the time since `since` to the time spent mapping memory.
    pub(crate) fn add_map_time(&self, since: Instant) {
        self.map_nanos.fetch_add(nanos_since(since), Ordering::Relaxed);
    }

    /// Adds the time since `since` to the time spent reading missing extents.
    pub(crate) fn add_fault_time(&self, since: Instant) {
        self.fault_nanos.fetch_add(nanos_since(since), Ordering::Relaxed);
    }

    /// One step towards room for `want`: a free slot is ready, or a frame of the budget has
    /// been taken for the caller (`Room::Ready` for `Want::Frame`: the caller maps it and
    /// records it with `Books::add_frame`, or gives it back), or a victim was given up (in
    /// this shard, or — where this shard has nothing left to give — in another), or nothing can
    /// go. Without `write_back` (read-ahead on a pool thread, which must never wait for a
    /// write-back that may need the pool) a dirty victim counts as nothing to give up.
    pub(crate) fn make_room(
        &self,
        shard: &Shard,
        state: &mut MutexGuard<'_, State>,
        want: Want,
        write_back: bool,
    ) -> Result<Room> {
        loop {
            match want {
                Want::Slot if state.books.has_free_slot() => return Ok(Room::Ready),
                Want::Slot if state.books.budget().try_take() => {
                    let t = Instant::now();
                    let Some(position) = state.books.add_slot_frame() else {
                        return Ok(Room::Full);
                    };
                    let mapped = self.store.map_slot_frame(position);
                    self.add_map_time(t);
                    if let Err(e) = mapped {
                        state.books.remove_slot_frame(position);
                        return Err(e);
                    }
                    return Ok(Room::Ready);
                }
                Want::Frame if state.books.budget().try_take() => return Ok(Room::Ready),
                _ => {}
            }
            match self.give_up_one(shard, state, want, write_back)? {
                GaveUp::Unit => continue,
                GaveUp::Released => return Ok(Room::Released),
                GaveUp::Nothing if self.shards.len() > 1 => {
                    // The budget is the cache's: a frame another shard holds idle will do.
                    let elsewhere =
                        MutexGuard::unlocked(state, || self.give_up_elsewhere(shard, write_back))?;
                    return Ok(if elsewhere { Room::Released } else { Room::Full });
                }
                GaveUp::Nothing => return Ok(Room::Full),
            }
        }
    }

    /// Gives up one frame's worth of another shard than `me` (one lock at a time; the caller
    /// holds none): whether one went back to the budget (or was written back, after which the
    /// caller looks again).
    fn give_up_elsewhere(&self, me: &Shard, write_back: bool) -> Result<bool> {
        for other in self.shards.iter().filter(|s| !std::ptr::eq(*s, me)) {
            let mut state = other.state.lock();
            let gave = self.give_up_one(other, &mut state, Want::Frame, write_back);
            drop(state);
            other.changed.notify_all();
            match gave? {
                GaveUp::Unit | GaveUp::Released => return Ok(true),
                GaveUp::Nothing => {}
            }
        }
        Ok(false)
    }

    /// Gives up this shard's victim for `want`, if it has one (see `Books::victim`).
    fn give_up_one(
        &self,
        shard: &Shard,
        state: &mut MutexGuard<'_, State>,
        want: Want,
        write_back: bool,
    ) -> Result<GaveUp> {
        match state.books.victim(want) {
            Victim::CleanFrame { file, index } => {
                let entry = state.files.get(&file).cloned();
                let t = Instant::now();
                if let Some(entry) = entry {
                    self.store.unmap_frame(&entry.memory, index)?;
                }
                self.add_map_time(t);
                state.books.remove_frame(file, index);
                Ok(GaveUp::Unit)
            }
            Victim::Slot(slot) => {
                state.books.evict_slot(slot);
                Ok(GaveUp::Unit)
            }
            Victim::SlotFrame(position) => {
                let t = Instant::now();
                self.store.unmap_slot_frame(position)?;
                self.add_map_time(t);
                state.books.remove_slot_frame(position);
                Ok(GaveUp::Unit)
            }
            Victim::DirtyFrame { .. } if !write_back => Ok(GaveUp::Nothing),
            Victim::DirtyFrame { file, index } => {
                let Some(entry) = state.files.get(&file).cloned() else {
                    return Ok(GaveUp::Nothing);
                };
                // Pinned while its bytes go out, so no one else evicts it meanwhile, and
                // closed to new requests, so that it is clean when they are out and goes
                // at once: room made here is not lost to a writer that dirtied it again.
                state.books.pin(Unit::Frame { file, index }, true);
                state.books.begin_eviction(file, index);
                let per = self.geometry.per_frame();
                let extents = index * per..(index + 1) * per;
                let result = MutexGuard::unlocked(state, || {
                    super::writeback::write_back(self, &entry, extents)
                });
                let free = state.books.end_eviction(file, index, result.is_ok());
                let unmapped = if free {
                    let t = Instant::now();
                    let unmapped = self.store.unmap_frame(&entry.memory, index);
                    self.add_map_time(t);
                    if unmapped.is_ok() {
                        state.books.remove_frame(file, index);
                    }
                    unmapped
                } else {
                    Ok(())
                };
                shard.changed.notify_all();
                result?;
                unmapped?;
                Ok(GaveUp::Released)
            }
            Victim::None => Ok(GaveUp::Nothing),
        }
    }

    /// When a request started at `since` finds nothing to evict: waits for a change (a load
    /// finished, a pin went). Pins of the cache's own operations go by themselves; pins of
    /// callers' views may never go (the caller itself may hold them), so waiting for those is
    /// bounded by the cache's `pin_wait`, after which the request is `OutOfBudget`.
    pub(crate) fn wait_or_full(
        &self,
        shard: &Shard,
        state: &mut MutexGuard<'_, State>,
        requested: u64,
        since: Instant,
    ) -> Result<()> {
        // With the budget shared by shards, room may come from another shard, whose changes
        // this shard's condition variable does not hear of: look again every millisecond.
        let poll = (self.shards.len() > 1).then(|| Instant::now() + SHARED_BUDGET_POLL);
        if state.books.transient_pins() > 0 {
            match poll {
                Some(at) => drop(shard.changed.wait_until(state, at)),
                None => shard.changed.wait(state),
            }
            return Ok(());
        }
        let deadline = since + self.pin_wait;
        if Instant::now() < deadline {
            shard.changed.wait_until(state, poll.map_or(deadline, |at| at.min(deadline)));
            return Ok(());
        }
        Err(self.out_of_budget(requested))
    }

    /// `OutOfBudget` for a request of `requested` bytes, with the budget and the memory mapped
    /// now.
    pub(crate) fn out_of_budget(&self, requested: u64) -> Error {
        let frame = self.geometry.frame;
        Error::OutOfBudget {
            requested,
            budget: self.max_frames as u64 * frame,
            in_use: self.store.frames_mapped() as u64 * frame,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_frames_grow_with_the_budget_from_8_to_64_mib() {
        const MIB: u64 = 1 << 20;
        let g = HOST_GRANULARITY;
        for (budget, frame) in [
            (0, 8),
            (MIB, 8),
            (64 * MIB, 8),
            (256 * MIB, 8),
            (511 * MIB, 8),
            (512 * MIB, 16),
            (1000 * MIB, 16),
            (1024 * MIB, 32),
            (1536 * MIB, 32),
            (2048 * MIB, 64),
            (80 << 30, 64),
            (u64::MAX, 64),
        ] {
            assert_eq!(default_frame(budget, g), frame * MIB, "budget {budget}");
        }
        // A granularity the frame is not a multiple of rounds it up.
        assert_eq!(default_frame(1 << 30, 24 * MIB), 48 * MIB);
    }
}
