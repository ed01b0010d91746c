//! [`DeviceMappedFile`]: mmap semantics on the GPU.
//!
//! A file is presented as one contiguous range of device addresses, `base() + file offset`.
//! Nothing is resident at first. A [`View`] of a range faults in what is missing — the missing
//! extents coalesced into runs, each run one parallel read of the [`FileHandle`] straight into
//! the range — and pins the frames under it until it is dropped. Device memory is mapped a
//! frame (2 MiB) at a time, within a budget; under pressure the least recently used unpinned
//! frame is unmapped, after its dirty extents were written back. [`DeviceMappedFile::flush`]
//! writes every dirty extent back; [`DeviceMappedFile::sync`] also makes it durable.
//!
//! Without a GPU (or with [`Device::Host`]) host memory stands in for device memory: the same
//! books, faults and write-backs, with frames as host allocations. There is no single address
//! range then, so [`View::region`] is `None` and data moves with [`View::copy_to_host`] /
//! [`View::copy_from_host`] (which work on both backends).
//!
//! Semantics, as users of mmap expect them:
//! - A read-write map never changes the file's length: a flush writes only the bytes the file
//!   had when it was mapped. The partial last extent reads as the file's bytes, then zeros.
//! - An extent whose write-back fails stays dirty, and the error is returned.
//! - Dropping a map with dirty extents flushes them (errors are logged); [`DeviceMappedFile::close`]
//!   returns them instead.
//! - A file that shrank under the map: a fault past its new end is an error, never zeros.
//! - Device memory never exceeds the budget; a view needing more frames than the budget allows,
//!   or than are free of other views' pins, is [`Error::OutOfBudget`].
//! - Two threads faulting the same extent cause one read; views pin their frames, so eviction
//!   never takes memory from under a live view.
#![forbid(unsafe_code)]

pub(crate) mod residency;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::align::PAGE_SIZE;
use crate::error::{Error, Result};
use crate::io::{FileHandle, HandleOptions};
use crate::memory::cuda::{CudaView, FrameArena};
use crate::memory::Device;
use residency::{ExtentState, Geometry, Table, Victim};

/// Default frame size: mapping a frame costs about 35 µs whatever its size (H100, 2026-11-21:
/// 2048 frames of 2 MiB took 70 ms to map and unmap per 4 GiB, a third of a whole-file fault
/// at 24.5 GB/s; 32 MiB frames faulted at 33-37 GB/s, where a plain read into the same range ran
/// at 44). 8 MiB frames cut the calls fourfold and keep eviction reasonably fine-grained.
const DEFAULT_FRAME: u64 = 8 << 20;

/// Faults up to this size take the coalescing path (`FileHandle::pread_device`).
const SMALL_FAULT: usize = 256 << 10;

/// Allocation granularity of the host backend: the GPUs', so that both backends keep the same
/// books.
const HOST_FRAME: u64 = 2 << 20;

/// Options of a [`DeviceMappedFile`] (builder, like `memmap2::MmapOptions`).
#[derive(Debug, Clone)]
pub struct MapOptions {
    writable: bool,
    budget: Option<u64>,
    extent_size: u64,
    frame_size: Option<u64>,
    memory: Option<Device>,
    handle: Option<HandleOptions>,
}

impl Default for MapOptions {
    fn default() -> Self {
        MapOptions {
            writable: false,
            budget: None,
            extent_size: 64 << 10,
            frame_size: None,
            memory: None,
            handle: None,
        }
    }
}

impl MapOptions {
    /// Read-only, budget = the whole file up to 4 GiB, 8 MiB frames, 64 KiB extents, GPU 0 if
    /// present.
    pub fn new() -> MapOptions {
        MapOptions::default()
    }

    /// Allows writes through [`DeviceMappedFile::view_mut`] (the file is opened read-write).
    pub fn writable(&mut self, yes: bool) -> &mut Self {
        self.writable = yes;
        self
    }

    /// The most device memory the map may use, in bytes (rounded down to whole frames, at least
    /// one frame).
    pub fn budget(&mut self, bytes: u64) -> &mut Self {
        self.budget = Some(bytes);
        self
    }

