//! The books of a cache: which memory holds which extents of which files, in what state, who
//! pins what, and in what order memory was used. No I/O and no driver calls: the cache asks the
//! books what to do, does the slow part (mapping memory, reading, writing) and reports back.
//!
//! Memory comes in *frames* (the budget is a number of them), used in two ways:
//! - a **file frame** is mapped at its place in one file's address range, so that a view of any
//!   range of the file is one contiguous piece of memory (`base + offset`). Its extents are
//!   absent, being read in, clean, or dirty; only file frames hold dirty bytes.
//! - a **slot frame** is cut into slots of one extent each, holding clean extents of any file
//!   wherever they fall: random access to a file much larger than the budget then costs an
//!   extent of memory per extent touched, not a frame.
//!
//! An extent's bytes live in at most one place that new requests see: its file frame (when that
//! frame is mapped and the extent is loading or valid there) or one slot. When a file frame is
//! mapped over extents that slots hold, those stay in their slots until a request for the frame
//! copies them over ([`Books::claim_moves`]); a slot superseded while a caller still reads it is
//! *stale*: kept until unpinned, found by no one.
//!
//! Units (file frames and slots) that no one pins sit in one least-recently-used list across
//! all files; pinning takes a unit out of it, unpinning puts it back as the most recent. The
//! victim of an eviction is the least recently used unit, clean ones before dirty ones, and
//! frames read ahead and not yet viewed only when no other clean unit can go.
#![forbid(unsafe_code)]

use std::collections::HashMap as StdHashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::geometry::Geometry;

/// The books' maps are keyed by small integers (file ids, frame and extent indices) that no one
/// outside chooses: a multiply-and-rotate hash serves them in a nanosecond, where SipHash's
/// flooding resistance costs twenty — and a gather looks up several per row under the lock.
#[derive(Default, Clone, Copy)]
pub(crate) struct IndexHasher(u64);

impl Hasher for IndexHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(26);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A map keyed by the cache's own small integers, hashed by [`IndexHasher`].
pub(crate) type IndexHashMap<K, V> = StdHashMap<K, V, BuildHasherDefault<IndexHasher>>;
type HashMap<K, V> = IndexHashMap<K, V>;

/// A file's number in its cache.
pub(crate) type FileId = u32;
/// A slot's number: its slot frame's position in the cache's slot arena times the slots per
/// frame, plus its index (unique across the shards of a cache, whose books each own a stretch
/// of the arena).
pub(crate) type SlotId = u32;

/// A unit of memory that can be pinned and evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Unit {
    /// Frame `index` of file `file`.
    Frame { file: FileId, index: u64 },
    /// A slot.
    Slot(SlotId),
}

/// What an extent of a mapped file frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtentState {
    /// Nothing valid.
    Absent,
    /// One caller is reading it in; others wait for it (single flight).
    Loading,
    /// The file's bytes.
    Clean,
    /// Bytes newer than the file's, to be written back.
    Dirty,
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Nothing; on the free list.
    Free,
    /// One caller is reading its extent in.
    Loading,
    /// Its extent's bytes (slots are never dirty).
    Clean,
    /// Superseded by the extent's file frame while pinned; freed when unpinned.
    Stale,
}

/// Where an extent's bytes are, as new requests see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Location {
    /// Its file frame is mapped and holds it in this state (`Absent`: mapped, nothing there).
    Frame(ExtentState),
    /// This slot holds it (loading or clean).
    Slot(SlotId, SlotState),
    /// Nowhere: its frame is not mapped and no slot holds it.
    Nowhere,
}

/// What to give up to make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Victim {
    /// A file frame with nothing dirty: unmap it.
    CleanFrame { file: FileId, index: u64 },
    /// A file frame with dirty extents: write them back, then look again.
    DirtyFrame { file: FileId, index: u64 },
    /// A clean slot no one pins: reuse it.
    Slot(SlotId),
    /// A slot frame with no slot in use by a caller: release it (its clean slots go).
    SlotFrame(usize),
    /// Everything is pinned or being read in.
    None,
}

/// What a request needs room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// A frame of memory (a file frame, or a new slot frame).
    Frame,
    /// One slot.
    Slot,
}

/// What happened to one file, for its stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FileCounters {
    /// Extents asked for that were resident.
    pub(crate) hits: u64,
    /// Extents asked for that had to be read.
    pub(crate) misses: u64,
    /// Reads issued to fill missing extents.
    pub(crate) fault_reads: u64,
    /// Bytes those reads brought in.
    pub(crate) bytes_faulted: u64,
    /// Units of this file given up to make room (or by `evict`).
    pub(crate) evictions: u64,
    /// Bytes written back.
    pub(crate) bytes_written_back: u64,
    /// Write-backs that failed.
    pub(crate) write_errors: u64,
}

impl FileCounters {
    /// Adds every counter of `delta`.
    pub(crate) fn add(&mut self, delta: &FileCounters) {
        self.hits += delta.hits;
        self.misses += delta.misses;
        self.fault_reads += delta.fault_reads;
        self.bytes_faulted += delta.bytes_faulted;
        self.evictions += delta.evictions;
        self.bytes_written_back += delta.bytes_written_back;
        self.write_errors += delta.write_errors;
    }
}

const NIL: u32 = u32::MAX;

/// The frames of memory a cache may use, shared by the books of all its shards: any shard maps
/// a frame while the cache as a whole is under its budget, and evicts its own units when it is
/// not. Fixed shares per shard made a shard whose share views pinned wait — into
/// `OutOfBudget` after the pin wait — while others had room (issue 20's stress pathology).
#[derive(Debug)]
pub(crate) struct FrameBudget {
    max: usize,
    used: AtomicUsize,
}

impl FrameBudget {
    /// A budget of `max` frames, none in use.
    pub(crate) fn new(max: usize) -> Arc<FrameBudget> {
        Arc::new(FrameBudget { max, used: AtomicUsize::new(0) })
    }

    /// Frames in the budget.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Frames in use (or taken and about to be), over every shard.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Whether a frame is free now (a hint: [`try_take`](Self::try_take) decides).
    pub(crate) fn has_room(&self) -> bool {
        self.used() < self.max
    }

