//! Row gathers by index: rows `i * row_size .. (i + 1) * row_size` of a file, for a list of
//! indices on the host or on the GPU, copied in order into the caller's buffer.
//!
//! On a GPU the rows whose extents are all resident in slots are found and copied by one
//! kernel launch, reading the directory (`directory`): no work per row on the CPU, and device
//! indices never travel to the host for those rows. The kernel lists the others; the host reads
//! them through the cache (`gather`, with each row placed where it goes), which fills their
//! slots, so the next gather finds them. Every index is checked by the kernel before anything
//! is read: one out of range is an error naming it, never a fault. On host memory the same
//! steps run on the CPU against the same table, so the tests exercise the directory's protocol.
//!
//! Once the budget is full, the misses of a read-only file are read past the cache instead
//! (`read_through`): their rows alone, on the pool's threads; `gather_rows` returns their indices
//! so that the caller can offer their extents to the cache in the background (`admission`).
//! Where the file is also registered for the GPU (the cache in front of the zero-copy tier,
//! [`MissesInPlace`]), the kernel copies the misses itself, in place from the registered file,
//! in the same launch; the host only learns which they were, for admission.
//!
//! The gather waits for its kernel before it returns (the misses need its list), so `dst` is
//! complete when it does; the kernel runs on the caller's stream, after the work queued there.
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::collections::HashMap;

use super::books::{key, SlotId};
use super::directory::Directory;
use super::gather::{gather_to, GatherRange};
use super::read_through::{read_rows_through, reads_through};
use super::state::{Engine, FileEntry};
use super::store::{HomeReader, SlotBytes};
use crate::error::{Error, Result};
use crate::memory::cuda::{
    validate_device_range, CudaBuffer, CudaDevice, CudaViewMut, PinnedBuffer, Stream,
};
use crate::memory::kernels::{RawEvent, RowJob, StreamHandle};
use crate::memory::{Device, DeviceViewMut};

/// Where a row gather's indices are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum IndexSource<'a> {
    /// Signed 32-bit indices in host memory.
    I32(&'a [i32]),
    /// Signed 64-bit indices in host memory.
    I64(&'a [i64]),
    /// `count` signed indices of `bytes` (4 or 8) each at device address `ptr` on GPU `ordinal`.
    Device { ptr: u64, bytes: u32, count: u64, ordinal: usize },
}

impl IndexSource<'_> {
    /// How many indices.
    pub(crate) fn len(&self) -> u64 {
        match self {
            IndexSource::I32(v) => v.len() as u64,
            IndexSource::I64(v) => v.len() as u64,
            IndexSource::Device { count, .. } => *count,
        }
    }

    /// The `n` indices from position `at` on.
    fn part(&self, at: u64, n: u64) -> IndexSource<'_> {
        let (a, b) = (at as usize, (at + n) as usize);
        match *self {
            IndexSource::I32(v) => IndexSource::I32(&v[a..b]),
            IndexSource::I64(v) => IndexSource::I64(&v[a..b]),
            IndexSource::Device { ptr, bytes, ordinal, .. } => {
                IndexSource::Device { ptr: ptr + at * u64::from(bytes), bytes, count: n, ordinal }
            }
        }
    }

    /// Index `i`, where the indices are on the host.
    fn host(&self, i: usize) -> Option<i64> {
        match self {
            IndexSource::I32(v) => v.get(i).map(|&x| i64::from(x)),
            IndexSource::I64(v) => v.get(i).copied(),
            IndexSource::Device { .. } => None,
        }
    }

    /// Bytes of one index.
    fn width(&self) -> u32 {
        match self {
            IndexSource::I32(_) => 4,
            IndexSource::I64(_) => 8,
            IndexSource::Device { bytes, .. } => *bytes,
        }
    }
}

/// Rows one pass (one kernel launch) takes at most: bounds the scratch a gather holds (a dozen
/// bytes a row) and keeps the kernel's miss positions in 32 bits.
const ROWS_PER_PASS: u64 = 1 << 20;

