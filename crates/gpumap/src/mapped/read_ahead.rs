//! Read-ahead of a walk: which pieces to read in the background when a view continues a walk
//! through a file (or any wide view of a file advised `Sequential`). Pure: the file's map
//! decides here and hands the pieces to its pool. Pieces of 16 MiB, each read whole by one pool
//! thread, as deep as the budget allows (docs/decisions/0002-read-ahead-in-pieces.md).
#![forbid(unsafe_code)]

use super::map_options::Advice;

/// The most windows (views' lengths) one view reads ahead.
const MAX_WINDOWS_AHEAD: u64 = 16;

/// Read-ahead is cut into pieces this long, each one job on the file's pool read as one task by
/// the thread that takes it: split further, a piece would finish only when the last of its
/// tasks on threads busy with other pieces did (docs/decisions/0002-read-ahead-in-pieces.md).
pub(crate) const READ_AHEAD_PIECE: u64 = 16 << 20;

/// The most pieces one view starts (longer pieces beyond it), so that a view of a huge walk
/// queues a bounded number of pool jobs.
const MAX_PIECES_AHEAD: u64 = 64;

/// How a file is being read, for read-ahead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AccessState {
    pub(crate) advice: Advice,
    /// Where the last contiguous view ended (a view starting there is the next of a walk).
    pub(crate) last_end: Option<u64>,
    /// Read-ahead has been started up to here.
    pub(crate) ahead_until: u64,
}

/// What read-ahead depends on besides the access: the file and its cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Walk {
    /// Bytes a walk reads ahead (`MapOptions::read_ahead`; 0: none).
    pub(crate) read_ahead: u64,
    /// The cache's budget, frame and extent.
    pub(crate) budget: u64,
    pub(crate) frame: u64,
    pub(crate) extent: u64,
    /// The mapped file's length.
    pub(crate) file_len: u64,
}

/// What a contiguous view of `[offset, offset + len)` starts reading ahead: the pieces
/// `(offset, len)` after it, when the access is a walk — two to [`MAX_WINDOWS_AHEAD`] windows
/// of `len` (none with read-ahead 0), as far as the budget holds them beside this one, minus
/// what earlier views of the walk already started. Records the view in `access`: a view that
/// does not continue the walk starts it again (the next pass over the file reads ahead like
/// the first).
pub(crate) fn plan(
    access: &mut AccessState,
    walk: &Walk,
    offset: u64,
    len: u64,
) -> Vec<(u64, u64)> {
    if access.advice == Advice::Random || len == 0 {
        return Vec::new();
    }
    let depth = match walk.read_ahead {
        0 => 0,
        bytes => bytes.div_ceil(len).clamp(2, MAX_WINDOWS_AHEAD),
    }
    .min((walk.budget / len.next_multiple_of(walk.frame)).saturating_sub(1));
    let end = offset + len;
    let continuing = access.last_end == Some(offset);
    if !continuing {
        // A walk starting again or jumping: what earlier read-ahead reached says nothing
        // about what is resident now.
        access.ahead_until = 0;
    }
    let walking = access.advice == Advice::Sequential || continuing;
    access.last_end = Some(end);
    if !walking || depth == 0 {
        return Vec::new();
    }
    let until = (end + depth * len).min(walk.file_len);
    let from = end.max(access.ahead_until);
    access.ahead_until = access.ahead_until.max(until);
    let piece = piece_len(until.saturating_sub(from), len, walk.extent);
    (from..until).step_by(piece as usize).map(|at| (at, piece.min(until - at))).collect()
}

