//! The host-memory workloads (`gpumap-filehandle-host` and its baselines `memcpy`, `dd`, `cat`).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use gpumap::config::DirectRead;
use gpumap::error::Result;
use gpumap::io::{FileHandle, IoPool};
use gpumap::memory::HostBuffer;

use crate::files::{evict, file_size};
use crate::options::BenchOptions;
use crate::record::Record;
use crate::timing::{best_of, time_shell, wait_all};
use crate::workloads::{random_workloads, write_workloads, RandomWorkload};

const IMPL_HOST: &str = "gpumap-filehandle-host";

/// Runs the host-memory workloads and hands each record to `emit` as it is measured.
pub fn run_host(options: &BenchOptions, emit: &mut dyn FnMut(&Record)) -> Result<()> {
    let (file_len, size) = file_size(&options.file)?;
    let mut buf = HostBuffer::new(size)?;
    for &threads in &options.threads {
        let handle = open(&options.file, "r", threads, false)?;
        // Cold: evicted from the page cache (fdatasync + POSIX_FADV_DONTNEED), then read once
        // by the default handle (buffered) and once with the `uncached` O_DIRECT policy.
        let mut uncached = FileHandle::options()?;
        uncached.pool(handle.pool().clone()).direct_read(DirectRead::Uncached);
        let uncached = uncached.open(&options.file, "r")?;
        for (name, cold) in [(IMPL_HOST, &handle), ("gpumap-uncached-host", &uncached)] {
            evict(&options.file)?;
            let t = Instant::now();
            cold.read_exact(&mut buf, 0)?;
            let secs = t.elapsed().as_secs_f64();
            emit(&Record::new(name, "seq_read_cold", threads, file_len, secs));
        }
        handle.read_exact(&mut buf, 0)?; // warm it
        let best = best_of(options.repeats, || {
            let t = Instant::now();
            handle.read_exact(&mut buf, 0)?;
            Ok(t.elapsed().as_secs_f64())
        })?;
        emit(&Record::new(IMPL_HOST, "seq_read_warm", threads, file_len, best));
        if options.baselines {
            let mut dst = HostBuffer::new(size)?;
            let best = best_of(options.repeats, || Ok(parallel_memcpy(&mut dst, &buf, threads)))?;
            emit(&Record::new("memcpy", "seq_read_warm", threads, file_len, best));
        }
    }
    for RandomWorkload { name: workload, block, offsets, threads } in
        random_workloads(options, file_len)
    {
        let ops = offsets.len();
        let handle = open(&options.file, "r", threads, false)?;
        for temperature in ["cold", "warm"] {
            if temperature == "cold" {
                evict(&options.file)?;
            }
            let t = Instant::now();
            let futures: Vec<_> =
                offsets.iter().map(|&o| handle.pread(vec![0u8; block as usize], o)).collect();
            let secs = wait_all(t, futures)?;
            let name = format!("{workload}_{temperature}");
            emit(
                &Record::new(IMPL_HOST, &name, threads, block * ops as u64, secs)
                    .with_ops(ops as u64),
            );
        }
    }
    let mut src = HostBuffer::new(options.write_bytes as usize)?;
    src.par_chunks_mut(1 << 20).for_each(|c| c.fill(0x5a));
    write_workloads(
        options,
        IMPL_HOST,
        options.write_bytes,
        |path, flags, threads| open(path, flags, threads, true),
        |handle| handle.write(&src, 0),
        emit,
    )?;
    if options.baselines {
        for (name, cmd) in [
            ("dd", format!("dd if='{}' of=/dev/null bs=4M status=none", options.file.display())),
            ("cat", format!("cat '{}' > /dev/null", options.file.display())),
        ] {
            let best = best_of(options.repeats, || time_shell(&cmd))?;
            emit(&Record::new(name, "seq_read_warm", 1, file_len, best));
        }
    }
    Ok(())
}

/// A handle for the host workloads: its own pool of `threads`, so that each thread count is
/// measured on a pool of that size.
fn open(path: &Path, flags: &str, threads: usize, direct: bool) -> Result<FileHandle> {
    let mut options = FileHandle::options()?;
    options.pool(Arc::new(IoPool::new(threads)?)).direct_io(direct, direct);
    options.open(path, flags)
}

/// Copies `src` into `dst` on `threads` rayon tasks: the host's memory bandwidth, the ceiling of
/// a warm read into host memory.
fn parallel_memcpy(dst: &mut [u8], src: &[u8], threads: usize) -> f64 {
    let chunk = src.len().div_ceil(threads.max(1)).max(1);
    let t = Instant::now();
    rayon::scope(|s| {
        for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
            s.spawn(move |_| d.copy_from_slice(c));
        }
    });
    t.elapsed().as_secs_f64()
}
