//! The books of a cache shard: which memory holds which extents of which files, in what state,
//! who pins what, and in what order memory was used. No I/O and no driver calls: the cache asks
//! the books what to do, does the slow part (mapping memory, reading, writing) and reports back.
//!
//! Memory comes in *frames* (the budget is a number of them, shared by every shard: see
//! [`FrameBudget`]), used in two ways:
//! - a **file frame** is mapped at its place in one file's address range, so that a view of any
//!   range of the file is one contiguous piece of memory (`base + offset`). Its extents are
//!   absent, being read in, clean, or dirty; only file frames hold dirty bytes (the per-file
//!   state machine is [`FileBooks`]).
//! - a **slot frame** is cut into slots of one extent each, holding clean extents of any file
//!   wherever they fall (the `SlotArena`): random access to a file much larger than the budget
//!   then costs an extent of memory per extent touched, not a frame.
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

mod budget;
mod catalog;
#[cfg(test)]
mod check;
mod ids;
mod lru;
mod residency;
mod slots;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

pub(crate) use budget::FrameBudget;
pub(crate) use catalog::{key, Catalog, EMPTY};
pub(crate) use ids::{
    ExtentState, FileCounters, FileId, IndexHashMap, Location, SlotId, SlotState, Unit, Victim,
    Want,
};
pub(crate) use residency::FileBooks;

use super::geometry::Geometry;
use ids::NIL;
use lru::Lru;
use residency::FileFrame;
use slots::SlotArena;

/// The books of one shard (see the module docs).
#[derive(Debug)]
pub(crate) struct Books {
    geometry: Geometry,
    /// The cache's budget, shared with the other shards' books.
    budget: Arc<FrameBudget>,
    /// Frames these books hold (file frames and slot frames).
    frames_in_use: usize,
    files: IndexHashMap<FileId, FileBooks>,
    /// What lookups outside the books (the GPU's) see of the slots, shared with the other
    /// shards' books.
    catalog: Arc<Catalog>,
    /// This shard's number, by which the budget knows which arena positions it holds.
    shard: u8,
    /// The slot frames this shard holds, at their positions in the cache's slot arena.
    arena: SlotArena,
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
    /// Empty books for `geometry` with a budget and a catalog of their own of `max_frames`
    /// frames.
    #[cfg(test)]
    pub(crate) fn new(geometry: Geometry, max_frames: usize) -> Books {
        Books::for_shard(geometry, FrameBudget::new(max_frames), Catalog::new(), 0)
    }

