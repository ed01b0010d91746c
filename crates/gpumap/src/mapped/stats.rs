//! What a cache and its files have done: [`FileStats`] and [`CacheStats`].
#![forbid(unsafe_code)]

use super::engine::{CacheNumbers, Engine, FileNumbers};
#[cfg(doc)]
use super::{CacheOptions, DeviceCache, DeviceMappedFile};

/// What one mapped file has done so far ([`DeviceMappedFile::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FileStats {
    /// Bytes mapped (the file's length when it was mapped).
    pub len: u64,
    /// Extents asked for (by views, gathers and prefetches) that were resident.
    pub hits: u64,
    /// Extents asked for that had to be read from the file.
    pub misses: u64,
    /// Reads issued to fill missing extents.
    pub fault_reads: u64,
    /// Bytes those reads brought in.
    pub bytes_faulted: u64,
    /// Frames and slots of this file given up to make room (or by `evict`).
    pub evictions: u64,
    /// Bytes written back (by flushes and evictions).
    pub bytes_written_back: u64,
    /// Write-backs that failed.
    pub write_errors: u64,
    /// Rows of row gathers read from the file past the full cache (also counted in `misses`;
    /// see [`DeviceMappedFile::gather_rows`]).
    pub rows_read_through: u64,
    /// Bytes of the file resident (clean or dirty).
    pub resident_bytes: u64,
    /// Bytes waiting to be written back.
    pub dirty_bytes: u64,
    /// Frames of the file mapped (contiguous homes).
    pub frames: u64,
    /// Slots holding extents of the file (random-access homes).
    pub slots: u64,
}

/// What a cache holds and has done ([`DeviceCache::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CacheStats {
    /// The budget, in bytes (whole frames).
    pub budget: u64,
    /// Independent parts the budget is split into ([`CacheOptions::shards`]).
    pub shards: u64,
    /// The frame size.
    pub frame_size: u64,
    /// The extent (and slot) size.
    pub extent_size: u64,
    /// Bytes of memory in use: mapped file frames and slot frames. Never above `budget`.
    pub used_bytes: u64,
    /// Slots in use across files.
    pub slots_in_use: u64,
    /// Files open in the cache.
    pub files: u64,
    /// The counters of every file (open now) added up; `len` is their total length.
    pub totals: FileStats,
    /// Seconds spent mapping and unmapping memory (summed over threads).
    pub map_seconds: f64,
    /// Seconds spent reading missing extents (summed over the threads that waited for them).
    pub fault_seconds: f64,
}

impl From<FileNumbers> for FileStats {
    fn from(n: FileNumbers) -> FileStats {
        let c = n.counters;
        FileStats {
            len: n.len,
            hits: c.hits,
            misses: c.misses,
            fault_reads: c.fault_reads,
            bytes_faulted: c.bytes_faulted,
            evictions: c.evictions,
            bytes_written_back: c.bytes_written_back,
            write_errors: c.write_errors,
            rows_read_through: c.rows_read_through,
            resident_bytes: n.resident_bytes,
            dirty_bytes: n.dirty_bytes,
            frames: n.frames,
            slots: n.slots,
        }
    }
}

impl CacheStats {
    /// The stats of `engine`'s cache now.
    pub(crate) fn new(engine: &Engine) -> CacheStats {
        let g = engine.geometry;
        let CacheNumbers { frames_taken, slots_in_use, files, totals, map_seconds, fault_seconds } =
            engine.cache_numbers();
        CacheStats {
            budget: engine.max_frames as u64 * g.frame,
            shards: engine.shards.len() as u64,
            frame_size: g.frame,
            extent_size: g.extent,
            used_bytes: frames_taken * g.frame,
            slots_in_use,
            files,
            totals: FileStats::from(totals),
            map_seconds,
            fault_seconds,
        }
    }
}
