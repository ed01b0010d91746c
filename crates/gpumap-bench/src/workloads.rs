//! The workloads shared by host and device memory: which random reads (fixed offsets, so runs
//! compare) and the write workloads.

use std::path::Path;
use std::time::Instant;

use gpumap::error::Result;
use gpumap::io::{FileHandle, ScratchFile};

use crate::options::BenchOptions;
use crate::record::Record;

/// One random-read workload: `offsets.len()` reads of `block` bytes, on `threads` threads.
#[derive(Clone)]
pub(crate) struct RandomWorkload {
    pub(crate) name: &'static str,
    pub(crate) block: u64,
    pub(crate) offsets: Vec<u64>,
    pub(crate) threads: usize,
}

/// `rand_read_4k` (`random_ops` reads) and `rand_read_64k` (a quarter as many) at the largest
/// thread count, for a file large enough to hold one block.
pub(crate) fn random_workloads(options: &BenchOptions, file_len: u64) -> Vec<RandomWorkload> {
    let threads = options.threads.iter().copied().max().unwrap_or(1);
    [
        ("rand_read_4k", 4096u64, options.random_ops),
        ("rand_read_64k", 65536, options.random_ops / 4),
    ]
    .into_iter()
    .filter(|&(_, block, _)| file_len >= block)
    .map(|(name, block, ops)| RandomWorkload {
        name,
        block,
        offsets: random_offsets(file_len, block, ops),
        threads,
    })
    .collect()
}

/// `seq_write` and `seq_write_durable` at each write thread count: `write` on a handle of a
/// scratch file beside the input (a new file, never the input or any other that exists,
/// removed on every way out: see [`ScratchFile`]), then (durable) `fdatasync`.
pub(crate) fn write_workloads(
    options: &BenchOptions,
    implementation: &str,
    bytes: u64,
    open: impl Fn(&Path, usize) -> Result<FileHandle>,
    write: impl Fn(&FileHandle) -> Result<usize>,
    emit: &mut dyn FnMut(&Record),
) -> Result<()> {
    let scratch = ScratchFile::beside(&options.file)?;
    let out = scratch.path();
    for &threads in &options.write_threads {
        for durable in [false, true] {
            // "w" truncates: each workload writes into an empty file.
            let handle = open(out, threads)?;
            let t = Instant::now();
            write(&handle)?;
            if durable {
                handle.sync_data()?;
            }
            let secs = t.elapsed().as_secs_f64();
            let workload = if durable { "seq_write_durable" } else { "seq_write" };
            emit(&Record::new(implementation, workload, threads, bytes, secs));
        }
    }
    Ok(())
}

/// `count` distinct-ish random block-aligned offsets within the file (fixed seed: runs compare).
pub fn random_offsets(file_len: u64, block: u64, count: usize) -> Vec<u64> {
    let blocks = (file_len / block).max(1);
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..count)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % blocks) * block
        })
        .collect()
}
