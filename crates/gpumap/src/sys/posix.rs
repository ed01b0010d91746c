//! POSIX file I/O: positional read/write loops, `O_DIRECT` opens, sync. (Page-cache calls —
//! advice, residency, locking — are in `sys::pagecache`.)
//!
//! One function per system call (or per loop around one), each documented with the call it maps
//! to. The standard library's safe wrappers (`FileExt::read_at` is `pread64`) carry most calls;
//! `fstatfs` and `fcntl`, which it lacks, are called through `libc`, one public function per
//! `fcntl` command. This is the layer that speaks to the kernel and turns its answers (short
//! counts, `EINTR`, `EINVAL`) into [`crate::Error`] (or, for the `fcntl` calls, which have no
//! path to name, into `io::Error`).

use std::fs::{File, OpenOptions};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::error::{Error, Result};

/// Reads into `buf` at `offset` until `buf` is full or the file ends; returns the count read.
///
/// A loop over `pread(2)`: short reads continue, `EINTR` is retried, a zero-byte read is end of
/// file.
#[doc(alias = "pread")]
#[doc(alias = "pread64")]
pub fn pread_full(file: &File, path: &Path, mut buf: &mut [u8], offset: u64) -> Result<usize> {
    let mut done = 0usize;
    while !buf.is_empty() {
        let at = offset + done as u64;
        match file.read_at(buf, at) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                buf = &mut buf[n..];
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("pread", path, Some(at), e)),
        }
    }
    Ok(done)
}

/// What `getrlimit` takes: glibc names the resource type, other C libraries take an `int`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub type Resource = libc::__rlimit_resource_t;
/// What `getrlimit` takes: glibc names the resource type, other C libraries take an `int`.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub type Resource = libc::c_int;

/// The soft limit of `resource` (`RLIMIT_NOFILE`, `RLIMIT_MEMLOCK`, ...): `getrlimit(2)`.
/// `None` when unlimited, or where the call fails.
#[doc(alias = "getrlimit")]
pub fn soft_limit(resource: Resource) -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a live, writable `struct rlimit` for the duration of the call.
    let status = unsafe { libc::getrlimit(resource, &mut limit) };
    if status != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    // `rlim_t` is 32 bits wide on some targets.
    #[allow(clippy::unnecessary_cast)]
    Some(limit.rlim_cur as u64)
}

/// Reads into `buf` at `offset` only what the page cache holds now: one `preadv2(2)` with
/// `RWF_NOWAIT`, which fails with `EAGAIN` rather than wait for the disk. The count read (short
/// where only part of the range is cached or the file ends first), or `None` where the kernel
/// would have had to wait, cannot serve such a read (`EOPNOTSUPP`, or `EINVAL`/`ENOSYS` before
/// Linux 4.14), was interrupted, or failed: the caller then reads the ordinary way, which waits
/// and reports errors.
#[doc(alias = "preadv2")]
#[doc(alias = "RWF_NOWAIT")]
pub fn pread_cached(file: &File, buf: &mut [u8], offset: u64) -> Option<usize> {
    let offset = libc::off_t::try_from(offset).ok()?;
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: `iov` describes `buf`, writable for its length and exclusively borrowed for the
    // call; the descriptor is `file`'s, open for the call.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset, libc::RWF_NOWAIT) };
    usize::try_from(n).ok()
}

/// Writes all of `buf` at `offset`.
///
/// A loop over `pwrite(2)`: short writes continue, `EINTR` is retried; a write of zero bytes
/// (which only a full device can cause) is reported as `WriteZero`.
#[doc(alias = "pwrite")]
#[doc(alias = "pwrite64")]
pub fn pwrite_all(file: &File, path: &Path, mut buf: &[u8], offset: u64) -> Result<usize> {
    let mut done = 0usize;
    while !buf.is_empty() {
        let at = offset + done as u64;
        // Where a test armed a fault, this write may be cut short or fail (no-op otherwise).
        let allowed = crate::fault::before_write(path, buf.len())
            .map_err(|e| Error::io("pwrite", path, Some(at), e))?;
        match file.write_at(&buf[..allowed], at) {
            Ok(0) => {
                let e = io::Error::new(io::ErrorKind::WriteZero, "pwrite wrote no bytes");
                return Err(Error::io("pwrite", path, Some(at), e));
            }
            Ok(n) => {
                done += n;
                buf = &buf[n..];
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("pwrite", path, Some(at), e)),
        }
    }
    Ok(done)
}

