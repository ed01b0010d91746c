//! [`FileHandle`] transfers to and from device memory.
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
//! A [`DeviceRegion`] does not keep its memory alive: it must stay allocated until the call (or
//! the [`IoFuture`]) completes.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::Arc;

use crate::align::{align_up, checked_end, split_tasks, PAGE_SIZE};
use crate::error::Result;
use crate::io::compat::IoPath;
use crate::io::file_handle::{expect_len, FileHandle, Inner, ReadPlan};
use crate::io::gds::{AsyncIo, BatchRead, CuFileHandle, RegisteredBuffer};
use crate::io::pool::{Completer, IoFuture};
use crate::memory::bounce::{BounceBuffer, BouncePool};
use crate::memory::cuda::{CudaDevice, DeviceRegion, InFlight, Stream};

impl FileHandle {
    /// Reads into device memory `dst` from `offset`, in parallel; returns the count read, short
    /// only where the file ends first.
    pub fn read_device(&self, dst: DeviceRegion, offset: u64) -> Result<usize> {
        let inner = &self.inner;
        inner.check_read()?;
        checked_end(offset, dst.len() as u64)?;
        match inner.cufile_for(dst.len()) {
            Some(gds) => inner.run_cufile(gds, dst, offset, true),
            None => {
                let tasks = split_tasks(offset, dst.len() as u64, inner.span_size(dst.len()));
                let plan = inner.read_plan(offset, dst.len() as u64);
                inner.pool.run(tasks, |t| {
                    inner.read_span(dst, t.buf_offset as usize, t.len as usize, t.offset, plan)
                })
            }
        }
    }

    /// Reads exactly `dst.len()` bytes into device memory, or fails with
    /// [`crate::Error::UnexpectedEof`].
    pub fn read_device_exact(&self, dst: DeviceRegion, offset: u64) -> Result<()> {
        let got = self.read_device(dst, offset)?;
        expect_len(offset, dst.len(), got)
    }

    /// Writes all of device memory `src` at `offset`, in parallel; returns `src.len()`.
    pub fn write_device(&self, src: DeviceRegion, offset: u64) -> Result<usize> {
        let inner = &self.inner;
        inner.check_positional_write()?;
        checked_end(offset, src.len() as u64)?;
        match inner.cufile_for(src.len()) {
            Some(gds) => inner.run_cufile(gds, src, offset, false),
            None => {
                let tasks = split_tasks(offset, src.len() as u64, inner.span_size(src.len()));
                inner.pool.run(tasks, |t| {
                    inner.write_span(src, t.buf_offset as usize, t.len as usize, t.offset)
                })
            }
        }
    }

    /// Starts [`read_device`](Self::read_device) on the pool.
    ///
    /// Small reads on the POSIX path (at most a quarter of a bounce buffer) that are in flight
    /// together are coalesced: they queue on the handle, and pool threads take them in groups
    /// that go through [`read_device_batch`](Self::read_device_batch)'s path — one pinned
    /// buffer and one host-to-device copy per run of adjacent destinations instead of one per
    /// read. A lone read is taken alone, at once.
    pub fn pread_device(&self, dst: DeviceRegion, offset: u64) -> IoFuture<usize> {
        let inner = &self.inner;
        let small = !dst.is_empty() && dst.len() as u64 <= inner.bounce_buffer_size / 4;
        if small
            && inner.check_read().is_ok()
            && checked_end(offset, dst.len() as u64).is_ok()
            && inner.cufile_for(dst.len()).is_none()
        {
            return self.enqueue_small_read(DeviceRead { dst, offset });
        }
        let handle = self.clone();
        inner.pool.spawn(move || handle.read_device(dst, offset))
    }

    fn enqueue_small_read(&self, read: DeviceRead) -> IoFuture<usize> {
        let (future, completer) = IoFuture::pending();
        let start_drainer = {
            let mut queue = self.inner.small_reads.lock();
            queue.waiting.push_back((read, completer));
            let start = queue.drainers < self.inner.pool.nthreads();
            if start {
                queue.drainers += 1;
            }
            start
        };
        if start_drainer {
            let handle = self.clone();
            self.inner.pool.spawn_detached(move || handle.drain_small_reads());
        }
        future
    }

