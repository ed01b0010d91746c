//! `pread_device` futures, and the coalescing of the small ones.
//!
//! Small reads into GPU memory on the POSIX path (at most a quarter of a bounce buffer) that
//! are in flight together queue on the handle (`small_read_queue`); up to one drainer per pool
//! thread takes a fair share of the queue at a time (one device, within one bounce buffer) and
//! sends it through the batch path (`batch::read_group`): one pinned buffer and one
//! host-to-device copy per run of adjacent destinations instead of one per read. A group that
//! fails is read again read by read, so that each future gets its own answer.
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::align::checked_end;
use crate::error::Result;
use crate::io::batch;
use crate::io::device_io;
use crate::io::handle_state::HandleState;
use crate::io::pool::IoFuture;
use crate::io::small_read_queue::QueuedRead;
use crate::memory::cuda::RawRegion;
use crate::memory::{DeviceViewMut, OwnedDeviceMemory};

/// Reads into the owned `dst` from `offset` on the pool; a small read into GPU memory on the
/// POSIX path is queued to be coalesced. The future gives back `dst` and the count read.
pub(super) fn pread_device<B: OwnedDeviceMemory>(
    state: &Arc<HandleState>,
    dst: B,
    offset: u64,
) -> IoFuture<(B, usize)> {
    // Boxed first, so the memory the queue points at cannot move with `dst`.
    let mut dst = Box::new(dst);
    if let DeviceViewMut::Cuda(view) = dst.device_view_mut() {
        let raw = view.raw;
        let small = raw.len != 0 && raw.len as u64 <= state.settings.bounce_buffer_size / 4;
        if small
            && state.check_read().is_ok()
            && checked_end(offset, raw.len as u64).is_ok()
            && state.cufile_for(raw.len).is_none()
        {
            let (future, completer) = IoFuture::pending();
            let finish = Box::new(move |result: Result<usize>| {
                completer.complete(result.map(|n| (*dst, n)));
            });
            enqueue(state, QueuedRead { dst: raw, offset, finish });
            return future;
        }
    }
    let shared = Arc::clone(state);
    state.pool.spawn(move || {
        let n = device_io::read_device(&shared, dst.device_view_mut(), offset)?;
        Ok((*dst, n))
    })
}

/// Queues `read`, and starts a drainer where fewer than one per pool thread run.
fn enqueue(state: &Arc<HandleState>, read: QueuedRead) {
    let start_drainer = state.small_reads.lock().push(read, state.pool.nthreads());
    if start_drainer {
        let shared = Arc::clone(state);
        state.pool.spawn_detached(move || drain(&shared));
    }
}

/// A drainer: takes groups of queued small reads until the queue is empty.
fn drain(state: &HandleState) {
    let capacity = state.settings.bounce_buffer_size as usize;
    loop {
        // The lock is held only while the group is taken, never over the reads.
        let Some(group) = state.small_reads.lock().take_group(state.pool.nthreads(), capacity)
        else {
            return;
        };
        let reads: Vec<(RawRegion, u64)> = group.iter().map(|r| (r.dst, r.offset)).collect();
        let mut counts = vec![0usize; reads.len()];
        match batch::read_group(state, &reads, &mut counts) {
            Ok(_) => {
                for (read, n) in group.into_iter().zip(counts) {
                    (read.finish)(Ok(n));
                }
            }
            // Each read again on its own, so each future gets its own answer.
            Err(_) => {
                for read in group {
                    (read.finish)(device_io::read_cuda(state, read.dst, read.offset));
                }
            }
        }
    }
}
