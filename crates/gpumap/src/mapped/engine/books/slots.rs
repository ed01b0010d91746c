//! The slot arena of one shard's books: frames of memory cut into slots of one extent each,
//! which hold clean extents of any file wherever they fall, and the free list. Which extent a
//! slot holds and who pins it is recorded here; the file's index of its slots and the LRU list
//! are the whole books' business.
#![forbid(unsafe_code)]

use super::ids::{FileId, SlotId, SlotState, NIL};

/// One slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) state: SlotState,
    pub(super) owner: (FileId, u64),
    pub(super) pins: u32,
    pub(super) lru: u32,
    pub(super) in_free_list: bool,
}

impl Slot {
    const FREE: Slot =
        Slot { state: SlotState::Free, owner: (0, 0), pins: 0, lru: NIL, in_free_list: true };
}

/// A frame of memory cut into slots.
#[derive(Debug)]
pub(super) struct SlotFrame {
    pub(super) slots: Box<[Slot]>,
    /// Slots that are not free.
    pub(super) used: u32,
    /// Slots someone pins.
    pub(super) busy: u32,
}

/// The stretch of the cache's slot arena that one shard's books own: its slot frames by
/// position, and its free slots.
#[derive(Debug)]
pub(super) struct SlotArena {
    /// Slots in one slot frame.
    per_frame: usize,
    /// The first position of the arena this stretch covers (`frames[0]`'s).
    pub(super) first_position: usize,
    /// By position (from `first_position`); `None` where no frame is mapped.
    pub(super) frames: Vec<Option<SlotFrame>>,
    /// Slot frames with no slot in use.
    pub(super) empty_frames: usize,
    /// Free slots, taken last in, first out; entries of frames given up since are skipped.
    free: Vec<SlotId>,
}

impl SlotArena {
    /// A stretch of `positions` frames from `first_position`, none mapped.
    pub(super) fn new(per_frame: usize, positions: usize, first_position: usize) -> SlotArena {
        SlotArena {
            per_frame,
            first_position,
            frames: (0..positions).map(|_| None).collect(),
            empty_frames: 0,
            free: Vec::new(),
        }
    }

    /// Where slot `id` is in `frames`: (local position, index in its frame).
    pub(super) fn place(&self, id: SlotId) -> (usize, usize) {
        (id as usize / self.per_frame - self.first_position, id as usize % self.per_frame)
    }

    /// Slot `id` (a free one where its frame is not mapped).
    pub(super) fn slot(&self, id: SlotId) -> Slot {
        let (position, i) = self.place(id);
        self.frames[position]
            .as_ref()
            .map_or(Slot { in_free_list: false, ..Slot::FREE }, |f| f.slots[i])
    }

    /// Slot `id`, which lies in a mapped slot frame (every slot the books name does).
    pub(super) fn slot_mut(&mut self, id: SlotId) -> &mut Slot {
        let (position, i) = self.place(id);
        &mut self.frames[position].as_mut().expect("slot in a mapped slot frame").slots[i]
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

    /// Records a mapped frame at the first free position, all its slots free; returns the
    /// position, or `None` when every position is taken.
    pub(super) fn add_frame(&mut self) -> Option<usize> {
        let local = self.frames.iter().position(Option::is_none)?;
        let position = self.first_position + local;
        self.frames[local] = Some(SlotFrame {
            slots: vec![Slot::FREE; self.per_frame].into_boxed_slice(),
            used: 0,
            busy: 0,
        });
        self.empty_frames += 1;
        // Pushed in reverse so the first slots of the frame are taken first.
        for i in (0..self.per_frame).rev() {
            self.free.push((position * self.per_frame + i) as SlotId);
        }
        Some(position)
    }

    /// Takes the slot frame at `position` out of the arena (its free-list entries are skipped
    /// when popped); `None` where none is mapped.
    pub(super) fn remove_frame(&mut self, position: usize) -> Option<SlotFrame> {
        let frame = position
            .checked_sub(self.first_position)
            .and_then(|local| self.frames.get_mut(local))
            .and_then(Option::take)?;
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

    /// Frees slot `id` (no one pins it, and it is out of the LRU list): onto the free list.
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

    /// Counts a new pin of slot `id` and returns the slot (`pins == 1`: the first, so the caller
    /// takes it out of the LRU list).
    pub(super) fn pin(&mut self, id: SlotId) -> Option<&mut Slot> {
        let (position, i) = self.place(id);
        let frame = self.frames[position].as_mut()?;
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
        let frame = self.frames[position].as_mut()?;
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
        let local = self.frames.iter().position(|f| f.as_ref().is_some_and(|f| f.used == 0))?;
        Some(self.first_position + local)
    }

    /// The position of slot `id`'s frame when none of its slots is pinned.
    pub(super) fn idle_frame_of(&self, id: SlotId) -> Option<usize> {
        let (local, _) = self.place(id);
        let idle = self.frames[local].as_ref().is_some_and(|f| f.busy == 0);
        idle.then_some(self.first_position + local)
    }

    /// Slots in use (loading, clean or stale).
    pub(super) fn in_use(&self) -> usize {
        self.frames.iter().flatten().map(|f| f.used as usize).sum()
    }
}
