//! [`ByteRange`]: the part of a file a call is about, checked against the file and rounded
//! out to the pages that cover it ([`Span`]).
#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use crate::sys::pagecache::page_size;

/// A byte range of a file: `len: None` means "to the end of the file".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ByteRange {
    /// First byte.
    pub offset: u64,
    /// Number of bytes, or `None` for everything from `offset` to the end of the file.
    pub len: Option<u64>,
}

impl ByteRange {
    /// The whole file.
    pub const ALL: ByteRange = ByteRange { offset: 0, len: None };

    /// `len` bytes from `offset`.
    pub fn new(offset: u64, len: u64) -> Self {
        ByteRange { offset, len: Some(len) }
    }

    /// Everything from `offset` to the end of the file.
    pub fn from_offset(offset: u64) -> Self {
        ByteRange { offset, len: None }
    }

    /// Check the range against a file of `file_size` bytes and round it out to pages.
    pub(super) fn resolve(&self, file_size: u64) -> Result<Span> {
        let len = match self.len {
            Some(len) => len,
            None => file_size.checked_sub(self.offset).ok_or(Error::OutOfRange {
                offset: self.offset,
                len: 0,
                file_len: file_size,
            })?,
        };
        let end =
            self.offset.checked_add(len).ok_or(Error::Overflow { offset: self.offset, len })?;
        if end > file_size {
            return Err(Error::OutOfRange { offset: self.offset, len, file_len: file_size });
        }
        let page = page_size();
        let first_page = self.offset / page;
        let end_page = if len == 0 { first_page } else { end.div_ceil(page) };
        Ok(Span { offset: self.offset, len, first_page, end_page, page, file_size })
    }
}

impl From<std::ops::Range<u64>> for ByteRange {
    /// `start..end`; an inverted range becomes empty.
    fn from(r: std::ops::Range<u64>) -> Self {
        ByteRange::new(r.start, r.end.saturating_sub(r.start))
    }
}

impl From<std::ops::RangeFrom<u64>> for ByteRange {
    fn from(r: std::ops::RangeFrom<u64>) -> Self {
        ByteRange::from_offset(r.start)
    }
}

impl From<std::ops::RangeFull> for ByteRange {
    fn from(_: std::ops::RangeFull) -> Self {
        ByteRange::ALL
    }
}

/// A checked byte range and the pages covering it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) first_page: u64,
    /// One past the last page.
    pub(super) end_page: u64,
    pub(super) page: u64,
    pub(super) file_size: u64,
}

impl Span {
    pub(super) fn pages(&self) -> u64 {
        self.end_page - self.first_page
    }
    /// Page-aligned start of the covered pages.
    pub(super) fn aligned_offset(&self) -> u64 {
        self.first_page * self.page
    }
    /// Bytes of the covered pages (may reach past the end of the file in the last page).
    pub(super) fn aligned_len(&self) -> u64 {
        self.pages() * self.page
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_out_to_pages() {
        let page = page_size();
        let span = ByteRange::new(1, page).resolve(10 * page).unwrap();
        assert_eq!((span.first_page, span.end_page), (0, 2));
        let span = ByteRange::ALL.resolve(page + 1).unwrap();
        assert_eq!(span.pages(), 2);
        let span = ByteRange::ALL.resolve(0).unwrap();
        assert_eq!(span.pages(), 0);
        let span = ByteRange::new(page, 0).resolve(page).unwrap();
        assert_eq!(span.pages(), 0);
    }

    #[test]
    fn ranges_past_the_end_are_errors() {
        assert!(matches!(
            ByteRange::new(5, 10).resolve(10),
            Err(Error::OutOfRange { offset: 5, len: 10, file_len: 10 })
        ));
        assert!(matches!(ByteRange::from_offset(11).resolve(10), Err(Error::OutOfRange { .. })));
        assert!(matches!(ByteRange::new(u64::MAX, 2).resolve(10), Err(Error::Overflow { .. })));
    }
}
