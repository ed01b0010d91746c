//! Sizes in a cache: extents (the unit of validity and I/O) inside frames (the unit of device
//! memory), and the arithmetic between byte ranges, extents and frames. Pure functions.
#![forbid(unsafe_code)]

use std::ops::Range;

/// The two sizes of a cache: `extent` (a power of two from 4 KiB) divides `frame` (a multiple
/// of the GPU's allocation granularity, 2 MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) extent: u64,
    pub(crate) frame: u64,
}

impl Geometry {
    /// Extents in one frame (also the slots one frame of slot memory holds).
    pub(crate) fn per_frame(&self) -> u64 {
        self.frame / self.extent
    }

    /// The frame holding extent `e`.
    pub(crate) fn frame_of(&self, e: u64) -> u64 {
        e / self.per_frame()
    }

    /// Extent `e`'s position inside its frame.
    pub(crate) fn within_frame(&self, e: u64) -> usize {
        (e % self.per_frame()) as usize
    }

    /// The extents of `extents` that lie in frame `index` (empty when none do).
    pub(crate) fn extents_in_frame(&self, index: u64, extents: &Range<u64>) -> Range<u64> {
        let per = self.per_frame();
        let start = (index * per).max(extents.start);
        start..((index + 1) * per).min(extents.end).max(start)
    }

    /// Extents needed to cover `len` bytes.
    pub(crate) fn extents(&self, len: u64) -> u64 {
        len.div_ceil(self.extent)
    }

    /// Frames needed to cover `len` bytes.
    pub(crate) fn frames(&self, len: u64) -> u64 {
        len.div_ceil(self.frame)
    }

    /// Extents overlapping `[offset, offset + len)` (empty for `len == 0`).
    pub(crate) fn extents_covering(&self, offset: u64, len: u64) -> Range<u64> {
        if len == 0 {
            return 0..0;
        }
        offset / self.extent..(offset + len).div_ceil(self.extent)
    }

    /// Frames overlapping `[offset, offset + len)` (empty for `len == 0`).
    pub(crate) fn frames_covering(&self, offset: u64, len: u64) -> Range<u64> {
        if len == 0 {
            return 0..0;
        }
        offset / self.frame..(offset + len).div_ceil(self.frame)
    }

    /// The bytes `(offset, len)` that extents `extents` hold of a file of `file_len` bytes (the
    /// last extent cut at the end of the file).
    pub(crate) fn bytes_of(&self, extents: Range<u64>, file_len: u64) -> (u64, u64) {
        let start = extents.start * self.extent;
        let end = (extents.end * self.extent).min(file_len);
        (start, end.saturating_sub(start))
    }

    /// Cuts sorted extent indices into runs of consecutive extents, as byte ranges of a file of
    /// `file_len` bytes; with `within_frames`, runs also break at frame borders (for memory
    /// whose frames are not adjacent).
    pub(crate) fn runs(
        &self,
        sorted: &[u64],
        within_frames: bool,
        file_len: u64,
    ) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut i = 0;
        while i < sorted.len() {
            let start = sorted[i];
            let mut end = start + 1;
            while i + 1 < sorted.len()
                && sorted[i + 1] == end
                && (!within_frames || self.frame_of(end) == self.frame_of(start))
            {
                end += 1;
                i += 1;
            }
            let run = self.bytes_of(start..end, file_len);
            if run.1 > 0 {
                runs.push(run);
            }
            i += 1;
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const G: Geometry = Geometry { extent: 4096, frame: 2 << 20 };

    #[test]
    fn covering_ranges() {
        assert_eq!(G.extents_covering(0, 0), 0..0);
        assert_eq!(G.extents_covering(4095, 2), 0..2);
        assert_eq!(G.frames_covering((2 << 20) - 1, 1), 0..1);
        assert_eq!(G.frames_covering((2 << 20) - 1, 2), 0..2);
        assert_eq!(G.bytes_of(0..3, 10_000), (0, 10_000));
        assert_eq!(G.bytes_of(2..3, 8192), (8192, 0));
    }

    proptest! {
        /// A range's extents in each frame it touches, frame after frame, are the range again.
        #[test]
        fn extents_in_frames_partition_a_range(start in 0u64..5000, n in 0u64..3000) {
            let extents = start..start + n;
            let mut joined = Vec::new();
            for index in 0..(start + n) / G.per_frame() + 2 {
                let r = G.extents_in_frame(index, &extents);
                prop_assert!(r.is_empty() || G.frame_of(r.start) == index);
                prop_assert!(r.is_empty() || G.frame_of(r.end - 1) == index);
                joined.extend(r);
            }
            prop_assert_eq!(joined, extents.collect::<Vec<u64>>());
        }

        /// Runs cover exactly the bytes of the extents given, in order, each run one stretch of
        /// consecutive extents (and inside one frame when asked).
        #[test]
        fn runs_cover_exactly_the_extents(
            mut extents in proptest::collection::vec(0u64..2048, 0..200),
            within in any::<bool>(),
            file_len in 1u64..(8 << 20),
        ) {
            extents.sort_unstable();
            extents.dedup();
            let runs = G.runs(&extents, within, file_len);
            let mut covered = Vec::new();
            for &(offset, len) in &runs {
                prop_assert!(len > 0 && offset + len <= file_len);
                prop_assert_eq!(offset % G.extent, 0);
                if within {
                    prop_assert_eq!(offset / G.frame, (offset + len - 1) / G.frame);
                }
                covered.extend(G.extents_covering(offset, len));
            }
            let wanted: Vec<u64> =
                extents.into_iter().filter(|e| e * G.extent < file_len).collect();
            prop_assert_eq!(covered, wanted);
        }
    }
}
