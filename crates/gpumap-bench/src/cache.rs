//! The GPU page cache's workloads (`gpumap-cache-*`, `gpumap-zerocopy-*`) on device memory.

use std::sync::Arc;
use std::time::Instant;

use gpumap::error::Result;
use gpumap::io::{FileHandle, IoPool};
use gpumap::mapped::{
    CacheOptions, DeviceCache, DeviceMappedFile, MapOptions, ZeroCopy, ZeroCopyOptions,
};
use gpumap::memory::cuda::{CudaBuffer, CudaDevice};
use gpumap::memory::Device;

use crate::files::{evict, warm_page_cache};
use crate::options::BenchOptions;
use crate::record::Record;
use crate::timing::{best_of, in_threads};
use crate::workloads::{random_offsets, random_workloads, RandomWorkload};

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
/// - the same steady rows through a map with misses read in place
///   (`gpumap-cache-misses-in-place-b64`, `ZeroCopy::MissesWithin`: the cache in front of the
///   zero-copy tier);
/// - the zero-copy tier (`ZeroCopyFile`): registering the warm file (`gpumap-zerocopy`,
///   `register_warm`), then the random reads gathered in place from the page cache in batches
///   of 1024 from every thread (`gpumap-zerocopy-batch`, warm only: registering reads the file),
///   and single views of a map opened zero-copy from every thread (`gpumap-zerocopy-views`);
/// - the median time of a view of resident data (`gpumap-cache-view-hit`,
///   `view_resident_latency`; `seconds` is the median of 100,000 views).
///
/// Warm means the page cache holds the file; every measured run starts from an empty cache.
pub(crate) fn run_cache(
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
    let open_zero_copy = |budget: u64,
                          extent: u64,
                          zero_copy: ZeroCopy|
     -> Result<(DeviceCache, DeviceMappedFile)> {
        let budget = budget.max(8 << 20).next_multiple_of(8 << 20);
        let cache = CacheOptions::new()
            .memory(Device::Cuda(device.clone()))
            .budget(budget)
            .extent_size(extent)
            .build()?;
        let map = cache.open_with(
            &options.file,
            MapOptions::new().handle_options(handle()?).zero_copy(zero_copy),
        )?;
        Ok((cache, map))
    };
    let open = |budget: u64, extent: u64| open_zero_copy(budget, extent, ZeroCopy::Off);
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
        // The same rows with the cache in front of the zero-copy tier: misses read in place by
        // the row kernel from the registered page cache, their extents admitted behind it.
        let (cache, in_place) =
            open_zero_copy(file_len / 64, block, ZeroCopy::MissesWithin(u64::MAX))?;
        let secs = gather_in_batches(&in_place, &steady, block, &dsts)?;
        let record =
            Record::new("gpumap-cache-misses-in-place-b64", workload, threads, bytes, secs);
        emit(&record.with_ops(steady.len() as u64));
        drop((in_place, cache));
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
