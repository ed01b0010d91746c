//! [`RawRegion`], the device address range the crate passes around internally, and the bounds
//! checks every view and buffer shares.
#![forbid(unsafe_code)]

use std::ops::{Bound, RangeBounds};

use super::device::CudaDevice;
use crate::error::{Error, Result};
use crate::sys::cuda as sys;

/// Checks that `[offset, offset + len)` lies inside `available` bytes.
pub(crate) fn check_range(offset: usize, len: usize, available: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= available => Ok(()),
        Some(_) => Err(Error::OutOfRange {
            offset: offset as u64,
            len: len as u64,
            file_len: available as u64,
        }),
        None => Err(Error::Overflow { offset: offset as u64, len: len as u64 }),
    }
}

/// `range` of a buffer of `len` bytes as `(start, len)`, bounds-checked.
pub(crate) fn resolve_range(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => {
            s.checked_add(1).ok_or(Error::Overflow { offset: s as u64, len: 1 })?
        }
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => {
            e.checked_add(1).ok_or(Error::Overflow { offset: e as u64, len: 1 })?
        }
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end {
        return Err(Error::InvalidArgument(format!("range {start}..{end} ends before it starts")));
    }
    check_range(start, end - start, len)?;
    Ok((start, end - start))
}

/// A device address range as the crate passes it around internally: no lifetime, `Copy`. The
/// public face of device memory is `CudaView` / `CudaViewMut`, which borrow what they point
/// to; a `RawRegion` is only made from one of those (or from memory the crate owns) and never
/// outlives the call that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RawRegion {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) ordinal: usize,
}

impl RawRegion {
    /// The sub-range `[offset, offset + len)`, bounds-checked.
    pub(crate) fn sub(&self, offset: usize, len: usize) -> Result<RawRegion> {
        check_range(offset, len, self.len)?;
        Ok(RawRegion { ptr: self.ptr + offset as u64, len, ordinal: self.ordinal })
    }

    fn bind(&self) -> Result<()> {
        CudaDevice::new(self.ordinal)?.bind_to_thread()
    }

    /// Synchronous `cuMemcpyHtoD` of `src` to `offset`.
    pub(crate) fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(offset, src.len(), self.len)?;
        self.bind()?;
        sys::memcpy_htod(self.ptr + offset as u64, src)
    }

    /// Synchronous `cuMemcpyDtoH` of `dst.len()` bytes at `offset` into `dst`.
    pub(crate) fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len)?;
        self.bind()?;
        sys::memcpy_dtoh(dst, self.ptr + offset as u64)
    }

    /// Sets every byte to `value` (`cuMemsetD8`; done when it returns).
    pub(crate) fn fill(&self, value: u8) -> Result<()> {
        self.bind()?;
        sys::memset_d8(self.ptr, value, self.len)
    }
}
