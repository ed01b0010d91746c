//! Bringing extents in: a request (a view, a gather, a prefetch) -> the extents it lacks ->
//! claimed (single flight) -> read -> placed in their homes -> marked resident.
//!
//! - A **contiguous view** pins the file frames under its range (mapping missing ones, after
//!   making room), copies over extents that slots hold, reads the rest in runs of adjacent
//!   extents — each run one parallel read straight into the frames — and waits for extents
//!   others are reading.
//! - A **single-extent read view** (random access) is served from wherever its extent is; a
//!   missing extent goes into a slot (one extent of memory, not a frame) unless its frame is
//!   mapped anyway.
//! - A **gather** copies many ranges, of any files, into one buffer, in rounds that each pin at
//!   most a quarter of the budget: resident extents are copied from their homes; missing ones
//!   are read into pinned buffers (one per group of up to 4 MiB, on the pool) and placed into
//!   their slots and the caller's buffer by one kernel launch per group. Extents others are
//!   reading are left to the next round; extents of read-only files for which the budget has
//!   no room at all are read straight into the caller's buffer and not cached.
//!
//! No lock is held across I/O, and no one waits for anything while holding a claim: claims
//! are read in first, then the waiting starts, so two requests can never wait for each other.
#![forbid(unsafe_code)]

use std::ops::Range;
use std::time::Instant;

use parking_lot::MutexGuard;

use super::books::{
    ExtentState, FileCounters, FileId, IndexHashMap, Location, SlotId, SlotState, Unit, Want,
};
use super::cache::{CacheShared, FileEntry, Room, Shard, State};
use super::store::Home;
use crate::error::{Error, Result};
use crate::memory::bounce::BouncePool;
use crate::memory::cuda::{CudaDevice, DeviceCopy, RawRegion};
use crate::memory::DeviceViewMut;

/// Staging buffer of a gather group: misses are read into one pinned buffer this large.
const GATHER_GROUP: usize = 4 << 20;

/// The least a task of a prefetch's load moves (on the GPU's POSIX path). A load alone is
/// spread over the whole pool, 4 MiB a task for a 64 MiB window; prefetches run several ranges
/// at once, and there fewer, longer tasks pipeline better: on the H100 (2026-11-22, 4 GiB warm,
/// 16 threads), 64 MiB reads eight at a time ran at 36.5 GB/s in 4 MiB tasks and 47.0 in
/// 16 MiB ones (a whole-file read: 48–50). Read-ahead goes further: each of its pool jobs is
/// one task ([`PinFor::ReadAhead`]).
const PREFETCH_TASK: u64 = 16 << 20;

/// What a contiguous pin of a file's frames is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PinFor {
    /// A read view: resident and pinned until the view goes; its load spread over the pool.
    Read,
    /// A writable view: also marks the extents dirty and counts a live writer.
    Write,
    /// [`DeviceMappedFile::prefetch`](super::DeviceMappedFile::prefetch), on a thread of its
    /// own: resident, not kept pinned, read in tasks of at least [`PREFETCH_TASK`].
    Prefetch,
    /// A piece of a walk's read-ahead, as one job on the file's pool: resident, not kept
    /// pinned, never waiting for others (they may need the pool), and read as one task on the
    /// job's own thread. Split further, its tasks would go to threads busy with the other
    /// pieces, and the piece would finish only when the last of them did — a walk reading
    /// ahead in 64 MiB windows of 16 MiB tasks ran at 83–91 % of FileHandle's whole-file
    /// read, in 16 MiB pieces of one task each at 94–98 % (H100, 2026-11-22).
    ReadAhead,
}

impl PinFor {
    fn writes(self) -> bool {
        self == PinFor::Write
    }

    /// Whether the pins go before the request returns (the frames are only made resident).
    fn transient(self) -> bool {
        matches!(self, PinFor::Prefetch | PinFor::ReadAhead)
    }

    fn waits(self) -> bool {
        self != PinFor::ReadAhead
    }

    /// The least a task of the request's load moves (`u64::MAX`: each run in one task).
    fn min_task(self) -> u64 {
        match self {
            PinFor::Read | PinFor::Write => 0,
            PinFor::Prefetch => PREFETCH_TASK,
            PinFor::ReadAhead => u64::MAX,
        }
    }
}

/// Whether a request may wait for room or for a frame being evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Yes (holding nothing else).
    Yes,
    /// No: it fails with `OutOfBudget` (a read-ahead on a pool thread).
    No,
    /// No: it says so, and its caller lets go of what it holds elsewhere before it waits.
    Report,
}

/// Where a view's bytes are pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pins {
    /// Nothing (an empty view).
    Nothing,
    /// File frames (a contiguous home).
    Frames(Range<u64>),
    /// One slot holding the view's extent.
    Slot(SlotId),
    /// Nothing in the cache: the view is the file's zero-copy registration.
    ZeroCopy,
}

