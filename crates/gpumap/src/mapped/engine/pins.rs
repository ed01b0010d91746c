//! Faults of views: a request (a view, a prefetch, a walk's read-ahead) -> the extents it
//! lacks -> claimed (single flight) -> read -> placed in their homes -> marked resident.
//!
//! - A **contiguous view** pins the file frames under its range (mapping missing ones, after
//!   making room), copies over extents that slots hold, reads the rest in runs of adjacent
//!   extents — each run one parallel read straight into the frames — and waits for extents
//!   others are reading.
//! - A **single-extent read view** (random access) is served from wherever its extent is; a
//!   missing extent goes into a slot (one extent of memory, not a frame) unless its frame is
//!   mapped anyway.
//!
//! No lock is held across I/O, and no one waits for anything while holding a claim: claims
//! are read in first, then the waiting starts, so two requests can never wait for each other.
#![forbid(unsafe_code)]

use std::ops::Range;
use std::time::Instant;

use crate::sync::MutexGuard;

use super::books::{ExtentState, FileId, Location, SlotId, SlotState, Unit, Want};
use super::room::{self, Room};
use super::state::{Engine, FileEntry, Shard, State};
use super::store::Home;
use crate::error::{Error, Result};

/// The least a task of a prefetch's load moves (on the GPU's POSIX path). A load alone is
/// spread over the whole pool, 4 MiB a task for a 64 MiB window; prefetches run several ranges
/// at once, and there fewer, longer tasks pipeline better, each overlapping its reads with its
/// copies (docs/decisions/0002-read-ahead-in-pieces.md). Read-ahead goes further: each of its
/// pool jobs is one task ([`PinFor::ReadAhead`]).
const PREFETCH_TASK: u64 = 16 << 20;

/// What a contiguous pin of a file's frames is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PinFor {
    /// A read view: resident and pinned until the view goes; its load spread over the pool.
    Read,
    /// A writable view: also marks the extents dirty and counts a live writer.
    Write,
    /// A prefetch (the mapped file's `prefetch`), on a thread of its
    /// own: resident, not kept pinned, read in tasks of at least [`PREFETCH_TASK`].
    Prefetch,
    /// A piece of a walk's read-ahead, as one job on the file's pool: resident, not kept
    /// pinned, never waiting for others (they may need the pool), and read as one task on the
    /// job's own thread. Split further, its tasks would go to threads busy with the other
    /// pieces, and the piece would finish only when the last of them did, so pieces would come
    /// in together and the pool would run dry between them
    /// (docs/decisions/0002-read-ahead-in-pieces.md).
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
    engine: &Engine,
    entry: &FileEntry,
    offset: u64,
    len: u64,
    purpose: PinFor,
) -> Result<Pins> {
    let (transient, wait) = (purpose.transient(), purpose.waits());
    if len == 0 {
        return Ok(Pins::Nothing);
    }
    let g = engine.geometry;
    let frames = g.frames_covering(offset, len);
    let extents = g.extents_covering(offset, len);
    let requested = (frames.end - frames.start) * g.frame;
    if (frames.end - frames.start) as usize > engine.max_frames {
        return Err(engine.out_of_budget(requested));
    }
    // Consecutive frames go round the shards, so a view within the budget has at most a
    // shard's share of frames in any one shard.
    let parts = engine.shards_of_frames(entry.id, frames.clone());
    pin_parts(engine, entry, &parts, requested, transient, wait)?;
    let unpin_all = || unpin_parts(engine, entry, &parts, &vec![true; parts.len()], transient);
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
            let mut state = engine.shards[*shard].state.lock();
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
            let sh = &engine.shards[shard];
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
        let moves: Vec<(u64, SlotId)> = claims.iter().flat_map(|c| c.1.iter().copied()).collect();
        let mut loads: Vec<u64> = claims.iter().flat_map(|c| c.2.iter().copied()).collect();
        loads.sort_unstable();
        if transient {
            read_in.extend(loads.iter().map(|&e| g.frame_of(e)));
        }
        let moved = move_to_frames(engine, entry, &moves);
        let loaded = load_into_frames(engine, entry, &loads, purpose.min_task());
        let mut moved_at = 0;
        for (shard, shard_moves, shard_loads) in &claims {
            let sh = &engine.shards[*shard];
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
            let sh = &engine.shards[*shard];
            let mut state = sh.state.lock();
            let mine: Vec<u64> = read_in.iter().copied().filter(|i| indices.contains(i)).collect();
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
            let mut state = engine.shards[*shard].state.lock();
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
    engine: &Engine,
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
            let sh = &engine.shards[*shard];
            let mut state = sh.state.lock();
            // A read-ahead never waits, nor writes a victim back (it runs on the pool).
            let mode = if wait { Wait::Report } else { Wait::No };
            let tried = map_and_pin(
                engine, sh, &mut state, entry, frames, requested, transient, mode, since,
            );
            drop(state);
            match tried {
                Ok(true) => pinned[k] = true,
                Ok(false) => {
                    unpin_parts(engine, entry, parts, &pinned, transient);
                    pinned.fill(false);
                    // Waiting on one shard lets it take the frames just let go in the others,
                    // which the next pass then misses: a request that cannot fit beside what
                    // others pin would go round for ever, the wait's own deadline never
                    // reached. Bounded by the same deadline.
                    if since.elapsed() >= engine.pin_wait {
                        return Err(engine.out_of_budget(requested));
                    }
                    let mut state = sh.state.lock();
                    let mode = Wait::Yes;
                    map_and_pin(
                        engine, sh, &mut state, entry, frames, requested, transient, mode, since,
                    )?;
                    pinned[k] = true;
                    continue 'again;
                }
                Err(e) => {
                    unpin_parts(engine, entry, parts, &pinned, transient);
                    return Err(e);
                }
            }
        }
        return Ok(());
    }
}