/// Appends all of `buf` to a file opened with `O_APPEND`: a loop over `write(2)`, each call
/// placed atomically at the end of the file by the kernel.
#[doc(alias = "write")]
pub fn append_all(file: &File, path: &Path, buf: &[u8]) -> Result<usize> {
    use std::io::Write;
    let mut writer = file;
    let mut done = 0usize;
    while done < buf.len() {
        match writer.write(&buf[done..]) {
            Ok(0) => {
                let e = io::Error::new(io::ErrorKind::WriteZero, "write wrote no bytes");
                return Err(Error::io("write", path, None, e));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("write", path, None, e)),
        }
    }
    Ok(done)
}

/// Opens a second descriptor of `path` with `O_DIRECT` (page cache bypassed) and the given
/// access. `Ok(None)` when the file system refuses `O_DIRECT` (`EINVAL`: tmpfs, some FUSE
/// and overlay mounts), so that callers fall back to buffered I/O; other errors are returned.
#[doc(alias = "O_DIRECT")]
pub fn open_direct(path: &Path, read: bool, write: bool) -> Result<Option<File>> {
    match OpenOptions::new()
        .read(read)
        .write(write)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(Error::io("open(O_DIRECT)", path, None, e)),
    }
}

/// Size of the file in bytes: `fstat(2)`'s `st_size`.
#[doc(alias = "fstat")]
pub fn file_len(file: &File, path: &Path) -> Result<u64> {
    file.metadata().map(|m| m.len()).map_err(|e| Error::io("fstat", path, None, e))
}

/// Flushes the file's data (not its metadata unless needed to read the data back):
/// `fdatasync(2)`.
pub fn fdatasync(file: &File, path: &Path) -> Result<()> {
    file.sync_data().map_err(|e| Error::io("fdatasync", path, None, e))
}

/// Flushes the file's data and metadata: `fsync(2)`.
pub fn fsync(file: &File, path: &Path) -> Result<()> {
    file.sync_all().map_err(|e| Error::io("fsync", path, None, e))
}

/// Sets the file's length, filling with zeros (a hole) when it grows: `ftruncate(2)`.
#[doc(alias = "ftruncate")]
pub fn set_len(file: &File, path: &Path, len: u64) -> Result<()> {
    file.set_len(len).map_err(|e| Error::io("ftruncate", path, Some(len), e))
}

/// Bytes an unprivileged process may still write to the file system holding `path`:
/// `statvfs(2)`'s `f_bavail × f_frsize`.
#[doc(alias = "statvfs")]
pub fn available_bytes(path: &Path) -> Result<u64> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
        Error::io("statvfs", path, None, io::Error::from_raw_os_error(libc::EINVAL))
    })?;
    let mut stat = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string that lives across the call; `stat` is
    // writable memory of the size and layout of `struct statvfs`, filled on success.
    let status = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if status != 0 {
        return Err(Error::io("statvfs", path, None, io::Error::last_os_error()));
    }
    // SAFETY: statvfs returned 0, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    // `fsblkcnt_t` and `c_ulong` are 32 bits on some targets.
    #[allow(clippy::useless_conversion)]
    Ok(u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize)))
}

/// Pseudo file systems, by `statfs` magic number (`<linux/magic.h>`): their files report a size
/// (usually 0 or 4096) that says nothing of what a read returns.
const PSEUDO_FILE_SYSTEMS: [(u32, &str); 8] = [
    (0x0000_9fa0, "a pseudo file (procfs)"),
    (0x6265_6572, "a pseudo file (sysfs)"),
    (0x6462_6720, "a pseudo file (debugfs)"),
    (0x7472_6163, "a pseudo file (tracefs)"),
    (0x7363_6673, "a pseudo file (securityfs)"),
    (0x0027_e0eb, "a pseudo file (cgroup)"),
    (0x6367_7270, "a pseudo file (cgroup2)"),
    (0x6265_6570, "a pseudo file (configfs)"),
];

