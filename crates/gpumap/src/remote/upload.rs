//! Range bodies to GPU memory: each body lands straight in a pinned bounce buffer where one is
//! free, and goes up from there with no copy on the host; one copy in flight while the next
//! body is received.
//!
//! Nothing here blocks on the bounce pool: a lane's requests are polled by the lane's own
//! thread, so a lane waiting for a buffer that its own requests hold would wait forever. A
//! body that finds no free buffer lands in memory of its own and goes up by a synchronous copy.
#![forbid(unsafe_code)]

use std::rc::Rc;
use std::sync::Arc;

use crate::config::Config;
use crate::error::Result;
use crate::io::IoPool;
use crate::memory::bounce::{BounceBuffer, BouncePool};
use crate::memory::cuda::{CopyDirection, CudaDevice, InFlight, RawRegion, Stream};

/// Pinned buffers a remote read may ask the shared pool to hold, at most: its requests in
/// flight and one copy per lane, within this.
const MAX_LANDING_BUFFERS: usize = 64;

/// Where one range's body is received.
pub(crate) enum Landing {
    /// The first `len` bytes of a pinned bounce buffer.
    Pinned { buffer: BounceBuffer, len: usize },
    /// Memory of its own (no buffer was free, or the range is larger than one).
    Heap(Vec<u8>),
}

impl Landing {
    /// The bytes the body fills.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Landing::Pinned { buffer, len } => &mut buffer[..*len],
            Landing::Heap(bytes) => bytes,
        }
    }
}

/// Sends landed bodies to their regions of one GPU, in any order.
pub(crate) struct Uploader {
    pool: Arc<BouncePool>,
    stream: Rc<Stream>,
    in_flight: Option<InFlight<'static, BounceBuffer>>,
}

impl Uploader {
    /// An uploader to GPU `ordinal`, on the calling thread's stream for it; `landings` is how
    /// many bodies the whole read may hold at once (its requests in flight, and a copy per
    /// lane), which the shared pool's bound is raised to, within [`MAX_LANDING_BUFFERS`].
    pub(crate) fn new(ordinal: usize, landings: usize) -> Result<Uploader> {
        let pool = landing_pool(ordinal, landings)?;
        let device = CudaDevice::new(ordinal)?;
        device.bind_to_thread()?;
        Ok(Uploader { pool, stream: Stream::for_current_thread(&device)?, in_flight: None })
    }

    /// The pool bodies land in (for the requests, which run apart from the uploader).
    pub(crate) fn pool(&self) -> Arc<BouncePool> {
        Arc::clone(&self.pool)
    }

    /// Sends `landing` to `dst` (as long as the body): a pinned body by an asynchronous copy
    /// (the one before it waited for), a body of its own memory by a synchronous one.
    pub(crate) fn upload(&mut self, landing: Landing, dst: RawRegion) -> Result<()> {
        match landing {
            Landing::Pinned { buffer, len } => {
                let copy =
                    self.stream.start_raw(buffer, 0, len, dst, 0, CopyDirection::HostToDevice)?;
                if let Some(previous) = self.in_flight.replace(copy) {
                    previous.wait()?;
                }
                Ok(())
            }
            Landing::Heap(bytes) => dst.copy_from_host(0, &bytes),
        }
    }

    /// Waits for the last copy.
    pub(crate) fn finish(mut self) -> Result<()> {
        match self.in_flight.take() {
            Some(last) => last.wait().map(drop),
            None => Ok(()),
        }
    }
}

/// The pinned buffers bodies bound for GPU `ordinal` land in: the pool the local device path
/// shares (two buffers per I/O thread), so that both draw on one bounded set, its bound raised
/// to `landings` (bodies held at once), within [`MAX_LANDING_BUFFERS`]. Binds the device's
/// context to the calling thread.
pub(crate) fn landing_pool(ordinal: usize, landings: usize) -> Result<Arc<BouncePool>> {
    let bound_asked = landings.min(MAX_LANDING_BUFFERS);
    // A request loop asks for the same pool at every read: it keeps the last one (and its
    // device), rather than take the process-wide locks that find them each time.
    let kept = LAST_POOL.with(|last| {
        last.borrow()
            .as_ref()
            .filter(|k| k.ordinal == ordinal && k.bound_asked == bound_asked)
            .cloned()
    });
    if let Some(kept) = kept {
        kept.device.bind_to_thread()?;
        return Ok(kept.pool);
    }
    let device = CudaDevice::new(ordinal)?;
    device.bind_to_thread()?;
    let buffer_size = usize::try_from(Config::global()?.bounce_buffer_size).unwrap_or(4 << 20);
    let local = 2 * IoPool::global()?.nthreads();
    let pool = BouncePool::for_device(&device, buffer_size, local.max(bound_asked))?;
    let kept = KeptPool { ordinal, bound_asked, device, pool: Arc::clone(&pool) };
    LAST_POOL.with(|last| *last.borrow_mut() = Some(kept));
    Ok(pool)
}

/// The pool a thread found last, and what it was asked for.
#[derive(Clone)]
struct KeptPool {
    ordinal: usize,
    bound_asked: usize,
    device: CudaDevice,
    pool: Arc<BouncePool>,
}

thread_local! {
    static LAST_POOL: std::cell::RefCell<Option<KeptPool>> = const { std::cell::RefCell::new(None) };
}

/// Where a body of `len` bytes lands: a free buffer of `pool` that holds it, else memory of
/// its own. Never waits for a buffer.
pub(crate) fn landing(pool: &Arc<BouncePool>, len: usize) -> Result<Landing> {
    if len <= pool.buffer_size() {
        if let Some(buffer) = pool.try_acquire()? {
            return Ok(Landing::Pinned { buffer, len });
        }
    }
    Ok(Landing::Heap(vec![0u8; len]))
}
