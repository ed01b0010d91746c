//! The host page cache as a tool: see it, fill it, empty it, pin it.
//!
//! Before a benchmark, or before loading a data set onto GPUs, it matters whether a file's
//! bytes are already in the host's page cache: a cached file is copied at memory speed (about
//! 11 GB/s per core into pinned memory), a cold one at the disk's speed (about 2.2 GB/s
//! sequential on a good virtual disk, far less on a network file system). This module answers
//! "how much of this file is cached" and changes the answer, like util-linux `fincore`,
//! `vmtouch` and `pcstat`, and like KvikIO's `get_page_cache_info` /
//! `drop_file_page_cache` / `drop_system_page_cache`.
//!
//! # Concepts
//!
//! * **Pages.** The cache holds files in base pages of [`page_size`] bytes (4 KiB on x86_64,
//!   4, 16 or 64 KiB on aarch64). A byte range is reported for the pages that cover it, so
//!   a 1-byte file has one page and a fully cached 1-byte file reports 4096 resident bytes,
//!   as `fincore` does.
//! * **Two ways to ask.** `mincore(2)` needs the range mapped (we map it in windows of at most
//!   1 GiB, 128 MiB on 32-bit targets, so files larger than the address space work) and
//!   returns one byte per page: that is the per-page [`ResidencyMap`]. `cachestat(2)` (Linux
//!   6.5+, June 2023) needs no mapping and also counts dirty, under-writeback, evicted and
//!   recently evicted pages. [`residency`] uses `cachestat` where the kernel has it and falls
//!   back to `mincore` on `ENOSYS` (older kernels, or seccomp profiles that do not know it);
//!   [`Method`] records which one answered.
//! * **Warm** ([`warm`]): `POSIX_FADV_WILLNEED` starts asynchronous readahead and returns
//!   once the reads are queued; [`WarmMode::Read`] reads the range and returns when it is
//!   cached.
//! * **Evict** ([`evict`]): `fdatasync` where the range may hold dirty pages, then
//!   `POSIX_FADV_DONTNEED`. `cachestat` says when nothing is dirty; skipping the sync then
//!   makes evicting a tree of small files several times faster. This is best effort: the
//!   kernel keeps pages that are mapped by a process, locked, or dirtied again meanwhile, so
//!   [`EvictReport`] says what is still resident afterwards.
//! * **Drop everything** ([`drop_system`]): `sync`, then write `1` (page cache) or `3` (also
//!   dentries and inodes) to `/proc/sys/vm/drop_caches`. Needs `CAP_SYS_ADMIN` and a writable
//!   `/proc/sys` (containers usually mount it read-only).
//! * **Lock** ([`lock`]): map the range and `mlock` it, so it stays resident until the
//!   [`LockedRange`] is dropped. Limited by `RLIMIT_MEMLOCK` (often 8 MiB) without
//!   `CAP_IPC_LOCK`, and by the memory available: both are checked before anything is locked.
//!
//! # Traps
//!
//! * **`mincore` lies about files you may not write.** Since Linux 5.2 (the fix for the page
//!   cache side channel CVE-2019-5489) the kernel reports real residency only for files the
//!   caller owns, could open for writing, or has `CAP_FOWNER` over; for every other file it
//!   claims **every page is resident**. Kernels from 2025 on apply the same rule to
//!   `cachestat`, which then fails with `EPERM`. This module checks the same conditions
//!   before trusting `mincore` and reports [`Residency::cached_pages`] as `None` ("unknown",
//!   with [`Residency::unknown_reason`]) instead of a false 100%.
//! * **Zero-length files and empty ranges** have zero pages; nothing is mapped (`mmap` of zero
//!   bytes fails) and the answer is 0 of 0.
//! * **Sparse files**: holes are not cached until read; reading a hole caches zero-filled
//!   pages, so a sparse file can have more resident bytes than allocated blocks.
//! * **Ranges** must lie inside the file: a range past the end is an
//!   [`Error::OutOfRange`], not a silent clamp.
//! * **Readahead**: reading part of a file caches more than was read: up to the device's
//!   readahead window (`/sys/class/bdi/*/read_ahead_kb`: 128 KiB by default, 8 MiB on some
//!   virtual disks).
//! * **`WILLNEED` is capped**: one `POSIX_FADV_WILLNEED` call reads at most the readahead
//!   window (or the device's maximum I/O size, if larger) and silently drops the rest, so a
//!   single call on a 64 MiB file cached 8 MiB in our tests. [`warm`] advises one window at a
//!   time.
//! * **In-flight reads**: `cachestat` counts a page as soon as its read is queued, `mincore`
//!   only once the data has arrived; just after an asynchronous warm the two can differ.
#![forbid(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::sys::pagecache as sys;

/// Bytes mapped at a time for `mincore` and per-page maps: small enough for any address
/// space, large enough that a 1 TiB file needs only 1024 `mmap`/`munmap` pairs.
#[cfg(target_pointer_width = "64")]
const WINDOW_BYTES: u64 = 1 << 30;
#[cfg(not(target_pointer_width = "64"))]
const WINDOW_BYTES: u64 = 128 << 20;

/// Bytes per `pread` when warming by reading.
const READ_CHUNK_BYTES: usize = 1 << 20;

/// The size of a base page, the unit every count in this module is in.
pub fn page_size() -> u64 {
    sys::page_size()
}

/// A byte range of a file: `len: None` means "to the end of the file".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ByteRange {
    /// First byte.
    pub offset: u64,
    /// Number of bytes, or `None` for everything from `offset` to the end of the file.
    pub len: Option<u64>,
}

