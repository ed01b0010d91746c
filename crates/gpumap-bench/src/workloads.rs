//! The workloads shared by host and device memory: which random reads (fixed offsets, so runs
//! compare) and the write workloads.

use std::path::Path;
use std::time::Instant;

use gpumap::error::Result;
use gpumap::io::{FileHandle, ScratchFile};

use crate::files::io_error;
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
/// removed on every way out: see [`ScratchFile`]), then (durable) `fdatasync`. `open(path,
/// flags, threads)` opens the scratch file as `flags` say. Each workload empties the file and
/// opens it without `O_CREAT`: a Ctrl-C's cleanup that has just removed it would otherwise see
/// the next workload make it again, to outlive the process.
pub(crate) fn write_workloads(
    options: &BenchOptions,
    implementation: &str,
    bytes: u64,
    open: impl Fn(&Path, &str, usize) -> Result<FileHandle>,
    write: impl Fn(&FileHandle) -> Result<usize>,
    emit: &mut dyn FnMut(&Record),
) -> Result<()> {
    let scratch = ScratchFile::beside(&options.file)?;
    let out = scratch.path();
    for &threads in &options.write_threads {
        for durable in [false, true] {
            // Each workload writes into an empty file, cut without O_CREAT.
            std::fs::OpenOptions::new()
                .write(true)
                .open(out)
                .and_then(|f| f.set_len(0))
                .map_err(|e| io_error("empty the scratch file", Some(out), e))?;
            let handle = open(out, "r+", threads)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Ctrl-C's cleanup removes the scratch file while a workload runs, and the signal ends the
    /// process just after: the next workload must not make the file again meanwhile, or it
    /// would stay behind.
    #[test]
    fn a_scratch_file_removed_meanwhile_is_never_made_again() {
        let dir =
            std::env::temp_dir().join(format!("gpumap-bench-workloads-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("data");
        std::fs::write(&input, b"input").unwrap();
        let mut options = BenchOptions::quick(&input);
        options.write_threads = vec![1];
        let writes = std::cell::Cell::new(0);
        let result = write_workloads(
            &options,
            "test",
            4,
            |path, flags, _| FileHandle::open(path, flags),
            |handle| {
                writes.set(writes.get() + 1);
                let n = handle.write(b"abcd", 0)?;
                // What the signal thread's cleanup does.
                gpumap::io::scratch::remove_live();
                Ok(n)
            },
            &mut |_| {},
        );
        let mut left: Vec<_> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        left.sort();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(result.is_err(), "the next workload finds its file gone");
        assert_eq!(writes.get(), 1);
        assert_eq!(left, ["data"]);
    }
}