/// What a pass found: (position in the pass's indices, index) of the rows not found resident,
/// and how many of those the kernel copied in place (all of them, or none).
struct Found {
    misses: Vec<(u64, u64)>,
    in_place: u64,
}

impl Found {
    fn to_fill(misses: Vec<(u64, u64)>) -> Found {
        Found { misses, in_place: 0 }
    }
}

/// Where a gather's misses come from when the file is also registered for the GPU (the cache in
/// front of the zero-copy tier): read in place by the row kernel, never through the cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MissesInPlace {
    /// The registered file's device address; 0 on host memory, where the misses are read with
    /// `pread` instead.
    pub(crate) base: u64,
    /// The bytes registered there: a file mapped longer is not read in place.
    pub(crate) len: u64,
    /// Whether the gather lists the misses' indices (to admit their extents); without, the
    /// kernel's miss list stays on the device and only its length is read.
    pub(crate) list: bool,
}

/// Copies rows `indices` of `entry`'s file, `row_size` bytes each, in order into `dst` (see the
/// module docs). `stream`: the caller's stream (GPU only; default: the thread's own);
/// `in_place`: the file's registration for the GPU, if any. Returns the indices of the rows
/// read past the cache, for admission (with `in_place`, only where it asks for the list).
pub(crate) fn gather_rows(
    engine: &Engine,
    entry: &FileEntry,
    indices: IndexSource<'_>,
    row_size: u64,
    mut dst: DeviceViewMut<'_>,
    stream: Option<StreamHandle>,
    in_place: Option<MissesInPlace>,
) -> Result<Vec<u64>> {
    check_gather(&indices, row_size, dst.len())?;
    let in_place = in_place.filter(|p| p.len >= entry.len);
    refresh_recency(engine, false)?;
    let count = indices.len();
    let mut at = 0;
    let mut read_through = Vec::new();
    while at < count {
        let n = (count - at).min(ROWS_PER_PASS);
        let part = indices.part(at, n);
        read_through.extend(gather_pass(
            engine,
            entry,
            part,
            at,
            row_size,
            dst.reborrow(),
            stream,
            in_place,
        )?);
        at += n;
    }
    Ok(read_through)
}

/// Gives the slots that lookups found since the last harvest a second chance: the books make
/// them the most recently used (see `Directory::harvest_used`). Rows the kernel copies never
/// pass through the books, so without this the rows gathered most would be evicted first.
/// `now`: whether or not a harvest is due (before an admission evicts, say).
pub(super) fn refresh_recency(engine: &Engine, now: bool) -> Result<()> {
    let Some(used) = engine.directory.harvest_used(now)? else { return Ok(()) };
    let mut by_shard: Vec<Vec<SlotId>> = vec![Vec::new(); engine.shards.len()];
    for slot in used {
        by_shard[engine.shard_of_slot(slot)].push(slot);
    }
    for (shard, slots) in engine.shards.iter().zip(by_shard) {
        if !slots.is_empty() {
            let mut state = shard.state.lock();
            for slot in slots {
                state.books.touch_slot(slot);
            }
        }
    }
    Ok(())
}

/// Checks a row gather's arguments: rows of some bytes, a destination that holds them all,
/// device indices of 4 or 8 bytes in memory the driver knows.
fn check_gather(indices: &IndexSource<'_>, row_size: u64, dst_len: usize) -> Result<()> {
    if row_size == 0 {
        return Err(Error::InvalidArgument("rows of 0 bytes".into()));
    }
    let count = indices.len();
    let needed =
        count.checked_mul(row_size).ok_or(Error::Overflow { offset: count, len: row_size })?;
    if (dst_len as u64) < needed {
        return Err(Error::BufferTooSmall { needed, available: dst_len as u64 });
    }
    if let IndexSource::Device { ptr, bytes, count, .. } = *indices {
        if bytes != 4 && bytes != 8 {
            return Err(Error::InvalidArgument(format!(
                "row indices of {bytes} bytes: 4 (int32) or 8 (int64) expected"
            )));
        }
        let len = count
            .checked_mul(u64::from(bytes))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or(Error::Overflow { offset: ptr, len: count })?;
        validate_device_range(ptr, len)?;
    }
    Ok(())
}

