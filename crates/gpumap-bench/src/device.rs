//! The device-memory workloads through `FileHandle` (`gpumap-filehandle`, `gpumap-uncached`,
//! `gpumap-batch`, `gpumap-cufile`) beside a pinned host-to-device copy and the disk's own
//! O_DIRECT rate; then the page cache's ([`crate::cache`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use gpumap::config::{CompatMode, DirectRead};
use gpumap::error::{Error, Result};
use gpumap::io::{DeviceRead, FileHandle, IoPool};
use gpumap::memory::cuda::{CudaBuffer, CudaDevice, PinnedBuffer, Stream};
use gpumap::memory::DeviceViewMut;

use crate::cache::run_cache;
use crate::files::{evict, file_size};
use crate::options::BenchOptions;
use crate::record::Record;
use crate::timing::{best_of, time_shell};
use crate::workloads::{random_workloads, write_workloads, RandomWorkload};

/// Runs the device-memory workloads on `device`: gpumap's default path (`impl`
/// `gpumap-filehandle`, compat mode auto) and, where cuFile registers the file, the cuFile path
/// forced (`gpumap-cufile`, compat mode off). Also times a pinned host-to-device copy of 256 MiB
/// (`cuda-h2d-pinned`, workload `pinned_h2d_copy_256m`), the ceiling of any path that crosses
/// PCIe from host memory.
pub fn run_device(
    options: &BenchOptions,
    device: &CudaDevice,
    emit: &mut dyn FnMut(&Record),
) -> Result<()> {
    let (file_len, size) = file_size(&options.file)?;
    if options.baselines {
        let copy_len = size.clamp(1, 256 << 20);
        let pinned = PinnedBuffer::new(device, copy_len)?;
        let mut target = CudaBuffer::alloc(device, copy_len)?;
        let stream = Stream::new(device)?;
        let mut pinned = Some(pinned);
        let best = best_of(options.repeats.max(3), || {
            let buf =
                pinned.take().ok_or_else(|| Error::InvalidArgument("pinned buffer lost".into()))?;
            let t = Instant::now();
            let back = stream.upload(buf, 0, copy_len, target.view_mut(), 0)?.wait()?;
            let secs = t.elapsed().as_secs_f64();
            pinned = Some(back);
            Ok(secs)
        })?;
        // Its own workload row: a ceiling to read figures against, not a peer to beat.
        emit(&Record::new("cuda-h2d-pinned", "pinned_h2d_copy_256m", 1, copy_len as u64, best));
    }
    if options.baselines {
        // The disk's own rate: O_DIRECT, 16 MiB requests, one at a time (the page cache plays
        // no part, so this is a cold read whatever the cache holds).
        let cmd = format!(
            "dd if='{}' of=/dev/null bs=16M iflag=direct status=none",
            options.file.display()
        );
        let secs = time_shell(&cmd)?;
        emit(&Record::new("dd-odirect", "seq_read_cold", 1, file_len, secs));
    }
    let mut dst = CudaBuffer::alloc(device, size)?;
    let random = random_workloads(options, file_len);
    let mut paths = vec![("gpumap-filehandle", CompatMode::Auto)];
    let probe = device_open(&options.file, "r", 1, false, CompatMode::Off);
    match probe {
        Ok(_) => paths.push(("gpumap-cufile", CompatMode::Off)),
        Err(e) => tracing::info!("cuFile path not measured: {}", gpumap::error::Report(&e)),
    }
    for (name, mode) in paths {
        for (i, &threads) in options.threads.iter().enumerate() {
            let warm = device_open(&options.file, "r", threads, false, mode)?;
            if i == 0 {
                tracing::info!("{name}: {}", warm.compat_decision().reason);
            }
            // Allocates bounce buffers and warms streams. Cold: the default handle (buffered),
            // and on the POSIX path also the `uncached` O_DIRECT policy a one-time load would
            // choose.
            warm.read_device_exact(dst.view_mut(), 0)?;
            let mut cold_handles = vec![(name, warm.clone())];
            if mode == CompatMode::Auto {
                let mut o = FileHandle::options()?;
                o.pool(warm.pool().clone()).direct_read(DirectRead::Uncached).compat_mode(mode);
                cold_handles.push(("gpumap-uncached", o.open(&options.file, "r")?));
            }
            for (cold_name, cold) in cold_handles {
                evict(&options.file)?;
                let t = Instant::now();
                cold.read_device_exact(dst.view_mut(), 0)?;
                let secs = t.elapsed().as_secs_f64();
                emit(&Record::new(cold_name, "seq_read_cold", threads, file_len, secs));
            }
            warm.read_device_exact(dst.view_mut(), 0)?;
            let best = best_of(options.repeats, || {
                let t = Instant::now();
                warm.read_device_exact(dst.view_mut(), 0)?;
                Ok(t.elapsed().as_secs_f64())
            })?;
            emit(&Record::new(name, "seq_read_warm", threads, file_len, best));
        }
        for RandomWorkload { name: workload, block, offsets, threads } in random.iter().cloned() {
            let ops = offsets.len();
            let handle = device_open(&options.file, "r", threads, false, mode)?;
            // One destination per read, owned by its future while it runs and handed back for
            // the next round: views of a buffer leaked for the process's life (a bench process;
            // `'static` is what lets a view travel with a future).
            let whole: &'static mut CudaBuffer =
                Box::leak(Box::new(CudaBuffer::alloc(device, ops * block as usize)?));
            let mut slots: Vec<DeviceViewMut<'static>> =
                DeviceViewMut::Cuda(whole.view_mut()).chunks_mut(block as usize)?;
            for temperature in ["cold", "warm"] {
                if temperature == "cold" {
                    evict(&options.file)?;
                }
                let t = Instant::now();
                let futures: Vec<_> = slots
                    .drain(..)
                    .zip(&offsets)
                    .map(|(v, &o)| handle.pread_device(v, o))
                    .collect();
                let mut secs = 0.0;
                for f in futures {
                    let (view, _) = f.wait()?;
                    slots.push(view);
                    secs = t.elapsed().as_secs_f64();
                }
                let name_t = format!("{workload}_{temperature}");
                emit(
                    &Record::new(name, &name_t, threads, block * ops as u64, secs)
                        .with_ops(ops as u64),
                );
                if block == 4096 && temperature == "warm" {
                    // One read at a time, each waited for: the cost of one call, which the
                    // Python bench (`pread_4k_sync_warm`, impl gpumap-py) measures through
                    // `CuFile.pread(...).get()` for comparison.
                    let reps = ops.min(20_000);
                    let mut view = slots.pop().ok_or_else(|| {
                        Error::InvalidArgument("no destination for the sync reads".into())
                    })?;
                    let t = Instant::now();
                    for &o in offsets.iter().take(reps) {
                        view = handle.pread_device(view, o).wait()?.0;
                    }
                    let secs = t.elapsed().as_secs_f64();
                    slots.push(view);
                    emit(
                        &Record::new(name, "pread_4k_sync_warm", 1, 4096 * reps as u64, secs)
                            .with_ops(reps as u64),
                    );
                }
                if mode != CompatMode::Auto {
                    continue;
                }
                // The same reads as one batch (FileHandle::read_device_batch).
                let mut reads: Vec<DeviceRead<'_>> = slots
                    .iter_mut()
                    .zip(&offsets)
                    .map(|(v, &offset)| DeviceRead { dst: v.reborrow(), offset })
                    .collect();
                if temperature == "cold" {
                    evict(&options.file)?;
                }
                let t = Instant::now();
                handle.read_device_batch(&mut reads)?;
                let secs = t.elapsed().as_secs_f64();
                emit(
                    &Record::new("gpumap-batch", &name_t, threads, block * ops as u64, secs)
                        .with_ops(ops as u64),
                );
            }
        }
        let src = CudaBuffer::zeroed(device, (options.write_bytes as usize).min(size.max(1)))?;
        write_workloads(
            options,
            name,
            src.len() as u64,
            |path, flags, threads| device_open(path, flags, threads, true, mode),
            |handle| handle.write_device(src.view(), 0),
            emit,
        )?;
    }
    drop(dst);
    run_cache(options, device, file_len, emit)?;
    Ok(())
}

/// A handle for the device workloads: its own pool of `threads`, the requested compat mode
/// (`Off` forces cuFile, so that the cuFile path is measured on its own).
fn device_open(
    path: &Path,
    flags: &str,
    threads: usize,
    direct: bool,
    mode: CompatMode,
) -> Result<FileHandle> {
    let mut options = FileHandle::options()?;
    options.pool(Arc::new(IoPool::new(threads)?)).direct_io(direct, true).compat_mode(mode);
    options.open(path, flags)
}