    /// The unit of validity and I/O: a power of two from 4 KiB up to the frame size (2 MiB).
    /// Smaller extents read less that is not asked for; larger ones make fewer, bigger reads.
    pub fn extent_size(&mut self, bytes: u64) -> &mut Self {
        self.extent_size = bytes;
        self
    }

    /// The unit in which device memory is mapped, evicted and counted against the budget: a
    /// multiple of the GPU's allocation granularity (2 MiB); default 8 MiB. Larger frames mean
    /// fewer driver calls per byte faulted (mapping one costs about 35 µs, whatever its size)
    /// and coarser eviction.
    pub fn frame_size(&mut self, bytes: u64) -> &mut Self {
        self.frame_size = Some(bytes);
        self
    }

    /// Where the bytes live (default: [`Device::auto`], GPU 0 or host memory).
    pub fn memory(&mut self, memory: Device) -> &mut Self {
        self.memory = Some(memory);
        self
    }

    /// Options of the file handle faults and write-backs go through (threads, compat mode,
    /// O_DIRECT); default: the process defaults.
    pub fn handle_options(&mut self, options: HandleOptions) -> &mut Self {
        self.handle = Some(options);
        self
    }

    /// Maps the file at `path` (see [`DeviceMappedFile`]).
    pub fn open(&self, path: impl AsRef<Path>) -> Result<DeviceMappedFile> {
        DeviceMappedFile::open_with(path.as_ref(), self)
    }
}

/// Frames of host memory (the host backend), allocated when first mapped and kept for reuse
/// when unmapped (a fresh allocation pays a page fault per 4 KiB on first touch).
struct HostFrames {
    frames: Vec<Mutex<Option<Box<[u8]>>>>,
    spare: Mutex<Vec<Box<[u8]>>>,
    frame: u64,
}

enum Backing {
    Host(HostFrames),
    Device(FrameArena),
}

impl Backing {
    fn describe(&self) -> String {
        match self {
            Backing::Host(_) => "host memory".to_owned(),
            Backing::Device(a) => format!("GPU {} ({})", a.device().ordinal(), a.device().name()),
        }
    }

    /// Whether frames are separate allocations (host) rather than one address range (device),
    /// so that a transfer must not cross a frame border.
    fn frames_apart(&self) -> bool {
        matches!(self, Backing::Host(_))
    }

    fn map(&self, frame: usize) -> Result<()> {
        match self {
            Backing::Host(h) => {
                let bytes = match h.spare.lock().pop() {
                    Some(mut kept) => {
                        kept.fill(0);
                        kept
                    }
                    None => vec![0u8; h.frame as usize].into_boxed_slice(),
                };
                *h.frames[frame].lock() = Some(bytes);
                Ok(())
            }
            Backing::Device(a) => a.map(frame),
        }
    }

    fn unmap(&self, frame: usize) -> Result<()> {
        match self {
            Backing::Host(h) => {
                if let Some(bytes) = h.frames[frame].lock().take() {
                    h.spare.lock().push(bytes);
                }
                Ok(())
            }
            Backing::Device(a) => a.unmap(frame),
        }
    }

    /// Runs `f` on the host bytes `[offset, offset + len)` of one mapped frame.
    fn with_host<T>(
        h: &HostFrames,
        offset: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> Result<T>,
    ) -> Result<T> {
        let frame = (offset / h.frame) as usize;
        let at = (offset % h.frame) as usize;
        let mut guard = h.frames[frame].lock();
        let bytes = guard.as_deref_mut().ok_or_else(|| {
            Error::InvalidArgument(format!("frame {frame} of the map is not mapped"))
        })?;
        f(&mut bytes[at..at + len])
    }

    /// File -> memory for `[offset, offset + len)` (within one frame on the host backend); the
    /// count read.
    fn load(&self, file: &FileHandle, offset: u64, len: usize) -> Result<usize> {
        match self {
            Backing::Host(h) => Self::with_host(h, offset, len, |b| file.read(b, offset)),
            // Small reads go through the handle's coalescing futures: faults of many threads
            // in flight together share pinned buffers and host-to-device copies.
            Backing::Device(a) if len <= SMALL_FAULT => {
                file.pread_cuda_raw(a.region(offset, len), offset).wait()
            }
            Backing::Device(a) => file.read_cuda_raw(a.region(offset, len), offset),
        }
    }

