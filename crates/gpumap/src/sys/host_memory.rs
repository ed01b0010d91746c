//! Host memory that many threads read and write at once, each in its own extents: what the host
//! backend of a cache uses where a GPU would have device memory.
//!
//! A [`LockedChunk`] is one anonymous mapping cut into units (a cache's extents) with a lock
//! each. [`LockedChunk::lock`] locks the units a byte range touches, in ascending order, and
//! hands out the range as `&mut [u8]` for as long as the guard lives. Two guards can only
//! coexist when their units differ, so their bytes never overlap: that is the whole safety
//! argument, and why the bytes are reached through raw pointers here rather than through one
//! `&mut [u8]` of the chunk. A thread holding a guard never waits for anything but the
//! kernel's I/O, so guards cannot deadlock with the pool that runs the I/O.

use std::ptr::NonNull;

use memmap2::MmapMut;
use parking_lot::{Mutex, MutexGuard};

use crate::error::{Error, Result};

/// Host memory in lockable units (see the module docs).
pub(crate) struct LockedChunk {
    /// Keeps the mapping alive; never read through directly once `base` is taken.
    _map: MmapMut,
    base: NonNull<u8>,
    len: usize,
    unit: usize,
    locks: Box<[Mutex<()>]>,
}

// SAFETY: the memory is reached only through guards that lock its units, so concurrent
// access from several threads is to disjoint bytes; the mapping itself is plain memory.
unsafe impl Send for LockedChunk {}
// SAFETY: as above: shared references only hand out disjoint byte ranges under locks.
unsafe impl Sync for LockedChunk {}

impl LockedChunk {
    /// `len` zeroed bytes (an anonymous private mapping) in units of `unit` bytes.
    pub(crate) fn new(len: usize, unit: usize) -> Result<Self> {
        if len == 0 || unit == 0 || !len.is_multiple_of(unit) {
            return Err(Error::InvalidArgument(format!(
                "host memory of {len} bytes in units of {unit}"
            )));
        }
        let mut map =
            MmapMut::map_anon(len).map_err(|e| Error::io_nopath("mmap anonymous memory", e))?;
        let base = NonNull::new(map.as_mut_ptr()).ok_or_else(|| {
            Error::InvalidArgument("an anonymous mapping at address 0".to_owned())
        })?;
        let locks = (0..len / unit).map(|_| Mutex::new(())).collect();
        Ok(Self { _map: map, base, len, unit, locks })
    }

    /// Locks the units that `[offset, offset + len)` touches and returns those bytes. Blocks
    /// while another guard holds one of them.
    pub(crate) fn lock(&self, offset: usize, len: usize) -> Result<ChunkGuard<'_>> {
        let end =
            offset.checked_add(len).filter(|&end| end <= self.len).ok_or(Error::OutOfRange {
                offset: offset as u64,
                len: len as u64,
                file_len: self.len as u64,
            })?;
        let units = if len == 0 { 0..0 } else { offset / self.unit..end.div_ceil(self.unit) };
        let guards = units.map(|u| self.locks[u].lock()).collect();
        Ok(ChunkGuard { chunk: self, offset, len, _guards: guards })
    }
}

/// Bytes of a [`LockedChunk`], exclusively the holder's until dropped.
pub(crate) struct ChunkGuard<'a> {
    chunk: &'a LockedChunk,
    offset: usize,
    len: usize,
    _guards: Vec<MutexGuard<'a, ()>>,
}

impl std::ops::Deref for ChunkGuard<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `[offset, offset + len)` lies inside the mapping (checked in `lock`), which
        // lives as long as the chunk the guard borrows; the guard holds the locks of every unit
        // the range touches, so no other guard reaches these bytes meanwhile.
        unsafe { std::slice::from_raw_parts(self.chunk.base.as_ptr().add(self.offset), self.len) }
    }
}

impl std::ops::DerefMut for ChunkGuard<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference through the guard.
        unsafe {
            std::slice::from_raw_parts_mut(self.chunk.base.as_ptr().add(self.offset), self.len)
        }
    }
}

/// Bytes of physical memory (`sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE)`); `u64::MAX`
/// when the system does not say.
pub(crate) fn physical_memory() -> u64 {
    // SAFETY: sysconf takes a constant and reads no memory of ours.
    let (pages, size) =
        unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    match (u64::try_from(pages), u64::try_from(size)) {
        (Ok(pages), Ok(size)) if pages > 0 && size > 0 => pages.saturating_mul(size),
        _ => u64::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_of_different_units_coexist_and_see_their_bytes() {
        let chunk = LockedChunk::new(4 * 4096, 4096).unwrap();
        let mut a = chunk.lock(0, 4096).unwrap();
        let mut b = chunk.lock(8192, 100).unwrap();
        a.fill(1);
        b.fill(2);
        drop((a, b));
        let all = chunk.lock(0, 4 * 4096).unwrap();
        assert!(all[..4096].iter().all(|&x| x == 1));
        assert!(all[8192..8292].iter().all(|&x| x == 2));
        assert!(all[8292..].iter().all(|&x| x == 0));
        assert!(chunk.lock(4 * 4096 - 1, 2).is_err());
        assert!(LockedChunk::new(100, 4096).is_err());
    }

    #[test]
    fn overlapping_guards_take_turns() {
        let chunk = std::sync::Arc::new(LockedChunk::new(2 * 4096, 4096).unwrap());
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let chunk = &chunk;
                s.spawn(move || {
                    for _ in 0..200 {
                        let mut g = chunk.lock(4000, 200).unwrap();
                        g.fill(t);
                        assert!(g.iter().all(|&x| x == t), "another thread wrote meanwhile");
                    }
                });
            }
        });
    }
}
