//! The standard gpumap workloads, shared by `gpumap bench` and the bench targets (an internal
//! crate of the workspace, not published: library users have no need of it).
//!
//! Each measurement is a [`Record`] in the JSON-lines format of the GPU test flow
//! (see docs/gpu.md): `{"impl", "workload", "threads", "bytes", "seconds", "gbps"}` plus
//! `"ops"`/`"iops"` for random reads. Baselines measured in the same run on the same file
//! (`memcpy`, `dd`, `cat`) let figures from one run be compared; figures from different runs are
//! not comparable.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use gpumap::config::{CompatMode, DirectRead};
use gpumap::error::{Error, Result};
use gpumap::io::{DeviceRead, FileHandle, IoPool, ScratchFile};
use gpumap::mapped::{
    CacheOptions, DeviceCache, DeviceMappedFile, MapOptions, ZeroCopy, ZeroCopyOptions,
};
use gpumap::memory::cuda::{CudaBuffer, CudaDevice, PinnedBuffer, Stream};
use gpumap::memory::{Device, DeviceViewMut, HostBuffer};

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// Implementation (`gpumap-filehandle`, `memcpy`, `dd`, ...); ours start with `gpumap`.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// Workload name (`seq_read_warm`, `rand_read_4k_cold`, ...).
    pub workload: String,
    /// Threads used.
    pub threads: usize,
    /// Bytes moved.
    pub bytes: u64,
    /// Seconds taken.
    pub seconds: f64,
    /// Rate in GB/s (10^9 bytes per second).
    pub gbps: f64,
    /// Operations, for random reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops: Option<u64>,
    /// Operations per second, for random reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iops: Option<f64>,
}

impl Record {
    fn new(
        implementation: &str,
        workload: &str,
        threads: usize,
        bytes: u64,
        seconds: f64,
    ) -> Record {
        let seconds = seconds.max(1e-9);
        Record {
            implementation: implementation.into(),
            workload: workload.into(),
            threads,
            bytes,
            seconds: (seconds * 1e6).round() / 1e6,
            gbps: ((bytes as f64 / seconds / 1e9) * 1000.0).round() / 1000.0,
            ops: None,
            iops: None,
        }
    }

    fn with_ops(mut self, ops: u64) -> Record {
        self.ops = Some(ops);
        self.iops = Some((ops as f64 / self.seconds * 10.0).round() / 10.0);
        self
    }
}

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