/// `Err` when the indices or the destination are on another GPU than `device`.
fn check_devices(device: &CudaDevice, dst_ordinal: usize, indices: &IndexSource<'_>) -> Result<()> {
    if let IndexSource::Device { ordinal, .. } = *indices {
        if ordinal != device.ordinal() {
            return Err(Error::InvalidArgument(format!(
                "the indices are on GPU {ordinal}, the file's memory on GPU {}",
                device.ordinal()
            )));
        }
    }
    if dst_ordinal != device.ordinal() {
        return Err(Error::InvalidArgument(format!(
            "the destination is on GPU {dst_ordinal}, the file's memory on GPU {}",
            device.ordinal()
        )));
    }
    Ok(())
}

/// One pass of `gather_rows`: `indices` are those from position `first` on. Returns the
/// indices of the rows it read past the cache.
#[allow(clippy::too_many_arguments)]
fn gather_pass(
    engine: &Engine,
    entry: &FileEntry,
    indices: IndexSource<'_>,
    first: u64,
    row_size: u64,
    mut dst: DeviceViewMut<'_>,
    stream: Option<StreamHandle>,
    in_place: Option<MissesInPlace>,
) -> Result<Vec<u64>> {
    let count = indices.len();
    let rows_mapped = entry.len / row_size;
    // A file cut under its map: rows past its end now are errors, whatever the cache holds.
    let rows = rows_mapped.min(entry.file.len()? / row_size);
    let out = first * row_size;
    let found = match (&engine.store.device(), &mut dst) {
        (Device::Cuda(device), DeviceViewMut::Cuda(view)) => {
            check_devices(device, view.device_ordinal(), &indices)?;
            let at = view.ptr() + out;
            let job = Pass { first, rows, row_size, dst: at };
            on_device(engine, entry, device, &indices, &job, stream, in_place)?
        }
        (_, dst) => on_host(engine, entry, &indices, first, rows, row_size, dst)?,
    };
    if found.in_place > 0 {
        count_rows(engine, entry, count - found.in_place, found.in_place);
        return Ok(found.misses.into_iter().map(|(_, index)| index).collect());
    }
    let hits = count - found.misses.len() as u64;
    if found.misses.is_empty() {
        count_rows(engine, entry, hits, 0);
        return Ok(Vec::new());
    }
    for &(position, index) in &found.misses {
        check_row(entry, first + position, index as i64, rows, rows_mapped, row_size)?;
    }
    if reads_through(engine, entry, row_size, in_place.is_some()) {
        read_rows_through(engine, entry, &found.misses, row_size, out, &mut dst)?;
        count_rows(engine, entry, hits, found.misses.len() as u64);
        return Ok(found.misses.into_iter().map(|(_, index)| index).collect());
    }
    // The cache's fill counts its own misses.
    count_rows(engine, entry, hits, 0);
    let ranges: Vec<GatherRange<'_>> = found
        .misses
        .iter()
        .map(|&(_, index)| GatherRange { entry, offset: index * row_size, len: row_size })
        .collect();
    let placed: Vec<u64> =
        found.misses.iter().map(|&(position, _)| out + position * row_size).collect();
    gather_to(engine, &ranges, Some(&placed), Some(dst))?;
    Ok(Vec::new())
}

/// Adds rows a gather found resident (`hits`) and read past the cache (`read_through`) to
/// `entry`'s counters.
fn count_rows(engine: &Engine, entry: &FileEntry, hits: u64, read_through: u64) {
    if let Some(c) = engine.shards[0].state.lock().books.counters_mut(entry.id) {
        c.hits += hits;
        c.misses += read_through;
        c.rows_read_through += read_through;
    }
}

