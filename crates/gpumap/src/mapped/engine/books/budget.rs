//! The cache's budget of frames, and the positions of its slot arena, shared by the books of
//! every shard.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::sync::Mutex;

/// The frames of memory a cache may use, shared by the books of all its shards: any shard maps
/// a frame while the cache as a whole is under its budget, and evicts its own units when it is
/// not. Fixed shares per shard made a shard whose share views pinned wait — into
/// `OutOfBudget` after the pin wait — while others had room (issue 20's stress pathology).
///
/// A frame used as slots takes a position in the cache's one slot arena (as many positions as
/// frames in the budget, so slot numbers are dense: the directory kernels read is indexed by
/// them), and the budget remembers which shard's books hold each position.
#[derive(Debug)]
pub(crate) struct FrameBudget {
    max: usize,
    used: AtomicUsize,
    /// Slot-arena positions no shard holds.
    free_positions: Mutex<Vec<usize>>,
    /// The shard holding each position (meaningful while it is held).
    holder: Box<[AtomicU8]>,
}

impl FrameBudget {
    /// A budget of `max` frames, none in use.
    pub(crate) fn new(max: usize) -> Arc<FrameBudget> {
        Arc::new(FrameBudget {
            max,
            used: AtomicUsize::new(0),
            // Reversed, so that positions are taken from 0 up.
            free_positions: Mutex::new((0..max).rev().collect()),
            holder: (0..max).map(|_| AtomicU8::new(0)).collect(),
        })
    }

    /// Takes a free position of the slot arena for `shard`'s books (there is one for every
    /// frame taken from the budget, so none lacks while frames are counted).
    pub(crate) fn take_position(&self, shard: u8) -> Option<usize> {
        let position = self.free_positions.lock().pop()?;
        self.holder[position].store(shard, Ordering::Release);
        Some(position)
    }

    /// Gives a position back (one no frame was mapped at).
    pub(crate) fn give_position(&self, position: usize) {
        self.free_positions.lock().push(position);
    }

    /// Takes back the slot frame a shard's books gave up at `position`
    /// ([`Books::remove_slot_frame`](super::Books::remove_slot_frame)) once its memory is
    /// unmapped: the position, and the frame of the budget.
    pub(crate) fn release_slot_frame(&self, position: usize) {
        self.give_position(position);
        self.give_back();
    }

    /// The shard holding `position`.
    pub(crate) fn holder(&self, position: usize) -> usize {
        self.holder.get(position).map_or(0, |h| h.load(Ordering::Acquire) as usize)
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
