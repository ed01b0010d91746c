//! The pinned buffer a handle keeps for its lone small reads (see `lone_reads`): allocated by
//! the first, lent to one read at a time. Pure bookkeeping: no I/O here.
#![forbid(unsafe_code)]

use crate::memory::cuda::PinnedBuffer;

/// Where a handle's lone-read buffer is.
#[derive(Default)]
pub(super) enum LoneBuffer {
    /// None yet, or the last one was lost with a failed copy.
    #[default]
    Unallocated,
    /// Kept between reads.
    Free(PinnedBuffer),
    /// A read holds it (its copy to the GPU may be running).
    Lent,
}

/// What [`LoneBuffer::lend`] gives.
pub(super) enum Lend {
    /// The buffer, now lent.
    Buffer(PinnedBuffer),
    /// No buffer exists: the caller allocates one (it counts as lent), then gives it back or
    /// reports it [`lost`](LoneBuffer::lost).
    Allocate,
    /// Another read holds it.
    InUse,
}

impl LoneBuffer {
    /// Lends the buffer to one read (see [`Lend`]).
    pub(super) fn lend(&mut self) -> Lend {
        match std::mem::replace(self, LoneBuffer::Lent) {
            LoneBuffer::Free(buffer) => Lend::Buffer(buffer),
            LoneBuffer::Unallocated => Lend::Allocate,
            LoneBuffer::Lent => Lend::InUse,
        }
    }

    /// The lent buffer, back for the next read.
    pub(super) fn give_back(&mut self, buffer: PinnedBuffer) {
        *self = LoneBuffer::Free(buffer);
    }

    /// The lent buffer will not come back (its allocation or copy failed): the next read
    /// allocates another.
    pub(super) fn lost(&mut self) {
        *self = LoneBuffer::Unallocated;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_read_at_a_time_holds_the_buffer() {
        let mut slot = LoneBuffer::default();
        // The first read allocates; while it holds the buffer, a second is refused.
        assert!(matches!(slot.lend(), Lend::Allocate));
        assert!(matches!(slot.lend(), Lend::InUse));
        slot.give_back(PinnedBuffer::empty());
        // Given back, it is lent again, once.
        assert!(matches!(slot.lend(), Lend::Buffer(_)));
        assert!(matches!(slot.lend(), Lend::InUse));
        // Lost with a failed copy: the next read allocates again.
        slot.lost();
        assert!(matches!(slot.lend(), Lend::Allocate));
    }
}
