//! The engine's state: the shards (books under their locks), the memory store, the geometry and
//! the budget, and what the engine keeps of each open file. The operations on it live beside:
//! `room` (eviction), `pins` (faults of views), `gather`, `writeback`.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sync::{Condvar, Mutex};

use super::admission_gate::Admissions;
use super::backing::Backing;
use super::books::{key, Books, Catalog, FileCounters, FileId, FrameBudget, SlotId};
use super::directory::Directory;
use super::doorkeeper::Doorkeeper;
use super::geometry::Geometry;
use super::sticky::StickyError;
use super::store::{FileMemory, Store};
use crate::error::{Error, Result};
use crate::memory::Device;

/// What an engine is built with: its sizes, already checked (`CacheOptions` does that).
#[derive(Debug, Clone)]
pub(crate) struct EngineConfig {
    pub(crate) device: Device,
    pub(crate) geometry: Geometry,
    /// The budget, in frames.
    pub(crate) max_frames: usize,
    pub(crate) shards: usize,
    /// How long a request waits for views to unpin memory (see `CacheOptions::pin_wait`).
    pub(crate) pin_wait: Duration,
    /// Whether single-extent views go to their frames rather than to slots: a cache made to
    /// hold its one file whole (`CacheOptions::for_file`), where a slot saves no memory and
    /// slots pinned by such views would keep a view of the whole file from fitting.
    pub(crate) views_in_frames: bool,
}

/// What the engine keeps of one open file: what faults, write-backs and eviction need.
pub(crate) struct FileEntry {
    pub(crate) id: FileId,
    pub(crate) path: PathBuf,
    pub(crate) file: Backing,
    /// The local file's device and inode (`None` for a remote object): a cache holds a file
    /// writable under one entry only (see [`Engine::add_file`]).
    pub(crate) identity: Option<(u64, u64)>,
    pub(crate) writable: bool,
    pub(crate) len: u64,
    pub(crate) memory: FileMemory,
    /// The error of a failed write-back, until a `sync` writes every byte (see `writeback`).
    pub(crate) sticky: Mutex<Option<StickyError>>,
}

impl FileEntry {
    /// Whether `other` is the same local file, and either of them writable.
    fn conflicts_with(&self, other: &FileEntry) -> bool {
        self.identity.is_some()
            && self.identity == other.identity
            && (self.writable || other.writable)
    }

    /// The refusal of this entry, a second one of the file of `open`.
    fn open_twice(&self, open: &FileEntry) -> Error {
        let mode = |e: &FileEntry| if e.writable { "writable" } else { "read-only" };
        Error::InvalidArgument(format!(
            "{} ({}): the file is already open in this cache ({}, {}); two maps of one file in \
             one cache would not see each other's writes: use the map already open, or drop it \
             and its views first",
            self.path.display(),
            mode(self),
            open.path.display(),
            mode(open)
        ))
    }
}

/// The state behind one lock: the books of a shard, and the files they name (every shard
/// names every open file).
pub(crate) struct State {
    pub(crate) books: Books,
    pub(crate) files: HashMap<FileId, Arc<FileEntry>>,
}

/// One independent part of a cache: its books under their own lock, drawing on the cache's one
/// budget and the one slot arena, with its own LRU list. An extent and its frame
/// are always in the same shard (the shard of the frame), so everything the books decide about
/// one extent — where it is, one home, moves between slot and frame — stays inside one shard.
pub(crate) struct Shard {
    pub(crate) state: Mutex<State>,
    /// Signalled when loads finish and pins go in this shard.
    pub(crate) changed: Condvar,
}

/// The engine of one cache: its shards, memory and sizes. The public types (`DeviceCache`,
/// `DeviceMappedFile`, views) are faces on it.
pub(crate) struct Engine {
    pub(crate) shards: Box<[Shard]>,
    /// The id of the next file opened.
    next_file: AtomicU32,
    pub(crate) store: Store,
    pub(crate) geometry: Geometry,
    /// Nanoseconds spent mapping memory and reading missing extents, summed over threads:
    /// counters, not a lock, since every fault adds to them.
    map_nanos: AtomicU64,
    fault_nanos: AtomicU64,
    pub(crate) pin_wait: Duration,
    /// See [`EngineConfig::views_in_frames`].
    pub(crate) views_in_frames: bool,
    /// The budget in frames (the books' too; here to be read without the lock).
    pub(crate) max_frames: usize,
    /// The budget itself, shared by the shards' books: which of them holds each slot frame.
    budget: Arc<FrameBudget>,
    /// The table of resident slots the GPU's lookups read, kept from the catalog the shards'
    /// books share.
    pub(crate) directory: Directory,
    /// The background admission of rows gathers read past the full cache.
    pub(crate) admissions: Arc<Admissions>,
    /// The extents read past the full cache lately, so that admissions take those missed again.
    pub(crate) doorkeeper: Doorkeeper,
    /// Row gathers reading past the cache at this moment: they share the pool's threads.
    pub(crate) reading_through: AtomicUsize,
}

