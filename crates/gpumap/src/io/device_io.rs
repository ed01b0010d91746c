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
//! Calls that return before the transfer is done take owned memory ([`OwnedDeviceMemory`]) or
//! borrow it in their guard ([`StreamTransfer`]), so memory cannot be freed under a transfer.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::align::{align_up, checked_end, split_tasks, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::io::compat::IoPath;
use crate::io::file_handle::{FileHandle, Inner, ReadPlan};
use crate::io::gds::{AsyncIo, CuFileHandle, RawBatchRead, RegisteredBuffer};
use crate::io::pool::{delivered_prefix, IoFuture};
use crate::memory::bounce::{BounceBuffer, BouncePool};
use crate::memory::cuda::{
    BatchCopier, CopyDirection, CudaDevice, CudaView, CudaViewMut, DeviceCopy, InFlight, RawRegion,
    Stream,
};
use crate::memory::{DeviceView, DeviceViewMut, OwnedDeviceMemory, OwnedDeviceSource};

impl FileHandle {
    /// Reads into `dst` — device memory, or host memory standing in for it — from `offset`, in
    /// parallel; returns the count read, short only where the file ends first.
    ///
    /// `dst` is anything that becomes a [`DeviceViewMut`]: `&mut DeviceBuffer`,
    /// `buffer.view_mut()`, a [`CudaViewMut`], `&mut [u8]`.
    pub fn read_device<'a>(&self, dst: impl Into<DeviceViewMut<'a>>, offset: u64) -> Result<usize> {
        match dst.into() {
            DeviceViewMut::Host(bytes) => self.read(bytes, offset),
            DeviceViewMut::Cuda(view) => self.inner.read_cuda(view.raw, offset),
        }
    }

    /// Reads exactly `dst.len()` bytes into `dst`, or fails with
    /// [`crate::Error::UnexpectedEof`].
    pub fn read_device_exact<'a>(
        &self,
        dst: impl Into<DeviceViewMut<'a>>,
        offset: u64,
    ) -> Result<()> {
        let dst = dst.into();
        let wanted = dst.len() as u64;
        let got = self.read_device(dst, offset)?;
        self.expect_len(offset, wanted, got as u64)
    }

    /// Writes all of `src` — device memory, or host memory standing in for it — at `offset`,
    /// in parallel; returns `src.len()`.
    pub fn write_device<'a>(&self, src: impl Into<DeviceView<'a>>, offset: u64) -> Result<usize> {
        match src.into() {
            DeviceView::Host(bytes) => self.write(bytes, offset),
            DeviceView::Cuda(view) => self.inner.write_cuda(view.raw, offset),
        }
    }

    /// Starts [`read_device`](Self::read_device) into the owned `dst` on the pool; the future
    /// gives back `dst` and the count read.
    ///
    /// Small reads into GPU memory on the POSIX path (at most a quarter of a bounce buffer)
    /// that are in flight together are coalesced: they queue on the handle, and pool threads
    /// take them in groups that go through [`read_device_batch`](Self::read_device_batch)'s
    /// path — one pinned buffer and one host-to-device copy per run of adjacent destinations
    /// instead of one per read. A lone read is taken alone, at once.
    pub fn pread_device<B: OwnedDeviceMemory>(&self, dst: B, offset: u64) -> IoFuture<(B, usize)> {
        // Boxed first, so the memory the queue points at cannot move with `dst`.
        let mut dst = Box::new(dst);
        let inner = &self.inner;
        if let DeviceViewMut::Cuda(view) = dst.device_view_mut() {
            let raw = view.raw;
            let small = raw.len != 0 && raw.len as u64 <= inner.bounce_buffer_size / 4;
            if small
                && inner.check_read().is_ok()
                && checked_end(offset, raw.len as u64).is_ok()
                && inner.cufile_for(raw.len).is_none()
            {
                let (future, completer) = IoFuture::pending();
                let finish = Box::new(move |result: Result<usize>| {
                    completer.complete(result.map(|n| (*dst, n)));
                });
                self.enqueue_small_read(QueuedRead { dst: raw, offset, finish });
                return future;
            }
        }
        let handle = self.clone();
        inner.pool.spawn(move || {
            let n = handle.read_device(dst.device_view_mut(), offset)?;
            Ok((*dst, n))
        })
    }

    fn enqueue_small_read(&self, read: QueuedRead) {
        let start_drainer = {
            let mut queue = self.inner.small_reads.lock();
            queue.waiting.push_back(read);
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
                let mut group: Vec<QueuedRead> = Vec::new();
                let mut bytes = 0usize;
                while let Some(next) = queue.waiting.front() {
                    let fits = group.is_empty()
                        || (group.len() < share
                            && bytes + next.dst.len <= capacity
                            && next.dst.ordinal == group[0].dst.ordinal);
                    if !fits {
                        break;
                    }
                    bytes += next.dst.len;
                    group.extend(queue.waiting.pop_front());
                }
                group
            };
            let reads: Vec<(RawRegion, u64)> = group.iter().map(|r| (r.dst, r.offset)).collect();
            let mut counts = vec![0usize; reads.len()];
            match inner.read_group(&reads, &mut counts) {
                Ok(_) => {
                    for (read, n) in group.into_iter().zip(counts) {
                        (read.finish)(Ok(n));
                    }
                }
                // Each read again on its own, so each future gets its own answer.
                Err(_) => {
                    for read in group {
                        (read.finish)(inner.read_cuda(read.dst, read.offset));
                    }
                }
            }
        }
    }

    /// File -> GPU memory the crate keeps live for the call (a pinned map range), in tasks of
    /// at least `min_task` bytes on the POSIX path (0: as `read_device` splits it). A larger
    /// least task suits reads that run many at once (a cache's read-ahead): concurrency comes
    /// from the other reads, and each task's deeper pipeline is worth more than spreading one
    /// read over every thread.
    pub(crate) fn read_cuda_raw_in_tasks(
        &self,
        dst: RawRegion,
        offset: u64,
        min_task: u64,
    ) -> Result<usize> {
        self.inner.read_cuda_in_tasks(dst, offset, min_task)
    }

    /// GPU memory the crate keeps live for the call -> file.
    pub(crate) fn write_cuda_raw(&self, src: RawRegion, offset: u64) -> Result<usize> {
        self.inner.write_cuda(src, offset)
    }

    /// Starts [`write_device`](Self::write_device) of the owned `src` on the pool; the future
    /// gives back `src` and the count written.
    pub fn pwrite_device<B: OwnedDeviceSource>(&self, src: B, offset: u64) -> IoFuture<(B, usize)> {
        let handle = self.clone();
        self.inner.pool.spawn(move || {
            let n = handle.write_device(src.device_view(), offset)?;
            Ok((src, n))
        })
    }
}

