//! Admission in the background: the extents of rows a gather read past a full cache
//! (`read_through`) are offered to the cache, and one thread at a time makes them resident, off
//! the gathers' path. An offer made while an admission runs is dropped. The rows asked for most
//! miss most often and so are offered again soon, which leans what gets in towards the hot
//! rows; a stream of cold misses costs at most one thread's work and one batch of evictions at a
//! time. Into a full cache, an extent is offered only on its second miss of late (`doorkeeper`),
//! so that misses spread over far more than the budget cost no admissions for nothing.
#![forbid(unsafe_code)]

use super::gather::{gather_to, GatherRange};
use super::rows::refresh_recency;
use super::state::{Engine, FileEntry};
use crate::error::Result;

/// The most extents one admission takes into a full cache: bounds its work (a few milliseconds
/// of the books and its reads, and as many evictions), so that what it admits reflects the
/// latest misses.
pub(crate) const MAX_EXTENTS_PER_ADMISSION: usize = 4096;

/// The most extents one admission takes while the budget has room (misses read in place reach
/// the cache only through admissions, and filling free room evicts nothing): a 256 MiB bound
/// on one admission's reads at extents of 4 KiB.
pub(crate) const MAX_EXTENTS_PER_ADMISSION_WITH_ROOM: usize = 1 << 16;

/// The distinct extents of the rows `rows` (row indices, `row_size` bytes each) of `entry`'s
/// file to offer the cache, at most [`MAX_EXTENTS_PER_ADMISSION`] (or, while the budget has room,
/// [`MAX_EXTENTS_PER_ADMISSION_WITH_ROOM`]), taken in the rows' order. Into a full cache only
/// those the doorkeeper has seen miss before; every miss is recorded there, offered or not.
pub(crate) fn extents_of_rows(
    engine: &Engine,
    entry: &FileEntry,
    rows: &[u64],
    row_size: u64,
) -> Vec<u64> {
    let room = engine.has_room();
    let most = if room { MAX_EXTENTS_PER_ADMISSION_WITH_ROOM } else { MAX_EXTENTS_PER_ADMISSION };
    // The file's id in the key's top bits, so that the same extent of two files differs.
    let file = u64::from(entry.id).rotate_right(24);
    let mut extents = Vec::new();
    for &row in rows {
        for e in engine.geometry.extents_covering(row * row_size, row_size) {
            let again = engine.doorkeeper.missed_again(file ^ e);
            if (again || room) && extents.len() < most {
                extents.push(e);
            }
        }
    }
    extents.sort_unstable();
    extents.dedup();
    extents
}

/// Makes extents `extents` of `entry` resident, evicting what the cache's LRU order gives up.
/// The lookups' marks are harvested first, whether due or not, so that what gathers found
/// before it is not what this admission evicts.
pub(crate) fn admit(engine: &Engine, entry: &FileEntry, extents: &[u64]) -> Result<()> {
    refresh_recency(engine, true)?;
    let g = engine.geometry;
    let ranges: Vec<GatherRange<'_>> = extents
        .iter()
        .map(|&e| {
            let (offset, len) = g.bytes_of(e..e + 1, entry.len);
            GatherRange { entry, offset, len }
        })
        .filter(|r| r.len > 0)
        .collect();
    gather_to(engine, &ranges, None, None)
}
