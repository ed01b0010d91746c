//! The host backend: page-aligned host memory, standing in for device memory where there is no
//! GPU (CI, laptops), and serving as the destination of host-memory transfers.
#![forbid(unsafe_code)]

use std::ops::{Deref, DerefMut};

use memmap2::MmapMut;

use crate::error::{Error, Result};

/// A page-aligned, zero-initialised host buffer (an anonymous private mapping).
///
/// Page alignment matters: `O_DIRECT` transfers need an aligned buffer, so a `HostBuffer` lets
/// the aligned middle of every task bypass the page cache, where a `Vec<u8>` (16 bytes past a
/// page boundary with glibc's large allocations) never can.
pub struct HostBuffer {
    map: Option<MmapMut>,
}

impl HostBuffer {
    /// A zeroed buffer of `len` bytes. Memory is committed on first touch.
    pub fn new(len: usize) -> Result<HostBuffer> {
        if len == 0 {
            return Ok(HostBuffer { map: None });
        }
        let map =
            MmapMut::map_anon(len).map_err(|e| Error::io_nopath("mmap anonymous buffer", e))?;
        Ok(HostBuffer { map: Some(map) })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self.map.as_mut() {
            Some(m) => m,
            None => &mut [],
        }
    }
}

impl AsRef<[u8]> for HostBuffer {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for HostBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer").field("len", &self.len()).finish()
    }
}

/// Host memory cut into extents with a lock each: the frames of a cache on the host backend
/// (the `unsafe` part lives in `sys`).
pub(crate) use crate::sys::host_memory::LockedChunk;

/// Bytes of physical memory on this machine (a cache's largest host budget).
pub(crate) fn physical_memory() -> u64 {
    crate::sys::host_memory::physical_memory()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_empty_ok() {
        let mut b = HostBuffer::new(10_000).unwrap();
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert!(b.iter().all(|&x| x == 0));
        b[9_999] = 7;
        assert_eq!(b[9_999], 7);
        let e = HostBuffer::new(0).unwrap();
        assert!(e.is_empty() && e.as_ref().is_empty());
    }
}
