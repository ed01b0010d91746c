//! The arithmetic of a multipart upload, apart from the code that sends it: which parts a
//! write touches, and which bytes of a part have been written. Pure, so that tests can table
//! and fuzz it.
//!
//! Part `i` holds the object's bytes `[i × part_size, (i + 1) × part_size)`: every part but the
//! last is exactly `part_size` bytes, which is what S3 asks (all parts but the last at least
//! 5 MiB) and what stores stricter than S3 (equal parts) ask too.
#![forbid(unsafe_code)]

use std::ops::Range;

use crate::error::{Error, Result};

/// The fewest bytes S3 accepts in a part that is not the last.
pub const MIN_PART_SIZE: u64 = 5 << 20;

/// The most bytes S3 accepts in one part.
pub const MAX_PART_SIZE: u64 = 5 << 30;

/// The most parts S3 accepts in one upload: an object written in parts of `part_size` bytes
/// ends at `MAX_PARTS × part_size` at most.
pub const MAX_PARTS: u64 = 10_000;

/// One write's piece that falls in one part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The part's index (0-based; S3 numbers parts from 1).
    pub(crate) part: usize,
    /// Where the piece lands within the part.
    pub(crate) in_part: Range<usize>,
    /// Where the piece comes from within the write's source.
    pub(crate) in_source: Range<usize>,
}

/// The pieces of a write of `len` bytes at `offset` into an object cut into parts of
/// `part_size` bytes, in order: at most [`MAX_PARTS`]. Refuses a write that ends past
/// [`MAX_PARTS`] parts, naming it, and a part size of 0.
pub(crate) fn pieces(offset: u64, len: usize, part_size: usize) -> Result<Vec<Piece>> {
    if part_size == 0 {
        return Err(Error::InvalidArgument("part_size 0: a part holds at least one byte".into()));
    }
    let end = offset.checked_add(len as u64).ok_or(Error::Overflow { offset, len: len as u64 })?;
    let limit = MAX_PARTS.saturating_mul(part_size as u64);
    if end > limit {
        return Err(Error::InvalidArgument(format!(
            "a write of {len} bytes at offset {offset} ends past {limit} bytes, the most an \
             upload of {MAX_PARTS} parts of {part_size} bytes holds; raise part_size"
        )));
    }
    let mut pieces = Vec::new();
    let mut at = offset;
    while at < end {
        let part = (at / part_size as u64) as usize;
        let part_start = part as u64 * part_size as u64;
        let piece_end = end.min(part_start.saturating_add(part_size as u64));
        let source_start = (at - offset) as usize;
        let source_end = (piece_end - offset) as usize;
        pieces.push(Piece {
            part,
            in_part: (at - part_start) as usize..(piece_end - part_start) as usize,
            in_source: source_start..source_end,
        });
        at = piece_end;
    }
    Ok(pieces)
}

/// Which bytes of one part have been written: disjoint, sorted, merged ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Coverage {
    ranges: Vec<Range<usize>>,
}

impl Coverage {
    /// Marks `range` written (overlapping or touching ranges merge).
    pub(crate) fn insert(&mut self, range: Range<usize>) {
        if range.is_empty() {
            return;
        }
        let mut merged = range;
        let mut kept = Vec::with_capacity(self.ranges.len() + 1);
        for r in self.ranges.drain(..) {
            if r.end < merged.start || merged.end < r.start {
                kept.push(r);
            } else {
                merged = merged.start.min(r.start)..merged.end.max(r.end);
            }
        }
        let at = kept.partition_point(|r| r.start < merged.start);
        kept.insert(at, merged);
        self.ranges = kept;
    }

    /// The first byte below `len` not written, if any.
    pub(crate) fn first_gap(&self, len: usize) -> Option<usize> {
        match self.ranges.first() {
            Some(first) if first.start == 0 => (first.end < len).then_some(first.end),
            _ => (len > 0).then_some(0),
        }
    }