/// `Ok` for a row within the file; else the error naming it: `RowIndex` past the rows mapped
/// (or negative), `UnexpectedEof` past the end of a file cut under the map. `position`: where
/// the index is among all the gather's.
fn check_row(
    entry: &FileEntry,
    position: u64,
    index: i64,
    rows: u64,
    rows_mapped: u64,
    row_size: u64,
) -> Result<()> {
    match u64::try_from(index) {
        Ok(i) if i < rows => Ok(()),
        Ok(i) if i < rows_mapped => Err(entry.file.eof_error(i * row_size, row_size, 0)),
        _ => Err(Error::RowIndex { position, index, rows: rows_mapped }),
    }
}

/// The host's stand-in for the kernel: each row's extents looked up in the directory, the
/// resident rows copied from their slots, the others listed. `first`: the pass's first
/// position among all the gather's.
///
/// Every index is checked first, so that an error names the lowest bad position. A pass of many
/// rows of a cache in host memory, into host memory, is shared among the pool's threads, each
/// placing and copying its own run of rows into its own part of `dst`
/// (docs/decisions/0036-host-row-gathers-shared-among-the-pool.md).
fn on_host(
    engine: &Engine,
    entry: &FileEntry,
    indices: &IndexSource<'_>,
    first: u64,
    rows: u64,
    row_size: u64,
    dst: &mut DeviceViewMut<'_>,
) -> Result<Found> {
    let mapped = entry.len / row_size;
    let indices = host_indices(indices)?;
    for (position, &index) in indices.iter().enumerate() {
        check_row(entry, first + position as u64, index, rows, mapped, row_size)?;
    }
    let hold = engine.directory.begin()?;
    let out = (first * row_size) as usize;
    // Saturating: only a run's place is cut from it, and a destination holds every row.
    let task_bytes = (row_size as usize).saturating_mul(ROWS_PER_TASK);
    let mut misses = Vec::new();
    match dst {
        DeviceViewMut::Host(bytes) => {
            let end = out + indices.len() * row_size as usize;
            let available = bytes.len() as u64;
            let dst = bytes
                .get_mut(out..end)
                .ok_or(Error::BufferTooSmall { needed: end as u64, available })?;
            // Runs of a task's rows, each placed and copied into its own part of `dst`, so
            // that the pieces placed stay few.
            let tasks = indices.len().div_ceil(ROWS_PER_TASK);
            let mut found: Vec<Vec<(u64, u64)>> = vec![Vec::new(); tasks];
            let runs: Vec<_> = indices
                .chunks(ROWS_PER_TASK)
                .zip(dst.chunks_mut(task_bytes))
                .zip(found.iter_mut())
                .enumerate()
                .map(|(t, ((indices, dst), found))| {
                    ((t * ROWS_PER_TASK) as u64, indices, dst, found)
                })
                .collect();
            let run = |(at, indices, dst, found): (u64, &[i64], &mut [u8], &mut Vec<_>)| {
                let mut reader = engine.store.slot_reader(&hold);
                let pieces = place_rows(engine, entry, &mut reader, indices, at, row_size, found)?;
                copy_pieces(&reader, &pieces, dst)?;
                Ok(0)
            };
            // Shared among the pool's threads from host memory only: a GPU cache's slots are
            // copied out by the driver, on the thread whose context is current.
            let pool = entry.file.pool();
            if tasks > 1 && pool.nthreads() > 1 && engine.store.in_host_memory() {
                pool.run(runs, run)?;
            } else {
                runs.into_iter().try_for_each(|r| run(r).map(|_| ()))?;
            }
            misses = found.concat();
        }
        DeviceViewMut::Cuda(view) => {
            let mut reader = engine.store.slot_reader(&hold);
            // A piece is at most an extent: what the pieces go through on their way up.
            let mut piece_buffer = Vec::new();
            for (t, indices) in indices.chunks(ROWS_PER_TASK).enumerate() {
                let at = (t * ROWS_PER_TASK) as u64;
                let pieces =
                    place_rows(engine, entry, &mut reader, indices, at, row_size, &mut misses)?;
                for &(bytes, to) in &pieces {
                    piece_buffer.resize(bytes.len(), 0);
                    reader.copy_slot(bytes, &mut piece_buffer)?;
                    view.copy_from_host(out + t * task_bytes + to, &piece_buffer)?;
                }
            }
        }
    }
    Ok(Found::to_fill(misses))
}

