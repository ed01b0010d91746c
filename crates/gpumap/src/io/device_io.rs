//! Transfers between a file and device memory, one region at a time.
//!
//! Two paths, chosen per file by [`crate::io::compat`]:
//!
//! - **cuFile**: the transfer is split into `task_size` tasks, each a `cuFileRead`/`cuFileWrite`
//!   at its device offset, run in parallel on the pool.
//! - **POSIX** (pipelined bounce buffers): the transfer is split into tasks of 16 bounce
//!   buffers (64 MiB by default; fewer where that would leave a thread under four tasks), and
//!   each task moves through pinned bounce buffers in `bounce_buffer_size` chunks,
//!   double-buffered: while chunk *k* is copied
//!   to the GPU on the worker's stream, chunk *k + 1* is read from the file. Bounce buffers are
//!   page aligned, so the aligned middle of each chunk can bypass the page cache with
//!   `O_DIRECT`. Writes mirror it: chunk *k + 1* is copied from the GPU while chunk *k* is
//!   written.
//!
//! Many small reads go through `batch` (and, as futures, `small_reads`) instead; stream-ordered
//! transfers through `stream`.
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::align::{align_up, checked_end, split_tasks, PAGE_SIZE};
use crate::error::Result;
use crate::io::compat::IoPath;
use crate::io::direct::{self, ReadPlan};
use crate::io::gds::{CuFileHandle, RegisteredBuffer};
use crate::io::handle_state::HandleState;
use crate::io::host_io;
use crate::io::pool::{delivered_prefix, IoFuture};
use crate::io::writes_in_flight::spawn_counted;
use crate::memory::bounce::{BounceBuffer, BouncePool};
use crate::memory::cuda::{CopyDirection, CudaDevice, CudaView, InFlight, RawRegion, Stream};
use crate::memory::{DeviceView, DeviceViewMut, OwnedDeviceSource};

/// Reads into `dst` — GPU memory, or host memory standing in for it — from `offset`.
pub(super) fn read_device(
    state: &HandleState,
    dst: DeviceViewMut<'_>,
    offset: u64,
) -> Result<usize> {
    match dst {
        DeviceViewMut::Host(bytes) => host_io::read(state, bytes, offset),
        DeviceViewMut::Cuda(view) => read_cuda(state, view.raw, offset),
    }
}

/// Writes all of `src` — GPU memory, or host memory standing in for it — at `offset`.
pub(super) fn write_device(state: &HandleState, src: DeviceView<'_>, offset: u64) -> Result<usize> {
    match src {
        DeviceView::Host(bytes) => host_io::write(state, bytes, offset),
        DeviceView::Cuda(view) => write_cuda(state, view.raw, offset),
    }
}

/// [`write_device`] of the owned `src` on the pool; the future gives back `src` and the count.
pub(super) fn pwrite_device<B: OwnedDeviceSource>(
    state: &Arc<HandleState>,
    src: B,
    offset: u64,
) -> IoFuture<(B, usize)> {
    let shared = Arc::clone(state);
    spawn_counted(&state.writes, &state.pool, move || {
        let n = write_device(&shared, src.device_view(), offset)?;
        Ok((src, n))
    })
}

/// File -> GPU memory: the cuFile path, or the pipelined bounce path.
pub(super) fn read_cuda(state: &HandleState, dst: RawRegion, offset: u64) -> Result<usize> {
    read_cuda_in_tasks(state, dst, offset, 0)
}

/// [`read_cuda`], in tasks of at least `min_task` bytes on the bounce path (0: as
/// [`read_cuda`] splits it). A larger least task suits reads that run many at once (a cache's
/// read-ahead): concurrency comes from the other reads, and each task's deeper pipeline is
/// worth more than spreading one read over every thread.
pub(super) fn read_cuda_in_tasks(
    state: &HandleState,
    dst: RawRegion,
    offset: u64,
    min_task: u64,
) -> Result<usize> {
    let _range = crate::profiling::Range::new(c"gpumap::read_device");
    state.check_read()?;
    checked_end(offset, dst.len as u64)?;
    match state.cufile_for(dst.len) {
        Some(gds) => run_cufile(state, gds, dst, offset, true),
        None => {
            let span = span_size(state, dst.len).max(min_task);
            let tasks = split_tasks(offset, dst.len as u64, span);
            let plan = direct::read_plan(state, offset, dst.len as u64);
            let counts = state.pool.run_each(tasks.clone(), |t| {
                read_span(state, dst, t.buf_offset as usize, t.len as usize, t.offset, plan)
            })?;
            // A file cut by another process mid-read: only the bytes delivered from the
            // start without a gap count.
            Ok(delivered_prefix(&tasks, &counts))
        }
    }
}

