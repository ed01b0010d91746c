//! Many small reads in one call ([`DeviceRead`], [`BatchPiece`]): into host memory each piece
//! read straight to its place, in parallel; into GPU memory through cuFile's batch API on the
//! cuFile path, and on the POSIX path in groups that fit one bounce buffer — each group read
//! packed into one pinned buffer and placed by one copy per run of adjacent destinations, or
//! one launch of the copy kernel for scattered ones.
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::align::checked_end;
use crate::error::{Error, Result};
use crate::io::compat::IoPath;
use crate::io::device_io;
use crate::io::direct;
use crate::io::gds::{CuFileHandle, RawBatchRead};
use crate::io::handle_state::HandleState;
use crate::io::host_io;
use crate::io::pool::IoFuture;
use crate::memory::cuda::{BatchCopier, CopyDirection, CudaDevice, DeviceCopy, RawRegion};
use crate::memory::{DeviceViewMut, OwnedDeviceMemory};

/// One read of a batch: the bytes of the file at `offset` go to `dst` (all of it, unless the
/// file ends first).
#[derive(Debug)]
pub struct DeviceRead<'a> {
    /// Destination memory; its length is the read's length.
    pub dst: DeviceViewMut<'a>,
    /// File offset.
    pub offset: u64,
}

/// One piece of [`FileHandle::pread_device_batch`](super::FileHandle::pread_device_batch):
/// `len` bytes at file `offset` into the buffer at `dst_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPiece {
    /// Where the piece goes in the buffer.
    pub dst_offset: usize,
    /// Bytes to read.
    pub len: usize,
    /// Where the piece comes from in the file.
    pub offset: u64,
}

/// More runs than this in one batch group are placed by the copy kernel, not a copy each.
const SCATTER_MIN_RUNS: usize = 2;

/// Reads every piece of `reads` (all into one device, or all into host memory); each one's
/// count, in order.
pub(super) fn read_device_batch(
    state: &HandleState,
    reads: &mut [DeviceRead<'_>],
) -> Result<Vec<usize>> {
    state.check_read()?;
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
        return read_host_batch(state, reads);
    }
    let raw = reads
        .iter()
        .map(|r| match &r.dst {
            DeviceViewMut::Cuda(v) => Ok((v.raw, r.offset)),
            DeviceViewMut::Host(_) => Err(mixed_batch()),
        })
        .collect::<Result<Vec<(RawRegion, u64)>>>()?;
    read_cuda_batch(state, &raw)
}

/// [`read_device_batch`] into the owned `dst` on the pool, `pieces` carved out of it; the
/// future gives back `dst` and each piece's count.
pub(super) fn pread_device_batch<B: OwnedDeviceMemory>(
    state: &Arc<HandleState>,
    dst: B,
    pieces: Vec<BatchPiece>,
) -> IoFuture<(B, Vec<usize>)> {
    let shared = Arc::clone(state);
    state.pool.spawn(move || {
        let mut dst = dst;
        let ranges: Vec<(usize, usize)> = pieces.iter().map(|p| (p.dst_offset, p.len)).collect();
        let views = dst.device_view_mut().carve(&ranges)?;
        let mut reads: Vec<DeviceRead<'_>> = views
            .into_iter()
            .zip(&pieces)
            .map(|(dst, p)| DeviceRead { dst, offset: p.offset })
            .collect();
        let counts = read_device_batch(&shared, &mut reads)?;
        drop(reads);
        Ok((dst, counts))
    })
}

/// A batch into host memory: every piece read straight into its destination, in parallel
/// on the pool.
fn read_host_batch(state: &HandleState, reads: &mut [DeviceRead<'_>]) -> Result<Vec<usize>> {
    let mut counts = vec![0usize; reads.len()];
    let items: Vec<(&mut [u8], u64, &mut usize)> = reads
        .iter_mut()
        .zip(counts.iter_mut())
        .filter_map(|(r, count)| match &mut r.dst {
            DeviceViewMut::Host(bytes) => Some((&mut **bytes, r.offset, count)),
            DeviceViewMut::Cuda(_) => None,
        })
        .collect();
    state.pool.run(items, |(bytes, offset, count)| {
        let plan = direct::read_plan(state, offset, bytes.len() as u64);
        *count = host_io::read_piece(state, bytes, offset, plan)?;
        Ok(*count)
    })?;
    Ok(counts)
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

/// A batch into GPU memory: cuFile's batch API on the cuFile path, else groups of one bounce
/// buffer each, in parallel on the pool.
pub(super) fn read_cuda_batch(
    state: &HandleState,
    reads: &[(RawRegion, u64)],
) -> Result<Vec<usize>> {
    let _range = crate::profiling::Range::new(c"gpumap::read_device_batch");
    if let (decision, Some(gds)) = state.decision() {
        if decision.path == IoPath::CuFile {
            return read_batch_cufile(state, gds, reads);
        }
    }
    let buffer_size = state.settings.bounce_buffer_size as usize;
    let mut counts = vec![0usize; reads.len()];
    let groups = group_reads(reads, buffer_size);
    let mut items = Vec::with_capacity(groups.len());
    let mut rest = counts.as_mut_slice();
    for range in groups {
        let (out, tail) = rest.split_at_mut(range.len());
        items.push((&reads[range], out));
        rest = tail;
    }
    state.pool.run(items, |(group, out)| {
        if let [(dst, offset)] = group {
            if dst.len > buffer_size {
                out[0] = device_io::read_cuda(state, *dst, *offset)?;
                return Ok(out[0]);
            }
        }
        read_group(state, group, out)
    })?;
    Ok(counts)
}

/// A batch on the cuFile path: cuFile's batch API (`cuFileBatchIOSubmit`), which with
/// GPUDirect Storage reads every piece straight into device memory, many in flight at once.
/// Pieces are clipped to the file's length first, so the batch never asks cuFile to read
/// past the end (what it does there is not documented).
fn read_batch_cufile(
    state: &HandleState,
    gds: &CuFileHandle,
    reads: &[(RawRegion, u64)],
) -> Result<Vec<usize>> {
    let file_len = state.len()?;
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

/// One batch group: every piece read into one bounce buffer, packed; then one copy per run
/// of pieces whose destinations are adjacent (a short read ends its run, so the bytes
/// after it in the destination are left as they were).
pub(super) fn read_group(
    state: &HandleState,
    group: &[(RawRegion, u64)],
    counts: &mut [usize],
) -> Result<usize> {
    // On the pool thread too: the copy kernel is launched here, and NVTX ranges are per thread.
    let _range = crate::profiling::Range::new(c"gpumap::read_device_batch");
    let Some((first, _)) = group.first() else { return Ok(0) };
    let (pool, stream) = device_io::staging(state, first.ordinal)?;
    let mut buffer = pool.acquire()?;
    let mut packed = 0usize;
    for ((dst, offset), count) in group.iter().zip(counts.iter_mut()) {
        let len = dst.len;
        let plan = direct::read_plan(state, *offset, len as u64);
        *count = host_io::read_piece(state, &mut buffer[packed..packed + len], *offset, plan)?;
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
    // Scattered destinations: one kernel launch places every run (the driver serialises
    // small copies, so a copy each would cost far more); a few adjacent runs: one copy each.
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
