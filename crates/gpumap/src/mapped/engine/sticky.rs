//! A write-back failure remembered for its file (see `writeback`): Linux reports a write-back
//! error once, and a retried `fsync` can falsely succeed, so the file keeps returning it until
//! a `sync` has written every byte again.
#![forbid(unsafe_code)]

use std::path::Path;

use crate::error::Error;

/// A write-back failure remembered for its file until a `sync` writes every byte: its cause,
/// so that every later flush reports an error of the same kind (and errno), with the dirty
/// bytes counted anew each time.
pub(crate) struct StickyError {
    /// What failed: the source of a `WriteBack`, a `FileShrank`, or a failed `fdatasync`.
    cause: Error,
}

impl StickyError {
    pub(crate) fn from_error(e: &Error) -> StickyError {
        let cause = match e {
            Error::WriteBack { source, .. } => source.duplicate(),
            other => other.duplicate(),
        };
        StickyError { cause }
    }

    /// The error again, with `dirty_bytes` as they are now.
    pub(crate) fn to_error(&self, path: &Path, dirty_bytes: u64) -> Error {
        match &self.cause {
            Error::FileShrank { path, len, mapped_len, .. } => Error::FileShrank {
                path: path.clone(),
                len: *len,
                mapped_len: *mapped_len,
                dirty_bytes,
            },
            cause => Error::WriteBack {
                path: path.to_path_buf(),
                dirty_bytes,
                source: Box::new(cause.duplicate()),
            },
        }
    }
}