    /// Empty books for shard `shard` of a cache of `geometry`, drawing on `budget` and
    /// recording in `catalog` (both shared with the other shards' books).
    pub(crate) fn for_shard(
        geometry: Geometry,
        budget: Arc<FrameBudget>,
        catalog: Arc<Catalog>,
        shard: u8,
    ) -> Books {
        let arena = SlotArena::new(geometry.per_frame() as usize, budget.max());
        Books {
            geometry,
            budget,
            frames_in_use: 0,
            files: IndexHashMap::default(),
            catalog,
            shard,
            arena,
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

    /// Slots retiring: free once no lookup outside the books can see what they held (they go
    /// by themselves, like transient pins).
    pub(crate) fn retiring(&self) -> usize {
        self.arena.retiring()
    }

    // ---- files --------------------------------------------------------------------------

    /// Registers file `id` (numbered by the cache) of `len` bytes.
    pub(crate) fn add_file(&mut self, id: FileId, len: u64) {
        self.files.insert(id, FileBooks::new(len));
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
            (_, Some(&slot)) => Location::Slot(slot, self.arena.slot(slot).state),
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
        if let Some(frame) = self.frame_mut(file, index) {
            frame.evicting = true;
        }
    }

    /// Ends an eviction [`begin_eviction`](Self::begin_eviction) started and unpins the frame
    /// (one transient pin). Returns whether the frame can now be given up: `written` (its
    /// write-back succeeded), clean, nothing loading, no other pin. The caller then unmaps it
    /// and calls [`remove_frame`](Self::remove_frame), without letting go of the books between.
    pub(crate) fn end_eviction(&mut self, file: FileId, index: u64, written: bool) -> bool {
        let Some(frame) = self.frame_mut(file, index) else { return false };
        frame.evicting = false;
        let free = written && frame.pins == 1 && frame.writers == 0 && frame.is_clean();
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

    fn frame_mut(&mut self, file: FileId, index: u64) -> Option<&mut FileFrame> {
        self.files.get_mut(&file).and_then(|f| f.frames.get_mut(&index))
    }

    /// Bytes of `file` resident (clean or dirty, in frames or slots) and dirty.
    pub(crate) fn resident_and_dirty(&self, file: FileId) -> (u64, u64) {
        let Some(books) = self.files.get(&file) else { return (0, 0) };
        let g = self.geometry;
        let (mut resident, dirty) = books.frame_bytes(g);
        for (&e, &slot) in &books.slots {
            if self.arena.slot(slot).state == SlotState::Clean {
                resident += g.bytes_of(e..e + 1, books.len).1;
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
        self.arena.in_use()
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
                let Some(slot) = self.arena.pin(id) else { return };
                if slot.pins == 1 && slot.lru != NIL {
                    self.lru.remove(slot.lru);
                    slot.lru = NIL;
                }
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
                let Some(slot) = self.arena.unpin(id) else { return };
                match slot.state {
                    SlotState::Clean => slot.lru = self.lru.push(unit),
                    SlotState::Stale => self.release_slot(id),
                    SlotState::Free | SlotState::Loading | SlotState::Retiring => {}
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
        books.frames.insert(index, FileFrame::new(per));
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
        debug_assert!(frame.is_clean());
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
        self.files.get_mut(&file).map_or_else(Vec::new, |f| f.claim_in_frames(g, extents))
    }

    /// Marks extents of `file` read in (`ok`: clean; otherwise absent again).
    pub(crate) fn finish_frame_loads(&mut self, file: FileId, extents: &[u64], ok: bool) {
        let g = self.geometry;
        if let Some(f) = self.files.get_mut(&file) {
            f.finish_frame_loads(g, extents, ok);
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
            let Some(x) = self.files.get_mut(&file).and_then(|f| f.extent_mut(g, e)) else {
                continue;
            };
            x.state = ExtentState::Loading;
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
        if let Some(x) = books.extent_mut(g, e) {
            if x.state == ExtentState::Loading {
                x.state = if ok { ExtentState::Clean } else { ExtentState::Absent };
            }
        }
        if !ok {
            return;
        }
        if let Some(slot) = books.slots.remove(&e) {
            if self.arena.slot(slot).pins == 0 {
                self.release_slot(slot);
            } else {
                // Out of the catalog now (readers of the directory must not find it), freed at
                // its last unpin.
                self.unpublish(slot);
                self.arena.slot_mut(slot).state = SlotState::Stale;
            }
        }
    }

    /// Marks `extents` of `file` dirty (each in a mapped frame, clean or dirty), newer than
    /// any write-back in progress.
    pub(crate) fn mark_dirty(&mut self, file: FileId, extents: Range<u64>) {
        let g = self.geometry;
        if let Some(f) = self.files.get_mut(&file) {
            f.mark_dirty(g, extents);
        }
    }

    /// Adds `delta` (±1) live writable views to each frame of `frames`.
    pub(crate) fn add_writers(&mut self, file: FileId, frames: Range<u64>, delta: i32) {
        if let Some(f) = self.files.get_mut(&file) {
            f.add_writers(frames, delta);
        }
    }

    /// The dirty extents among `extents` with their versions, sorted.
    pub(crate) fn dirty_in(&self, file: FileId, extents: Range<u64>) -> Vec<(u64, u32)> {
        let g = self.geometry;
        self.files.get(&file).map_or_else(Vec::new, |f| {
            f.scan_dirty(g, extents).into_iter().map(|(e, x)| (e, x.version)).collect()
        })
    }

    /// Claims the dirty extents among `extents`, but those in `skip` (which the caller has
    /// written already), that no write-back is writing (with their versions, sorted), and says
    /// whether others are being written: a write-back waits for those, so that one extent is
    /// never written by two write-backs at once.
    pub(crate) fn claim_writeback(
        &mut self,
        file: FileId,
        extents: Range<u64>,
        skip: &HashSet<u64>,
    ) -> (Vec<(u64, u32)>, bool) {
        let g = self.geometry;
        self.files
            .get_mut(&file)
            .map_or((Vec::new(), false), |f| f.claim_writeback(g, extents, skip))
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
        if let Some(f) = self.files.get_mut(&file) {
            f.finish_writeback(g, claimed, written);
        }
    }

    /// The frames of `file` no one pins, with nothing dirty or loading (for `evict`).
    pub(crate) fn idle_frames(&self, file: FileId) -> Vec<u64> {
        self.files.get(&file).map_or_else(Vec::new, FileBooks::idle_frames)
    }

    /// The slots of `file` no one pins (for `evict`).
    pub(crate) fn idle_slots(&self, file: FileId) -> Vec<SlotId> {
        self.files.get(&file).map_or_else(Vec::new, |books| {
            books
                .slots
                .values()
                .copied()
                .filter(|&s| {
                    let slot = self.arena.slot(s);
                    slot.pins == 0 && slot.state == SlotState::Clean
                })
                .collect()
        })
    }

    // ---- slots --------------------------------------------------------------------------

    /// Whether a slot is free for [`take_slot`](Self::take_slot).
    pub(crate) fn has_free_slot(&mut self) -> bool {
        self.reclaim();
        self.arena.has_free()
    }

    /// Frees the retiring slots no lookup outside the books can see any more.
    fn reclaim(&mut self) {
        if self.arena.retiring() > 0 {
            let catalog = &self.catalog;
            self.arena.reclaim(|at| catalog.reusable(at));
        }
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
        self.arena.slot(id).owner
    }

    /// The state of slot `id`.
    #[cfg(test)]
    pub(crate) fn slot_state(&self, id: SlotId) -> SlotState {
        self.arena.slot(id).state
    }

    /// Records a frame of memory, which the caller took from the budget
    /// ([`FrameBudget::try_take`]), as slots at a free position of the slot arena, and returns
    /// the position for the caller to map (all its slots free). `None`, with the frame given
    /// back, when every position is in use.
    pub(crate) fn add_slot_frame(&mut self) -> Option<usize> {
        let Some(position) = self.budget.take_position(self.shard) else {
            self.budget.give_back();
            return None;
        };
        self.arena.add_frame(position);
        self.frames_in_use += 1;
        Some(position)
    }

    /// Gives up the slot frame at `position`, none of whose slots anyone pins: its clean slots
    /// are evicted, and once no lookup outside the books can see any of them the frame goes
    /// (`true`: the caller unmaps it, then hands the position and the frame back with
    /// [`FrameBudget::release_slot_frame`] — not before, or another shard could map memory at
    /// a position still mapped). `false`: some are retiring; ask again when they are done.
    pub(crate) fn remove_slot_frame(&mut self, position: usize) -> bool {
        let Some(frame) = self.arena.frames.get(position).and_then(Option::as_ref) else {
            return false;
        };
        debug_assert_eq!(frame.busy, 0);
        let clean: Vec<SlotId> = (0..frame.slots.len())
            .filter(|&i| frame.slots[i].state == SlotState::Clean)
            .map(|i| (position * frame.slots.len() + i) as SlotId)
            .collect();
        for id in clean {
            self.evict_slot(id);
        }
        self.reclaim();
        if self.arena.frames[position].as_ref().is_some_and(|f| f.used > 0) {
            return false;
        }
        self.arena.remove_frame(position);
        self.frames_in_use -= 1;
        true
    }

    /// Takes a free slot for extent `e` of `file`: it becomes `Loading`, pinned once (a
    /// transient pin) by the caller, and is where requests find `e`. `None` when no slot is free.
    pub(crate) fn take_slot(&mut self, file: FileId, e: u64) -> Option<SlotId> {
        if !self.arena.has_free() {
            self.reclaim();
        }
        let id = self.arena.take(file, e)?;
        self.transient_pins += 1;
        if let Some(books) = self.files.get_mut(&file) {
            books.slots.insert(e, id);
        }
        Some(id)
    }

    /// Marks slot `id` read in (`ok`: clean, and in the catalog; otherwise free again). It
    /// stays pinned.
    pub(crate) fn finish_slot_load(&mut self, id: SlotId, ok: bool) {
        let slot = self.arena.slot(id);
        if slot.state != SlotState::Loading {
            return;
        }
        if ok {
            let published = key(slot.owner.0, slot.owner.1);
            if let Some(k) = published {
                self.catalog.fill(id, k);
            }
            let slot = self.arena.slot_mut(id);
            slot.state = SlotState::Clean;
            slot.published = published.is_some();
        } else {
            if let Some(books) = self.files.get_mut(&slot.owner.0) {
                if books.slots.get(&slot.owner.1) == Some(&id) {
                    books.slots.remove(&slot.owner.1);
                }
            }
            // Freed when its last pin goes.
            self.arena.slot_mut(id).state = SlotState::Stale;
        }
    }

    /// Makes slot `id` the most recently used, if it is clean, unpinned and one of these
    /// books' (lookups outside the books found it: the GPU's row gathers). Anything else —
    /// a slot since freed, refilled or handed to another shard — is left alone.
    pub(crate) fn touch_slot(&mut self, id: SlotId) {
        // A slot of a frame this shard does not hold reads as free here.
        let slot = self.arena.slot(id);
        if slot.state != SlotState::Clean || slot.pins > 0 || slot.lru == NIL {
            return;
        }
        self.lru.remove(slot.lru);
        self.arena.slot_mut(id).lru = self.lru.push(Unit::Slot(id));
    }

    /// Evicts slot `id` (clean, unpinned): its extent is no longer resident, and the slot is
    /// free for [`take_slot`](Self::take_slot).
    pub(crate) fn evict_slot(&mut self, id: SlotId) {
        let slot = self.arena.slot(id);
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
            let owner = self.arena.slot(id).owner;
            if let Some(books) = self.files.get_mut(&owner.0) {
                books.slots.remove(&owner.1);
                books.counters.evictions += 1;
            }
        }
        for &(_, id) in &victims {
            self.arena.slot_mut(id).lru = NIL;
            self.release_slot(id);
        }
        let evicted = victims.len();
        self.scratch = victims;
        evicted
    }

    /// Frees a slot no one pins: out of the LRU list and the catalog, onto the free list — or,
    /// while a lookup outside the books may still see what it held, retiring until none can.
    fn release_slot(&mut self, id: SlotId) {
        let slot = self.arena.slot(id);
        if slot.lru != NIL {
            self.lru.remove(slot.lru);
            self.arena.slot_mut(id).lru = NIL;
        }
        self.unpublish(id);
        if self.catalog.reusable(self.arena.slot(id).retire_at) {
            self.arena.free(id);
        } else {
            self.arena.retire(id);
        }
    }

    /// Takes slot `id` out of the catalog if it is there: the next publication clears it.
    fn unpublish(&mut self, id: SlotId) {
        if self.arena.slot(id).published {
            let at = self.catalog.retire(id);
            let slot = self.arena.slot_mut(id);
            slot.published = false;
            slot.retire_at = at;
        }
    }

    /// The shard of the books holding slot `id` (by its frame's position in the arena).
    pub(crate) fn shard_of_slot(budget: &FrameBudget, id: SlotId, per_frame: u64) -> usize {
        budget.holder(id as usize / per_frame as usize)
    }

    // ---- victims ------------------------------------------------------------------------

    /// What to give up for `want`: the least recently used unit that can go, clean before dirty.
    /// For a frame, an empty slot frame goes first, and a slot's whole frame goes when none of
    /// its slots is in use.
    pub(crate) fn victim(&mut self, want: Want) -> Victim {
        self.reclaim();
        if want == Want::Frame {
            if let Some(position) = self.arena.empty_frame() {
                return Victim::SlotFrame(position);
            }
        }
        let (mut dirty, mut ahead) = (None, None);
        for unit in self.lru.oldest_first() {
            match unit {
                Unit::Frame { file, index } => {
                    let Some(frame) = self.frame(file, index) else { continue };
                    if frame.is_clean() {
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
                        if let Some(position) = self.arena.idle_frame_of(id) {
                            return Victim::SlotFrame(position);
                        }
                    }
                },
            }
        }
        ahead.or(dirty).unwrap_or(Victim::None)
    }

    /// Checks every invariant the module docs promise; the first broken one, described.
    #[cfg(test)]
    pub(crate) fn check(&self) -> Result<(), String> {
        check::check(self)
    }
}
