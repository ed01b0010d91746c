//! [`evict`](evict()): drop a range of a file from the page cache, syncing first only where it
//! may hold pages not yet written.
#![forbid(unsafe_code)]

use super::range::{ByteRange, Span};
use super::residency::{residency_of, MethodChoice, Residency};
use super::target::{Opened, Target};
use crate::error::Result;
use crate::sys::pagecache as sys;

/// What [`evict`](evict()) found before and left after.
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
    let opened = Opened::open(target.into())?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pagecache::residency::Method;

    #[test]
    fn only_possibly_dirty_ranges_are_synced_before_eviction() {
        let span = ByteRange::ALL.resolve(1 << 20).unwrap();
        let clean = Residency::from_cachestat(
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
}