/// The type of the file system holding `file`: `fstatfs(2)`'s `f_type`, as the 32-bit magic
/// number Linux's `magic.h` names.
#[doc(alias = "fstatfs")]
pub fn file_system_magic(file: &File, path: &Path) -> Result<u32> {
    let mut stat = MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `stat` is writable memory of the size and layout of `struct statfs`, which the
    // kernel fills on success; the descriptor is borrowed from `file`, so it is open.
    let status = unsafe { libc::fstatfs(file.as_raw_fd(), stat.as_mut_ptr()) };
    if status != 0 {
        return Err(Error::io("fstatfs", path, None, io::Error::last_os_error()));
    }
    // SAFETY: fstatfs returned 0, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    // Magic numbers are 32-bit; `f_type`'s width and sign differ between architectures.
    Ok((stat.f_type as u64 & 0xffff_ffff) as u32)
}

/// What a file is when it lives on a pseudo file system (`"a pseudo file (procfs)"`), or
/// `None`, from its file system's magic number ([`file_system_magic`]).
pub fn pseudo_file_system(magic: u32) -> Option<&'static str> {
    PSEUDO_FILE_SYSTEMS.iter().find(|(m, _)| *m == magic).map(|(_, what)| *what)
}

/// Clears `O_NONBLOCK` on `file`'s open file description: `fcntl(F_GETFL)`, then
/// `fcntl(F_SETFL)`. (Files are opened non-blocking so that a FIFO cannot hang the open; a
/// regular file's descriptor is then made ordinary again.)
#[doc(alias = "fcntl")]
pub fn clear_nonblocking(file: &File, path: &Path) -> Result<()> {
    let flags =
        fcntl_getfl(file.as_fd()).map_err(|e| Error::io("fcntl(F_GETFL)", path, None, e))?;
    if flags & libc::O_NONBLOCK == 0 {
        return Ok(());
    }
    fcntl_setfl(file.as_fd(), flags & !libc::O_NONBLOCK)
        .map_err(|e| Error::io("fcntl(F_SETFL)", path, None, e))
}

/// The status flags and access mode of `fd`'s open file description (`O_RDONLY`, `O_WRONLY`
/// or `O_RDWR`, with `O_APPEND`, `O_DIRECT` and the like): `fcntl(fd, F_GETFL)`.
#[doc(alias = "fcntl")]
#[doc(alias = "F_GETFL")]
pub fn fcntl_getfl(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: F_GETFL takes no pointer; `fd` is borrowed, so it is open for the call.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags)
}

/// Sets the status flags of `fd`'s open file description (the kernel takes `O_APPEND`,
/// `O_NONBLOCK`, `O_DIRECT` and a few others, and ignores the rest): `fcntl(fd, F_SETFL)`.
#[doc(alias = "fcntl")]
#[doc(alias = "F_SETFL")]
pub fn fcntl_setfl(fd: BorrowedFd<'_>, flags: i32) -> io::Result<()> {
    // SAFETY: F_SETFL takes an integer, no pointer; `fd` is borrowed, so it is open.
    let status = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) };
    if status < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new descriptor (close-on-exec) of the open file description the number `fd` names in
/// this process: `fcntl(fd, F_DUPFD_CLOEXEC, 3)`, numbered from 3 as the standard library's
/// `try_clone` does, so that the duplicate never becomes stdin, stdout or stderr. A number that
/// names no open descriptor is `EBADF`. Takes a bare number, not a borrowed descriptor, because
/// its callers (Python's `fileno()`) have nothing else; duplicating changes nothing about the
/// original.
#[doc(alias = "fcntl")]
#[doc(alias = "F_DUPFD_CLOEXEC")]
#[doc(alias = "dup")]
pub fn fcntl_dupfd_cloexec(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC takes an integer (the lowest number to use), no pointer; the
    // kernel checks `fd` and answers EBADF for a number that is not open.
    let duplicate = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if duplicate < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the call just made `duplicate`, an open descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(duplicate) })
}

