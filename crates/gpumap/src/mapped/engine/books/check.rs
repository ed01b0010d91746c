//! The books' invariants, checked after every step of the tests (not part of the books).
#![forbid(unsafe_code)]

use super::ids::{ExtentState, SlotId, SlotState, NIL};
use super::Books;

/// Checks every invariant the module docs promise; the first broken one, described.
pub(super) fn check(b: &Books) -> Result<(), String> {
    let g = b.geometry;
    let slot_frames = b.arena.frames.iter().flatten().count();
    let file_frames: usize = b.files.values().map(|f| f.frames.len()).sum();
    if b.frames_in_use != slot_frames + file_frames
        || b.frames_in_use > b.budget.used()
        || b.budget.used() > b.budget.max()
    {
        return Err(format!(
            "frames in use {} != {file_frames} file + {slot_frames} slot frames, budget {} \
             of which {} used",
            b.frames_in_use,
            b.budget.max(),
            b.budget.used()
        ));
    }
    let mut in_lru = 0;
    for (&id, books) in &b.files {
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
                    && books.slots.get(&e).is_some_and(|&s| b.arena.slot(s).pins > 0);
                if x.state != ExtentState::Absent && books.slots.contains_key(&e) && !moving {
                    return Err(format!("extent {e} of file {id} in its frame and a slot"));
                }
            }
        }
        for (&e, &slot) in &books.slots {
            let s = b.arena.slot(slot);
            if s.owner != (id, e) || !matches!(s.state, SlotState::Loading | SlotState::Clean) {
                return Err(format!("slot {slot} indexed for ({id}, {e}) holds {s:?}"));
            }
        }
    }
    let mut empty = 0;
    let mut retiring = 0;
    for (position, frame) in b.arena.frames.iter().enumerate() {
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
            let id = (position * g.per_frame() as usize + i) as SlotId;
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
            if s.state == SlotState::Retiring && (s.pins > 0 || s.in_free_list) {
                return Err(format!("slot {id} retiring but pinned or listed free: {s:?}"));
            }
            if s.published && s.state != SlotState::Clean {
                return Err(format!("slot {id} in the catalog but {:?}", s.state));
            }
            retiring += usize::from(s.state == SlotState::Retiring);
            if s.state == SlotState::Clean || s.state == SlotState::Loading {
                let indexed = b.files.get(&s.owner.0).and_then(|f| f.slots.get(&s.owner.1));
                if indexed != Some(&id) {
                    return Err(format!("slot {id} {s:?} not indexed by its owner"));
                }
            }
        }
    }
    if retiring != b.arena.retiring() {
        return Err(format!("{retiring} slots retiring, {} queued", b.arena.retiring()));
    }
    if empty != b.arena.empty_frames {
        return Err(format!("{empty} empty slot frames, counted {}", b.arena.empty_frames));
    }
    if in_lru != b.lru.len {
        return Err(format!("{in_lru} units marked in the LRU list, which holds {}", b.lru.len));
    }
    Ok(())
}
