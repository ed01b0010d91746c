//! Making room: giving up a victim of this shard (or, with nothing left here, one another
//! shard holds idle) for a frame or a slot a request needs, writing a dirty victim back first;
//! and waiting when nothing can go.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::sync::MutexGuard;

use super::books::{Unit, Victim, Want};
use super::state::{Engine, FileEntry, Shard, State};
use super::writeback;
use crate::error::Result;

/// How often a request waiting for room in a cache of several shards looks again (room another
/// shard makes wakes no one here).
const SHARED_BUDGET_POLL: Duration = Duration::from_millis(1);

/// What one step of making room did.
pub(crate) enum Room {
    /// There is room for what was wanted.
    Ready,
    /// The lock was let go to write a dirty frame back: look at everything again.
    Released,
    /// Everything is pinned.
    Full,
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

/// One step towards room for `want`: a free slot is ready, or a frame of the budget has
/// been taken for the caller (`Room::Ready` for `Want::Frame`: the caller maps it and
/// records it with `Books::add_frame`, or gives it back), or a victim was given up (in
/// this shard, or — where this shard has nothing left to give — in another), or nothing can
/// go. Without `write_back` (read-ahead on a pool thread, which must never wait for a
/// write-back that may need the pool) a dirty victim counts as nothing to give up.
pub(crate) fn make_room(
    engine: &Engine,
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
                let mapped = engine.store.map_slot_frame(position);
                engine.add_map_time(t);
                if let Err(e) = mapped {
                    // Nothing was mapped at the position: it and the frame go straight back.
                    if state.books.remove_slot_frame(position) {
                        state.books.budget().release_slot_frame(position);
                    }
                    return Err(e);
                }
                return Ok(Room::Ready);
            }
            Want::Frame if state.books.budget().try_take() => return Ok(Room::Ready),
            _ => {}
        }
        match give_up_one(engine, shard, state, want, write_back)? {
            GaveUp::Unit => continue,
            GaveUp::Released => return Ok(Room::Released),
            GaveUp::Nothing if engine.shards.len() > 1 => {
                // The budget is the cache's: a frame another shard holds idle will do.
                let elsewhere =
                    MutexGuard::unlocked(state, || give_up_elsewhere(engine, shard, write_back))?;
                return Ok(if elsewhere { Room::Released } else { Room::Full });
            }
            GaveUp::Nothing => return Ok(Room::Full),
        }
    }
}

/// Gives up one frame's worth of another shard than `me` (one lock at a time; the caller
/// holds none): whether one went back to the budget (or was written back, after which the
/// caller looks again).
fn give_up_elsewhere(engine: &Engine, me: &Shard, write_back: bool) -> Result<bool> {
    for other in engine.shards.iter().filter(|s| !std::ptr::eq(*s, me)) {
        let mut state = other.state.lock();
        let gave = give_up_one(engine, other, &mut state, Want::Frame, write_back);
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
    engine: &Engine,
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
                engine.store.unmap_frame(&entry.memory, index)?;
            }
            engine.add_map_time(t);
            state.books.remove_frame(file, index);
            Ok(GaveUp::Unit)
        }
        Victim::Slot(slot) => {
            state.books.evict_slot(slot);
            Ok(GaveUp::Unit)
        }
        Victim::SlotFrame(position) => {
            // Its clean slots go first; the memory only once no lookup of the GPU's directory
            // can still read it (until then its slots are retiring, and a later call takes it).
            if state.books.remove_slot_frame(position) {
                let t = Instant::now();
                // Were the unmap to fail, the position stays out of use (and its frame
                // counted): mapping there again would fail, or worse.
                engine.store.unmap_slot_frame(position)?;
                engine.add_map_time(t);
                state.books.budget().release_slot_frame(position);
            }
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
            let per = engine.geometry.per_frame();
            let extents = index * per..(index + 1) * per;
            let result =
                MutexGuard::unlocked(state, || writeback::write_back(engine, &entry, extents));
            let free = state.books.end_eviction(file, index, result.is_ok());
            let unmapped = if free {
                let t = Instant::now();
                let unmapped = engine.store.unmap_frame(&entry.memory, index);
                engine.add_map_time(t);
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
    engine: &Engine,
    shard: &Shard,
    state: &mut MutexGuard<'_, State>,
    requested: u64,
    since: Instant,
) -> Result<()> {
    // With the budget shared by shards, room may come from another shard, whose changes
    // this shard's condition variable does not hear of: look again every millisecond.
    let poll = (engine.shards.len() > 1).then(|| Instant::now() + SHARED_BUDGET_POLL);
    // The cache's own pins go by themselves: wait for them without bound.
    if state.books.transient_pins() > 0 {
        match poll {
            Some(at) => drop(shard.changed.wait_until(state, at)),
            None => shard.changed.wait(state),
        }
        return Ok(());
    }
    let deadline = since + engine.pin_wait;
    // So do slots retiring, once the row gathers that could see them end; an ending gather
    // tells no shard, so look again every millisecond. Not without bound: a lookup scope of the
    // caller's (`LookupScope`) may hold them while this very thread waits.
    if state.books.retiring() > 0 && Instant::now() < deadline {
        shard.changed.wait_until(state, Instant::now() + SHARED_BUDGET_POLL);
        return Ok(());
    }
    if Instant::now() < deadline {
        shard.changed.wait_until(state, poll.map_or(deadline, |at| at.min(deadline)));
        return Ok(());
    }
    Err(engine.out_of_budget(requested))
}

/// Writes back what is dirty among the extents covering `[offset, offset + len)` of `entry`,
/// then gives up the memory of every frame and slot of them that no one pins (`evict`,
/// `Advice::DontNeed`).
pub(crate) fn evict(engine: &Engine, entry: &FileEntry, offset: u64, len: u64) -> Result<()> {
    let g = engine.geometry;
    let extents = g.extents_covering(offset, len);
    if entry.writable {
        writeback::write_back(engine, entry, extents.clone())?;
    }
    let frames = g.frames_covering(offset, len);
    for shard in engine.shards.iter() {
        let mut state = shard.state.lock();
        for index in state.books.idle_frames(entry.id) {
            if frames.contains(&index) {
                engine.store.unmap_frame(&entry.memory, index)?;
                state.books.remove_frame(entry.id, index);
            }
        }
        for slot in state.books.idle_slots(entry.id) {
            if extents.contains(&state.books.slot_owner(slot).1) {
                state.books.evict_slot(slot);
            }
        }
        drop(state);
        shard.changed.notify_all();
    }
    Ok(())
}
