//! The `unsafe` doors through which raw addresses from other stacks (another CUDA library,
//! Python's `__cuda_array_interface__`, a C caller) become gpumap views. Everything else makes
//! views by borrowing memory it can see, so that a view cannot outlive its memory; here the
//! caller promises it instead, and the driver still checks what it can.

use crate::error::Result;
use crate::memory::cuda::{validate_device_range, CudaView, CudaViewMut};

impl<'a> CudaView<'a> {
    /// Wraps device memory allocated by another CUDA stack, after checking through
    /// `cuPointerGetAttributes` that `ptr` is device (or managed) memory and that
    /// `[ptr, ptr + len)` lies inside one allocation. A host pointer is `InvalidArgument`, a
    /// range past the allocation's end `BufferTooSmall`, an unknown (e.g. freed) address
    /// `InvalidArgument`; without CUDA, `Unavailable`.
    ///
    /// # Safety
    ///
    /// The memory must stay allocated for `'a`, and nothing may write to it while gpumap reads
    /// it through this view (or a copy or slice of it). The driver's checks cannot see a free
    /// that happens later.
    #[doc(alias = "cuPointerGetAttributes")]
    #[doc(alias = "cuMemGetAddressRange")]
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Result<CudaView<'a>> {
        Ok(CudaView::assume_valid(validate_device_range(ptr, len)?))
    }
}

impl<'a> CudaViewMut<'a> {
    /// Wraps device memory allocated by another CUDA stack for writing, with the checks of
    /// [`CudaView::from_raw`].
    ///
    /// # Safety
    ///
    /// The memory must stay allocated for `'a`, and nothing else may read or write it while
    /// gpumap writes through this view (or a slice of it).
    #[doc(alias = "cuPointerGetAttributes")]
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Result<CudaViewMut<'a>> {
        Ok(CudaViewMut::assume_valid(validate_device_range(ptr, len)?))
    }
}
