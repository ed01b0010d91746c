//! The slots of one shard's books: frames of memory cut into slots of one extent each, which
//! hold clean extents of any file wherever they fall, the free list, and slots retiring (free,
//! but possibly still seen by a lookup outside the books: see `Catalog`). Which extent a slot
//! holds and who pins it is recorded here; the file's index of its slots, the LRU list and the
//! catalog are the whole books' business.
#![forbid(unsafe_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::ids::{FileId, SlotId, SlotState, NIL};

/// One slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) state: SlotState,
    pub(super) owner: (FileId, u64),
    pub(super) pins: u32,
    pub(super) lru: u32,
    pub(super) in_free_list: bool,
    /// Its extent is in the catalog (filled there, not yet retired).
    pub(super) published: bool,
    /// The publication that clears it from the directory, once retired.
    pub(super) retire_at: u64,
}

impl Slot {
    const FREE: Slot = Slot {
        state: SlotState::Free,
        owner: (0, 0),
        pins: 0,
        lru: NIL,
        in_free_list: true,
        published: false,
        retire_at: 0,
    };
}

/// A frame of memory cut into slots.
#[derive(Debug)]
pub(super) struct SlotFrame {
    pub(super) slots: Box<[Slot]>,
    /// Slots that are not free (retiring ones count: their memory may still be read).
    pub(super) used: u32,
    /// Slots someone pins.
    pub(super) busy: u32,
}

/// The slot frames one shard's books hold, by their position in the cache's slot arena (every
/// position is the cache's; a shard holds those it took), and its free and retiring slots.
#[derive(Debug)]
pub(super) struct SlotArena {
    /// Slots in one slot frame.
    per_frame: usize,
    /// By position in the arena; `None` where this shard holds no frame.
    pub(super) frames: Vec<Option<SlotFrame>>,
    /// Slot frames with no slot in use.
    pub(super) empty_frames: usize,
    /// Free slots, taken last in, first out; entries of frames given up since are skipped.
    free: Vec<SlotId>,
    /// Retiring slots by the publication after which they are free.
    retiring: BinaryHeap<Reverse<(u64, SlotId)>>,
}

impl SlotArena {
    /// An arena of `positions` positions, none held.
    pub(super) fn new(per_frame: usize, positions: usize) -> SlotArena {
        SlotArena {
            per_frame,
            frames: (0..positions).map(|_| None).collect(),
            empty_frames: 0,
            free: Vec::new(),
            retiring: BinaryHeap::new(),
        }
    }

    /// Where slot `id` is: (its frame's position, its index in the frame).
    pub(super) fn place(&self, id: SlotId) -> (usize, usize) {
        (id as usize / self.per_frame, id as usize % self.per_frame)
    }

    /// Slot `id` (a free one where its frame is not held).
    pub(super) fn slot(&self, id: SlotId) -> Slot {
        let (position, i) = self.place(id);
        let frame = self.frames.get(position).and_then(Option::as_ref);
        frame.map_or(Slot { in_free_list: false, ..Slot::FREE }, |f| f.slots[i])
    }

    /// Slot `id`, which lies in a held slot frame (every slot the books name does).
    pub(super) fn slot_mut(&mut self, id: SlotId) -> &mut Slot {
        let (position, i) = self.place(id);
        &mut self.frames[position].as_mut().expect("slot in a held slot frame").slots[i]
    }

    /// Whether a slot is free for [`take`](Self::take) (dropping free-list entries of slot
    /// frames that were given up).
    pub(super) fn has_free(&mut self) -> bool {
        while let Some(&id) = self.free.last() {
            let (position, i) = self.place(id);
            if let Some(frame) = self.frames[position].as_mut() {
                let slot = &mut frame.slots[i];
                if slot.in_free_list && slot.state == SlotState::Free {
                    return true;
                }
                slot.in_free_list = false;
            }
            self.free.pop();
        }
        false
    }

    /// Records a frame mapped at `position` (taken from the budget for this shard), all its
    /// slots free.
    pub(super) fn add_frame(&mut self, position: usize) {
        self.frames[position] = Some(SlotFrame {
            slots: vec![Slot::FREE; self.per_frame].into_boxed_slice(),
            used: 0,
            busy: 0,
        });
        self.empty_frames += 1;
        // Pushed in reverse so the first slots of the frame are taken first.
        for i in (0..self.per_frame).rev() {
            self.free.push((position * self.per_frame + i) as SlotId);
        }
    }