impl CacheShared {
    /// Pins the file frames under `[offset, offset + len)` of `entry`, with every extent in
    /// them resident, for `purpose` (see [`PinFor`]). A read-ahead never blocks on others:
    /// extents they are reading are left to them, and a full budget is `OutOfBudget` at once.
    ///
    /// A prefetch or read-ahead makes the frames resident but does not keep them: their pins
    /// go before this returns (`Pins::Nothing`), in the same hold of the lock that finished the
    /// loads. The frames then enter the LRU list in the order they were read, not whenever a
    /// busy thread comes back to unpin them — a late unpin would make a frame long used look
    /// newer than one read ahead and not yet used, which the next read-ahead would then evict.
    pub(crate) fn pin_frames(
        &self,
        entry: &FileEntry,
        offset: u64,
        len: u64,
        purpose: PinFor,
    ) -> Result<Pins> {
        let (transient, wait) = (purpose.transient(), purpose.waits());
        if len == 0 {
            return Ok(Pins::Nothing);
        }
        let g = self.geometry;
        let frames = g.frames_covering(offset, len);
        let extents = g.extents_covering(offset, len);
        let requested = (frames.end - frames.start) * g.frame;
        if (frames.end - frames.start) as usize > self.max_frames {
            return Err(self.out_of_budget(requested));
        }
        // Consecutive frames go round the shards, so a view within the budget has at most a
        // shard's share of frames in any one shard.
        let parts = self.shards_of_frames(entry.id, frames.clone());
        self.pin_parts(entry, &parts, requested, transient, wait)?;
        let unpin_all = || self.unpin_parts(entry, &parts, &vec![true; parts.len()], transient);
        // The view's extents in each frame of each part.
        let within: Vec<Vec<Range<u64>>> = parts
            .iter()
            .map(|(_, indices)| indices.iter().map(|&i| g.extents_in_frame(i, &extents)).collect())
            .collect();
        let mut counted = false;
        // Frames this prefetch read extents into.
        let mut read_in = Vec::new();
        loop {
            // Claims in every shard first (claiming never waits), then one read of them all.
            let mut claims: Vec<Claimed> = Vec::new();
            // A part with extents others are reading, and nothing to claim.
            let mut busy = None;
            for (k, (shard, _)) in parts.iter().enumerate() {
                let mut state = self.shards[*shard].state.lock();
                let (moves, loads) = claim_in(&mut state, entry, &within[k]);
                if !counted {
                    let wanted: u64 = within[k].iter().map(|r| r.end - r.start).sum();
                    if let Some(c) = state.books.counters_mut(entry.id) {
                        c.misses += loads.len() as u64;
                        c.hits += wanted - loads.len() as u64;
                    }
                }
                if !moves.is_empty() || !loads.is_empty() {
                    claims.push((*shard, moves, loads));
                } else if busy.is_none() && any_loading(&state, entry, &within[k]) {
                    busy = Some(k);
                }
            }
            counted = true;
            if claims.is_empty() {
                // Nothing left to read here. Where others are reading, wait — holding only
                // pins, which loads never wait for — in a hold of the lock that finds the part
                // still busy with nothing to claim: a part found idle with nothing to claim is
                // resident, and stays so while pinned.
                let Some(k) = busy.filter(|_| wait) else { break };
                let shard = parts[k].0;
                let sh = &self.shards[shard];
                let mut state = sh.state.lock();
                let (moves, loads) = claim_in(&mut state, entry, &within[k]);
                if moves.is_empty() && loads.is_empty() {
                    if any_loading(&state, entry, &within[k]) {
                        sh.changed.wait(&mut state);
                    }
                    continue;
                }
                claims.push((shard, moves, loads));
            }
            let moves: Vec<(u64, SlotId)> =
                claims.iter().flat_map(|c| c.1.iter().copied()).collect();
            let mut loads: Vec<u64> = claims.iter().flat_map(|c| c.2.iter().copied()).collect();
            loads.sort_unstable();
            if transient {
                read_in.extend(loads.iter().map(|&e| g.frame_of(e)));
            }
            let moved = self.move_to_frames(entry, &moves);
            let loaded = self.load_into_frames(entry, &loads, purpose.min_task());
            let mut moved_at = 0;
            for (shard, shard_moves, shard_loads) in &claims {
                let sh = &self.shards[*shard];
                let mut state = sh.state.lock();
                for ((e, slot), ok) in shard_moves.iter().zip(&moved[moved_at..]) {
                    state.books.moved_to_frame(entry.id, *e, *ok);
                    state.books.unpin(Unit::Slot(*slot), true);
                }
                moved_at += shard_moves.len();
                state.books.finish_frame_loads(entry.id, shard_loads, loaded.is_ok());
                drop(state);
                sh.changed.notify_all();
            }
            if let Err(e) = loaded {
                unpin_all();
                return Err(e);
            }
            if let Some(e) = moved.iter().position(|ok| !ok) {
                unpin_all();
                return Err(Error::InvalidArgument(format!(
                    "moving extent {} of {} from its slot failed",
                    moves[e].0,
                    entry.path.display()
                )));
            }
        }
        if transient {
            read_in.sort_unstable();
            read_in.dedup();
            for (shard, indices) in &parts {
                let sh = &self.shards[*shard];
                let mut state = sh.state.lock();
                let mine: Vec<u64> =
                    read_in.iter().copied().filter(|i| indices.contains(i)).collect();
                state.books.mark_read_ahead(entry.id, &mine);
                for &index in indices {
                    state.books.unpin(Unit::Frame { file: entry.id, index }, transient);
                }
                drop(state);
                sh.changed.notify_all();
            }
            return Ok(Pins::Nothing);
        }
        if purpose.writes() {
            for ((shard, indices), ranges) in parts.iter().zip(&within) {
                let mut state = self.shards[*shard].state.lock();
                for (&index, r) in indices.iter().zip(ranges.iter().cloned()) {
                    state.books.mark_dirty(entry.id, r);
                    state.books.add_writers(entry.id, index..index + 1, 1);
                }
            }
        }
        Ok(Pins::Frames(frames))
    }

