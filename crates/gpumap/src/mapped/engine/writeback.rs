//! Writing dirty extents back: runs of adjacent dirty extents, in parallel on the file's pool.
//!
//! - An extent is marked clean only when a write-back that *started after its last write*
//!   finished and no writable view over it is alive (the books' versions and writer counts):
//!   bytes written through a live view are never lost to a flush that ran meanwhile.
//! - A failed write leaves its extents dirty and returns the error, which also *sticks* to the
//!   file: every later flush returns it until a `sync` writes every byte and `fdatasync`
//!   succeeds. (Linux reports a write-back error once; a retried `fsync` can falsely succeed,
//!   so the only safe retry is writing everything again — and the bytes are still here.)
//! - A map never changes its file's length: dirty bytes past the end of a file that another
//!   process cut are not written, stay dirty, and the write-back says so ([`Error::FileShrank`]).
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::ops::Range;

use crate::sync::{Mutex, MutexGuard};

use super::books::Unit;
use super::state::{Engine, FileEntry, Shard};
use super::sticky::StickyError;

use super::store::Home;
use crate::error::{Error, Result};

/// Writes the dirty extents of `entry` among `extents` back to its file (see the module docs),
/// shard by shard; every shard is tried, and the first failure returned.
///
/// Extents another write-back is writing are waited for and then written again if still dirty
/// (that one may carry older bytes): when this returns `Ok`, the file holds everything written
/// to the range before the call.
pub(crate) fn write_back(engine: &Engine, entry: &FileEntry, extents: Range<u64>) -> Result<()> {
    if extents.is_empty() {
        return Ok(());
    }
    let mut failed = None;
    for shard in shards_covering(engine, entry, extents.clone()) {
        if let Err(failure) = write_back_in(engine, &engine.shards[shard], entry, extents.clone()) {
            failed.get_or_insert(failure);
        }
    }
    let Some(failure) = failed else { return Ok(()) };
    let dirty_bytes = dirty_bytes(engine, entry, extents);
    let e = match failure {
        Failure::Write(e) => {
            Error::WriteBack { path: entry.path.clone(), dirty_bytes, source: Box::new(e) }
        }
        Failure::Shrank { limit } => Error::FileShrank {
            path: entry.path.clone(),
            len: limit,
            mapped_len: entry.len,
            dirty_bytes,
        },
    };
    *entry.sticky.lock() = Some(StickyError::from_error(&e));
    Err(e)
}

/// Why a shard's write-back did not write everything.
enum Failure {
    /// A write failed.
    Write(Error),
    /// The file is shorter than the map now, up to `limit`: bytes past it stay dirty.
    Shrank { limit: u64 },
}

/// The shards holding the frames of `extents` of `entry`, in order.
fn shards_covering(engine: &Engine, entry: &FileEntry, extents: Range<u64>) -> Vec<usize> {
    let g = engine.geometry;
    let n = engine.shards.len();
    let frames = g.frame_of(extents.start)..g.frame_of(extents.end - 1) + 1;
    if frames.end - frames.start >= n as u64 {
        return (0..n).collect();
    }
    engine.shards_of_frames(entry.id, frames).into_iter().map(|(shard, _)| shard).collect()
}

/// The bytes of `entry` among `extents` that are dirty now, over every shard.
fn dirty_bytes(engine: &Engine, entry: &FileEntry, extents: Range<u64>) -> u64 {
    let g = engine.geometry;
    engine
        .shards
        .iter()
        .map(|shard| {
            shard
                .state
                .lock()
                .books
                .dirty_in(entry.id, extents.clone())
                .iter()
                .map(|&(e, _)| g.bytes_of(e..e + 1, entry.len).1)
                .sum::<u64>()
        })
        .sum()
}

