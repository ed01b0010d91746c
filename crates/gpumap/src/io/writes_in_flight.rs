//! [`WritesInFlight`]: the writes a file's futures have started and not finished, counted per
//! file and for the whole process, so that closing a file or ending the process can wait for
//! them instead of losing them (a future dropped unwaited lets its write run on, and a process
//! that exits ends the pool's threads wherever they are).

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::sys::posix::fork_generation;

/// A count of writes in flight, and a way to wait for none.
#[derive(Default)]
pub(crate) struct WritesInFlight {
    count: Mutex<Count>,
    none_left: Condvar,
}

/// Writes in flight in one process: a forked child inherits its parent's count, but not the
/// threads that run those writes, so it must neither wait for them (its exit would hang) nor
/// count their ends.
#[derive(Default)]
struct Count {
    generation: u64,
    writes: usize,
}

/// Every file's writes together.
static ALL: WritesInFlight = WritesInFlight::new();

impl WritesInFlight {
    const fn new() -> Self {
        WritesInFlight {
            count: Mutex::new(Count { generation: 0, writes: 0 }),
            none_left: Condvar::new(),
        }
    }

    /// Counts a write started; the token counts it done when dropped, however the write ends
    /// (done, failed, cancelled before it ran).
    pub(crate) fn start(self: &Arc<Self>) -> WriteInFlight {
        let generation = fork_generation();
        self.add(generation);
        ALL.add(generation);
        WriteInFlight { writes: self.clone(), generation }
    }

    /// Blocks until no write counted here is in flight in this process.
    pub(crate) fn wait(&self) {
        let generation = fork_generation();
        let mut count = self.count.lock();
        while count.generation == generation && count.writes > 0 {
            self.none_left.wait(&mut count);
        }
    }

    fn add(&self, generation: u64) {
        let mut count = self.count.lock();
        if count.generation != generation {
            *count = Count { generation, writes: 0 };
        }
        count.writes += 1;
    }

    fn done(&self, generation: u64) {
        let mut count = self.count.lock();
        if count.generation != generation {
            return; // a write of the parent's, whose count this process does not keep
        }
        count.writes -= 1;
        if count.writes == 0 {
            self.none_left.notify_all();
        }
    }
}

/// One write in flight (see [`WritesInFlight::start`]).
pub(crate) struct WriteInFlight {
    writes: Arc<WritesInFlight>,
    generation: u64,
}

impl Drop for WriteInFlight {
    fn drop(&mut self) {
        self.writes.done(self.generation);
        ALL.done(self.generation);
    }
}

/// Blocks until every write started through a [`FileHandle`](super::FileHandle)'s futures
/// (`pwrite`, `pwrite_device`) in this process has ended. For the end of a process: its pool's
/// threads end with it, and a write still running would be cut short, silently.
pub fn wait_for_all_writes() {
    ALL.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_end_when_the_last_write_does() {
        let file = Arc::new(WritesInFlight::default());
        file.wait(); // none yet: at once
        let writes: Vec<_> = (0..3).map(|_| file.start()).collect();
        let waiter = {
            let file = file.clone();
            std::thread::spawn(move || {
                file.wait();
                wait_for_all_writes();
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "three writes are in flight");
        drop(writes);
        waiter.join().unwrap();
        assert_eq!(file.count.lock().writes, 0);
    }
}
