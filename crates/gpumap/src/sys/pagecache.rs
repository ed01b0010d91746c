//! Raw page-cache calls: `mincore`, `cachestat`, `posix_fadvise`, `mlock`, `faccessat`, `sync`.
//!
//! One function per system call, each mapping its status onto [`Error`] with the
//! [`std::io::Error`] kept intact, so callers can branch on the errno (`ENOSYS` from
//! `cachestat` means "fall back to `mincore`", and is remembered: [`cachestat_missing`]).
//! Beside them, the windowed walk `mincore` needs for files larger than the address space.
//! The safe policy (which call to use, what a result means, when it cannot be trusted) lives
//! in the `pagecache` module; the I/O layer asks [`cachestat`] and [`mincore_pages`] directly.
//!
//! File mappings made here are never read through: their address is only handed to the
//! kernel (`mincore`, `mlock`), which is why a file shrinking under a mapping cannot cause
//! undefined behaviour in this crate (the kernel reports `ENOMEM`/`EFAULT` instead of the
//! `SIGBUS` a user-space read would take).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use memmap2::{Mmap, MmapOptions};

use crate::error::{Error, Result};

/// `SYS_cachestat`: 451 on every Linux architecture Rust supports (they share the unified
/// numbering for calls added after 5.1); the `libc` crate does not export it for x86_64.
#[cfg(target_os = "linux")]
const SYS_CACHESTAT: libc::c_long = 451;

/// Bytes mapped at a time for `mincore`: small enough for any address space, large enough
/// that a 1 TiB file needs only 1024 `mmap`/`munmap` pairs.
#[cfg(target_pointer_width = "64")]
const WINDOW_BYTES: u64 = 1 << 30;
#[cfg(not(target_pointer_width = "64"))]
const WINDOW_BYTES: u64 = 128 << 20;

/// Set once `cachestat` answers `ENOSYS`: the kernel (or a seccomp filter) lacks it for the
/// life of the process.
static CACHESTAT_MISSING: AtomicBool = AtomicBool::new(false);

/// An [`Error::Io`] whose path may be unknown (a caller handed us a bare file descriptor).
fn io_error(
    op: &'static str,
    path: Option<&Path>,
    offset: Option<u64>,
    source: io::Error,
) -> Error {
    Error::Io { op, path: path.map(Path::to_path_buf), offset, source }
}

/// The size of a base page in bytes, the unit of `mincore` and `cachestat` (asked once).
#[doc(alias = "sysconf")]
#[doc(alias = "_SC_PAGESIZE")]
pub fn page_size() -> u64 {
    static PAGE_SIZE: OnceLock<u64> = OnceLock::new();
    *PAGE_SIZE.get_or_init(|| {
        // SAFETY: sysconf takes no pointers and has no preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        // sysconf only fails for names it does not know; _SC_PAGESIZE is mandatory in POSIX.
        u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
    })
}

/// The counters `cachestat(2)` returns for a byte range, all in pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CachestatCounts {
    /// Pages in the page cache.
    pub cached: u64,
    /// Cached pages that are dirty.
    pub dirty: u64,
    /// Cached pages under writeback.
    pub writeback: u64,
    /// Pages evicted from the cache (shadow entries still present).
    pub evicted: u64,
    /// Evicted pages that would still be resident had the cache not been under pressure
    /// (their refault distance is inside the working set).
    pub recently_evicted: u64,
}

