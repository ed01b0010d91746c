//! One file's part of the books: its mapped file frames, the state of every extent in them, and
//! where its extents sit in slots. What happens to extents inside file frames — claimed for
//! reading, read in, made dirty, claimed for write-back, written back — is decided here; pins,
//! the LRU list and the slots themselves are the whole books' business.
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::ops::Range;

use super::ids::{ExtentState, FileCounters, IndexHashMap, SlotId, NIL};
use crate::mapped::engine::geometry::Geometry;

/// What the books keep of one extent of a mapped file frame.
#[derive(Debug, Clone, Copy)]
pub(super) struct Extent {
    pub(super) state: ExtentState,
    /// Bumped whenever the extent is made dirty: a write-back that started before a newer write
    /// must not mark it clean.
    pub(super) version: u32,
    /// A write-back of it is in flight: no other may start (their writes could land in either
    /// order, an older one's bytes last).
    pub(super) writing: bool,
}

/// A frame of memory mapped at its place in one file's address range.
#[derive(Debug)]
pub(super) struct FileFrame {
    pub(super) extents: Box<[Extent]>,
    /// Views and operations using the frame; a pinned frame is never evicted.
    pub(super) pins: u32,
    /// Live writable views over the frame: while any is live, its extents stay dirty whatever
    /// is written back.
    pub(super) writers: u32,
    /// Its node in the LRU list, when unpinned.
    pub(super) lru: u32,
    /// Its dirty bytes are going out so that its memory can be given up: new requests wait
    /// for it to go (see `Books::begin_eviction`).
    pub(super) evicting: bool,
    /// Read ahead and not yet pinned by a view: evicted only when no other clean unit can go
    /// (see `Books::mark_read_ahead`).
    pub(super) ahead: bool,
}

impl FileFrame {
    /// A frame just mapped: every extent absent, pinned once by whoever mapped it.
    pub(super) fn new(per_frame: usize) -> FileFrame {
        let absent = Extent { state: ExtentState::Absent, version: 0, writing: false };
        FileFrame {
            extents: vec![absent; per_frame].into_boxed_slice(),
            pins: 1,
            writers: 0,
            lru: NIL,
            evicting: false,
            ahead: false,
        }
    }

    /// Whether nothing in the frame is loading or dirty (a file frame cannot go otherwise).
    pub(super) fn is_clean(&self) -> bool {
        self.extents.iter().all(|x| matches!(x.state, ExtentState::Absent | ExtentState::Clean))
    }
}

/// One file's part of the books.
#[derive(Debug)]
pub(crate) struct FileBooks {
    /// Bytes mapped: the file's length when it was opened.
    pub(crate) len: u64,
    pub(super) frames: IndexHashMap<u64, FileFrame>,
    /// Extent -> the slot holding it (loading or clean).
    pub(super) slots: IndexHashMap<u64, SlotId>,
    pub(crate) counters: FileCounters,
}

impl FileBooks {
    /// A file of `len` bytes with nothing resident.
    pub(super) fn new(len: u64) -> FileBooks {
        FileBooks {
            len,
            frames: IndexHashMap::default(),
            slots: IndexHashMap::default(),
            counters: FileCounters::default(),
        }
    }

    /// The extent state of extent `e`, when its frame is mapped.
    pub(super) fn extent_mut(&mut self, g: Geometry, e: u64) -> Option<&mut Extent> {
        let frame = self.frames.get_mut(&g.frame_of(e))?;
        Some(&mut frame.extents[g.within_frame(e)])
    }

    /// Claims the absent extents among `extents` (their frames mapped, no slot holding them)
    /// for reading in: they become `Loading`. Returns them.
    pub(super) fn claim_in_frames(&mut self, g: Geometry, extents: Range<u64>) -> Vec<u64> {
        let mut claimed = Vec::new();
        for e in extents {
            if self.slots.contains_key(&e) {
                continue;
            }
            if let Some(x) = self.extent_mut(g, e) {
                if x.state == ExtentState::Absent {
                    x.state = ExtentState::Loading;
                    claimed.push(e);
                }
            }
        }
        claimed
    }

    /// Marks extents read in (`ok`: clean; otherwise absent again).
    pub(super) fn finish_frame_loads(&mut self, g: Geometry, extents: &[u64], ok: bool) {
        for &e in extents {
            if let Some(x) = self.extent_mut(g, e) {
                if x.state == ExtentState::Loading {
                    x.state = if ok { ExtentState::Clean } else { ExtentState::Absent };
                }
            }
        }
    }

