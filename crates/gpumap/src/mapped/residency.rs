//! The residency table of a mapped file: which frames of device memory are mapped and pinned,
//! in what order they were used, and which extents inside them hold the file's bytes (clean),
//! newer bytes (dirty), or are being read in.
//!
//! The table only keeps the books: it does no I/O and calls no driver. The map
//! ([`super::DeviceMappedFile`]) holds it under a mutex, asks it what to do, does the slow part
//! (mapping memory, reading, writing) and reports back.
#![forbid(unsafe_code)]

use std::ops::Range;

use lru::LruCache;

/// Sizes of a mapping: `len` bytes, cut into frames (the unit of device memory) and extents (the
/// unit of validity and I/O; a frame holds a whole number of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) len: u64,
    pub(crate) frame: u64,
    pub(crate) extent: u64,
}

impl Geometry {
    /// Frames needed to cover `len`.
    pub(crate) fn frames(&self) -> usize {
        self.len.div_ceil(self.frame) as usize
    }

    /// Extents needed to cover `len`.
    pub(crate) fn extents(&self) -> usize {
        self.len.div_ceil(self.extent) as usize
    }

    pub(crate) fn extents_per_frame(&self) -> usize {
        (self.frame / self.extent) as usize
    }

    /// The frame holding extent `e`.
    pub(crate) fn frame_of(&self, e: usize) -> usize {
        e / self.extents_per_frame()
    }

    /// Extents overlapping `[offset, offset + len)` (empty for `len == 0`); the range must lie
    /// inside the mapping.
    pub(crate) fn extents_covering(&self, offset: u64, len: u64) -> Range<usize> {
        if len == 0 {
            return 0..0;
        }
        (offset / self.extent) as usize..(offset + len).div_ceil(self.extent) as usize
    }

    /// Frames overlapping `[offset, offset + len)`.
    pub(crate) fn frames_covering(&self, offset: u64, len: u64) -> Range<usize> {
        if len == 0 {
            return 0..0;
        }
        (offset / self.frame) as usize..(offset + len).div_ceil(self.frame) as usize
    }

    /// The mapping's bytes `[offset, offset + len)` held by extents `extents` (the last one cut
    /// at the end of the mapping).
    pub(crate) fn bytes_of(&self, extents: Range<usize>) -> (u64, u64) {
        let start = extents.start as u64 * self.extent;
        let end = (extents.end as u64 * self.extent).min(self.len);
        (start, end.saturating_sub(start))
    }

    /// Cuts sorted extent indices into runs of consecutive extents, as byte ranges
    /// `(offset, len)` of the mapping; with `within_frames`, runs also break at frame borders
    /// (for backends whose frames are not adjacent in memory).
    pub(crate) fn runs(&self, sorted: &[usize], within_frames: bool) -> Vec<(u64, u64)> {
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
            runs.push(self.bytes_of(start..end));
            i += 1;
        }
        runs
    }
}

/// What an extent of a mapped frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtentState {
    /// Nothing valid (or the frame is not mapped).
    Absent,
    /// One caller is reading it in; others wait for it (single flight).
    Loading,
    /// The file's bytes.
    Clean,
    /// Bytes newer than the file's, to be written back.
    Dirty,
}

#[derive(Debug, Clone, Copy)]
struct Extent {
    state: ExtentState,
    /// Bumped whenever the extent is marked dirty: a write-back that started before a newer
    /// write must not mark it clean.
    version: u32,
}

#[derive(Debug, Clone, Copy, Default)]
struct Frame {
    mapped: bool,
    /// Views and in-flight operations using the frame; a pinned frame is never evicted.
    pins: u32,
}

/// The frame to give up to make room, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Victim {
    /// Unpinned and clean: unmap it.
    Clean(usize),
    /// Unpinned but dirty: write it back first.
    Dirty(usize),
    /// Every mapped frame is pinned or being read in.
    None,
}

/// Counters a map reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) evictions: u64,
}

/// The books of one mapping (see the module docs).
#[derive(Debug)]
pub(crate) struct Table {
    geometry: Geometry,
    extents: Vec<Extent>,
    frames: Vec<Frame>,
    /// Mapped frames, most recently used first.
    lru: LruCache<usize, ()>,
    mapped: usize,
    max_frames: usize,
    pub(crate) counters: Counters,
}