    /// Pins every frame of `parts` (frames by shard), mapping the missing ones after making
    /// room for them. It never waits holding pins in another shard (two requests could each
    /// hold what the other waits for): when one shard must wait, everything is let go, that
    /// shard is waited for alone, and the others are pinned again. On failure nothing stays
    /// pinned.
    fn pin_parts(
        &self,
        entry: &FileEntry,
        parts: &[(usize, Vec<u64>)],
        requested: u64,
        transient: bool,
        wait: bool,
    ) -> Result<()> {
        let since = Instant::now();
        let mut pinned = vec![false; parts.len()];
        'again: loop {
            for (k, (shard, frames)) in parts.iter().enumerate() {
                if pinned[k] {
                    continue;
                }
                let sh = &self.shards[*shard];
                let mut state = sh.state.lock();
                // A read-ahead never waits, nor writes a victim back (it runs on the pool).
                let mode = if wait { Wait::Report } else { Wait::No };
                let tried = self
                    .map_and_pin(sh, &mut state, entry, frames, requested, transient, mode, since);
                drop(state);
                match tried {
                    Ok(true) => pinned[k] = true,
                    Ok(false) => {
                        self.unpin_parts(entry, parts, &pinned, transient);
                        pinned.fill(false);
                        let mut state = sh.state.lock();
                        let mode = Wait::Yes;
                        self.map_and_pin(
                            sh, &mut state, entry, frames, requested, transient, mode, since,
                        )?;
                        pinned[k] = true;
                        continue 'again;
                    }
                    Err(e) => {
                        self.unpin_parts(entry, parts, &pinned, transient);
                        return Err(e);
                    }
                }
            }
            return Ok(());
        }
    }

    /// Unpins the frames of the parts marked in `pinned`.
    fn unpin_parts(
        &self,
        entry: &FileEntry,
        parts: &[(usize, Vec<u64>)],
        pinned: &[bool],
        transient: bool,
    ) {
        for ((shard, frames), _) in parts.iter().zip(pinned).filter(|(_, &p)| p) {
            let sh = &self.shards[*shard];
            let mut state = sh.state.lock();
            for &index in frames {
                state.books.unpin(Unit::Frame { file: entry.id, index }, transient);
            }
            drop(state);
            sh.changed.notify_all();
        }
    }

    /// Pins every frame of `frames` (all in `shard`), mapping the missing ones after making
    /// room for them. When it would have to wait (for room, or for a frame being evicted):
    /// with `Wait::Yes` it lets its pins go and waits; with `Wait::No` it fails with
    /// `OutOfBudget`; with `Wait::Report` it lets its pins go and returns `false`. On failure
    /// nothing stays pinned.
    #[allow(clippy::too_many_arguments)]
    fn map_and_pin(
        &self,
        shard: &Shard,
        state: &mut MutexGuard<'_, State>,
        entry: &FileEntry,
        frames: &[u64],
        requested: u64,
        transient: bool,
        mode: Wait,
        since: Instant,
    ) -> Result<bool> {
        'again: loop {
            let mut pinned = Vec::new();
            let mut missing = Vec::new();
            let mut evicting = false;
            for &index in frames {
                if state.books.is_evicting(entry.id, index) {
                    evicting = true;
                } else if state.books.is_mapped(entry.id, index) {
                    state.books.pin(Unit::Frame { file: entry.id, index }, transient);
                    pinned.push(index);
                } else {
                    missing.push(index);
                }
            }
            let release = |state: &mut MutexGuard<'_, State>, pinned: &[u64]| {
                for &index in pinned {
                    state.books.unpin(Unit::Frame { file: entry.id, index }, transient);
                }
                shard.changed.notify_all();
            };
            if evicting {
                // Its bytes are going out so that its memory can go; it is read in again
                // afterwards. A write-back, so the wait is short.
                release(state, &pinned);
                match mode {
                    Wait::No => return Err(self.out_of_budget(requested)),
                    Wait::Report => return Ok(false),
                    Wait::Yes => {}
                }
                shard.changed.wait(state);
                continue 'again;
            }
            for index in missing {
                match self.make_room(shard, state, Want::Frame, mode != Wait::No) {
                    Ok(Room::Ready) => {}
                    Ok(Room::Released) => {
                        release(state, &pinned);
                        continue 'again;
                    }
                    Ok(Room::Full) => {
                        release(state, &pinned);
                        match mode {
                            Wait::No => return Err(self.out_of_budget(requested)),
                            Wait::Report => return Ok(false),
                            Wait::Yes => {}
                        }
                        self.wait_or_full(shard, state, requested, since)?;
                        continue 'again;
                    }
                    Err(e) => {
                        release(state, &pinned);
                        return Err(e);
                    }
                }
                // A frame of the budget is ours now: recorded once mapped, else given back.
                let t = Instant::now();
                let mapped = self.store.map_frame(&entry.memory, index);
                self.add_map_time(t);
                if let Err(e) = mapped {
                    state.books.budget().give_back();
                    release(state, &pinned);
                    return Err(e);
                }
                state.books.add_frame(entry.id, index, transient);
                pinned.push(index);
            }
            return Ok(true);
        }
    }

    /// Copies extents from their slots into their (pinned, mapped) frames; one result each.
    fn move_to_frames(&self, entry: &FileEntry, moves: &[(u64, SlotId)]) -> Vec<bool> {
        let g = self.geometry;
        moves
            .iter()
            .map(|&(e, slot)| {
                let (offset, len) = g.bytes_of(e..e + 1, entry.len);
                let len = if len == 0 { 0 } else { g.extent as usize };
                self.store
                    .copy_within(Home::Slot(slot, 0), Home::Frame(&entry.memory, offset), len)
                    .map_err(|err| tracing::warn!("moving extent {e} into its frame: {err}"))
                    .is_ok()
            })
            .collect()
    }

    /// Reads claimed extents into their (pinned, mapped) frames, runs of adjacent extents in
    /// parallel on the file's pool, in tasks of at least `min_task` bytes (see
    /// [`PinFor::min_task`]).
    fn load_into_frames(&self, entry: &FileEntry, loads: &[u64], min_task: u64) -> Result<()> {
        let _range = crate::profiling::Range::new(c"gpumap::cache::fault");
        if loads.is_empty() {
            return Ok(());
        }
        let g = self.geometry;
        let runs = g.runs(loads, self.store.frames_apart(), entry.len);
        let t = Instant::now();
        let result = entry.file.pool().run(runs.clone(), |(offset, len)| {
            // The file's last extent is filled with zeros past its end.
            let fill = ((offset + len).next_multiple_of(g.extent) - offset) as usize;
            let got = self.store.load(
                Home::Frame(&entry.memory, offset),
                &entry.file,
                offset,
                len as usize,
                fill,
                min_task,
            )?;
            if (got as u64) < len {
                // The file shrank under the map: what it no longer has is an error, not zeros.
                return Err(entry.file.eof_error(offset, len, got as u64));
            }
            Ok(got)
        });
        self.add_fault_time(t);
        // A file's counters are summed over the shards: any shard will do.
        let mut state = self.shards[self.shard_of_extent(entry.id, loads[0])].state.lock();
        if let Some(c) = state.books.counters_mut(entry.id) {
            c.fault_reads += runs.len() as u64;
            c.bytes_faulted += runs.iter().map(|r| r.1).sum::<u64>();
        }
        result.map(|_| ())
    }

    /// Pins extent `e` of `entry` wherever it is resident, reading it into a slot (or into its
    /// frame, when that is mapped anyway) if it is missing: the home of a single-extent read
    /// view. Costs one extent of memory for a miss, where a contiguous view costs a frame.
    pub(crate) fn pin_extent(&self, entry: &FileEntry, e: u64) -> Result<Pins> {
        let g = self.geometry;
        let index = g.frame_of(e);
        let frame = Unit::Frame { file: entry.id, index };
        let since = Instant::now();
        let shard = &self.shards[self.shard_of(entry.id, index)];
        let mut state = shard.state.lock();
        loop {
            match state.books.locate(entry.id, e) {
                Location::Frame(ExtentState::Clean | ExtentState::Dirty) => {
                    state.books.pin(frame, false);
                    count(&mut state, entry.id, 1, 0);
                    return Ok(Pins::Frames(index..index + 1));
                }
                Location::Slot(slot, SlotState::Clean) => {
                    state.books.pin(Unit::Slot(slot), false);
                    count(&mut state, entry.id, 1, 0);
                    return Ok(Pins::Slot(slot));
                }
                Location::Frame(ExtentState::Absent) => {
                    // Its frame is mapped anyway: read it there, at no cost in memory.
                    state.books.pin(frame, false);
                    let claimed = state.books.claim_in_frames(entry.id, e..e + 1);
                    if claimed.is_empty() {
                        state.books.unpin(frame, false);
                        shard.changed.wait(&mut state);
                        continue;
                    }
                    count(&mut state, entry.id, 0, 1);
                    let result = MutexGuard::unlocked(&mut state, || {
                        self.load_into_frames(entry, &claimed, 0)
                    });
                    state.books.finish_frame_loads(entry.id, &claimed, result.is_ok());
                    if result.is_err() {
                        state.books.unpin(frame, false);
                    }
                    shard.changed.notify_all();
                    return result.map(|()| Pins::Frames(index..index + 1));
                }
                Location::Frame(ExtentState::Loading) | Location::Slot(..) => {
                    shard.changed.wait(&mut state);
                }
                Location::Nowhere => {
                    match self.make_room(shard, &mut state, Want::Slot, true)? {
                        Room::Ready => {}
                        Room::Released => continue,
                        Room::Full => {
                            self.wait_or_full(shard, &mut state, g.extent, since)?;
                            continue;
                        }
                    }
                    let Some(slot) = state.books.take_slot(entry.id, e) else { continue };
                    count(&mut state, entry.id, 0, 1);
                    let (offset, len) = g.bytes_of(e..e + 1, entry.len);
                    let result = MutexGuard::unlocked(&mut state, || {
                        // The read alone: not the wait for the lock afterwards.
                        let t = Instant::now();
                        let loaded = self.store.load(
                            Home::Slot(slot, 0),
                            &entry.file,
                            offset,
                            len as usize,
                            g.extent as usize,
                            0,
                        );
                        self.add_fault_time(t);
                        loaded
                    });
                    let result = result.and_then(|got| match got as u64 {
                        got if got < len => Err(entry.file.eof_error(offset, len, got)),
                        _ => Ok(()),
                    });
                    if let Some(c) = state.books.counters_mut(entry.id) {
                        c.fault_reads += 1;
                        c.bytes_faulted += len;
                    }
                    state.books.finish_slot_load(slot, result.is_ok());
                    if result.is_ok() {
                        state.books.pin(Unit::Slot(slot), false);
                    }
                    state.books.unpin(Unit::Slot(slot), true);
                    shard.changed.notify_all();
                    return result.map(|()| Pins::Slot(slot));
                }
            }
        }
    }

    /// Undoes what a view pinned; a writable view's extents become newer than any write-back
    /// in progress, and its writer goes.
    pub(crate) fn unpin_view(
        &self,
        entry: &FileEntry,
        pins: &Pins,
        extents: Range<u64>,
        write: bool,
    ) {
        if matches!(pins, Pins::Nothing | Pins::ZeroCopy) {
            // Nothing in the books: no lock, no wake-up (zero-copy views come and go by the
            // million).
            return;
        }
        match pins {
            Pins::Nothing | Pins::ZeroCopy => {}
            Pins::Frames(frames) => {
                for (shard, indices) in self.shards_of_frames(entry.id, frames.clone()) {
                    let sh = &self.shards[shard];
                    let mut state = sh.state.lock();
                    for index in indices {
                        if write {
                            let r = self.geometry.extents_in_frame(index, &extents);
                            state.books.mark_dirty(entry.id, r);
                            state.books.add_writers(entry.id, index..index + 1, -1);
                        }
                        state.books.unpin(Unit::Frame { file: entry.id, index }, false);
                    }
                    drop(state);
                    sh.changed.notify_all();
                }
            }
            Pins::Slot(slot) => {
                let sh = &self.shards[self.shard_of_slot(*slot)];
                sh.state.lock().books.unpin(Unit::Slot(*slot), false);
                sh.changed.notify_all();
            }
        }
    }
}

