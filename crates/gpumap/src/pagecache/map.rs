//! [`residency_map`]: which pages of a range are in the page cache, page by page, and the
//! runs they form ([`ResidencyMap`], [`ResidentRun`]).
#![forbid(unsafe_code)]

use super::range::{ByteRange, Span};
use super::residency::{
    cachestat_counts, mincore_pages, mincore_untrusted_reason, Method, Residency,
};
use super::target::{Opened, Target};
use crate::error::{Error, Result};
use crate::sys::pagecache as sys;

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
/// When the kernel will not tell (see the [module docs](super)), the map has no resident
/// pages and `residency.cached_pages` is `None`.
#[doc(alias = "mincore")]
pub fn residency_map<'a>(target: impl Into<Target<'a>>, range: ByteRange) -> Result<ResidencyMap> {
    let opened = Opened::open(target.into())?;
    let span = range.resolve(opened.size)?;
    let mut residency = Residency::empty(&span, Method::Mincore);
    if span.pages() == 0 {
        return Ok(ResidencyMap { residency, resident_runs: Vec::new(), bits: Vec::new() });
    }
    if let Some(reason) = mincore_untrusted_reason(&opened) {
        let residency = Residency::unknown(&span, Method::Mincore, reason);
        return Ok(ResidencyMap { residency, resident_runs: Vec::new(), bits: Vec::new() });
    }
    let words = usize::try_from(span.pages().div_ceil(64)).map_err(|_| {
        Error::InvalidArgument(format!("{} pages do not fit in memory", span.pages()))
    })?;
    let mut bits = vec![0u64; words];
    let cached = mincore_pages(&opened, &span, |first, vec| {
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
    if !sys::cachestat_missing() {
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