impl ByteRange {
    /// The whole file.
    pub const ALL: ByteRange = ByteRange { offset: 0, len: None };

    /// `len` bytes from `offset`.
    pub fn new(offset: u64, len: u64) -> Self {
        ByteRange { offset, len: Some(len) }
    }

    /// Everything from `offset` to the end of the file.
    pub fn from_offset(offset: u64) -> Self {
        ByteRange { offset, len: None }
    }

    /// Check the range against a file of `file_size` bytes and round it out to pages.
    fn resolve(&self, file_size: u64) -> Result<Span> {
        let len = match self.len {
            Some(len) => len,
            None => file_size.checked_sub(self.offset).ok_or(Error::OutOfRange {
                offset: self.offset,
                len: 0,
                file_len: file_size,
            })?,
        };
        let end =
            self.offset.checked_add(len).ok_or(Error::Overflow { offset: self.offset, len })?;
        if end > file_size {
            return Err(Error::OutOfRange { offset: self.offset, len, file_len: file_size });
        }
        let page = page_size();
        let first_page = self.offset / page;
        let end_page = if len == 0 { first_page } else { end.div_ceil(page) };
        Ok(Span { offset: self.offset, len, first_page, end_page, page, file_size })
    }
}

impl From<std::ops::Range<u64>> for ByteRange {
    /// `start..end`; an inverted range becomes empty.
    fn from(r: std::ops::Range<u64>) -> Self {
        ByteRange::new(r.start, r.end.saturating_sub(r.start))
    }
}

impl From<std::ops::RangeFrom<u64>> for ByteRange {
    fn from(r: std::ops::RangeFrom<u64>) -> Self {
        ByteRange::from_offset(r.start)
    }
}

impl From<std::ops::RangeFull> for ByteRange {
    fn from(_: std::ops::RangeFull) -> Self {
        ByteRange::ALL
    }
}

/// A checked byte range and the pages covering it.
#[derive(Debug, Clone, Copy)]
struct Span {
    offset: u64,
    len: u64,
    first_page: u64,
    /// One past the last page.
    end_page: u64,
    page: u64,
    file_size: u64,
}

impl Span {
    fn pages(&self) -> u64 {
        self.end_page - self.first_page
    }
    /// Page-aligned start of the covered pages.
    fn aligned_offset(&self) -> u64 {
        self.first_page * self.page
    }
    /// Bytes of the covered pages (may reach past the end of the file in the last page).
    fn aligned_len(&self) -> u64 {
        self.pages() * self.page
    }
}

/// The file to ask about: a path, an open [`File`], or a borrowed descriptor.
///
/// Functions take `impl Into<Target>`, so `residency(Path::new("x"), ..)`,
/// `residency("x", ..)` and `residency(&file, ..)` all work.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// Opened read-only (and non-blocking, so a FIFO is refused rather than waited on).
    Path(&'a Path),
    /// An open file; its offset is not changed.
    File(&'a File),
    /// A borrowed descriptor (duplicated for the call; its offset is not changed).
    Fd(BorrowedFd<'a>),
}

impl<'a> From<&'a Path> for Target<'a> {
    fn from(p: &'a Path) -> Self {
        Target::Path(p)
    }
}
impl<'a> From<&'a PathBuf> for Target<'a> {
    fn from(p: &'a PathBuf) -> Self {
        Target::Path(p)
    }
}
impl<'a> From<&'a str> for Target<'a> {
    fn from(p: &'a str) -> Self {
        Target::Path(Path::new(p))
    }
}
impl<'a> From<&'a File> for Target<'a> {
    fn from(f: &'a File) -> Self {
        Target::File(f)
    }
}
impl<'a> From<BorrowedFd<'a>> for Target<'a> {
    fn from(fd: BorrowedFd<'a>) -> Self {
        Target::Fd(fd)
    }
}

/// An opened target: the file, its path when known, its size and owner.
struct Opened {
    file: File,
    path: Option<PathBuf>,
    size: u64,
    owner_uid: u32,
    /// `st_dev`: the device (and so the readahead settings) the file lives on.
    device: u64,
}

impl Opened {
    fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
    fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
    fn io_error(&self, op: &'static str, offset: Option<u64>, source: io::Error) -> Error {
        Error::Io { op, path: self.path.clone(), offset, source }
    }
}

