//! Where a cache's bytes live: frames of GPU memory (CUDA virtual memory management), or of host
//! memory standing in for it, mapped at their place in one file's address range (file frames)
//! or cut into slots (slot frames). The store does what the books decide: it maps and unmaps
//! memory and moves bytes between files and memory; it keeps no books of its own beyond which
//! physical frame sits where.
//!
//! Physical frames are created on demand and, once unmapped, kept for reuse (a kept one is
//! mapped again without the driver call that creates it; every driver call on a frame costs
//! the same whatever its size: docs/decisions/0001-frames-by-budget.md): frames mapped plus
//! frames kept never exceed the number the books allow, so the memory held never exceeds the
//! budget.
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::sync::Mutex;

use super::backing::Backing;
use super::books::SlotId;
use super::directory::Lookups;
use super::geometry::Geometry;
use crate::error::{Error, Result};
use crate::io::FileHandle;
use crate::memory::cuda::{
    BatchCopier, CudaDevice, DeviceCopy, PhysFrame, PinnedBuffer, RawRegion, Stream, VaRange,
};
use crate::memory::host::LockedChunk;
use crate::memory::Device;

/// Loads up to this size (slots, small runs) are read on the calling thread into a pinned
/// buffer of its own and placed by a copy on its own stream (see `CudaStore::load_small`).
const SMALL_LOAD: usize = 256 << 10;

/// One file's memory: its reserved address range and mapped frames on a GPU; its frames on the
/// host.
pub(crate) enum FileMemory {
    Cuda { range: VaRange, frames: Mutex<HashMap<u64, PhysFrame>>, frame: u64 },
    Host { frames: Mutex<HashMap<u64, Arc<LockedChunk>>> },
}

/// Where one piece of an extent's bytes is, for one operation (the books keep it there with a
/// pin for as long as the operation runs).
#[derive(Clone, Copy)]
pub(crate) enum Home<'a> {
    /// At this file offset in the file's frames.
    Frame(&'a FileMemory, u64),
    /// In this slot, at this offset inside it.
    Slot(SlotId, u64),
}

/// The memory of one cache.
pub(crate) enum Store {
    Cuda(CudaStore),
    Host(HostStore),
}

pub(crate) struct CudaStore {
    device: CudaDevice,
    geometry: Geometry,
    spare: Mutex<Vec<PhysFrame>>,
    slot_arena: VaRange,
    slot_frames: Mutex<Vec<Option<PhysFrame>>>,
    copier: Arc<BatchCopier>,
    mapped: AtomicUsize,
}

pub(crate) struct HostStore {
    geometry: Geometry,
    spare: Mutex<Vec<Arc<LockedChunk>>>,
    slot_frames: Mutex<Vec<Option<Arc<LockedChunk>>>>,
    mapped: AtomicUsize,
}

impl Store {
    /// The memory of a cache of at most `max_frames` frames on `device`.
    pub(crate) fn new(device: &Device, geometry: Geometry, max_frames: usize) -> Result<Store> {
        Ok(match device {
            Device::Cuda(device) => {
                let too_large = || {
                    let frame = geometry.frame;
                    Error::InvalidArgument(format!(
                        "{max_frames} frames of {frame} bytes do not fit in an address space"
                    ))
                };
                let arena_len =
                    (max_frames as u64).checked_mul(geometry.frame).ok_or_else(too_large)?;
                Store::Cuda(CudaStore {
                    device: device.clone(),
                    geometry,
                    spare: Mutex::new(Vec::new()),
                    slot_arena: VaRange::reserve(
                        device,
                        usize::try_from(arena_len).map_err(|_| too_large())?,
                        alignment(geometry.frame),
                    )?,
                    slot_frames: Mutex::new((0..max_frames).map(|_| None).collect()),
                    copier: BatchCopier::for_device(device)?,
                    mapped: AtomicUsize::new(0),
                })
            }
            Device::Host => Store::Host(HostStore {
                geometry,
                spare: Mutex::new(Vec::new()),
                slot_frames: Mutex::new((0..max_frames).map(|_| None).collect()),
                mapped: AtomicUsize::new(0),
            }),
        })
    }

    /// The memory the store uses.
    pub(crate) fn device(&self) -> Device {
        match self {
            Store::Cuda(s) => Device::Cuda(s.device.clone()),
            Store::Host(_) => Device::Host,
        }
    }