    /// Memory -> file for `[offset, offset + len)` (within one frame on the host backend).
    fn store(&self, file: &FileHandle, offset: u64, len: usize) -> Result<()> {
        match self {
            Backing::Host(h) => Self::with_host(h, offset, len, |b| file.write(b, offset)),
            Backing::Device(a) => file.write_cuda_raw(a.region(offset, len), offset),
        }
        .map(|_| ())
    }

    fn copy_out(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        match self {
            Backing::Host(h) => Self::with_host(h, offset, dst.len(), |b| {
                dst.copy_from_slice(b);
                Ok(())
            }),
            Backing::Device(a) => a.region(offset, dst.len()).copy_to_host(0, dst),
        }
    }

    fn copy_in(&self, offset: u64, src: &[u8]) -> Result<()> {
        match self {
            Backing::Host(h) => Self::with_host(h, offset, src.len(), |b| {
                b.copy_from_slice(src);
                Ok(())
            }),
            Backing::Device(a) => a.region(offset, src.len()).copy_from_host(0, src),
        }
    }
}

/// What a map has done so far ([`DeviceMappedFile::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MapStats {
    /// Bytes mapped (the file's length when it was mapped).
    pub len: u64,
    /// The budget, in bytes of device memory.
    pub budget: u64,
    /// Bytes of device memory in use (mapped frames).
    pub mapped_bytes: u64,
    /// Bytes holding the file's data (clean or dirty extents).
    pub resident_bytes: u64,
    /// Bytes waiting to be written back.
    pub dirty_bytes: u64,
    /// Reads issued to fill missing extents (each a run of adjacent extents).
    pub fault_reads: u64,
    /// Bytes those reads brought in.
    pub bytes_faulted: u64,
    /// Frames unmapped to make room.
    pub evictions: u64,
    /// Bytes written back (by flushes and by evictions).
    pub bytes_written_back: u64,
    /// Seconds spent mapping and unmapping device memory (summed over threads).
    pub map_seconds: f64,
    /// Seconds spent in fault reads (summed over the threads that waited for them).
    pub fault_seconds: f64,
}

struct Shared {
    path: PathBuf,
    file: FileHandle,
    writable: bool,
    backing: Backing,
    table: Mutex<Table>,
    /// Signalled when extents finish loading and when pins are released.
    changed: Condvar,
    stats: Mutex<MapStats>,
}

/// A file mapped into device memory (see the [module docs](self)).
///
/// ```no_run
/// use gpumap::mapped::MapOptions;
/// let map = MapOptions::new().budget(256 << 20).open("weights.bin")?;
/// let view = map.view(4096, 1 << 20)?;          // faults in what is missing, pins it
/// if let Some(region) = view.region() {          // device memory, for kernels
///     println!("{:#x}", region.ptr());
/// }
/// let mut first = [0u8; 16];
/// view.copy_to_host(0, &mut first)?;
/// # Ok::<(), gpumap::Error>(())
/// ```
#[derive(Clone)]
pub struct DeviceMappedFile {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DeviceMappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMappedFile")
            .field("path", &self.shared.path)
            .field("len", &self.len())
            .field("writable", &self.shared.writable)
            .field("memory", &self.shared.backing.describe())
            .finish()
    }
}

impl DeviceMappedFile {
    /// Maps `path` read-only with the default [`MapOptions`].
    pub fn open(path: impl AsRef<Path>) -> Result<DeviceMappedFile> {
        MapOptions::new().open(path)
    }