/// Opens `path` as `options` say, with `O_DIRECT` (page cache bypassed) where the file system
/// allows it: where it refuses (`EINVAL`: tmpfs, some FUSE and overlay mounts), opens it again
/// without. `open(2)` once, or twice. `options`' custom flags are replaced by `O_CLOEXEC` (and
/// `O_DIRECT`).
#[doc(alias = "O_DIRECT")]
pub fn open_direct_or_buffered(path: &Path, options: &mut OpenOptions) -> Result<File> {
    options
        .custom_flags(libc::O_CLOEXEC | libc::O_DIRECT)
        .open(path)
        .or_else(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => options.custom_flags(libc::O_CLOEXEC).open(path),
            _ => Err(e),
        })
        .map_err(|e| Error::io("open", path, None, e))
}

/// Forks counted in this process by [`fork_generation`]'s handler.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// Forks being prepared now, and threads being spawned now ([`spawn_apart_from_fork`]).
static FORKING: AtomicUsize = AtomicUsize::new(0);
static SPAWNING: AtomicUsize = AtomicUsize::new(0);

/// Before a fork: no spawn may start, and those under way end first.
extern "C" fn before_fork() {
    FORKING.fetch_add(1, Ordering::SeqCst);
    while SPAWNING.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
}

extern "C" fn after_fork_in_parent() {
    FORKING.fetch_sub(1, Ordering::SeqCst);
}

extern "C" fn after_fork_in_child() {
    FORKS.fetch_add(1, Ordering::AcqRel);
    // The child's one thread is the one that forked: no spawn of another was under way.
    SPAWNING.store(0, Ordering::SeqCst);
    FORKING.store(0, Ordering::SeqCst);
}

/// The `pthread_atfork(3)` handlers, registered once (and inherited by children).
fn register_fork_handlers() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    // Loaded first: a swap on every call would write the line every thread reads.
    if !REGISTERED.load(Ordering::Acquire) && !REGISTERED.swap(true, Ordering::AcqRel) {
        // SAFETY: the handlers touch atomics alone, and the prepare handler yields until the
        // spawns under way end: async-signal-safe, as handlers in a multithreaded process
        // must be in the child, and waiting on nothing the forking thread holds.
        let rc = unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_in_parent),
                Some(after_fork_in_child),
            )
        };
        if rc != 0 {
            tracing::warn!(
                "pthread_atfork failed ({rc}): a forked child would wait on its parent's threads"
            );
        }
    }
}

/// How many forks stand between this process and the one that first called this: 0 there, 1
/// in a child forked from it, 2 in a grandchild. A child has none of its parent's threads, so
/// process-wide objects that own some (the I/O pool, the remote runtime) are made again where
/// this changes. A `pthread_atfork(3)` child handler, registered at the first call (and
/// inherited by children), counts the forks; a fork before that call needs no counting, as
/// nothing was made yet.
#[doc(alias = "pthread_atfork")]
pub fn fork_generation() -> u64 {
    register_fork_handlers();
    FORKS.load(Ordering::Acquire)
}

