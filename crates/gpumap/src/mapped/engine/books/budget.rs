//! The cache's budget of frames, shared by the books of every shard.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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
