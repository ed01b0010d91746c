//! [`WritesInFlight`]: the writes a file's futures have started and not finished, counted per
//! file and for the whole process, so that closing a file or ending the process can wait for
//! them instead of losing them (a future dropped unwaited lets its write run on, and a process
//! that exits ends the pool's threads wherever they are).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::sync::{Condvar, Mutex};

use crate::io::pool::{IoFuture, IoPool};
use crate::sys::posix::fork_generation;
use crate::{Error, Result};

/// A count of writes in flight, and a way to wait for those started before the wait.
#[derive(Default)]
pub(crate) struct WritesInFlight {
    count: Mutex<Count>,
    one_ended: Condvar,
}

/// Writes in flight in one process, by the epoch they started in: a wait ends the epoch and
/// waits only for the writes of the epochs up to it, so that writes started meanwhile (a
/// daemon thread writing on while the process exits) cannot keep it waiting for ever. A forked
/// child inherits its parent's count, but not the threads that run those writes, so it must
/// neither wait for them (its exit would hang) nor count their ends.
#[derive(Default)]
struct Count {
    generation: u64,
    epoch: u64,
    /// Writes in flight per epoch; an epoch with none is not kept.
    writes: BTreeMap<u64, usize>,
    /// Whether new writes are refused: the process's exit has begun ([`wait_for_all_writes`]).
    closed: bool,
}

/// Every file's writes together.
static ALL: WritesInFlight = WritesInFlight::new();

impl WritesInFlight {
    const fn new() -> Self {
        WritesInFlight {
            count: Mutex::new(Count {
                generation: 0,
                epoch: 0,
                writes: BTreeMap::new(),
                closed: false,
            }),
            one_ended: Condvar::new(),
        }
    }

    /// Counts a write started; the token counts it done when dropped, however the write ends
    /// (done, failed, cancelled before it ran). Refused once the process's exit has waited for
    /// its writes ([`wait_for_all_writes`]): a write started then would run on into the
    /// process's teardown and be cut short.
    pub(crate) fn start(self: &Arc<Self>) -> Result<WriteInFlight> {
        let generation = fork_generation();
        let all_epoch = ALL.add(generation).ok_or_else(|| Error::Unavailable {
            what: "a write",
            reason: "the process is exiting: a write started now would be cut short".into(),
        })?;
        let file_epoch = self.add(generation).unwrap_or_default(); // a file's count never closes
        Ok(WriteInFlight { writes: self.clone(), generation, file_epoch, all_epoch })
    }

    /// Blocks until every write counted here that started before the call has ended in this
    /// process (writes started during the wait are not waited for).
    pub(crate) fn wait(&self) {
        self.wait_closing(false);
    }

    /// [`wait`](Self::wait), refusing new writes from the call on where `close`.
    fn wait_closing(&self, close: bool) {
        let generation = fork_generation();
        let mut count = self.count.lock();
        if count.generation != generation {
            if !close {
                return;
            }
            *count = Count { generation, ..Count::default() };
        }
        count.closed |= close;
        let last = count.epoch;
        count.epoch += 1;
        while count.generation == generation
            && count.writes.first_key_value().is_some_and(|(&epoch, _)| epoch <= last)
        {
            self.one_ended.wait(&mut count);
        }
    }

    /// Counts a write started in this epoch, and returns the epoch; `None` once closed.
    fn add(&self, generation: u64) -> Option<u64> {
        let mut count = self.count.lock();
        if count.generation != generation {
            *count = Count { generation, ..Count::default() };
        }
        if count.closed {
            return None;
        }
        let epoch = count.epoch;
        *count.writes.entry(epoch).or_insert(0) += 1;
        Some(epoch)
    }

    fn done(&self, generation: u64, epoch: u64) {
        let mut count = self.count.lock();
        if count.generation != generation {
            return; // a write of the parent's, whose count this process does not keep
        }
        if let Some(writes) = count.writes.get_mut(&epoch) {
            *writes -= 1;
            if *writes == 0 {
                count.writes.remove(&epoch);
                self.one_ended.notify_all();
            }
        }
    }
}

/// Runs `job` on `pool` as a write counted in `writes` ([`WritesInFlight::start`]), holding
/// its token until the job ends; a refused start is the future's error.
pub(crate) fn spawn_counted<T, F>(
    writes: &Arc<WritesInFlight>,
    pool: &IoPool,
    job: F,
) -> IoFuture<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    match writes.start() {
        Ok(in_flight) => pool.spawn(move || {
            let _in_flight = in_flight;
            job()
        }),
        Err(e) => {
            let (future, completer) = IoFuture::pending();
            completer.complete(Err(e));
            future
        }
    }
}

/// One write in flight (see [`WritesInFlight::start`]).
pub(crate) struct WriteInFlight {
    writes: Arc<WritesInFlight>,
    generation: u64,
    file_epoch: u64,
    all_epoch: u64,
}

impl Drop for WriteInFlight {
    fn drop(&mut self) {
        self.writes.done(self.generation, self.file_epoch);
        ALL.done(self.generation, self.all_epoch);
    }
}

/// Blocks until every write started through a [`FileHandle`](super::FileHandle)'s futures
/// (`pwrite`, `pwrite_device`) in this process has ended, and refuses such writes from then
/// on ([`Error::Unavailable`]). For the end of a process: its pool's threads end with it, and
/// a write still running would be cut short, silently; threads that go on writing as the
/// process exits (daemon threads) get the error instead of holding the exit up.
pub fn wait_for_all_writes() {
    ALL.wait_closing(true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_end_when_the_last_write_does() {
        let file = Arc::new(WritesInFlight::default());
        file.wait(); // none yet: at once
        let writes: Vec<_> = (0..3).map(|_| file.start().unwrap()).collect();
        let waiter = {
            let file = file.clone();
            std::thread::spawn(move || {
                file.wait();
                ALL.wait(); // what wait_for_all_writes waits on (it would refuse later writes)
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "three writes are in flight");
        drop(writes);
        waiter.join().unwrap();
        assert!(file.count.lock().writes.is_empty());
    }

    #[test]
    fn a_wait_ends_though_writes_keep_starting() {
        let file = Arc::new(WritesInFlight::default());
        let before = file.start().unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            // A writer that always has a write in flight, each started before the last ends.
            scope.spawn(|| {
                let mut current = file.start().unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let next = file.start().unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    current = next;
                }
                drop(current);
            });
            let waiter = scope.spawn(|| file.wait());
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!waiter.is_finished(), "a write started before the wait is in flight");
            drop(before);
            // Ends while the writer goes on: only its writes started before the wait count.
            let waited = std::time::Instant::now();
            while !waiter.is_finished() && waited.elapsed() < std::time::Duration::from_secs(10) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let ended = waiter.is_finished();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(ended, "the wait never ended while writes kept starting");
        });
    }
}