/// `spawn()` (a thread's start: `pthread_create`) run while no fork can begin, and a fork
/// begun only once the spawns under way have ended. glibc's `pthread_create` frees the
/// thread-local blocks of a reused stack after it has given up the lock on its stack cache;
/// a fork then gives the child that stack, still listing the blocks, and the child's next
/// thread frees them again ("double free or corruption"), as a child forked while the parent
/// resized its I/O pool showed (decision 0047).
pub fn spawn_apart_from_fork<T>(spawn: impl FnOnce() -> T) -> T {
    register_fork_handlers();
    loop {
        while FORKING.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        SPAWNING.fetch_add(1, Ordering::SeqCst);
        if FORKING.load(Ordering::SeqCst) == 0 {
            break;
        }
        // A fork began meanwhile: it goes first.
        SPAWNING.fetch_sub(1, Ordering::SeqCst);
    }
    struct Spawned;
    impl Drop for Spawned {
        fn drop(&mut self) {
            SPAWNING.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let _spawned = Spawned;
    spawn()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(contents: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, contents).unwrap();
        (dir, path)
    }

    #[test]
    fn pread_cached_reads_what_the_page_cache_holds_and_never_fails() {
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let (_dir, path) = scratch(&data);
        let file = File::open(&path).unwrap();
        // Just written, so cached: the bytes asked for, or a short count at the end.
        let mut buf = vec![0u8; 4096];
        let n = pread_cached(&file, &mut buf, 5000);
        // A kernel or file system without RWF_NOWAIT says None; the caller reads again.
        if let Some(n) = n {
            assert_eq!(n, 4096);
            assert_eq!(buf, data[5000..9096]);
            assert_eq!(pread_cached(&file, &mut buf, 18_000), Some(2000));
            assert_eq!(buf[..2000], data[18_000..]);
            assert_eq!(pread_cached(&file, &mut buf, 30_000), Some(0));
        }
        // Offsets no `off_t` holds, and descriptors not open for reading: None, not an error.
        assert_eq!(pread_cached(&file, &mut buf, u64::MAX), None);
        let write_only = OpenOptions::new().write(true).open(&path).unwrap();
        assert_eq!(pread_cached(&write_only, &mut buf, 0), None);
    }

    #[test]
    fn getfl_reports_the_access_mode_and_setfl_changes_the_status_flags() {
        let (_dir, path) = scratch(b"abc");
        let file = File::open(&path).unwrap();
        let flags = fcntl_getfl(file.as_fd()).unwrap();
        assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY);
        assert_eq!(flags & libc::O_NONBLOCK, 0);
        fcntl_setfl(file.as_fd(), flags | libc::O_NONBLOCK).unwrap();
        assert_ne!(fcntl_getfl(file.as_fd()).unwrap() & libc::O_NONBLOCK, 0);
        clear_nonblocking(&file, &path).unwrap();
        assert_eq!(fcntl_getfl(file.as_fd()).unwrap() & libc::O_NONBLOCK, 0);
        let appending = OpenOptions::new().append(true).open(&path).unwrap();
        let flags = fcntl_getfl(appending.as_fd()).unwrap();
        assert_eq!(flags & libc::O_ACCMODE, libc::O_WRONLY);
        assert_ne!(flags & libc::O_APPEND, 0);
    }

    #[test]
    fn dupfd_gives_a_second_descriptor_of_the_same_file_and_refuses_numbers_not_open() {
        let (_dir, path) = scratch(b"abc");
        let file = File::open(&path).unwrap();
        let duplicate = File::from(fcntl_dupfd_cloexec(file.as_raw_fd()).unwrap());
        assert_ne!(duplicate.as_raw_fd(), file.as_raw_fd());
        drop(file);
        let mut read = [0u8; 3];
        assert_eq!(pread_full(&duplicate, &path, &mut read, 0).unwrap(), 3);
        assert_eq!(&read, b"abc");
        let e = fcntl_dupfd_cloexec(-1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn direct_or_buffered_opens_as_asked_whatever_the_file_system_takes() {
        let (_dir, path) = scratch(&[5u8; 8192]);
        let file = open_direct_or_buffered(&path, OpenOptions::new().read(true)).unwrap();
        assert_eq!(fcntl_getfl(file.as_fd()).unwrap() & libc::O_ACCMODE, libc::O_RDONLY);
        let created = path.with_file_name("created");
        let options = &mut OpenOptions::new();
        options.read(true).write(true).create(true).truncate(true);
        let file = open_direct_or_buffered(&created, options).unwrap();
        assert_eq!(fcntl_getfl(file.as_fd()).unwrap() & libc::O_ACCMODE, libc::O_RDWR);
        assert_eq!(file_len(&file, &created).unwrap(), 0);
        let missing = path.with_file_name("missing");
        let Err(Error::Io { op, source, .. }) =
            open_direct_or_buffered(&missing, OpenOptions::new().read(true))
        else {
            panic!("a missing file opened")
        };
        assert_eq!((op, source.kind()), ("open", io::ErrorKind::NotFound));
    }
}