    /// A drainer: takes groups of queued small reads (a fair share of the queue, within one
    /// bounce buffer, one device) until the queue is empty.
    fn drain_small_reads(&self) {
        let inner = &self.inner;
        let capacity = inner.bounce_buffer_size as usize;
        loop {
            let group = {
                let mut queue = inner.small_reads.lock();
                if queue.waiting.is_empty() {
                    queue.drainers -= 1;
                    return;
                }
                let share = queue.waiting.len().div_ceil(inner.pool.nthreads());
                let mut group: Vec<(DeviceRead, Completer<usize>)> = Vec::new();
                let mut bytes = 0usize;
                while let Some((next, _)) = queue.waiting.front() {
                    let fits = group.is_empty()
                        || (group.len() < share
                            && bytes + next.dst.len() <= capacity
                            && next.dst.device_ordinal() == group[0].0.dst.device_ordinal());
                    if !fits {
                        break;
                    }
                    bytes += next.dst.len();
                    group.extend(queue.waiting.pop_front());
                }
                group
            };
            let (reads, completers): (Vec<DeviceRead>, Vec<Completer<usize>>) =
                group.into_iter().unzip();
            let mut counts = vec![0usize; reads.len()];
            match inner.read_group(&reads, &mut counts) {
                Ok(_) => {
                    for (completer, n) in completers.into_iter().zip(counts) {
                        completer.complete(Ok(n));
                    }
                }
                // Each read again on its own, so each future gets its own answer.
                Err(_) => {
                    for (completer, r) in completers.into_iter().zip(&reads) {
                        completer.complete(self.read_device(r.dst, r.offset));
                    }
                }
            }
        }
    }

    /// Starts [`write_device`](Self::write_device) on the pool.
    pub fn pwrite_device(&self, src: DeviceRegion, offset: u64) -> IoFuture<usize> {
        let handle = self.clone();
        self.inner.pool.spawn(move || handle.write_device(src, offset))
    }
}

/// A stream-ordered transfer started by [`FileHandle::read_async`] or
/// [`FileHandle::write_async`].
#[derive(Debug)]
#[must_use = "wait() gives the count (and the error, if any)"]
pub struct StreamTransfer {
    state: StreamState,
}

#[derive(Debug)]
enum StreamState {
    /// The POSIX path ran in stream order before the call returned.
    Done(usize),
    /// `cuFileReadAsync`/`cuFileWriteAsync` queued on the stream.
    CuFile(AsyncIo),
}

impl StreamTransfer {
    /// Blocks until the stream has carried out the transfer; returns the bytes moved.
    pub fn wait(self) -> Result<usize> {
        match self.state {
            StreamState::Done(n) => Ok(n),
            StreamState::CuFile(io) => io.wait(),
        }
    }
}

impl FileHandle {
    /// A read into `dst` ordered on `stream`: it sees the work queued on `stream` before the
    /// call, and work queued after the call sees its data.
    ///
    /// On the cuFile path this is `cuFileReadAsync`: the call returns at once and the read
    /// runs when the stream reaches it. On the POSIX path (and below `gds_threshold`) there is
    /// no way to run `pread` inside a stream, so — like KvikIO's compatibility mode — the
    /// stream is synchronized, the read runs in parallel on the pool, and the call returns
    /// when it is done; [`StreamTransfer::wait`] then returns at once.
    pub fn read_async(
        &self,
        dst: DeviceRegion,
        offset: u64,
        stream: &Stream,
    ) -> Result<StreamTransfer> {
        self.stream_ordered(dst, offset, stream, false)
    }

    /// A write of `src` ordered on `stream` (see [`read_async`](Self::read_async)).
    pub fn write_async(
        &self,
        src: DeviceRegion,
        offset: u64,
        stream: &Stream,
    ) -> Result<StreamTransfer> {
        self.stream_ordered(src, offset, stream, true)
    }

    /// Registers `region` with cuFile (`cuFileBufRegister`) for the life of the returned guard,
    /// as KvikIO's `buffer_register`: worthwhile for a buffer that is the target of many
    /// transfers on the cuFile path. On the POSIX path there is nothing to register and this
    /// returns `Ok(None)`.
    #[doc(alias = "cuFileBufRegister")]
    pub fn buffer_register(&self, region: DeviceRegion) -> Result<Option<RegisteredBuffer>> {
        match self.inner.decision() {
            (decision, Some(_)) if decision.path == IoPath::CuFile => {
                CuFileHandle::register_buffer(region).map(Some)
            }
            _ => Ok(None),
        }
    }

