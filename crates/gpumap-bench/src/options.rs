//! What a run measures ([`BenchOptions`]) and the arguments every bench target takes.

use std::path::PathBuf;

use gpumap::error::{Error, Result};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The file to read (it is not modified); writes go to a sibling file that is removed.
    pub file: PathBuf,
    /// Thread counts for the sequential reads.
    pub threads: Vec<usize>,
    /// Thread counts for the writes.
    pub write_threads: Vec<usize>,
    /// Bytes written by the write workloads.
    pub write_bytes: u64,
    /// Random reads per random workload.
    pub random_ops: usize,
    /// Repetitions of each warm measurement (the best is kept).
    pub repeats: usize,
    /// Also time `memcpy`, `dd` and `cat` on the same bytes.
    pub baselines: bool,
}

impl BenchOptions {
    /// The standard set: reads at 1/4/8/16 threads, writes of 1 GiB at 1 and 16 threads,
    /// 32768 random 4 KiB and 8192 random 64 KiB reads.
    pub fn standard(file: impl Into<PathBuf>) -> BenchOptions {
        BenchOptions {
            file: file.into(),
            threads: vec![1, 4, 8, 16],
            write_threads: vec![1, 16],
            write_bytes: 1 << 30,
            random_ops: 32768,
            repeats: 3,
            baselines: true,
        }
    }

    /// A shorter set for a quick look: 1 and 4 threads, 256 MiB writes, 4096 random reads.
    pub fn quick(file: impl Into<PathBuf>) -> BenchOptions {
        BenchOptions {
            threads: vec![1, 4],
            write_threads: vec![1, 4],
            write_bytes: 256 << 20,
            random_ops: 4096,
            repeats: 2,
            ..BenchOptions::standard(file)
        }
    }
}

/// Parses `--jsonl OUT FILE [--quick]`, the arguments every bench target takes.
pub fn parse_bench_args(args: &[String]) -> Result<(PathBuf, PathBuf, bool)> {
    let mut jsonl = None;
    let mut file = None;
    let mut quick = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--jsonl" => jsonl = it.next().map(PathBuf::from),
            "--quick" => quick = true,
            "--bench" => {} // passed by `cargo bench`
            other if !other.starts_with('-') => file = Some(PathBuf::from(other)),
            other => return Err(Error::InvalidArgument(format!("unknown option {other}"))),
        }
    }
    match (jsonl, file) {
        (Some(j), Some(f)) => Ok((j, f, quick)),
        _ => Err(Error::InvalidArgument("usage: BENCH --jsonl OUT.jsonl FILE [--quick]".into())),
    }
}
