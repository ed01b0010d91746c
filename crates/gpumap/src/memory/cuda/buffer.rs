//! [`CudaBuffer`]: an owned device allocation.
#![forbid(unsafe_code)]

use std::fmt;

use super::device::CudaDevice;
use super::region::RawRegion;
use super::view::{CudaView, CudaViewMut};
use crate::error::Result;
use crate::sys::cuda as sys;

/// An owned device allocation (`cuMemAlloc`), freed on drop.
///
/// Freeing waits for the work queued in the device's context (`cuCtxSynchronize`), so that a
/// copy still running into the buffer — one whose guard was leaked with `mem::forget`, say —
/// can never land in memory the driver has handed to someone else.
pub struct CudaBuffer {
    alloc: sys::DeviceAlloc,
    device: CudaDevice,
}

impl fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBuffer")
            .field("ptr", &format_args!("{:#x}", self.alloc.ptr()))
            .field("len", &self.alloc.len())
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl CudaBuffer {
    /// Allocates `len` bytes on `device` (contents undefined). A zero length allocates nothing.
    #[doc(alias = "cuMemAlloc")]
    pub fn alloc(device: &CudaDevice, len: usize) -> Result<Self> {
        device.bind_to_thread()?;
        let alloc = sys::DeviceAlloc::new(device.context(), len)?;
        Ok(Self { alloc, device: device.clone() })
    }

    /// Allocates `len` zeroed bytes on `device` (`cuMemAlloc` + `cuMemsetD8`).
    #[doc(alias = "cuMemsetD8")]
    pub fn zeroed(device: &CudaDevice, len: usize) -> Result<Self> {
        let mut buffer = Self::alloc(device, len)?;
        buffer.fill(0)?;
        Ok(buffer)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.alloc.len()
    }

    /// Whether the buffer has zero length.
    pub fn is_empty(&self) -> bool {
        self.alloc.len() == 0
    }

    /// The device it lives on.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// The device address of the first byte (for kernels; valid while the buffer lives).
    pub fn ptr(&self) -> u64 {
        self.alloc.ptr()
    }

    fn raw(&self) -> RawRegion {
        RawRegion { ptr: self.alloc.ptr(), len: self.alloc.len(), ordinal: self.device.ordinal() }
    }

    /// The whole buffer, to read from: the view borrows the buffer, so it cannot outlive it.
    pub fn view(&self) -> CudaView<'_> {
        CudaView::assume_valid(self.raw())
    }

    /// The whole buffer, to write into (exclusively borrowed while the view lives).
    pub fn view_mut(&mut self) -> CudaViewMut<'_> {
        CudaViewMut::assume_valid(self.raw())
    }

    /// Copies `src` into the buffer at `offset` (`cuMemcpyHtoD`; done when it returns).
    #[doc(alias = "cuMemcpyHtoD")]
    pub fn copy_from_host(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.view_mut().copy_from_host(offset, src)
    }

    /// Copies `dst.len()` bytes at `offset` into `dst` (synchronous `cuMemcpyDtoH`).
    #[doc(alias = "cuMemcpyDtoH")]
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.view().copy_to_host(offset, dst)
    }

    /// Sets every byte to `value` (`cuMemsetD8`; done when it returns).
    pub fn fill(&mut self, value: u8) -> Result<()> {
        self.view_mut().fill(value)
    }
}