    fn stream_ordered(
        &self,
        region: DeviceRegion,
        offset: u64,
        stream: &Stream,
        write: bool,
    ) -> Result<StreamTransfer> {
        let inner = &self.inner;
        if write {
            inner.check_positional_write()?;
        } else {
            inner.check_read()?;
        }
        checked_end(offset, region.len() as u64)?;
        if region.device_ordinal() != stream.device().ordinal() {
            return Err(crate::Error::InvalidArgument(format!(
                "region is on device {} but the stream on device {}",
                region.device_ordinal(),
                stream.device().ordinal()
            )));
        }
        if let Some(gds) = inner.cufile_for(region.len()) {
            let io = if write {
                gds.write_async(stream, region, 0, region.len(), offset)?
            } else {
                gds.read_async(stream, region, 0, region.len(), offset)?
            };
            return Ok(StreamTransfer { state: StreamState::CuFile(io) });
        }
        stream.synchronize()?;
        let n = if write {
            self.write_device(region, offset)?
        } else {
            self.read_device(region, offset)?
        };
        Ok(StreamTransfer { state: StreamState::Done(n) })
    }
}

/// Small `pread_device` calls waiting to be coalesced, and the drainers taking them.
#[derive(Default)]
pub(super) struct SmallReads {
    waiting: VecDeque<(DeviceRead, Completer<usize>)>,
    drainers: usize,
}

/// One read of a batch: the bytes of the file at `offset` go to `dst` (all of it, unless the
/// file ends first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRead {
    /// Destination device memory; its length is the read's length.
    pub dst: DeviceRegion,
    /// File offset.
    pub offset: u64,
}

impl FileHandle {
    /// Reads many (typically small, scattered) pieces into device memory and returns each
    /// one's count, in order (short only where the file ends first).
    ///
    /// Where the file takes the cuFile path, the batch goes through cuFile's batch API (see
    /// `read_batch_cufile`). On the POSIX path:
    /// many small reads are limited by the cost of one host-to-device copy each (about 8 µs,
    /// and serialised in the driver), not by the disk or the page cache. A batch pays it once
    /// per *run* instead: the pieces are read into a pinned buffer packed in list order, and
    /// pieces whose destinations follow one another in device memory (`dst` of one ending where
    /// the next begins) go up in a single copy. Order the list by destination to get the most
    /// out of it. Pieces larger than a bounce buffer take the ordinary path.
    pub fn read_device_batch(&self, reads: &[DeviceRead]) -> Result<Vec<usize>> {
        let inner = &self.inner;
        inner.check_read()?;
        for r in reads {
            checked_end(r.offset, r.dst.len() as u64)?;
            if r.dst.device_ordinal() != reads[0].dst.device_ordinal() {
                return Err(crate::Error::InvalidArgument(format!(
                    "a batch reads into one device; it mixes devices {} and {}",
                    reads[0].dst.device_ordinal(),
                    r.dst.device_ordinal()
                )));
            }
        }
        if let (decision, Some(gds)) = inner.decision() {
            if decision.path == IoPath::CuFile {
                return self.read_batch_cufile(gds, reads);
            }
        }
        let mut counts = vec![0usize; reads.len()];
        let groups = group_reads(reads, inner.bounce_buffer_size as usize);
        let mut items = Vec::with_capacity(groups.len());
        let mut rest = counts.as_mut_slice();
        for range in groups {
            let (out, tail) = rest.split_at_mut(range.len());
            items.push((&reads[range], out));
            rest = tail;
        }
        inner.pool.run(items, |(group, out)| {
            if let [single] = group {
                if single.dst.len() > inner.bounce_buffer_size as usize {
                    out[0] = self.read_device(single.dst, single.offset)?;
                    return Ok(out[0]);
                }
            }
            inner.read_group(group, out)
        })?;
        Ok(counts)
    }