/// The length of the pieces `bytes` of read-ahead in windows of `window` bytes are cut into:
/// [`READ_AHEAD_PIECE`], longer where that would make more than [`MAX_PIECES_AHEAD`] of them,
/// in whole extents (a piece border inside an extent would leave it to whichever piece claims
/// it first) — but never longer than a window: a piece pins all its frames until it is in, and
/// a small budget read ahead in pieces longer than the walk's windows evicted windows read
/// ahead before the walk got to them.
pub(crate) fn piece_len(bytes: u64, window: u64, extent: u64) -> u64 {
    let piece =
        bytes.div_ceil(MAX_PIECES_AHEAD).max(READ_AHEAD_PIECE).next_multiple_of(extent.max(1));
    piece.min(window)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    fn walk(read_ahead: u64) -> Walk {
        Walk { read_ahead, budget: 1 << 30, frame: 32 * MIB, extent: 64 << 10, file_len: 4 << 30 }
    }

    #[test]
    fn a_walk_reads_ahead_and_a_jump_starts_again() {
        let mut access = AccessState::default();
        let w = walk(512 * MIB);
        // The first view of a file is no walk yet.
        assert!(plan(&mut access, &w, 0, 64 * MIB).is_empty());
        // The next one continues it: 512 MiB ahead (eight windows) in 16 MiB pieces.
        let pieces = plan(&mut access, &w, 64 * MIB, 64 * MIB);
        assert_eq!(pieces.len(), 32);
        assert_eq!(pieces[0], (128 * MIB, 16 * MIB));
        assert_eq!(pieces.last(), Some(&(624 * MIB, 16 * MIB)));
        // The one after asks only for what is not yet asked for: one more window.
        let pieces = plan(&mut access, &w, 128 * MIB, 64 * MIB);
        assert_eq!(pieces, (0..4).map(|k| ((640 + 16 * k) * MIB, 16 * MIB)).collect::<Vec<_>>());
        // A jump is no walk, and the walk that follows it reads ahead afresh.
        assert!(plan(&mut access, &w, 2048 * MIB, 64 * MIB).is_empty());
        assert_eq!(access.ahead_until, 0);
        assert_eq!(plan(&mut access, &w, 2112 * MIB, 64 * MIB).len(), 32);
    }

    #[test]
    fn advice_budget_and_file_end_bound_it() {
        let w = walk(512 * MIB);
        let mut random = AccessState { advice: Advice::Random, ..AccessState::default() };
        assert!(plan(&mut random, &w, 0, 64 * MIB).is_empty());
        assert!(plan(&mut random, &w, 64 * MIB, 64 * MIB).is_empty());
        // Sequential reads ahead from the first view.
        let mut sequential = AccessState { advice: Advice::Sequential, ..AccessState::default() };
        assert_eq!(plan(&mut sequential, &w, 0, 64 * MIB).len(), 32);
        // None with read-ahead off.
        let mut access = AccessState { advice: Advice::Sequential, ..AccessState::default() };
        assert!(plan(&mut access, &walk(0), 0, 64 * MIB).is_empty());
        // A budget of three windows reads two ahead.
        let small = Walk { budget: 192 * MIB, ..w };
        let mut access = AccessState { advice: Advice::Sequential, ..AccessState::default() };
        let pieces = plan(&mut access, &small, 0, 64 * MIB);
        assert_eq!(pieces.last().map(|p| p.0 + p.1), Some(192 * MIB));
        // Never past the end of the file.
        let short = Walk { file_len: 100 * MIB, ..w };
        let mut access = AccessState { advice: Advice::Sequential, ..AccessState::default() };
        let pieces = plan(&mut access, &short, 0, 64 * MIB);
        assert_eq!(pieces.last().map(|p| p.0 + p.1), Some(100 * MIB));
    }

    proptest! {
        #[test]
        fn pieces_fit_windows_and_are_bounded_in_number(
            window in 1u64..(1 << 36),
            windows in 1u64..=MAX_WINDOWS_AHEAD,
            extent_pages in 1u64..=4096,
        ) {
            let extent = extent_pages * 4096;
            let bytes = window * windows;
            let piece = piece_len(bytes, window, extent);
            prop_assert!(piece <= window);
            prop_assert!(piece >= READ_AHEAD_PIECE.min(window));
            prop_assert!(piece == window || piece.is_multiple_of(extent));
            prop_assert!(bytes.div_ceil(piece) <= MAX_PIECES_AHEAD.max(MAX_WINDOWS_AHEAD));
            // No longer than it needs to be: the least whole extents at or past the target.
            let target = bytes.div_ceil(MAX_PIECES_AHEAD).max(READ_AHEAD_PIECE);
            prop_assert!(piece == window || piece - target < extent);
        }

        /// Pieces tile the range after the view without gaps or overlaps, within the file.
        #[test]
        fn pieces_tile_what_is_read_ahead(
            read_ahead_mib in 0u64..2048,
            window_mib in 1u64..256,
            views in 1usize..6,
        ) {
            let w = walk(read_ahead_mib * MIB);
            let mut access = AccessState { advice: Advice::Sequential, ..AccessState::default() };
            let mut covered_until = 0u64;
            for k in 0..views as u64 {
                let offset = k * window_mib * MIB;
                for (at, n) in plan(&mut access, &w, offset, window_mib * MIB) {
                    prop_assert!(n > 0 && at + n <= w.file_len);
                    prop_assert!(at >= covered_until.max(offset + window_mib * MIB));
                    covered_until = at + n;
                }
            }
        }
    }
}
