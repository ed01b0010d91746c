//! [`StreamRef`]: a CUDA stream gpumap queues work on without owning it — one of gpumap's own
//! [`Stream`]s, or another stack's (PyTorch's current stream, a CuPy stream), so that gpumap's
//! kernels run in order with the caller's work instead of after a device-wide wait.
//! Another stack's stream enters through the `unsafe` [`StreamRef::from_raw`], whose one
//! `unsafe` block calls the driver layer's `StreamHandle::foreign` on the caller's promise.
#![deny(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;

use crate::error::{Error, Result};
use crate::memory::cuda::{CudaDevice, Stream};
use crate::memory::kernels::StreamHandle;

/// A stream to queue work on, borrowed for `'a`: from a [`Stream`] ([`StreamRef::of`]), or from
/// another CUDA stack through the `unsafe` [`StreamRef::from_raw`].
#[derive(Clone, Copy)]
pub struct StreamRef<'a> {
    pub(crate) handle: StreamHandle,
    ordinal: usize,
    _stream: PhantomData<&'a Stream>,
}

impl fmt::Debug for StreamRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamRef").field("device", &self.ordinal).finish()
    }
}

impl<'a> StreamRef<'a> {
    /// One of gpumap's own streams.
    pub fn of(stream: &'a Stream) -> StreamRef<'a> {
        StreamRef {
            handle: stream.raw().as_handle(),
            ordinal: stream.device().ordinal(),
            _stream: PhantomData,
        }
    }

    /// The legacy default stream of `device` (stream `0`), which waits for, and is waited for
    /// by, every blocking stream of the device.
    pub fn legacy(device: &CudaDevice) -> StreamRef<'static> {
        StreamRef { handle: StreamHandle::LEGACY, ordinal: device.ordinal(), _stream: PhantomData }
    }

    pub(crate) fn checked(handle: StreamHandle, device: &CudaDevice) -> StreamRef<'a> {
        StreamRef { handle, ordinal: device.ordinal(), _stream: PhantomData }
    }

    /// The GPU the stream belongs to.
    pub fn device_ordinal(&self) -> usize {
        self.ordinal
    }

    /// Waits for the work queued on the stream so far (`cuStreamSynchronize`), with the
    /// stream's device bound to the calling thread: before gpumap reads memory another stack
    /// wrote on its stream.
    pub fn synchronize(&self) -> Result<()> {
        CudaDevice::new(self.ordinal)?.bind_to_thread()?;
        self.handle.synchronize()
    }

    /// Whether all the work queued on the stream so far has finished (`cuStreamQuery`), without
    /// waiting: a caller that finds it idle need not [`synchronize`](Self::synchronize).
    #[doc(alias = "cuStreamQuery")]
    pub fn is_idle(&self) -> Result<bool> {
        CudaDevice::new(self.ordinal)?.bind_to_thread()?;
        self.handle.is_idle()
    }

    /// The stream's handle, after checking that it is on the GPU `ordinal`.
    pub(crate) fn on(&self, ordinal: usize) -> Result<StreamHandle> {
        if self.ordinal != ordinal {
            return Err(Error::InvalidArgument(format!(
                "the stream is on GPU {}, the memory on GPU {ordinal}",
                self.ordinal
            )));
        }
        Ok(self.handle)
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
    #[allow(unsafe_code)] // the caller's promise, passed on to the driver layer
    pub unsafe fn from_raw(device: &CudaDevice, raw: u64) -> Result<StreamRef<'static>> {
        device.bind_to_thread()?;
        // SAFETY: the caller's promise is `foreign`'s.
        let handle = unsafe { crate::sys::cuda::StreamHandle::foreign(raw, device.context())? };
        Ok(StreamRef::checked(handle, device))
    }
}