    /// Whether no byte is written.
    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether every byte below `len` is written.
    pub(crate) fn covers(&self, len: usize) -> bool {
        self.first_gap(len).is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn piece(part: usize, in_part: Range<usize>, in_source: Range<usize>) -> Piece {
        Piece { part, in_part, in_source }
    }

    #[test]
    fn writes_are_cut_at_part_boundaries() {
        let table: &[(u64, usize, Vec<Piece>)] = &[
            (0, 0, vec![]),
            (0, 10, vec![piece(0, 0..10, 0..10)]),
            (5, 10, vec![piece(0, 5..10, 0..5), piece(1, 0..5, 5..10)]),
            (10, 10, vec![piece(1, 0..10, 0..10)]),
            (
                7,
                25,
                vec![
                    piece(0, 7..10, 0..3),
                    piece(1, 0..10, 3..13),
                    piece(2, 0..10, 13..23),
                    piece(3, 0..2, 23..25),
                ],
            ),
        ];
        for (offset, len, want) in table {
            assert_eq!(&pieces(*offset, *len, 10).unwrap(), want, "{offset} {len}");
        }
    }

    #[test]
    fn writes_past_the_last_part_are_refused() {
        assert!(pieces(MAX_PARTS * 10 - 1, 1, 10).is_ok());
        let e = pieces(MAX_PARTS * 10 - 1, 2, 10).unwrap_err();
        assert!(e.to_string().contains("raise part_size"), "{e}");
        assert!(matches!(pieces(u64::MAX, 2, 10), Err(Error::Overflow { .. })));
        assert!(matches!(pieces(0, 1, 0), Err(Error::InvalidArgument(_))));
        assert!(pieces(u64::MAX - 1, 1, usize::MAX).is_ok());
    }

    #[test]
    fn coverage_merges_and_finds_gaps() {
        let mut c = Coverage::default();
        assert_eq!(c.first_gap(0), None);
        assert_eq!(c.first_gap(5), Some(0));
        c.insert(4..6);
        c.insert(0..2);
        assert_eq!(c.first_gap(6), Some(2));
        c.insert(2..4);
        assert_eq!(c.ranges, vec![0..6]);
        assert!(c.covers(6));
        assert!(!c.covers(7));
        c.insert(9..9);
        assert_eq!(c.ranges, vec![0..6]);
    }

    proptest! {
        /// Pieces tile the write exactly: consecutive in the source, each within one part,
        /// and at the right place in the object.
        #[test]
        fn pieces_tile_the_write(offset in 0u64..10_000, len in 0usize..5_000, size in 1usize..700) {
            let end = offset + len as u64;
            let Ok(got) = pieces(offset, len, size) else {
                // Refused only past the last part.
                prop_assert!(end > MAX_PARTS * size as u64);
                return Ok(());
            };
            prop_assert!(end <= MAX_PARTS * size as u64);
            let mut next = 0;
            for p in &got {
                prop_assert_eq!(p.in_source.start, next);
                prop_assert_eq!(p.in_source.len(), p.in_part.len());
                prop_assert!(!p.in_part.is_empty() && p.in_part.end <= size);
                prop_assert_eq!(
                    (p.part * size + p.in_part.start) as u64,
                    offset + p.in_source.start as u64
                );
                next = p.in_source.end;
            }
            prop_assert_eq!(next, len);
        }

        /// Coverage agrees with a byte map of what was written.
        #[test]
        fn coverage_matches_a_byte_map(writes in proptest::collection::vec((0usize..64, 0usize..20), 0..12), len in 0usize..80) {
            let mut c = Coverage::default();
            let mut written = [false; 100];
            for (start, n) in writes {
                c.insert(start..start + n);
                written[start..start + n].iter_mut().for_each(|w| *w = true);
            }
            let want = (0..len).find(|&i| !written[i]);
            prop_assert_eq!(c.first_gap(len), want);
            prop_assert_eq!(c.covers(len), want.is_none());
            prop_assert_eq!(c.is_empty(), !written.contains(&true));
            for pair in c.ranges.windows(2) {
                prop_assert!(pair[0].end < pair[1].start);
            }
        }
    }
}
