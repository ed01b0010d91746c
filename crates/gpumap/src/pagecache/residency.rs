//! [`residency`]: how much of a range of a file is in the page cache — by `cachestat` where
//! the kernel has it, else by `mincore` — and whether the kernel's answer can be trusted;
//! [`Residency`], the answer.
#![forbid(unsafe_code)]

use std::sync::OnceLock;

use super::proc::has_capability;
use super::range::{ByteRange, Span};
use super::target::{Opened, Target};
use crate::error::Result;
use crate::sys::pagecache::{self as sys, CachestatCounts};

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

    /// Nothing cached of `span`, found by `method` (the counters `cachestat` gives at 0).
    pub(super) fn empty(span: &Span, method: Method) -> Residency {
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

    /// What `cachestat` counted in `span`.
    pub(super) fn from_cachestat(span: &Span, counts: &CachestatCounts) -> Residency {
        Residency {
            cached_pages: Some(counts.cached),
            dirty_pages: Some(counts.dirty),
            writeback_pages: Some(counts.writeback),
            evicted_pages: Some(counts.evicted),
            recently_evicted_pages: Some(counts.recently_evicted),
            ..Residency::empty(span, Method::Cachestat)
        }
    }

    /// Residency the kernel will not tell, and why.
    pub(super) fn unknown(span: &Span, method: Method, reason: String) -> Residency {
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

/// How much of `range` of `target` is in the page cache, by the best method available.
///
/// Opens paths read-only. See the [module docs](super) for what "unknown" means.
#[doc(alias = "fincore")]
#[doc(alias = "get_page_cache_info")]
pub fn residency<'a>(target: impl Into<Target<'a>>, range: ByteRange) -> Result<Residency> {
    residency_with(target, range, MethodChoice::Auto)
}

/// [`residency`](residency()) with the method chosen by the caller.
pub fn residency_with<'a>(
    target: impl Into<Target<'a>>,
    range: ByteRange,
    choice: MethodChoice,
) -> Result<Residency> {
    let opened = Opened::open(target.into())?;
    let span = range.resolve(opened.size)?;
    residency_of(&opened, &span, choice)
}

/// The residency of `span` of an opened file, by `choice`.
pub(super) fn residency_of(
    opened: &Opened,
    span: &Span,
    choice: MethodChoice,
) -> Result<Residency> {
    let try_cachestat = match choice {
        // Where `cachestat` answered ENOSYS once, the kernel (or a seccomp filter) lacks it
        // for the life of the process: straight to `mincore`.
        MethodChoice::Auto => !sys::cachestat_missing(),
        MethodChoice::Cachestat => true,
        MethodChoice::Mincore => false,
    };
    if try_cachestat {
        if span.pages() == 0 {
            return Ok(Residency::empty(span, Method::Cachestat));
        }
        match cachestat_counts(opened, span) {
            Ok(counts) => return Ok(Residency::from_cachestat(span, &counts)),
            Err(e) if choice == MethodChoice::Auto && sys::mincore_may_answer(&e) => {}
            Err(e) => return Err(e),
        }
    }
    if span.pages() == 0 {
        return Ok(Residency::empty(span, Method::Mincore));
    }
    if let Some(reason) = mincore_untrusted_reason(opened) {
        return Ok(Residency::unknown(span, Method::Mincore, reason));
    }
    let cached = mincore_pages(opened, span, |_, _| {})?;
    let mut residency = Residency::empty(span, Method::Mincore);
    residency.cached_pages = Some(cached);
    Ok(residency)
}

/// `cachestat` over the pages of `span`.
pub(super) fn cachestat_counts(opened: &Opened, span: &Span) -> Result<sys::CachestatCounts> {
    sys::cachestat(opened.fd(), opened.path(), span.aligned_offset(), span.aligned_len())
}

/// `mincore` over the pages of `span`; `on_window(first_page_index_in_span, bytes)` sees each
/// window's vector. Returns the number of resident pages.
pub(super) fn mincore_pages(
    opened: &Opened,
    span: &Span,
    on_window: impl FnMut(u64, &[u8]),
) -> Result<u64> {
    let (fd, path) = (opened.fd(), opened.path());
    sys::mincore_pages(fd, path, span.aligned_offset(), span.aligned_len(), on_window)
}

/// `None` when the kernel will answer `mincore` truthfully for this file; otherwise why not.
///
/// Mirrors the kernel's `can_do_mincore` (Linux 5.2+): the caller owns the inode, or has
/// `CAP_FOWNER` over it, or could open it for writing.
pub(super) fn mincore_untrusted_reason(opened: &Opened) -> Option<String> {
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