    /// A batch on the cuFile path: cuFile's batch API (`cuFileBatchIOSubmit`), which with
    /// GPUDirect Storage reads every piece straight into device memory, many in flight at once.
    /// Pieces are clipped to the file's length first, so the batch never asks cuFile to read
    /// past the end (what it does there is not documented).
    fn read_batch_cufile(&self, gds: &CuFileHandle, reads: &[DeviceRead]) -> Result<Vec<usize>> {
        let file_len = self.len()?;
        let mut ios = Vec::with_capacity(reads.len());
        let mut slots = Vec::with_capacity(reads.len());
        for (i, r) in reads.iter().enumerate() {
            let len = file_len.saturating_sub(r.offset).min(r.dst.len() as u64) as usize;
            if len > 0 {
                ios.push(BatchRead { dst: r.dst, dst_offset: 0, len, file_offset: r.offset });
                slots.push(i);
            }
        }
        let mut counts = vec![0usize; reads.len()];
        for (slot, result) in slots.into_iter().zip(gds.read_batch(&ios)?) {
            counts[slot] = result?;
        }
        Ok(counts)
    }

    /// Starts [`read_device_batch`](Self::read_device_batch) on the pool.
    pub fn pread_device_batch(&self, reads: Vec<DeviceRead>) -> IoFuture<Vec<usize>> {
        let handle = self.clone();
        self.inner.pool.spawn(move || handle.read_device_batch(&reads))
    }
}

/// Cuts `reads` into consecutive groups that each fit one staging buffer of `capacity` bytes
/// (a piece larger than that is a group of its own).
fn group_reads(reads: &[DeviceRead], capacity: usize) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let (mut start, mut bytes) = (0usize, 0usize);
    for (i, r) in reads.iter().enumerate() {
        if i > start && bytes + r.dst.len() > capacity {
            groups.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += r.dst.len();
    }
    if start < reads.len() {
        groups.push(start..reads.len());
    }
    groups
}

/// Bounce-buffer chunks per task on the POSIX device path (see `Inner::span_size`).
const PIPELINE_CHUNKS: u64 = 16;

/// A chunk on its way from device to file: the download in flight, and where it goes.
struct Chunk {
    copy: InFlight<BounceBuffer>,
    /// Where the chunk starts in its buffer.
    skew: usize,
    len: usize,
    file_offset: u64,
}

impl Inner {
    /// The cuFile handle when a device transfer of `len` bytes takes the cuFile path (cuFile
    /// chosen for the file and `len` at least `gds_threshold`); `None` for the POSIX path.
    fn cufile_for(&self, len: usize) -> Option<&CuFileHandle> {
        let (decision, gds) = self.decision();
        gds.as_ref().filter(|_| decision.path == IoPath::CuFile && len as u64 >= self.gds_threshold)
    }

    /// The task size on the POSIX device path: [`PIPELINE_CHUNKS`] bounce buffers, so that a
    /// task pipelines its chunks on one thread, but no more than a quarter of one thread's
    /// share (every thread gets several tasks, so none straggles at the end), and never less
    /// than `task_size` or one bounce buffer.
    ///
    /// Measured on the H200 test machine (2026-11-21, 4 GiB warm, 16 threads): 4 MiB chunks in
    /// 64 MiB tasks 51.6 GB/s; 4 MiB chunks in 4 MiB tasks (KvikIO's shape) 46.1; 16 MiB chunks
    /// in 16 MiB tasks 41.4; 16 MiB chunks in 256 MiB tasks 33.3.
    fn span_size(&self, len: usize) -> u64 {
        let chunk = self.bounce_buffer_size;
        let share = (len as u64) / (4 * self.pool.nthreads() as u64);
        let span = (PIPELINE_CHUNKS * chunk).min(share).max(self.task_size).max(chunk);
        align_up(span, PAGE_SIZE).unwrap_or(span)
    }

    fn run_cufile(
        &self,
        gds: &CuFileHandle,
        region: DeviceRegion,
        offset: u64,
        read: bool,
    ) -> Result<usize> {
        let tasks = split_tasks(offset, region.len() as u64, self.task_size);
        self.pool.run(tasks, |t| {
            let (at, len) = (t.buf_offset as usize, t.len as usize);
            if read {
                gds.read(region, at, len, t.offset)
            } else {
                gds.write(region, at, len, t.offset)
            }
        })
    }

    fn staging(&self, ordinal: usize) -> Result<(Arc<BouncePool>, std::rc::Rc<Stream>)> {
        let device = CudaDevice::new(ordinal)?;
        device.bind_to_thread()?;
        let pool = BouncePool::for_device(
            &device,
            self.bounce_buffer_size as usize,
            2 * self.pool.nthreads(),
        )?;
        Ok((pool, Stream::for_current_thread(&device)?))
    }

