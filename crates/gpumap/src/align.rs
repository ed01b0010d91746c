//! Page and extent arithmetic, and the splitting of one transfer into parallel tasks.
//!
//! Pure functions over `u64` offsets. Everything that can overflow returns `Option` or
//! [`crate::Error::Overflow`]; nothing here panics.
#![forbid(unsafe_code)]

use crate::error::{Error, Result};

/// The page size gpumap aligns to: the x86-64 and common aarch64 page, and the block size that
/// `O_DIRECT` needs on every file system we meet (4 KiB-sector disks included).
pub const PAGE_SIZE: u64 = 4096;

/// Rounds `value` down to a multiple of `alignment` (a power of two).
#[inline]
pub const fn align_down(value: u64, alignment: u64) -> u64 {
    value & !(alignment - 1)
}

/// Rounds `value` up to a multiple of `alignment` (a power of two); `None` on overflow.
#[inline]
pub const fn align_up(value: u64, alignment: u64) -> Option<u64> {
    match value.checked_add(alignment - 1) {
        Some(v) => Some(align_down(v, alignment)),
        None => None,
    }
}

/// Whether `value` is a multiple of `alignment` (a power of two).
#[inline]
pub const fn is_aligned(value: u64, alignment: u64) -> bool {
    value & (alignment - 1) == 0
}

/// `offset + len`, or [`Error::Overflow`] when that passes `i64::MAX` (the largest `off_t`).
pub fn checked_end(offset: u64, len: u64) -> Result<u64> {
    match offset.checked_add(len) {
        Some(end) if end <= i64::MAX as u64 => Ok(end),
        _ => Err(Error::Overflow { offset, len }),
    }
}

/// `Ok` when `[offset, offset + len)` lies within a file of `file_len` bytes;
/// [`Error::OutOfRange`] past its end, [`Error::Overflow`] when the end is not a `u64`.
pub(crate) fn check_range(offset: u64, len: u64, file_len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= file_len => Ok(()),
        Some(_) => Err(Error::OutOfRange { offset, len, file_len }),
        None => Err(Error::Overflow { offset, len }),
    }
}

/// One piece of a parallel transfer: `len` bytes at file offset `offset`, which land at
/// `buf_offset` in the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Task {
    /// File offset of the piece.
    pub offset: u64,
    /// Length of the piece.
    pub len: u64,
    /// Offset of the piece in the caller's buffer.
    pub buf_offset: u64,
}

/// Splits `len` bytes at `offset` into tasks of at most `task_size` bytes, KvikIO-style: the
/// first task ends at a page boundary so that every later task starts page-aligned (which keeps
/// `O_DIRECT` usable for them and the page cache's readahead windows intact).
///
/// `task_size` below one page is treated as one page (a smaller task only adds system calls).
/// The tasks cover the range exactly once, in order. `len == 0` gives no task.
pub fn split_tasks(offset: u64, len: u64, task_size: u64) -> Vec<Task> {
    let task_size = align_up(task_size.max(PAGE_SIZE), PAGE_SIZE).unwrap_or(u64::MAX);
    let Some(end) = offset.checked_add(len) else {
        return vec![Task { offset, len, buf_offset: 0 }];
    };
    let mut tasks = Vec::with_capacity(len.div_ceil(task_size) as usize + 1);
    let mut pos = offset;
    while pos < end {
        // Cut at the last page boundary no further than task_size ahead; if that would make an
        // empty task (pos unaligned and within one page of it), cut at task_size.
        let limit = pos.saturating_add(task_size).min(end);
        let cut = if limit == end { end } else { align_down(limit, PAGE_SIZE) };
        let cut = if cut <= pos { limit } else { cut };
        tasks.push(Task { offset: pos, len: cut - pos, buf_offset: pos - offset });
        pos = cut;
    }
    tasks
}

/// A range split for direct I/O: an unaligned `head`, an `alignment`-aligned `middle` (start and
/// length both aligned, unless it is empty) and an unaligned `tail`. Each part is `(offset, len)`; parts may be
/// empty. The parts are adjacent and cover the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectSplit {
    /// Bytes before the first aligned offset.
    pub head: (u64, u64),
    /// The aligned middle.
    pub middle: (u64, u64),
    /// Bytes after the last aligned offset.
    pub tail: (u64, u64),
}