/// Rows a host gather places and copies at a time: a task's, where the gather is shared among
/// the pool's threads.
const ROWS_PER_TASK: usize = 4096;

/// Looks up the extents of rows `indices` (checked), and places the pieces of those resident,
/// each with where it goes counting from the first row's place (a piece lies within one
/// extent). Pushes the others to `misses`: (position in the pass, index), the first row being
/// at position `first`.
#[allow(clippy::too_many_arguments)]
fn place_rows(
    engine: &Engine,
    entry: &FileEntry,
    reader: &mut HomeReader<'_>,
    indices: &[i64],
    first: u64,
    row_size: u64,
    misses: &mut Vec<(u64, u64)>,
) -> Result<Vec<(SlotBytes, usize)>> {
    let g = engine.geometry;
    let mut pieces = Vec::with_capacity(indices.len());
    for (position, &index) in indices.iter().enumerate() {
        let (position, start) = (position as u64, index as u64 * row_size);
        let row_pieces = pieces.len();
        let mut at = start;
        for e in g.extents_covering(start, row_size) {
            let Some(slot) = key(entry.id, e).and_then(|k| engine.directory.lookup(k)) else {
                pieces.truncate(row_pieces);
                misses.push((first + position, index as u64));
                break;
            };
            let end = ((e + 1) * g.extent).min(start + row_size);
            let bytes = reader.place(slot, at - e * g.extent, (end - at) as usize)?;
            pieces.push((bytes, (position * row_size + at - start) as usize));
            at = end;
        }
    }
    Ok(pieces)
}

/// Copies `pieces` into `dst`, each copy first prefetching the piece a few places on, so that
/// the memory latencies of the rows ahead pass while this one is copied under its extent's lock.
fn copy_pieces(
    reader: &HomeReader<'_>,
    pieces: &[(SlotBytes, usize)],
    dst: &mut [u8],
) -> Result<()> {
    let available = dst.len() as u64;
    for (n, &(bytes, to)) in pieces.iter().enumerate() {
        if let Some(&(ahead, _)) = pieces.get(n + PREFETCH_AHEAD) {
            reader.prefetch(ahead);
        }
        let needed = (to + bytes.len()) as u64;
        let piece =
            dst.get_mut(to..to + bytes.len()).ok_or(Error::BufferTooSmall { needed, available })?;
        reader.copy_slot(bytes, piece)?;
    }
    Ok(())
}

/// How many pieces ahead of its copy a host gather prefetches: enough rows in flight to cover
/// a memory latency at the rate one thread copies, few enough to stay in the CPU's caches.
const PREFETCH_AHEAD: usize = 8;

/// A thread's buffers for row kernels on one GPU, grown as asked (up to a pass) and kept.
struct Scratch {
    /// Device: the indices (when they come from the host), then the miss list, then two
    /// result words (the miss count, the first bad position).
    device: CudaBuffer,
    /// Pinned: the indices on their way up, and the result words on their way down.
    pinned: PinnedBuffer,
    event: RawEvent,
}

thread_local! {
    static SCRATCH: RefCell<HashMap<usize, Scratch>> = RefCell::new(HashMap::new());
}

/// Where a launch's arrays are on the device.
struct KernelArgs {
    /// The indices.
    indices: u64,
    /// Room for a `u32` position per index.
    misses: u64,
    /// The miss count (`u32`, zeroed) and, 8 bytes on, the first bad position (`u64::MAX`).
    results: u64,
}

