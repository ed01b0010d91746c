//! A bounded pool of page-aligned pinned bounce buffers, one pool per device.
//!
//! Pinning memory costs far more than moving the same bytes over PCIe
//! (docs/decisions/0005-bounce-buffers-4mib.md), so buffers are allocated lazily, once, and
//! recycled: a [`BounceBuffer`] goes back to its pool when dropped. The pool never holds more
//! than `max_buffers` (threads × 2 by default: one being filled and one being copied per
//! worker), and [`BouncePool::acquire`] blocks when all are out.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::memory::cuda::{CudaDevice, PinnedBuffer, StagingBuffer};

/// The process-wide pools, by (device ordinal, buffer size).
type PoolsByKey = HashMap<(usize, usize), Arc<BouncePool>>;

/// A pool of pinned buffers of one size for one device. Share it through the `Arc` that
/// [`BouncePool::new`] and [`BouncePool::for_device`] return.
pub struct BouncePool {
    device: CudaDevice,
    buffer_size: usize,
    state: Mutex<PoolState>,
    returned: Condvar,
}

struct PoolState {
    /// Buffers not handed out.
    free: Vec<PinnedBuffer>,
    /// Buffers in existence (free + handed out + being allocated).
    allocated: usize,
    /// Upper bound on `allocated`.
    max_buffers: usize,
}

impl fmt::Debug for BouncePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock();
        f.debug_struct("BouncePool")
            .field("device", &self.device.ordinal())
            .field("buffer_size", &self.buffer_size)
            .field("allocated", &state.allocated)
            .field("free", &state.free.len())
            .field("max_buffers", &state.max_buffers)
            .finish()
    }
}

impl BouncePool {
    /// A new, empty pool: buffers of `buffer_size` bytes on `device`, at most `max_buffers`.
    pub fn new(device: &CudaDevice, buffer_size: usize, max_buffers: usize) -> Result<Arc<Self>> {
        if buffer_size == 0 || max_buffers == 0 {
            return Err(Error::InvalidArgument(format!(
                "bounce pool needs a non-zero buffer size and count (got {buffer_size} bytes x \
                 {max_buffers})"
            )));
        }
        Ok(Arc::new(Self {
            device: device.clone(),
            buffer_size,
            state: Mutex::new(PoolState { free: Vec::new(), allocated: 0, max_buffers }),
            returned: Condvar::new(),
        }))
    }

    /// The process-wide pool for `device` and `buffer_size`, created on first use. A later call
    /// asking for a larger `max_buffers` raises the bound (never lowers it), so callers with
    /// different thread counts can share one pool.
    pub fn for_device(
        device: &CudaDevice,
        buffer_size: usize,
        max_buffers: usize,
    ) -> Result<Arc<Self>> {
        static POOLS: OnceLock<Mutex<PoolsByKey>> = OnceLock::new();
        let pools = POOLS.get_or_init(|| Mutex::new(HashMap::new()));
        let mut pools = pools.lock();
        if let Some(pool) = pools.get(&(device.ordinal(), buffer_size)) {
            let mut state = pool.state.lock();
            if max_buffers > state.max_buffers {
                state.max_buffers = max_buffers;
                pool.returned.notify_all();
            }
            return Ok(Arc::clone(pool));
        }
        let pool = Self::new(device, buffer_size, max_buffers)?;
        pools.insert((device.ordinal(), buffer_size), Arc::clone(&pool));
        Ok(pool)
    }

    /// Size of each buffer in bytes.
    pub fn buffer_size(&self) -> usize {
        self.buffer_size
    }

    /// The device the buffers are allocated for.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// The bound on buffers in existence.
    pub fn max_buffers(&self) -> usize {
        self.state.lock().max_buffers
    }

    /// Buffers allocated so far (free or handed out).
    pub fn allocated(&self) -> usize {
        self.state.lock().allocated
    }

    /// A buffer: a recycled one, a newly pinned one while under the bound, or else the next one
    /// returned (this blocks). A thread that already holds `max_buffers` buffers and asks for
    /// another waits forever; hold at most two per worker.
    pub fn acquire(self: &Arc<Self>) -> Result<BounceBuffer> {
        self.acquire_inner(true).and_then(|b| {
            b.ok_or_else(|| Error::InvalidArgument("bounce pool exhausted".to_owned()))
        })
    }

    /// Like [`BouncePool::acquire`] but returns `Ok(None)` instead of blocking.
    pub fn try_acquire(self: &Arc<Self>) -> Result<Option<BounceBuffer>> {
        self.acquire_inner(false)
    }

    fn acquire_inner(self: &Arc<Self>, block: bool) -> Result<Option<BounceBuffer>> {
        let mut state = self.state.lock();
        loop {
            if let Some(buffer) = state.free.pop() {
                return Ok(Some(self.wrap(buffer)));
            }
            if state.allocated < state.max_buffers {
                state.allocated += 1;
                break;
            }
            if !block {
                return Ok(None);
            }
            self.returned.wait(&mut state);
        }
        // Pinning takes milliseconds: do it without the lock so other threads can recycle.
        drop(state);
        match PinnedBuffer::new(&self.device, self.buffer_size) {
            Ok(buffer) => Ok(Some(self.wrap(buffer))),
            Err(e) => {
                self.state.lock().allocated -= 1;
                self.returned.notify_one();
                Err(e)
            }
        }
    }

    fn wrap(self: &Arc<Self>, buffer: PinnedBuffer) -> BounceBuffer {
        BounceBuffer { buffer, pool: Arc::clone(self) }
    }

    fn give_back(&self, buffer: PinnedBuffer) {
        self.state.lock().free.push(buffer);
        self.returned.notify_one();
    }
}

/// A pinned buffer on loan from a [`BouncePool`]; returns to the pool when dropped. Derefs to
/// `[u8]` of the pool's buffer size.
pub struct BounceBuffer {
    buffer: PinnedBuffer,
    pool: Arc<BouncePool>,
}

impl fmt::Debug for BounceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BounceBuffer").field("len", &self.buffer.len()).finish()
    }
}

impl BounceBuffer {
    /// The pool it returns to.
    pub fn pool(&self) -> &Arc<BouncePool> {
        &self.pool
    }

    /// The underlying pinned buffer.
    pub fn pinned(&self) -> &PinnedBuffer {
        &self.buffer
    }
}

impl Deref for BounceBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buffer.as_slice()
    }
}

impl DerefMut for BounceBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut_slice()
    }
}

impl StagingBuffer for BounceBuffer {
    fn pinned_mut(&mut self) -> &mut PinnedBuffer {
        &mut self.buffer
    }
}

impl Drop for BounceBuffer {
    fn drop(&mut self) {
        // Swap in an empty placeholder (no allocation) and hand the real buffer back.
        let buffer = std::mem::replace(&mut self.buffer, PinnedBuffer::empty());
        self.pool.give_back(buffer);
    }
}