/// [`write_back`] of the extents whose frames are in `shard`.
fn write_back_in(
    engine: &Engine,
    shard: &Shard,
    entry: &FileEntry,
    extents: Range<u64>,
) -> std::result::Result<(), Failure> {
    let mut state = shard.state.lock();
    // Extents this call has written: not claimed again, though a live writable view keeps
    // them dirty, or write-backs on other threads, each waiting for the others' extents,
    // would write them over and over and never return.
    let mut written_here = HashSet::new();
    loop {
        let (mine, busy) = state.books.claim_writeback(entry.id, extents.clone(), &written_here);
        if mine.is_empty() {
            if !busy {
                return Ok(());
            }
            shard.changed.wait(&mut state);
            continue;
        }
        let frames = frames_of(engine, &mine);
        // Pinned while they are written, so that they cannot be evicted meanwhile.
        for &index in &frames {
            state.books.pin(Unit::Frame { file: entry.id, index }, true);
        }
        let (written, bytes, result, limit) =
            MutexGuard::unlocked(&mut state, || write_claimed(engine, entry, &mine));
        state.books.finish_writeback(entry.id, &mine, &written);
        for &index in &frames {
            state.books.unpin(Unit::Frame { file: entry.id, index }, true);
        }
        if let Some(c) = state.books.counters_mut(entry.id) {
            c.bytes_written_back += bytes;
            c.write_errors += u64::from(result.is_err());
        }
        shard.changed.notify_all();
        if let Err(e) = result {
            return Err(Failure::Write(e));
        }
        if limit < entry.len && written.len() < mine.len() {
            return Err(Failure::Shrank { limit });
        }
        if !busy {
            return Ok(());
        }
        written_here.extend(mine.iter().map(|&(e, _)| e));
    }
}

/// The distinct frames of sorted extents.
fn frames_of(engine: &Engine, extents: &[(u64, u32)]) -> Vec<u64> {
    let mut frames: Vec<u64> = extents.iter().map(|&(e, _)| engine.geometry.frame_of(e)).collect();
    frames.dedup();
    frames
}

/// Writes claimed dirty extents, runs of adjacent ones in parallel on the file's pool, never
/// past the file's current end. Returns the extents all of whose bytes were written, the bytes
/// written, the first error, and the length written up to.
fn write_claimed(
    engine: &Engine,
    entry: &FileEntry,
    claimed: &[(u64, u32)],
) -> (Vec<(u64, u32)>, u64, Result<usize>, u64) {
    let _range = crate::profiling::Range::new(c"gpumap::cache::write_back");
    let g = engine.geometry;
    let written = Mutex::new(Vec::with_capacity(claimed.len()));
    let bytes = Mutex::new(0u64);
    let current = entry.file.len();
    let limit = current.as_ref().map_or(entry.len, |&len| len.min(entry.len));
    let result = match current {
        Err(e) => Err(e),
        Ok(_) => {
            let indices: Vec<u64> = claimed.iter().map(|&(e, _)| e).collect();
            let runs = g.runs(&indices, engine.store.frames_apart(), limit);
            // Never cancelled with the call that needed the room (see `uncancelled`).
            crate::io::pool::uncancelled(|| {
                entry.file.pool().run(runs, |(offset, len)| {
                    engine.store.write_back(
                        Home::Frame(&entry.memory, offset),
                        entry.file.writable_file(&entry.path)?,
                        offset,
                        len as usize,
                    )?;
                    // Extents all of whose bytes (in the mapping) this run wrote.
                    let done: Vec<(u64, u32)> = g
                        .extents_covering(offset, len)
                        .filter(|&e| {
                            let (start, n) = g.bytes_of(e..e + 1, entry.len);
                            start + n <= offset + len
                        })
                        .filter_map(|e| {
                            claimed.binary_search_by_key(&e, |d| d.0).ok().map(|i| claimed[i])
                        })
                        .collect();
                    written.lock().extend(done);
                    *bytes.lock() += len;
                    Ok(len as usize)
                })
            })
        }
    };
    (written.into_inner(), bytes.into_inner(), result, limit)
}

/// The error a file's earlier failed write-back left, if any (see the module docs).
pub(crate) fn sticky_error(engine: &Engine, entry: &FileEntry) -> Option<Error> {
    entry.sticky.lock().as_ref()?;
    // Counted before the sticky error is locked again: no lock of the books inside it.
    let dirty = dirty_bytes(engine, entry, 0..engine.geometry.extents(entry.len));
    entry.sticky.lock().as_ref().map(|sticky| sticky.to_error(&entry.path, dirty))
}

/// A flush of `extents`: their write-back, then the file's sticky error if an earlier
/// write-back failed (see the module docs).
pub(crate) fn flush(engine: &Engine, entry: &FileEntry, extents: Range<u64>) -> Result<()> {
    write_back(engine, entry, extents)?;
    match sticky_error(engine, entry) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A sync: every dirty extent written back, then `fdatasync`; when both succeed the file's
/// sticky error is cleared.
pub(crate) fn sync(engine: &Engine, entry: &FileEntry) -> Result<()> {
    write_back(engine, entry, 0..engine.geometry.extents(entry.len))?;
    if entry.writable {
        if let Err(e) = entry.file.writable_file(&entry.path).and_then(|file| file.sync_data()) {
            *entry.sticky.lock() = Some(StickyError::from_error(&e));
            return Err(e);
        }
    }
    *entry.sticky.lock() = None;
    Ok(())
}