/// What a row kernel reported.
struct Reported {
    /// The lowest position whose index is out of range.
    first_bad: Option<u64>,
    /// How many rows the kernel listed as misses.
    miss_count: u64,
    /// The positions the kernel listed as misses, in no order (empty unless asked for).
    misses: Vec<u32>,
}

/// Runs a row kernel over `indices` on `stream` and waits for it: stages host indices on the
/// device, sets the result words, calls `launch` to queue the kernel, then reads back what it
/// reported (the miss list only where `list`). The scratch is the thread's own, so concurrent
/// gathers never share it.
fn run_row_kernel(
    device: &CudaDevice,
    indices: &IndexSource<'_>,
    stream: StreamHandle,
    list: bool,
    launch: impl FnOnce(&KernelArgs) -> Result<()>,
) -> Result<Reported> {
    let count = indices.len() as usize;
    let width = indices.width() as usize;
    let staged = (count * width).next_multiple_of(16);
    let at_misses = staged;
    let at_results = at_misses + (count * 4).next_multiple_of(16);
    let total = at_results + 16;
    SCRATCH.with(|cell| -> Result<Reported> {
        let mut map = cell.borrow_mut();
        let fits = map
            .get(&device.ordinal())
            .is_some_and(|s| s.device.len() >= total && s.pinned.len() >= total);
        if !fits {
            map.remove(&device.ordinal());
            let size = total.next_power_of_two().max(1 << 16);
            let scratch = Scratch {
                device: CudaBuffer::alloc(device, size)?,
                pinned: PinnedBuffer::new(device, size)?,
                event: RawEvent::new()?,
            };
            map.insert(device.ordinal(), scratch);
        }
        let Some(scratch) = map.get_mut(&device.ordinal()) else {
            return Err(Error::InvalidArgument("row kernel scratch missing".into()));
        };
        let dev = scratch.device.ptr();
        let pinned = scratch.pinned.as_mut_slice();
        let pinned_base = pinned.as_ptr() as u64;
        // No miss yet, no bad row yet.
        pinned[at_results..at_results + 8].copy_from_slice(&0u64.to_ne_bytes());
        pinned[at_results + 8..at_results + 16].copy_from_slice(&u64::MAX.to_ne_bytes());
        let indices_at = match indices {
            IndexSource::Device { ptr, .. } => *ptr,
            IndexSource::I32(v) => {
                for (k, x) in v.iter().enumerate() {
                    pinned[4 * k..4 * k + 4].copy_from_slice(&x.to_ne_bytes());
                }
                dev
            }
            IndexSource::I64(v) => {
                for (k, x) in v.iter().enumerate() {
                    pinned[8 * k..8 * k + 8].copy_from_slice(&x.to_ne_bytes());
                }
                dev
            }
        };
        let args = KernelArgs {
            indices: indices_at,
            misses: dev + at_misses as u64,
            results: dev + at_results as u64,
        };
        let results_home = pinned_base + at_results as u64;
        let queued = (|| {
            if indices_at == dev {
                stream.copy(dev, pinned_base, count * width)?;
            }
            stream.copy(args.results, results_home, 16)?;
            launch(&args)?;
            stream.copy(results_home, args.results, 16)?;
            stream.record(&scratch.event)
        })();
        // Waited for even when queueing failed part way: what was queued still reads and
        // writes the scratch. (Nothing queued since the event's last record is then waited.)
        let waited = scratch.event.synchronize();
        queued.and(waited)?;
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&pinned[at..at + 8]);
            u64::from_ne_bytes(w)
        };
        let miss_count = (word(at_results) & 0xffff_ffff) as usize;
        let first_bad = Some(word(at_results + 8)).filter(|&b| b != u64::MAX);
        let mut misses = Vec::new();
        if list && miss_count > 0 && first_bad.is_none() {
            let mut raw = vec![0u8; miss_count.min(count) * 4];
            stream.copy(raw.as_mut_ptr() as u64, args.misses, raw.len())?;
            stream.synchronize()?;
            misses =
                raw.chunks_exact(4).map(|p| u32::from_ne_bytes([p[0], p[1], p[2], p[3]])).collect();
        }
        Ok(Reported { first_bad, miss_count: miss_count as u64, misses })
    })
}