/// The `main` of a bench target (`harness = false`): parses `--jsonl OUT FILE [--quick]`, runs
/// `run` with the standard (or quick) options and appends every record to `OUT`.
pub fn target_main(
    run: impl FnOnce(&BenchOptions, &mut dyn FnMut(&Record)) -> Result<()>,
) -> std::process::ExitCode {
    use std::io::Write;
    use std::process::ExitCode;
    // Diagnostics — the decisions behind the measurements (which path, why), and failures — go
    // through tracing, on stderr; the records go to standard output and to OUT.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .without_time()
        .try_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (jsonl, file, quick) = match parse_bench_args(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let options = if quick { BenchOptions::quick(file) } else { BenchOptions::standard(file) };
    let mut failed = false;
    let mut stdout_open = true;
    let result = run(&options, &mut |record| {
        match serde_json::to_string(record) {
            // A reader that went away (`| head`) ends the echo, not the run: OUT has it all.
            Ok(line) if stdout_open => {
                if let Err(e) = writeln!(std::io::stdout().lock(), "{line}") {
                    tracing::warn!("standard output: {e}; the records still go to the JSONL file");
                    stdout_open = false;
                }
            }
            Ok(_) => {}
            Err(e) => tracing::error!("cannot encode a result: {e}"),
        }
        if let Err(e) = append_jsonl(&jsonl, record) {
            tracing::error!("cannot record a result: {}", gpumap::error::Report(&e));
            failed = true;
        }
    });
    match result {
        Ok(()) if !failed => ExitCode::SUCCESS,
        Ok(()) => ExitCode::FAILURE,
        Err(e) => {
            tracing::error!("bench failed: {}", gpumap::error::Report(&e));
            ExitCode::FAILURE
        }
    }
}

/// One random-read workload: `offsets.len()` reads of `block` bytes, on `threads` threads.
#[derive(Clone)]
struct RandomWorkload {
    name: &'static str,
    block: u64,
    offsets: Vec<u64>,
    threads: usize,
}

/// `rand_read_4k` (`random_ops` reads) and `rand_read_64k` (a quarter as many) at the largest
/// thread count, for a file large enough to hold one block.
fn random_workloads(options: &BenchOptions, file_len: u64) -> Vec<RandomWorkload> {
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

/// The file's length, also as a buffer size.
fn file_size(path: &Path) -> Result<(u64, usize)> {
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

/// Times all `futures` to completion after `start`.
fn wait_all<T>(start: Instant, futures: Vec<gpumap::io::IoFuture<T>>) -> Result<f64> {
    for f in futures {
        f.wait()?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// `seq_write` and `seq_write_durable` at each write thread count: `write` on a handle of a
/// scratch file beside the input (a new file, never the input or any other that exists,
/// removed on every way out: see [`ScratchFile`]), then (durable) `fdatasync`.
fn write_workloads(
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
        |path, threads| open(path, "w", threads, true),
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
            |path, threads| device_open(path, "w", threads, true, mode),
            |handle| handle.write_device(src.view(), 0),
            emit,
        )?;
    }
    drop(dst);
    run_cache(options, device, file_len, emit)?;
    Ok(())
}

/// The GPU page cache's workloads (`gpumap-cache-*`), on `device`:
/// - random 4 KiB and 64 KiB reads, cold and warm, with a budget of 1/64 of the file (`-b64`)
///   and of the whole file (`-b1`), through the batch API (`gather`, 1024 ranges a call, from
///   every thread: `gpumap-cache-batch-*`) and through single views from every thread
///   (`gpumap-cache-views-*`); extents of the block size, so a miss reads what it needs;
/// - a sequential walk in 64 MiB windows with a budget of a quarter of the file
///   (`gpumap-cache-walk-b4`), read-ahead overlapping the windows: `seq_read_cold` and
///   `seq_read_warm_first_pass` one pass of a new cache; `seq_read_warm` measured as
///   FileHandle's (after a first use, the best of `repeats` passes), each pass from an emptied
///   cache that keeps its memory;
/// - the batch path in steady state (`gpumap-cache-batch-b64`, `rand_read_4k_warm_steady` and
///   `rand_read_64k_warm_steady`): sixteen times `random_ops` rows of 4 KiB or 64 KiB into one
///   cache of 1/64 of the file, where the rows above (`random_ops` rows, a call or a view per
///   row) mostly time a new cache's first use; and single 4 KiB views the same way
///   (`gpumap-cache-views-b64`/`-b1`, `rand_read_4k_warm_steady`);
/// - the zero-copy tier (`ZeroCopyFile`): registering the warm file (`gpumap-zerocopy`,
///   `register_warm`), then the random reads gathered in place from the page cache in batches
///   of 1024 from every thread (`gpumap-zerocopy-batch`, warm only: registering reads the file),
///   and single views of a map opened zero-copy from every thread (`gpumap-zerocopy-views`);
/// - the median time of a view of resident data (`gpumap-cache-view-hit`,
///   `view_resident_latency`; `seconds` is the median of 100,000 views).
///
/// Warm means the page cache holds the file; every measured run starts from an empty cache.
fn run_cache(
    options: &BenchOptions,
    device: &CudaDevice,
    file_len: u64,
    emit: &mut dyn FnMut(&Record),
) -> Result<()> {
    let threads = options.threads.iter().copied().max().unwrap_or(1);
    let handle = || -> Result<gpumap::io::HandleOptions> {
        let mut handle = FileHandle::options()?;
        handle.pool(Arc::new(IoPool::new(threads)?));
        Ok(handle)
    };
    // The library's default frames for each budget (8 MiB for 1/64 of a 4 GiB file, 32 MiB
    // for a quarter, 64 MiB for all of it) and default read-ahead: what a user gets.
    let open = |budget: u64, extent: u64| -> Result<(DeviceCache, DeviceMappedFile)> {
        let budget = budget.max(8 << 20).next_multiple_of(8 << 20);
        let cache = CacheOptions::new()
            .memory(Device::Cuda(device.clone()))
            .budget(budget)
            .extent_size(extent)
            .build()?;
        let map = cache.open_with(&options.file, MapOptions::new().handle_options(handle()?))?;
        Ok((cache, map))
    };
    for RandomWorkload { name, block, offsets, .. } in random_workloads(options, file_len) {
        for (suffix, budget) in [("b64", file_len / 64), ("b1", file_len)] {
            for temperature in ["cold", "warm"] {
                let workload = format!("{name}_{temperature}");
                let bytes = block * offsets.len() as u64;
                // Batches of 1024 ranges, the calls spread over the threads; one destination
                // per thread, allocated before the clock starts.
                let (_cache, map) = open(budget, block)?;
                let dsts = row_buffers(device, threads, block)?;
                if temperature == "cold" {
                    evict(&options.file)?;
                } else {
                    warm_page_cache(&options.file)?;
                }
                let secs = gather_in_batches(&map, &offsets, block, &dsts)?;
                let record = Record::new(
                    &format!("gpumap-cache-batch-{suffix}"),
                    &workload,
                    threads,
                    bytes,
                    secs,
                );
                emit(&record.with_ops(offsets.len() as u64));
                // Single views, one range a call, from every thread.
                let (_cache, map) = open(budget, block)?;
                if temperature == "cold" {
                    evict(&options.file)?;
                }
                let secs = in_threads(threads, offsets.iter().collect(), |_, o| {
                    map.view(**o, block).map(drop)
                })?;
                let record = Record::new(
                    &format!("gpumap-cache-views-{suffix}"),
                    &workload,
                    threads,
                    bytes,
                    secs,
                );
                emit(&record.with_ops(offsets.len() as u64));
            }
        }
    }
    // A sequential walk under a quarter of the file's size: cold, one pass of a new cache;
    // warm, the first pass of a new cache, then — measured as FileHandle's `seq_read_warm`,
    // after a first use and the best of `repeats` — passes that each start from an empty
    // cache (`evict`) that keeps its memory, as a second walk through one cache does.
    let walk = |map: &DeviceMappedFile| -> Result<f64> {
        let window = 64u64 << 20;
        let t = Instant::now();
        let mut offset = 0;
        while offset < file_len {
            offset += map.view(offset, window.min(file_len - offset))?.len();
        }
        Ok(t.elapsed().as_secs_f64())
    };
    for temperature in ["cold", "warm"] {
        let (_cache, map) = open(file_len / 4, 64 << 10)?;
        if temperature == "cold" {
            evict(&options.file)?;
        } else {
            warm_page_cache(&options.file)?;
        }
        let secs = walk(&map)?;
        let workload = match temperature {
            "cold" => "seq_read_cold",
            _ => "seq_read_warm_first_pass",
        };
        emit(&Record::new("gpumap-cache-walk-b4", workload, threads, file_len, secs));
        if temperature == "warm" {
            let best = best_of(options.repeats, || {
                map.evict()?;
                walk(&map)
            })?;
            emit(&Record::new("gpumap-cache-walk-b4", "seq_read_warm", threads, file_len, best));
        }
    }
    // The batch path in steady state: sixteen times the rows into one cache, so that what a
    // new cache and its new pool threads do once (creating and mapping frames, streams,
    // staging buffers) is a small part of the time — as FileHandle's warm batch rows run on
    // threads its cold rows used first. Then single views the same way.
    let steady_rows =
        [(4096u64, "rand_read_4k_warm_steady"), (64 << 10, "rand_read_64k_warm_steady")];
    for (block, workload) in steady_rows {
        if file_len < block {
            continue;
        }
        let steady = random_offsets(file_len, block, options.random_ops * 16);
        let bytes = block * steady.len() as u64;
        let (_cache, map) = open(file_len / 64, block)?;
        let dsts = row_buffers(device, threads, block)?;
        warm_page_cache(&options.file)?;
        let secs = gather_in_batches(&map, &steady, block, &dsts)?;
        let record = Record::new("gpumap-cache-batch-b64", workload, threads, bytes, secs);
        emit(&record.with_ops(steady.len() as u64));
        if block != 4096 {
            continue;
        }
        for (suffix, budget) in [("b64", file_len / 64), ("b1", file_len)] {
            let (_cache, map) = open(budget, block)?;
            let secs = in_threads(threads, steady.iter().collect(), |_, o| {
                map.view(**o, block).map(drop)
            })?;
            let record = Record::new(
                &format!("gpumap-cache-views-{suffix}"),
                workload,
                threads,
                bytes,
                secs,
            );
            emit(&record.with_ops(steady.len() as u64));
        }
    }
    // The zero-copy tier: the warm file registered for the GPU, rows gathered in place.
    warm_page_cache(&options.file)?;
    let t = Instant::now();
    let file = ZeroCopyOptions::new()
        .device(Device::Cuda(device.clone()))
        .max_pinned(u64::MAX)
        .open(&options.file)?;
    emit(&Record::new("gpumap-zerocopy", "register_warm", 1, file_len, t.elapsed().as_secs_f64()));
    for RandomWorkload { name, block, offsets, .. } in random_workloads(options, file_len) {
        let dsts = row_buffers(device, threads, block)?;
        let batches: Vec<Vec<(u64, u64)>> =
            offsets.chunks(1024).map(|c| c.iter().map(|&o| (o, block)).collect()).collect();
        let secs = in_threads(threads, batches.iter().collect(), |t, rows| {
            let mut dst = dsts[t].take();
            let result = file.gather(rows, dst.view_mut()).map(drop);
            dsts[t].put(dst);
            result
        })?;
        let bytes = block * offsets.len() as u64;
        let record =
            Record::new("gpumap-zerocopy-batch", &format!("{name}_warm"), threads, bytes, secs);
        emit(&record.with_ops(offsets.len() as u64));
    }
    drop(file);
    // Single views of a map opened zero-copy, one a call from every thread.
    let cache = CacheOptions::new().memory(Device::Cuda(device.clone())).build()?;
    let map = cache.open_with(
        &options.file,
        MapOptions::new().handle_options(handle()?).zero_copy(ZeroCopy::Within(u64::MAX)),
    )?;
    for RandomWorkload { name, block, offsets, .. } in random_workloads(options, file_len) {
        let secs =
            in_threads(threads, offsets.iter().collect(), |_, o| map.view(**o, block).map(drop))?;
        let bytes = block * offsets.len() as u64;
        let record =
            Record::new("gpumap-zerocopy-views", &format!("{name}_warm"), threads, bytes, secs);
        emit(&record.with_ops(offsets.len() as u64));
    }
    drop((map, cache));
    // The cost of a view of resident data.
    let (_cache, map) = open(64 << 20, 4096)?;
    drop(map.view(0, 4096)?);
    let mut times: Vec<f64> = (0..100_000)
        .map(|_| {
            let t = Instant::now();
            let view = map.view(0, 4096);
            let secs = t.elapsed().as_secs_f64();
            drop(view);
            secs
        })
        .collect();
    times.sort_by(f64::total_cmp);
    // As a rate, so that sub-microsecond times survive the record's rounding: `iops` is one
    // over the median time of a view.
    let views = times.len() as u64;
    let median = times[times.len() / 2];
    let record = Record::new(
        "gpumap-cache-view-hit",
        "view_resident_latency",
        1,
        4096 * views,
        median * views as f64,
    );
    emit(&record.with_ops(views));
    Ok(())
}

/// One destination of 1024 rows of `block` bytes per thread, allocated before a clock starts.
fn row_buffers(device: &CudaDevice, threads: usize, block: u64) -> Result<Vec<Taken<CudaBuffer>>> {
    (0..threads)
        .map(|_| Ok(Taken::new(CudaBuffer::alloc(device, 1024 * block as usize)?)))
        .collect()
}

/// Gathers the rows of `block` bytes at `offsets` (multiples of `block`) through `map` in
/// batches of 1024 row indices, the calls spread over one thread per destination of `dsts`; the
/// seconds taken.
fn gather_in_batches(
    map: &DeviceMappedFile,
    offsets: &[u64],
    block: u64,
    dsts: &[Taken<CudaBuffer>],
) -> Result<f64> {
    let indices: Vec<i64> = offsets.iter().map(|&o| (o / block) as i64).collect();
    in_threads(dsts.len(), indices.chunks(1024).collect(), |t, rows| {
        let mut dst = dsts[t].take();
        let result = map.gather_rows(*rows, block, dst.view_mut());
        dsts[t].put(dst);
        result
    })
}

/// Runs `work(thread, item)` on every item from `threads` threads (each taking the next item),
/// and returns the seconds until all are done.
fn in_threads<T: Sync>(
    threads: usize,
    items: Vec<T>,
    work: impl Fn(usize, &T) -> Result<()> + Sync,
) -> Result<f64> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let (next, items, work) = (&next, &items, &work);
                s.spawn(move || -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { return Ok(()) };
                        work(thread, item)?;
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| Error::InvalidArgument("a bench thread panicked".into()))??;
        }
        Ok(())
    })?;
    Ok(t.elapsed().as_secs_f64())
}

