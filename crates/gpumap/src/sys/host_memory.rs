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

use crate::sync::{Mutex, MutexGuard};
use memmap2::MmapMut;

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
        let end = self.end_of(offset, len)?;
        let units = if len == 0 { 0..0 } else { offset / self.unit..end.div_ceil(self.unit) };
        let guards = units.map(|u| self.locks[u].lock()).collect();
        Ok(ChunkGuard { chunk: self, offset, len, _guards: guards })
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`, under the locks of the units they
    /// touch. A range inside one unit (a row of a gather) takes its one lock and allocates
    /// nothing, where [`lock`](Self::lock) keeps a list of guards.
    pub(crate) fn read_into(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let len = dst.len();
        let end = self.end_of(offset, len)?;
        if len == 0 || offset / self.unit != (end - 1) / self.unit {
            dst.copy_from_slice(&self.lock(offset, len)?);
            return Ok(());
        }
        let _unit = self.locks[offset / self.unit].lock();
        // SAFETY: `[offset, end)` lies inside the mapping (checked in `end_of`) and inside one
        // unit, whose lock is held: no guard writes these bytes meanwhile, and `dst` is the
        // caller's own memory, outside the chunk's guards.
        let src = unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset), len) };
        dst.copy_from_slice(src);
        Ok(())
    }

    /// Asks the CPU to start loading `[offset, offset + len)` into its caches, without waiting
    /// or locking: a gather prefetches the rows it copies a few rows later, so that their
    /// memory latencies overlap where its copies (each under a lock) would take them one after
    /// another. A hint only: the range is clipped to the chunk, and nothing is read.
    pub(crate) fn prefetch(&self, offset: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let end = offset.saturating_add(len).min(self.len);
            let mut line = offset & !63;
            while line < end {
                // SAFETY: `line < self.len`, so the address lies inside the mapping; a prefetch
                // never faults and neither reads nor writes memory as the program sees it.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(self.base.as_ptr().add(line).cast::<i8>()) };
                line += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (offset, len);
    }

    /// The end of `[offset, offset + len)`, or `OutOfRange` past the chunk.
    fn end_of(&self, offset: usize, len: usize) -> Result<usize> {
        offset.checked_add(len).filter(|&end| end <= self.len).ok_or(Error::OutOfRange {
            offset: offset as u64,
            len: len as u64,
            file_len: self.len as u64,
        })
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
    fn reads_within_and_across_units_see_the_bytes_and_stay_inside() {
        let chunk = LockedChunk::new(3 * 4096, 4096).unwrap();
        let model: Vec<u8> = (0..3 * 4096).map(|i| (i * 7 % 251) as u8).collect();
        chunk.lock(0, model.len()).unwrap().copy_from_slice(&model);
        for (offset, len) in [(0, 4096), (100, 512), (4000, 200), (4095, 4098), (0, 12288), (9, 0)]
        {
            let mut got = vec![0u8; len];
            chunk.read_into(offset, &mut got).unwrap();
            assert!(got[..] == model[offset..offset + len], "{offset} + {len}");
        }
        // Past the end, or overflowing: an error, nothing read. A prefetch anywhere is a hint.
        assert!(chunk.read_into(12_000, &mut [0u8; 289]).is_err());
        assert!(chunk.read_into(usize::MAX, &mut [0u8; 2]).is_err());
        chunk.prefetch(12_000, 1 << 20);
        chunk.prefetch(usize::MAX - 3, 100);
        // A read waits for a guard of its unit.
        let guard = chunk.lock(4096, 10).unwrap();
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut got = [0u8; 4];
                chunk.read_into(8000, &mut got).unwrap();
                got
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!reader.is_finished(), "a read ran while its unit was locked");
            drop(guard);
            assert!(reader.join().unwrap()[..] == model[8000..8004]);
        });
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
