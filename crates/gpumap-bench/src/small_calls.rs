//! The cost of one small read into GPU memory, and of its parts: a 4 KiB `pread` into pinned
//! memory, a 4 KiB host-to-device copy waited for, the two one after the other with no
//! library around them, and then `FileHandle::read_device` and `pread_device(..).wait()`. Each
//! call is waited for before the next starts, so the figures are latencies (µs a call =
//! 10^6 / `iops`). The rounds are interleaved, so a machine that slows down mid-run slows every
//! row alike.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Instant;

use gpumap::error::{Error, Result};
use gpumap::io::{FileHandle, IoPool};
use gpumap::memory::cuda::{CudaBuffer, CudaDevice, PinnedBuffer, Stream};

use crate::files::{file_size, io_error, warm_page_cache};
use crate::options::BenchOptions;
use crate::record::Record;
use crate::workloads::random_offsets;

const BLOCK: usize = 4096;
const ROUNDS: usize = 3;

/// Runs the small-call latencies on `device` over `options.file` (made warm first): `ROUNDS`
/// interleaved rounds of `options.random_ops` calls (at most 20,000) per row, workload
/// `call_4k_warm`, one record per row and round.
pub fn run_small_calls(
    options: &BenchOptions,
    device: &CudaDevice,
    emit: &mut dyn FnMut(&Record),
) -> Result<()> {
    let (file_len, _) = file_size(&options.file)?;
    if file_len < BLOCK as u64 {
        return Err(Error::InvalidArgument(format!(
            "{} holds {file_len} bytes; the small calls read {BLOCK}",
            options.file.display()
        )));
    }
    warm_page_cache(&options.file)?;
    let ops = options.random_ops.clamp(1, 20_000);
    let offsets = random_offsets(file_len, BLOCK as u64, ops);
    let file = File::open(&options.file).map_err(|e| io_error("open", Some(&options.file), e))?;
    let mut handle_options = FileHandle::options()?;
    handle_options.pool(Arc::new(IoPool::new(16)?));
    let handle = handle_options.open(&options.file, "r")?;
    let mut calls = Calls {
        file,
        handle,
        stream: Stream::new(device)?,
        pinned: Some(PinnedBuffer::new(device, BLOCK)?),
        target: Some(CudaBuffer::alloc(device, BLOCK)?),
    };
    // Warm-up: streams, bounce buffers and the pool's threads exist before the first round.
    for row in 0..ROWS.len() {
        for &offset in offsets.iter().take(200) {
            calls.one(row, offset)?;
        }
    }
    for _ in 0..ROUNDS {
        for (row, name) in ROWS.iter().enumerate() {
            let t = Instant::now();
            for &offset in &offsets {
                calls.one(row, offset)?;
            }
            let secs = t.elapsed().as_secs_f64();
            emit(
                &Record::new(name, "call_4k_warm", 1, (BLOCK * ops) as u64, secs)
                    .with_ops(ops as u64),
            );
        }
    }
    Ok(())
}

/// What the rows call, with the buffers they pass from call to call.
struct Calls {
    file: File,
    handle: FileHandle,
    stream: Stream,
    pinned: Option<PinnedBuffer>,
    target: Option<CudaBuffer>,
}

/// The rows, in the order of [`Calls::one`].
const ROWS: [&str; 5] = [
    "host-pread-pinned",
    "cuda-upload-pinned",
    "host-pread+upload",
    "gpumap-read_device",
    "gpumap-pread_device-wait",
];

impl Calls {
    /// One call of row `row` (an index into [`ROWS`]) at `offset`.
    fn one(&mut self, row: usize, offset: u64) -> Result<()> {
        match row {
            0 => self.pread(offset),
            1 | 2 => {
                if row == 2 {
                    self.pread(offset)?;
                }
                let buf = self.pinned.take().ok_or_else(lost)?;
                let dst = self.target.as_mut().ok_or_else(lost)?;
                self.pinned = Some(self.stream.upload(buf, 0, BLOCK, dst.view_mut(), 0)?.wait()?);
                Ok(())
            }
            3 => {
                let dst = self.target.as_mut().ok_or_else(lost)?;
                self.handle.read_device(dst.view_mut(), offset).map(drop)
            }
            _ => {
                let dst = self.target.take().ok_or_else(lost)?;
                self.target = Some(self.handle.pread_device(dst, offset).wait()?.0);
                Ok(())
            }
        }
    }

    fn pread(&mut self, offset: u64) -> Result<()> {
        let buf = self.pinned.as_mut().ok_or_else(lost)?;
        self.file.read_exact_at(buf.as_mut_slice(), offset).map_err(|e| io_error("pread", None, e))
    }
}

fn lost() -> Error {
    Error::InvalidArgument("a buffer of the small-call bench was lost".into())
}