fn open(target: Target<'_>) -> Result<Opened> {
    let (file, path) = match target {
        Target::Path(p) => {
            let file = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(p)
                .map_err(|e| Error::io("open", p, None, e))?;
            (file, Some(p.to_path_buf()))
        }
        Target::File(f) => (f.try_clone().map_err(|e| Error::io_nopath("dup", e))?, None),
        Target::Fd(fd) => {
            (File::from(fd.try_clone_to_owned().map_err(|e| Error::io_nopath("dup", e))?), None)
        }
    };
    let meta = file.metadata().map_err(|e| Error::Io {
        op: "fstat",
        path: path.clone(),
        offset: None,
        source: e,
    })?;
    let kind = meta.file_type();
    let size = if kind.is_file() {
        // A /proc or /sys file's size says nothing about its content, and it has no pages in
        // the cache: refused, as `read` and `map` refuse it, rather than reported empty.
        let named = path.clone().unwrap_or_else(|| PathBuf::from("the file"));
        if let Some(what) = crate::sys::posix::pseudo_file_system(&file, &named)? {
            return Err(Error::NotRegularFile { path, what });
        }
        meta.len()
    } else if kind.is_block_device() {
        // fstat reports 0 for block devices; their size is where a seek to the end lands.
        // The descriptor may be a duplicate sharing the caller's offset, so put it back.
        block_device_size(&file).map_err(|e| Error::Io {
            op: "lseek",
            path: path.clone(),
            offset: None,
            source: e,
        })?
    } else {
        let what = if kind.is_dir() {
            return Err(Error::Io {
                op: "open",
                path,
                offset: None,
                source: io::Error::from_raw_os_error(libc::EISDIR),
            });
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() {
            "a character device"
        } else {
            "a special file"
        };
        return Err(Error::NotRegularFile { path, what });
    };
    Ok(Opened { file, path, size, owner_uid: meta.uid(), device: meta.dev() })
}

fn block_device_size(mut file: &File) -> io::Result<u64> {
    let position = file.stream_position()?;
    let size = file.seek(SeekFrom::End(0))?;
    file.seek(SeekFrom::Start(position))?;
    Ok(size)
}

/// How a residency answer was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Method {
    /// `cachestat(2)` (Linux 6.5+): counts, including dirty and writeback pages.
    Cachestat,
    /// `mmap` + `mincore(2)`: one bit per page, no dirty or writeback counts.
    Mincore,
}

/// Which method [`residency_with`] may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum MethodChoice {
    /// `cachestat` where the kernel has it, else `mincore`.
    #[default]
    Auto,
    /// `cachestat` only: an error where it is missing.
    Cachestat,
    /// `mincore` only (to compare, or to avoid `cachestat` on purpose).
    Mincore,
}

/// How much of a byte range of a file is in the page cache. All counts are in pages of
/// [`Residency::page_size`] bytes, for the pages covering the range.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Residency {
    /// First byte of the range asked about.
    pub offset: u64,
    /// Bytes in the range asked about.
    pub len: u64,
    /// Size of the file at the time of the call.
    pub file_size: u64,
    /// Bytes per page.
    pub page_size: u64,
    /// Pages covering the range.
    pub total_pages: u64,
    /// Pages in the page cache; `None` when the kernel will not tell (see
    /// [`Residency::unknown_reason`]).
    pub cached_pages: Option<u64>,
    /// Cached pages that are dirty (not yet written back); `cachestat` only.
    pub dirty_pages: Option<u64>,
    /// Cached pages being written back; `cachestat` only.
    pub writeback_pages: Option<u64>,
    /// Pages of the range that were evicted and whose eviction the kernel still remembers;
    /// `cachestat` only.
    pub evicted_pages: Option<u64>,
    /// Evicted pages that would have stayed resident without memory pressure; `cachestat`
    /// only.
    pub recently_evicted_pages: Option<u64>,
    /// How the answer was obtained.
    pub method: Method,
    /// Why `cached_pages` is `None`, when it is.
    pub unknown_reason: Option<String>,
}

impl Residency {
    /// Whether the cached-page count is known.
    pub fn is_known(&self) -> bool {
        self.cached_pages.is_some()
    }

    /// Cached bytes, counted in whole pages (as `fincore` does: a cached partial last page
    /// counts fully).
    pub fn cached_bytes(&self) -> Option<u64> {
        self.cached_pages.map(|p| p.saturating_mul(self.page_size))
    }

    /// Fraction of the range's pages that are cached, in `0.0..=1.0` (1.0 for an empty range).
    pub fn fraction(&self) -> Option<f64> {
        let cached = self.cached_pages?;
        if self.total_pages == 0 {
            return Some(1.0);
        }
        Some(cached as f64 / self.total_pages as f64)
    }

    fn empty(span: &Span, method: Method) -> Residency {
        let counter = (method == Method::Cachestat).then_some(0);
        Residency {
            offset: span.offset,
            len: span.len,
            file_size: span.file_size,
            page_size: span.page,
            total_pages: span.pages(),
            cached_pages: Some(0),
            dirty_pages: counter,
            writeback_pages: counter,
            evicted_pages: counter,
            recently_evicted_pages: counter,
            method,
            unknown_reason: None,
        }
    }
}

/// Set once `cachestat` answers `ENOSYS`: the kernel (or a seccomp filter) lacks it for the
/// life of the process, so later calls skip straight to `mincore`.
static CACHESTAT_MISSING: AtomicBool = AtomicBool::new(false);

/// How much of `range` of `target` is in the page cache, by the best method available.
///
/// Opens paths read-only. See the [module docs](self) for what "unknown" means.
#[doc(alias = "fincore")]
#[doc(alias = "get_page_cache_info")]
pub fn residency<'a>(target: impl Into<Target<'a>>, range: ByteRange) -> Result<Residency> {
    residency_with(target, range, MethodChoice::Auto)
}

/// [`residency`] with the method chosen by the caller.
pub fn residency_with<'a>(
    target: impl Into<Target<'a>>,
    range: ByteRange,
    choice: MethodChoice,
) -> Result<Residency> {
    let opened = open(target.into())?;
    let span = range.resolve(opened.size)?;
    residency_of(&opened, &span, choice)
}

