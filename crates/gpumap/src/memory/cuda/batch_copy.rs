//! [`BatchCopier`]: many small copies on one device in one kernel launch.
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use crate::sync::Mutex;

use super::buffer::CudaBuffer;
use super::device::CudaDevice;
use super::pinned::PinnedBuffer;
use super::stream::Stream;
use crate::error::{Error, Result};
use crate::sys::cuda as sys;

/// One copy of a batch: `len` bytes from `src` to `dst`, both addresses the device can reach
/// (device memory; pinned host memory as a source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceCopy {
    pub(crate) src: u64,
    pub(crate) dst: u64,
    pub(crate) len: u32,
}

/// Copies at least this long go through `cuMemcpyAsync` (the copy engines move them at the
/// link's rate); shorter ones through the kernel, many in one launch.
const KERNEL_COPY_MAX: u32 = 256 << 10;

/// Most copies described in one launch (20 bytes each: 1.25 MiB of descriptors).
const DESCRIPTORS_PER_LAUNCH: usize = 1 << 16;

/// Many small copies on one device in one kernel launch instead of one driver call each,
/// because one launch placed small pieces far faster than a `cuMemcpyHtoDAsync` each or one
/// `cuMemcpyBatchAsync` (docs/decisions/0007-small-reads-packed.md has the figures). Where the
/// kernel cannot be loaded (a driver too old to JIT its PTX), every copy is one
/// `cuMemcpyAsync`, with the reason in [`BatchCopier::kernel_status`].
pub(crate) struct BatchCopier {
    device: CudaDevice,
    kernel: std::result::Result<sys::CopyKernel, String>,
}

thread_local! {
    /// Each thread's pinned descriptor buffer per device, kept between batches.
    static DESCRIPTORS: RefCell<HashMap<usize, PinnedBuffer>> = RefCell::new(HashMap::new());
    /// Each thread's device staging buffer per device, for packed uploads.
    static STAGING: RefCell<HashMap<usize, CudaBuffer>> = RefCell::new(HashMap::new());
}

impl BatchCopier {
    /// The process-wide copier of `device` (the kernel is loaded once per device).
    pub(crate) fn for_device(device: &CudaDevice) -> Result<Arc<BatchCopier>> {
        static COPIERS: OnceLock<Mutex<HashMap<usize, Arc<BatchCopier>>>> = OnceLock::new();
        let mut copiers = COPIERS.get_or_init(|| Mutex::new(HashMap::new())).lock();
        if let Some(c) = copiers.get(&device.ordinal()) {
            return Ok(Arc::clone(c));
        }
        device.bind_to_thread()?;
        let kernel = sys::CopyKernel::load(device.ordinal()).map_err(|e| e.to_string());
        if let Err(reason) = &kernel {
            tracing::warn!(
                "batched copies on GPU {} use one call each: {reason}",
                device.ordinal()
            );
        }
        let copier = Arc::new(BatchCopier { device: device.clone(), kernel });
        copiers.insert(device.ordinal(), Arc::clone(&copier));
        Ok(copier)
    }

    /// Whether the kernel is loaded, or why not.
    pub(crate) fn kernel_status(&self) -> std::result::Result<(), &str> {
        self.kernel.as_ref().map(|_| ()).map_err(String::as_str)
    }