/// Unpins the frames of the parts marked in `pinned`.
fn unpin_parts(
    engine: &Engine,
    entry: &FileEntry,
    parts: &[(usize, Vec<u64>)],
    pinned: &[bool],
    transient: bool,
) {
    for ((shard, frames), _) in parts.iter().zip(pinned).filter(|(_, &p)| p) {
        let sh = &engine.shards[*shard];
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
    engine: &Engine,
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
                Wait::No => return Err(engine.out_of_budget(requested)),
                Wait::Report => return Ok(false),
                Wait::Yes => {}
            }
            shard.changed.wait(state);
            continue 'again;
        }
        for index in missing {
            match room::make_room(engine, shard, state, Want::Frame, mode != Wait::No) {
                Ok(Room::Ready) => {}
                Ok(Room::Released) => {
                    release(state, &pinned);
                    continue 'again;
                }
                Ok(Room::Full) => {
                    release(state, &pinned);
                    match mode {
                        Wait::No => return Err(engine.out_of_budget(requested)),
                        Wait::Report => return Ok(false),
                        Wait::Yes => {}
                    }
                    room::wait_or_full(engine, shard, state, requested, since)?;
                    continue 'again;
                }
                Err(e) => {
                    release(state, &pinned);
                    return Err(e);
                }
            }
            // A frame of the budget is ours now: recorded once mapped, else given back.
            let t = Instant::now();
            let mapped = engine.store.map_frame(&entry.memory, index);
            engine.add_map_time(t);
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
fn move_to_frames(engine: &Engine, entry: &FileEntry, moves: &[(u64, SlotId)]) -> Vec<bool> {
    let g = engine.geometry;
    moves
        .iter()
        .map(|&(e, slot)| {
            let (offset, len) = g.bytes_of(e..e + 1, entry.len);
            let len = if len == 0 { 0 } else { g.extent as usize };
            engine
                .store
                .copy_within(Home::Slot(slot, 0), Home::Frame(&entry.memory, offset), len)
                .map_err(|err| tracing::warn!("moving extent {e} into its frame: {err}"))
                .is_ok()
        })
        .collect()
}

/// Reads claimed extents into their (pinned, mapped) frames, runs of adjacent extents in
/// parallel on the file's pool, in tasks of at least `min_task` bytes (see
/// [`PinFor::min_task`]).
fn load_into_frames(
    engine: &Engine,
    entry: &FileEntry,
    loads: &[u64],
    min_task: u64,
) -> Result<()> {
    let _range = crate::profiling::Range::new(c"gpumap::cache::fault");
    if loads.is_empty() {
        return Ok(());
    }
    let g = engine.geometry;
    let runs = g.runs(loads, engine.store.frames_apart(), entry.len);
    let t = Instant::now();
    let result = entry.file.pool().run(runs.clone(), |(offset, len)| {
        // The file's last extent is filled with zeros past its end.
        let fill = ((offset + len).next_multiple_of(g.extent) - offset) as usize;
        let got = engine.store.load(
            Home::Frame(&entry.memory, offset),
            &entry.file,
            offset,
            len as usize,
            fill,
            min_task,
        )?;
        // The file shrank under the map: what it no longer has is an error, not zeros.
        entry.file.expect_len(offset, len, got as u64)?;
        Ok(got)
    });
    engine.add_fault_time(t);
    // A file's counters are summed over the shards: any shard will do.
    let mut state = engine.shards[engine.shard_of_extent(entry.id, loads[0])].state.lock();
    if let Some(c) = state.books.counters_mut(entry.id) {
        c.fault_reads += runs.len() as u64;
        c.bytes_faulted += runs.iter().map(|r| r.1).sum::<u64>();
    }
    result.map(|_| ())
}

/// Pins extent `e` of `entry` wherever it is resident, reading it into a slot (or into its
/// frame, when that is mapped anyway) if it is missing: the home of a single-extent read
/// view. Costs one extent of memory for a miss, where a contiguous view costs a frame.
pub(crate) fn pin_extent(engine: &Engine, entry: &FileEntry, e: u64) -> Result<Pins> {
    let g = engine.geometry;
    let index = g.frame_of(e);
    let frame = Unit::Frame { file: entry.id, index };
    let since = Instant::now();
    let shard = &engine.shards[engine.shard_of(entry.id, index)];
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
                    load_into_frames(engine, entry, &claimed, 0)
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
                match room::make_room(engine, shard, &mut state, Want::Slot, true)? {
                    Room::Ready => {}
                    Room::Released => continue,
                    Room::Full => {
                        room::wait_or_full(engine, shard, &mut state, g.extent, since)?;
                        continue;
                    }
                }
                let Some(slot) = state.books.take_slot(entry.id, e) else { continue };
                count(&mut state, entry.id, 0, 1);
                let (offset, len) = g.bytes_of(e..e + 1, entry.len);
                let result = MutexGuard::unlocked(&mut state, || {
                    // The read alone: not the wait for the lock afterwards.
                    let t = Instant::now();
                    let loaded = engine.store.load(
                        Home::Slot(slot, 0),
                        &entry.file,
                        offset,
                        len as usize,
                        g.extent as usize,
                        0,
                    );
                    engine.add_fault_time(t);
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
    engine: &Engine,
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
            for (shard, indices) in engine.shards_of_frames(entry.id, frames.clone()) {
                let sh = &engine.shards[shard];
                let mut state = sh.state.lock();
                for index in indices {
                    if write {
                        let r = engine.geometry.extents_in_frame(index, &extents);
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
            let sh = &engine.shards[engine.shard_of_slot(*slot)];
            sh.state.lock().books.unpin(Unit::Slot(*slot), false);
            sh.changed.notify_all();
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