fn residency_of(opened: &Opened, span: &Span, choice: MethodChoice) -> Result<Residency> {
    let try_cachestat = match choice {
        MethodChoice::Auto => !CACHESTAT_MISSING.load(Ordering::Relaxed),
        MethodChoice::Cachestat => true,
        MethodChoice::Mincore => false,
    };
    if try_cachestat {
        if span.pages() == 0 {
            return Ok(Residency::empty(span, Method::Cachestat));
        }
        match cachestat_counts(opened, span) {
            Ok(counts) => return Ok(residency_from_cachestat(span, &counts)),
            Err(e) if choice == MethodChoice::Auto => match e.raw_os_error() {
                Some(libc::ENOSYS) => CACHESTAT_MISSING.store(true, Ordering::Relaxed),
                // EOPNOTSUPP: hugetlbfs and the like; mincore may still work.
                // EPERM: either the kernel's write-permission rule (then the mincore check
                // below says "unknown" too) or a seccomp filter that answers EPERM for
                // calls it does not know (then mincore is the way).
                Some(libc::EOPNOTSUPP) | Some(libc::EPERM) | Some(libc::EINVAL) => {}
                _ => return Err(e),
            },
            Err(e) => return Err(e),
        }
    }
    if span.pages() == 0 {
        return Ok(Residency::empty(span, Method::Mincore));
    }
    if let Some(reason) = mincore_untrusted_reason(opened) {
        return Ok(unknown(span, Method::Mincore, reason));
    }
    let cached = mincore_windows(opened, span, |_, _| {})?;
    let mut residency = Residency::empty(span, Method::Mincore);
    residency.cached_pages = Some(cached);
    Ok(residency)
}

fn cachestat_counts(opened: &Opened, span: &Span) -> Result<sys::CachestatCounts> {
    sys::cachestat(opened.fd(), opened.path(), span.aligned_offset(), span.aligned_len())
}

fn residency_from_cachestat(span: &Span, counts: &sys::CachestatCounts) -> Residency {
    Residency {
        cached_pages: Some(counts.cached),
        dirty_pages: Some(counts.dirty),
        writeback_pages: Some(counts.writeback),
        evicted_pages: Some(counts.evicted),
        recently_evicted_pages: Some(counts.recently_evicted),
        ..Residency::empty(span, Method::Cachestat)
    }
}

fn unknown(span: &Span, method: Method, reason: String) -> Residency {
    Residency {
        cached_pages: None,
        dirty_pages: None,
        writeback_pages: None,
        evicted_pages: None,
        recently_evicted_pages: None,
        unknown_reason: Some(reason),
        ..Residency::empty(span, method)
    }
}

/// `None` when the kernel will answer `mincore` truthfully for this file; otherwise why not.
///
/// Mirrors the kernel's `can_do_mincore` (Linux 5.2+): the caller owns the inode, or has
/// `CAP_FOWNER` over it, or could open it for writing.
fn mincore_untrusted_reason(opened: &Opened) -> Option<String> {
    if !kernel_restricts_mincore() {
        return None;
    }
    let euid = sys::effective_uid();
    if euid == opened.owner_uid {
        return None;
    }
    // CAP_FOWNER counts only over inodes whose owner is mapped into our user namespace; an
    // unmapped owner shows up as the overflow uid.
    if has_cap_fowner() && opened.owner_uid != OVERFLOW_UID {
        return None;
    }
    if sys::may_write(opened.fd()) {
        return None;
    }
    Some(format!(
        "the kernel reports page-cache residency only for files the caller owns or may write \
         (Linux 5.2+); this file is owned by uid {} and not writable by uid {euid}",
        opened.owner_uid
    ))
}

/// The uid the kernel shows for owners not mapped into the caller's user namespace.
const OVERFLOW_UID: u32 = 65534;

/// Whether this kernel applies the 5.2 `mincore` permission rule (unknown kernels: yes).
fn kernel_restricts_mincore() -> bool {
    static RESTRICTS: OnceLock<bool> = OnceLock::new();
    *RESTRICTS.get_or_init(|| {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut numbers = release.trim().split(['.', '-']).map(|n| n.parse::<u32>().ok());
        match (numbers.next().flatten(), numbers.next().flatten()) {
            (Some(major), Some(minor)) => (major, minor) >= (5, 2),
            _ => true,
        }
    })
}

/// Whether the process has `CAP_FOWNER` (bit 3 of `CapEff` in `/proc/self/status`).
fn has_cap_fowner() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    const CAP_FOWNER: u32 = 3;
    *HAS.get_or_init(|| has_capability(CAP_FOWNER))
}

/// Whether bit `capability` is set in the process's effective capabilities (`CapEff` in
/// `/proc/self/status`); `false` where that cannot be read.
fn has_capability(capability: u32) -> bool {
    proc_status_field("CapEff:")
        .and_then(|hex| u64::from_str_radix(&hex, 16).ok())
        .is_some_and(|caps| caps & (1 << capability) != 0)
}

/// The value of a `/proc/self/status` line (`"VmLck:"` gives `"0 kB"`), trimmed.
fn proc_status_field(name: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| line.strip_prefix(name)).map(|v| v.trim().to_owned())
}

/// A `"123 kB"` value of `/proc/self/status` or `/proc/meminfo`, in bytes.
fn kib_value(text: &str) -> Option<u64> {
    text.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?.checked_mul(1024)
}

/// `MemAvailable` and `MemTotal` of `/proc/meminfo`, in bytes.
fn memory_available_and_total() -> Option<(u64, u64)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field =
        |name: &str| meminfo.lines().find_map(|line| line.strip_prefix(name)).and_then(kib_value);
    Some((field("MemAvailable:")?, field("MemTotal:")?))
}

