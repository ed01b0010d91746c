//! One thread that sends the bodies of one-request reads up to GPU memory, in batches: the
//! copies of every body that landed since its last round go out together, and one wait covers
//! them all.
//!
//! A request loop that copied and waited itself would stall its other requests for the wait,
//! and with a loop per core, as many threads would wait on the copy engine at once, each
//! spinning in the driver (docs/decisions/0030-small-remote-reads-on-loops.md). Handing the
//! body over lets the loop go on at once; whoever handed it over is told when it is in place.
#![forbid(unsafe_code)]

use std::rc::Rc;
use std::sync::Arc;

use crate::sync::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::memory::bounce::BounceBuffer;
use crate::memory::cuda::{CopyDirection, CudaDevice, InFlight, RawRegion, Stream};
use crate::per_process::PerProcess;
use crate::remote::upload::Landing;

/// What runs once a body is in place (or failed to get there); it owns whatever must live
/// until then (the destination, the permits the body was received under).
pub(crate) type Then = Box<dyn FnOnce(Result<()>) + Send>;

/// A body waiting to go up.
struct Job {
    body: Landing,
    dst: RawRegion,
    then: Then,
}

/// The bodies handed over and not yet taken by the thread.
#[derive(Default)]
struct Queue {
    jobs: Mutex<Vec<Job>>,
    ready: Condvar,
}

/// This process's queue, whose thread is started with it.
static QUEUE: PerProcess<Arc<Queue>> = PerProcess::new();

/// Sends `body` to the start of `dst` (as long as the body) from the upload thread, then runs
/// `then` with the outcome. Where the thread cannot be started, does both on the calling
/// thread.
pub(crate) fn upload_then(body: Landing, dst: RawRegion, then: Then) {
    let job = Job { body, dst, then };
    match queue() {
        Ok(queue) => {
            queue.jobs.lock().push(job);
            queue.ready.notify_one();
        }
        Err(e) => {
            tracing::debug!(error = %e, "no upload thread: the body goes up from the caller");
            run_batch(vec![job]);
        }
    }
}

fn queue() -> Result<Arc<Queue>> {
    QUEUE.get_or_try_make(|| {
        let queue = Arc::new(Queue::default());
        let serving = Arc::clone(&queue);
        let thread = std::thread::Builder::new().name("gpumap-upload".to_owned());
        crate::per_process::spawn_apart_from_fork(|| thread.spawn(move || serve(&serving)))
            .map_err(|e| Error::Unavailable {
                what: "the remote upload thread",
                reason: e.to_string(),
            })?;
        Ok(queue)
    })
}

/// The thread: takes every body handed over since its last round, and sends them up.
fn serve(queue: &Queue) {
    loop {
        let batch = {
            let mut jobs = queue.jobs.lock();
            while jobs.is_empty() {
                queue.ready.wait(&mut jobs);
            }
            std::mem::take(&mut *jobs)
        };
        run_batch(batch);
    }
}

/// Starts every pinned body's copy (each on the stream of its device), sends up the others by
/// a synchronous copy, then waits for the copies in the order they were started: by the last
/// one's turn, the earlier are done.
fn run_batch(batch: Vec<Job>) {
    let mut started: Vec<(InFlight<'static, BounceBuffer>, Then)> = Vec::with_capacity(batch.len());
    // The stream of the device the last body went to: most batches are all for one.
    let mut last: Option<Rc<Stream>> = None;
    for Job { body, dst, then } in batch {
        match body {
            Landing::Pinned { buffer, len } => match start(&mut last, buffer, len, dst) {
                Ok(copy) => started.push((copy, then)),
                Err(e) => then(Err(e)),
            },
            Landing::Heap(bytes) => then(dst.copy_from_host(0, &bytes)),
        }
    }
    for (copy, then) in started {
        then(copy.wait().map(drop));
    }
}

/// Starts the copy of `buffer`'s first `len` bytes to `dst`, on this thread's stream of its
/// device (`last`, where it is that device's).
fn start(
    last: &mut Option<Rc<Stream>>,
    buffer: BounceBuffer,
    len: usize,
    dst: RawRegion,
) -> Result<InFlight<'static, BounceBuffer>> {
    let stream = match last.take() {
        Some(stream) if stream.device().ordinal() == dst.ordinal => stream,
        _ => {
            let device = CudaDevice::new(dst.ordinal)?;
            device.bind_to_thread()?;
            Stream::for_current_thread(&device)?
        }
    };
    let copy = stream.start_raw(buffer, 0, len, dst, 0, CopyDirection::HostToDevice);
    *last = Some(stream);
    copy
}
