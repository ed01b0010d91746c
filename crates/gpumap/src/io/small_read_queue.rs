//! The queue of small `pread_device` reads waiting to be coalesced: how a drainer takes a group
//! of them, how a thread waiting on one takes its own (with the reads queued after it), and how
//! a cancelled one leaves (see `small_reads`). Pure bookkeeping: no I/O here.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use crate::error::Result;
use crate::memory::cuda::RawRegion;

/// Names a queued read for the thread that waits on it. Ids grow in queue order, so the queue
/// stays sorted by id and a read is found by binary search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct ReadId(u64);

/// A small `pread_device` waiting to be coalesced: where it goes, and how its future is
/// completed (the closure owns the caller's memory until then).
pub(super) struct QueuedRead {
    pub(super) id: ReadId,
    pub(super) dst: RawRegion,
    pub(super) offset: u64,
    pub(super) finish: Box<dyn FnOnce(Result<usize>) + Send>,
}

/// Small `pread_device` calls waiting to be coalesced, and the count of drainers taking them.
///
/// Every read leaves the queue exactly once: in a drainer's group, in a waiter's group, or
/// removed when cancelled. While reads wait, at least one drainer is counted, so none is left
/// behind when nobody waits.
#[derive(Default)]
pub(super) struct SmallReadQueue {
    waiting: VecDeque<QueuedRead>,
    drainers: usize,
    next_id: u64,
}

impl SmallReadQueue {
    /// Queues a read of `dst` from `offset`, completed through `finish`; its id, and `true`
    /// when the caller is to start a drainer (fewer than `max_drainers` run), which is then
    /// counted.
    pub(super) fn push(
        &mut self,
        dst: RawRegion,
        offset: u64,
        finish: Box<dyn FnOnce(Result<usize>) + Send>,
        max_drainers: usize,
    ) -> (ReadId, bool) {
        let id = ReadId(self.next_id);
        self.next_id += 1;
        self.waiting.push_back(QueuedRead { id, dst, offset, finish });
        let start = self.drainers < max_drainers;
        if start {
            self.drainers += 1;
        }
        (id, start)
    }