/// Run `mincore` over the span in windows; `on_window(first_page_index_in_span, bytes)` sees
/// each window's vector. Returns the number of resident pages.
fn mincore_windows(
    opened: &Opened,
    span: &Span,
    mut on_window: impl FnMut(u64, &[u8]),
) -> Result<u64> {
    let mut vec = Vec::new();
    let mut cached = 0u64;
    let start = span.aligned_offset();
    let end = start + span.aligned_len();
    let mut offset = start;
    while offset < end {
        let len = (end - offset).min(WINDOW_BYTES);
        let window = sys::FileWindow::map(opened.fd(), opened.path(), offset, len)?;
        window.mincore(&mut vec, opened.path(), offset)?;
        cached += vec.iter().filter(|b| **b & 1 != 0).count() as u64;
        on_window((offset - start) / span.page, &vec);
        offset += len;
    }
    Ok(cached)
}

/// A run of resident bytes (whole pages, clipped to the end of the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ResidentRun {
    /// File offset of the run's first byte.
    pub offset: u64,
    /// Bytes in the run.
    pub len: u64,
}

/// Per-page residency of a range: which pages are cached, and the runs they form.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ResidencyMap {
    /// The counts; `cached_pages` is the number of set bits. Dirty/writeback/evicted counts
    /// come from `cachestat` when available (a separate snapshot taken just after).
    pub residency: Residency,
    /// Resident runs in file order.
    pub resident_runs: Vec<ResidentRun>,
    /// One bit per page of the range, bit `i % 64` of word `i / 64` for page `i`.
    #[cfg_attr(feature = "serde", serde(skip))]
    bits: Vec<u64>,
}

impl ResidencyMap {
    /// Pages in the map (equals `residency.total_pages`).
    pub fn pages(&self) -> u64 {
        self.residency.total_pages
    }

    /// Whether page `index` of the range (0 = the page holding `residency.offset`) is cached.
    /// `false` past the end, and for every page when residency is unknown.
    pub fn is_resident(&self, index: u64) -> bool {
        let word = usize::try_from(index / 64).ok().and_then(|w| self.bits.get(w));
        word.is_some_and(|w| w & (1 << (index % 64)) != 0)
    }

    /// Cached pages among pages `range` of the map (indices as for [`Self::is_resident`]).
    pub fn resident_pages_in(&self, range: std::ops::Range<u64>) -> u64 {
        let end = range.end.min(self.pages());
        (range.start.min(end)..end).filter(|i| self.is_resident(*i)).count() as u64
    }
}

/// Which pages of `range` of `target` are in the page cache, page by page (`mincore`).
///
/// When the kernel will not tell (see the [module docs](self)), the map has no resident
/// pages and `residency.cached_pages` is `None`.
#[doc(alias = "mincore")]
pub fn residency_map<'a>(target: impl Into<Target<'a>>, range: ByteRange) -> Result<ResidencyMap> {
    let opened = open(target.into())?;
    let span = range.resolve(opened.size)?;
    let mut residency = Residency::empty(&span, Method::Mincore);
    if span.pages() == 0 {
        return Ok(ResidencyMap { residency, resident_runs: Vec::new(), bits: Vec::new() });
    }
    if let Some(reason) = mincore_untrusted_reason(&opened) {
        let residency = unknown(&span, Method::Mincore, reason);
        return Ok(ResidencyMap { residency, resident_runs: Vec::new(), bits: Vec::new() });
    }
    let words = usize::try_from(span.pages().div_ceil(64)).map_err(|_| {
        Error::InvalidArgument(format!("{} pages do not fit in memory", span.pages()))
    })?;
    let mut bits = vec![0u64; words];
    let cached = mincore_windows(&opened, &span, |first, vec| {
        for (i, byte) in vec.iter().enumerate() {
            if byte & 1 != 0 {
                let page = first + i as u64;
                // `page < span.pages()`, and `words` covers every page.
                if let Some(word) = usize::try_from(page / 64).ok().and_then(|w| bits.get_mut(w)) {
                    *word |= 1 << (page % 64);
                }
            }
        }
    })?;
    residency.cached_pages = Some(cached);
    if !CACHESTAT_MISSING.load(Ordering::Relaxed) {
        if let Ok(counts) = cachestat_counts(&opened, &span) {
            residency.dirty_pages = Some(counts.dirty);
            residency.writeback_pages = Some(counts.writeback);
            residency.evicted_pages = Some(counts.evicted);
            residency.recently_evicted_pages = Some(counts.recently_evicted);
        }
    }
    let mut map = ResidencyMap { residency, resident_runs: Vec::new(), bits };
    map.resident_runs = runs_of(&map, &span);
    Ok(map)
}

fn runs_of(map: &ResidencyMap, span: &Span) -> Vec<ResidentRun> {
    let mut runs = Vec::new();
    let mut run_start: Option<u64> = None;
    for page in 0..=span.pages() {
        let resident = page < span.pages() && map.is_resident(page);
        match (resident, run_start) {
            (true, None) => run_start = Some(page),
            (false, Some(start)) => {
                let offset = (span.first_page + start) * span.page;
                let end = ((span.first_page + page) * span.page).min(span.file_size);
                runs.push(ResidentRun { offset, len: end - offset });
                run_start = None;
            }
            _ => {}
        }
    }
    runs
}

/// How [`warm`] brings a range into the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum WarmMode {
    /// `POSIX_FADV_WILLNEED`: asynchronous readahead; returns before the data is cached, and
    /// the kernel may read less under memory pressure.
    #[default]
    Advise,
    /// Read the range (1 MiB at a time, sequential readahead advised) and return when done.
    Read,
}