    /// Takes a frame of the budget, if one is free: the caller maps it and records it
    /// ([`Books::add_frame`], [`Books::add_slot_frame`]), or gives it back.
    pub(crate) fn try_take(&self) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| (n < self.max).then_some(n + 1))
            .is_ok()
    }

    /// Gives a frame back.
    pub(crate) fn give_back(&self) {
        let _ = self.used.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

#[derive(Debug, Clone, Copy)]
struct Extent {
    state: ExtentState,
    /// Bumped whenever the extent is made dirty: a write-back that started before a newer write
    /// must not mark it clean.
    version: u32,
    /// A write-back of it is in flight: no other may start (their writes could land in either
    /// order, an older one's bytes last).
    writing: bool,
}

#[derive(Debug)]
struct FileFrame {
    extents: Box<[Extent]>,
    /// Views and operations using the frame; a pinned frame is never evicted.
    pins: u32,
    /// Live writable views over the frame: while any is live, its extents stay dirty whatever
    /// is written back.
    writers: u32,
    /// Its node in the LRU list, when unpinned.
    lru: u32,
    /// Its dirty bytes are going out so that its memory can be given up: new requests wait
    /// for it to go (see [`Books::begin_eviction`]).
    evicting: bool,
    /// Read ahead and not yet pinned by a view: evicted only when no other clean unit can go
    /// (see [`Books::mark_read_ahead`]).
    ahead: bool,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    state: SlotState,
    owner: (FileId, u64),
    pins: u32,
    lru: u32,
    in_free_list: bool,
}

#[derive(Debug)]
struct SlotFrame {
    slots: Box<[Slot]>,
    /// Slots that are not free.
    used: u32,
    /// Slots someone pins.
    busy: u32,
}

/// One file's part of the books.
#[derive(Debug)]
pub(crate) struct FileBooks {
    /// Bytes mapped: the file's length when it was opened.
    pub(crate) len: u64,
    frames: HashMap<u64, FileFrame>,
    /// Extent -> the slot holding it (loading or clean).
    slots: HashMap<u64, SlotId>,
    pub(crate) counters: FileCounters,
}

/// An intrusive least-recently-used list of units over a slab of nodes: O(1) to add, remove
/// and find the oldest, a unit and two 32-bit links a node, no hashing.
#[derive(Debug, Default)]
struct Lru {
    nodes: Vec<(Unit, u32, u32)>, // (unit, towards older, towards newer)
    free: Vec<u32>,
    newest: u32,
    oldest: u32,
    len: usize,
}

impl Lru {
    fn new() -> Lru {
        Lru { newest: NIL, oldest: NIL, ..Lru::default() }
    }

    /// Adds `unit` as the newest; returns its node.
    fn push(&mut self, unit: Unit) -> u32 {
        let node = (unit, self.newest, NIL);
        let handle = match self.free.pop() {
            Some(h) => {
                self.nodes[h as usize] = node;
                h
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if self.newest != NIL {
            self.nodes[self.newest as usize].2 = handle;
        } else {
            self.oldest = handle;
        }
        self.newest = handle;
        self.len += 1;
        handle
    }

    fn remove(&mut self, handle: u32) {
        let (_, older, newer) = self.nodes[handle as usize];
        if older != NIL {
            self.nodes[older as usize].2 = newer;
        } else {
            self.oldest = newer;
        }
        if newer != NIL {
            self.nodes[newer as usize].1 = older;
        } else {
            self.newest = older;
        }
        self.free.push(handle);
        self.len -= 1;
    }

    /// Drops the oldest nodes, `nodes` (oldest first), whose next newer one is `rest`.
    fn cut_oldest(&mut self, nodes: impl Iterator<Item = u32>, rest: u32) {
        for node in nodes {
            self.free.push(node);
            self.len -= 1;
        }
        self.oldest = rest;
        if rest == NIL {
            self.newest = NIL;
        } else {
            self.nodes[rest as usize].1 = NIL;
        }
    }

    /// Units from the oldest to the newest.
    fn oldest_first(&self) -> impl Iterator<Item = Unit> + '_ {
        let mut at = self.oldest;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let (unit, _, newer) = self.nodes[at as usize];
            at = newer;
            Some(unit)
        })
    }
}

/// The books of one cache (see the module docs).
#[derive(Debug)]
pub(crate) struct Books {
    geometry: Geometry,
    /// The cache's budget, shared with the other shards' books.
    budget: Arc<FrameBudget>,
    /// Frames these books hold (file frames and slot frames).
    frames_in_use: usize,
    files: HashMap<FileId, FileBooks>,
    /// The first position of the slot arena these books own (`slot_frames[0]`'s): a stretch
    /// as long as the whole budget, since one shard may hold all of it.
    first_position: usize,
    /// By position in the slot arena (from `first_position`); `None` where no frame is mapped.
    slot_frames: Vec<Option<SlotFrame>>,
    empty_slot_frames: usize,
    free_slots: Vec<SlotId>,
    lru: Lru,
    /// Pins held by the cache's own operations (reads, gathers, write-backs), which end without
    /// any caller's help: a request that finds everything pinned waits for these, and fails at
    /// once when every pin is a caller's view.
    transient_pins: usize,
    /// Kept between calls of [`evict_oldest_slots`](Self::evict_oldest_slots): no allocation
    /// under the lock.
    scratch: Vec<(u32, SlotId)>,
    /// The next id [`new_file`](Self::new_file) gives (tests number files themselves).
    #[cfg(test)]
    next_test_file: FileId,
}

impl Books {
    /// Empty books for `geometry` with a budget of their own of `max_frames` frames, owning the
    /// slot arena's positions from 0.
    #[cfg(test)]
    pub(crate) fn new(geometry: Geometry, max_frames: usize) -> Books {
        Books::with_arena(geometry, FrameBudget::new(max_frames), 0)
    }

