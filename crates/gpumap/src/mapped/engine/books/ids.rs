//! The books' vocabulary: the ids of files and slots, the units that can be pinned and evicted,
//! the states of extents and slots, where an extent is, what to give up for room, and the
//! counters each file keeps.
#![forbid(unsafe_code)]

use std::collections::HashMap as StdHashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The books' maps are keyed by small integers (file ids, frame and extent indices) that no one
/// outside chooses: a multiply-and-rotate hash serves them in a nanosecond, where SipHash's
/// flooding resistance costs twenty — and a gather looks up several per row under the lock.
#[derive(Default, Clone, Copy)]
pub(crate) struct IndexHasher(u64);

impl Hasher for IndexHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(26);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A map keyed by the cache's own small integers, hashed by [`IndexHasher`].
pub(crate) type IndexHashMap<K, V> = StdHashMap<K, V, BuildHasherDefault<IndexHasher>>;

/// A file's number in its cache.
pub(crate) type FileId = u32;
/// A slot's number: its slot frame's position in the cache's slot arena times the slots per
/// frame, plus its index (unique across the shards of a cache, whose books each own a stretch
/// of the arena).
pub(crate) type SlotId = u32;

/// A unit of memory that can be pinned and evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Unit {
    /// Frame `index` of file `file`.
    Frame { file: FileId, index: u64 },
    /// A slot.
    Slot(SlotId),
}

/// What an extent of a mapped file frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtentState {
    /// Nothing valid.
    Absent,
    /// One caller is reading it in; others wait for it (single flight).
    Loading,
    /// The file's bytes.
    Clean,
    /// Bytes newer than the file's, to be written back.
    Dirty,
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Nothing; on the free list.
    Free,
    /// One caller is reading its extent in.
    Loading,
    /// Its extent's bytes (slots are never dirty).
    Clean,
    /// Superseded by the extent's file frame while pinned; freed when unpinned.
    Stale,
    /// Free, but a lookup outside the books may still see what it held (see `Catalog`):
    /// taken again once none can.
    Retiring,
}

/// Where an extent's bytes are, as new requests see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Location {
    /// Its file frame is mapped and holds it in this state (`Absent`: mapped, nothing there).
    Frame(ExtentState),
    /// This slot holds it (loading or clean).
    Slot(SlotId, SlotState),
    /// Nowhere: its frame is not mapped and no slot holds it.
    Nowhere,
}

/// What to give up to make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Victim {
    /// A file frame with nothing dirty: unmap it.
    CleanFrame { file: FileId, index: u64 },
    /// A file frame with dirty extents: write them back, then look again.
    DirtyFrame { file: FileId, index: u64 },
    /// A clean slot no one pins: reuse it.
    Slot(SlotId),
    /// A slot frame with no slot in use by a caller: release it (its clean slots go).
    SlotFrame(usize),
    /// Everything is pinned or being read in.
    None,
}

/// What a request needs room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// A frame of memory (a file frame, or a new slot frame).
    Frame,
    /// One slot.
    Slot,
}

/// What happened to one file, for its stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FileCounters {
    /// Extents asked for that were resident.
    pub(crate) hits: u64,
    /// Extents asked for that had to be read.
    pub(crate) misses: u64,
    /// Reads issued to fill missing extents.
    pub(crate) fault_reads: u64,
    /// Bytes those reads brought in.
    pub(crate) bytes_faulted: u64,
    /// Units of this file given up to make room (or by `evict`).
    pub(crate) evictions: u64,
    /// Bytes written back.
    pub(crate) bytes_written_back: u64,
    /// Write-backs that failed.
    pub(crate) write_errors: u64,
    /// Rows of row gathers read from the file past the full cache.
    pub(crate) rows_read_through: u64,
}

impl FileCounters {
    /// Adds every counter of `delta`.
    pub(crate) fn add(&mut self, delta: &FileCounters) {
        self.hits += delta.hits;
        self.misses += delta.misses;
        self.fault_reads += delta.fault_reads;
        self.bytes_faulted += delta.bytes_faulted;
        self.evictions += delta.evictions;
        self.bytes_written_back += delta.bytes_written_back;
        self.rows_read_through += delta.rows_read_through;
        self.write_errors += delta.write_errors;
    }
}

/// The empty link of the LRU list and the slots' and frames' nodes in it.
pub(crate) const NIL: u32 = u32::MAX;
