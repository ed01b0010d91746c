//! The queue of small `pread_device` reads waiting to be coalesced, and how a drainer takes a
//! group of them (see `small_reads`). Pure bookkeeping: no I/O here.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use crate::error::Result;
use crate::memory::cuda::RawRegion;

/// A small `pread_device` waiting to be coalesced: where it goes, and how its future is
/// completed (the closure owns the caller's memory until then).
pub(super) struct QueuedRead {
    pub(super) dst: RawRegion,
    pub(super) offset: u64,
    pub(super) finish: Box<dyn FnOnce(Result<usize>) + Send>,
}

/// Small `pread_device` calls waiting to be coalesced, and the count of drainers taking them.
#[derive(Default)]
pub(super) struct SmallReadQueue {
    waiting: VecDeque<QueuedRead>,
    drainers: usize,
}

impl SmallReadQueue {
    /// Queues `read`; `true` when the caller is to start a drainer (fewer than `max_drainers`
    /// run), which is then counted.
    pub(super) fn push(&mut self, read: QueuedRead, max_drainers: usize) -> bool {
        self.waiting.push_back(read);
        let start = self.drainers < max_drainers;
        if start {
            self.drainers += 1;
        }
        start
    }

    /// The next group for a drainer: a fair share of the queue among `nthreads` drainers,
    /// within `capacity` bytes (one bounce buffer) and on one device; a first read larger
    /// than that goes alone. `None` when the queue is empty, and the drainer is then no longer
    /// counted.
    pub(super) fn take_group(
        &mut self,
        nthreads: usize,
        capacity: usize,
    ) -> Option<Vec<QueuedRead>> {
        if self.waiting.is_empty() {
            self.drainers -= 1;
            return None;
        }
        let share = self.waiting.len().div_ceil(nthreads);
        let mut group: Vec<QueuedRead> = Vec::new();
        let mut bytes = 0usize;
        while let Some(next) = self.waiting.front() {
            let fits = group.is_empty()
                || (group.len() < share
                    && bytes + next.dst.len <= capacity
                    && next.dst.ordinal == group[0].dst.ordinal);
            if !fits {
                break;
            }
            bytes += next.dst.len;
            group.extend(self.waiting.pop_front());
        }
        Some(group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(len: usize, ordinal: usize) -> QueuedRead {
        QueuedRead { dst: RawRegion { ptr: 0, len, ordinal }, offset: 0, finish: Box::new(|_| {}) }
    }

    fn lens(group: &[QueuedRead]) -> Vec<usize> {
        group.iter().map(|r| r.dst.len).collect()
    }

    #[test]
    fn drainers_take_fair_shares_within_a_buffer_and_one_device() {
        let mut queue = SmallReadQueue::default();
        // One drainer per thread at most: the third push starts none.
        assert!(queue.push(read(100, 0), 2));
        assert!(queue.push(read(200, 0), 2));
        assert!(!queue.push(read(300, 0), 2));
        queue.push(read(400, 1), 2);
        queue.push(read(500, 1), 2);
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
        assert!(queue.push(read(100, 0), 2));
    }
}