impl Table {
    /// An empty table for `geometry` that maps at most `max_frames` frames at once.
    pub(crate) fn new(geometry: Geometry, max_frames: usize) -> Table {
        Table {
            geometry,
            extents: vec![Extent { state: ExtentState::Absent, version: 0 }; geometry.extents()],
            frames: vec![Frame::default(); geometry.frames()],
            lru: LruCache::unbounded(),
            mapped: 0,
            max_frames,
            counters: Counters::default(),
        }
    }

    pub(crate) fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub(crate) fn max_frames(&self) -> usize {
        self.max_frames
    }

    pub(crate) fn mapped_frames(&self) -> usize {
        self.mapped
    }

    pub(crate) fn is_mapped(&self, frame: usize) -> bool {
        self.frames[frame].mapped
    }

    /// Whether another frame can be mapped without evicting one.
    pub(crate) fn has_room(&self) -> bool {
        self.mapped < self.max_frames
    }

    /// Records that `frame` was mapped (its extents start absent) and makes it most recent.
    pub(crate) fn mark_mapped(&mut self, frame: usize) {
        debug_assert!(!self.frames[frame].mapped && self.has_room());
        self.frames[frame].mapped = true;
        self.mapped += 1;
        self.lru.put(frame, ());
    }

    /// Makes `frame` the most recently used.
    pub(crate) fn touch(&mut self, frame: usize) {
        self.lru.promote(&frame);
    }

    pub(crate) fn pin(&mut self, frame: usize) {
        self.frames[frame].pins += 1;
    }

    pub(crate) fn unpin(&mut self, frame: usize) {
        let f = &mut self.frames[frame];
        f.pins = f.pins.saturating_sub(1);
    }

    fn extents_of_frame(&self, frame: usize) -> Range<usize> {
        let per = self.geometry.extents_per_frame();
        (frame * per).min(self.extents.len())..((frame + 1) * per).min(self.extents.len())
    }

    fn frame_has(&self, frame: usize, state: ExtentState) -> bool {
        self.extents[self.extents_of_frame(frame)].iter().any(|e| e.state == state)
    }

    /// The least recently used frame that may go: a clean one if any (cheapest), else a dirty
    /// one; never a pinned frame or one with an extent being read in.
    pub(crate) fn victim(&self) -> Victim {
        let mut dirty = None;
        for (&frame, ()) in self.lru.iter().rev() {
            let f = self.frames[frame];
            if f.pins > 0 || self.frame_has(frame, ExtentState::Loading) {
                continue;
            }
            if !self.frame_has(frame, ExtentState::Dirty) {
                return Victim::Clean(frame);
            }
            dirty.get_or_insert(frame);
        }
        dirty.map_or(Victim::None, Victim::Dirty)
    }

    /// Records that `frame` (unpinned, with nothing dirty or loading) was unmapped.
    pub(crate) fn mark_unmapped(&mut self, frame: usize) {
        debug_assert!(self.frames[frame].mapped && self.frames[frame].pins == 0);
        for e in self.extents_of_frame(frame) {
            debug_assert!(matches!(
                self.extents[e].state,
                ExtentState::Absent | ExtentState::Clean
            ));
            self.extents[e].state = ExtentState::Absent;
        }
        self.frames[frame].mapped = false;
        self.mapped -= 1;
        self.lru.pop(&frame);
        self.counters.evictions += 1;
    }

    /// Claims the absent extents of `range` for reading in (they become `Loading`) and returns
    /// them; their frames must be mapped.
    pub(crate) fn claim_absent(&mut self, range: Range<usize>) -> Vec<usize> {
        let mut claimed = Vec::new();
        for e in range {
            if self.extents[e].state == ExtentState::Absent {
                debug_assert!(self.frames[self.geometry.frame_of(e)].mapped);
                self.extents[e].state = ExtentState::Loading;
                claimed.push(e);
            }
        }
        claimed
    }

    /// Whether some extent of `range` is being read in by someone.
    pub(crate) fn any_loading(&self, range: Range<usize>) -> bool {
        self.extents[range].iter().any(|e| e.state == ExtentState::Loading)
    }

