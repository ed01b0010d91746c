//! `read_files`: pieces of many files into one buffer in one pipeline, over
//! [`gpumap::io::pread_files`] (what `gpumapio.load_checkpoint` reads a checkpoint's shards
//! with).

use gpumap::io::{FilePiece, IoFuture};
use gpumap::sync::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::buffers::{memory, OwnedDst};
use crate::errors::wait_interruptibly;
use crate::file::CuFile;

/// A read of many files in flight: the buffer it fills, and each piece's count.
type PendingRead = IoFuture<(OwnedDst, Vec<usize>)>;

/// A piece as Python passes it: `(file index, file offset, size, buffer offset, count, stride)`.
type PyPiece = (usize, u64, usize, usize, usize, u64);

/// Starts reading `pieces` of `files` into `buf` on the first file's pool.
fn start(
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    files: Vec<Bound<'_, CuFile>>,
    pieces: Vec<PyPiece>,
) -> PyResult<PendingRead> {
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
    Ok(gpumap::io::pread_files(handles, dst, pieces))
}

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
    pieces: Vec<PyPiece>,
) -> PyResult<Vec<usize>> {
    let (dst, counts) = wait_interruptibly(py, start(py, buf, files, pieces)?)?;
    drop(dst);
    Ok(counts)
}

/// [`read_files`] started and left running, so that the caller can do other work meanwhile
/// (`load_checkpoint` builds its tensors' views); `wait()` gives the counts.
#[pyfunction]
pub fn start_read_files(
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    files: Vec<Bound<'_, CuFile>>,
    pieces: Vec<PyPiece>,
) -> PyResult<FilesRead> {
    Ok(FilesRead { future: Mutex::new(Some(start(py, buf, files, pieces)?)) })
}

/// A [`read_files`] in flight. The buffer and the files stay referenced until it ends, whether
/// or not anyone waits; close the files only after `wait()`.
#[pyclass(module = "gpumapio", name = "FilesRead", frozen)]
pub struct FilesRead {
    future: Mutex<Option<PendingRead>>,
}

#[pymethods]
impl FilesRead {
    /// Waits for the read (the GIL released, Ctrl-C cancelling it) and returns each piece's
    /// count, as `read_files` does. Only once: a second call raises `RuntimeError`.
    fn wait(&self, py: Python<'_>) -> PyResult<Vec<usize>> {
        let Some(future) = self.future.lock().take() else {
            return Err(PyRuntimeError::new_err("this read was already waited for"));
        };
        let (dst, counts) = wait_interruptibly(py, future)?;
        drop(dst);
        Ok(counts)
    }

    /// Asks the read to stop early: tasks not started are skipped, and `wait()` then raises
    /// the cancellation once those running are done.
    fn cancel(&self) {
        if let Some(future) = &*self.future.lock() {
            future.cancel();
        }
    }
}
