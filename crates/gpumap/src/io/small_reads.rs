//! `pread_device` futures, and the coalescing of the small ones.
//!
//! Small reads into GPU memory on the POSIX path (at most a quarter of a bounce buffer) that
//! are in flight together queue on the handle (`small_read_queue`); up to one drainer per pool
//! thread takes a fair share of the queue at a time (one device, within one bounce buffer) and
//! sends it through the batch path (`batch::read_group`): one pinned buffer and one
//! host-to-device copy per run of adjacent destinations instead of one per read. A group that
//! fails is read again read by read, so that each future gets its own answer.
//!
//! A thread that waits on the future of a read still queued does not sleep until a drainer has
//! read it: the future's helper takes the read, with those queued after it as a drainer would
//! take them, and reads them on the waiting thread. A drainer that finds the queue emptied by
//! waiters ends. A lone read, with nothing queued or being drained, whose bytes the page cache
//! holds does not queue at all: it is read as it is submitted (`lone_reads`).
#![forbid(unsafe_code)]

use std::sync::{Arc, Weak};

use crate::align::checked_end;
use crate::error::Result;
use crate::io::batch;
use crate::io::device_io;
use crate::io::handle_state::HandleState;
use crate::io::lone_reads;
use crate::io::pool::{cancelled, Help, IoFuture};
use crate::io::small_read_queue::{QueuedRead, ReadId};
use crate::memory::cuda::RawRegion;
use crate::memory::{DeviceViewMut, OwnedDeviceMemory};

/// Reads into the owned `dst` from `offset` on the pool; a small read into GPU memory on the
/// POSIX path is queued to be coalesced, and its waiter may read it itself. The future gives
/// back `dst` and the count read.
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
            dst = match lone_reads::read_now(state, dst, raw, offset) {
                Ok(future) => return future,
                Err(dst) => dst,
            };
            let (future, completer) = IoFuture::pending();
            let finish = Box::new(move |result: Result<usize>| {
                completer.complete(result.map(|n| (*dst, n)));
            });
            let id = enqueue(state, raw, offset, finish);
            // Weak: a future kept after its read is done must not keep the file open.
            let shared = Arc::downgrade(state);
            future.set_helper(Box::new(move |help| take_back(&shared, id, help)));
            return future;
        }
    }
    let shared = Arc::clone(state);
    state.pool.spawn(move || {
        let n = device_io::read_device(&shared, dst.device_view_mut(), offset)?;
        Ok((*dst, n))
    })
}

/// Queues a read, and starts a drainer where fewer than one per pool thread run.
fn enqueue(
    state: &Arc<HandleState>,
    dst: RawRegion,
    offset: u64,
    finish: Box<dyn FnOnce(Result<usize>) + Send>,
) -> ReadId {
    let (id, start_drainer) =
        state.small_reads.lock().push(dst, offset, finish, state.pool.nthreads());
    if start_drainer {
        let shared = Arc::clone(state);
        state.pool.spawn_detached(move || drain(&shared));
    }
    id
}

/// The helper of a queued read's future: where read `id` still waits, reads it (and the reads
/// a drainer would take with it) on this thread, or, cancelled, ends it unread. Where a
/// drainer took it, nothing: the caller waits for the drainer. Polls leave it to the drainers
/// (the helper stays for a later wait).
fn take_back(state: &Weak<HandleState>, id: ReadId, help: Help) -> bool {
    match help {
        Help::Poll | Help::Finish => false,
        Help::Run => {
            // Gone: no drainer holds the state, so nothing is left queued.
            if let Some(state) = state.upgrade() {
                let capacity = state.settings.bounce_buffer_size as usize;
                // The lock is held only while the group is taken, never over the reads.
                let group =
                    state.small_reads.lock().take_group_at(id, state.pool.nthreads(), capacity);
                if let Some(group) = group {
                    read_group(&state, group);
                }
            }
            true
        }
        Help::Cancel => {
            if let Some(state) = state.upgrade() {
                let read = state.small_reads.lock().remove(id);
                if let Some(read) = read {
                    (read.finish)(Err(cancelled()));
                }
            }
            true
        }
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
        read_group(state, group);
    }
}

/// Reads a group taken from the queue and completes each read's future.
fn read_group(state: &HandleState, group: Vec<QueuedRead>) {
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