/// Bring `range` of `target` into the page cache.
#[doc(alias = "posix_fadvise")]
#[doc(alias = "POSIX_FADV_WILLNEED")]
pub fn warm<'a>(target: impl Into<Target<'a>>, range: ByteRange, mode: WarmMode) -> Result<()> {
    let opened = open(target.into())?;
    let span = range.resolve(opened.size)?;
    if span.pages() == 0 {
        return Ok(());
    }
    match mode {
        WarmMode::Advise => {
            // The kernel reads at most max(readahead window, device I/O size) per WILLNEED
            // call and silently ignores the rest, so advise one window at a time.
            let chunk = willneed_chunk_bytes(opened.device, span.page);
            let end = span.aligned_offset() + span.aligned_len();
            let mut offset = span.aligned_offset();
            while offset < end {
                let len = (end - offset).min(chunk);
                sys::fadvise(opened.fd(), opened.path(), offset, len, sys::Advice::WillNeed)?;
                offset += len;
            }
            Ok(())
        }
        WarmMode::Read => {
            // A hint only; reading works without it.
            let _ = sys::fadvise(
                opened.fd(),
                opened.path(),
                span.aligned_offset(),
                span.aligned_len(),
                sys::Advice::Sequential,
            );
            read_range(&opened, span.aligned_offset(), span.offset + span.len)
        }
    }
}

/// The readahead window of the device holding a file (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`),
/// in bytes, at least a page; 128 KiB (the kernel default) when it cannot be read.
fn willneed_chunk_bytes(device: u64, page: u64) -> u64 {
    const KERNEL_DEFAULT: u64 = 128 << 10;
    let (major, minor) = (libc::major(device as libc::dev_t), libc::minor(device as libc::dev_t));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    let bytes = std::fs::read_to_string(knob)
        .ok()
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .filter(|kb| *kb > 0)
        .map_or(KERNEL_DEFAULT, |kb| kb.saturating_mul(1024));
    (bytes / page).max(1) * page
}

fn read_range(opened: &Opened, start: u64, end: u64) -> Result<()> {
    let mut buffer = vec![0u8; READ_CHUNK_BYTES];
    let mut offset = start;
    while offset < end {
        let want = usize::try_from(end - offset).map_or(buffer.len(), |r| r.min(buffer.len()));
        match opened.file.read_at(&mut buffer[..want], offset) {
            // The file shrank since we looked: nothing more to cache.
            Ok(0) => break,
            Ok(n) => offset += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(opened.io_error("pread", Some(offset), e)),
        }
    }
    Ok(())
}

/// What [`evict`] found before and left after.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct EvictReport {
    /// Residency before (after nothing was done).
    pub before: Residency,
    /// Residency after `fdatasync` + `POSIX_FADV_DONTNEED`. Pages still counted here are
    /// mapped or locked by some process, or were dirtied or read again meanwhile.
    pub after: Residency,
}

/// Drop `range` of `target` from the page cache: `fdatasync`, then `POSIX_FADV_DONTNEED`
/// (best effort; see [`EvictReport::after`]).
///
/// The `fdatasync` is skipped where `cachestat` counts no dirty or under-writeback pages in
/// the range (or nothing of it is cached), unless pages stay after the first
/// `POSIX_FADV_DONTNEED`: then it syncs and drops once more.
///
/// A failing `fdatasync` (for example `EIO`) is returned: its dirty pages could not be
/// dropped anyway, and a write error must not pass unseen.
#[doc(alias = "drop_file_page_cache")]
#[doc(alias = "POSIX_FADV_DONTNEED")]
pub fn evict<'a>(target: impl Into<Target<'a>>, range: ByteRange) -> Result<EvictReport> {
    let opened = open(target.into())?;
    let span = range.resolve(opened.size)?;
    let before = residency_of(&opened, &span, MethodChoice::Auto)?;
    if span.pages() == 0 {
        return Ok(EvictReport { after: before.clone(), before });
    }
    let synced = may_hold_unwritten_pages(&before);
    if synced {
        sync_for_eviction(&opened)?;
    }
    drop_pages(&opened, &span)?;
    let mut after = residency_of(&opened, &span, MethodChoice::Auto)?;
    if !synced && after.cached_pages.is_some_and(|pages| pages > 0) {
        // Pages the count called clean stayed: dirtied since, or not yet droppable (pages
        // unlocked a moment ago are kept for some milliseconds). Sync and try once more, as
        // an eviction that always syncs would have.
        sync_for_eviction(&opened)?;
        drop_pages(&opened, &span)?;
        after = residency_of(&opened, &span, MethodChoice::Auto)?;
    }
    Ok(EvictReport { before, after })
}

/// `fdatasync` before dropping pages (dirty pages cannot be dropped).
fn sync_for_eviction(opened: &Opened) -> Result<()> {
    match opened.file.sync_data() {
        Ok(()) => Ok(()),
        // EINVAL/EROFS: the file cannot be synced (special files, read-only mounts), so it has
        // no dirty pages we could write; dropping the clean ones still works.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EROFS)) => Ok(()),
        Err(e) => Err(opened.io_error("fdatasync", None, e)),
    }
}

/// `POSIX_FADV_DONTNEED` over the span's pages.
fn drop_pages(opened: &Opened, span: &Span) -> Result<()> {
    sys::fadvise(
        opened.fd(),
        opened.path(),
        span.aligned_offset(),
        span.aligned_len(),
        sys::Advice::DontNeed,
    )
}

