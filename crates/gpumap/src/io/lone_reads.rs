//! A lone small `pread_device` is read as it is submitted, where the page cache holds its bytes:
//! one `preadv2(RWF_NOWAIT)` into a pinned buffer of the process-wide pool (`lone_buffer`) and
//! its copy to the GPU queued on the calling thread's stream; the future then only waits for
//! that copy. A read waited for at once thus costs what the `pread` and the copy cost, with no
//! queue, no drainer woken and no helper taking it back from the queue.
//!
//! Any other read goes to the queue (`small_reads`): one submitted while others wait or are
//! being drained, or while another lone read of the same handle runs (so reads in flight
//! together are still coalesced), one that finds every pooled buffer lent, or one the page
//! cache cannot serve at once (so a disk read never blocks the caller), wholly or in part — the
//! queue's path reads it again and reports its errors.
//!
//! The future's helper ends the read: a wait waits for the copy, a poll completes it once the
//! copy has ended, a cancel leaves it (nothing is left to stop), and a dropped future waits for
//! the copy before the caller's memory goes.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::sync::Mutex;

use crate::error::Result;
use crate::io::direct::{self, ReadPlan};
use crate::io::handle_state::HandleState;
use crate::io::lone_buffer::{LonePool, Take};
use crate::io::pool::{Completer, Help, IoFuture};
use crate::memory::cuda::{CopyDirection, CudaDevice, InFlight, PinnedBuffer, RawRegion, Stream};
use crate::memory::OwnedDeviceMemory;
use crate::sys::posix;

/// The largest read served so (each pooled buffer is this long).
pub(super) const LONE_READ_MAX: usize = 64 << 10;

/// The most pooled buffers: 4 MiB pinned for the whole process, however many handles are open.
const LONE_BUFFERS_MAX: usize = 64;

static LONE_BUFFERS: Mutex<LonePool<PinnedBuffer>> =
    crate::sync::Mutex::new(LonePool::new(LONE_BUFFERS_MAX));

/// Reads `dst` (at `raw`) from `offset` now if it is a lone read the page cache holds (see the
/// module docs); its future, or `dst` back for the queue.
pub(super) fn read_now<B: OwnedDeviceMemory>(
    state: &Arc<HandleState>,
    dst: Box<B>,
    raw: RawRegion,
    offset: u64,
) -> std::result::Result<IoFuture<(B, usize)>, Box<B>> {
    if raw.len > LONE_READ_MAX
        || direct::read_plan(state, offset, raw.len as u64) != ReadPlan::Buffered
        || !state.small_reads.lock().is_idle()
    {
        return Err(dst);
    }
    // One at a time per handle: a burst of reads on one handle queues, and coalesces.
    let running = &state.lone_read_running;
    if running.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_err() {
        return Err(dst);
    }
    let Some(mut buffer) = take_buffer(raw.ordinal) else {
        running.store(false, Ordering::Release);
        return Err(dst);
    };
    let cached = posix::pread_cached(&state.file, &mut buffer.as_mut_slice()[..raw.len], offset);
    if cached != Some(raw.len) {
        LONE_BUFFERS.lock().give_back(buffer);
        running.store(false, Ordering::Release);
        return Err(dst);
    }
    let copy = match start_copy(buffer, raw) {
        Ok(copy) => copy,
        Err(e) => {
            // The queue's path reads it again, and reports the error if it is the device's.
            tracing::debug!("a lone read's copy did not start: {e}");
            LONE_BUFFERS.lock().lost();
            running.store(false, Ordering::Release);
            return Err(dst);
        }
    };
    let (future, completer) = IoFuture::pending();
    let mut read = LoneRead {
        copy: Some(copy),
        dst: Some(dst),
        len: raw.len,
        completer: Some(completer),
        state: Arc::downgrade(state),
    };
    future.set_helper(Box::new(move |help| read.help(help)));
    Ok(future)
}

/// A pooled buffer, lent (allocated if none is free and the pool may grow); `None` where every
/// buffer the pool may hold is lent or the allocation failed.
fn take_buffer(ordinal: usize) -> Option<PinnedBuffer> {
    // The lock is held only to lend, never over the allocation.
    let taken = LONE_BUFFERS.lock().take();
    match taken {
        Take::Buffer(buffer) => Some(buffer),
        Take::Exhausted => None,
        Take::Allocate => {
            let allocated = CudaDevice::new(ordinal)
                .and_then(|device| PinnedBuffer::new(&device, LONE_READ_MAX));
            match allocated {
                Ok(buffer) => Some(buffer),
                Err(e) => {
                    tracing::debug!("no pinned buffer for lone reads: {e}");
                    LONE_BUFFERS.lock().lost();
                    None
                }
            }
        }
    }
}

/// Queues the copy of the buffer's first `raw.len` bytes to `raw` on this thread's stream.
fn start_copy(buffer: PinnedBuffer, raw: RawRegion) -> Result<InFlight<'static, PinnedBuffer>> {
    let device = CudaDevice::new(raw.ordinal)?;
    let stream = Stream::for_current_thread(&device)?;
    stream.start_raw(buffer, 0, raw.len, raw, 0, CopyDirection::HostToDevice)
}

/// A lone read whose bytes are read and whose copy is queued: what its future's helper ends.
struct LoneRead<B> {
    /// `None` once ended.
    copy: Option<InFlight<'static, PinnedBuffer>>,
    /// The caller's memory, which the copy writes into: handed back only after it ended.
    dst: Option<Box<B>>,
    len: usize,
    completer: Option<Completer<(B, usize)>>,
    /// Weak: a future kept after its read is done must not keep the file open.
    state: Weak<HandleState>,
}

impl<B> LoneRead<B> {
    /// The helper's answer to `help` (see [`crate::io::pool::Helper`]).
    fn help(&mut self, help: Help) -> bool {
        match help {
            Help::Run | Help::Finish => {}
            // Nothing is left to stop: the copy ends on its own, and a later call completes it.
            Help::Cancel => return false,
            Help::Poll => {
                let running =
                    self.copy.as_ref().is_some_and(|c| matches!(c.is_complete(), Ok(false)));
                if running {
                    return false;
                }
            }
        }
        self.end();
        true
    }

    /// Waits for the copy, gives the buffer back, lets the handle's next lone read run and
    /// completes the future.
    fn end(&mut self) {
        let Some(copy) = self.copy.take() else { return };
        let result = match copy.wait() {
            Ok(buffer) => {
                LONE_BUFFERS.lock().give_back(buffer);
                Ok(())
            }
            Err(e) => {
                LONE_BUFFERS.lock().lost();
                Err(e)
            }
        };
        if let Some(state) = self.state.upgrade() {
            state.lone_read_running.store(false, Ordering::Release);
        }
        if let (Some(dst), Some(completer)) = (self.dst.take(), self.completer.take()) {
            completer.complete(result.map(|()| (*dst, self.len)));
        }
    }
}

impl<B> Drop for LoneRead<B> {
    fn drop(&mut self) {
        // A future dropped unwaited: the caller's memory goes only after the copy into it.
        self.end();
    }
}
