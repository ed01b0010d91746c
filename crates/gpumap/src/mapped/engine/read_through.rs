//! Rows read past a full cache. When a row gather of a read-only file misses and the budget has
//! no room left, filling the cache would cost each missing row an eviction, the books' work under
//! a shard lock and a whole extent's read, all on the calling thread. Instead the missing rows
//! alone are read from the file, spread over the pool's threads, and placed into the caller's
//! buffer; the cache is left as it was, and the gather's caller offers their extents to the
//! cache in the background (`admission`). Writable files never take this way: their newest bytes
//! may be in the cache, dirty, on their way to the file.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::sync::Mutex;

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

/// A gather counted among those reading through at once while it lives.
struct Reading<'a>(&'a AtomicUsize);

impl<'a> Reading<'a> {
    /// Counts one more gather; returns it and how many read through now, itself included.
    fn enter(count: &'a AtomicUsize) -> (Reading<'a>, usize) {
        let now = count.fetch_add(1, Ordering::Relaxed) + 1;
        (Reading(count), now)
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Rows per group for `misses` rows of `row_size` bytes, where `gathers` gathers (this one
/// included) share a pool of `nthreads` threads: enough groups for every thread to take two
/// among them all, none over a staging buffer nor under the least worth a launch. Many gathers
/// at once thus send few large groups each, and one alone spreads over the whole pool.
fn rows_per_group(misses: usize, row_size: u64, nthreads: usize, gathers: usize) -> usize {
    let fewest = (MIN_GROUP_BYTES / row_size).max(1) as usize;
    let most = (GROUP_BYTES / row_size).max(1) as usize;
    let groups = (2 * nthreads.max(1)).div_ceil(gathers.max(1));
    misses.div_ceil(groups).max(fewest).min(most)
}

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
    let (_reading, gathers) = Reading::enter(&engine.reading_through);
    let per_group = rows_per_group(misses.len(), row_size, pool.nthreads(), gathers);
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
                read_rows(entry, group, &mut buffer[..group.len() * row])?;
                let mut pieces = Vec::with_capacity(group.len());
                for (k, &(position, _)) in group.iter().enumerate() {
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
                read_rows(entry, group, &mut bytes.lock())?;
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

/// Reads the rows of `group` ((position, row index) each) into `rows`, a row's length each in
/// order, all in one [`read_pieces_at`](super::backing::Backing::read_pieces_at): a short read
/// is the file cut under the map.
fn read_rows(entry: &FileEntry, group: &[(u64, u64)], rows: &mut [u8]) -> Result<()> {
    let row = rows.len() / group.len().max(1);
    let mut pieces: Vec<(&mut [u8], u64)> = rows
        .chunks_mut(row.max(1))
        .zip(group)
        .map(|(bytes, &(_, index))| (bytes, index * row as u64))
        .collect();
    let counts = entry.file.read_pieces_at(&mut pieces)?;
    for (&(_, index), got) in group.iter().zip(counts) {
        entry.file.expect_len(index * row as u64, row as u64, got as u64)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_shrink_in_number_as_gathers_share_the_pool() {
        const KIB: u64 = 1 << 10;
        // (misses, row size, pool threads, gathers at once) -> rows per group
        for (misses, row, threads, gathers, per_group) in [
            // One gather of 1,000 rows of 4 KiB on 16 threads: 32 groups of 32 rows.
            (1000, 4 * KIB, 16, 1, 32),
            // Sixteen at once: two groups each.
            (1000, 4 * KIB, 16, 16, 500),
            // More gathers than threads: one group each, within a staging buffer (1,024 rows).
            (1000, 4 * KIB, 16, 64, 1000),
            (5000, 4 * KIB, 16, 64, 1024),
            // Never under 64 KiB a group: 16 rows of 4 KiB, 128 of 512 B.
            (100, 4 * KIB, 16, 1, 16),
            (1000, 512, 16, 1, 128),
            // A row larger than a staging buffer goes alone; no thread counted is one.
            (10, 8 << 20, 16, 1, 1),
            (10, 4 * KIB, 0, 0, 16),
        ] {
            assert_eq!(
                rows_per_group(misses, row, threads, gathers),
                per_group,
                "{misses} misses of {row} B, {threads} threads, {gathers} gathers"
            );
        }
    }

    #[test]
    fn a_gather_is_counted_while_it_reads() {
        let count = AtomicUsize::new(0);
        let (first, n) = Reading::enter(&count);
        assert_eq!(n, 1);
        {
            let (_second, n) = Reading::enter(&count);
            assert_eq!(n, 2);
        }
        assert_eq!(count.load(Ordering::Relaxed), 1);
        drop(first);
        assert_eq!(count.load(Ordering::Relaxed), 0);
    }
}
