//! Row gathers' arguments from Python (`MappedFile.gather_rows`): the indices (int32 or int64,
//! on the host or a GPU), the destination, and a stream of another CUDA stack.

use gpumap::mapped::{IndexWidth, RowIndices};
use gpumap::memory::cuda::CudaDevice;
use gpumap::memory::{DeviceView, DeviceViewMut, StreamRef};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;

use crate::buffers::{memory, OwnedDst, OwnedSrc};
use crate::errors::{check, nogil_interruptibly};

/// A row gather's memory, checked and kept alive while the gather runs without the GIL.
pub struct Rows {
    indices: OwnedSrc,
    width: IndexWidth,
    dst: OwnedDst,
    /// The work, for [`nogil_interruptibly`]: the bytes gathered and 4 KiB a row (a row that
    /// misses is read as a page at least).
    size: u64,
}

impl Rows {
    /// The indices and the destination of a gather of rows of `row_size` bytes: the indices
    /// must be signed 32- or 64-bit integers (a `TypeError` otherwise), `out` must hold every
    /// row (a `ValueError` otherwise).
    pub fn new(
        py: Python<'_>,
        indices: &Bound<'_, PyAny>,
        row_size: u64,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<Rows> {
        let found = memory(indices, false)?;
        let width = match found.signed_int() {
            Some(4) => IndexWidth::I32,
            Some(8) => IndexWidth::I64,
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "row indices must be int32 or int64 (in the machine's byte order); {} \
                     holds other items",
                    indices.get_type().name()?
                )))
            }
        };
        if row_size == 0 {
            return Err(PyValueError::new_err("row_size must be at least 1"));
        }
        let count = found.len() / width.bytes() as usize;
        let total =
            (count as u64).checked_mul(row_size).and_then(|n| usize::try_from(n).ok()).ok_or_else(
                || PyValueError::new_err(format!("{count} rows of {row_size} bytes overflow")),
            )?;
        let len = found.len();
        let indices = found.into_src(py, 0, len)?;
        let dst = memory(out, true)?.into_dst(py, 0, total)?;
        let size = (total as u64).saturating_add((count as u64).saturating_mul(4096));
        Ok(Rows { indices, width, dst, size })
    }

    /// Runs `gather` on the indices and the destination with the GIL released; Ctrl-C stops
    /// a large one (see [`nogil_interruptibly`]).
    pub fn run<F>(self, py: Python<'_>, gather: F) -> PyResult<()>
    where
        F: FnOnce(RowIndices<'_>, DeviceViewMut<'_>) -> gpumap::Result<()> + Send,
    {
        let Rows { indices, width, mut dst, size } = self;
        nogil_interruptibly(py, size, move || {
            let mut copied = Vec::new();
            let indices = match indices.view() {
                DeviceView::Cuda(view) => RowIndices::on_device(view, width)?,
                DeviceView::Host(bytes) => host_indices(bytes, width, &mut copied),
            };
            gather(indices, dst.view())
        })
    }
}

/// Indices in host memory: the bytes themselves where they are aligned for their width, else
/// a copy (into `copied`), which a `bytes` slice or a NumPy view at an odd offset may need.
fn host_indices<'a>(
    bytes: &'a [u8],
    width: IndexWidth,
    copied: &'a mut Vec<i64>,
) -> RowIndices<'a> {
    match width {
        IndexWidth::I32 => {
            // SAFETY: every bit pattern is an i32; `align_to` puts in `middle` only what is
            // aligned for one.
            let (head, middle, tail) = unsafe { bytes.align_to::<i32>() };
            if head.is_empty() && tail.is_empty() {
                return RowIndices::from(middle);
            }
            copied.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| i64::from(i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))),
            );
        }
        IndexWidth::I64 => {
            // SAFETY: as above, for i64.
            let (head, middle, tail) = unsafe { bytes.align_to::<i64>() };
            if head.is_empty() && tail.is_empty() {
                return RowIndices::from(middle);
            }
            copied.extend(bytes.chunks_exact(8).map(|c| {
                let mut word = [0u8; 8];
                word.copy_from_slice(c);
                i64::from_ne_bytes(word)
            }));
        }
    }
    RowIndices::from(copied.as_slice())
}

/// The stream a gather's kernel runs on: a torch stream (`cuda_stream`), a CuPy stream
/// (`ptr`), or a raw `CUstream` as an int, on `device`.
pub fn stream_arg(
    py: Python<'_>,
    stream: &Bound<'_, PyAny>,
    device: &CudaDevice,
) -> PyResult<StreamRef<'static>> {
    let raw: u64 = if let Ok(raw) = stream.extract::<u64>() {
        raw
    } else if let Ok(raw) = stream.getattr(intern!(py, "cuda_stream")) {
        raw.extract()?
    } else if let Ok(raw) = stream.getattr(intern!(py, "ptr")) {
        raw.extract()?
    } else {
        return Err(PyTypeError::new_err(format!(
            "stream: expected a torch.cuda.Stream, a cupy.cuda.Stream or a CUstream handle, got {}",
            stream.get_type().name()?
        )));
    };
    // SAFETY: the caller handed over a live stream (a torch or CuPy stream object it holds, or
    // a handle it vouches for, as KvikIO's stream arguments take); gather_rows waits for its
    // own work before returning, so the stream need not outlive the call.
    check(py, unsafe { StreamRef::from_raw(device, raw) })
}