/// A value that one thread at a time takes and puts back (each bench thread its own buffer).
struct Taken<T>(std::sync::Mutex<Option<T>>);

impl<T> Taken<T> {
    fn new(value: T) -> Self {
        Taken(std::sync::Mutex::new(Some(value)))
    }

    fn take(&self) -> T {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take().expect("each thread takes its own")
    }

    fn put(&self, value: T) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
    }
}

/// Reads the whole file once through the page cache.
fn warm_page_cache(path: &Path) -> Result<()> {
    gpumap::pagecache::warm(
        path,
        gpumap::pagecache::ByteRange::ALL,
        gpumap::pagecache::WarmMode::Read,
    )
}

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

fn open(path: &Path, flags: &str, threads: usize, direct: bool) -> Result<FileHandle> {
    let mut options = FileHandle::options()?;
    options.pool(Arc::new(IoPool::new(threads)?)).direct_io(direct, direct);
    options.open(path, flags)
}

/// Drops the file's pages from the page cache ([`gpumap::pagecache::evict`]).
fn evict(path: &Path) -> Result<()> {
    gpumap::pagecache::evict(path, gpumap::pagecache::ByteRange::ALL).map(|_| ())
}

fn best_of(repeats: usize, mut measure: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        best = best.min(measure()?);
    }
    Ok(best)
}

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

fn time_shell(cmd: &str) -> Result<f64> {
    let t = Instant::now();
    let status = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .status()
        .map_err(|e| io_error("run baseline command", None, e))?;
    if !status.success() {
        return Err(Error::InvalidArgument(format!("baseline `{cmd}` failed: {status}")));
    }
    Ok(t.elapsed().as_secs_f64())
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

/// Appends `record` as one JSON line to `out` (printing is the caller's: `gpumap bench
/// --json --jsonl F` prints each record once).
pub fn append_jsonl(out: &Path, record: &Record) -> Result<()> {
    use std::io::Write;
    let line = serde_json::to_string(record)
        .map_err(|e| Error::InvalidArgument(format!("cannot encode record: {e}")))?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .map_err(|e| io_error("open", Some(out), e))?;
    writeln!(f, "{line}").map_err(|e| io_error("write", Some(out), e))
}

/// An [`Error::Io`] for `op` on `path`.
fn io_error(op: &'static str, path: Option<&Path>, source: std::io::Error) -> Error {
    Error::Io { op, path: path.map(Path::to_path_buf), offset: None, source }
}