    /// Ends a read-in of `extents` claimed with [`Table::claim_absent`]: clean if it worked,
    /// absent again if not.
    pub(crate) fn finish_load(&mut self, extents: &[usize], ok: bool) {
        for &e in extents {
            debug_assert_eq!(self.extents[e].state, ExtentState::Loading);
            self.extents[e].state = if ok { ExtentState::Clean } else { ExtentState::Absent };
        }
    }

    /// Marks the (valid) extents of `range` dirty.
    pub(crate) fn mark_dirty(&mut self, range: Range<usize>) {
        for e in &mut self.extents[range] {
            debug_assert!(matches!(e.state, ExtentState::Clean | ExtentState::Dirty));
            e.state = ExtentState::Dirty;
            e.version = e.version.wrapping_add(1);
        }
    }

    /// The dirty extents of `range`, each with its version, for a write-back.
    pub(crate) fn dirty_in(&self, range: Range<usize>) -> Vec<(usize, u32)> {
        range
            .filter(|&e| self.extents[e].state == ExtentState::Dirty)
            .map(|e| (e, self.extents[e].version))
            .collect()
    }

    /// Ends a write-back: an extent written successfully and not dirtied again meanwhile
    /// becomes clean; every other stays dirty.
    pub(crate) fn finish_writeback(&mut self, written: &[(usize, u32)]) {
        for &(e, version) in written {
            let x = &mut self.extents[e];
            if x.state == ExtentState::Dirty && x.version == version {
                x.state = ExtentState::Clean;
            }
        }
    }

    /// Extents in state `state`.
    pub(crate) fn count(&self, state: ExtentState) -> usize {
        self.extents.iter().filter(|e| e.state == state).count()
    }

    /// The state of extent `e`.
    #[cfg(test)]
    pub(crate) fn state(&self, e: usize) -> ExtentState {
        self.extents[e].state
    }

