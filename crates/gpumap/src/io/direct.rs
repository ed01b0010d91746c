//! When a transfer goes around the page cache: the handle's `O_DIRECT` policy for reads
//! ([`DirectRead`]) and writes, and the part of a piece that may go direct.
#![forbid(unsafe_code)]

use std::fs::File;

use crate::align::{self, direct_split, PAGE_SIZE};
use crate::config::DirectRead;
use crate::io::handle_state::HandleState;

/// How the pieces of one read choose between the page cache and `O_DIRECT` (see
/// [`read_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadPlan {
    /// Every piece through the page cache.
    Buffered,
    /// The aligned middle of every piece with `O_DIRECT`.
    Direct,
    /// Each piece of 1 MiB or more asks the page cache what it holds.
    PerPiece,
}

/// Reads shorter than this never ask the page cache what it holds (see [`DirectRead::Uncached`]).
const UNCACHED_CHECK_MIN: u64 = 1 << 20;

/// How the pieces of a read of `[offset, offset + len)` choose between the page cache and
/// `O_DIRECT`, by the handle's [`DirectRead`] policy.
///
/// Under `Uncached` the whole transfer is looked at first: when almost none of it is cached
/// every piece goes around the cache. Deciding piece by piece there would go wrong: one
/// buffered piece (an unaligned head, say) sets off the kernel's read-ahead, the next piece
/// then finds itself cached and reads buffered, which reads ahead further, and so on to
/// the end of the file.
pub(super) fn read_plan(state: &HandleState, offset: u64, len: u64) -> ReadPlan {
    match state.settings.direct_io_read {
        DirectRead::Off => ReadPlan::Buffered,
        DirectRead::On => ReadPlan::Direct,
        // Small reads stay buffered: the check would cost about as much as the read, and
        // the kernel reads a lone small miss without read-ahead anyway.
        DirectRead::Uncached if len < UNCACHED_CHECK_MIN || state.direct.is_none() => {
            ReadPlan::Buffered
        }
        DirectRead::Uncached if mostly_uncached(state, offset, len) => ReadPlan::Direct,
        DirectRead::Uncached => ReadPlan::PerPiece,
    }
}

/// Whether the aligned middle of a piece of `len` bytes at `offset` goes direct under `plan`.
pub(super) fn piece_goes_direct(
    state: &HandleState,
    plan: ReadPlan,
    offset: u64,
    len: u64,
) -> bool {
    match plan {
        ReadPlan::Buffered => false,
        ReadPlan::Direct => true,
        ReadPlan::PerPiece => len >= UNCACHED_CHECK_MIN && mostly_uncached(state, offset, len),
    }
}

/// Whether less than an eighth of `[offset, offset + len)` is in the page cache; `false`
/// when the kernel will not say (or the range runs past the end): buffered is never far
/// wrong.
fn mostly_uncached(state: &HandleState, offset: u64, len: u64) -> bool {
    let range = crate::pagecache::ByteRange::new(offset, len);
    match crate::pagecache::residency(&state.file, range) {
        Ok(r) => r.cached_pages.is_some_and(|cached| cached * 8 < r.total_pages),
        Err(_) => false,
    }
}

/// The part of `[offset, offset + len)` that may go through `O_DIRECT` for a buffer at
/// address `addr`: `None` when direct I/O is off for this direction (`enabled`), or the
/// aligned middle is empty, or the buffer is not page-aligned where the middle starts.
pub(super) fn direct_middle(
    state: &HandleState,
    enabled: bool,
    addr: usize,
    offset: u64,
    len: u64,
) -> Option<(&File, u64, u64)> {
    let direct = state.direct.as_ref().filter(|_| enabled)?;
    let split = direct_split(offset, len, PAGE_SIZE);
    let middle_addr = addr as u64 + split.head.1;
    (split.middle.1 > 0 && align::is_aligned(middle_addr, PAGE_SIZE)).then_some((
        direct,
        split.middle.0,
        split.middle.1,
    ))
}