/// Splits `[offset, offset + len)` into head, aligned middle and tail (see [`DirectSplit`]).
pub fn direct_split(offset: u64, len: u64, alignment: u64) -> DirectSplit {
    let end = offset.saturating_add(len);
    let mid_start = align_up(offset, alignment).unwrap_or(end).min(end);
    let mid_end = align_down(end, alignment).max(mid_start);
    DirectSplit {
        head: (offset, mid_start - offset),
        middle: (mid_start, mid_end - mid_start),
        tail: (mid_end, end - mid_end),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rounding() {
        assert_eq!(align_down(4097, 4096), 4096);
        assert_eq!(align_up(4097, 4096), Some(8192));
        assert_eq!(align_up(4096, 4096), Some(4096));
        assert_eq!(align_up(u64::MAX, 4096), None);
        assert!(is_aligned(0, 4096) && is_aligned(8192, 4096) && !is_aligned(1, 4096));
        assert!(check_range(0, 10, 10).is_ok() && check_range(10, 0, 10).is_ok());
        assert!(matches!(check_range(5, 6, 10), Err(Error::OutOfRange { offset: 5, len: 6, .. })));
        assert!(matches!(check_range(u64::MAX, 1, 10), Err(Error::Overflow { .. })));
        assert!(checked_end(u64::MAX, 1).is_err());
        assert!(checked_end(i64::MAX as u64, 1).is_err());
        assert_eq!(checked_end(1 << 40, 5).ok(), Some((1 << 40) + 5));
    }

    #[test]
    fn split_examples() {
        assert!(split_tasks(0, 0, 4 << 20).is_empty());
        assert_eq!(split_tasks(10, 5, 4 << 20), vec![Task { offset: 10, len: 5, buf_offset: 0 }]);
        let t = split_tasks(100, 10 << 20, 4 << 20);
        assert_eq!(t[0], Task { offset: 100, len: (4 << 20) - 100, buf_offset: 0 });
        assert_eq!(t[1].offset, 4 << 20);
    }

    proptest! {
        #[test]
        fn tasks_cover_range_once_and_align(offset in 0u64..(1 << 44), len in 0u64..(64 << 20),
                                            task_size in 1u64..(16 << 20)) {
            let tasks = split_tasks(offset, len, task_size);
            let eff = align_up(task_size.max(PAGE_SIZE), PAGE_SIZE).unwrap();
            let mut pos = offset;
            for (i, t) in tasks.iter().enumerate() {
                prop_assert_eq!(t.offset, pos);
                prop_assert_eq!(t.buf_offset, pos - offset);
                prop_assert!(t.len > 0 && t.len <= eff);
                if i > 0 { prop_assert!(is_aligned(t.offset, PAGE_SIZE)); }
                pos += t.len;
            }
            prop_assert_eq!(pos, offset + len);
            // No more tasks than needed: at most one extra for the unaligned head.
            prop_assert!(tasks.len() as u64 <= len.div_ceil(eff) + 1);
        }

        #[test]
        fn direct_split_is_exact(offset in 0u64..(1 << 44), len in 0u64..(1 << 24)) {
            let s = direct_split(offset, len, PAGE_SIZE);
            prop_assert_eq!(s.head.0, offset);
            prop_assert_eq!(s.head.0 + s.head.1, s.middle.0);
            prop_assert_eq!(s.middle.0 + s.middle.1, s.tail.0);
            prop_assert_eq!(s.tail.0 + s.tail.1, offset + len);
            // An empty middle sits wherever the head ends (a range with no page boundary
            // inside has no aligned point to put it at).
            prop_assert!(is_aligned(s.middle.1, PAGE_SIZE));
            prop_assert!(s.middle.1 == 0 || is_aligned(s.middle.0, PAGE_SIZE));
            prop_assert!(s.head.1 < PAGE_SIZE && s.tail.1 < PAGE_SIZE);
        }
    }
}