/// What a contiguous view claimed in one shard: (shard, extents to move in from slots, extents
/// to read).
type Claimed = (usize, Vec<(u64, SlotId)>, Vec<u64>);

/// Claims, in `ranges` of `entry`'s extents (in one shard's pinned frames), those held by clean
/// slots, for moving into their frames, and the absent ones, for reading.
fn claim_in(
    state: &mut MutexGuard<'_, State>,
    entry: &FileEntry,
    ranges: &[Range<u64>],
) -> (Vec<(u64, SlotId)>, Vec<u64>) {
    let (mut moves, mut loads) = (Vec::new(), Vec::new());
    for r in ranges {
        moves.extend(state.books.claim_moves(entry.id, r.clone()));
        loads.extend(state.books.claim_in_frames(entry.id, r.clone()));
    }
    (moves, loads)
}

/// Whether others are reading any extent of `ranges` of `entry`.
fn any_loading(state: &MutexGuard<'_, State>, entry: &FileEntry, ranges: &[Range<u64>]) -> bool {
    ranges.iter().any(|r| state.books.any_loading(entry.id, r.clone()))
}

/// Adds `hits` and `misses` to a file's counters.
fn count(state: &mut MutexGuard<'_, State>, file: FileId, hits: u64, misses: u64) {
    if let Some(c) = state.books.counters_mut(file) {
        c.hits += hits;
        c.misses += misses;
    }
}