    /// Frames mapped now (file frames and slot frames), over every shard of the cache.
    pub(crate) fn frames_mapped(&self) -> usize {
        self.mapped().load(Ordering::Relaxed)
    }

    fn mapped(&self) -> &AtomicUsize {
        match self {
            Store::Cuda(s) => &s.mapped,
            Store::Host(s) => &s.mapped,
        }
    }

    /// Whether the cache is in host memory: its copies are plain memory copies that any thread
    /// may make, where a GPU cache's are the driver's.
    pub(crate) fn in_host_memory(&self) -> bool {
        matches!(self, Store::Host(_))
    }

    /// Whether frames are separate allocations (host) rather than adjacent in one address
    /// range (GPU), so that a transfer must not cross a frame border.
    pub(crate) fn frames_apart(&self) -> bool {
        matches!(self, Store::Host(_))
    }

    /// The batched copier (GPU only).
    pub(crate) fn copier(&self) -> Option<&BatchCopier> {
        match self {
            Store::Cuda(s) => Some(&s.copier),
            Store::Host(_) => None,
        }
    }

    /// Memory for a file of `len` bytes: on a GPU, its whole address range reserved up front.
    pub(crate) fn open_file(&self, len: u64) -> Result<FileMemory> {
        Ok(match self {
            Store::Cuda(s) => {
                let frames = s.geometry.frames(len).max(1);
                let bytes = frames
                    .checked_mul(s.geometry.frame)
                    .and_then(|b| usize::try_from(b).ok())
                    .ok_or(Error::Overflow { offset: 0, len })?;
                FileMemory::Cuda {
                    range: VaRange::reserve(&s.device, bytes, alignment(s.geometry.frame))?,
                    frames: Mutex::new(HashMap::new()),
                    frame: s.geometry.frame,
                }
            }
            Store::Host(_) => FileMemory::Host { frames: Mutex::new(HashMap::new()) },
        })
    }

    /// The device address of a file's first byte (GPU only).
    pub(crate) fn base(&self, memory: &FileMemory) -> Option<u64> {
        match memory {
            FileMemory::Cuda { range, .. } => Some(range.base()),
            FileMemory::Host { .. } => None,
        }
    }

