//! Streams and events, and copies queued on a stream.
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::c_uint;
use std::sync::Arc;

use cudarc::driver::sys as cu;

use super::driver::{api, check, release_failed, CUDA_ERROR_NOT_READY, CUDA_SUCCESS};
use super::memory::PinnedHost;
use crate::error::{Error, Result};

/// A non-blocking stream (`cuStreamCreate(CU_STREAM_NON_BLOCKING)`), destroyed on drop.
pub(crate) struct RawStream {
    pub(super) stream: cu::CUstream,
    /// Completed events kept for the stream's next copies: creating and destroying an event
    /// per copy costs two more driver calls on every bounce-buffer chunk.
    spare_events: crate::sync::Mutex<Vec<RawEvent>>,
}

/// Spare events a stream keeps (a double-buffered loop needs two or three).
const SPARE_EVENTS: usize = 8;

// SAFETY: CUDA streams may be used from any thread; the struct only stores the handle.
unsafe impl Send for RawStream {}
// SAFETY: as above.
unsafe impl Sync for RawStream {}

impl RawStream {
    /// `cuStreamCreate` in the current context (the caller binds it).
    pub(crate) fn new() -> Result<Self> {
        let mut stream: cu::CUstream = std::ptr::null_mut();
        // SAFETY: `stream` is a valid out-pointer.
        check("cuStreamCreate", unsafe {
            (api()?.cuStreamCreate)(
                &mut stream,
                cu::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint,
            )
        })?;
        Ok(Self { stream, spare_events: crate::sync::Mutex::new(Vec::new()) })
    }

    /// A spare event of this stream, or a new one (`cuEventCreate`).
    fn take_event(&self) -> Result<RawEvent> {
        match self.spare_events.lock().pop() {
            Some(event) => Ok(event),
            None => RawEvent::new(),
        }
    }

    /// Keeps a completed event for a later copy (or destroys it when enough are kept).
    fn keep_event(&self, event: RawEvent) {
        let mut spare = self.spare_events.lock();
        if spare.len() < SPARE_EVENTS {
            spare.push(event);
        }
    }

    /// `cuStreamSynchronize`.
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live for the life of `self`.
        check("cuStreamSynchronize", unsafe { (api()?.cuStreamSynchronize)(self.stream) })
    }

    /// The raw handle, for cuFile's stream-ordered calls.
    pub(crate) fn handle(&self) -> cu::CUstream {
        self.stream
    }

    /// This stream as a [`StreamHandle`], valid while `self` lives.
    pub(crate) fn as_handle(&self) -> StreamHandle {
        StreamHandle(self.stream as usize)
    }
}

/// A stream to queue work on that gpumap does not own: one of its own ([`RawStream::as_handle`])
/// or another stack's (a PyTorch or CuPy stream), checked to belong to a device's primary
/// context ([`StreamHandle::foreign`]). `0` is the legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamHandle(usize);

impl StreamHandle {
    /// The legacy default stream.
    pub(crate) const LEGACY: StreamHandle = StreamHandle(0);

