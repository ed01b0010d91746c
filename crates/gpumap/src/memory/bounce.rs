//! A bounded pool of page-aligned pinned bounce buffers, one pool per device.
//!
//! Pinning memory costs far more than moving the same bytes over PCIe
//! (docs/decisions/0005-bounce-buffers-4mib.md), so buffers are allocated lazily, once, and
//! recycled: a [`BounceBuffer`] goes back to its pool when dropped. They are pinned in groups
//! that double the pool (2, 2, 4, 8, ...), one registration each, because the driver takes its
//! registrations one at a time and each costs about as much as a group's
//! (docs/decisions/0037-pinned-buffers-registered-together.md). The pool never holds more
//! than `max_buffers` (threads × 2 by default: one being filled and one being copied per
//! worker), and [`BouncePool::acquire`] blocks when all are out.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, OnceLock};

use crate::sync::{Condvar, Mutex};

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
        let count = loop {
            if let Some(buffer) = state.free.pop() {
                return Ok(Some(self.wrap(buffer)));
            }
            if state.allocated < state.max_buffers {
                let count = group_size(state.allocated, state.max_buffers);
                state.allocated += count;
                break count;
            }
            if !block {
                return Ok(None);
            }
            self.returned.wait(&mut state);
        };
        // Pinning takes milliseconds: do it without the lock so other threads can recycle.
        drop(state);
        let made = PinnedBuffer::new_many(&self.device, self.buffer_size, count);
        let mut state = self.state.lock();
        let mut made = match made {
            Ok(made) => made,
            Err(e) => {
                state.allocated -= count;
                drop(state);
                self.returned.notify_all();
                return Err(e);
            }
        };
        state.allocated -= count - made.len();
        let Some(mine) = made.pop() else {
            drop(state);
            self.returned.notify_all();
            return Err(Error::Unavailable {
                what: "pinned memory",
                reason: format!("no buffer of {} bytes was made", self.buffer_size),
            });
        };
        state.free.append(&mut made);
        drop(state);
        self.returned.notify_all();
        Ok(Some(self.wrap(mine)))
    }

    fn wrap(self: &Arc<Self>, buffer: PinnedBuffer) -> BounceBuffer {
        BounceBuffer { buffer, pool: Arc::clone(self) }
    }

    fn give_back(&self, buffer: PinnedBuffer) {
        self.state.lock().free.push(buffer);
        self.returned.notify_one();
    }
}

/// How many buffers a pool of `allocated` buffers, bounded by `max_buffers`, pins next: as
/// many as it has (two at first), so that it doubles, never past its bound.
fn group_size(allocated: usize, max_buffers: usize) -> usize {
    allocated.max(2).min(max_buffers.saturating_sub(allocated))
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::group_size;

    #[test]
    fn groups_double_the_pool_up_to_its_bound() {
        for (max, groups) in [
            (1, vec![1]),
            (2, vec![2]),
            (3, vec![2, 1]),
            (5, vec![2, 2, 1]),
            (32, vec![2, 2, 4, 8, 16]),
            (40, vec![2, 2, 4, 8, 16, 8]),
        ] {
            let mut allocated = 0;
            let mut seen = Vec::new();
            while allocated < max {
                let count = group_size(allocated, max);
                seen.push(count);
                allocated += count;
            }
            assert_eq!(seen, groups, "max {max}");
        }
        assert_eq!(group_size(7, 7), 0);
        assert_eq!(group_size(9, 7), 0);
    }

    proptest! {
        #[test]
        fn groups_reach_the_bound_in_few_steps(max in 1usize..100_000, start in 0usize..100_000) {
            let mut allocated = start.min(max);
            let mut steps = 0u32;
            while allocated < max {
                let count = group_size(allocated, max);
                prop_assert!(count >= 1);
                prop_assert!(count <= allocated.max(2));
                allocated += count;
                prop_assert!(allocated <= max);
                steps += 1;
            }
            prop_assert!(steps <= usize::BITS - max.leading_zeros() + 1, "{steps} steps to {max}");
        }
    }
}
