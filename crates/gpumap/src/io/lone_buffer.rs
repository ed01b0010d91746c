//! The pinned buffers lone small reads are read into (see `lone_reads`): one process-wide pool,
//! allocated on demand up to a bound, so that a program with thousands of open handles pins no
//! more for them than the bound. Pure bookkeeping over any buffer type: no I/O here.
#![forbid(unsafe_code)]

/// Free buffers, and how many exist (free or lent) against the most that may.
pub(super) struct LonePool<B> {
    free: Vec<B>,
    existing: usize,
    max: usize,
}

/// What [`LonePool::take`] gives.
pub(super) enum Take<B> {
    /// A free buffer, now lent.
    Buffer(B),
    /// None is free but another may exist: the caller allocates it (it counts as lent), then
    /// gives it back or reports it [`lost`](LonePool::lost).
    Allocate,
    /// Every buffer that may exist is lent.
    Exhausted,
}

impl<B> LonePool<B> {
    /// An empty pool of at most `max` buffers.
    pub(super) const fn new(max: usize) -> Self {
        LonePool { free: Vec::new(), existing: 0, max }
    }

    /// Lends a buffer (see [`Take`]).
    pub(super) fn take(&mut self) -> Take<B> {
        if let Some(buffer) = self.free.pop() {
            return Take::Buffer(buffer);
        }
        if self.existing < self.max {
            self.existing += 1;
            return Take::Allocate;
        }
        Take::Exhausted
    }

    /// A lent buffer, back for the next read.
    pub(super) fn give_back(&mut self, buffer: B) {
        self.free.push(buffer);
    }

    /// A lent buffer that will not come back (its allocation or copy failed): another may be
    /// allocated in its place.
    pub(super) fn lost(&mut self) {
        self.existing = self.existing.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn buffers_are_allocated_on_demand_up_to_the_bound_and_reused() {
        let mut pool = LonePool::<u32>::new(2);
        assert!(matches!(pool.take(), Take::Allocate));
        assert!(matches!(pool.take(), Take::Allocate));
        assert!(matches!(pool.take(), Take::Exhausted));
        pool.give_back(7);
        assert!(matches!(pool.take(), Take::Buffer(7)));
        pool.lost();
        assert!(matches!(pool.take(), Take::Allocate), "a lost buffer may be replaced");
        assert!(matches!(pool.take(), Take::Exhausted));
    }

    proptest! {
        /// Against a model of the buffers lent: never more than `max` exist, a free one is
        /// always reused before another is allocated, and the pool never refuses while fewer
        /// than `max` are lent.
        #[test]
        fn never_more_than_the_bound_exist(
            max in 0usize..6,
            ops in proptest::collection::vec(0u8..3, 1..200),
        ) {
            let mut pool = LonePool::<usize>::new(max);
            let mut lent: Vec<usize> = Vec::new();
            let mut next = 0usize;
            for op in ops {
                match op {
                    0 => match pool.take() {
                        Take::Buffer(b) => lent.push(b),
                        Take::Allocate => {
                            prop_assert!(pool.free.is_empty());
                            lent.push(next);
                            next += 1;
                        }
                        Take::Exhausted => prop_assert_eq!(lent.len(), max),
                    },
                    1 if !lent.is_empty() => {
                        let b = lent.remove(0);
                        pool.give_back(b);
                    }
                    2 if !lent.is_empty() => {
                        lent.remove(0);
                        pool.lost();
                    }
                    _ => {}
                }
                prop_assert!(pool.existing <= max);
                prop_assert_eq!(pool.existing, lent.len() + pool.free.len());
            }
        }
    }
}