/// Whether `residency` leaves room for dirty or under-writeback pages, which `fdatasync` must
/// write (or wait for) before `POSIX_FADV_DONTNEED` can drop them.
///
/// `cachestat` counts them; where it says there are none, or nothing of the range is cached
/// at all, the sync is skipped. That sync was most of the cost of evicting a tree of small
/// files: an `fdatasync` with nothing to write still costs a journal round trip on ext4.
/// A page dirtied after the count stays cached, as it would after any `DONTNEED`, and
/// [`EvictReport::after`] shows it.
fn may_hold_unwritten_pages(residency: &Residency) -> bool {
    let clean = residency.dirty_pages == Some(0) && residency.writeback_pages == Some(0);
    let empty = residency.cached_pages == Some(0);
    !(clean || empty)
}

/// The kernel's knob for dropping clean caches system-wide.
const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

/// Drop the whole system's clean page cache (and, with `reclaim_dentries`, the dentry and
/// inode caches): `sync`, then write `1` (or `3`) to `/proc/sys/vm/drop_caches`.
///
/// Needs root (`CAP_SYS_ADMIN`) and a writable `/proc/sys`; without them the error says so
/// and keeps the OS error (`EACCES`, `EPERM` or `EROFS`). Dirty pages are written first, but
/// pages that are mapped, locked or dirtied meanwhile stay.
#[doc(alias = "drop_caches")]
#[doc(alias = "drop_system_page_cache")]
pub fn drop_system(reclaim_dentries: bool) -> Result<()> {
    const NEEDS: &str = "writing vm.drop_caches (needs root with CAP_SYS_ADMIN and a writable \
                         /proc/sys, which containers usually mount read-only)";
    let path = Path::new(DROP_CACHES);
    // Open before syncing so that an unprivileged call fails fast instead of syncing first.
    let mut knob = OpenOptions::new().write(true).open(path).map_err(|e| Error::Io {
        op: if is_permission_error(&e) { NEEDS } else { "open" },
        path: Some(path.to_path_buf()),
        offset: None,
        source: e,
    })?;
    sys::sync_all();
    let value: &[u8] = if reclaim_dentries { b"3\n" } else { b"1\n" };
    io::Write::write_all(&mut knob, value).map_err(|e| Error::Io {
        op: if is_permission_error(&e) { NEEDS } else { "write" },
        path: Some(path.to_path_buf()),
        offset: None,
        source: e,
    })
}

fn is_permission_error(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS))
}

/// A range held resident with `mlock`; dropping it unlocks (and unmaps) the range.
#[derive(Debug)]
pub struct LockedRange {
    window: Option<sys::FileWindow>,
    path: Option<PathBuf>,
    offset: u64,
    len: u64,
}

impl LockedRange {
    /// First byte of the locked range.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes in the locked range.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes pinned, in whole pages.
    pub fn locked_bytes(&self) -> u64 {
        self.window.as_ref().map_or(0, sys::FileWindow::len)
    }

    /// The file, when it was given by path.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Unlock now and see any error (dropping unlocks too, silently).
    pub fn unlock(mut self) -> Result<()> {
        match self.window.take() {
            Some(window) => window.unlock(self.path.as_deref(), self.offset),
            None => Ok(()),
        }
    }
}

impl Drop for LockedRange {
    fn drop(&mut self) {
        if let Some(window) = self.window.take() {
            // Unmapping (when `window` drops) unlocks too, so an error here loses nothing.
            let _ = window.unlock(self.path.as_deref(), self.offset);
        }
    }
}

/// Read `range` of `target` into the page cache and keep it there (`mmap` + `mlock`) until
/// the returned [`LockedRange`] is dropped.
///
/// Checked before anything is locked, as [`Error::ResourceLimit`]: without `CAP_IPC_LOCK`,
/// the range plus what the process already holds locked must fit `RLIMIT_MEMLOCK` (often
/// 8 MiB); and the part of the range not yet cached must fit the memory available
/// (`MemAvailable`) less an eighth of the machine's memory, kept for everything else — locked
/// pages cannot be reclaimed, and locking a large sparse file would otherwise end in the OOM
/// killer. On 32-bit targets the range must also fit the address space.
#[doc(alias = "mlock")]
pub fn lock<'a>(target: impl Into<Target<'a>>, range: ByteRange) -> Result<LockedRange> {
    let opened = open(target.into())?;
    let span = range.resolve(opened.size)?;
    let window = if span.pages() == 0 {
        None
    } else {
        check_lockable(&opened, &span)?;
        let window = sys::FileWindow::map(
            opened.fd(),
            opened.path(),
            span.aligned_offset(),
            span.aligned_len(),
        )?;
        window.lock(opened.path(), span.aligned_offset())?;
        Some(window)
    };
    Ok(LockedRange { window, path: opened.path, offset: span.offset, len: span.len })
}

/// `CAP_IPC_LOCK`: locking beyond `RLIMIT_MEMLOCK`.
const CAP_IPC_LOCK: u32 = 14;

/// Whether `span` of `opened` can be locked without passing `RLIMIT_MEMLOCK` or running the
/// machine out of memory (see [`lock`]).
fn check_lockable(opened: &Opened, span: &Span) -> Result<()> {
    let memlock = if has_capability(CAP_IPC_LOCK) {
        None
    } else {
        let locked = proc_status_field("VmLck:").and_then(|v| kib_value(&v)).unwrap_or(0);
        sys::memlock_limit().map(|limit| (limit, locked))
    };
    let cached = residency_of(opened, span, MethodChoice::Auto)
        .ok()
        .and_then(|r| r.cached_bytes())
        .unwrap_or(0);
    lock_verdict(span.aligned_len(), cached, memlock, memory_available_and_total())
}

