//! Rows read past a full cache. When a row gather of a read-only file misses and the budget has
//! no room left, filling the cache would cost each missing row an eviction, the books' work under
//! a shard lock and a whole extent's read, all on the calling thread. Instead the missing rows
//! alone are read from the file, spread over the pool's threads, and placed into the caller's
//! buffer; the cache is left as it was, and the gather's caller offers their extents to the
//! cache in the background (`admission`). Writable files never take this way: their newest bytes
//! may be in the cache, dirty, on their way to the file.
#![forbid(unsafe_code)]

use parking_lot::Mutex;

use super::state::{Engine, FileEntry};
use crate::error::{Error, Result};
use crate::memory::bounce::BouncePool;
use crate::memory::cuda::CudaDevice;
use crate::memory::{Device, DeviceViewMut};

/// Staging buffer of one group of rows read through: one pool task, one upload and one launch
/// per group, as the cache's own gather groups (docs/decisions/0008-gather-groups-4mib.md).
const GROUP_BYTES: u64 = 4 << 20;

/// The least a group reads (a row more where a row is larger): below it a group's upload and
/// launch cost more than its reads, so a small gather's misses stay on one or a few threads.
const MIN_GROUP_BYTES: u64 = 64 << 10;

/// Whether the misses of a row gather of `entry` (rows of `row_size` bytes) are read past the
/// cache: a read-only file, rows that fit a group, and either a budget with no frame left to
/// take or `always` (the cache in front of the zero-copy tier, whose misses never fill it).
pub(crate) fn reads_through(
    engine: &Engine,
    entry: &FileEntry,
    row_size: u64,
    always: bool,
) -> bool {
    !entry.writable && row_size <= GROUP_BYTES && (always || !engine.has_room())
}

/// Reads the rows `misses` — (position in the gather, row index), every one checked to be
/// within the file — of `row_size` bytes from `entry`'s file into `dst`, row at position `p`
/// at byte `out + p * row_size`. Returns when they are all there.
pub(crate) fn read_rows_through(
    engine: &Engine,
    entry: &FileEntry,
    misses: &[(u64, u64)],
    row_size: u64,
    out: u64,
    dst: &mut DeviceViewMut<'_>,
) -> Result<()> {
    if misses.is_empty() {
        return Ok(());
    }
    let pool = entry.file.pool();
    // Enough groups for every pool thread to take two, none over a staging buffer nor under
    // the least worth a launch.
    let fewest = (MIN_GROUP_BYTES / row_size).max(1) as usize;
    let most = (GROUP_BYTES / row_size).max(1) as usize;
    let per_group = misses.len().div_ceil(2 * pool.nthreads().max(1)).max(fewest).min(most);
    let groups: Vec<&[(u64, u64)]> = misses.chunks(per_group).collect();
    let row = row_size as usize;
    match (engine.store.device(), &mut *dst) {
        (Device::Cuda(device), DeviceViewMut::Cuda(view)) => {
            let copier =
                engine.store.copier().ok_or_else(|| Error::InvalidArgument("no GPU".into()))?;
            let base = view.ptr() + out;
            let bounce =
                BouncePool::for_device(&device, GROUP_BYTES as usize, 2 * pool.nthreads())?;
            pool.run(groups, |group| {
                CudaDevice::bind_to_thread(&device)?;
                let mut buffer = bounce.acquire()?;
                let mut pieces = Vec::with_capacity(group.len());
                for (k, &(position, index)) in group.iter().enumerate() {
                    read_row(entry, index, &mut buffer[k * row..(k + 1) * row])?;
                    pieces.push((k * row, base + position * row_size, row as u32));
                }
                let staged = buffer.as_ptr() as u64;
                copier.upload_and_scatter(staged, group.len() * row, &pieces)?;
                Ok(group.len())
            })?;
        }
        (_, dst) => {
            // Host memory (or a host cache gathering into a GPU buffer): each group read into a
            // buffer of its own on the pool, then copied out in order here.
            let read: Vec<Mutex<Vec<u8>>> =
                groups.iter().map(|g| Mutex::new(vec![0u8; g.len() * row])).collect();
            pool.run(groups.iter().zip(&read).collect(), |(group, bytes)| {
                let mut bytes = bytes.lock();
                for (k, &(_, index)) in group.iter().enumerate() {
                    read_row(entry, index, &mut bytes[k * row..(k + 1) * row])?;
                }
                Ok(group.len())
            })?;
            for (group, bytes) in groups.iter().zip(read) {
                let bytes = bytes.into_inner();
                for (k, &(position, _)) in group.iter().enumerate() {
                    let to = (out + position * row_size) as usize;
                    let piece = &bytes[k * row..(k + 1) * row];
                    match dst {
                        DeviceViewMut::Host(d) => d[to..to + row].copy_from_slice(piece),
                        DeviceViewMut::Cuda(view) => view.copy_from_host(to, piece)?,
                    }
                }
            }
        }
    }
    Ok(())
}

/// Reads row `index` into `row` (its length): a short read is the file cut under the map.
fn read_row(entry: &FileEntry, index: u64, row: &mut [u8]) -> Result<()> {
    let (offset, len) = (index * row.len() as u64, row.len() as u64);
    let got = entry.file.read_at(row, offset)?;
    entry.file.expect_len(offset, len, got as u64)
}
