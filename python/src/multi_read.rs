//! `read_files`: pieces of many files into one buffer in one pipeline, over
//! [`gpumap::io::pread_files`] (what `gpumapio.load_checkpoint` reads a checkpoint's shards
//! with).

use gpumap::io::FilePiece;
use pyo3::prelude::*;

use crate::buffers::memory;
use crate::errors::wait_interruptibly;
use crate::file::CuFile;

/// Reads `pieces` — `(file index, file offset, size, buffer offset, count, stride)` each:
/// `count` runs of `size` bytes, the `k`-th at `file offset + k * stride`, back to back in the
/// buffer — of `files` into `buf`, every file's reads in flight together; returns each piece's
/// count (short only where its file ends first). The GIL is released while it runs, and
/// Ctrl-C stops it between tasks.
#[pyfunction]
pub fn read_files(
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    files: Vec<Bound<'_, CuFile>>,
    pieces: Vec<(usize, u64, usize, usize, usize, u64)>,
) -> PyResult<Vec<usize>> {
    let handles = files.iter().map(|f| f.get().handle()).collect::<PyResult<Vec<_>>>()?;
    let mem = memory(buf, true)?;
    let len = mem.len();
    let dst = mem.into_dst(py, 0, len)?;
    let pieces = pieces
        .into_iter()
        .map(|(file, offset, len, dst_offset, count, stride)| FilePiece {
            file,
            offset,
            dst_offset,
            len,
            count,
            stride,
        })
        .collect();
    let (dst, counts) = wait_interruptibly(py, gpumap::io::pread_files(handles, dst, pieces))?;
    drop(dst);
    Ok(counts)
}
