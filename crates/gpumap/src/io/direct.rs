//! When a transfer goes around the page cache: the handle's `O_DIRECT` policy for reads
//! ([`DirectRead`]) and writes, and the part of a piece that may go direct.
#![forbid(unsafe_code)]

use std::fs::File;
use std::os::fd::AsFd;

use crate::align::{self, direct_split, PAGE_SIZE};
use crate::config::DirectRead;
use crate::io::handle_state::HandleState;
use crate::sys::pagecache;

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
    cached_pages(state, offset, len).is_some_and(|(cached, total)| cached * 8 < total)
}

/// The pages of `[offset, offset + len)` in the page cache, and the pages covering the range;
/// `None` where the range runs past the end of the file or the kernel will not say.
///
/// The question `pagecache::residency` answers, asked of the kernel directly, as the I/O layer
/// sits below that tool: `cachestat`, else `mincore`. Where the kernel hides residency from
/// the caller (a file it may not write), `cachestat` refuses and `mincore` calls every page
/// cached; either way the range does not read as uncached, as `residency`'s "unknown" did not.
fn cached_pages(state: &HandleState, offset: u64, len: u64) -> Option<(u64, u64)> {
    let end = offset.checked_add(len)?;
    if end > state.len().ok()? {
        return None;
    }
    let page = pagecache::page_size();
    let first_page = offset / page;
    let pages = if len == 0 { 0 } else { end.div_ceil(page) - first_page };
    if pages == 0 {
        return Some((0, 0));
    }
    let (fd, path) = (state.file.as_fd(), Some(state.path.as_path()));
    let (start, aligned_len) = (first_page * page, pages * page);
    if !pagecache::cachestat_missing() {
        match pagecache::cachestat(fd, path, start, aligned_len) {
            Ok(counts) => return Some((counts.cached, pages)),
            Err(e) if pagecache::mincore_may_answer(&e) => {}
            Err(_) => return None,
        }
    }
    let cached = pagecache::mincore_pages(fd, path, start, aligned_len, |_, _| {}).ok()?;
    Some((cached, pages))
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