/// GPU memory -> file.
pub(super) fn write_cuda(state: &HandleState, src: RawRegion, offset: u64) -> Result<usize> {
    let _range = crate::profiling::Range::new(c"gpumap::write_device");
    state.check_positional_write()?;
    checked_end(offset, src.len as u64)?;
    match state.cufile_for(src.len) {
        Some(gds) => run_cufile(state, gds, src, offset, false),
        None => {
            let tasks = split_tasks(offset, src.len as u64, span_size(state, src.len));
            state.pool.run(tasks, |t| {
                write_span(state, src, t.buf_offset as usize, t.len as usize, t.offset)
            })
        }
    }
}

/// Registers `region` with cuFile for the life of the guard where the file takes the cuFile
/// path; `None` on the POSIX path, where there is nothing to register.
pub(super) fn register_buffer<'a>(
    state: &HandleState,
    region: CudaView<'a>,
) -> Result<Option<RegisteredBuffer<'a>>> {
    match state.decision() {
        (decision, Some(_)) if decision.path == IoPath::CuFile => {
            CuFileHandle::register_buffer(region).map(Some)
        }
        _ => Ok(None),
    }
}

/// Bounce-buffer chunks per task on the POSIX device path (see [`span_size`]).
const PIPELINE_CHUNKS: u64 = 16;

/// A task of the POSIX device read path is read in at least this many chunks, so that reading
/// one overlaps the copy of the one before, down to chunks of [`PIPELINE_MIN_CHUNK`].
const PIPELINE_MIN_STEPS: usize = 4;

/// The smallest chunk a task is cut into for pipelining.
const PIPELINE_MIN_CHUNK: usize = 1 << 20;

/// The chunk a task of `len` bytes reads at a time through bounce buffers of `buffer` bytes:
/// the whole buffer, unless that leaves fewer than [`PIPELINE_MIN_STEPS`] chunks — a 4 MiB task
/// in one 4 MiB chunk reads, then waits for its copy, and its thread never overlaps the two.
fn pipeline_chunk(len: usize, buffer: usize) -> usize {
    let even = len.div_ceil(PIPELINE_MIN_STEPS).next_multiple_of(PAGE_SIZE as usize);
    even.clamp(PIPELINE_MIN_CHUNK.min(buffer), buffer)
}

/// A chunk on its way from device to file: the download in flight, and where it goes.
struct Chunk {
    copy: InFlight<'static, BounceBuffer>,
    /// Where the chunk starts in its buffer.
    skew: usize,
    len: usize,
    file_offset: u64,
}

/// The task size on the POSIX device path: [`PIPELINE_CHUNKS`] bounce buffers, so that a
/// task pipelines its chunks on one thread, but no more than a quarter of one thread's
/// share (every thread gets several tasks, so none straggles at the end), and never less
/// than `task_size` or one bounce buffer.
///
/// Long tasks of buffer-sized chunks beat both KvikIO's one chunk per task and bigger chunks
/// (docs/decisions/0005-bounce-buffers-4mib.md has the sweep).
pub(super) fn span_size(state: &HandleState, len: usize) -> u64 {
    let chunk = state.settings.bounce_buffer_size;
    let share = (len as u64) / (4 * state.pool.nthreads() as u64);
    let span = (PIPELINE_CHUNKS * chunk).min(share).max(state.settings.task_size).max(chunk);
    align_up(span, PAGE_SIZE).unwrap_or(span)
}

fn run_cufile(
    state: &HandleState,
    gds: &CuFileHandle,
    region: RawRegion,
    offset: u64,
    read: bool,
) -> Result<usize> {
    let tasks = split_tasks(offset, region.len as u64, state.settings.task_size);
    let counts = state.pool.run_each(tasks.clone(), |t| {
        let (at, len) = (t.buf_offset as usize, t.len as usize);
        if read {
            gds.read_raw(region, at, len, t.offset)
        } else {
            gds.write_raw(region, at, len, t.offset)
        }
    })?;
    Ok(delivered_prefix(&tasks, &counts))
}

/// This thread's bounce pool and stream for device `ordinal`, the device bound to the thread.
pub(super) fn staging(
    state: &HandleState,
    ordinal: usize,
) -> Result<(Arc<BouncePool>, std::rc::Rc<Stream>)> {
    let device = CudaDevice::new(ordinal)?;
    device.bind_to_thread()?;
    let pool = BouncePool::for_device(
        &device,
        state.settings.bounce_buffer_size as usize,
        2 * state.pool.nthreads(),
    )?;
    Ok((pool, Stream::for_current_thread(&device)?))
}

/// A second buffer for double-buffering, or — when the pool is exhausted by other
/// transfers — the buffer of the copy in flight once it is done. Never blocks while
/// holding a buffer, so workers cannot deadlock on the pool.
fn next_buffer(
    pool: &Arc<BouncePool>,
    in_flight: &mut Option<InFlight<'static, BounceBuffer>>,
) -> Result<BounceBuffer> {
    if let Some(buffer) = pool.try_acquire()? {
        return Ok(buffer);
    }
    match in_flight.take() {
        Some(copy) => copy.wait(),
        None => pool.acquire(),
    }
}