    /// Runs every copy and waits for them (on the calling thread's stream). The crate's
    /// contract: each range is valid for the device, stays so and is not otherwise accessed
    /// until this returns, and destinations do not overlap.
    pub(crate) fn copy(&self, copies: &[DeviceCopy]) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        self.device.bind_to_thread()?;
        let stream = Stream::for_current_thread(&self.device)?;
        self.copy_on(&stream, copies)
    }

    /// [`copy`](Self::copy) on `stream`, after the work already queued there.
    fn copy_on(&self, stream: &Stream, copies: &[DeviceCopy]) -> Result<()> {
        // Waited for even when queueing failed part way: what was queued still reads its
        // sources, which the callers reuse once this returns.
        let queued = self.enqueue_on(stream, copies);
        let done = stream.synchronize();
        queued.and(done)
    }

    /// Queues `copies` on `stream` without waiting for them.
    fn enqueue_on(&self, stream: &Stream, copies: &[DeviceCopy]) -> Result<()> {
        let (small, large): (Vec<DeviceCopy>, Vec<DeviceCopy>) = match &self.kernel {
            Ok(_) => copies.iter().partition(|c| c.len < KERNEL_COPY_MAX),
            Err(_) => (Vec::new(), copies.to_vec()),
        };
        for c in &large {
            sys::memcpy_async(c.dst, c.src, c.len as usize, stream.raw())?;
        }
        if let Ok(kernel) = &self.kernel {
            for batch in small.chunks(DESCRIPTORS_PER_LAUNCH) {
                self.launch(kernel, stream, batch)?;
            }
        }
        Ok(())
    }

    /// Uploads `len` bytes of pinned host memory at `host` to the calling thread's device
    /// staging buffer in one copy (the copy engines, at the link's rate), then places them with
    /// one kernel launch: each `(offset, dst, len)` copies `len` bytes from `offset` in the
    /// staging buffer to `dst`. Waits for both. One packed copy moves the bytes at the link's
    /// rate and one launch places them, where a copy per piece would pay a driver call each.
    /// Without the kernel, every piece is a copy from the host. The crate's contract is
    /// [`copy`](Self::copy)'s.
    pub(crate) fn upload_and_scatter(
        &self,
        host: u64,
        len: usize,
        pieces: &[(usize, u64, u32)],
    ) -> Result<()> {
        if self.kernel.is_err() {
            let copies: Vec<DeviceCopy> = pieces
                .iter()
                .map(|&(at, dst, n)| DeviceCopy { src: host + at as u64, dst, len: n })
                .collect();
            return self.copy(&copies);
        }
        self.device.bind_to_thread()?;
        let stream = Stream::for_current_thread(&self.device)?;
        let staging = STAGING.with(|cell| -> Result<u64> {
            let mut buffers = cell.borrow_mut();
            let ordinal = self.device.ordinal();
            if buffers.get(&ordinal).is_none_or(|b| b.len() < len) {
                buffers.remove(&ordinal);
                buffers.insert(ordinal, CudaBuffer::alloc(&self.device, len.next_power_of_two())?);
            }
            Ok(buffers.get(&ordinal).map_or(0, CudaBuffer::ptr))
        })?;
        sys::memcpy_async(staging, host, len, stream.raw())?;
        let copies: Vec<DeviceCopy> = pieces
            .iter()
            .map(|&(at, dst, n)| DeviceCopy { src: staging + at as u64, dst, len: n })
            .collect();
        // On the same stream, so the kernel starts after the upload; `copy_on` waits for both.
        self.copy_on(&stream, &copies)
    }

    fn launch(
        &self,
        kernel: &sys::CopyKernel,
        stream: &Stream,
        batch: &[DeviceCopy],
    ) -> Result<()> {
        DESCRIPTORS.with(|cell| {
            let mut buffers = cell.borrow_mut();
            let needed = batch.len() * 20;
            let buffer = match buffers.get_mut(&self.device.ordinal()) {
                Some(b) if b.len() >= needed => b,
                _ => {
                    let size = needed.next_power_of_two().max(64 << 10);
                    buffers.insert(self.device.ordinal(), PinnedBuffer::new(&self.device, size)?);
                    buffers.get_mut(&self.device.ordinal()).ok_or_else(|| {
                        Error::InvalidArgument("descriptor buffer vanished".to_owned())
                    })?
                }
            };
            let n = batch.len();
            let bytes = buffer.as_mut_slice();
            for (i, c) in batch.iter().enumerate() {
                bytes[8 * i..8 * i + 8].copy_from_slice(&c.src.to_ne_bytes());
                bytes[8 * (n + i)..8 * (n + i) + 8].copy_from_slice(&c.dst.to_ne_bytes());
                bytes[16 * n + 4 * i..16 * n + 4 * i + 4].copy_from_slice(&c.len.to_ne_bytes());
            }
            kernel.run(stream.raw(), &buffer.host, n)
        })
    }
}