/// `struct cachestat_range` from `<linux/mman.h>`.
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// `struct cachestat` from `<linux/mman.h>`.
#[repr(C)]
#[derive(Default)]
struct CachestatRaw {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// `cachestat(fd, {offset, len}, &cstat, 0)`: page-cache counters for the pages that cover
/// `offset..offset+len` (Linux 6.5+).
///
/// `len == 0` means "to the end of the file", as for the system call. Errors keep the errno:
/// `ENOSYS` on older kernels (or where seccomp filters it, as Docker's default profile did
/// before it learned the call), `EPERM` on kernels that check that the caller could write
/// the file (the same rule as `mincore`, added in 2025), `EOPNOTSUPP` for hugetlbfs.
#[doc(alias = "SYS_cachestat")]
pub fn cachestat(
    fd: BorrowedFd<'_>,
    path: Option<&Path>,
    offset: u64,
    len: u64,
) -> Result<CachestatCounts> {
    #[cfg(target_os = "linux")]
    {
        let range = CachestatRange { off: offset, len };
        let mut raw = CachestatRaw::default();
        let fd_arg = libc::c_uint::try_from(fd.as_raw_fd()).map_err(|_| {
            io_error("cachestat", path, Some(offset), io::Error::from_raw_os_error(libc::EBADF))
        })?;
        // SAFETY: `range` and `raw` are live, properly aligned `repr(C)` values with the
        // layout of the kernel's `struct cachestat_range` / `struct cachestat`; the kernel
        // reads the first and writes the second only during the call. `fd` is borrowed, so it
        // stays open for the call. Flags must be 0.
        let status = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                fd_arg,
                &range as *const CachestatRange,
                &mut raw as *mut CachestatRaw,
                0 as libc::c_uint,
            )
        };
        if status != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::ENOSYS) {
                CACHESTAT_MISSING.store(true, Ordering::Relaxed);
            }
            return Err(io_error("cachestat", path, Some(offset), error));
        }
        Ok(CachestatCounts {
            cached: raw.nr_cache,
            dirty: raw.nr_dirty,
            writeback: raw.nr_writeback,
            evicted: raw.nr_evicted,
            recently_evicted: raw.nr_recently_evicted,
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (fd, len, CachestatRange { off: 0, len: 0 }, CachestatRaw::default());
        CACHESTAT_MISSING.store(true, Ordering::Relaxed);
        Err(io_error("cachestat", path, Some(offset), io::Error::from_raw_os_error(libc::ENOSYS)))
    }
}

/// Whether [`cachestat`] answered `ENOSYS` earlier in this process: the kernel (or a seccomp
/// filter) lacks it for the life of the process, so callers can go straight to `mincore`.
pub fn cachestat_missing() -> bool {
    CACHESTAT_MISSING.load(Ordering::Relaxed)
}

/// Whether `mincore` may still answer where [`cachestat`] failed with `error`: `ENOSYS` (no
/// such call), `EOPNOTSUPP` (hugetlbfs and the like), `EPERM` (either the kernel's
/// write-permission rule, under which `mincore` is restricted too, or a seccomp filter that
/// answers `EPERM` for calls it does not know), `EINVAL`. Any other error is the answer.
pub fn mincore_may_answer(error: &Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) | Some(libc::EPERM) | Some(libc::EINVAL)
    )
}

/// `mincore` over the pages of `[offset, offset + len)` (`offset` page-aligned), mapped in
/// windows of at most 1 GiB (128 MiB on 32-bit targets) so that files larger than the address
/// space work; `on_window(first_page, bytes)` sees each window's vector, its first page
/// counted from `offset`. Returns the number of resident pages; see [`FileWindow::mincore`]
/// for when the answer cannot be trusted.
pub fn mincore_pages(
    fd: BorrowedFd<'_>,
    path: Option<&Path>,
    offset: u64,
    len: u64,
    mut on_window: impl FnMut(u64, &[u8]),
) -> Result<u64> {
    let page = page_size();
    let end = offset.checked_add(len).ok_or(Error::Overflow { offset, len })?;
    let mut vec = Vec::new();
    let mut cached = 0u64;
    let mut at = offset;
    while at < end {
        let window_len = (end - at).min(WINDOW_BYTES);
        let window = FileWindow::map(fd, path, at, window_len)?;
        window.mincore(&mut vec, path, at)?;
        cached += vec.iter().filter(|b| **b & 1 != 0).count() as u64;
        on_window((at - offset) / page, &vec);
        at += window_len;
    }
    Ok(cached)
}