    /// Maps a frame of memory (a kept one, or a new one) as frame `index` of a file.
    pub(crate) fn map_frame(&self, memory: &FileMemory, index: u64) -> Result<()> {
        match (self, memory) {
            (Store::Cuda(s), FileMemory::Cuda { range, frames, .. }) => {
                let phys = s.take()?;
                if let Err(e) = range.map((index * s.geometry.frame) as usize, &phys) {
                    s.spare.lock().push(phys);
                    return Err(e);
                }
                frames.lock().insert(index, phys);
                self.mapped().fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            (Store::Host(s), FileMemory::Host { frames }) => {
                let chunk = s.take()?;
                frames.lock().insert(index, chunk);
                self.mapped().fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(mismatch()),
        }
    }

    /// Unmaps frame `index` of a file and keeps its memory for reuse. The books guarantee that
    /// nothing uses it.
    pub(crate) fn unmap_frame(&self, memory: &FileMemory, index: u64) -> Result<()> {
        match (self, memory) {
            (Store::Cuda(s), FileMemory::Cuda { range, frames, .. }) => {
                let Some(phys) = frames.lock().remove(&index) else { return Ok(()) };
                let offset = (index * s.geometry.frame) as usize;
                if let Err(e) = range.unmap(offset, s.geometry.frame as usize) {
                    frames.lock().insert(index, phys);
                    return Err(e);
                }
                s.spare.lock().push(phys);
                self.mapped().fetch_sub(1, Ordering::Relaxed);
                Ok(())
            }
            (Store::Host(s), FileMemory::Host { frames }) => {
                if let Some(chunk) = frames.lock().remove(&index) {
                    s.spare.lock().push(chunk);
                    self.mapped().fetch_sub(1, Ordering::Relaxed);
                }
                Ok(())
            }
            _ => Err(mismatch()),
        }
    }

    /// Unmaps every frame of a file (it is closing); failures are logged, the memory dropped.
    pub(crate) fn release_file(&self, memory: &FileMemory) {
        let indices: Vec<u64> = match memory {
            FileMemory::Cuda { frames, .. } => frames.lock().keys().copied().collect(),
            FileMemory::Host { frames } => frames.lock().keys().copied().collect(),
        };
        for index in indices {
            if let Err(e) = self.unmap_frame(memory, index) {
                tracing::warn!("unmapping frame {index} of a closing file failed: {e}");
            }
        }
    }

    /// Maps a frame of memory as the slot frame at `position` of the slot arena.
    pub(crate) fn map_slot_frame(&self, position: usize) -> Result<()> {
        match self {
            Store::Cuda(s) => {
                let phys = s.take()?;
                if let Err(e) = s.slot_arena.map(position * s.geometry.frame as usize, &phys) {
                    s.spare.lock().push(phys);
                    return Err(e);
                }
                s.slot_frames.lock()[position] = Some(phys);
                self.mapped().fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Store::Host(s) => {
                let chunk = s.take()?;
                s.slot_frames.lock()[position] = Some(chunk);
                self.mapped().fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// Unmaps the slot frame at `position` and keeps its memory. The books guarantee that no
    /// slot of it is in use.
    pub(crate) fn unmap_slot_frame(&self, position: usize) -> Result<()> {
        match self {
            Store::Cuda(s) => {
                let Some(phys) = s.slot_frames.lock()[position].take() else { return Ok(()) };
                let offset = position * s.geometry.frame as usize;
                if let Err(e) = s.slot_arena.unmap(offset, s.geometry.frame as usize) {
                    s.slot_frames.lock()[position] = Some(phys);
                    return Err(e);
                }
                s.spare.lock().push(phys);
                self.mapped().fetch_sub(1, Ordering::Relaxed);
                Ok(())
            }
            Store::Host(s) => {
                if let Some(chunk) = s.slot_frames.lock()[position].take() {
                    s.spare.lock().push(chunk);
                    self.mapped().fetch_sub(1, Ordering::Relaxed);
                }
                Ok(())
            }
        }
    }

    /// The device address of the slot arena's first byte (GPU only): slot `s` starts at
    /// `base + s * extent`.
    pub(crate) fn slot_arena_base(&self) -> Option<u64> {
        match self {
            Store::Cuda(s) => Some(s.slot_arena.base()),
            Store::Host(_) => None,
        }
    }

    /// The device address of `len` bytes at `home` (GPU only).
    pub(crate) fn region(&self, home: Home<'_>, len: usize) -> Option<RawRegion> {
        match (self, home) {
            (Store::Cuda(_), Home::Frame(FileMemory::Cuda { range, .. }, offset)) => {
                Some(range.region(offset, len))
            }
            (Store::Cuda(s), Home::Slot(slot, at)) => {
                Some(s.slot_arena.region(slot as u64 * s.geometry.extent + at, len))
            }
            _ => None,
        }
    }

    /// The host chunk and offset of `home` (host only).
    fn chunk(&self, home: Home<'_>) -> Result<(Arc<LockedChunk>, usize)> {
        let Store::Host(s) = self else { return Err(mismatch()) };
        let g = s.geometry;
        let found = match home {
            Home::Frame(FileMemory::Host { frames }, offset) => frames
                .lock()
                .get(&(offset / g.frame))
                .map(|c| (Arc::clone(c), (offset % g.frame) as usize)),
            Home::Slot(slot, at) => {
                let per = g.per_frame() as usize;
                let (position, i) = (slot as usize / per, slot as usize % per);
                s.slot_frames.lock()[position]
                    .as_ref()
                    .map(|c| (Arc::clone(c), i * g.extent as usize + at as usize))
            }
            Home::Frame(FileMemory::Cuda { .. }, _) => return Err(mismatch()),
        };
        found.ok_or_else(not_mapped)
    }

    /// Reads `len` bytes of `file` at `offset` into `home`, then zeroes what the file did not
    /// fill up to `fill` bytes (the tail of a file's last extent). Returns the count read.
    /// `min_task`: the least a task of a large load on the GPU moves (see
    /// `FileHandle::read_cuda_raw_in_tasks`); 0 spreads it over the whole pool.
    pub(crate) fn load(
        &self,
        home: Home<'_>,
        file: &Backing,
        offset: u64,
        len: usize,
        fill: usize,
        min_task: u64,
    ) -> Result<usize> {
        match self {
            Store::Cuda(s) => {
                let region = self.region(home, fill.max(len)).ok_or_else(mismatch)?;
                if region.len <= SMALL_LOAD {
                    return s.load_small(region, file, offset, len);
                }
                let got =
                    file.read_cuda_raw_in_tasks(RawRegion { len, ..region }, offset, min_task)?;
                if got < region.len {
                    region.sub(got, region.len - got)?.fill(0)?;
                }
                Ok(got)
            }
            Store::Host(_) => {
                let (chunk, at) = self.chunk(home)?;
                let mut bytes = chunk.lock(at, fill.max(len))?;
                let got = file.read_at(&mut bytes[..len], offset)?;
                bytes[got..].fill(0);
                Ok(got)
            }
        }
    }

    /// Writes `len` bytes at `home` (a file frame) to `file` at `offset`.
    pub(crate) fn write_back(
        &self,
        home: Home<'_>,
        file: &FileHandle,
        offset: u64,
        len: usize,
    ) -> Result<()> {
        match self {
            Store::Cuda(_) => {
                let region = self.region(home, len).ok_or_else(mismatch)?;
                file.write_cuda_raw(region, offset).map(|_| ())
            }
            Store::Host(_) => {
                let (chunk, at) = self.chunk(home)?;
                let bytes = chunk.lock(at, len)?;
                file.write_at(&bytes, offset).map(|_| ())
            }
        }
    }

    /// Copies `dst.len()` bytes at `home` into `dst`.
    pub(crate) fn copy_out(&self, home: Home<'_>, dst: &mut [u8]) -> Result<()> {
        match self {
            Store::Cuda(_) => {
                self.region(home, dst.len()).ok_or_else(mismatch)?.copy_to_host(0, dst)
            }
            Store::Host(_) => {
                let (chunk, at) = self.chunk(home)?;
                chunk.read_into(at, dst)
            }
        }
    }

    /// Copies `src` to `home`.
    pub(crate) fn copy_in(&self, home: Home<'_>, src: &[u8]) -> Result<()> {
        match self {
            Store::Cuda(_) => {
                self.region(home, src.len()).ok_or_else(mismatch)?.copy_from_host(0, src)
            }
            Store::Host(_) => {
                let (chunk, at) = self.chunk(home)?;
                chunk.lock(at, src.len())?.copy_from_slice(src);
                Ok(())
            }
        }
    }

    /// Copies `len` bytes from `src` to `dst` (an extent moving from its slot to its frame).
    pub(crate) fn copy_within(&self, src: Home<'_>, dst: Home<'_>, len: usize) -> Result<()> {
        match self {
            Store::Cuda(s) => {
                let from = self.region(src, len).ok_or_else(mismatch)?;
                let to = self.region(dst, len).ok_or_else(mismatch)?;
                s.copier.copy(&[DeviceCopy { src: from.ptr, dst: to.ptr, len: len as u32 }])
            }
            Store::Host(_) => {
                // Through a copy, so that no thread ever holds locks of two chunks at once.
                let mut bytes = vec![0u8; len];
                self.copy_out(src, &mut bytes)?;
                self.copy_in(dst, &bytes)
            }
        }
    }

    /// A reader of the slots that lookups under `hold` find, for as long as the hold lives.
    pub(crate) fn slot_reader<'h>(&'h self, _hold: &'h Lookups<'h>) -> HomeReader<'h> {
        self.home_reader()
    }

    /// A reader of homes the caller has pinned in the books (a round of a gather), which it
    /// must not read past its pins.
    pub(crate) fn pinned_reader(&self) -> HomeReader<'_> {
        self.home_reader()
    }

    /// A reader with nothing looked up yet; what keeps its homes in place is the caller's to
    /// hold ([`slot_reader`](Self::slot_reader), [`pinned_reader`](Self::pinned_reader)).
    fn home_reader(&self) -> HomeReader<'_> {
        HomeReader { store: self, slot_chunks: Vec::new(), frame_chunks: HashMap::new() }
    }

    /// `"GPU 0 (NVIDIA H100 PCIe)"` or `"host memory"`.
    pub(crate) fn describe(&self) -> String {
        self.device().describe()
    }
}

thread_local! {
    /// Each thread's pinned buffer per device for small loads.
    static SCRATCH: RefCell<HashMap<usize, PinnedBuffer>> = RefCell::new(HashMap::new());
}

impl CudaStore {
    /// A small load: `len` bytes of `file` at `offset` read on the calling thread into its
    /// pinned scratch buffer (zeros after what the file had, up to `region`'s length), then
    /// placed by one `cuMemcpyHtoDAsync` on the thread's own stream, waited for there.
    ///
    /// Not combined with other threads' copies into one kernel launch: that made every thread
    /// wait for a launch and its completion, where a copy on the thread's own stream waits for
    /// no one and needs no pool thread (docs/decisions/0004-small-loads-copied-per-thread.md).
    fn load_small(
        &self,
        region: RawRegion,
        file: &Backing,
        offset: u64,
        len: usize,
    ) -> Result<usize> {
        SCRATCH.with(|cell| {
            let ordinal = self.device.ordinal();
            let kept = cell.borrow_mut().remove(&ordinal);
            let mut pinned = match kept {
                Some(pinned) => pinned,
                None => PinnedBuffer::new(&self.device, SMALL_LOAD)?,
            };
            let bytes = pinned.as_mut_slice();
            let got = match file.read_at(&mut bytes[..len], offset) {
                Ok(got) => got,
                Err(e) => {
                    cell.borrow_mut().insert(ordinal, pinned);
                    return Err(e);
                }
            };
            bytes[got..region.len].fill(0);
            // The buffer moves into the copy and comes back when it is done; a failed copy
            // drops it (the next load pins another).
            let stream = Stream::for_current_thread(&self.device)?;
            let copy = stream.start_raw(
                pinned,
                0,
                region.len,
                region,
                0,
                crate::memory::cuda::CopyDirection::HostToDevice,
            )?;
            cell.borrow_mut().insert(ordinal, copy.wait()?);
            Ok(got)
        })
    }

    /// A kept physical frame, or a new one.
    fn take(&self) -> Result<PhysFrame> {
        match self.spare.lock().pop() {
            Some(frame) => Ok(frame),
            None => PhysFrame::new(&self.device, self.geometry.frame as usize),
        }
    }
}

impl HostStore {
    fn take(&self) -> Result<Arc<LockedChunk>> {
        match self.spare.lock().pop() {
            Some(chunk) => Ok(chunk),
            None => Ok(Arc::new(LockedChunk::new(
                self.geometry.frame as usize,
                self.geometry.extent as usize,
            )?)),
        }
    }
}

/// Reads of homes that stay put while it lives: slots a row gather's lookups found under its
/// hold on the directory, or homes a gather's round pinned. In host memory each frame's memory
/// is looked up once, on first use, rather than once a piece under the store's lock (which
/// every copying thread would take, and whose `Arc` counts they would share); on a GPU each
/// read is a copy by the driver, as `Store::copy_out` makes it.
///
/// Sound because what it reads stays put: a slot that a lookup under a hold found keeps its
/// frame mapped until the hold ends (`room` unmaps a slot frame only once its retiring slots
/// are reusable, which waits for every hold that could see them), and a pinned home is neither
/// evicted nor unmapped. So the memory kept for a frame stays that frame's.
pub(crate) struct HomeReader<'a> {
    store: &'a Store,
    /// Host memory: slot frames by position, filled as they are first read.
    slot_chunks: Vec<Option<Arc<LockedChunk>>>,
    /// Host memory: file frames by (the file's memory's address, frame index).
    frame_chunks: HashMap<(usize, u64), Arc<LockedChunk>>,
}

/// `len` bytes at offset `at` of a slot, as a [`HomeReader`] placed them.
#[derive(Clone, Copy)]
pub(crate) struct SlotBytes {
    slot: SlotId,
    at: u64,
    len: usize,
    /// Host memory: the slot frame's position, and the bytes' offset in its memory.
    position: usize,
    offset: usize,
}

impl SlotBytes {
    /// How many bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl HomeReader<'_> {
    /// Places `len` bytes at offset `at` of `slot`, a slot the reader may read.
    pub(crate) fn place(&mut self, slot: SlotId, at: u64, len: usize) -> Result<SlotBytes> {
        let (g, host) = match self.store {
            Store::Host(s) => (s.geometry, Some(s)),
            Store::Cuda(s) => (s.geometry, None),
        };
        if at.checked_add(len as u64).is_none_or(|end| end > g.extent) {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes at {at} of a slot of {} bytes",
                g.extent
            )));
        }
        let per = g.per_frame() as usize;
        let (position, i) = (slot as usize / per, slot as usize % per);
        let offset = i * g.extent as usize + at as usize;
        let placed = SlotBytes { slot, at, len, position, offset };
        let Some(host) = host else { return Ok(placed) };
        if self.slot_chunks.len() <= position {
            self.slot_chunks.resize(position + 1, None);
        }
        if self.slot_chunks[position].is_none() {
            let frames = host.slot_frames.lock();
            let chunk = frames.get(position).and_then(Option::as_ref).ok_or_else(not_mapped)?;
            self.slot_chunks[position] = Some(Arc::clone(chunk));
        }
        Ok(placed)
    }

    /// Starts loading `bytes` into the CPU's caches (host memory; see
    /// [`LockedChunk::prefetch`]).
    pub(crate) fn prefetch(&self, bytes: SlotBytes) {
        if let Some(Some(chunk)) = self.slot_chunks.get(bytes.position) {
            chunk.prefetch(bytes.offset, bytes.len);
        }
    }

    /// Copies `bytes` into `dst` (of their length).
    pub(crate) fn copy_slot(&self, bytes: SlotBytes, dst: &mut [u8]) -> Result<()> {
        if dst.len() != bytes.len {
            return Err(Error::InvalidArgument(format!(
                "{} bytes of a slot copied into {} bytes",
                bytes.len,
                dst.len()
            )));
        }
        match (self.store, self.slot_chunks.get(bytes.position)) {
            (Store::Cuda(_), _) => self.store.copy_out(Home::Slot(bytes.slot, bytes.at), dst),
            (Store::Host(_), Some(Some(chunk))) => chunk.read_into(bytes.offset, dst),
            (Store::Host(_), _) => {
                Err(Error::InvalidArgument("slot bytes this reader did not place".to_owned()))
            }
        }
    }

    /// Copies `dst.len()` bytes at `home` into `dst`.
    pub(crate) fn copy_out(&mut self, home: Home<'_>, dst: &mut [u8]) -> Result<()> {
        let Store::Host(host) = self.store else { return self.store.copy_out(home, dst) };
        match home {
            Home::Slot(slot, at) => {
                let bytes = self.place(slot, at, dst.len())?;
                self.copy_slot(bytes, dst)
            }
            Home::Frame(memory @ FileMemory::Host { frames }, offset) => {
                let frame = host.geometry.frame;
                let key = (std::ptr::from_ref(memory) as usize, offset / frame);
                let chunk = match self.frame_chunks.get(&key) {
                    Some(chunk) => chunk,
                    None => {
                        let found = frames.lock().get(&key.1).cloned().ok_or_else(not_mapped)?;
                        self.frame_chunks.entry(key).or_insert(found)
                    }
                };
                chunk.read_into((offset % frame) as usize, dst)
            }
            Home::Frame(FileMemory::Cuda { .. }, _) => Err(mismatch()),
        }
    }
}

