//! The `unsafe` doors through which raw addresses from other stacks (another CUDA library,
//! Python's `__cuda_array_interface__`, a C caller) become gpumap views. Everything else makes
//! views by borrowing memory it can see, so that a view cannot outlive its memory; here the
//! caller promises it instead, and the driver still checks what it can.

use crate::error::Result;
use crate::memory::cuda::{validate_device_range, CudaDevice, CudaView, CudaViewMut};
use crate::memory::StreamRef;

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

impl StreamRef<'static> {
    /// Another CUDA stack's stream on `device`: a PyTorch stream's `cuda_stream`, a CuPy
    /// stream's `ptr`, a `CUstream` from C; `0`, `1`, `2` for the legacy and per-thread default
    /// streams. The driver is asked (`cuStreamGetCtx`) that it belongs to the device's primary
    /// context, the one gpumap, PyTorch and CuPy share; another context's stream is
    /// `InvalidArgument`.
    ///
    /// # Safety
    ///
    /// `raw` must be a live stream (the driver dereferences the handle: one made up or destroyed
    /// is undefined behaviour, not an error), and stay alive while work gpumap queued on it runs
    /// — gpumap's calls that take a stream wait for their own work before they return.
    #[doc(alias = "cuStreamGetCtx")]
    pub unsafe fn from_raw(device: &CudaDevice, raw: u64) -> Result<StreamRef<'static>> {
        device.bind_to_thread()?;
        // SAFETY: the caller's promise is `foreign`'s.
        let handle = unsafe { crate::sys::cuda::StreamHandle::foreign(raw, device.context())? };
        Ok(StreamRef::checked(handle, device))
    }
}