/// A stream-ordered transfer started by [`FileHandle::read_async`] or
/// [`FileHandle::write_async`]; it borrows the device memory until it is waited for (dropping
/// it waits too).
#[derive(Debug)]
#[must_use = "wait() gives the count (and the error, if any)"]
pub struct StreamTransfer<'a> {
    state: StreamState,
    _memory: PhantomData<&'a mut [u8]>,
}

#[derive(Debug)]
enum StreamState {
    /// The POSIX path ran in stream order before the call returned.
    Done(usize),
    /// `cuFileReadAsync`/`cuFileWriteAsync` queued on the stream.
    CuFile(AsyncIo<'static>),
}

impl StreamTransfer<'_> {
    /// Blocks until the stream has carried out the transfer; returns the bytes moved.
    pub fn wait(self) -> Result<usize> {
        match self.state {
            StreamState::Done(n) => Ok(n),
            StreamState::CuFile(io) => io.wait(),
        }
    }
}

impl FileHandle {
    /// A read into GPU memory `dst` ordered on `stream`: it sees the work queued on `stream`
    /// before the call, and work queued after the call sees its data.
    ///
    /// On the cuFile path this is `cuFileReadAsync`: the call returns at once and the read
    /// runs when the stream reaches it. On the POSIX path (and below `gds_threshold`) there is
    /// no way to run `pread` inside a stream, so — like KvikIO's compatibility mode — the
    /// stream is synchronized, the read runs in parallel on the pool, and the call returns
    /// when it is done; [`StreamTransfer::wait`] then returns at once.
    pub fn read_async<'a>(
        &self,
        dst: CudaViewMut<'a>,
        offset: u64,
        stream: &Stream,
    ) -> Result<StreamTransfer<'a>> {
        self.stream_ordered(dst.raw, offset, stream, false)
    }

    /// A write of GPU memory `src` ordered on `stream` (see [`read_async`](Self::read_async)).
    pub fn write_async<'a>(
        &self,
        src: CudaView<'a>,
        offset: u64,
        stream: &Stream,
    ) -> Result<StreamTransfer<'a>> {
        self.stream_ordered(src.raw, offset, stream, true)
    }

    /// Registers `region` with cuFile (`cuFileBufRegister`) for the life of the returned guard,
    /// as KvikIO's `buffer_register`: worthwhile for a buffer that is the target of many
    /// transfers on the cuFile path. On the POSIX path there is nothing to register and this
    /// returns `Ok(None)`.
    #[doc(alias = "cuFileBufRegister")]
    pub fn buffer_register<'a>(
        &self,
        region: CudaView<'a>,
    ) -> Result<Option<RegisteredBuffer<'a>>> {
        match self.inner.decision() {
            (decision, Some(_)) if decision.path == IoPath::CuFile => {
                CuFileHandle::register_buffer(region).map(Some)
            }
            _ => Ok(None),
        }
    }

    fn stream_ordered<'a>(
        &self,
        region: RawRegion,
        offset: u64,
        stream: &Stream,
        write: bool,
    ) -> Result<StreamTransfer<'a>> {
        let inner = &self.inner;
        if write {
            inner.check_positional_write()?;
        } else {
            inner.check_read()?;
        }
        checked_end(offset, region.len as u64)?;
        if region.ordinal != stream.device().ordinal() {
            return Err(Error::InvalidArgument(format!(
                "memory is on device {} but the stream on device {}",
                region.ordinal,
                stream.device().ordinal()
            )));
        }
        let state = if let Some(gds) = inner.cufile_for(region.len) {
            StreamState::CuFile(gds.start_async(stream, write, region, 0, region.len, offset)?)
        } else {
            stream.synchronize()?;
            StreamState::Done(if write {
                inner.write_cuda(region, offset)?
            } else {
                inner.read_cuda(region, offset)?
            })
        };
        Ok(StreamTransfer { state, _memory: PhantomData })
    }
}