/// One range of a gather: `len` bytes of `entry` at `offset`.
pub(crate) struct GatherRange<'a> {
    pub(crate) entry: &'a FileEntry,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// A gather's range cut at extent borders: `len` bytes at `at` in extent `e` of range
/// `range`'s file, going to `dst` in the caller's buffer.
#[derive(Debug, Clone, Copy)]
struct Segment {
    range: usize,
    e: u64,
    at: u64,
    len: usize,
    dst: usize,
}

/// Where a round found (or put) an extent.
#[derive(Debug, Clone, Copy)]
enum Place {
    Frame,
    Slot(SlotId),
    /// Nowhere in the cache: read straight into the caller's buffer (a read-only file's
    /// extent for which the budget had no room).
    Through,
}

/// An extent a round reads in, and the segments that want it.
struct Miss {
    range: usize,
    e: u64,
    place: Place,
    /// The first segment that wants it, and any others (rare: two rows of one extent), kept
    /// apart so that a miss costs no allocation under the lock.
    first_segment: usize,
    more_segments: Vec<usize>,
}

impl Miss {
    fn new(seg: Segment, first_segment: usize, place: Place) -> Miss {
        Miss { range: seg.range, e: seg.e, place, first_segment, more_segments: Vec::new() }
    }

    fn segments(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(self.first_segment).chain(self.more_segments.iter().copied())
    }
}

/// What a round adds to each file's counters, summed per file (a gather's rows come from few
/// files) and added to the books in one go.
#[derive(Default)]
struct Tally(Vec<(FileId, FileCounters)>);