/// A read-only shared mapping of part of a file, used only to ask the kernel about the pages
/// behind it (`mincore`) or to pin them (`mlock`). The bytes are never exposed to Rust code.
#[derive(Debug)]
pub struct FileWindow {
    map: Mmap,
}

impl FileWindow {
    /// `mmap(NULL, len, PROT_READ, MAP_SHARED, fd, offset)`.
    ///
    /// `offset` must be a multiple of the page size and `len` must be non-zero and fit the
    /// address space (callers on 32-bit targets map large files in windows).
    #[doc(alias = "mmap")]
    pub fn map(
        fd: BorrowedFd<'_>,
        path: Option<&Path>,
        offset: u64,
        len: u64,
    ) -> Result<FileWindow> {
        let bad = |reason: &str| {
            Error::InvalidArgument(format!("cannot map {len} bytes at offset {offset}: {reason}"))
        };
        if len == 0 {
            return Err(bad("empty mapping"));
        }
        if !offset.is_multiple_of(page_size()) {
            return Err(bad("offset is not page-aligned"));
        }
        let len_usize = usize::try_from(len)
            .ok()
            .filter(|l| isize::try_from(*l).is_ok())
            .ok_or_else(|| bad("longer than this platform's address space"))?;
        // SAFETY: memmap2's contract is that the file must not be modified while the mapping
        // is read through a `&[u8]`. This mapping is never read or dereferenced by Rust code:
        // `FileWindow` does not expose the bytes, only hands the address to the kernel
        // (`mincore`, `mlock`), which copes with concurrent writes and truncation itself.
        // `fd` is borrowed, so it is open for the call; the mapping keeps its own reference
        // to the file, so it stays valid after the descriptor is closed.
        let map = unsafe { MmapOptions::new().offset(offset).len(len_usize).map(fd.as_raw_fd()) }
            .map_err(|e| io_error("mmap", path, Some(offset), e))?;
        Ok(FileWindow { map })
    }

    /// Number of pages this window covers.
    pub fn pages(&self) -> usize {
        let page = usize::try_from(page_size()).unwrap_or(4096);
        self.map.len().div_ceil(page)
    }

    /// `mincore(addr, len, vec)`: one byte per page of the window into `vec` (resized to
    /// [`FileWindow::pages`]); bit 0 of each byte is set when the page is in the page cache.
    ///
    /// Since Linux 5.2 the kernel answers truthfully only for files the caller owns or could
    /// open for writing; for others it claims every page is resident. The caller must check
    /// that before trusting the answer.
    pub fn mincore(&self, vec: &mut Vec<u8>, path: Option<&Path>, offset: u64) -> Result<()> {
        vec.clear();
        vec.resize(self.pages(), 0);
        // SAFETY: `self.map` is a live mapping of `self.map.len()` bytes starting at a
        // page-aligned address (mmap returns page-aligned addresses and the offset we mapped
        // at is page-aligned). `vec` has one writable byte per page of that range, which is
        // exactly what the kernel writes. The mapping is not read by the call.
        let status = unsafe {
            libc::mincore(
                self.map.as_ptr() as *mut libc::c_void,
                self.map.len(),
                vec.as_mut_ptr() as *mut _,
            )
        };
        if status != 0 {
            return Err(io_error("mincore", path, Some(offset), io::Error::last_os_error()));
        }
        Ok(())
    }

    /// `mlock(addr, len)`: fault the window's pages in and keep them resident until
    /// [`FileWindow::unlock`] or the window is dropped (unmapping unlocks).
    ///
    /// Fails with `ENOMEM`/`EPERM` past `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`.
    #[doc(alias = "mlock")]
    pub fn lock(&self, path: Option<&Path>, offset: u64) -> Result<()> {
        self.map.lock().map_err(|e| {
            io_error(
                "mlock (limited by RLIMIT_MEMLOCK without CAP_IPC_LOCK)",
                path,
                Some(offset),
                e,
            )
        })
    }