/// One pass's rows on the device: the pass's first position among the gather's, the rows the
/// file has now, their size, and where the pass's first row goes.
struct Pass {
    first: u64,
    rows: u64,
    row_size: u64,
    dst: u64,
}

/// The kernel's way (see the module docs).
fn on_device(
    engine: &Engine,
    entry: &FileEntry,
    device: &CudaDevice,
    indices: &IndexSource<'_>,
    pass: &Pass,
    stream: Option<StreamHandle>,
    in_place: Option<MissesInPlace>,
) -> Result<Found> {
    let Pass { first, rows, row_size, dst } = *pass;
    device.bind_to_thread()?;
    let directory: &Directory = &engine.directory;
    let (Some(kernels), Some(table)) = (directory.kernels(), directory.params()) else {
        return Err(Error::InvalidArgument("a GPU cache without its directory".into()));
    };
    let Some(file) = engine.directory_file(entry) else {
        // A file whose keys do not fit is never in the directory: every row a miss.
        let all = host_indices(indices)?;
        let misses = all.into_iter().enumerate().map(|(p, i)| (p as u64, i as u64)).collect();
        return Ok(Found::to_fill(misses));
    };
    let own;
    let stream = match stream {
        Some(s) => s,
        None => {
            own = Stream::for_current_thread(device)?;
            own.raw().as_handle()
        }
    };
    let job = |args: &KernelArgs| RowJob {
        indices: args.indices,
        index_bytes: indices.width(),
        count: indices.len(),
        rows,
        row_size,
        dst,
        first_bad: args.results + 8,
    };
    // While the kernel may read slots, none is reused: the hold ends once it has finished.
    let lookups = directory.begin()?;
    let base = in_place.map_or(0, |p| p.base);
    let list = in_place.is_none_or(|p| p.list);
    let reported = run_row_kernel(device, indices, stream, list, |args| {
        let job = job(args);
        kernels.gather_rows(stream, &table, file, &job, base, args.misses, args.results)
    });
    drop(lookups);
    let reported = reported?;
    if let Some(bad) = reported.first_bad {
        let index = index_at(indices, bad)?;
        let mapped = entry.len / row_size;
        check_row(entry, first + bad, index, rows, mapped, row_size)?;
        return Err(Error::InvalidArgument(format!("the row kernel refused index {index}")));
    }
    let all = match indices {
        IndexSource::Device { .. } if !reported.misses.is_empty() => Some(host_indices(indices)?),
        _ => None,
    };
    let mut misses: Vec<(u64, u64)> = reported
        .misses
        .into_iter()
        .map(|p| {
            let p = u64::from(p);
            let index = match &all {
                Some(all) => all[p as usize],
                None => indices.host(p as usize).unwrap_or(-1),
            };
            (p, index as u64)
        })
        .collect();
    misses.sort_unstable();
    let in_place = if base == 0 { 0 } else { reported.miss_count };
    Ok(Found { misses, in_place })
}