impl Tally {
    /// The counters to add to for `file`.
    fn of(&mut self, file: FileId) -> &mut FileCounters {
        let at = match self.0.iter().position(|t| t.0 == file) {
            Some(at) => at,
            None => {
                self.0.push((file, FileCounters::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[at].1
    }

    fn add(&mut self, file: FileId, hits: u64, misses: u64) {
        let c = self.of(file);
        c.hits += hits;
        c.misses += misses;
    }

    fn apply(self, state: &mut MutexGuard<'_, State>) {
        for (file, delta) in self.0 {
            if let Some(c) = state.books.counters_mut(file) {
                c.add(&delta);
            }
        }
    }
}

/// The part of a round one shard planned: its misses and pins.
struct Part {
    shard: usize,
    misses: Range<usize>,
    pins: Range<usize>,
}

/// What one round of a gather does.
#[derive(Default)]
struct Round {
    hits: Vec<(usize, Place)>,
    misses: Vec<Miss>,
    pins: Vec<Unit>,
    parts: Vec<Part>,
    deferred: Vec<usize>,
    /// Read-only files' extents that find no room are read through ([`Place::Through`]).
    through: bool,
    /// Making room failed (a dirty victim's write-back): returned once the round's pins went.
    error: Option<Error>,
}

impl CacheShared {
    /// Copies `ranges`, packed one after another, into `dst` (or, without `dst`, only makes
    /// them resident: a batch prefetch). The caller checked the ranges and `dst`'s size.
    pub(crate) fn gather(
        &self,
        ranges: &[GatherRange<'_>],
        mut dst: Option<DeviceViewMut<'_>>,
    ) -> Result<()> {
        let g = self.geometry;
        let mut segments = Vec::new();
        let mut at_dst = 0usize;
        for (i, r) in ranges.iter().enumerate() {
            let mut offset = r.offset;
            let end = r.offset + r.len;
            while offset < end {
                let e = offset / g.extent;
                let next = ((e + 1) * g.extent).min(end);
                let len = (next - offset) as usize;
                segments.push(Segment { range: i, e, at: offset % g.extent, len, dst: at_dst });
                at_dst += len;
                offset = next;
            }
        }
        // Extents of read-only files for which the budget has no room are read straight into
        // `dst` rather than waited for: nothing can make them differ from the file, and under
        // a budget full of others' pins waiting only adds rounds.
        let through = dst.is_some();
        // A round pins at most a quarter of each shard's extents.
        let n = self.shards.len();
        let capacity = self.max_frames / n * g.per_frame() as usize;
        let limit = (capacity / 4).max(1);
        let mut todo: Vec<usize> = (0..segments.len()).collect();
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut since = Instant::now();
        while !todo.is_empty() {
            let mut round = Round { through, ..Round::default() };
            for rows in &mut by_shard {
                rows.clear();
            }
            for s in todo {
                let seg = &segments[s];
                by_shard[self.shard_of_extent(ranges[seg.range].entry.id, seg.e)].push(s);
            }
            for (shard, rows) in by_shard.iter().enumerate() {
                if rows.is_empty() {
                    continue;
                }
                let sh = &self.shards[shard];
                let (misses, pins) = (round.misses.len(), round.pins.len());
                let mut state = sh.state.lock();
                self.plan_round(sh, &mut state, ranges, &segments, rows, limit, &mut round);
                drop(state);
                round.parts.push(Part {
                    shard,
                    misses: misses..round.misses.len(),
                    pins: pins..round.pins.len(),
                });
            }
            let progress = !round.hits.is_empty() || !round.misses.is_empty();
            let result = self.run_round(ranges, &segments, &round, dst.as_mut());
            for part in &round.parts {
                // Reads and bytes per file, summed before the lock is taken.
                let mut faulted = Tally::default();
                for miss in &round.misses[part.misses.clone()] {
                    let entry = ranges[miss.range].entry;
                    let c = faulted.of(entry.id);
                    c.fault_reads += 1;
                    c.bytes_faulted += g.bytes_of(miss.e..miss.e + 1, entry.len).1;
                }
                let sh = &self.shards[part.shard];
                let mut state = sh.state.lock();
                faulted.apply(&mut state);
                for miss in &round.misses[part.misses.clone()] {
                    let ok = result.is_ok();
                    match miss.place {
                        Place::Slot(slot) => state.books.finish_slot_load(slot, ok),
                        Place::Frame => state.books.finish_frame_loads(
                            ranges[miss.range].entry.id,
                            &[miss.e],
                            ok,
                        ),
                        Place::Through => {}
                    }
                }
                for unit in &round.pins[part.pins.clone()] {
                    state.books.unpin(*unit, true);
                }
                drop(state);
                sh.changed.notify_all();
            }
            result?;
            if let Some(e) = round.error {
                return Err(e);
            }
            if progress {
                since = Instant::now();
            } else if let Some(&s) = round.deferred.first() {
                // Nothing could be pinned: others' reads and gathers hold the memory (they
                // end), or views do (waited for, up to the cache's pin wait).
                let seg = &segments[s];
                let sh = &self.shards[self.shard_of_extent(ranges[seg.range].entry.id, seg.e)];
                let mut state = sh.state.lock();
                self.wait_or_full(sh, &mut state, g.extent, since)?;
            }
            todo = round.deferred;
        }
        Ok(())
    }

    /// Decides what one round does, pinning what it uses: at most `limit` rows; extents others
    /// are reading, and what does not fit, are deferred — or, in a round that reads through,
    /// read-only files' extents that find no room are read through (see [`Place::Through`]).
    ///
    /// Under the lock, a row costs the cache misses of the books it touches (its file's index,
    /// a slot, a list node), not instructions; so the round goes in steps, each over all its
    /// rows — where the extents are; pins and claims; room for the misses; their slots — and
    /// the misses of one step's rows, independent of each other, overlap.
    #[allow(clippy::too_many_arguments)]
    fn plan_round(
        &self,
        shard: &Shard,
        state: &mut MutexGuard<'_, State>,
        ranges: &[GatherRange<'_>],
        segments: &[Segment],
        todo: &[usize],
        limit: usize,
        round: &mut Round,
    ) {
        let rows = &todo[..todo.len().min(limit)];
        round.deferred.extend_from_slice(&todo[rows.len()..]);
        let file_of = |s: usize| ranges[segments[s].range].entry.id;
        let located: Vec<Location> =
            rows.iter().map(|&s| state.books.locate(file_of(s), segments[s].e)).collect();
        // (file, extent) -> the miss (or, with `PENDING` set, the slot still wanted) of the
        // round that reads it: a second row of the extent waits for that read, not its own.
        const PENDING: usize = 1 << (usize::BITS - 1);
        let mut claimed: IndexHashMap<(FileId, u64), usize> = IndexHashMap::default();
        claimed.reserve(rows.len());
        let mut wanted: Vec<Miss> = Vec::new();
        let mut tally = Tally::default();
        for (&s, location) in rows.iter().zip(located) {
            let seg = segments[s];
            let file = file_of(s);
            if let Some(&m) = claimed.get(&(file, seg.e)) {
                match m & PENDING {
                    0 => {
                        round.misses[m].more_segments.push(s);
                        tally.add(file, 1, 0);
                    }
                    _ => wanted[m & !PENDING].more_segments.push(s),
                }
                continue;
            }
            let frame = Unit::Frame { file, index: self.geometry.frame_of(seg.e) };
            match location {
                Location::Frame(ExtentState::Clean | ExtentState::Dirty) => {
                    state.books.pin(frame, true);
                    round.pins.push(frame);
                    round.hits.push((s, Place::Frame));
                    tally.add(file, 1, 0);
                }
                Location::Slot(slot, SlotState::Clean) => {
                    state.books.pin(Unit::Slot(slot), true);
                    round.pins.push(Unit::Slot(slot));
                    round.hits.push((s, Place::Slot(slot)));
                    tally.add(file, 1, 0);
                }
                Location::Frame(ExtentState::Absent) => {
                    state.books.pin(frame, true);
                    round.pins.push(frame);
                    state.books.claim_in_frames(file, seg.e..seg.e + 1);
                    claimed.insert((file, seg.e), round.misses.len());
                    round.misses.push(Miss::new(seg, s, Place::Frame));
                    tally.add(file, 0, 1);
                }
                Location::Frame(ExtentState::Loading) | Location::Slot(..) => {
                    round.deferred.push(s)
                }
                Location::Nowhere => {
                    claimed.insert((file, seg.e), PENDING | wanted.len());
                    wanted.push(Miss::new(seg, s, Place::Frame));
                }
            }
        }
        self.take_slots(shard, state, ranges, wanted, round, &mut tally);
        tally.apply(state);
    }

    /// Gives each of `wanted` (extents no one holds) a slot, in order, making room: free slots,
    /// new slot frames while the budget has room, then the least recently used slots in one
    /// sweep, and only then the general way (frames, write-backs), which may let go of the
    /// lock — after which the rest is deferred to the next round, which looks again. Where no
    /// room can be made, the rest is deferred too, or in a round that reads through, read
    /// through if its file is read-only.
    fn take_slots(
        &self,
        shard: &Shard,
        state: &mut MutexGuard<'_, State>,
        ranges: &[GatherRange<'_>],
        wanted: Vec<Miss>,
        round: &mut Round,
        tally: &mut Tally,
    ) {
        let mut swept = false;
        let mut full = false;
        let mut left = wanted.len();
        let mut wanted = wanted.into_iter();
        while let Some(mut miss) = wanted.next() {
            let file = ranges[miss.range].entry.id;
            let slot = loop {
                if let Some(slot) = state.books.take_slot(file, miss.e) {
                    break Some(slot);
                }
                if !state.books.has_room() && !swept {
                    swept = true;
                    if state.books.evict_oldest_slots(left) > 0 {
                        continue;
                    }
                }
                match self.make_room(shard, state, Want::Slot, true) {
                    Ok(Room::Ready) => continue,
                    Ok(Room::Released) => break None,
                    Ok(Room::Full) => {
                        full = true;
                        break None;
                    }
                    Err(e) => {
                        round.error = Some(e);
                        break None;
                    }
                }
            };
            let Some(slot) = slot else {
                for mut miss in std::iter::once(miss).chain(wanted) {
                    let file = ranges[miss.range].entry;
                    if full && round.through && !file.writable {
                        miss.place = Place::Through;
                        tally.add(file.id, miss.more_segments.len() as u64, 1);
                        round.misses.push(miss);
                    } else {
                        round.deferred.extend(miss.segments());
                    }
                }
                return;
            };
            left -= 1;
            round.pins.push(Unit::Slot(slot));
            miss.place = Place::Slot(slot);
            tally.add(file, miss.more_segments.len() as u64, 1);
            round.misses.push(miss);
        }
    }

    /// Where segment `seg` of a round is in memory (`None`: read through, nowhere).
    fn home<'a>(
        &self,
        ranges: &[GatherRange<'a>],
        seg: &Segment,
        place: Place,
    ) -> Option<Home<'a>> {
        match place {
            Place::Frame => Some(Home::Frame(
                &ranges[seg.range].entry.memory,
                seg.e * self.geometry.extent + seg.at,
            )),
            Place::Slot(slot) => Some(Home::Slot(slot, seg.at)),
            Place::Through => None,
        }
    }

    /// Reads a round's misses into their homes and copies its segments into `dst`.
    fn run_round(
        &self,
        ranges: &[GatherRange<'_>],
        segments: &[Segment],
        round: &Round,
        dst: Option<&mut DeviceViewMut<'_>>,
    ) -> Result<()> {
        let device_dst = match &dst {
            None => Some(None),
            Some(DeviceViewMut::Cuda(v)) => Some(Some(v.raw)),
            Some(DeviceViewMut::Host(_)) => None,
        };
        let t = Instant::now();
        let result = match (self.store.copier(), device_dst) {
            (Some(_), Some(target)) => self.run_round_on_device(ranges, segments, round, target),
            _ => self.run_round_through_host(ranges, segments, round, dst),
        };
        self.add_fault_time(t);
        result
    }

    /// The GPU path: misses read into pinned buffers, a group of up to 4 MiB each on the pool,
    /// and placed — into their homes and into `dst` — by one kernel launch per group; resident
    /// extents copied from their homes by one more.
    fn run_round_on_device(
        &self,
        ranges: &[GatherRange<'_>],
        segments: &[Segment],
        round: &Round,
        dst: Option<RawRegion>,
    ) -> Result<()> {
        let g = self.geometry;
        let extent = g.extent as usize;
        let copier = self.store.copier().ok_or_else(|| Error::InvalidArgument("no GPU".into()))?;
        let address = |seg: &Segment, place: Place| -> Result<u64> {
            self.home(ranges, seg, place)
                .and_then(|home| self.store.region(home, seg.len))
                .map(|region| region.ptr)
                .ok_or_else(|| Error::InvalidArgument("no address".into()))
        };
        if let Some(first) = round.misses.first() {
            let pool = ranges[first.range].entry.file.pool();
            let device = match self.store.device() {
                crate::memory::Device::Cuda(d) => d,
                crate::memory::Device::Host => return Err(Error::InvalidArgument("no GPU".into())),
            };
            let bounce = BouncePool::for_device(&device, GATHER_GROUP, 2 * pool.nthreads())?;
            let groups: Vec<&[Miss]> =
                round.misses.chunks((GATHER_GROUP / extent).max(1)).collect();
            pool.run(groups, |group| {
                // On the pool thread too: its launch is part of the gather's timeline.
                let _range = crate::profiling::Range::new(c"gpumap::cache::gather");
                CudaDevice::bind_to_thread(&device)?;
                let mut buffer = bounce.acquire()?;
                let base = buffer.as_ptr() as u64;
                // (offset in the buffer, destination, length): each miss whole into its home,
                // and its segments into `dst`.
                let mut pieces = Vec::with_capacity(group.len() * 2);
                for (k, miss) in group.iter().enumerate() {
                    let entry = ranges[miss.range].entry;
                    let (offset, len) = g.bytes_of(miss.e..miss.e + 1, entry.len);
                    let piece = &mut buffer[k * extent..(k + 1) * extent];
                    let got = entry.file.read_at(&mut piece[..len as usize], offset)?;
                    if (got as u64) < len {
                        return Err(entry.file.eof_error(offset, len, got as u64));
                    }
                    piece[got..].fill(0);
                    let at = k * extent;
                    if !matches!(miss.place, Place::Through) {
                        let whole =
                            Segment { range: miss.range, e: miss.e, at: 0, len: extent, dst: 0 };
                        pieces.push((at, address(&whole, miss.place)?, extent as u32));
                    }
                    if let Some(dst) = dst {
                        for s in miss.segments() {
                            let seg = &segments[s];
                            pieces.push((
                                at + seg.at as usize,
                                dst.ptr + seg.dst as u64,
                                seg.len as u32,
                            ));
                        }
                    }
                }
                // One packed upload of the group, then one launch places every piece.
                copier.upload_and_scatter(base, group.len() * extent, &pieces)?;
                drop(buffer);
                Ok(group.len())
            })?;
        }
        if let Some(dst) = dst {
            let copies = round
                .hits
                .iter()
                .map(|&(s, place)| {
                    let seg = &segments[s];
                    Ok(DeviceCopy {
                        src: address(seg, place)?,
                        dst: dst.ptr + seg.dst as u64,
                        len: seg.len as u32,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            copier.copy(&copies)?;
        }
        Ok(())
    }

    /// The host path (a host-memory cache, or a host buffer to gather into): misses read into
    /// their homes in parallel (those read through into buffers of their own), then every
    /// segment copied out.
    fn run_round_through_host(
        &self,
        ranges: &[GatherRange<'_>],
        segments: &[Segment],
        round: &Round,
        dst: Option<&mut DeviceViewMut<'_>>,
    ) -> Result<()> {
        let g = self.geometry;
        let extent = g.extent as usize;
        // One buffer per miss read through (empty for the others), filled on the pool.
        let through: Vec<parking_lot::Mutex<Vec<u8>>> = round
            .misses
            .iter()
            .map(|m| {
                let len = if matches!(m.place, Place::Through) { extent } else { 0 };
                parking_lot::Mutex::new(vec![0u8; len])
            })
            .collect();
        if let Some(first) = round.misses.first() {
            let pool = ranges[first.range].entry.file.pool();
            pool.run(round.misses.iter().zip(&through).collect(), |(miss, bytes)| {
                let entry = ranges[miss.range].entry;
                let (offset, len) = g.bytes_of(miss.e..miss.e + 1, entry.len);
                let whole = Segment { range: miss.range, e: miss.e, at: 0, len: 0, dst: 0 };
                let got = match self.home(ranges, &whole, miss.place) {
                    Some(home) => {
                        self.store.load(home, &entry.file, offset, len as usize, extent, 0)?
                    }
                    None => entry.file.read_at(&mut bytes.lock()[..len as usize], offset)?,
                };
                if (got as u64) < len {
                    return Err(entry.file.eof_error(offset, len, got as u64));
                }
                Ok(got)
            })?;
        }
        let Some(dst) = dst else { return Ok(()) };
        let mut bytes = Vec::new();
        let hits = round.hits.iter().map(|&(s, place)| (s, place, None));
        let misses = round
            .misses
            .iter()
            .zip(&through)
            .flat_map(|(m, read)| m.segments().map(move |s| (s, m.place, Some(read))));
        for (s, place, read) in hits.chain(misses) {
            let seg = &segments[s];
            let out = match dst {
                DeviceViewMut::Host(out) => &mut out[seg.dst..seg.dst + seg.len],
                DeviceViewMut::Cuda(_) => {
                    bytes.resize(seg.len, 0);
                    &mut bytes[..]
                }
            };
            match (self.home(ranges, seg, place), read) {
                (Some(home), _) => self.store.copy_out(home, out)?,
                (None, Some(read)) => {
                    let at = seg.at as usize;
                    out.copy_from_slice(&read.lock()[at..at + seg.len]);
                }
                (None, None) => return Err(Error::InvalidArgument("a hit with no home".into())),
            }
            if let DeviceViewMut::Cuda(view) = dst {
                view.copy_from_host(seg.dst, &bytes)?;
            }
        }
        Ok(())
    }
}