/// One file's numbers, summed over the shards (its stats, in the engine's terms).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FileNumbers {
    pub(crate) len: u64,
    pub(crate) counters: FileCounters,
    pub(crate) resident_bytes: u64,
    pub(crate) dirty_bytes: u64,
    pub(crate) frames: u64,
    pub(crate) slots: u64,
}

impl FileNumbers {
    /// Adds `other`'s counts (the same file in another shard, or another file); the length is
    /// not a count and is left alone.
    pub(crate) fn add(&mut self, other: &FileNumbers) {
        self.counters.add(&other.counters);
        self.resident_bytes += other.resident_bytes;
        self.dirty_bytes += other.dirty_bytes;
        self.frames += other.frames;
        self.slots += other.slots;
    }
}

/// The cache's numbers over the files open now.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CacheNumbers {
    pub(crate) frames_taken: u64,
    pub(crate) slots_in_use: u64,
    pub(crate) files: u64,
    pub(crate) totals: FileNumbers,
    pub(crate) map_seconds: f64,
    pub(crate) fault_seconds: f64,
}

fn nanos_since(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Engine {
    /// An engine with `config`'s sizes; its memory reserved (address ranges on a GPU), none
    /// mapped yet.
    pub(crate) fn new(config: &EngineConfig) -> Result<Engine> {
        let EngineConfig { device, geometry, max_frames, shards, pin_wait, views_in_frames } =
            config.clone();
        // Slot numbers (frame position × slots per frame) must fit in 32 bits.
        if (max_frames as u64).saturating_mul(geometry.per_frame()) > u64::from(SlotId::MAX) {
            return Err(Error::InvalidArgument(format!(
                "a budget of {max_frames} frames of {} extents: more than 2^32 slots (use larger \
                 extents)",
                geometry.per_frame()
            )));
        }
        let shard_count = u8::try_from(shards)
            .map_err(|_| Error::InvalidArgument(format!("{shards} shards: at most 255")))?;
        let budget = FrameBudget::new(max_frames);
        let catalog = Catalog::new();
        let shards = (0..shard_count)
            .map(|i| Shard {
                state: Mutex::new(State {
                    books: Books::for_shard(geometry, Arc::clone(&budget), Arc::clone(&catalog), i),
                    files: HashMap::new(),
                }),
                changed: Condvar::new(),
            })
            .collect();
        let store = Store::new(&device, geometry, max_frames)?;
        let slots = max_frames * geometry.per_frame() as usize;
        let directory = Directory::new(
            Arc::clone(&catalog),
            geometry,
            slots,
            &device,
            store.slot_arena_base(),
        )?;
        Ok(Engine {
            shards,
            next_file: AtomicU32::new(0),
            store,
            budget,
            directory,
            geometry,
            map_nanos: AtomicU64::new(0),
            fault_nanos: AtomicU64::new(0),
            pin_wait,
            views_in_frames,
            max_frames,
            admissions: Arc::default(),
            doorkeeper: Doorkeeper::new(slots),
            reading_through: AtomicUsize::new(0),
        })
    }

    /// Whether the budget has a frame left to take: no eviction is needed to make room.
    pub(crate) fn has_room(&self) -> bool {
        self.budget.has_room()
    }

    /// The number `entry`'s extents are keyed by in the directory (`key(file, e) >> 40`), or
    /// `None` where their keys do not fit: then the file is never in the directory, and every
    /// lookup of it misses.
    pub(crate) fn directory_file(&self, entry: &FileEntry) -> Option<u64> {
        let last = self.geometry.extents(entry.len).saturating_sub(1);
        let (first, _) = (key(entry.id, 0)?, key(entry.id, last)?);
        Some(first >> 40)
    }

    /// Where the engine's memory is.
    pub(crate) fn device(&self) -> Device {
        self.store.device()
    }

    /// Registers `file` (opened at `path`, `len` bytes; `identity`: its device and inode) in
    /// every shard's books; its address range is reserved on a GPU. A file already open in
    /// this cache, where either entry is writable, is refused: two entries of one file do not
    /// see each other's writes, and each writes back whole extents, stale bytes included.
    pub(crate) fn add_file(
        &self,
        path: PathBuf,
        file: Backing,
        identity: Option<(u64, u64)>,
        writable: bool,
        len: u64,
    ) -> Result<Arc<FileEntry>> {
        let memory = self.store.open_file(len)?;
        let id = self.next_file.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(FileEntry {
            id,
            path,
            file,
            identity,
            writable,
            len,
            memory,
            sticky: Mutex::new(None),
        });
        // Every shard names every file, and each registers in shard 0 first: the check there
        // and the registration are one step for concurrent opens.
        for (k, shard) in self.shards.iter().enumerate() {
            let mut state = shard.state.lock();
            if k == 0 {
                if let Some(open) = state.files.values().find(|e| e.conflicts_with(&entry)) {
                    return Err(entry.open_twice(open));
                }
            }
            state.books.add_file(id, len);
            state.files.insert(id, Arc::clone(&entry));
        }
        Ok(entry)
    }

    /// Forgets a closing file (no view of it is left): its frames are unmapped — before each
    /// shard's lock goes, so that memory in use never exceeds the budget — and its slots
    /// freed. Write-back is the caller's, before.
    pub(crate) fn remove_file(&self, entry: &FileEntry) {
        for shard in self.shards.iter() {
            let mut state = shard.state.lock();
            let frames = state.books.remove_file(entry.id);
            state.files.remove(&entry.id);
            for index in frames {
                if let Err(e) = self.store.unmap_frame(&entry.memory, index) {
                    tracing::warn!("unmapping frame {index} of a closing file failed: {e}");
                }
            }
            drop(state);
            shard.changed.notify_all();
        }
        // Anything the books no longer named (none expected).
        self.store.release_file(&entry.memory);
    }

    /// Every open file.
    pub(crate) fn entries(&self) -> Vec<Arc<FileEntry>> {
        self.shards[0].state.lock().files.values().cloned().collect()
    }

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

    /// The shard whose books hold slot `slot` (the budget knows who holds its frame).
    pub(crate) fn shard_of_slot(&self, slot: SlotId) -> usize {
        Books::shard_of_slot(&self.budget, slot, self.geometry.per_frame())
            .min(self.shards.len() - 1)
    }

    /// The shards holding frames `frames` of `file`, each with those frames, in the order of
    /// their first frame.
    pub(crate) fn shards_of_frames(
        &self,
        file: FileId,
        frames: Range<u64>,
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

    /// One file's numbers, summed over the shards (its length counted once).
    pub(crate) fn file_numbers(&self, id: FileId) -> FileNumbers {
        let mut total = FileNumbers::default();
        for shard in self.shards.iter() {
            let n = file_numbers_in(&shard.state.lock().books, id);
            total.add(&n);
            total.len = n.len;
        }
        total
    }

    /// The cache's numbers over the files open now, shard by shard (one lock at a time: a sum
    /// of moments close together, not one moment).
    pub(crate) fn cache_numbers(&self) -> CacheNumbers {
        let mut numbers = CacheNumbers::default();
        for (i, shard) in self.shards.iter().enumerate() {
            let state = shard.state.lock();
            let books = &state.books;
            for (id, file) in books.files() {
                numbers.totals.add(&file_numbers_in(books, id));
                if i == 0 {
                    // Every shard knows every file: its length is counted in one.
                    numbers.totals.len += file.len;
                }
            }
            numbers.slots_in_use += books.slots_in_use() as u64;
            numbers.files = books.files().count() as u64;
            // The budget's own count: a sum over shards read one after another could count a
            // frame twice as it moves from one shard to another.
            numbers.frames_taken = books.budget().used() as u64;
        }
        let seconds = |nanos: &AtomicU64| nanos.load(Ordering::Relaxed) as f64 / 1e9;
        numbers.map_seconds = seconds(&self.map_nanos);
        numbers.fault_seconds = seconds(&self.fault_nanos);
        numbers
    }
}

/// One file's numbers in the books of one shard.
fn file_numbers_in(books: &Books, id: FileId) -> FileNumbers {
    let Some(file) = books.file(id) else { return FileNumbers::default() };
    let (resident_bytes, dirty_bytes) = books.resident_and_dirty(id);
    let (frames, slots) = books.units_of(id);
    FileNumbers {
        len: file.len,
        counters: file.counters,
        resident_bytes,
        dirty_bytes,
        frames: frames as u64,
        slots: slots as u64,
    }
}