    /// A second buffer for double-buffering, or — when the pool is exhausted by other
    /// transfers — the buffer of the copy in flight once it is done. Never blocks while
    /// holding a buffer, so workers cannot deadlock on the pool.
    fn next_buffer(
        pool: &Arc<BouncePool>,
        in_flight: &mut Option<InFlight<BounceBuffer>>,
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
    fn read_span(
        &self,
        dst: DeviceRegion,
        dst_offset: usize,
        len: usize,
        file_offset: u64,
        plan: ReadPlan,
    ) -> Result<usize> {
        let (pool, stream) = self.staging(dst.device_ordinal())?;
        let chunk_size = pool.buffer_size();
        let mut in_flight: Option<InFlight<BounceBuffer>> = None;
        let mut done = 0usize;
        while done < len {
            // Bytes land in the buffer at the file offset's place within its page, so that
            // buffer and file line up for O_DIRECT whatever the offset (only the first chunk
            // of an unaligned transfer has a skew).
            let skew = ((file_offset + done as u64) % PAGE_SIZE) as usize;
            let want = (chunk_size - skew).min(len - done);
            let mut buffer = Self::next_buffer(&pool, &mut in_flight)?;
            let at = file_offset + done as u64;
            let got = self.read_piece(&mut buffer[skew..skew + want], at, plan)?;
            if got > 0 {
                let copy = stream.upload_from(buffer, skew, got, dst, dst_offset + done)?;
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

    /// One batch group: every piece read into one bounce buffer, packed; then one copy per run
    /// of pieces whose destinations are adjacent (a short read ends its run, so the bytes
    /// after it in the destination are left as they were).
    fn read_group(&self, group: &[DeviceRead], counts: &mut [usize]) -> Result<usize> {
        let Some(first) = group.first() else { return Ok(0) };
        let (pool, stream) = self.staging(first.dst.device_ordinal())?;
        let mut buffer = pool.acquire()?;
        let mut packed = 0usize;
        for (r, count) in group.iter().zip(counts.iter_mut()) {
            let len = r.dst.len();
            let plan = self.read_plan(r.offset, len as u64);
            *count = self.read_piece(&mut buffer[packed..packed + len], r.offset, plan)?;
            packed += len;
        }
        // Runs: [run_start, i) with adjacent destinations and full reads (but the last).
        let mut total = 0usize;
        let (mut run_start, mut run_packed) = (0usize, 0usize);
        let mut packed = 0usize;
        for i in 0..group.len() {
            let r = &group[i];
            let ends_run = i + 1 == group.len()
                || counts[i] < r.dst.len()
                || group[i + 1].dst.device_ordinal() != r.dst.device_ordinal()
                || group[i + 1].dst.ptr() != r.dst.ptr() + r.dst.len() as u64;
            packed += r.dst.len();
            if ends_run {
                let run_dst = group[run_start].dst;
                let run_len = packed - run_packed - (r.dst.len() - counts[i]);
                if run_len > 0 {
                    // The run's destination spans from its first piece's start onwards;
                    // adjacency was checked piece by piece, so it is one device range.
                    let target =
                        DeviceRegion::from_parts(run_dst.ptr(), run_len, run_dst.device_ordinal());
                    buffer = stream.upload_from(buffer, run_packed, run_len, target, 0)?.wait()?;
                }
                total += run_len;
                (run_start, run_packed) = (i + 1, packed);
            }
        }
        Ok(total)
    }

    /// Device -> file for `src[src_offset..src_offset + len]` at `file_offset`.
    fn write_span(
        &self,
        src: DeviceRegion,
        src_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<usize> {
        let (pool, stream) = self.staging(src.device_ordinal())?;
        let chunk_size = pool.buffer_size();
        let start = |buffer: BounceBuffer, done: usize| -> Result<Chunk> {
            // Placed as in `read_span`, so the aligned middle can go out with O_DIRECT.
            let skew = ((file_offset + done as u64) % PAGE_SIZE) as usize;
            let n = (chunk_size - skew).min(len - done);
            let copy = stream.download_to(src, src_offset + done, buffer, skew, n)?;
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
            self.write_piece(&buffer[chunk.skew..chunk.skew + chunk.len], chunk.file_offset)?;
            if in_flight.is_none() && next_start < len {
                let next = start(buffer, next_start)?;
                next_start += next.len;
                in_flight = Some(next);
            }
        }
        Ok(len)
    }
}
