//! [`RowIndices`]: which rows a row gather copies — 32- or 64-bit signed indices in host
//! memory, or in GPU memory where a model or a sampler produced them.
#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use crate::memory::cuda::CudaView;

use super::engine::IndexSource;

/// The width of indices in GPU memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexWidth {
    /// `int32`.
    I32,
    /// `int64`.
    I64,
}

impl IndexWidth {
    /// Bytes of one index.
    pub fn bytes(self) -> u32 {
        match self {
            IndexWidth::I32 => 4,
            IndexWidth::I64 => 8,
        }
    }
}

/// The indices of a row gather ([`DeviceMappedFile::gather_rows`]): row `i` is bytes
/// `i * row_size .. (i + 1) * row_size` of the file. A negative index, or one past the last
/// whole row, is [`Error::RowIndex`] naming it and its position; it is never read.
///
/// [`DeviceMappedFile::gather_rows`]: super::DeviceMappedFile::gather_rows
#[derive(Debug, Clone, Copy)]
pub struct RowIndices<'a> {
    source: Source<'a>,
}

#[derive(Debug, Clone, Copy)]
enum Source<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
    Device { view: CudaView<'a>, width: IndexWidth },
}

impl<'a> RowIndices<'a> {
    /// Indices in GPU memory: `view` holds `view.len() / width.bytes()` of them, in the native
    /// byte order. A length that is not a whole number of indices is `InvalidArgument`.
    pub fn on_device(view: CudaView<'a>, width: IndexWidth) -> Result<RowIndices<'a>> {
        if !view.len().is_multiple_of(width.bytes() as usize) {
            return Err(Error::InvalidArgument(format!(
                "{} bytes of device memory are not a whole number of {}-byte indices",
                view.len(),
                width.bytes()
            )));
        }
        Ok(RowIndices { source: Source::Device { view, width } })
    }

    /// How many indices (rows to gather).
    pub fn len(&self) -> usize {
        match self.source {
            Source::I32(v) => v.len(),
            Source::I64(v) => v.len(),
            Source::Device { view, width } => view.len() / width.bytes() as usize,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The indices as the engine takes them.
    pub(crate) fn source(&self) -> IndexSource<'a> {
        match self.source {
            Source::I32(v) => IndexSource::I32(v),
            Source::I64(v) => IndexSource::I64(v),
            Source::Device { view, width } => IndexSource::Device {
                ptr: view.ptr(),
                bytes: width.bytes(),
                count: self.len() as u64,
                ordinal: view.device_ordinal(),
            },
        }
    }
}

impl<'a> From<&'a [i32]> for RowIndices<'a> {
    fn from(v: &'a [i32]) -> Self {
        RowIndices { source: Source::I32(v) }
    }
}

impl<'a> From<&'a [i64]> for RowIndices<'a> {
    fn from(v: &'a [i64]) -> Self {
        RowIndices { source: Source::I64(v) }
    }
}

impl<'a> From<&'a Vec<i32>> for RowIndices<'a> {
    fn from(v: &'a Vec<i32>) -> Self {
        RowIndices::from(v.as_slice())
    }
}

impl<'a> From<&'a Vec<i64>> for RowIndices<'a> {
    fn from(v: &'a Vec<i64>) -> Self {
        RowIndices::from(v.as_slice())
    }
}

impl<'a, const N: usize> From<&'a [i32; N]> for RowIndices<'a> {
    fn from(v: &'a [i32; N]) -> Self {
        RowIndices::from(v.as_slice())
    }
}

impl<'a, const N: usize> From<&'a [i64; N]> for RowIndices<'a> {
    fn from(v: &'a [i64; N]) -> Self {
        RowIndices::from(v.as_slice())
    }
}