/// The rule of [`check_lockable`]: `bytes` to lock, `cached` of them already in the page
/// cache; `memlock` the limit and what the process holds locked (`None`: no limit applies);
/// `memory` the machine's available and total memory (`None`: unknown, not checked).
fn lock_verdict(
    bytes: u64,
    cached: u64,
    memlock: Option<(u64, u64)>,
    memory: Option<(u64, u64)>,
) -> Result<()> {
    if let Some((limit, locked)) = memlock {
        let available = limit.saturating_sub(locked);
        if bytes > available {
            return Err(Error::ResourceLimit {
                resource: "RLIMIT_MEMLOCK",
                requested: bytes,
                available,
                hint: "raise the limit (ulimit -l, LimitMEMLOCK= for a systemd service) or run \
                       with CAP_IPC_LOCK",
            });
        }
    }
    if let Some((available, total)) = memory {
        let new_bytes = bytes.saturating_sub(cached);
        let spare = available.saturating_sub(total / 8);
        if new_bytes > spare {
            return Err(Error::ResourceLimit {
                resource: "the memory available (MemAvailable, less an eighth of MemTotal)",
                requested: new_bytes,
                available: spare,
                hint: "lock a smaller range; locked pages cannot be reclaimed",
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Report;

    #[test]
    fn kernel_values_parse() {
        assert_eq!(kib_value("  8 kB"), Some(8192));
        assert_eq!(kib_value("0 kB"), Some(0));
        assert_eq!(kib_value("8"), None);
        let (available, total) = memory_available_and_total().unwrap();
        assert!(available > 0 && available <= total);
        assert!(proc_status_field("VmLck:").and_then(|v| kib_value(&v)).is_some());
    }

    #[test]
    fn locks_are_checked_against_memlock_and_memory_first() {
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        let limit_of = |e: Error| match e {
            Error::ResourceLimit { resource, requested, available, .. } => {
                (resource, requested, available)
            }
            other => panic!("expected ResourceLimit, got {other:?}"),
        };
        // 8 MiB limit, 6 MiB already locked: 4 MiB more do not fit, 2 MiB do.
        let e = lock_verdict(4 * MIB, 0, Some((8 * MIB, 6 * MIB)), None).unwrap_err();
        assert_eq!(limit_of(e), ("RLIMIT_MEMLOCK", 4 * MIB, 2 * MIB));
        assert!(lock_verdict(2 * MIB, 0, Some((8 * MIB, 6 * MIB)), None).is_ok());
        // No limit (CAP_IPC_LOCK, or unlimited): memory decides. 64 GiB of a sparse file on a
        // 24 GiB machine with 20 GiB available: 17 GiB may be added.
        let memory = Some((20 * GIB, 24 * GIB));
        let (resource, requested, available) =
            limit_of(lock_verdict(64 * GIB, 0, None, memory).unwrap_err());
        assert!(resource.contains("MemAvailable"), "{resource}");
        assert_eq!((requested, available), (64 * GIB, 17 * GIB));
        // What is cached already costs nothing new.
        assert!(lock_verdict(30 * GIB, 14 * GIB, None, memory).is_ok());
        assert!(lock_verdict(64 * GIB, 0, None, None).is_ok());
        let shown = Report(&lock_verdict(9 * MIB, 0, Some((8 * MIB, 0)), None).unwrap_err());
        assert!(shown.to_string().contains("RLIMIT_MEMLOCK"), "{shown}");
    }

    #[test]
    fn only_possibly_dirty_ranges_are_synced_before_eviction() {
        let span = ByteRange::ALL.resolve(1 << 20).unwrap();
        let clean = residency_from_cachestat(
            &span,
            &sys::CachestatCounts { cached: 256, ..Default::default() },
        );
        assert!(!may_hold_unwritten_pages(&clean));
        let dirty = Residency { dirty_pages: Some(1), ..clean.clone() };
        assert!(may_hold_unwritten_pages(&dirty));
        let writeback = Residency { writeback_pages: Some(1), ..clean.clone() };
        assert!(may_hold_unwritten_pages(&writeback));
        // mincore counts no dirty pages: sync unless nothing is cached.
        let mut mincore = Residency::empty(&span, Method::Mincore);
        assert!(!may_hold_unwritten_pages(&mincore));
        mincore.cached_pages = Some(3);
        assert!(may_hold_unwritten_pages(&mincore));
    }

    #[test]
    fn ranges_round_out_to_pages() {
        let page = page_size();
        let span = ByteRange::new(1, page).resolve(10 * page).unwrap();
        assert_eq!((span.first_page, span.end_page), (0, 2));
        let span = ByteRange::ALL.resolve(page + 1).unwrap();
        assert_eq!(span.pages(), 2);
        let span = ByteRange::ALL.resolve(0).unwrap();
        assert_eq!(span.pages(), 0);
        let span = ByteRange::new(page, 0).resolve(page).unwrap();
        assert_eq!(span.pages(), 0);
    }

    #[test]
    fn ranges_past_the_end_are_errors() {
        assert!(matches!(
            ByteRange::new(5, 10).resolve(10),
            Err(Error::OutOfRange { offset: 5, len: 10, file_len: 10 })
        ));
        assert!(matches!(ByteRange::from_offset(11).resolve(10), Err(Error::OutOfRange { .. })));
        assert!(matches!(ByteRange::new(u64::MAX, 2).resolve(10), Err(Error::Overflow { .. })));
    }
}
