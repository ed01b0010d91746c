//! [`PinnedBuffer`]: page-locked host memory, what asynchronous copies stage through.
#![forbid(unsafe_code)]

use std::fmt;

use super::device::CudaDevice;
use crate::error::Result;
use crate::sys::cuda as sys;

/// Page-aligned, page-locked host memory that every context can DMA from, zero-initialised,
/// owned, released on drop: anonymous memory on transparent huge pages registered with the
/// driver (`cuMemHostRegister`) where the kernel offers such pages, else `cuMemHostAlloc`'s
/// (docs/decisions/0029-pinned-huge-pages.md).
pub struct PinnedBuffer {
    pub(crate) host: sys::PinnedHost,
}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("addr", &format_args!("{:#x}", self.host.addr()))
            .field("len", &self.host.len())
            .finish()
    }
}

impl PinnedBuffer {
    /// Allocates `len` bytes of pinned host memory. `device`'s context is bound to the calling
    /// thread because the driver allocates in the current context. Costs milliseconds for
    /// megabytes: allocate once and reuse, as the bounce pool (`memory::bounce`) does.
    #[doc(alias = "cuMemHostAlloc")]
    #[doc(alias = "cuMemHostRegister")]
    pub fn new(device: &CudaDevice, len: usize) -> Result<Self> {
        device.bind_to_thread()?;
        Ok(Self { host: sys::PinnedHost::new(len)? })
    }

    /// `count` buffers of `len` bytes, pinned together (one registration where huge pages are
    /// offered, which costs the driver about what one buffer's does). `device`'s context is
    /// bound to the calling thread.
    #[doc(alias = "cuMemHostRegister")]
    pub fn new_many(device: &CudaDevice, len: usize, count: usize) -> Result<Vec<Self>> {
        device.bind_to_thread()?;
        Ok(sys::PinnedHost::new_many(len, count)?.into_iter().map(|host| Self { host }).collect())
    }

    /// A zero-length buffer (no allocation, no driver call), used as a placeholder.
    pub(crate) fn empty() -> Self {
        Self { host: sys::PinnedHost::empty() }
    }

    /// The memory.
    pub fn as_slice(&self) -> &[u8] {
        self.host.as_slice()
    }

    /// The memory, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.host.as_mut_slice()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.host.len()
    }

    /// Whether the buffer has zero length.
    pub fn is_empty(&self) -> bool {
        self.host.len() == 0
    }
}