    fn open_with(path: &Path, options: &MapOptions) -> Result<DeviceMappedFile> {
        let extent = options.extent_size;
        let device = match options.memory.clone().unwrap_or_else(Device::auto) {
            Device::Host => None,
            Device::Cuda(d) => Some(d),
        };
        let granularity = match &device {
            Some(d) => FrameArena::granularity(d)? as u64,
            None => HOST_FRAME,
        };
        let frame = options.frame_size.unwrap_or(DEFAULT_FRAME.next_multiple_of(granularity));
        if frame == 0 || !frame.is_multiple_of(granularity) {
            return Err(Error::InvalidArgument(format!(
                "frame size {frame}: expected a multiple of the allocation granularity \
                 {granularity}"
            )));
        }
        if !extent.is_power_of_two()
            || extent < PAGE_SIZE
            || extent > frame
            || !frame.is_multiple_of(extent)
        {
            return Err(Error::InvalidArgument(format!(
                "extent size {extent}: expected a power of two from {PAGE_SIZE} to the frame \
                 size {frame}, dividing it"
            )));
        }
        let handle_options = match &options.handle {
            Some(o) => o.clone(),
            None => FileHandle::options()?,
        };
        let file = handle_options.open(path, if options.writable { "r+" } else { "r" })?;
        let len = file.len()?;
        let geometry = Geometry { len, frame, extent };
        let budget = options.budget.unwrap_or_else(|| len.min(4 << 30));
        let max_frames = ((budget / frame) as usize).max(1);
        let backing = match device {
            Some(d) => Backing::Device(FrameArena::new(&d, geometry.frames(), frame as usize)?),
            None => Backing::Host(HostFrames {
                frames: (0..geometry.frames()).map(|_| Mutex::new(None)).collect(),
                spare: Mutex::new(Vec::new()),
                frame,
            }),
        };
        let stats = MapStats { len, budget: max_frames as u64 * frame, ..MapStats::default() };
        Ok(DeviceMappedFile {
            shared: Arc::new(Shared {
                path: path.to_path_buf(),
                file,
                writable: options.writable,
                backing,
                table: Mutex::new(Table::new(geometry, max_frames)),
                changed: Condvar::new(),
                stats: Mutex::new(stats),
            }),
        })
    }

    /// Bytes mapped: the file's length when it was mapped.
    pub fn len(&self) -> u64 {
        self.shared.table.lock().geometry().len
    }

    /// Whether the mapped file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes per frame, the unit in which device memory is mapped, evicted and budgeted (8 MiB
    /// by default; see [`MapOptions::frame_size`]).
    pub fn frame_size(&self) -> u64 {
        self.shared.table.lock().geometry().frame
    }

    /// The path mapped.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Where the bytes live, in words ("GPU 0 (NVIDIA H100 ...)" or "host memory").
    pub fn memory(&self) -> String {
        self.shared.backing.describe()
    }

    /// The device address of file offset 0, on the CUDA backend (`base() + offset` is the
    /// device address of any offset, resident or not); `None` on the host backend.
    pub fn base(&self) -> Option<u64> {
        match &self.shared.backing {
            Backing::Device(a) => Some(a.base()),
            Backing::Host(_) => None,
        }
    }

    /// The file handle faults and write-backs go through.
    pub fn file(&self) -> &FileHandle {
        &self.shared.file
    }

    /// Makes `[offset, offset + len)` resident and pins it until the view is dropped.
    pub fn view(&self, offset: u64, len: u64) -> Result<View> {
        self.acquire(offset, len, false)
    }