/// Rows of a file registered for `device` at `base` (the zero-copy tier) copied by the direct
/// kernel: every row in range is resident, so one launch does all. `rows`: the rows the file
/// has now; `rows_mapped`: those it had when mapped; `eof(offset)`: the error for a row past
/// the end of a file cut since.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_rows_direct(
    device: &CudaDevice,
    base: u64,
    rows: u64,
    rows_mapped: u64,
    indices: IndexSource<'_>,
    row_size: u64,
    dst: &mut CudaViewMut<'_>,
    stream: Option<StreamHandle>,
    eof: &dyn Fn(u64) -> Error,
) -> Result<()> {
    check_gather(&indices, row_size, dst.len())?;
    check_devices(device, dst.device_ordinal(), &indices)?;
    device.bind_to_thread()?;
    let kernels = crate::memory::kernels::row_kernels(device)?;
    let own;
    let stream = match stream {
        Some(s) => s,
        None => {
            own = Stream::for_current_thread(device)?;
            own.raw().as_handle()
        }
    };
    let mut at = 0;
    while at < indices.len() {
        let n = (indices.len() - at).min(ROWS_PER_PASS);
        let part = indices.part(at, n);
        let out = dst.ptr() + at * row_size;
        let reported = run_row_kernel(device, &part, stream, false, |args| {
            let job = RowJob {
                indices: args.indices,
                index_bytes: part.width(),
                count: n,
                rows,
                row_size,
                dst: out,
                first_bad: args.results + 8,
            };
            kernels.gather_rows_direct(stream, base, &job)
        })?;
        if let Some(bad) = reported.first_bad {
            let index = index_at(&part, bad)?;
            return Err(match u64::try_from(index) {
                Ok(i) if i < rows_mapped => eof(i * row_size),
                _ => Error::RowIndex { position: at + bad, index, rows: rows_mapped },
            });
        }
        at += n;
    }
    Ok(())
}

/// Rows of a file read with `read(offset, buffer)` (`pread`) into host memory: the zero-copy
/// tier's way into host memory. Each index is checked, in order, before its row is read.
/// `rows_mapped`: the rows of the file as mapped (a row past a cut since then is the read's
/// own `UnexpectedEof`).
pub(crate) fn read_rows(
    indices: IndexSource<'_>,
    row_size: u64,
    rows_mapped: u64,
    dst: &mut [u8],
    read: &dyn Fn(u64, &mut [u8]) -> Result<()>,
) -> Result<()> {
    check_gather(&indices, row_size, dst.len())?;
    let count = indices.len();
    let mut at = 0;
    while at < count {
        let n = (count - at).min(ROWS_PER_PASS);
        for (k, index) in host_indices(&indices.part(at, n))?.into_iter().enumerate() {
            let position = at + k as u64;
            let i = match u64::try_from(index) {
                Ok(i) if i < rows_mapped => i,
                _ => return Err(Error::RowIndex { position, index, rows: rows_mapped }),
            };
            let out = (position * row_size) as usize;
            read(i * row_size, &mut dst[out..out + row_size as usize])?;
        }
        at += n;
    }
    Ok(())
}

/// Index `position` of `indices`, read from the device where they are there.
fn index_at(indices: &IndexSource<'_>, position: u64) -> Result<i64> {
    if let Some(i) = indices.host(position as usize) {
        return Ok(i);
    }
    let IndexSource::Device { ptr, bytes, ordinal, .. } = *indices else { return Ok(-1) };
    let mut word = [0u8; 8];
    CudaDevice::new(ordinal)?.bind_to_thread()?;
    let at = ptr + position * u64::from(bytes);
    validate_device_range(at, bytes as usize)?.copy_to_host(0, &mut word[..bytes as usize])?;
    Ok(match bytes {
        4 => i64::from(i32::from_ne_bytes([word[0], word[1], word[2], word[3]])),
        _ => i64::from_ne_bytes(word),
    })
}

/// Every index, on the host (copied down from the device where they are there).
fn host_indices(indices: &IndexSource<'_>) -> Result<Vec<i64>> {
    Ok(match *indices {
        IndexSource::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
        IndexSource::I64(v) => v.to_vec(),
        IndexSource::Device { ptr, bytes, count, ordinal } => {
            let mut raw = vec![0u8; (count * u64::from(bytes)) as usize];
            CudaDevice::new(ordinal)?.bind_to_thread()?;
            validate_device_range(ptr, raw.len())?.copy_to_host(0, &mut raw)?;
            match bytes {
                4 => raw
                    .chunks_exact(4)
                    .map(|c| i64::from(i32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
                    .collect(),
                _ => raw
                    .chunks_exact(8)
                    .map(|c| {
                        let mut w = [0u8; 8];
                        w.copy_from_slice(c);
                        i64::from_ne_bytes(w)
                    })
                    .collect(),
            }
        }
    })
}