    /// Empty books for `geometry` drawing on `budget` (shared with other shards' books), owning
    /// the slot arena's positions `first_position..first_position + budget.max()`.
    pub(crate) fn with_arena(
        geometry: Geometry,
        budget: Arc<FrameBudget>,
        first_position: usize,
    ) -> Books {
        let positions = budget.max();
        Books {
            geometry,
            budget,
            frames_in_use: 0,
            files: HashMap::default(),
            first_position,
            slot_frames: (0..positions).map(|_| None).collect(),
            empty_slot_frames: 0,
            free_slots: Vec::new(),
            lru: Lru::new(),
            transient_pins: 0,
            scratch: Vec::new(),
            #[cfg(test)]
            next_test_file: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Frames of memory these books hold (file frames and slot frames).
    #[cfg(test)]
    pub(crate) fn frames_in_use(&self) -> usize {
        self.frames_in_use
    }

    /// Whether another frame fits in the cache's budget (a hint; see [`FrameBudget`]).
    pub(crate) fn has_room(&self) -> bool {
        self.budget.has_room()
    }

    /// The cache's budget, which these books share with the other shards'.
    pub(crate) fn budget(&self) -> &FrameBudget {
        &self.budget
    }

    pub(crate) fn transient_pins(&self) -> usize {
        self.transient_pins
    }

    // ---- files --------------------------------------------------------------------------

    /// Registers file `id` (numbered by the cache) of `len` bytes.
    pub(crate) fn add_file(&mut self, id: FileId, len: u64) {
        self.files.insert(
            id,
            FileBooks {
                len,
                frames: HashMap::default(),
                slots: HashMap::default(),
                counters: FileCounters::default(),
            },
        );
    }

    /// Registers a file of `len` bytes under a new id.
    #[cfg(test)]
    pub(crate) fn new_file(&mut self, len: u64) -> FileId {
        let id = self.next_test_file;
        self.next_test_file += 1;
        self.add_file(id, len);
        id
    }

    /// Forgets a file no one pins: its slots become free, and its mapped frames are returned
    /// for the caller to unmap (they no longer count against the budget).
    pub(crate) fn remove_file(&mut self, file: FileId) -> Vec<u64> {
        let Some(books) = self.files.remove(&file) else { return Vec::new() };
        let mut frames = Vec::with_capacity(books.frames.len());
        for (index, frame) in books.frames {
            if frame.lru != NIL {
                self.lru.remove(frame.lru);
            }
            self.frames_in_use -= 1;
            self.budget.give_back();
            frames.push(index);
        }
        for (_, slot) in books.slots {
            self.release_slot(slot);
        }
        frames
    }

    pub(crate) fn file(&self, file: FileId) -> Option<&FileBooks> {
        self.files.get(&file)
    }

    pub(crate) fn counters_mut(&mut self, file: FileId) -> Option<&mut FileCounters> {
        self.files.get_mut(&file).map(|f| &mut f.counters)
    }

    /// The files, for totals.
    pub(crate) fn files(&self) -> impl Iterator<Item = (FileId, &FileBooks)> {
        self.files.iter().map(|(&id, books)| (id, books))
    }

    // ---- where extents are --------------------------------------------------------------

    /// Where extent `e` of `file` is, as a new request sees it. The extents of a frame being
    /// evicted look `Loading` (wait, then look again) unless a slot holds them.
    pub(crate) fn locate(&self, file: FileId, e: u64) -> Location {
        let Some(books) = self.files.get(&file) else { return Location::Nowhere };
        let frame = books.frames.get(&self.geometry.frame_of(e));
        let in_frame = frame.map(|f| match f.extents[self.geometry.within_frame(e)].state {
            ExtentState::Absent => ExtentState::Absent,
            _ if f.evicting => ExtentState::Loading,
            state => state,
        });
        match (in_frame, books.slots.get(&e)) {
            (Some(state), _) if state != ExtentState::Absent => Location::Frame(state),
            (_, Some(&slot)) => Location::Slot(slot, self.slot(slot).state),
            (Some(_), None) if frame.is_some_and(|f| f.evicting) => {
                Location::Frame(ExtentState::Loading)
            }
            (Some(state), None) => Location::Frame(state),
            (None, None) => Location::Nowhere,
        }
    }

    /// Whether frame `index` of `file` is mapped.
    pub(crate) fn is_mapped(&self, file: FileId, index: u64) -> bool {
        self.files.get(&file).is_some_and(|f| f.frames.contains_key(&index))
    }

    /// Whether frame `index` of `file` is being evicted: it may not be pinned anew.
    pub(crate) fn is_evicting(&self, file: FileId, index: u64) -> bool {
        self.frame(file, index).is_some_and(|f| f.evicting)
    }

    /// Starts evicting frame `index` of `file`, a dirty victim the caller has pinned
    /// (transiently) and is about to write back. Until [`end_eviction`](Self::end_eviction) no
    /// one pins it anew — requests wait — so no write can land in it while its bytes go out:
    /// when the write-back ends, the frame is clean and can go at once. Without this, a frame
    /// in constant use is dirty again by the time its write-back ends, and the thread that
    /// wrote it back for room writes it back again, and again.
    pub(crate) fn begin_eviction(&mut self, file: FileId, index: u64) {
        if let Some(frame) = self.files.get_mut(&file).and_then(|f| f.frames.get_mut(&index)) {
            frame.evicting = true;
        }
    }

    /// Ends an eviction [`begin_eviction`](Self::begin_eviction) started and unpins the frame
    /// (one transient pin). Returns whether the frame can now be given up: `written` (its
    /// write-back succeeded), clean, nothing loading, no other pin. The caller then unmaps it
    /// and calls [`remove_frame`](Self::remove_frame), without letting go of the books between.
    pub(crate) fn end_eviction(&mut self, file: FileId, index: u64, written: bool) -> bool {
        let Some(frame) = self.files.get_mut(&file).and_then(|f| f.frames.get_mut(&index)) else {
            return false;
        };
        frame.evicting = false;
        let free = written && frame.pins == 1 && frame.writers == 0 && Self::frame_is_clean(frame);
        self.unpin(Unit::Frame { file, index }, true);
        free
    }

    /// Marks `frames` of `file`, which a prefetch pinned once each and read extents into, as
    /// read ahead — those no one else pins (one a view is already waiting for is used, not
    /// ahead): until a view pins one, it is evicted only when no other clean unit can go. In a
    /// walk the frame just viewed is dead and the frames ahead are about to be used, yet a
    /// read-ahead that finishes before the walker lets go of its view would otherwise enter
    /// the LRU list first and go first.
    pub(crate) fn mark_read_ahead(&mut self, file: FileId, frames: &[u64]) {
        let Some(books) = self.files.get_mut(&file) else { return };
        for index in frames {
            if let Some(frame) = books.frames.get_mut(index) {
                frame.ahead = frame.pins == 1;
            }
        }
    }

    fn frame(&self, file: FileId, index: u64) -> Option<&FileFrame> {
        self.files.get(&file).and_then(|f| f.frames.get(&index))
    }

    /// Bytes of `file` resident (clean or dirty, in frames or slots) and dirty.
    pub(crate) fn resident_and_dirty(&self, file: FileId) -> (u64, u64) {
        let Some(books) = self.files.get(&file) else { return (0, 0) };
        let g = self.geometry;
        let bytes = |e: u64| g.bytes_of(e..e + 1, books.len).1;
        let (mut resident, mut dirty) = (0, 0);
        for (&index, frame) in &books.frames {
            for (i, x) in frame.extents.iter().enumerate() {
                let e = index * g.per_frame() + i as u64;
                match x.state {
                    ExtentState::Clean => resident += bytes(e),
                    ExtentState::Dirty => {
                        resident += bytes(e);
                        dirty += bytes(e);
                    }
                    _ => {}
                }
            }
        }
        for (&e, &slot) in &books.slots {
            if self.slot(slot).state == SlotState::Clean {
                resident += bytes(e);
            }
        }
        (resident, dirty)
    }

    /// Frames and slots `file` holds.
    pub(crate) fn units_of(&self, file: FileId) -> (usize, usize) {
        self.files.get(&file).map_or((0, 0), |f| (f.frames.len(), f.slots.len()))
    }

    /// Slots in use (loading, clean or stale) across files.
    pub(crate) fn slots_in_use(&self) -> usize {
        self.slot_frames.iter().flatten().map(|f| f.used as usize).sum()
    }

    // ---- pins ---------------------------------------------------------------------------

    /// Pins `unit` (it leaves the LRU list). `transient`: pinned by the cache's own operation.
    pub(crate) fn pin(&mut self, unit: Unit, transient: bool) {
        match unit {
            Unit::Frame { file, index } => {
                let Some(frame) = self.files.get_mut(&file).and_then(|f| f.frames.get_mut(&index))
                else {
                    return;
                };
                if frame.pins == 0 && frame.lru != NIL {
                    self.lru.remove(frame.lru);
                    frame.lru = NIL;
                }
                frame.pins += 1;
                frame.ahead &= transient;
            }
            Unit::Slot(id) => {
                let (position, i) = self.slot_place(id);
                let Some(sf) = self.slot_frames[position].as_mut() else { return };
                let slot = &mut sf.slots[i];
                if slot.pins == 0 {
                    sf.busy += 1;
                    if slot.lru != NIL {
                        self.lru.remove(slot.lru);
                        slot.lru = NIL;
                    }
                }
                slot.pins += 1;
            }
        }
        if transient {
            self.transient_pins += 1;
        }
    }

    /// Undoes one [`pin`](Self::pin); at the last one the unit becomes the most recently used.
    pub(crate) fn unpin(&mut self, unit: Unit, transient: bool) {
        if transient {
            self.transient_pins = self.transient_pins.saturating_sub(1);
        }
        match unit {
            Unit::Frame { file, index } => {
                let Some(frame) = self.files.get_mut(&file).and_then(|f| f.frames.get_mut(&index))
                else {
                    return;
                };
                frame.pins = frame.pins.saturating_sub(1);
                if frame.pins == 0 && frame.lru == NIL {
                    frame.lru = self.lru.push(unit);
                }
            }
            Unit::Slot(id) => {
                let (position, i) = self.slot_place(id);
                let Some(sf) = self.slot_frames[position].as_mut() else { return };
                let slot = &mut sf.slots[i];
                if slot.pins == 0 {
                    return;
                }
                slot.pins -= 1;
                if slot.pins > 0 {
                    return;
                }
                sf.busy -= 1;
                match slot.state {
                    SlotState::Clean => slot.lru = self.lru.push(unit),
                    SlotState::Stale => self.free_slot(id),
                    SlotState::Free | SlotState::Loading => {}
                }
            }
        }
    }

    // ---- file frames --------------------------------------------------------------------

    /// Records that frame `index` of `file` was mapped (all its extents absent), pinned once by
    /// the caller, who took a frame of the budget for it ([`FrameBudget::try_take`]).
    pub(crate) fn add_frame(&mut self, file: FileId, index: u64, transient: bool) {
        let per = self.geometry.per_frame() as usize;
        let Some(books) = self.files.get_mut(&file) else {
            self.budget.give_back();
            return;
        };
        let extents = vec![Extent { state: ExtentState::Absent, version: 0, writing: false }; per];
        books.frames.insert(
            index,
            FileFrame {
                extents: extents.into_boxed_slice(),
                pins: 1,
                writers: 0,
                lru: NIL,
                evicting: false,
                ahead: false,
            },
        );
        self.frames_in_use += 1;
        if transient {
            self.transient_pins += 1;
        }
    }

    /// Records that frame `index` of `file` — unpinned, nothing dirty or loading — is given
    /// up (the caller unmaps it).
    pub(crate) fn remove_frame(&mut self, file: FileId, index: u64) {
        let Some(books) = self.files.get_mut(&file) else { return };
        let Some(frame) = books.frames.remove(&index) else { return };
        debug_assert!(frame.pins == 0);
        debug_assert!(frame
            .extents
            .iter()
            .all(|x| matches!(x.state, ExtentState::Absent | ExtentState::Clean)));
        if frame.lru != NIL {
            self.lru.remove(frame.lru);
        }
        books.counters.evictions += 1;
        self.frames_in_use -= 1;
        self.budget.give_back();
    }

    /// Claims the absent extents among `extents` (their frames mapped, no slot holding them)
    /// for reading in: they become `Loading`. Returns them.
    pub(crate) fn claim_in_frames(&mut self, file: FileId, extents: Range<u64>) -> Vec<u64> {
        let g = self.geometry;
        let Some(books) = self.files.get_mut(&file) else { return Vec::new() };
        let mut claimed = Vec::new();
        for e in extents {
            if books.slots.contains_key(&e) {
                continue;
            }
            if let Some(frame) = books.frames.get_mut(&g.frame_of(e)) {
                let x = &mut frame.extents[g.within_frame(e)];
                if x.state == ExtentState::Absent {
                    x.state = ExtentState::Loading;
                    claimed.push(e);
                }
            }
        }
        claimed
    }

    /// Marks extents of `file` read in (`ok`: clean; otherwise absent again).
    pub(crate) fn finish_frame_loads(&mut self, file: FileId, extents: &[u64], ok: bool) {
        let g = self.geometry;
        let Some(books) = self.files.get_mut(&file) else { return };
        for &e in extents {
            if let Some(frame) = books.frames.get_mut(&g.frame_of(e)) {
                let x = &mut frame.extents[g.within_frame(e)];
                if x.state == ExtentState::Loading {
                    x.state = if ok { ExtentState::Clean } else { ExtentState::Absent };
                }
            }
        }
    }

    /// Claims, among `extents`, those that clean slots hold while their file frame is mapped,
    /// for copying into the frame: each becomes `Loading` in the frame, and its slot is pinned
    /// (a transient pin) until the copy is done and [`moved_to_frame`](Self::moved_to_frame)
    /// and [`unpin`](Self::unpin) are called.
    pub(crate) fn claim_moves(&mut self, file: FileId, extents: Range<u64>) -> Vec<(u64, SlotId)> {
        let g = self.geometry;
        let mut moves = Vec::new();
        for e in extents {
            let Location::Slot(slot, SlotState::Clean) = self.locate(file, e) else { continue };
            let Some(frame) =
                self.files.get_mut(&file).and_then(|f| f.frames.get_mut(&g.frame_of(e)))
            else {
                continue;
            };
            frame.extents[g.within_frame(e)].state = ExtentState::Loading;
            self.pin(Unit::Slot(slot), true);
            moves.push((e, slot));
        }
        moves
    }

    /// Records that extent `e`, claimed by [`claim_moves`](Self::claim_moves), was copied from
    /// its slot into its file frame (`ok`; otherwise it stays in the slot): the frame's copy is
    /// now the one requests see, and the slot goes (stale while still pinned).
    pub(crate) fn moved_to_frame(&mut self, file: FileId, e: u64, ok: bool) {
        let g = self.geometry;
        let Some(books) = self.files.get_mut(&file) else { return };
        if let Some(frame) = books.frames.get_mut(&g.frame_of(e)) {
            let x = &mut frame.extents[g.within_frame(e)];
            if x.state == ExtentState::Loading {
                x.state = if ok { ExtentState::Clean } else { ExtentState::Absent };
            }
        }
        if !ok {
            return;
        }
        if let Some(slot) = books.slots.remove(&e) {
            if self.slot(slot).pins == 0 {
                self.release_slot(slot);
            } else {
                self.slot_mut(slot).state = SlotState::Stale;
            }
        }
    }

    /// Marks `extents` of `file` dirty (each in a mapped frame, clean or dirty), newer than
    /// any write-back in progress.
    pub(crate) fn mark_dirty(&mut self, file: FileId, extents: Range<u64>) {
        let g = self.geometry;
        let Some(books) = self.files.get_mut(&file) else { return };
        for e in extents {
            if let Some(frame) = books.frames.get_mut(&g.frame_of(e)) {
                let x = &mut frame.extents[g.within_frame(e)];
                debug_assert!(matches!(x.state, ExtentState::Clean | ExtentState::Dirty));
                x.state = ExtentState::Dirty;
                x.version = x.version.wrapping_add(1);
            }
        }
    }

    /// Adds `delta` (±1) live writable views to each frame of `frames`.
    pub(crate) fn add_writers(&mut self, file: FileId, frames: Range<u64>, delta: i32) {
        let Some(books) = self.files.get_mut(&file) else { return };
        for index in frames {
            if let Some(frame) = books.frames.get_mut(&index) {
                frame.writers = frame.writers.saturating_add_signed(delta);
            }
        }
    }

    /// The dirty extents among `extents` with their versions, sorted.
    pub(crate) fn dirty_in(&self, file: FileId, extents: Range<u64>) -> Vec<(u64, u32)> {
        self.scan_dirty(file, extents).into_iter().map(|(e, x)| (e, x.version)).collect()
    }

    /// The dirty extents among `extents`, sorted.
    fn scan_dirty(&self, file: FileId, extents: Range<u64>) -> Vec<(u64, Extent)> {
        let g = self.geometry;
        let Some(books) = self.files.get(&file) else { return Vec::new() };
        let mut dirty = Vec::new();
        if (extents.end - extents.start) / g.per_frame() > books.frames.len() as u64 {
            // A wide range over few mapped frames: walk the frames, not the range.
            let mut frames: Vec<(&u64, &FileFrame)> = books.frames.iter().collect();
            frames.sort_unstable_by_key(|(index, _)| **index);
            for (&index, frame) in frames {
                for (i, x) in frame.extents.iter().enumerate() {
                    let e = index * g.per_frame() + i as u64;
                    if x.state == ExtentState::Dirty && extents.contains(&e) {
                        dirty.push((e, *x));
                    }
                }
            }
            return dirty;
        }
        for e in extents {
            if let Some(frame) = books.frames.get(&g.frame_of(e)) {
                let x = frame.extents[g.within_frame(e)];
                if x.state == ExtentState::Dirty {
                    dirty.push((e, x));
                }
            }
        }
        dirty
    }

    /// Claims the dirty extents among `extents` that no write-back is writing (with their
    /// versions, sorted), and says whether others are being written: a write-back waits for
    /// those, so that one extent is never written by two write-backs at once.
    pub(crate) fn claim_writeback(
        &mut self,
        file: FileId,
        extents: Range<u64>,
    ) -> (Vec<(u64, u32)>, bool) {
        let g = self.geometry;
        let dirty = self.scan_dirty(file, extents);
        let busy = dirty.iter().any(|(_, x)| x.writing);
        let mine: Vec<(u64, u32)> =
            dirty.into_iter().filter(|(_, x)| !x.writing).map(|(e, x)| (e, x.version)).collect();
        if let Some(books) = self.files.get_mut(&file) {
            for &(e, _) in &mine {
                if let Some(frame) = books.frames.get_mut(&g.frame_of(e)) {
                    frame.extents[g.within_frame(e)].writing = true;
                }
            }
        }
        (mine, busy)
    }

    /// Records a write-back of `claimed` (by [`claim_writeback`](Self::claim_writeback)), of
    /// which `written` reached the file: those become clean unless written again since it
    /// started, or a writable view over them lives; all become claimable again.
    pub(crate) fn finish_writeback(
        &mut self,
        file: FileId,
        claimed: &[(u64, u32)],
        written: &[(u64, u32)],
    ) {
        let g = self.geometry;
        let Some(books) = self.files.get_mut(&file) else { return };
        for &(e, _) in claimed {
            if let Some(frame) = books.frames.get_mut(&g.frame_of(e)) {
                frame.extents[g.within_frame(e)].writing = false;
            }
        }
        for &(e, version) in written {
            if let Some(frame) = books.frames.get_mut(&g.frame_of(e)) {
                if frame.writers > 0 {
                    continue;
                }
                let x = &mut frame.extents[g.within_frame(e)];
                if x.state == ExtentState::Dirty && x.version == version {
                    x.state = ExtentState::Clean;
                }
            }
        }
    }

    /// Whether any extent of the file is loading or dirty (a file frame cannot go then).
    fn frame_is_clean(frame: &FileFrame) -> bool {
        frame.extents.iter().all(|x| matches!(x.state, ExtentState::Absent | ExtentState::Clean))
    }

    /// The frames of `file` no one pins, with nothing dirty or loading (for `evict`).
    pub(crate) fn idle_frames(&self, file: FileId) -> Vec<u64> {
        self.files.get(&file).map_or_else(Vec::new, |books| {
            books
                .frames
                .iter()
                .filter(|(_, f)| f.pins == 0 && Self::frame_is_clean(f))
                .map(|(&index, _)| index)
                .collect()
        })
    }

    /// The slots of `file` no one pins (for `evict`).
    pub(crate) fn idle_slots(&self, file: FileId) -> Vec<SlotId> {
        self.files.get(&file).map_or_else(Vec::new, |books| {
            books
                .slots
                .values()
                .copied()
                .filter(|&s| {
                    let slot = self.slot(s);
                    slot.pins == 0 && slot.state == SlotState::Clean
                })
                .collect()
        })
    }

    // ---- slots --------------------------------------------------------------------------

    /// Where slot `id` is in `slot_frames`: (local position, index in its frame).
    fn slot_place(&self, id: SlotId) -> (usize, usize) {
        let per = self.geometry.per_frame() as usize;
        (id as usize / per - self.first_position, id as usize % per)
    }

    fn slot(&self, id: SlotId) -> Slot {
        let (position, i) = self.slot_place(id);
        self.slot_frames[position].as_ref().map(|f| f.slots[i]).unwrap_or(Slot {
            state: SlotState::Free,
            owner: (0, 0),
            pins: 0,
            lru: NIL,
            in_free_list: false,
        })
    }

    fn slot_mut(&mut self, id: SlotId) -> &mut Slot {
        let (position, i) = self.slot_place(id);
        // Slots named by the books always lie in mapped slot frames.
        &mut self.slot_frames[position].as_mut().expect("slot in a mapped slot frame").slots[i]
    }

    /// Whether a slot is free for [`take_slot`](Self::take_slot) (dropping free-list entries
    /// of slot frames that were given up).
    pub(crate) fn has_free_slot(&mut self) -> bool {
        while let Some(&id) = self.free_slots.last() {
            let (position, i) = self.slot_place(id);
            if let Some(frame) = self.slot_frames[position].as_ref() {
                let slot = frame.slots[i];
                if slot.in_free_list && slot.state == SlotState::Free {
                    return true;
                }
                if slot.in_free_list {
                    self.slot_mut(id).in_free_list = false;
                }
            }
            self.free_slots.pop();
        }
        false
    }

    /// Whether any of `extents` of `file` is being read in (by anyone).
    pub(crate) fn any_loading(&self, file: FileId, extents: Range<u64>) -> bool {
        extents.into_iter().any(|e| {
            matches!(
                self.locate(file, e),
                Location::Frame(ExtentState::Loading) | Location::Slot(_, SlotState::Loading)
            )
        })
    }

    /// The file and extent slot `id` holds.
    pub(crate) fn slot_owner(&self, id: SlotId) -> (FileId, u64) {
        self.slot(id).owner
    }

    /// The state of slot `id`.
    #[cfg(test)]
    pub(crate) fn slot_state(&self, id: SlotId) -> SlotState {
        self.slot(id).state
    }

    /// Records a frame of memory, which the caller took from the budget
    /// ([`FrameBudget::try_take`]), as slots at a free position of the slot arena, and returns
    /// the position for the caller to map (all its slots free). `None`, with the frame given
    /// back, when every position is in use.
    pub(crate) fn add_slot_frame(&mut self) -> Option<usize> {
        let Some(local) = self.slot_frames.iter().position(Option::is_none) else {
            self.budget.give_back();
            return None;
        };
        let position = self.first_position + local;
        let per = self.geometry.per_frame() as usize;
        let free =
            Slot { state: SlotState::Free, owner: (0, 0), pins: 0, lru: NIL, in_free_list: true };
        self.slot_frames[local] =
            Some(SlotFrame { slots: vec![free; per].into_boxed_slice(), used: 0, busy: 0 });
        self.empty_slot_frames += 1;
        self.frames_in_use += 1;
        // Pushed in reverse so the first slots of the frame are taken first.
        for i in (0..per).rev() {
            self.free_slots.push((position * per + i) as SlotId);
        }
        Some(position)
    }

    /// Records that the slot frame at `position`, none of whose slots anyone pins, is given up:
    /// its clean slots are evicted (the caller unmaps it).
    pub(crate) fn remove_slot_frame(&mut self, position: usize) {
        let Some(frame) = position
            .checked_sub(self.first_position)
            .and_then(|local| self.slot_frames.get_mut(local))
            .and_then(Option::take)
        else {
            return;
        };
        debug_assert_eq!(frame.busy, 0);
        for slot in frame.slots.iter() {
            if slot.state == SlotState::Clean {
                if slot.lru != NIL {
                    self.lru.remove(slot.lru);
                }
                if let Some(books) = self.files.get_mut(&slot.owner.0) {
                    books.slots.remove(&slot.owner.1);
                    books.counters.evictions += 1;
                }
            }
        }
        if frame.used == 0 {
            self.empty_slot_frames -= 1;
        }
        self.frames_in_use -= 1;
        self.budget.give_back();
        // Free-list entries of the position are skipped when popped (the frame is gone).
    }

    /// Takes a free slot for extent `e` of `file`: it becomes `Loading`, pinned once (a
    /// transient pin) by the caller, and is where requests find `e`. `None` when no slot is free.
    pub(crate) fn take_slot(&mut self, file: FileId, e: u64) -> Option<SlotId> {
        while let Some(id) = self.free_slots.pop() {
            let (position, i) = self.slot_place(id);
            let Some(frame) = self.slot_frames[position].as_mut() else { continue };
            let slot = &mut frame.slots[i];
            if !slot.in_free_list {
                continue;
            }
            slot.in_free_list = false;
            if slot.state != SlotState::Free {
                continue;
            }
            *slot = Slot {
                state: SlotState::Loading,
                owner: (file, e),
                pins: 1,
                lru: NIL,
                in_free_list: false,
            };
            if frame.used == 0 {
                self.empty_slot_frames -= 1;
            }
            frame.used += 1;
            frame.busy += 1;
            self.transient_pins += 1;
            if let Some(books) = self.files.get_mut(&file) {
                books.slots.insert(e, id);
            }
            return Some(id);
        }
        None
    }

    /// Marks slot `id` read in (`ok`: clean; otherwise free again). It stays pinned.
    pub(crate) fn finish_slot_load(&mut self, id: SlotId, ok: bool) {
        let slot = self.slot(id);
        if slot.state != SlotState::Loading {
            return;
        }
        if ok {
            self.slot_mut(id).state = SlotState::Clean;
        } else {
            if let Some(books) = self.files.get_mut(&slot.owner.0) {
                if books.slots.get(&slot.owner.1) == Some(&id) {
                    books.slots.remove(&slot.owner.1);
                }
            }
            // Freed when its last pin goes.
            self.slot_mut(id).state = SlotState::Stale;
        }
    }

    /// Evicts slot `id` (clean, unpinned): its extent is no longer resident, and the slot is
    /// free for [`take_slot`](Self::take_slot).
    pub(crate) fn evict_slot(&mut self, id: SlotId) {
        let slot = self.slot(id);
        debug_assert!(slot.pins == 0 && slot.state == SlotState::Clean);
        if let Some(books) = self.files.get_mut(&slot.owner.0) {
            books.slots.remove(&slot.owner.1);
            books.counters.evictions += 1;
        }
        self.release_slot(id);
    }

    /// Evicts up to `n` of the least recently used units while they are slots (clean, no one
    /// pins them: that is what the LRU list holds of slots), oldest first; returns how many.
    /// The batch form of [`victim`](Self::victim) and [`evict_slot`](Self::evict_slot) for a
    /// gather's misses: the same victims in the same order, but each step done for all of them
    /// before the next, so that their cache misses (the slot, its file's index, its list node)
    /// overlap instead of following one another — under the lock, that is the row rate.
    pub(crate) fn evict_oldest_slots(&mut self, n: usize) -> usize {
        let mut victims = std::mem::take(&mut self.scratch);
        victims.clear();
        let mut at = self.lru.oldest;
        while victims.len() < n && at != NIL {
            let (unit, _, newer) = self.lru.nodes[at as usize];
            let Unit::Slot(id) = unit else { break };
            victims.push((at, id));
            at = newer;
        }
        self.lru.cut_oldest(victims.iter().map(|&(node, _)| node), at);
        for &(_, id) in &victims {
            let owner = self.slot(id).owner;
            if let Some(books) = self.files.get_mut(&owner.0) {
                books.slots.remove(&owner.1);
                books.counters.evictions += 1;
            }
        }
        for &(_, id) in &victims {
            self.slot_mut(id).lru = NIL;
            self.free_slot(id);
        }
        let evicted = victims.len();
        self.scratch = victims;
        evicted
    }

    /// Frees a slot no one pins: out of the LRU list, onto the free list.
    fn release_slot(&mut self, id: SlotId) {
        let slot = self.slot(id);
        if slot.lru != NIL {
            self.lru.remove(slot.lru);
        }
        self.free_slot(id);
    }

    fn free_slot(&mut self, id: SlotId) {
        let (position, i) = self.slot_place(id);
        let Some(frame) = self.slot_frames[position].as_mut() else { return };
        let slot = &mut frame.slots[i];
        if slot.state != SlotState::Free {
            frame.used -= 1;
            if frame.used == 0 {
                self.empty_slot_frames += 1;
            }
        }
        let push = !slot.in_free_list;
        *slot =
            Slot { state: SlotState::Free, owner: (0, 0), pins: 0, lru: NIL, in_free_list: true };
        if push {
            self.free_slots.push(id);
        }
    }

    // ---- victims ------------------------------------------------------------------------

    /// What to give up for `want`: the least recently used unit that can go, clean before dirty.
    /// For a frame, an empty slot frame goes first, and a slot's whole frame goes when none of
    /// its slots is in use.
    pub(crate) fn victim(&self, want: Want) -> Victim {
        if want == Want::Frame && self.empty_slot_frames > 0 {
            if let Some(local) =
                self.slot_frames.iter().position(|f| f.as_ref().is_some_and(|f| f.used == 0))
            {
                return Victim::SlotFrame(self.first_position + local);
            }
        }
        let (mut dirty, mut ahead) = (None, None);
        for unit in self.lru.oldest_first() {
            match unit {
                Unit::Frame { file, index } => {
                    let Some(frame) = self.files.get(&file).and_then(|f| f.frames.get(&index))
                    else {
                        continue;
                    };
                    if Self::frame_is_clean(frame) {
                        if frame.ahead {
                            ahead.get_or_insert(Victim::CleanFrame { file, index });
                            continue;
                        }
                        return Victim::CleanFrame { file, index };
                    }
                    if frame.extents.iter().all(|x| x.state != ExtentState::Loading) {
                        dirty.get_or_insert(Victim::DirtyFrame { file, index });
                    }
                }
                Unit::Slot(id) => match want {
                    Want::Slot => return Victim::Slot(id),
                    Want::Frame => {
                        let (local, _) = self.slot_place(id);
                        if self.slot_frames[local].as_ref().is_some_and(|f| f.busy == 0) {
                            return Victim::SlotFrame(self.first_position + local);
                        }
                    }
                },
            }
        }
        ahead.or(dirty).unwrap_or(Victim::None)
    }

    // ---- checks -------------------------------------------------------------------------

    /// Checks every invariant the module docs promise; the first broken one, described.
    #[cfg(test)]
    pub(crate) fn check(&self) -> Result<(), String> {
        let g = self.geometry;
        let slot_frames = self.slot_frames.iter().flatten().count();
        let file_frames: usize = self.files.values().map(|f| f.frames.len()).sum();
        if self.frames_in_use != slot_frames + file_frames
            || self.frames_in_use > self.budget.used()
            || self.budget.used() > self.budget.max()
        {
            return Err(format!(
                "frames in use {} != {file_frames} file + {slot_frames} slot frames, budget {} \
                 of which {} used",
                self.frames_in_use,
                self.budget.max(),
                self.budget.used()
            ));
        }
        let mut in_lru = 0;
        for (&id, books) in &self.files {
            for (&index, frame) in &books.frames {
                if frame.evicting && frame.pins == 0 {
                    return Err(format!("frame {index} of file {id}: evicting but not pinned"));
                }
                if (frame.pins == 0) != (frame.lru != NIL) {
                    return Err(format!(
                        "frame {index} of file {id}: pins {} but lru {}",
                        frame.pins, frame.lru
                    ));
                }
                in_lru += usize::from(frame.lru != NIL);
                for (i, x) in frame.extents.iter().enumerate() {
                    let e = index * g.per_frame() + i as u64;
                    let moving = x.state == ExtentState::Loading
                        && books.slots.get(&e).is_some_and(|&s| self.slot(s).pins > 0);
                    if x.state != ExtentState::Absent && books.slots.contains_key(&e) && !moving {
                        return Err(format!("extent {e} of file {id} in its frame and a slot"));
                    }
                }
            }
            for (&e, &slot) in &books.slots {
                let s = self.slot(slot);
                if s.owner != (id, e) || !matches!(s.state, SlotState::Loading | SlotState::Clean) {
                    return Err(format!("slot {slot} indexed for ({id}, {e}) holds {s:?}"));
                }
            }
        }
        let mut empty = 0;
        for (position, frame) in self.slot_frames.iter().enumerate() {
            let Some(frame) = frame else { continue };
            let used = frame.slots.iter().filter(|s| s.state != SlotState::Free).count();
            let busy = frame.slots.iter().filter(|s| s.pins > 0).count();
            if used != frame.used as usize || busy != frame.busy as usize {
                return Err(format!(
                    "slot frame {position}: counts {}/{} vs {used}/{busy}",
                    frame.used, frame.busy
                ));
            }
            empty += usize::from(used == 0);
            for (i, s) in frame.slots.iter().enumerate() {
                let id = ((self.first_position + position) * g.per_frame() as usize + i) as SlotId;
                let listed = s.state == SlotState::Clean && s.pins == 0;
                if listed != (s.lru != NIL) {
                    return Err(format!("slot {id} {s:?}: in the LRU list {}", s.lru != NIL));
                }
                in_lru += usize::from(s.lru != NIL);
                if s.state == SlotState::Free && !s.in_free_list {
                    return Err(format!("slot {id} free but not listed"));
                }
                if s.state == SlotState::Stale && s.pins == 0 {
                    return Err(format!("slot {id} stale with no pins"));
                }
                if s.state == SlotState::Clean || s.state == SlotState::Loading {
                    let indexed = self.files.get(&s.owner.0).and_then(|f| f.slots.get(&s.owner.1));
                    if indexed != Some(&id) {
                        return Err(format!("slot {id} {s:?} not indexed by its owner"));
                    }
                }
            }
        }
        if empty != self.empty_slot_frames {
            return Err(format!("{empty} empty slot frames, counted {}", self.empty_slot_frames));
        }
        if in_lru != self.lru.len {
            return Err(format!(
                "{in_lru} units marked in the LRU list, which holds {}",
                self.lru.len
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes a frame of the budget and records it as slots, as the cache does.
    fn slot_frame(b: &mut Books) -> Option<usize> {
        if !b.budget().try_take() {
            return None;
        }
        b.add_slot_frame()
    }

    /// Takes a frame of the budget and records it as frame `index` of `file`, as the cache does.
    fn file_frame(b: &mut Books, file: FileId, index: u64, transient: bool) {
        assert!(b.budget().try_take(), "no room for frame {index} of file {file}");
        b.add_frame(file, index, transient);
    }
    use proptest::prelude::*;

    const G: Geometry = Geometry { extent: 4096, frame: 4 * 4096 };

    #[test]
    fn slots_fill_frames_and_evict_least_recent_first() {
        let mut b = Books::new(G, 2);
        let f = b.new_file(1 << 20);
        assert!(b.has_room());
        slot_frame(&mut b).unwrap();
        let mut slots = Vec::new();
        for e in 0..4 {
            let s = b.take_slot(f, e).unwrap();
            b.finish_slot_load(s, true);
            b.unpin(Unit::Slot(s), true);
            slots.push(s);
        }
        assert!(b.take_slot(f, 9).is_none(), "the frame's four slots are taken");
        assert_eq!(b.locate(f, 2), Location::Slot(slots[2], SlotState::Clean));
        // Using extent 0 again makes extent 1 the least recently used.
        b.pin(Unit::Slot(slots[0]), false);
        b.unpin(Unit::Slot(slots[0]), false);
        assert_eq!(b.victim(Want::Slot), Victim::Slot(slots[1]));
        b.evict_slot(slots[1]);
        assert_eq!(b.locate(f, 1), Location::Nowhere);
        assert_eq!(b.take_slot(f, 9), Some(slots[1]));
        b.check().unwrap();
    }

    #[test]
    fn frames_take_over_extents_from_slots() {
        let mut b = Books::new(G, 2);
        let f = b.new_file(1 << 20);
        slot_frame(&mut b).unwrap();
        let s = b.take_slot(f, 1).unwrap();
        b.finish_slot_load(s, true);
        // A reader still pins the slot when the file frame arrives.
        file_frame(&mut b, f, 0, true);
        assert_eq!(b.locate(f, 1), Location::Slot(s, SlotState::Clean), "until it is moved");
        assert_eq!(b.claim_moves(f, 0..4), vec![(1, s)]);
        assert_eq!(b.locate(f, 1), Location::Frame(ExtentState::Loading));
        b.moved_to_frame(f, 1, true);
        b.unpin(Unit::Slot(s), true); // the mover's pin
        assert_eq!(b.locate(f, 1), Location::Frame(ExtentState::Clean));
        assert_eq!(b.slot_state(s), SlotState::Stale);
        b.unpin(Unit::Slot(s), true); // the reader's
        assert_eq!(b.slot_state(s), SlotState::Free);
        assert_eq!(b.claim_in_frames(f, 0..4), vec![0, 2, 3]);
        b.finish_frame_loads(f, &[0, 2, 3], true);
        b.unpin(Unit::Frame { file: f, index: 0 }, true);
        b.check().unwrap();
    }

    #[test]
    fn a_dirty_victim_is_closed_to_requests_until_it_goes() {
        let mut b = Books::new(G, 2);
        let f = b.new_file(1 << 20);
        for index in 0..2 {
            file_frame(&mut b, f, index, false);
            let e = index * 4;
            let claimed = b.claim_in_frames(f, e..e + 4);
            b.finish_frame_loads(f, &claimed, true);
            b.mark_dirty(f, e..e + 2);
            b.unpin(Unit::Frame { file: f, index }, false);
        }
        let Victim::DirtyFrame { file, index } = b.victim(Want::Frame) else {
            panic!("a dirty frame is the only victim")
        };
        assert_eq!((file, index), (f, 0), "the least recently used");
        b.pin(Unit::Frame { file, index }, true);
        b.begin_eviction(file, index);
        assert!(b.is_evicting(f, 0) && !b.is_evicting(f, 1));
        for e in 0..4 {
            // Its bytes, dirty or clean, are not handed out while they go: requests wait.
            assert_eq!(b.locate(f, e), Location::Frame(ExtentState::Loading), "extent {e}");
        }
        assert_eq!(b.locate(f, 4), Location::Frame(ExtentState::Dirty));
        b.check().unwrap();
        let (mine, busy) = b.claim_writeback(f, 0..4);
        assert!(!busy);
        b.finish_writeback(f, &mine, &mine);
        assert!(b.end_eviction(f, 0, true), "clean and pinned by no one: it can go");
        b.remove_frame(f, 0);
        assert!(b.has_room());
        assert_eq!(b.locate(f, 0), Location::Nowhere);
        // A failed write-back keeps the frame, dirty, for a later one.
        b.pin(Unit::Frame { file: f, index: 1 }, true);
        b.begin_eviction(f, 1);
        assert!(!b.end_eviction(f, 1, false));
        assert!(!b.is_evicting(f, 1));
        assert_eq!(b.locate(f, 4), Location::Frame(ExtentState::Dirty));
        // Pinned by another while evicting (a flush), it stays too.
        b.pin(Unit::Frame { file: f, index: 1 }, true);
        b.begin_eviction(f, 1);
        b.pin(Unit::Frame { file: f, index: 1 }, true);
        let (mine, _) = b.claim_writeback(f, 4..8);
        b.finish_writeback(f, &mine, &mine);
        assert!(!b.end_eviction(f, 1, true), "another pin holds it");
        b.unpin(Unit::Frame { file: f, index: 1 }, true);
        b.check().unwrap();
    }

    #[test]
    fn frames_read_ahead_go_after_every_other_clean_unit() {
        let mut b = Books::new(G, 3);
        let f = b.new_file(1 << 20);
        for index in 0..3 {
            file_frame(&mut b, f, index, true);
            let e = index * 4;
            let claimed = b.claim_in_frames(f, e..e + 4);
            b.finish_frame_loads(f, &claimed, true);
            if index == 0 {
                b.mark_read_ahead(f, &[0]);
            }
            b.unpin(Unit::Frame { file: f, index }, true);
        }
        // Frame 0 is the least recently used, but it was read ahead and no view used it yet.
        assert_eq!(b.victim(Want::Frame), Victim::CleanFrame { file: f, index: 1 });
        b.pin(Unit::Frame { file: f, index: 1 }, false);
        b.pin(Unit::Frame { file: f, index: 2 }, false);
        assert_eq!(b.victim(Want::Frame), Victim::CleanFrame { file: f, index: 0 }, "the last");
        // A view uses it: an ordinary frame from then on.
        b.pin(Unit::Frame { file: f, index: 0 }, false);
        b.unpin(Unit::Frame { file: f, index: 0 }, false);
        b.unpin(Unit::Frame { file: f, index: 1 }, false);
        assert_eq!(b.victim(Want::Frame), Victim::CleanFrame { file: f, index: 0 });
        // A frame a view already waits for is not marked: it is used, not ahead.
        b.pin(Unit::Frame { file: f, index: 1 }, true);
        b.pin(Unit::Frame { file: f, index: 1 }, false);
        b.mark_read_ahead(f, &[1]);
        b.unpin(Unit::Frame { file: f, index: 1 }, true);
        b.unpin(Unit::Frame { file: f, index: 1 }, false);
        b.unpin(Unit::Frame { file: f, index: 2 }, false);
        b.pin(Unit::Frame { file: f, index: 0 }, false);
        assert_eq!(b.victim(Want::Frame), Victim::CleanFrame { file: f, index: 1 });
        b.check().unwrap();
    }

    #[test]
    fn writes_during_a_write_back_stay_dirty() {
        let mut b = Books::new(G, 1);
        let f = b.new_file(1 << 20);
        file_frame(&mut b, f, 0, false);
        let claimed = b.claim_in_frames(f, 0..2);
        b.finish_frame_loads(f, &claimed, true);
        // A writable view lives over the frame while a flush runs.
        b.add_writers(f, 0..1, 1);
        b.mark_dirty(f, 0..2);
        let (snapshot, busy) = b.claim_writeback(f, 0..4);
        assert!(!busy);
        assert_eq!(b.claim_writeback(f, 0..4), (vec![], true), "one write-back at a time");
        b.finish_writeback(f, &snapshot, &snapshot);
        assert_eq!(b.dirty_in(f, 0..4).len(), 2, "a live writer keeps its extents dirty");
        // The writer is done: its extents are newer than that flush.
        b.mark_dirty(f, 0..2);
        b.add_writers(f, 0..1, -1);
        let (again, _) = b.claim_writeback(f, 0..4);
        b.finish_writeback(f, &again, &snapshot);
        assert_eq!(b.dirty_in(f, 0..4).len(), 2, "a flush that started earlier cannot clean");
        let (fresh, _) = b.claim_writeback(f, 0..4);
        b.finish_writeback(f, &fresh, &fresh);
        assert!(b.dirty_in(f, 0..4).is_empty());
        b.unpin(Unit::Frame { file: f, index: 0 }, false);
        b.check().unwrap();
    }

    #[test]
    fn a_frame_request_releases_a_whole_idle_slot_frame() {
        let mut b = Books::new(G, 1);
        let f = b.new_file(1 << 20);
        slot_frame(&mut b).unwrap();
        let s = b.take_slot(f, 7).unwrap();
        b.finish_slot_load(s, true);
        assert!(!b.has_room());
        assert_eq!(b.victim(Want::Frame), Victim::None, "its slot is pinned");
        b.unpin(Unit::Slot(s), true);
        assert_eq!(b.victim(Want::Frame), Victim::SlotFrame(0));
        b.remove_slot_frame(0);
        assert_eq!(b.locate(f, 7), Location::Nowhere);
        assert!(b.has_room());
        b.check().unwrap();
    }

    /// One step of the model-based test.
    #[derive(Debug, Clone)]
    enum Op {
        Slot { file: u8, e: u64, ok: bool },
        Frame { file: u8, index: u64, ok: bool, write: bool },
        Flush { file: u8 },
        Evict { want_frame: bool },
        DropFile { file: u8 },
        Sweep { n: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..3, 0u64..24, prop::bool::weighted(0.9)).prop_map(|(file, e, ok)| Op::Slot {
                file,
                e,
                ok
            }),
            (0u8..3, 0u64..6, prop::bool::weighted(0.9), any::<bool>())
                .prop_map(|(file, index, ok, write)| Op::Frame { file, index, ok, write }),
            (0u8..3).prop_map(|file| Op::Flush { file }),
            any::<bool>().prop_map(|want_frame| Op::Evict { want_frame }),
            (0u8..3).prop_map(|file| Op::DropFile { file }),
            (0usize..10).prop_map(|n| Op::Sweep { n }),
        ]
    }

    /// Makes room for `want` the way the cache does (a write-back is simulated as success).
    fn make_room(b: &mut Books, want: Want) -> bool {
        loop {
            if want == Want::Slot && !b.free_slots.is_empty() {
                return true;
            }
            if b.has_room() {
                if want == Want::Slot {
                    slot_frame(b);
                }
                return true;
            }
            match b.victim(want) {
                Victim::CleanFrame { file, index } => b.remove_frame(file, index),
                Victim::DirtyFrame { file, index } => {
                    let per = b.geometry().per_frame();
                    let (d, _) = b.claim_writeback(file, index * per..(index + 1) * per);
                    b.finish_writeback(file, &d, &d);
                }
                Victim::Slot(s) => b.evict_slot(s),
                Victim::SlotFrame(p) => b.remove_slot_frame(p),
                Victim::None => return false,
            }
        }
    }

    proptest! {
        /// Random requests against books of 1 to 4 frames: after every step the invariants
        /// hold, the budget is never exceeded, and no extent is in two places.
        #[test]
        fn invariants_hold_under_random_requests(
            frames in 1usize..5,
            first_position in 0usize..3,
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            // Books of a shard own a stretch of the slot arena that may not start at 0.
            let mut b = Books::with_arena(G, FrameBudget::new(frames), first_position);
            let mut files: Vec<FileId> = (0..3).map(|_| b.new_file(24 * 4096)).collect();
            for op in ops {
                match op {
                    Op::Slot { file, e, ok } => {
                        let f = files[file as usize];
                        if b.locate(f, e) != Location::Nowhere {
                            continue;
                        }
                        if !make_room(&mut b, Want::Slot) {
                            continue;
                        }
                        if let Some(s) = b.take_slot(f, e) {
                            b.finish_slot_load(s, ok);
                            b.unpin(Unit::Slot(s), true);
                        }
                    }
                    Op::Frame { file, index, ok, write } => {
                        let f = files[file as usize];
                        let unit = Unit::Frame { file: f, index };
                        if b.is_mapped(f, index) {
                            b.pin(unit, false);
                        } else {
                            if !make_room(&mut b, Want::Frame) {
                                continue;
                            }
                            file_frame(&mut b, f, index, false);
                        }
                        let per = b.geometry().per_frame();
                        let range = index * per..(index + 1) * per;
                        for (e, slot) in b.claim_moves(f, range.clone()) {
                            b.moved_to_frame(f, e, ok);
                            b.unpin(Unit::Slot(slot), true);
                        }
                        let claimed = b.claim_in_frames(f, range.clone());
                        b.finish_frame_loads(f, &claimed, ok);
                        let valid = range.clone().all(|e| {
                            matches!(
                                b.locate(f, e),
                                Location::Frame(ExtentState::Clean | ExtentState::Dirty)
                            )
                        });
                        if write && valid {
                            b.mark_dirty(f, range);
                        }
                        b.unpin(unit, false);
                    }
                    Op::Flush { file } => {
                        let f = files[file as usize];
                        let (d, _) = b.claim_writeback(f, 0..24);
                        b.finish_writeback(f, &d, &d);
                        prop_assert!(b.dirty_in(f, 0..24).is_empty());
                    }
                    Op::Evict { want_frame } => {
                        let want = if want_frame { Want::Frame } else { Want::Slot };
                        match b.victim(want) {
                            Victim::CleanFrame { file, index } => b.remove_frame(file, index),
                            Victim::Slot(s) => b.evict_slot(s),
                            Victim::SlotFrame(p) => b.remove_slot_frame(p),
                            Victim::DirtyFrame { .. } | Victim::None => {}
                        }
                    }
                    Op::DropFile { file } => {
                        let f = files[file as usize];
                        let (d, _) = b.claim_writeback(f, 0..24);
                        b.finish_writeback(f, &d, &d);
                        b.remove_file(f);
                        files[file as usize] = b.new_file(24 * 4096);
                    }
                    Op::Sweep { n } => {
                        // The victims one by one would be the oldest units while they are
                        // slots; the sweep takes exactly those, and leaves the rest in order.
                        let before: Vec<Unit> = b.lru.oldest_first().collect();
                        let expected: Vec<(SlotId, (FileId, u64))> = before
                            .iter()
                            .take(n)
                            .map_while(|u| match u {
                                Unit::Slot(s) => Some((*s, b.slot_owner(*s))),
                                Unit::Frame { .. } => None,
                            })
                            .collect();
                        prop_assert_eq!(b.evict_oldest_slots(n), expected.len());
                        for (s, (file, e)) in &expected {
                            prop_assert_eq!(b.slot_state(*s), SlotState::Free);
                            prop_assert_ne!(b.locate(*file, *e), Location::Slot(*s, SlotState::Clean));
                        }
                        let after: Vec<Unit> = b.lru.oldest_first().collect();
                        prop_assert_eq!(&after[..], &before[expected.len()..]);
                    }
                }
                if let Err(e) = b.check() {
                    return Err(TestCaseError::fail(e));
                }
                prop_assert!(b.frames_in_use() <= frames);
                prop_assert_eq!(b.transient_pins(), 0);
            }
        }
    }
}
