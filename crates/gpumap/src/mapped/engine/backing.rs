//! Where an open file's bytes come from: a local file, or (the `remote` feature) a remote
//! object read with ranged GETs. The engine asks both the same few things — read a range into
//! host or GPU memory, the length, checks of what a read got — so that faults, gathers and
//! read-through neither know nor care which one serves them. Only local files are written back.
#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::io::{FileHandle, IoPool};
#[cfg(feature = "remote")]
use crate::memory::cuda::CudaViewMut;
use crate::memory::cuda::RawRegion;
#[cfg(feature = "remote")]
use crate::memory::DeviceViewMut;
#[cfg(feature = "remote")]
use crate::remote::RemoteFile;

/// The source of one open file's bytes.
#[derive(Clone)]
pub(crate) enum Backing {
    Local(FileHandle),
    /// A remote object, read-only; its length is the one known at open (an object is replaced
    /// whole, never changed in place).
    #[cfg(feature = "remote")]
    Remote {
        file: RemoteFile,
        pool: Arc<IoPool>,
    },
}

impl Backing {
    /// The pool its reads are spread over.
    pub(crate) fn pool(&self) -> &Arc<IoPool> {
        match self {
            Backing::Local(file) => file.pool(),
            #[cfg(feature = "remote")]
            Backing::Remote { pool, .. } => pool,
        }
    }

    /// Whether the bytes are a remote object's.
    pub(crate) fn is_remote(&self) -> bool {
        !matches!(self, Backing::Local(_))
    }

    /// Its length now: a local file's from `fstat`, a remote object's as opened.
    pub(crate) fn len(&self) -> Result<u64> {
        match self {
            Backing::Local(file) => file.len(),
            #[cfg(feature = "remote")]
            Backing::Remote { file, .. } => Ok(file.len()),
        }
    }

    /// Reads up to `buf.len()` bytes at `offset` into host memory, as `pread` does: short
    /// only where the bytes end.
    pub(crate) fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        match self {
            Backing::Local(file) => file.read_at(buf, offset),
            #[cfg(feature = "remote")]
            Backing::Remote { file, .. } => {
                let n = present(file.len(), offset, buf.len());
                file.read(&mut buf[..n], offset)?;
                Ok(n)
            }
        }
    }

    /// Reads each `(buf, offset)` of `pieces` as [`read_at`](Self::read_at) does, and gives
    /// each one's count: a local file's one after another, a remote object's all in flight at
    /// once (within its bound on requests), so that a gather's misses do not wait on each
    /// other's round trips.
    pub(crate) fn read_pieces_at(&self, pieces: &mut [(&mut [u8], u64)]) -> Result<Vec<usize>> {
        match self {
            Backing::Local(file) => {
                pieces.iter_mut().map(|(buf, offset)| file.read_at(buf, *offset)).collect()
            }
            #[cfg(feature = "remote")]
            Backing::Remote { file, .. } => {
                let counts: Vec<usize> = pieces
                    .iter()
                    .map(|(buf, offset)| present(file.len(), *offset, buf.len()))
                    .collect();
                let mut present: Vec<(&mut [u8], u64)> = pieces
                    .iter_mut()
                    .zip(&counts)
                    .map(|((buf, offset), &n)| (&mut buf[..n], *offset))
                    .collect();
                file.read_pieces(&mut present)?;
                Ok(counts)
            }
        }
    }

    /// Reads up to `dst.len` bytes at `offset` into GPU memory the crate keeps live for the
    /// call (a large load of a cache frame); short only where the bytes end.
    pub(crate) fn read_cuda_raw_in_tasks(
        &self,
        dst: RawRegion,
        offset: u64,
        min_task: u64,
    ) -> Result<usize> {
        match self {
            Backing::Local(file) => file.read_cuda_raw_in_tasks(dst, offset, min_task),
            #[cfg(feature = "remote")]
            Backing::Remote { file, .. } => {
                let n = present(file.len(), offset, dst.len);
                if n > 0 {
                    let view = CudaViewMut::assume_valid(dst.sub(0, n)?);
                    file.read_device(DeviceViewMut::Cuda(view), offset)?;
                }
                Ok(n)
            }
        }
    }

    /// The local file, to write back to; a remote object is read-only.
    #[cfg_attr(not(feature = "remote"), allow(unused_variables))]
    pub(crate) fn writable_file(&self, path: &Path) -> Result<&FileHandle> {
        match self {
            Backing::Local(file) => Ok(file),
            #[cfg(feature = "remote")]
            Backing::Remote { .. } => Err(Error::InvalidArgument(format!(
                "{} is a remote object, mapped read-only",
                path.display()
            ))),
        }
    }

    /// `Ok` when a read of `wanted` bytes at `offset` got them all, else
    /// [`Error::UnexpectedEof`] naming the range and the length now.
    pub(crate) fn expect_len(&self, offset: u64, wanted: u64, got: u64) -> Result<()> {
        if got >= wanted {
            return Ok(());
        }
        Err(self.eof_error(offset, wanted, got))
    }

    /// [`Error::UnexpectedEof`] for a read of `wanted` bytes at `offset` that got `got`.
    pub(crate) fn eof_error(&self, offset: u64, wanted: u64, got: u64) -> Error {
        match self {
            Backing::Local(file) => file.eof_error(offset, wanted, got),
            #[cfg(feature = "remote")]
            Backing::Remote { file, .. } => Error::UnexpectedEof {
                path: Some(file.url().redacted().into()),
                offset,
                wanted,
                file_len: file.len(),
            },
        }
    }

    /// `Ok` when every `(offset, len)` of `ranges` lies within the bytes as long as they are
    /// now (for a local file one `fstat`), else [`Error::UnexpectedEof`] for the first that
    /// does not.
    pub(crate) fn expect_ranges(&self, ranges: impl IntoIterator<Item = (u64, u64)>) -> Result<()> {
        match self {
            Backing::Local(file) => file.expect_ranges(ranges),
            #[cfg(feature = "remote")]
            Backing::Remote { file, .. } => {
                for (offset, len) in ranges {
                    if offset.saturating_add(len) > file.len() {
                        let got = file.len().saturating_sub(offset);
                        return Err(self.eof_error(offset, len, got));
                    }
                }
                Ok(())
            }
        }
    }
}

/// How many of `want` bytes at `offset` an object of `len` bytes has.
#[cfg(feature = "remote")]
fn present(len: u64, offset: u64, want: usize) -> usize {
    usize::try_from(len.saturating_sub(offset)).unwrap_or(usize::MAX).min(want)
}

#[cfg(all(test, feature = "remote"))]
mod tests {
    use super::present;

    #[test]
    fn reads_are_short_only_where_the_object_ends() {
        for (len, offset, want, got) in
            [(100, 0, 10, 10), (100, 95, 10, 5), (100, 100, 10, 0), (100, 250, 10, 0), (0, 0, 4, 0)]
        {
            assert_eq!(present(len, offset, want), got, "{len} {offset} {want}");
        }
    }
}
