//! The bench file as the workloads need it: its size, its page-cache state, and I/O errors that
//! name it.

use std::path::Path;

use gpumap::error::{Error, Result};

/// The file's length, also as a buffer size.
pub(crate) fn file_size(path: &Path) -> Result<(u64, usize)> {
    // A FIFO, a device or a /proc file has no size to read: said so, not "empty".
    gpumap::io::check_regular_file(path)?;
    let len = std::fs::metadata(path).map_err(|e| io_error("stat", Some(path), e))?.len();
    if len == 0 {
        // Every workload reads the file: an empty one would report 0 GB/s for each.
        return Err(Error::InvalidArgument(format!(
            "{} is empty: the workloads read it (make one with `gpumap write {} --size 1GiB`)",
            path.display(),
            path.display()
        )));
    }
    let size = usize::try_from(len).map_err(|_| {
        Error::InvalidArgument(format!("file of {len} bytes does not fit in memory"))
    })?;
    Ok((len, size))
}

/// Drops the file's pages from the page cache ([`gpumap::pagecache::evict`]).
pub(crate) fn evict(path: &Path) -> Result<()> {
    gpumap::pagecache::evict(path, gpumap::pagecache::ByteRange::ALL).map(|_| ())
}

/// Reads the whole file once through the page cache.
pub(crate) fn warm_page_cache(path: &Path) -> Result<()> {
    gpumap::pagecache::warm(
        path,
        gpumap::pagecache::ByteRange::ALL,
        gpumap::pagecache::WarmMode::Read,
    )
}

/// An [`Error::Io`] for `op` on `path`.
pub(crate) fn io_error(op: &'static str, path: Option<&Path>, source: std::io::Error) -> Error {
    Error::Io { op, path: path.map(Path::to_path_buf), offset: None, source }
}