    /// Like [`view`](Self::view), for writing: the range's extents are marked dirty (the map
    /// cannot see what a kernel writes, so it takes the view as a write). Needs a writable map.
    pub fn view_mut(&self, offset: u64, len: u64) -> Result<View> {
        if !self.shared.writable {
            return Err(Error::AccessMode {
                path: self.shared.path.clone(),
                mode: "r".to_owned(),
                op: "a writable view (map with MapOptions::writable(true))",
            });
        }
        self.acquire(offset, len, true)
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`, faulting in what is missing.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.view(offset, dst.len() as u64)?.copy_to_host(0, dst)
    }

    /// Copies `src` to `offset`, faulting in what is missing; the bytes reach the file at the
    /// next flush (or eviction).
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.view_mut(offset, src.len() as u64)?.copy_from_host(0, src)
    }

    /// Writes every dirty extent back and waits: when it returns `Ok`, the file (through the
    /// page cache, or the disk with O_DIRECT) holds everything written before the call. Not
    /// durable against a crash: see [`sync`](Self::sync).
    pub fn flush(&self) -> Result<()> {
        self.flush_range(0, self.len())
    }

    /// Like [`flush`](Self::flush) for the extents overlapping `[offset, offset + len)`.
    pub fn flush_range(&self, offset: u64, len: u64) -> Result<()> {
        let extents = {
            let table = self.shared.table.lock();
            check_range(table.geometry(), offset, len)?;
            table.geometry().extents_covering(offset, len)
        };
        self.shared.write_back(extents)
    }

    /// [`flush`](Self::flush), then `fdatasync`: when it returns `Ok`, the data survive a crash.
    pub fn sync(&self) -> Result<()> {
        self.flush()?;
        self.shared.file.sync_data()
    }

    /// Flushes and unmaps, returning the flush's error (dropping the map logs it instead).
    pub fn close(self) -> Result<()> {
        if self.shared.writable {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes back what is dirty, then gives up the memory of every frame no view pins (the
    /// map keeps it for its next faults); the next view of those ranges reads them again.
    /// Like `POSIX_FADV_DONTNEED` for the map.
    pub fn evict(&self) -> Result<()> {
        if self.shared.writable {
            self.flush()?;
        }
        let mut table = self.shared.table.lock();
        while let Victim::Clean(frame) = table.victim() {
            self.shared.backing.unmap(frame)?;
            table.mark_unmapped(frame);
        }
        Ok(())
    }

    /// What the map has done so far.
    pub fn stats(&self) -> MapStats {
        let table = self.shared.table.lock();
        let geometry = *table.geometry();
        let mut stats = *self.shared.stats.lock();
        let bytes = |n: usize| (n as u64 * geometry.extent).min(geometry.len);
        stats.mapped_bytes = table.mapped_frames() as u64 * geometry.frame;
        stats.resident_bytes =
            bytes(table.count(ExtentState::Clean) + table.count(ExtentState::Dirty));
        stats.dirty_bytes = bytes(table.count(ExtentState::Dirty));
        stats.evictions = table.counters.evictions;
        stats
    }

    fn acquire(&self, offset: u64, len: u64, write: bool) -> Result<View> {
        let shared = &self.shared;
        let mut table = shared.table.lock();
        let geometry = *table.geometry();
        check_range(&geometry, offset, len)?;
        let frames = geometry.frames_covering(offset, len);
        if frames.len() > table.max_frames() {
            return Err(Error::OutOfBudget {
                requested: frames.len() as u64 * geometry.frame,
                budget: table.max_frames() as u64 * geometry.frame,
                in_use: table.mapped_frames() as u64 * geometry.frame,
            });
        }
        let mut pinned = Vec::with_capacity(frames.len());
        let result = self.map_and_pin(&mut table, frames.clone(), &mut pinned);
        let result =
            result.and_then(|()| self.fault_in(&mut table, geometry.extents_covering(offset, len)));
        if let Err(e) = result {
            for f in pinned {
                table.unpin(f);
            }
            shared.changed.notify_all();
            return Err(e);
        }
        if write {
            table.mark_dirty(geometry.extents_covering(offset, len));
        }
        Ok(View { map: self.clone(), offset, len, frames })
    }

    /// Maps (evicting where needed) and pins every frame of `frames`; `pinned` lists the
    /// frames pinned so far, so the caller can undo a failure.
    ///
    /// Mapping memory costs a driver call per frame (about 35 µs), and the driver serialises
    /// them: calling from several threads at once was slower on the H100 (12-20 GB/s faulting
    /// a warm file with 2 MiB frames, against 24.5 one after another). So the frames a view
    /// lacks are mapped one after another with the table locked, after the victims making
    /// room for all of them were unmapped.
    fn map_and_pin(
        &self,
        table: &mut MutexGuard<'_, Table>,
        frames: Range<usize>,
        pinned: &mut Vec<usize>,
    ) -> Result<()> {
        let backing = &self.shared.backing;
        'again: loop {
            // Pin what is mapped, so that it cannot be chosen to make room; list the rest.
            let mut missing = Vec::new();
            for f in frames.clone() {
                if !table.is_mapped(f) {
                    missing.push(f);
                } else if !pinned.contains(&f) {
                    table.pin(f);
                    table.touch(f);
                    pinned.push(f);
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            // Make room: clean victims leave the books at once and their memory goes below,
            // all together; a dirty victim is written back first, with the table unlocked,
            // after which everything is looked at again.
            let mut unmap = Vec::new();
            let mut write_back = None;
            while table.max_frames() - table.mapped_frames() < missing.len() {
                match table.victim() {
                    Victim::Clean(v) => {
                        table.mark_unmapped(v);
                        unmap.push(v);
                    }
                    Victim::Dirty(v) => {
                        write_back = Some(v);
                        break;
                    }
                    Victim::None => break,
                }
            }
            self.timed(|| unmap.into_iter().try_for_each(|f| backing.unmap(f)))?;
            if let Some(v) = write_back {
                // Pinned while its bytes go out, so no one else evicts it meanwhile.
                table.pin(v);
                let extents = {
                    let per = table.geometry().extents_per_frame();
                    (v * per)..((v + 1) * per).min(table.geometry().extents())
                };
                let result = MutexGuard::unlocked(table, || self.shared.write_back(extents));
                table.unpin(v);
                result?;
                continue 'again;
            }
            if table.max_frames() - table.mapped_frames() < missing.len() {
                // Every other mapped frame is pinned (by views, or by this view).
                let frame = table.geometry().frame;
                return Err(Error::OutOfBudget {
                    requested: (pinned.len() + missing.len()) as u64 * frame,
                    budget: table.max_frames() as u64 * frame,
                    in_use: table.mapped_frames() as u64 * frame,
                });
            }
            let result = self.timed(|| {
                missing.into_iter().try_for_each(|f| {
                    backing.map(f)?;
                    table.mark_mapped(f);
                    Ok(())
                })
            });
            result?;
        }
    }

    /// Runs `f`, adding its time to [`MapStats::map_seconds`].
    fn timed<T>(&self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        self.shared.stats.lock().map_seconds += t.elapsed().as_secs_f64();
        out
    }

    /// Brings every extent of `extents` in (their frames are mapped and pinned): claims the
    /// absent ones and reads them, and waits for those others are reading.
    fn fault_in(&self, table: &mut MutexGuard<'_, Table>, extents: Range<usize>) -> Result<()> {
        loop {
            let claimed = table.claim_absent(extents.clone());
            if !claimed.is_empty() {
                let geometry = *table.geometry();
                let t = Instant::now();
                let result = MutexGuard::unlocked(table, || self.shared.load(&geometry, &claimed));
                self.shared.stats.lock().fault_seconds += t.elapsed().as_secs_f64();
                table.finish_load(&claimed, result.is_ok());
                self.shared.changed.notify_all();
                result?;
                continue;
            }
            if !table.any_loading(extents.clone()) {
                return Ok(());
            }
            self.shared.changed.wait(table);
        }
    }
}

impl Shared {
    /// Reads the runs of `extents` (sorted) from the file, in parallel on the file's pool. On
    /// the device, frames are adjacent in the address range, so a run spans as many frames as
    /// it covers and goes through the pipelined device read whole.
    fn load(&self, geometry: &Geometry, extents: &[usize]) -> Result<()> {
        let runs = geometry.runs(extents, self.backing.frames_apart());
        self.file.pool().run(runs, |(offset, len)| {
            let got = self.backing.load(&self.file, offset, len as usize)?;
            if (got as u64) < len {
                // The file shrank under the map: what it no longer has is an error, not zeros.
                return Err(Error::UnexpectedEof { offset, wanted: len, got: got as u64 });
            }
            let mut stats = self.stats.lock();
            stats.fault_reads += 1;
            stats.bytes_faulted += len;
            Ok(got)
        })?;
        Ok(())
    }

    /// Writes the dirty extents of `extents` back, runs in parallel on the file's pool;
    /// extents whose write failed stay dirty, and the first error is returned.
    fn write_back(&self, extents: Range<usize>) -> Result<()> {
        let (dirty, geometry) = {
            let mut table = self.table.lock();
            let dirty = table.dirty_in(extents);
            let geometry = *table.geometry();
            // Pinned while they are written, so they cannot be evicted meanwhile.
            for f in frames_of(&geometry, &dirty) {
                table.pin(f);
            }
            (dirty, geometry)
        };
        let indices: Vec<usize> = dirty.iter().map(|&(e, _)| e).collect();
        let runs = geometry.runs(&indices, self.backing.frames_apart());
        let written = Mutex::new(Vec::with_capacity(dirty.len()));
        let result = self.file.pool().run(runs, |(offset, len)| {
            self.backing.store(&self.file, offset, len as usize)?;
            let extents = geometry.extents_covering(offset, len);
            let first = dirty.partition_point(|&(e, _)| e < extents.start);
            let last = dirty.partition_point(|&(e, _)| e < extents.end);
            written.lock().extend_from_slice(&dirty[first..last]);
            self.stats.lock().bytes_written_back += len;
            Ok(len as usize)
        });
        let mut table = self.table.lock();
        table.finish_writeback(&written.into_inner());
        for f in frames_of(&geometry, &dirty) {
            table.unpin(f);
        }
        drop(table);
        self.changed.notify_all();
        result.map(|_| ())
    }
}

/// The distinct frames of `extents` (sorted by extent).
fn frames_of(geometry: &Geometry, extents: &[(usize, u32)]) -> Vec<usize> {
    let mut frames: Vec<usize> = extents.iter().map(|&(e, _)| geometry.frame_of(e)).collect();
    frames.dedup();
    frames
}

fn check_range(geometry: &Geometry, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= geometry.len => Ok(()),
        Some(_) => Err(Error::OutOfRange { offset, len, file_len: geometry.len }),
        None => Err(Error::Overflow { offset, len }),
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The last handle and the last view are gone: write back what is dirty. Errors can
        // only be logged here; `close` returns them.
        if self.writable && self.table.lock().count(ExtentState::Dirty) > 0 {
            let extents = 0..self.table.lock().geometry().extents();
            if let Err(e) = self.write_back(extents) {
                tracing::warn!("flushing {} on drop failed: {e}", self.path.display());
            }
        }
    }
}

/// A resident, pinned range of a [`DeviceMappedFile`]; unpinned when dropped.
pub struct View {
    map: DeviceMappedFile,
    offset: u64,
    len: u64,
    frames: Range<usize>,
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

    /// The view's device memory (CUDA backend), valid while the view lives; `None` on the host
    /// backend.
    pub fn region(&self) -> Option<CudaView<'_>> {
        match &self.map.shared.backing {
            Backing::Device(a) => {
                Some(CudaView::assume_valid(a.region(self.offset, self.len as usize)))
            }
            Backing::Host(_) => None,
        }
    }

    /// Copies `dst.len()` bytes from `at` (relative to the view) into `dst`.
    pub fn copy_to_host(&self, at: u64, dst: &mut [u8]) -> Result<()> {
        self.pieces(at, dst.len() as u64, |offset, range| {
            self.map.shared.backing.copy_out(offset, &mut dst[range])
        })
    }

    /// Copies `src` to `at` (relative to the view). The view must come from
    /// [`DeviceMappedFile::view_mut`].
    pub fn copy_from_host(&self, at: u64, src: &[u8]) -> Result<()> {
        self.pieces(at, src.len() as u64, |offset, range| {
            self.map.shared.backing.copy_in(offset, &src[range])
        })
    }

    /// Calls `f(map offset, range of the caller's buffer)` for each frame-sized piece of
    /// `[at, at + len)` of the view.
    fn pieces(
        &self,
        at: u64,
        len: u64,
        mut f: impl FnMut(u64, Range<usize>) -> Result<()>,
    ) -> Result<()> {
        match at.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => return Err(Error::OutOfRange { offset: at, len, file_len: self.len }),
        }
        let frame = self.map.shared.table.lock().geometry().frame;
        let mut done = 0u64;
        while done < len {
            let offset = self.offset + at + done;
            let n = (frame - offset % frame).min(len - done);
            f(offset, done as usize..(done + n) as usize)?;
            done += n;
        }
        Ok(())
    }
}

impl Drop for View {
    fn drop(&mut self) {
        let shared = &self.map.shared;
        let mut table = shared.table.lock();
        for f in self.frames.clone() {
            table.unpin(f);
        }
        drop(table);
        shared.changed.notify_all();
    }
}