    /// Whether no read waits and no drainer runs: a read submitted now would be alone.
    pub(super) fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.drainers == 0
    }

    /// The next group for a drainer, from the front of the queue (see [`Self::group_from`]).
    /// `None` when the queue is empty, and the drainer is then no longer counted.
    pub(super) fn take_group(
        &mut self,
        nthreads: usize,
        capacity: usize,
    ) -> Option<Vec<QueuedRead>> {
        if self.waiting.is_empty() {
            self.drainers = self.drainers.saturating_sub(1);
            return None;
        }
        Some(self.group_from(0, nthreads, capacity))
    }

    /// The group a thread waiting on read `id` takes to run itself: `id` and the reads queued
    /// after it, as a drainer's group would take them from there. `None` when `id` no longer
    /// waits (a drainer took it, or it was cancelled). Drainers' counts are left alone.
    pub(super) fn take_group_at(
        &mut self,
        id: ReadId,
        nthreads: usize,
        capacity: usize,
    ) -> Option<Vec<QueuedRead>> {
        let at = self.position(id)?;
        Some(self.group_from(at, nthreads, capacity))
    }

    /// Takes read `id` out of the queue, unstarted, if it still waits (a cancelled read).
    pub(super) fn remove(&mut self, id: ReadId) -> Option<QueuedRead> {
        let at = self.position(id)?;
        self.waiting.remove(at)
    }

    fn position(&self, id: ReadId) -> Option<usize> {
        self.waiting.binary_search_by_key(&id, |r| r.id).ok()
    }

    /// The reads from position `start` on that make one group: a fair share of the queue among
    /// `nthreads` drainers, within `capacity` bytes (one bounce buffer) and on one device; a
    /// first read larger than that goes alone. `start` is within the queue.
    fn group_from(&mut self, start: usize, nthreads: usize, capacity: usize) -> Vec<QueuedRead> {
        let share = self.waiting.len().div_ceil(nthreads.max(1));
        let Some(first) = self.waiting.get(start) else { return Vec::new() };
        let ordinal = first.dst.ordinal;
        let mut bytes = first.dst.len;
        let mut end = start + 1;
        while let Some(next) = self.waiting.get(end) {
            let fits = end - start < share
                && bytes + next.dst.len <= capacity
                && next.dst.ordinal == ordinal;
            if !fits {
                break;
            }
            bytes += next.dst.len;
            end += 1;
        }
        self.waiting.drain(start..end).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn push(queue: &mut SmallReadQueue, len: usize, ordinal: usize, max: usize) -> (ReadId, bool) {
        queue.push(RawRegion { ptr: 0, len, ordinal }, 0, Box::new(|_| {}), max)
    }

    fn lens(group: &[QueuedRead]) -> Vec<usize> {
        group.iter().map(|r| r.dst.len).collect()
    }

    #[test]
    fn drainers_take_fair_shares_within_a_buffer_and_one_device() {
        let mut queue = SmallReadQueue::default();
        // One drainer per thread at most: the third push starts none.
        assert!(push(&mut queue, 100, 0, 2).1);
        assert!(push(&mut queue, 200, 0, 2).1);
        assert!(!push(&mut queue, 300, 0, 2).1);
        push(&mut queue, 400, 1, 2);
        push(&mut queue, 500, 1, 2);
        // Five waiting, two threads: shares of three; a buffer of 500 bytes stops the first
        // group at two, the device the second at one.
        assert_eq!(lens(&queue.take_group(2, 500).unwrap()), [100, 200]);
        assert_eq!(lens(&queue.take_group(2, 500).unwrap()), [300]);
        // A first read larger than the buffer goes alone.
        assert_eq!(lens(&queue.take_group(2, 300).unwrap()), [400]);
        assert_eq!(lens(&queue.take_group(2, 600).unwrap()), [500]);
        // Empty: each drainer asking is no longer counted, and the next push starts one.
        assert!(queue.take_group(2, 600).is_none());
        assert!(queue.take_group(2, 600).is_none());
        assert!(push(&mut queue, 100, 0, 2).1);
    }

    #[test]
    fn a_waiter_takes_its_own_read_and_those_after_it() {
        let mut queue = SmallReadQueue::default();
        let ids: Vec<ReadId> = (1..=4).map(|i| push(&mut queue, i * 100, 0, 1).0).collect();
        // Four waiting, two threads: a share of two, from the waiter's own read on.
        assert_eq!(lens(&queue.take_group_at(ids[1], 2, 1 << 20).unwrap()), [200, 300]);
        // Taken: its waiter, and the waiter of the read taken with it, find nothing.
        assert!(queue.take_group_at(ids[1], 2, 1 << 20).is_none());
        assert!(queue.take_group_at(ids[2], 2, 1 << 20).is_none());
        // A cancelled read leaves at once; the drainer takes the rest.
        assert_eq!(queue.remove(ids[3]).map(|r| r.dst.len), Some(400));
        assert!(queue.remove(ids[3]).is_none());
        assert_eq!(lens(&queue.take_group(2, 1 << 20).unwrap()), [100]);
        assert!(!queue.is_idle(), "a drainer still runs");
        assert!(queue.take_group(2, 1 << 20).is_none());
        assert_eq!(queue.drainers, 0);
        assert!(queue.is_idle());
    }

    /// One step of the queue's users.
    #[derive(Debug, Clone)]
    enum Op {
        Push { len: usize, ordinal: usize },
        Drain,
        Help { pick: usize },
        Cancel { pick: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1usize..600, 0usize..2).prop_map(|(len, ordinal)| Op::Push { len, ordinal }),
            1 => Just(Op::Drain),
            1 => any::<usize>().prop_map(|pick| Op::Help { pick }),
            1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        ]
    }

    proptest! {
        /// Against a model (the ids still waiting, in order, and the drainers counted): every
        /// read leaves exactly once; groups are runs of the queue within one share, one buffer
        /// and one device; a waiter's group starts at its read; reads never wait uncounted.
        #[test]
        fn every_read_leaves_once_in_a_well_formed_group(
            ops in proptest::collection::vec(op(), 1..200),
            nthreads in 1usize..5,
            capacity in 1usize..2000,
        ) {
            let mut queue = SmallReadQueue::default();
            let mut model: Vec<(ReadId, usize, usize)> = Vec::new();
            let mut pushed: Vec<ReadId> = Vec::new();
            let mut left: BTreeSet<ReadId> = BTreeSet::new();
            let mut drainers = 0usize;
            let check_group = |model: &mut Vec<(ReadId, usize, usize)>,
                               start: usize,
                               group: &[QueuedRead],
                               left: &mut BTreeSet<ReadId>|
             -> std::result::Result<(), TestCaseError> {
                let share = model.len().div_ceil(nthreads);
                prop_assert!(!group.is_empty() && group.len() <= share.max(1));
                let expected: Vec<ReadId> =
                    model[start..start + group.len()].iter().map(|m| m.0).collect();
                prop_assert_eq!(group.iter().map(|r| r.id).collect::<Vec<_>>(), expected);
                let bytes: usize = group.iter().map(|r| r.dst.len).sum();
                prop_assert!(group.len() == 1 || bytes <= capacity);
                prop_assert!(group.iter().all(|r| r.dst.ordinal == group[0].dst.ordinal));
                // The group stops only where the next read would break a rule.
                if let Some(next) = model.get(start + group.len()) {
                    prop_assert!(
                        group.len() == share
                            || bytes + next.1 > capacity
                            || next.2 != group[0].dst.ordinal
                    );
                }
                for r in group {
                    prop_assert!(left.insert(r.id), "{:?} left twice", r.id);
                }
                model.drain(start..start + group.len());
                Ok(())
            };
            for op in ops {
                match op {
                    Op::Push { len, ordinal } => {
                        let (id, start) = push(&mut queue, len, ordinal, nthreads);
                        prop_assert_eq!(start, drainers < nthreads);
                        drainers += usize::from(start);
                        prop_assert!(pushed.last().is_none_or(|last| *last < id));
                        pushed.push(id);
                        model.push((id, len, ordinal));
                    }
                    Op::Drain if drainers > 0 => match queue.take_group(nthreads, capacity) {
                        None => {
                            prop_assert!(model.is_empty());
                            drainers -= 1;
                        }
                        Some(group) => check_group(&mut model, 0, &group, &mut left)?,
                    },
                    Op::Drain => {}
                    Op::Help { pick } if !pushed.is_empty() => {
                        let id = pushed[pick % pushed.len()];
                        let at = model.iter().position(|m| m.0 == id);
                        match (queue.take_group_at(id, nthreads, capacity), at) {
                            (None, None) => {}
                            (Some(group), Some(at)) => {
                                prop_assert_eq!(group[0].id, id);
                                check_group(&mut model, at, &group, &mut left)?;
                            }
                            (group, at) => prop_assert!(
                                false,
                                "{:?} waiting at {:?}, group {:?}", id, at, group.map(|g| lens(&g))
                            ),
                        }
                    }
                    Op::Cancel { pick } if !pushed.is_empty() => {
                        let id = pushed[pick % pushed.len()];
                        let at = model.iter().position(|m| m.0 == id);
                        let removed = queue.remove(id);
                        prop_assert_eq!(removed.as_ref().map(|r| r.id), at.map(|_| id));
                        if let Some(at) = at {
                            prop_assert!(left.insert(id));
                            model.remove(at);
                        }
                    }
                    Op::Help { .. } | Op::Cancel { .. } => {}
                }
                prop_assert_eq!(queue.drainers, drainers);
                prop_assert_eq!(queue.is_idle(), model.is_empty() && drainers == 0);
                prop_assert!(model.is_empty() || drainers > 0, "reads wait with no drainer");
                prop_assert_eq!(
                    queue.waiting.iter().map(|r| r.id).collect::<Vec<_>>(),
                    model.iter().map(|m| m.0).collect::<Vec<_>>()
                );
            }
            // Drained to the end, every read has left exactly once.
            while drainers > 0 {
                match queue.take_group(nthreads, capacity) {
                    None => drainers -= 1,
                    Some(group) => check_group(&mut model, 0, &group, &mut left)?,
                }
            }
            prop_assert_eq!(left.len(), pushed.len());
        }
    }
}