    /// Another stack's stream `handle`, after the driver says it lives in `context` (the
    /// primary context gpumap uses): `cuStreamGetCtx`. The default streams (0, 1, 2) are taken
    /// as they are.
    ///
    /// # Safety
    ///
    /// `handle` is a live stream (the driver dereferences it; a made-up handle is undefined
    /// behaviour, not an error) and stays alive while work queued there through it runs.
    pub(crate) unsafe fn foreign(
        handle: u64,
        context: &super::device::PrimaryContext,
    ) -> Result<Self> {
        let handle = usize::try_from(handle)
            .map_err(|_| Error::InvalidArgument(format!("stream handle {handle:#x}")))?;
        if handle <= 2 {
            return Ok(StreamHandle(handle));
        }
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: `handle` is a live stream (this function's contract); `ctx` is a valid
        // out-pointer.
        check("cuStreamGetCtx", unsafe {
            (api()?.cuStreamGetCtx)(handle as cu::CUstream, &mut ctx)
        })?;
        if ctx != context.ctx {
            return Err(Error::InvalidArgument(format!(
                "stream {handle:#x} belongs to another CUDA context than the device's primary \
                 one, which gpumap uses"
            )));
        }
        Ok(StreamHandle(handle))
    }

    pub(super) fn raw(self) -> cu::CUstream {
        self.0 as cu::CUstream
    }

    /// `cuStreamSynchronize`.
    pub(crate) fn synchronize(self) -> Result<()> {
        // SAFETY: the handle is a live stream (the constructors' contract).
        check("cuStreamSynchronize", unsafe { (api()?.cuStreamSynchronize)(self.raw()) })
    }

    /// `cuStreamQuery`: whether all the work queued on the stream has finished.
    pub(crate) fn is_idle(self) -> Result<bool> {
        // SAFETY: the handle is a live stream (the constructors' contract).
        match unsafe { (api()?.cuStreamQuery)(self.raw()) } {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            rc => check("cuStreamQuery", rc).map(|()| false),
        }
    }

    /// `cuEventRecord` of `event` on this stream.
    pub(crate) fn record(self, event: &RawEvent) -> Result<()> {
        // SAFETY: both handles are live.
        check("cuEventRecord", unsafe { (api()?.cuEventRecord)(event.event, self.raw()) })
    }

    /// `cuMemcpyAsync` of `len` bytes from `src` to `dst` on this stream (see
    /// [`memcpy_async`]'s contract).
    pub(crate) fn copy(self, dst: u64, src: u64, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the addresses are only handed to the driver, which validates them; the caller
        // keeps both ranges valid until the stream passes the copy.
        check("cuMemcpyAsync", unsafe { (api()?.cuMemcpyAsync)(dst, src, len, self.raw()) })
    }
}

impl Drop for RawStream {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: destroyed exactly once; the driver lets queued work finish first.
            let rc = unsafe { (api.cuStreamDestroy_v2)(self.stream) };
            if rc != CUDA_SUCCESS {
                release_failed(api, "cuStreamDestroy", rc);
            }
        }
    }
}

/// An event created with `CU_EVENT_DISABLE_TIMING` (the cheap kind), destroyed on drop.
pub(crate) struct RawEvent {
    pub(super) event: cu::CUevent,
}

// SAFETY: CUDA events may be used from any thread; the struct only stores the handle.
unsafe impl Send for RawEvent {}
// SAFETY: as above.
unsafe impl Sync for RawEvent {}

impl RawEvent {
    /// `cuEventCreate` in the current context.
    pub(crate) fn new() -> Result<Self> {
        let mut event: cu::CUevent = std::ptr::null_mut();
        // SAFETY: `event` is a valid out-pointer.
        check("cuEventCreate", unsafe {
            (api()?.cuEventCreate)(&mut event, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint)
        })?;
        Ok(Self { event })
    }

    /// `cuEventRecord` on `stream`.
    pub(crate) fn record(&self, stream: &RawStream) -> Result<()> {
        // SAFETY: both handles are live.
        check("cuEventRecord", unsafe { (api()?.cuEventRecord)(self.event, stream.stream) })
    }

    /// `cuEventSynchronize`: blocks until the work recorded before the event completed.
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live.
        check("cuEventSynchronize", unsafe { (api()?.cuEventSynchronize)(self.event) })
    }

    /// `cuEventQuery`: `Ok(true)` when complete, `Ok(false)` while pending.
    pub(crate) fn is_complete(&self) -> Result<bool> {
        // SAFETY: the handle is live.
        let rc = unsafe { (api()?.cuEventQuery)(self.event) };
        match rc {
            CUDA_SUCCESS => Ok(true),
            CUDA_ERROR_NOT_READY => Ok(false),
            code => check("cuEventQuery", code).map(|()| false),
        }
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: destroyed exactly once.
            let rc = unsafe { (api.cuEventDestroy_v2)(self.event) };
            if rc != CUDA_SUCCESS {
                release_failed(api, "cuEventDestroy", rc);
            }
        }
    }
}

/// Direction of a [`PendingCopy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyDirection {
    /// Host buffer -> device (`cuMemcpyHtoDAsync`).
    HostToDevice,
    /// Device -> host buffer (`cuMemcpyDtoHAsync`).
    DeviceToHost,
}

/// An asynchronous copy between a pinned host buffer and device memory that owns the host buffer
/// until the copy is known complete. The buffer is handed back by [`PendingCopy::wait`]; dropping
/// the guard waits too. Because the guard owns `B` (and `B: 'static`), nothing else can free,
/// read or write the host memory while the DMA engine uses it — not even after `mem::forget`,
/// which leaks the buffer instead.
pub(crate) struct PendingCopy<B: Send + 'static> {
    buffer: Option<B>,
    /// Recorded after the copy; back to the stream's spares once it completed.
    event: Option<RawEvent>,
    /// Kept alive so the fallback synchronize in `drop` never touches a destroyed stream.
    stream: Arc<RawStream>,
}

