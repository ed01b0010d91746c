//! Host bytes to GPU memory through pinned bounce buffers, the way the local device path moves
//! them: the thread's bounce pool and stream, one copy in flight while the next buffer is
//! filled.
#![forbid(unsafe_code)]

use std::rc::Rc;
use std::sync::Arc;

use crate::config::Config;
use crate::error::Result;
use crate::io::IoPool;
use crate::memory::bounce::{BounceBuffer, BouncePool};
use crate::memory::cuda::{CopyDirection, CudaDevice, InFlight, RawRegion, Stream};

/// Uploads pieces of one destination region, in any order.
pub(crate) struct Uploader {
    pool: Arc<BouncePool>,
    stream: Rc<Stream>,
    dst: RawRegion,
    in_flight: Option<InFlight<'static, BounceBuffer>>,
}

impl Uploader {
    /// An uploader into `dst`, on the calling thread's stream for `dst`'s device.
    pub(crate) fn new(dst: RawRegion) -> Result<Uploader> {
        let device = CudaDevice::new(dst.ordinal)?;
        device.bind_to_thread()?;
        let buffer_size = usize::try_from(Config::global()?.bounce_buffer_size).unwrap_or(4 << 20);
        // Sized as the local device path sizes the shared pool (two per I/O thread), so that
        // both draw on one bounded set of pinned buffers.
        let pool = BouncePool::for_device(&device, buffer_size, 2 * IoPool::global()?.nthreads())?;
        Ok(Uploader { pool, stream: Stream::for_current_thread(&device)?, dst, in_flight: None })
    }

    /// Starts copying `bytes` to `dst` at `at`, a bounce buffer at a time; returns once the
    /// last piece's copy is queued (the one before it has completed).
    pub(crate) fn upload(&mut self, bytes: &[u8], at: usize) -> Result<()> {
        for (i, piece) in bytes.chunks(self.pool.buffer_size()).enumerate() {
            let mut buffer = self.next_buffer()?;
            buffer[..piece.len()].copy_from_slice(piece);
            let copy = self.stream.start_raw(
                buffer,
                0,
                piece.len(),
                self.dst,
                at + i * self.pool.buffer_size(),
                CopyDirection::HostToDevice,
            )?;
            if let Some(previous) = self.in_flight.replace(copy) {
                previous.wait()?;
            }
        }
        Ok(())
    }

    /// Waits for the last copy.
    pub(crate) fn finish(mut self) -> Result<()> {
        match self.in_flight.take() {
            Some(last) => last.wait().map(drop),
            None => Ok(()),
        }
    }

    /// A free buffer, or — when other transfers hold the pool's — the one in flight once its
    /// copy is done; never blocks while holding a buffer, so uploads cannot deadlock the pool.
    fn next_buffer(&mut self) -> Result<BounceBuffer> {
        if let Some(buffer) = self.pool.try_acquire()? {
            return Ok(buffer);
        }
        match self.in_flight.take() {
            Some(copy) => copy.wait(),
            None => self.pool.acquire(),
        }
    }
}
