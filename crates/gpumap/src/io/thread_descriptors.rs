//! A read-only descriptor of its own for each I/O thread that reads an open file in small
//! pieces.
//!
//! Every `pread` on a descriptor the process's threads share takes a reference on one `struct
//! file`, whose counter then bounces between cores: on a 16-core test machine sixteen threads
//! reading 1.5–8 KiB pieces through one descriptor moved a third to a half of what they moved
//! through one descriptor each (decision 0022). A descriptor opened again through
//! `/proc/self/fd/N` is a new open file description of the same inode (renamed or unlinked
//! since, it is still the same file), so reads through it see exactly what reads through the
//! first one see.
//!
//! Descriptors are a process's resource: the extra ones are opened lazily, one per pool thread
//! that reads the file, and within a process-wide budget (a quarter of the soft open-files
//! limit, at most [`MAX_EXTRA`]), so that they never take the descriptors a program counts on.
//! Where none can be had the shared descriptor serves, as before.
#![forbid(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::sys::posix;

/// Reads of at most this many bytes take the thread's own descriptor; larger ones spend so
/// long copying that the shared counter costs them nothing measurable.
pub(super) const OWN_DESCRIPTOR_MAX: usize = 1 << 20;

/// Pool threads of one file with a descriptor of their own, at most: threads past this one
/// share the file's first descriptor.
const MAX_SLOTS: usize = 64;

/// Extra descriptors the whole process holds at once, at most.
pub const MAX_EXTRA: usize = 1024;

/// Extra descriptors open now, in every file.
static OPEN_EXTRA: AtomicUsize = AtomicUsize::new(0);

/// The extra descriptors of one open file, one slot per pool thread.
pub(super) struct ThreadDescriptors {
    /// `None` in a slot whose descriptor could not be had (budget spent, `/proc` missing,
    /// permission since taken away): that thread reads through the shared one.
    slots: Box<[OnceLock<Option<File>>]>,
}

impl ThreadDescriptors {
    pub(super) fn new() -> ThreadDescriptors {
        ThreadDescriptors { slots: (0..MAX_SLOTS).map(|_| OnceLock::new()).collect() }
    }

    /// The descriptor a read of `len` bytes of `shared`'s file should go through on this
    /// thread: its own on a pool thread, for a small read, where one is open or can be opened;
    /// `shared` otherwise.
    pub(super) fn for_read<'a>(&'a self, shared: &'a File, len: usize) -> &'a File {
        if len > OWN_DESCRIPTOR_MAX {
            return shared;
        }
        let Some(slot) = rayon::current_thread_index().and_then(|i| self.slots.get(i)) else {
            return shared;
        };
        slot.get_or_init(|| reopen(shared)).as_ref().unwrap_or(shared)
    }

    /// How many extra descriptors this file holds.
    #[cfg(test)]
    fn open_count(&self) -> usize {
        self.slots.iter().filter(|s| matches!(s.get(), Some(Some(_)))).count()
    }
}

impl Drop for ThreadDescriptors {
    fn drop(&mut self) {
        let held = self.slots.iter_mut().filter_map(|s| s.take().flatten()).count();
        OPEN_EXTRA.fetch_sub(held, Ordering::Relaxed);
    }
}

/// The extra descriptors the process may hold: a quarter of the soft `RLIMIT_NOFILE`, within
/// [`MAX_EXTRA`].
fn budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let limit = posix::soft_limit(libc::RLIMIT_NOFILE).unwrap_or(u64::MAX);
        usize::try_from(limit / 4).unwrap_or(usize::MAX).min(MAX_EXTRA)
    })
}

/// Counts one more descriptor in `open`; `false`, counting nothing, where `budget` are open.
fn reserve(open: &AtomicUsize, budget: usize) -> bool {
    open.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < budget).then_some(n + 1))
        .is_ok()
}

/// `shared`'s file opened again for reading, through `/proc/self/fd`; `None` where the budget
/// is spent or the open fails (the reason traced).
fn reopen(shared: &File) -> Option<File> {
    if !reserve(&OPEN_EXTRA, budget()) {
        return None;
    }
    let opened = open_same(shared);
    if opened.is_none() {
        OPEN_EXTRA.fetch_sub(1, Ordering::Relaxed);
    }
    opened
}

fn open_same(shared: &File) -> Option<File> {
    // Regular files only: opening a FIFO again for reading would wait for a writer.
    let a = shared.metadata().ok()?;
    if !a.file_type().is_file() {
        return None;
    }
    let link = format!("/proc/self/fd/{}", shared.as_raw_fd());
    let file = match File::open(&link) {
        Ok(file) => file,
        Err(e) => {
            tracing::debug!(%link, error = %e, "no descriptor of its own for an I/O thread");
            return None;
        }
    };
    // The link names the inode the descriptor holds; a mismatch would mean something other
    // than procfs answers at /proc, so the shared descriptor is kept.
    let b = file.metadata().ok()?;
    if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
        tracing::debug!(%link, "/proc/self/fd named another file; shared descriptor kept");
        return None;
    }
    Some(file)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    fn pool(n: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap()
    }

    #[test]
    fn pool_threads_read_the_same_bytes_through_their_own_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, (0..=255u8).cycle().take(1 << 16).collect::<Vec<_>>()).unwrap();
        let shared = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        // Renamed and then unlinked: a descriptor opened again is still this file.
        std::fs::rename(&path, dir.path().join("moved")).unwrap();
        std::fs::remove_file(dir.path().join("moved")).unwrap();
        let own = ThreadDescriptors::new();
        // The calling thread is no pool thread: it reads through the shared descriptor.
        assert!(std::ptr::eq(own.for_read(&shared, 4096), &shared));
        let threads = pool(4);
        threads.broadcast(|_| {
            let file = own.for_read(&shared, 4096);
            assert!(!std::ptr::eq(file, &shared), "a pool thread got the shared descriptor");
            // Large reads stay on the shared one.
            assert!(std::ptr::eq(own.for_read(&shared, OWN_DESCRIPTOR_MAX + 1), &shared));
            let mut buf = [0u8; 300];
            file.read_exact_at(&mut buf, 1000).unwrap();
            assert!(buf.iter().enumerate().all(|(i, &b)| b == ((1000 + i) % 256) as u8));
        });
        assert_eq!(own.open_count(), 4);
        // A write through the shared descriptor is seen through every other one.
        shared.write_all_at(&[7u8; 16], 2000).unwrap();
        threads.broadcast(|_| {
            let mut buf = [0u8; 16];
            own.for_read(&shared, 16).read_exact_at(&mut buf, 2000).unwrap();
            assert_eq!(buf, [7u8; 16]);
        });
    }

    #[test]
    fn a_fifo_keeps_its_shared_descriptor_and_never_waits_for_a_writer() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fifo");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap();
        // Opened for reading without a writer (non-blocking): opening it again for reading
        // would wait for one, forever.
        let shared = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let own = ThreadDescriptors::new();
            let same = pool(2).install(|| std::ptr::eq(own.for_read(&shared, 16), &shared));
            let _ = done.send(same);
        });
        let same = finished.recv_timeout(std::time::Duration::from_secs(20));
        assert_eq!(same, Ok(true), "a FIFO got a descriptor of its own, or the open waited");
    }

    #[test]
    fn the_budget_is_never_passed_even_by_threads_at_once() {
        assert!(budget() <= MAX_EXTRA);
        let open = AtomicUsize::new(0);
        let granted = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..100 {
                        if reserve(&open, 37) {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(granted.load(Ordering::Relaxed), 37);
        assert_eq!(open.load(Ordering::Relaxed), 37);
    }
}