    /// Marks `extents` dirty (each in a mapped frame, clean or dirty), newer than any
    /// write-back in progress.
    pub(super) fn mark_dirty(&mut self, g: Geometry, extents: Range<u64>) {
        for e in extents {
            if let Some(x) = self.extent_mut(g, e) {
                debug_assert!(matches!(x.state, ExtentState::Clean | ExtentState::Dirty));
                x.state = ExtentState::Dirty;
                x.version = x.version.wrapping_add(1);
            }
        }
    }

    /// Adds `delta` (±1) live writable views to each frame of `frames`.
    pub(super) fn add_writers(&mut self, frames: Range<u64>, delta: i32) {
        for index in frames {
            if let Some(frame) = self.frames.get_mut(&index) {
                frame.writers = frame.writers.saturating_add_signed(delta);
            }
        }
    }

    /// The dirty extents among `extents`, sorted.
    pub(super) fn scan_dirty(&self, g: Geometry, extents: Range<u64>) -> Vec<(u64, Extent)> {
        let mut dirty = Vec::new();
        if (extents.end - extents.start) / g.per_frame() > self.frames.len() as u64 {
            // A wide range over few mapped frames: walk the frames, not the range.
            let mut frames: Vec<(&u64, &FileFrame)> = self.frames.iter().collect();
            frames.sort_unstable_by_key(|(index, _)| **index);
            for (&index, frame) in frames {
                for (i, x) in frame.extents.iter().enumerate() {
                    let e = index * g.per_frame() + i as u64;
                    if x.state == ExtentState::Dirty && extents.contains(&e) {
                        dirty.push((e, *x));
                    }
                }
            }
            return dirty;
        }
        for e in extents {
            if let Some(frame) = self.frames.get(&g.frame_of(e)) {
                let x = frame.extents[g.within_frame(e)];
                if x.state == ExtentState::Dirty {
                    dirty.push((e, x));
                }
            }
        }
        dirty
    }

    /// Claims the dirty extents among `extents`, but those in `skip`, that no write-back is
    /// writing (with their versions, sorted), and says whether others are being written.
    pub(super) fn claim_writeback(
        &mut self,
        g: Geometry,
        extents: Range<u64>,
        skip: &HashSet<u64>,
    ) -> (Vec<(u64, u32)>, bool) {
        let mut dirty = self.scan_dirty(g, extents);
        if !skip.is_empty() {
            dirty.retain(|(e, _)| !skip.contains(e));
        }
        let busy = dirty.iter().any(|(_, x)| x.writing);
        let mine: Vec<(u64, u32)> =
            dirty.into_iter().filter(|(_, x)| !x.writing).map(|(e, x)| (e, x.version)).collect();
        for &(e, _) in &mine {
            if let Some(x) = self.extent_mut(g, e) {
                x.writing = true;
            }
        }
        (mine, busy)
    }

    /// Records a write-back of `claimed`, of which `written` reached the file: those become
    /// clean unless written again since it started, or a writable view over them lives; all
    /// become claimable again.
    pub(super) fn finish_writeback(
        &mut self,
        g: Geometry,
        claimed: &[(u64, u32)],
        written: &[(u64, u32)],
    ) {
        for &(e, _) in claimed {
            if let Some(x) = self.extent_mut(g, e) {
                x.writing = false;
            }
        }
        for &(e, version) in written {
            if let Some(frame) = self.frames.get_mut(&g.frame_of(e)) {
                if frame.writers > 0 {
                    continue;
                }
                let x = &mut frame.extents[g.within_frame(e)];
                if x.state == ExtentState::Dirty && x.version == version {
                    x.state = ExtentState::Clean;
                }
            }
        }
    }

    /// The frames no one pins, with nothing dirty or loading (for `evict`).
    pub(super) fn idle_frames(&self) -> Vec<u64> {
        self.frames
            .iter()
            .filter(|(_, f)| f.pins == 0 && f.is_clean())
            .map(|(&index, _)| index)
            .collect()
    }

    /// Bytes resident in file frames (clean or dirty) and dirty, counting the last extent's
    /// bytes only up to the file's end.
    pub(super) fn frame_bytes(&self, g: Geometry) -> (u64, u64) {
        let bytes = |e: u64| g.bytes_of(e..e + 1, self.len).1;
        let (mut resident, mut dirty) = (0, 0);
        for (&index, frame) in &self.frames {
            for (i, x) in frame.extents.iter().enumerate() {
                let e = index * g.per_frame() + i as u64;
                match x.state {
                    ExtentState::Clean => resident += bytes(e),
                    ExtentState::Dirty => {
                        resident += bytes(e);
                        dirty += bytes(e);
                    }
                    _ => {}
                }
            }
        }
        (resident, dirty)
    }
}
