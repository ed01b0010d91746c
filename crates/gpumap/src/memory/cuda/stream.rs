//! [`Stream`]: a CUDA stream, with the double-buffering copy primitive ([`Stream::upload`] /
//! [`Stream::download`]), its guard ([`InFlight`]) and what it stages through
//! ([`StagingBuffer`]).
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use super::device::CudaDevice;
use super::pinned::PinnedBuffer;
use super::region::{check_range, RawRegion};
use super::view::{CudaView, CudaViewMut};
use crate::error::{Error, Result};
use crate::sys::cuda as sys;

/// A buffer that can stage an asynchronous copy: it owns (or is) a [`PinnedBuffer`].
/// Implemented by [`PinnedBuffer`] and the bounce pool's `BounceBuffer`. The `'static`
/// bound is what makes [`InFlight`] sound: the buffer moves into the guard, so nothing else can
/// reach the memory while the copy engine uses it.
pub trait StagingBuffer: Send + 'static {
    /// The pinned memory that is copied from or into.
    fn pinned_mut(&mut self) -> &mut PinnedBuffer;
}

impl StagingBuffer for PinnedBuffer {
    fn pinned_mut(&mut self) -> &mut PinnedBuffer {
        self
    }
}

fn host_of<B: StagingBuffer>(buffer: &mut B) -> &mut sys::PinnedHost {
    &mut buffer.pinned_mut().host
}

/// A CUDA stream (`cuStreamCreate` with `CU_STREAM_NON_BLOCKING`, so it never serialises with
/// the legacy default stream), destroyed on drop after its work finished.
pub struct Stream {
    raw: Arc<sys::RawStream>,
    device: CudaDevice,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream").field("device", &self.device.ordinal()).finish()
    }
}

thread_local! {
    static THREAD_STREAMS: RefCell<HashMap<usize, Rc<Stream>>> = RefCell::new(HashMap::new());
}

impl Stream {
    /// Creates a stream on `device`.
    #[doc(alias = "cuStreamCreate")]
    pub fn new(device: &CudaDevice) -> Result<Self> {
        device.bind_to_thread()?;
        Ok(Self { raw: Arc::new(sys::RawStream::new()?), device: device.clone() })
    }

    /// The calling thread's stream for `device`, created on first use and kept for the
    /// thread's life (pool threads reuse one stream each instead of creating one per call).
    pub fn for_current_thread(device: &CudaDevice) -> Result<Rc<Stream>> {
        THREAD_STREAMS.with(|streams| {
            if let Some(s) = streams.borrow().get(&device.ordinal()) {
                return Ok(Rc::clone(s));
            }
            let stream = Rc::new(Stream::new(device)?);
            streams.borrow_mut().insert(device.ordinal(), Rc::clone(&stream));
            Ok(stream)
        })
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Blocks until all work queued on the stream finished (`cuStreamSynchronize`).
    #[doc(alias = "cuStreamSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        self.raw.synchronize()
    }

    pub(crate) fn raw(&self) -> &Arc<sys::RawStream> {
        &self.raw
    }

    /// Enqueues a copy between `buffer[host_offset..host_offset + len]` and `region` at
    /// `offset`. Crate-internal: the caller keeps `region` live until the copy is waited for
    /// (the public methods tie that to a borrow).
    pub(crate) fn start_raw<B: StagingBuffer>(
        &self,
        buffer: B,
        host_offset: usize,
        len: usize,
        region: RawRegion,
        offset: usize,
        direction: sys::CopyDirection,
    ) -> Result<InFlight<'static, B>> {
        check_range(offset, len, region.len)?;
        if region.ordinal != self.device.ordinal() {
            return Err(Error::InvalidArgument(format!(
                "memory is on device {} but the stream on device {}",
                region.ordinal,
                self.device.ordinal()
            )));
        }
        self.device.bind_to_thread()?;
        let pending = sys::PendingCopy::start(
            &self.raw,
            buffer,
            host_of::<B>,
            host_offset,
            direction,
            region.ptr + offset as u64,
            len,
        )?;
        Ok(InFlight { pending, _memory: PhantomData })
    }

    /// Starts copying `len` bytes of `src` from `src_offset` to `dst` at `dst_offset`
    /// (`cuMemcpyHtoDAsync`). `src` moves into the returned guard, so it cannot be reused or
    /// freed while the copy runs, and the guard borrows `dst`; [`InFlight::wait`] hands the
    /// buffer back. Fill buffer A, `upload` it, fill buffer B meanwhile: that is the
    /// double-buffered staging loop.
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub fn upload<'a, B: StagingBuffer>(
        &self,
        src: B,
        src_offset: usize,
        len: usize,
        dst: CudaViewMut<'a>,
        dst_offset: usize,
    ) -> Result<InFlight<'a, B>> {
        let copy = self.start_raw(
            src,
            src_offset,
            len,
            dst.raw,
            dst_offset,
            sys::CopyDirection::HostToDevice,
        )?;
        Ok(copy.borrowing())
    }

    /// Starts copying `len` bytes of `src` at `src_offset` into `dst` at `dst_offset`
    /// (`cuMemcpyDtoHAsync`); after [`InFlight::wait`] the returned buffer holds the data.
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub fn download<'a, B: StagingBuffer>(
        &self,
        src: CudaView<'a>,
        src_offset: usize,
        dst: B,
        dst_offset: usize,
        len: usize,
    ) -> Result<InFlight<'a, B>> {
        let copy = self.start_raw(
            dst,
            dst_offset,
            len,
            src.raw,
            src_offset,
            sys::CopyDirection::DeviceToHost,
        )?;
        Ok(copy.borrowing())
    }
}

/// An asynchronous copy in flight, owning its staging buffer and borrowing the device memory
/// until the copy completed. Dropping it waits for the copy (errors are logged, never panicked
/// on). Leaking it (`mem::forget`) leaks the staging buffer, never frees it under the DMA.
pub struct InFlight<'a, B: StagingBuffer> {
    pending: sys::PendingCopy<B>,
    _memory: PhantomData<&'a mut [u8]>,
}

impl<B: StagingBuffer> fmt::Debug for InFlight<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight").finish_non_exhaustive()
    }
}

impl<'a, B: StagingBuffer> InFlight<'a, B> {
    /// Blocks until the copy completed (`cuEventSynchronize`) and returns the buffer.
    #[doc(alias = "cuEventSynchronize")]
    pub fn wait(self) -> Result<B> {
        self.pending.wait()
    }

    /// Whether the copy has completed, without blocking (`cuEventQuery`).
    #[doc(alias = "cuEventQuery")]
    pub fn is_complete(&self) -> Result<bool> {
        self.pending.is_complete()
    }

    fn borrowing<'b>(self) -> InFlight<'b, B> {
        InFlight { pending: self.pending, _memory: PhantomData }
    }
}