/// A small `pread_device` waiting to be coalesced: where it goes, and how its future is
/// completed (the closure owns the caller's memory until then).
pub(super) struct QueuedRead {
    dst: RawRegion,
    offset: u64,
    finish: Box<dyn FnOnce(Result<usize>) + Send>,
}

/// Small `pread_device` calls waiting to be coalesced, and the drainers taking them.
#[derive(Default)]
pub(super) struct SmallReads {
    waiting: VecDeque<QueuedRead>,
    drainers: usize,
}

/// One read of a batch: the bytes of the file at `offset` go to `dst` (all of it, unless the
/// file ends first).
#[derive(Debug)]
pub struct DeviceRead<'a> {
    /// Destination memory; its length is the read's length.
    pub dst: DeviceViewMut<'a>,
    /// File offset.
    pub offset: u64,
}

/// One piece of [`FileHandle::pread_device_batch`]: `len` bytes at file `offset` into the
/// buffer at `dst_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPiece {
    /// Where the piece goes in the buffer.
    pub dst_offset: usize,
    /// Bytes to read.
    pub len: usize,
    /// Where the piece comes from in the file.
    pub offset: u64,
}

impl FileHandle {
    /// Reads many (typically small, scattered) pieces into device memory — or host memory
    /// standing in for it — and returns each one's count, in order (short only where the file
    /// ends first). All destinations must be on one device.
    ///
    /// Where the file takes the cuFile path, the batch goes through cuFile's batch API (see
    /// `read_batch_cufile`). On the POSIX path:
    /// many small reads are limited by the cost of one host-to-device copy each (about 8 µs,
    /// and serialised in the driver), not by the disk or the page cache. A batch pays it once
    /// per *run* instead: the pieces are read into a pinned buffer packed in list order, and
    /// pieces whose destinations follow one another in device memory (`dst` of one ending where
    /// the next begins) go up in a single copy. Order the list by destination to get the most
    /// out of it. Pieces larger than a bounce buffer take the ordinary path. Into host memory,
    /// each piece is read straight into its destination, in parallel.
    pub fn read_device_batch(&self, reads: &mut [DeviceRead<'_>]) -> Result<Vec<usize>> {
        let inner = &self.inner;
        inner.check_read()?;
        let Some(first) = reads.first() else { return Ok(Vec::new()) };
        let device = first.dst.device_ordinal();
        for r in reads.iter() {
            checked_end(r.offset, r.dst.len() as u64)?;
            if r.dst.device_ordinal() != device {
                return Err(Error::InvalidArgument(format!(
                    "a batch reads into one device; it mixes {} and {}",
                    describe_ordinal(device),
                    describe_ordinal(r.dst.device_ordinal())
                )));
            }
        }
        if device.is_none() {
            return self.read_host_batch(reads);
        }
        let raw = reads
            .iter()
            .map(|r| match &r.dst {
                DeviceViewMut::Cuda(v) => Ok((v.raw, r.offset)),
                DeviceViewMut::Host(_) => Err(mixed_batch()),
            })
            .collect::<Result<Vec<(RawRegion, u64)>>>()?;
        inner.read_cuda_batch(&raw)
    }

    /// A batch into host memory: every piece read straight into its destination, in parallel
    /// on the pool.
    fn read_host_batch(&self, reads: &mut [DeviceRead<'_>]) -> Result<Vec<usize>> {
        let inner = &self.inner;
        let mut counts = vec![0usize; reads.len()];
        let items: Vec<(&mut [u8], u64, &mut usize)> = reads
            .iter_mut()
            .zip(counts.iter_mut())
            .filter_map(|(r, count)| match &mut r.dst {
                DeviceViewMut::Host(bytes) => Some((&mut **bytes, r.offset, count)),
                DeviceViewMut::Cuda(_) => None,
            })
            .collect();
        inner.pool.run(items, |(bytes, offset, count)| {
            let plan = inner.read_plan(offset, bytes.len() as u64);
            *count = inner.read_piece(bytes, offset, plan)?;
            Ok(*count)
        })?;
        Ok(counts)
    }

    /// Starts [`read_device_batch`](Self::read_device_batch) into the owned `dst` on the pool:
    /// each piece's `len` bytes at its file `offset` go to `dst` at its `dst_offset` (pieces may
    /// not overlap in `dst`). The future gives back `dst` and each piece's count.
    pub fn pread_device_batch<B: OwnedDeviceMemory>(
        &self,
        dst: B,
        pieces: Vec<BatchPiece>,
    ) -> IoFuture<(B, Vec<usize>)> {
        let handle = self.clone();
        self.inner.pool.spawn(move || {
            let mut dst = dst;
            let ranges: Vec<(usize, usize)> =
                pieces.iter().map(|p| (p.dst_offset, p.len)).collect();
            let views = dst.device_view_mut().carve(&ranges)?;
            let mut reads: Vec<DeviceRead<'_>> = views
                .into_iter()
                .zip(&pieces)
                .map(|(dst, p)| DeviceRead { dst, offset: p.offset })
                .collect();
            let counts = handle.read_device_batch(&mut reads)?;
            drop(reads);
            Ok((dst, counts))
        })
    }
}

fn describe_ordinal(ordinal: Option<usize>) -> String {
    match ordinal {
        Some(o) => format!("GPU {o}"),
        None => "host memory".to_owned(),
    }
}

fn mixed_batch() -> Error {
    Error::InvalidArgument("a batch reads into one device; it mixes GPU and host memory".into())
}

impl Inner {
    /// File -> GPU memory: the cuFile path, or the pipelined bounce path.
    pub(crate) fn read_cuda(&self, dst: RawRegion, offset: u64) -> Result<usize> {
        self.read_cuda_in_tasks(dst, offset, 0)
    }

    /// [`read_cuda`](Self::read_cuda), in tasks of at least `min_task` bytes on the bounce
    /// path (see `FileHandle::read_cuda_raw_in_tasks`).
    pub(crate) fn read_cuda_in_tasks(
        &self,
        dst: RawRegion,
        offset: u64,
        min_task: u64,
    ) -> Result<usize> {
        let _range = crate::profiling::Range::new(c"gpumap::read_device");
        self.check_read()?;
        checked_end(offset, dst.len as u64)?;
        match self.cufile_for(dst.len) {
            Some(gds) => self.run_cufile(gds, dst, offset, true),
            None => {
                let span = self.span_size(dst.len).max(min_task);
                let tasks = split_tasks(offset, dst.len as u64, span);
                let plan = self.read_plan(offset, dst.len as u64);
                let counts = self.pool.run_each(tasks.clone(), |t| {
                    self.read_span(dst, t.buf_offset as usize, t.len as usize, t.offset, plan)
                })?;
                // A file cut by another process mid-read: only the bytes delivered from the
                // start without a gap count.
                Ok(delivered_prefix(&tasks, &counts))
            }
        }
    }

    /// GPU memory -> file.
    pub(crate) fn write_cuda(&self, src: RawRegion, offset: u64) -> Result<usize> {
        let _range = crate::profiling::Range::new(c"gpumap::write_device");
        self.check_positional_write()?;
        checked_end(offset, src.len as u64)?;
        match self.cufile_for(src.len) {
            Some(gds) => self.run_cufile(gds, src, offset, false),
            None => {
                let tasks = split_tasks(offset, src.len as u64, self.span_size(src.len));
                self.pool.run(tasks, |t| {
                    self.write_span(src, t.buf_offset as usize, t.len as usize, t.offset)
                })
            }
        }
    }

    /// A batch into GPU memory (see [`FileHandle::read_device_batch`]).
    pub(crate) fn read_cuda_batch(&self, reads: &[(RawRegion, u64)]) -> Result<Vec<usize>> {
        let _range = crate::profiling::Range::new(c"gpumap::read_device_batch");
        if let (decision, Some(gds)) = self.decision() {
            if decision.path == IoPath::CuFile {
                return self.read_batch_cufile(gds, reads);
            }
        }
        let mut counts = vec![0usize; reads.len()];
        let groups = group_reads(reads, self.bounce_buffer_size as usize);
        let mut items = Vec::with_capacity(groups.len());
        let mut rest = counts.as_mut_slice();
        for range in groups {
            let (out, tail) = rest.split_at_mut(range.len());
            items.push((&reads[range], out));
            rest = tail;
        }
        self.pool.run(items, |(group, out)| {
            if let [(dst, offset)] = group {
                if dst.len > self.bounce_buffer_size as usize {
                    out[0] = self.read_cuda(*dst, *offset)?;
                    return Ok(out[0]);
                }
            }
            self.read_group(group, out)
        })?;
        Ok(counts)
    }

    /// A batch on the cuFile path: cuFile's batch API (`cuFileBatchIOSubmit`), which with
    /// GPUDirect Storage reads every piece straight into device memory, many in flight at once.
    /// Pieces are clipped to the file's length first, so the batch never asks cuFile to read
    /// past the end (what it does there is not documented).
    fn read_batch_cufile(
        &self,
        gds: &CuFileHandle,
        reads: &[(RawRegion, u64)],
    ) -> Result<Vec<usize>> {
        let file_len = crate::sys::posix::file_len(&self.file, &self.path)?;
        let mut ios = Vec::with_capacity(reads.len());
        let mut slots = Vec::with_capacity(reads.len());
        for (i, (dst, offset)) in reads.iter().enumerate() {
            let len = file_len.saturating_sub(*offset).min(dst.len as u64) as usize;
            if len > 0 {
                ios.push(RawBatchRead { dst: *dst, len, file_offset: *offset });
                slots.push(i);
            }
        }
        let mut counts = vec![0usize; reads.len()];
        for (slot, result) in slots.into_iter().zip(gds.read_batch_raw(&ios)?) {
            counts[slot] = result?;
        }
        Ok(counts)
    }
}

/// Cuts `reads` into consecutive groups that each fit one staging buffer of `capacity` bytes
/// (a piece larger than that is a group of its own).
fn group_reads(reads: &[(RawRegion, u64)], capacity: usize) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let (mut start, mut bytes) = (0usize, 0usize);
    for (i, r) in reads.iter().enumerate() {
        if i > start && bytes + r.0.len > capacity {
            groups.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += r.0.len;
    }
    if start < reads.len() {
        groups.push(start..reads.len());
    }
    groups
}

/// More runs than this in one batch group are placed by the copy kernel, not a copy each.
const SCATTER_MIN_RUNS: usize = 2;

/// Bounce-buffer chunks per task on the POSIX device path (see `Inner::span_size`).
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

impl Inner {
    /// The cuFile handle when a device transfer of `len` bytes takes the cuFile path (cuFile
    /// chosen for the file and `len` at least `gds_threshold`); `None` for the POSIX path.
    pub(crate) fn cufile_for(&self, len: usize) -> Option<&CuFileHandle> {
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
        region: RawRegion,
        offset: u64,
        read: bool,
    ) -> Result<usize> {
        let tasks = split_tasks(offset, region.len as u64, self.task_size);
        let counts = self.pool.run_each(tasks.clone(), |t| {
            let (at, len) = (t.buf_offset as usize, t.len as usize);
            if read {
                gds.read_raw(region, at, len, t.offset)
            } else {
                gds.write_raw(region, at, len, t.offset)
            }
        })?;
        Ok(delivered_prefix(&tasks, &counts))
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
    fn read_span(
        &self,
        dst: RawRegion,
        dst_offset: usize,
        len: usize,
        file_offset: u64,
        plan: ReadPlan,
    ) -> Result<usize> {
        // The pool thread's share of the transfer, on its own timeline.
        let _range = crate::profiling::Range::new(c"gpumap::read_device");
        let (pool, stream) = self.staging(dst.ordinal)?;
        let chunk_size = pipeline_chunk(len, pool.buffer_size());
        let mut in_flight: Option<InFlight<'static, BounceBuffer>> = None;
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

    /// One batch group: every piece read into one bounce buffer, packed; then one copy per run
    /// of pieces whose destinations are adjacent (a short read ends its run, so the bytes
    /// after it in the destination are left as they were).
    pub(crate) fn read_group(
        &self,
        group: &[(RawRegion, u64)],
        counts: &mut [usize],
    ) -> Result<usize> {
        // On the pool thread too: the copy kernel is launched here, and NVTX ranges are per thread.
        let _range = crate::profiling::Range::new(c"gpumap::read_device_batch");
        let Some((first, _)) = group.first() else { return Ok(0) };
        let (pool, stream) = self.staging(first.ordinal)?;
        let mut buffer = pool.acquire()?;
        let mut packed = 0usize;
        for ((dst, offset), count) in group.iter().zip(counts.iter_mut()) {
            let len = dst.len;
            let plan = self.read_plan(*offset, len as u64);
            *count = self.read_piece(&mut buffer[packed..packed + len], *offset, plan)?;
            packed += len;
        }
        // Runs: [run_start, i) with adjacent destinations and full reads (but the last), as
        // (destination, offset in the buffer).
        let mut runs: Vec<(RawRegion, usize)> = Vec::new();
        let (mut run_start, mut run_packed) = (0usize, 0usize);
        let mut packed = 0usize;
        for i in 0..group.len() {
            let dst = group[i].0;
            let ends_run = i + 1 == group.len()
                || counts[i] < dst.len
                || group[i + 1].0.ordinal != dst.ordinal
                || group[i + 1].0.ptr != dst.ptr + dst.len as u64;
            packed += dst.len;
            if ends_run {
                let run_len = packed - run_packed - (dst.len - counts[i]);
                if run_len > 0 {
                    // The run's destination spans from its first piece's start onwards;
                    // adjacency was checked piece by piece, so it is one device range.
                    runs.push((RawRegion { len: run_len, ..group[run_start].0 }, run_packed));
                }
                (run_start, run_packed) = (i + 1, packed);
            }
        }
        let total = runs.iter().map(|(dst, _)| dst.len).sum();
        // Scattered destinations: one kernel launch places every run (a copy each would cost
        // about 8 µs of serialised driver time); a few adjacent runs: one copy each.
        let copier = BatchCopier::for_device(&CudaDevice::new(first.ordinal)?)?;
        if runs.len() > SCATTER_MIN_RUNS && copier.kernel_status().is_ok() {
            let base = buffer.as_ptr() as u64;
            let copies: Vec<DeviceCopy> = runs
                .iter()
                .map(|(dst, at)| DeviceCopy {
                    src: base + *at as u64,
                    dst: dst.ptr,
                    len: dst.len as u32,
                })
                .collect();
            copier.copy(&copies)?;
            return Ok(total);
        }
        for (target, at) in runs {
            buffer = stream
                .start_raw(buffer, at, target.len, target, 0, CopyDirection::HostToDevice)?
                .wait()?;
        }
        Ok(total)
    }

    /// Device -> file for `src[src_offset..src_offset + len]` at `file_offset`.
    fn write_span(
        &self,
        src: RawRegion,
        src_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<usize> {
        // The pool thread's share of the transfer, on its own timeline.
        let _range = crate::profiling::Range::new(c"gpumap::write_device");
        let (pool, stream) = self.staging(src.ordinal)?;
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