    /// Takes the slot frame at `position` out of the arena (its free-list entries are skipped
    /// when popped); `None` where none is held.
    pub(super) fn remove_frame(&mut self, position: usize) -> Option<SlotFrame> {
        let frame = self.frames.get_mut(position).and_then(Option::take)?;
        if frame.used == 0 {
            self.empty_frames -= 1;
        }
        Some(frame)
    }

    /// Takes a free slot for extent `e` of `file`: `Loading`, pinned once. `None` when no
    /// slot is free.
    pub(super) fn take(&mut self, file: FileId, e: u64) -> Option<SlotId> {
        while let Some(id) = self.free.pop() {
            let (position, i) = self.place(id);
            let Some(frame) = self.frames[position].as_mut() else { continue };
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
                published: false,
                retire_at: 0,
            };
            if frame.used == 0 {
                self.empty_frames -= 1;
            }
            frame.used += 1;
            frame.busy += 1;
            return Some(id);
        }
        None
    }

    /// Frees slot `id` (no one pins it, it is out of the LRU list, and no lookup outside the
    /// books can see what it held): onto the free list.
    pub(super) fn free(&mut self, id: SlotId) {
        let (position, i) = self.place(id);
        let Some(frame) = self.frames[position].as_mut() else { return };
        let slot = &mut frame.slots[i];
        if slot.state != SlotState::Free {
            frame.used -= 1;
            if frame.used == 0 {
                self.empty_frames += 1;
            }
        }
        let push = !slot.in_free_list;
        *slot = Slot::FREE;
        if push {
            self.free.push(id);
        }
    }

    /// Retires slot `id` (no one pins it, it is out of the LRU list): free once publication
    /// `retire_at` has no reader older than it (see [`reclaim`](Self::reclaim)).
    pub(super) fn retire(&mut self, id: SlotId) {
        let slot = self.slot_mut(id);
        // The owner stays: what a lookup may still find there.
        slot.state = SlotState::Retiring;
        let at = slot.retire_at;
        self.retiring.push(Reverse((at, id)));
    }

    /// Frees the retiring slots whose publication `reusable` says no reader can still see.
    pub(super) fn reclaim(&mut self, reusable: impl Fn(u64) -> bool) {
        while let Some(&Reverse((at, id))) = self.retiring.peek() {
            if !reusable(at) {
                break;
            }
            self.retiring.pop();
            if self.slot(id).state == SlotState::Retiring {
                self.free(id);
            }
        }
    }

    /// Slots retiring.
    pub(super) fn retiring(&self) -> usize {
        self.retiring.len()
    }

    /// Counts a new pin of slot `id` and returns the slot (`pins == 1`: the first, so the caller
    /// takes it out of the LRU list).
    pub(super) fn pin(&mut self, id: SlotId) -> Option<&mut Slot> {
        let (position, i) = self.place(id);
        let frame = self.frames.get_mut(position)?.as_mut()?;
        let slot = &mut frame.slots[i];
        if slot.pins == 0 {
            frame.busy += 1;
        }
        slot.pins += 1;
        Some(slot)
    }

    /// Counts an unpin of slot `id`; returns the slot when that was its last pin.
    pub(super) fn unpin(&mut self, id: SlotId) -> Option<&mut Slot> {
        let (position, i) = self.place(id);
        let frame = self.frames.get_mut(position)?.as_mut()?;
        let slot = &mut frame.slots[i];
        if slot.pins == 0 {
            return None;
        }
        slot.pins -= 1;
        if slot.pins > 0 {
            return None;
        }
        frame.busy -= 1;
        Some(slot)
    }

    /// The position of a slot frame with no slot in use, if any.
    pub(super) fn empty_frame(&self) -> Option<usize> {
        if self.empty_frames == 0 {
            return None;
        }
        self.frames.iter().position(|f| f.as_ref().is_some_and(|f| f.used == 0))
    }

    /// The position of slot `id`'s frame when none of its slots is pinned.
    pub(super) fn idle_frame_of(&self, id: SlotId) -> Option<usize> {
        let (position, _) = self.place(id);
        let idle = self.frames[position].as_ref().is_some_and(|f| f.busy == 0);
        idle.then_some(position)
    }

    /// Slots in use (loading, clean, stale or retiring).
    pub(super) fn in_use(&self) -> usize {
        self.frames.iter().flatten().map(|f| f.used as usize).sum()
    }
}
