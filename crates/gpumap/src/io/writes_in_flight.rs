//! [`WritesInFlight`]: the writes a file's futures have started and not finished, counted per
//! file and for the whole process, so that closing a file or ending the process can wait for
//! them instead of losing them (a future dropped unwaited lets its write run on, and a process
//! that exits ends the pool's threads wherever they are).

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// A count of writes in flight, and a way to wait for none.
#[derive(Default)]
pub(crate) struct WritesInFlight {
    count: Mutex<usize>,
    none_left: Condvar,
}

/// Every file's writes together.
static ALL: WritesInFlight = WritesInFlight::new();

impl WritesInFlight {
    const fn new() -> Self {
        WritesInFlight { count: Mutex::new(0), none_left: Condvar::new() }
    }

    /// Counts a write started; the token counts it done when dropped, however the write ends
    /// (done, failed, cancelled before it ran).
    pub(crate) fn start(self: &Arc<Self>) -> WriteInFlight {
        self.add();
        ALL.add();
        WriteInFlight { writes: self.clone() }
    }

    /// Blocks until no write counted here is in flight.
    pub(crate) fn wait(&self) {
        let mut count = self.count.lock();
        while *count > 0 {
            self.none_left.wait(&mut count);
        }
    }

    fn add(&self) {
        *self.count.lock() += 1;
    }

    fn done(&self) {
        let mut count = self.count.lock();
        *count -= 1;
        if *count == 0 {
            self.none_left.notify_all();
        }
    }
}

/// One write in flight (see [`WritesInFlight::start`]).
pub(crate) struct WriteInFlight {
    writes: Arc<WritesInFlight>,
}

impl Drop for WriteInFlight {
    fn drop(&mut self) {
        self.writes.done();
        ALL.done();
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
        assert_eq!(*file.count.lock(), 0);
    }
}