/// File -> device for `[file_offset, file_offset + len)` into `dst` at `dst_offset`.
pub(super) fn read_span(
    state: &HandleState,
    dst: RawRegion,
    dst_offset: usize,
    len: usize,
    file_offset: u64,
    plan: ReadPlan,
) -> Result<usize> {
    // The pool thread's share of the transfer, on its own timeline.
    let _range = crate::profiling::Range::new(c"gpumap::read_device");
    let (pool, stream) = staging(state, dst.ordinal)?;
    let chunk_size = pipeline_chunk(len, pool.buffer_size());
    let mut in_flight: Option<InFlight<'static, BounceBuffer>> = None;
    let mut done = 0usize;
    while done < len {
        // Bytes land in the buffer at the file offset's place within its page, so that
        // buffer and file line up for O_DIRECT whatever the offset (only the first chunk
        // of an unaligned transfer has a skew).
        let skew = ((file_offset + done as u64) % PAGE_SIZE) as usize;
        let want = (chunk_size - skew).min(len - done);
        let mut buffer = next_buffer(&pool, &mut in_flight)?;
        let at = file_offset + done as u64;
        let got = host_io::read_piece(state, &mut buffer[skew..skew + want], at, plan)?;
        if got > 0 {
            let copy = stream.start_raw(
                buffer,
                skew,
                got,
                dst,
                dst_offset + done,
                CopyDirection::HostToDevice,
            )?;
            if let Some(previous) = in_flight.replace(copy) {
                previous.wait()?;
            }
        }
        done += got;
        if got < want {
            break; // end of file
        }
    }
    if let Some(last) = in_flight {
        last.wait()?;
    }
    Ok(done)
}

/// Device -> file for `src[src_offset..src_offset + len]` at `file_offset`.
fn write_span(
    state: &HandleState,
    src: RawRegion,
    src_offset: usize,
    len: usize,
    file_offset: u64,
) -> Result<usize> {
    // The pool thread's share of the transfer, on its own timeline.
    let _range = crate::profiling::Range::new(c"gpumap::write_device");
    let (pool, stream) = staging(state, src.ordinal)?;
    let chunk_size = pool.buffer_size();
    let start = |buffer: BounceBuffer, done: usize| -> Result<Chunk> {
        // Placed as in `read_span`, so the aligned middle can go out with O_DIRECT.
        let skew = ((file_offset + done as u64) % PAGE_SIZE) as usize;
        let n = (chunk_size - skew).min(len - done);
        let copy = stream.start_raw(
            buffer,
            skew,
            n,
            src,
            src_offset + done,
            CopyDirection::DeviceToHost,
        )?;
        Ok(Chunk { copy, skew, len: n, file_offset: file_offset + done as u64 })
    };
    if len == 0 {
        return Ok(0);
    }
    let first = start(pool.acquire()?, 0)?;
    let mut next_start = first.len;
    let mut in_flight = Some(first);
    while let Some(chunk) = in_flight.take() {
        let buffer = chunk.copy.wait()?;
        // Start the next download before writing this chunk, when a buffer is free.
        if next_start < len {
            if let Some(spare) = pool.try_acquire()? {
                let next = start(spare, next_start)?;
                next_start += next.len;
                in_flight = Some(next);
            }
        }
        host_io::write_piece(
            state,
            &buffer[chunk.skew..chunk.skew + chunk.len],
            chunk.file_offset,
        )?;
        if in_flight.is_none() && next_start < len {
            let next = start(buffer, next_start)?;
            next_start += next.len;
            in_flight = Some(next);
        }
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn pipeline_chunks_fit_the_buffer_and_overlap_where_they_can(
            len in 1usize..(256 << 20),
            buffer_pages in 1usize..4096,
        ) {
            let buffer = buffer_pages * PAGE_SIZE as usize;
            let chunk = pipeline_chunk(len, buffer);
            prop_assert!(chunk <= buffer && chunk.is_multiple_of(PAGE_SIZE as usize));
            prop_assert!(chunk >= PIPELINE_MIN_CHUNK.min(buffer));
            // Enough chunks to overlap reading with copying, unless that would take them below
            // the floor; whole buffers where those already give enough.
            let floor = PIPELINE_MIN_CHUNK.min(buffer);
            prop_assert!(chunk == buffer || chunk == floor || len.div_ceil(chunk) >= PIPELINE_MIN_STEPS);
            if len >= PIPELINE_MIN_STEPS * buffer {
                prop_assert_eq!(chunk, buffer);
            }
        }
    }
}