    /// Checks the table's invariants; for tests.
    #[cfg(test)]
    fn check(&self) {
        assert!(
            self.mapped <= self.max_frames,
            "{} frames mapped over {}",
            self.mapped,
            self.max_frames
        );
        assert_eq!(self.mapped, self.frames.iter().filter(|f| f.mapped).count());
        assert_eq!(self.lru.len(), self.mapped);
        for (i, f) in self.frames.iter().enumerate() {
            assert!(f.mapped || f.pins == 0, "frame {i} pinned but not mapped");
            assert_eq!(f.mapped, self.lru.contains(&i));
            if !f.mapped {
                for e in self.extents_of_frame(i) {
                    assert_eq!(self.extents[e].state, ExtentState::Absent, "extent {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GEO: Geometry = Geometry { len: 10 * 8192 + 100, frame: 8192, extent: 2048 };

    #[test]
    fn geometry_arithmetic() {
        assert_eq!(GEO.frames(), 11);
        assert_eq!(GEO.extents(), 41);
        assert_eq!(GEO.extents_covering(2047, 2), 0..2);
        assert_eq!(GEO.extents_covering(2048, 2048), 1..2);
        assert_eq!(GEO.extents_covering(5, 0), 0..0);
        assert_eq!(GEO.frames_covering(8191, 2), 0..2);
        // The last extent is cut at the end of the mapping.
        assert_eq!(GEO.bytes_of(40..41), (40 * 2048, 100));
        // Runs break at gaps and at frame borders.
        assert_eq!(
            GEO.runs(&[0, 1, 2, 3, 4, 5, 9, 40], true),
            vec![(0, 8192), (8192, 4096), (9 * 2048, 2048), (40 * 2048, 100)]
        );
        assert_eq!(
            GEO.runs(&[0, 1, 2, 3, 4, 5, 9, 39, 40], false),
            vec![(0, 12288), (9 * 2048, 2048), (39 * 2048, 2148)]
        );
    }

    #[test]
    fn victims_prefer_clean_and_skip_pinned() {
        let mut t = Table::new(GEO, 3);
        for f in 0..3 {
            t.mark_mapped(f);
        }
        let e = |f: usize| f * GEO.extents_per_frame();
        for f in 0..3 {
            let got = t.claim_absent(e(f)..e(f) + 1);
            t.finish_load(&got, true);
        }
        t.mark_dirty(e(0)..e(0) + 1);
        t.pin(1);
        assert_eq!(t.victim(), Victim::Clean(2));
        t.pin(2);
        assert_eq!(t.victim(), Victim::Dirty(0));
        t.pin(0);
        assert_eq!(t.victim(), Victim::None);
        t.check();
    }

    #[test]
    fn writeback_keeps_extents_dirtied_meanwhile() {
        let mut t = Table::new(GEO, 2);
        t.mark_mapped(0);
        let got = t.claim_absent(0..4);
        t.finish_load(&got, true);
        t.mark_dirty(0..2);
        let snapshot = t.dirty_in(0..4);
        t.mark_dirty(1..2); // written again while the write-back runs
        t.finish_writeback(&snapshot);
        assert_eq!(t.state(0), ExtentState::Clean);
        assert_eq!(t.state(1), ExtentState::Dirty);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire { frame: usize, write: bool },
        Release { frame: usize },
        Evict,
        Flush,
        FailedLoad { frame: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..11usize, any::<bool>()).prop_map(|(frame, write)| Op::Acquire { frame, write }),
            (0..11usize).prop_map(|frame| Op::Release { frame }),
            Just(Op::Evict),
            Just(Op::Flush),
            (0..11usize).prop_map(|frame| Op::FailedLoad { frame }),
        ]
    }

    proptest! {
        /// Random acquire/release/evict/flush sequences driven the way the map drives the
        /// table keep every invariant: never over budget, pinned frames never evicted, dirty
        /// data never dropped without a write-back.
        #[test]
        fn table_state_machine(ops in proptest::collection::vec(op(), 1..200), budget in 1..5usize) {
            let mut t = Table::new(GEO, budget);
            let mut pins = vec![0u32; GEO.frames()];
            for op in ops {
                match op {
                    Op::Acquire { frame, write } => {
                        if !t.is_mapped(frame) {
                            if !t.has_room() {
                                match t.victim() {
                                    Victim::Clean(v) => {
                                        prop_assert!(!t.frame_has(v, ExtentState::Dirty));
                                        prop_assert_eq!(pins[v], 0);
                                        t.mark_unmapped(v)
                                    }
                                    Victim::Dirty(v) => {
                                        let dirty = t.dirty_in(t.extents_of_frame(v));
                                        prop_assert!(!dirty.is_empty());
                                        t.finish_writeback(&dirty);
                                        t.mark_unmapped(v);
                                    }
                                    Victim::None => {
                                        prop_assert!(pins.iter().filter(|&&p| p > 0).count() >= budget);
                                        continue;
                                    }
                                }
                            }
                            t.mark_mapped(frame);
                        }
                        t.pin(frame);
                        pins[frame] += 1;
                        t.touch(frame);
                        let range = t.extents_of_frame(frame);
                        let got = t.claim_absent(range.clone());
                        t.finish_load(&got, true);
                        prop_assert!(!t.any_loading(range.clone()));
                        if write {
                            t.mark_dirty(range);
                        }
                    }
                    Op::Release { frame } => {
                        if pins[frame] > 0 {
                            pins[frame] -= 1;
                            t.unpin(frame);
                        }
                    }
                    Op::Evict => {
                        if let Victim::Clean(v) = t.victim() {
                            prop_assert_eq!(pins[v], 0);
                            prop_assert!(!t.frame_has(v, ExtentState::Dirty));
                            t.mark_unmapped(v);
                        }
                    }
                    Op::Flush => {
                        let all = t.dirty_in(0..GEO.extents());
                        t.finish_writeback(&all);
                        prop_assert_eq!(t.count(ExtentState::Dirty), 0);
                    }
                    Op::FailedLoad { frame } => {
                        if t.is_mapped(frame) {
                            let range = t.extents_of_frame(frame);
                            let got = t.claim_absent(range.clone());
                            t.finish_load(&got, false);
                            for e in got {
                                prop_assert_eq!(t.state(e), ExtentState::Absent);
                            }
                        }
                    }
                }
                t.check();
                for (f, &p) in pins.iter().enumerate() {
                    if p > 0 {
                        prop_assert!(t.is_mapped(f), "pinned frame {} lost its memory", f);
                    }
                }
            }
        }
    }
}