fn not_mapped() -> Error {
    Error::InvalidArgument("cache memory that is not mapped".to_owned())
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Store::Cuda(s) = self {
            let positions: Vec<usize> = s
                .slot_frames
                .lock()
                .iter()
                .enumerate()
                .filter_map(|(p, f)| f.as_ref().map(|_| p))
                .collect();
            for position in positions {
                if let Err(e) = self.unmap_slot_frame(position) {
                    tracing::warn!("unmapping slot frame {position} of a cache failed: {e}");
                }
            }
        }
    }
}

impl Drop for FileMemory {
    fn drop(&mut self) {
        // The cache released the frames before dropping the memory; whatever is left (after a
        // failed unmap) is unmapped here, so that the reservation is freed empty.
        if let FileMemory::Cuda { range, frames, frame } = self {
            for (index, phys) in frames.get_mut().drain() {
                // The driver keeps the memory until it is unmapped, so dropping `phys` after a
                // failed unmap is safe.
                if let Err(e) = range.unmap((index * *frame) as usize, *frame as usize) {
                    tracing::warn!("unmapping frame {index} of a closed file failed: {e}");
                }
                drop(phys);
            }
        }
    }
}

/// The largest power of two dividing `frame` (a multiple of the granularity, so at least that).
fn alignment(frame: u64) -> usize {
    (frame & frame.wrapping_neg()) as usize
}

fn mismatch() -> Error {
    Error::InvalidArgument("cache memory of the other kind".to_owned())
}