    /// `munlock(addr, len)`: let the window's pages be reclaimed again.
    #[doc(alias = "munlock")]
    pub fn unlock(&self, path: Option<&Path>, offset: u64) -> Result<()> {
        self.map.unlock().map_err(|e| io_error("munlock", path, Some(offset), e))
    }

    /// Length of the window in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }
}

/// What `posix_fadvise` is told about a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// `POSIX_FADV_WILLNEED`: start asynchronous readahead of the range.
    WillNeed,
    /// `POSIX_FADV_DONTNEED`: drop the range's clean, unmapped, unlocked pages.
    DontNeed,
    /// `POSIX_FADV_SEQUENTIAL`: double the readahead window.
    Sequential,
}

/// `posix_fadvise(fd, offset, len, advice)`; `len == 0` means "to the end of the file".
#[doc(alias = "posix_fadvise")]
#[doc(alias = "fadvise64")]
pub fn fadvise(
    fd: BorrowedFd<'_>,
    path: Option<&Path>,
    offset: u64,
    len: u64,
    advice: Advice,
) -> Result<()> {
    let overflow = || Error::Overflow { offset, len };
    let off = libc::off_t::try_from(offset).map_err(|_| overflow())?;
    let length = libc::off_t::try_from(len).map_err(|_| overflow())?;
    let advice_raw = match advice {
        Advice::WillNeed => libc::POSIX_FADV_WILLNEED,
        Advice::DontNeed => libc::POSIX_FADV_DONTNEED,
        Advice::Sequential => libc::POSIX_FADV_SEQUENTIAL,
    };
    // SAFETY: plain integer arguments; the descriptor is borrowed and so open for the call.
    let status = unsafe { libc::posix_fadvise(fd.as_raw_fd(), off, length, advice_raw) };
    // posix_fadvise returns the error number instead of setting errno.
    if status != 0 {
        return Err(io_error(
            "posix_fadvise",
            path,
            Some(offset),
            io::Error::from_raw_os_error(status),
        ));
    }
    Ok(())
}

/// The soft `RLIMIT_MEMLOCK` in bytes. `None` when unlimited (or, which never happens for this
/// resource, when the call fails).
#[doc(alias = "RLIMIT_MEMLOCK")]
pub fn memlock_limit() -> Option<u64> {
    super::posix::soft_limit(libc::RLIMIT_MEMLOCK)
}

/// `geteuid()`.
#[doc(alias = "geteuid")]
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// `faccessat(fd, "", W_OK, AT_EACCESS | AT_EMPTY_PATH) == 0`: could the caller open the file
/// behind `fd` for writing (the test the kernel applies before answering `mincore`)?
///
/// Also true when `fd` itself was opened for writing. Any failure (including kernels before
/// 5.8, which lack `faccessat2` and so `AT_EMPTY_PATH` here) answers `false`: callers use this
/// to decide whether a residency answer can be trusted, so "no" is the safe default.
#[doc(alias = "faccessat")]
#[doc(alias = "faccessat2")]
pub fn may_write(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: fcntl(F_GETFL) takes no pointer; the descriptor is borrowed and open.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags >= 0 && (flags & libc::O_ACCMODE) != libc::O_RDONLY {
        return true;
    }
    const EMPTY: &CStr = c"";
    // SAFETY: `EMPTY` is a valid NUL-terminated string that outlives the call; with
    // AT_EMPTY_PATH the kernel checks the file `fd` refers to.
    let status = unsafe {
        libc::faccessat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            libc::W_OK,
            libc::AT_EACCESS | libc::AT_EMPTY_PATH,
        )
    };
    status == 0
}

/// `sync()`: start writeback of every dirty page of every file system (Linux waits for it).
#[doc(alias = "sync")]
pub fn sync_all() {
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() }
}