impl<B: Send + 'static> PendingCopy<B> {
    /// Enqueues a copy of `len` bytes between the start of `buffer`'s pinned memory (found with
    /// `host`, called exactly once) and device address `device` on `stream`, then records an
    /// event. The caller has made the stream's context current and checked the device range.
    pub(crate) fn start(
        stream: &Arc<RawStream>,
        mut buffer: B,
        host: fn(&mut B) -> &mut PinnedHost,
        host_offset: usize,
        direction: CopyDirection,
        device: u64,
        len: usize,
    ) -> Result<Self> {
        let api = api()?;
        let event = stream.take_event()?;
        let pinned = host(&mut buffer);
        let needed = host_offset
            .checked_add(len)
            .ok_or(Error::Overflow { offset: host_offset as u64, len: len as u64 })?;
        if needed > pinned.len() {
            return Err(Error::BufferTooSmall {
                needed: needed as u64,
                available: pinned.len() as u64,
            });
        }
        // SAFETY: `host_offset + len <= pinned.len()` (checked above), so the offset pointer
        // stays inside the allocation.
        let host_ptr = unsafe { pinned.ptr.as_ptr().add(host_offset) };
        if len > 0 {
            let (op, rc) = match direction {
                CopyDirection::HostToDevice => (
                    "cuMemcpyHtoDAsync",
                    // SAFETY: `host_ptr` is valid for `len` bytes (checked above) and stays valid
                    // and untouched until the event completes: `buffer` moves into the guard.
                    unsafe {
                        (api.cuMemcpyHtoDAsync_v2)(device, host_ptr.cast(), len, stream.stream)
                    },
                ),
                CopyDirection::DeviceToHost => (
                    "cuMemcpyDtoHAsync",
                    // SAFETY: as above; the guard also holds the only access to the memory, so
                    // the device's writes race with nothing.
                    unsafe {
                        (api.cuMemcpyDtoHAsync_v2)(host_ptr.cast(), device, len, stream.stream)
                    },
                ),
            };
            check(op, rc)?;
        }
        // An event that was never recorded would report "complete" at once: keep it only if
        // recording worked, so that otherwise the guard's drop synchronizes the whole stream.
        let (event, recorded) = match event.record(stream) {
            Ok(()) => (Some(event), Ok(())),
            Err(e) => (None, Err(e)),
        };
        let pending = Self { buffer: Some(buffer), event, stream: Arc::clone(stream) };
        if let Err(e) = recorded {
            // The copy is queued but unrecorded: the guard's drop falls back to a stream sync
            // before releasing the buffer.
            drop(pending);
            return Err(e);
        }
        Ok(pending)
    }

    /// Blocks until the copy completed and returns the buffer.
    pub(crate) fn wait(mut self) -> Result<B> {
        match self.event.take() {
            Some(event) => {
                event.synchronize()?;
                self.stream.keep_event(event);
            }
            None => self.stream.synchronize()?,
        }
        self.buffer.take().ok_or_else(|| Error::InvalidArgument("copy already waited".to_owned()))
    }

    /// Whether the copy has completed (`cuEventQuery`), without blocking.
    pub(crate) fn is_complete(&self) -> Result<bool> {
        match &self.event {
            Some(event) => event.is_complete(),
            None => Ok(true),
        }
    }
}

impl<B: Send + 'static> Drop for PendingCopy<B> {
    fn drop(&mut self) {
        let Some(buffer) = self.buffer.take() else { return };
        if self.event.as_ref().is_some_and(|event| event.synchronize().is_ok()) {
            return;
        }
        if self.stream.synchronize().is_err() {
            // The DMA may still be using the memory: leak it rather than free or reuse it.
            tracing::warn!("could not confirm an async copy finished; leaking its buffer");
            std::mem::forget(buffer);
        }
    }
}

/// `cuMemcpyAsync` of `len` bytes from `src` to `dst` on `stream`; with unified addressing the
/// driver tells host from device memory by the addresses. The caller keeps both ranges valid
/// and otherwise untouched until the stream is synchronized.
pub(crate) fn memcpy_async(dst: u64, src: u64, len: usize, stream: &RawStream) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: the addresses are only handed to the driver, which validates them; the caller
    // upholds the lifetime contract above.
    check("cuMemcpyAsync", unsafe { (api()?.cuMemcpyAsync)(dst, src, len, stream.stream) })
}
