//! The books' own tests: cases for each rule, and a model-based test of every invariant under
//! random requests.

use super::catalog::EMPTY;
use super::*;
use proptest::prelude::*;

/// Takes a frame of the budget and records it as slots, as the cache does.
fn slot_frame(b: &mut Books) -> Option<usize> {
    if !b.budget().try_take() {
        return None;
    }
    b.add_slot_frame()
}

/// Takes a frame of the budget and records it as frame `index` of `file`, as the cache does.
fn file_frame(b: &mut Books, file: FileId, index: u64, transient: bool) {
    assert!(b.budget().try_take(), "no room for frame {index} of file {file}");
    b.add_frame(file, index, transient);
}

const G: Geometry = Geometry { extent: 4096, frame: 4 * 4096 };

#[test]
fn slots_fill_frames_and_evict_least_recent_first() {
    let mut b = Books::new(G, 2);
    let f = b.new_file(1 << 20);
    assert!(b.has_room());
    slot_frame(&mut b).unwrap();
    let mut slots = Vec::new();
    for e in 0..4 {
        let s = b.take_slot(f, e).unwrap();
        b.finish_slot_load(s, true);
        b.unpin(Unit::Slot(s), true);
        slots.push(s);
    }
    assert!(b.take_slot(f, 9).is_none(), "the frame's four slots are taken");
    assert_eq!(b.locate(f, 2), Location::Slot(slots[2], SlotState::Clean));
    // Using extent 0 again makes extent 1 the least recently used.
    b.pin(Unit::Slot(slots[0]), false);
    b.unpin(Unit::Slot(slots[0]), false);
    assert_eq!(b.victim(Want::Slot), Victim::Slot(slots[1]));
    b.evict_slot(slots[1]);
    assert_eq!(b.locate(f, 1), Location::Nowhere);
    assert_eq!(b.take_slot(f, 9), Some(slots[1]));
    b.check().unwrap();
}

#[test]
fn frames_take_over_extents_from_slots() {
    let mut b = Books::new(G, 2);
    let f = b.new_file(1 << 20);
    slot_frame(&mut b).unwrap();
    let s = b.take_slot(f, 1).unwrap();
    b.finish_slot_load(s, true);
    // A reader still pins the slot when the file frame arrives.
    file_frame(&mut b, f, 0, true);
    assert_eq!(b.locate(f, 1), Location::Slot(s, SlotState::Clean), "until it is moved");
    assert_eq!(b.claim_moves(f, 0..4), vec![(1, s)]);
    assert_eq!(b.locate(f, 1), Location::Frame(ExtentState::Loading));
    b.moved_to_frame(f, 1, true);
    b.unpin(Unit::Slot(s), true); // the mover's pin
    assert_eq!(b.locate(f, 1), Location::Frame(ExtentState::Clean));
    assert_eq!(b.slot_state(s), SlotState::Stale);
    b.unpin(Unit::Slot(s), true); // the reader's
    assert_eq!(b.slot_state(s), SlotState::Free);
    assert_eq!(b.claim_in_frames(f, 0..4), vec![0, 2, 3]);
    b.finish_frame_loads(f, &[0, 2, 3], true);
    b.unpin(Unit::Frame { file: f, index: 0 }, true);
    b.check().unwrap();
}

#[test]
fn a_dirty_victim_is_closed_to_requests_until_it_goes() {
    let mut b = Books::new(G, 2);
    let f = b.new_file(1 << 20);
    for index in 0..2 {
        file_frame(&mut b, f, index, false);
        let e = index * 4;
        let claimed = b.claim_in_frames(f, e..e + 4);
        b.finish_frame_loads(f, &claimed, true);
        b.mark_dirty(f, e..e + 2);
        b.unpin(Unit::Frame { file: f, index }, false);
    }
    let Victim::DirtyFrame { file, index } = b.victim(Want::Frame) else {
        panic!("a dirty frame is the only victim")
    };
    assert_eq!((file, index), (f, 0), "the least recently used");
    b.pin(Unit::Frame { file, index }, true);
    b.begin_eviction(file, index);
    assert!(b.is_evicting(f, 0) && !b.is_evicting(f, 1));
    for e in 0..4 {
        // Its bytes, dirty or clean, are not handed out while they go: requests wait.
        assert_eq!(b.locate(f, e), Location::Frame(ExtentState::Loading), "extent {e}");
    }
    assert_eq!(b.locate(f, 4), Location::Frame(ExtentState::Dirty));
    b.check().unwrap();
    let (mine, busy) = b.claim_writeback(f, 0..4, &HashSet::new());
    assert!(!busy);
    b.finish_writeback(f, &mine, &mine);
    assert!(b.end_eviction(f, 0, true), "clean and pinned by no one: it can go");
    b.remove_frame(f, 0);
    assert!(b.has_room());
    assert_eq!(b.locate(f, 0), Location::Nowhere);
    // A failed write-back keeps the frame, dirty, for a later one.
    b.pin(Unit::Frame { file: f, index: 1 }, true);
    b.begin_eviction(f, 1);
    assert!(!b.end_eviction(f, 1, false));
    assert!(!b.is_evicting(f, 1));
    assert_eq!(b.locate(f, 4), Location::Frame(ExtentState::Dirty));
    // Pinned by another while evicting (a flush), it stays too.
    b.pin(Unit::Frame { file: f, index: 1 }, true);
    b.begin_eviction(f, 1);
    b.pin(Unit::Frame { file: f, index: 1 }, true);
    let (mine, _) = b.claim_writeback(f, 4..8, &HashSet::new());
    b.finish_writeback(f, &mine, &mine);
    assert!(!b.end_eviction(f, 1, true), "another pin holds it");
    b.unpin(Unit::Frame { file: f, index: 1 }, true);
    b.check().unwrap();
}

#[test]
fn frames_read_ahead_go_after_every_other_clean_unit() {
    let mut b = Books::new(G, 3);
    let f = b.new_file(1 << 20);
    for index in 0..3 {
        file_frame(&mut b, f, index, true);
        let e = index * 4;
        let claimed = b.claim_in_frames(f, e..e + 4);
        b.finish_frame_loads(f, &claimed, true);
        if index == 0 {
            b.mark_read_ahead(f, &[0]);
        }
        b.unpin(Unit::Frame { file: f, index }, true);
    }
    // Frame 0 is the least recently used, but it was read ahead and no view used it yet.
    assert_eq!(b.victim(Want::Frame), Victim::CleanFrame { file: f, index: 1 });
    b.pin(Unit::Frame { file: f, index: 1 }, false);
    b.pin(Unit::Frame { file: f, index: 2 }, false);
    assert_eq!(b.victim(Want::Frame), Victim::CleanFrame { file: f, index: 0 }, "the last");
    // A view uses it: an ordinary frame from then on.
    b.pin(Unit::Frame { file: f, index: 0 }, false);
    b.unpin(Unit::Frame { file: f, index: 0 }, false);
    b.unpin(Unit::Frame { file: f, index: 1 }, false);
    assert_eq!(b.victim(Want::Frame), Victim::CleanFrame { file: f, index: 0 });
    // A frame a view already waits for is not marked: it is used, not ahead.
    b.pin(Unit::Frame { file: f, index: 1 }, true);
    b.pin(Unit::Frame { file: f, index: 1 }, false);
    b.mark_read_ahead(f, &[1]);
    b.unpin(Unit::Frame { file: f, index: 1 }, true);
    b.unpin(Unit::Frame { file: f, index: 1 }, false);
    b.unpin(Unit::Frame { file: f, index: 2 }, false);
    b.pin(Unit::Frame { file: f, index: 0 }, false);
    assert_eq!(b.victim(Want::Frame), Victim::CleanFrame { file: f, index: 1 });
    b.check().unwrap();
}

#[test]
fn writes_during_a_write_back_stay_dirty() {
    let mut b = Books::new(G, 1);
    let f = b.new_file(1 << 20);
    file_frame(&mut b, f, 0, false);
    let claimed = b.claim_in_frames(f, 0..2);
    b.finish_frame_loads(f, &claimed, true);
    // A writable view lives over the frame while a flush runs.
    b.add_writers(f, 0..1, 1);
    b.mark_dirty(f, 0..2);
    let (snapshot, busy) = b.claim_writeback(f, 0..4, &HashSet::new());
    assert!(!busy);
    assert_eq!(
        b.claim_writeback(f, 0..4, &HashSet::new()),
        (vec![], true),
        "one write-back at a time"
    );
    b.finish_writeback(f, &snapshot, &snapshot);
    assert_eq!(b.dirty_in(f, 0..4).len(), 2, "a live writer keeps its extents dirty");
    // The writer is done: its extents are newer than that flush.
    b.mark_dirty(f, 0..2);
    b.add_writers(f, 0..1, -1);
    let (again, _) = b.claim_writeback(f, 0..4, &HashSet::new());
    b.finish_writeback(f, &again, &snapshot);
    assert_eq!(b.dirty_in(f, 0..4).len(), 2, "a flush that started earlier cannot clean");
    let (fresh, _) = b.claim_writeback(f, 0..4, &HashSet::new());
    b.finish_writeback(f, &fresh, &fresh);
    assert!(b.dirty_in(f, 0..4).is_empty());
    b.unpin(Unit::Frame { file: f, index: 0 }, false);
    b.check().unwrap();
}

#[test]
fn a_write_back_skips_what_it_wrote_and_waits_only_for_the_rest() {
    let mut b = Books::new(G, 1);
    let f = b.new_file(1 << 20);
    file_frame(&mut b, f, 0, false);
    let claimed = b.claim_in_frames(f, 0..4);
    b.finish_frame_loads(f, &claimed, true);
    b.add_writers(f, 0..1, 1);
    b.mark_dirty(f, 0..4);
    // Another write-back holds extents 1 and 2; this one wrote 0 and 1 before.
    let other = b.claim_writeback(f, 1..3, &HashSet::new()).0;
    let written_here: HashSet<u64> = [0, 1].into();
    let (mine, busy) = b.claim_writeback(f, 0..4, &written_here);
    assert_eq!((mine.iter().map(|&(e, _)| e).collect::<Vec<_>>(), busy), (vec![3], true));
    b.finish_writeback(f, &mine, &mine);
    b.finish_writeback(f, &other, &other);
    // Kept dirty by the live view, 0, 1 and 3 are not claimed again; 2 is, once free.
    let (mine, busy) = b.claim_writeback(f, 0..4, &[0, 1, 3].into());
    assert_eq!((mine.iter().map(|&(e, _)| e).collect::<Vec<_>>(), busy), (vec![2], false));
    b.finish_writeback(f, &mine, &mine);
    let all: HashSet<u64> = (0..4).collect();
    assert_eq!(b.claim_writeback(f, 0..4, &all), (vec![], false), "nothing left to wait for");
    b.add_writers(f, 0..1, -1);
    b.unpin(Unit::Frame { file: f, index: 0 }, false);
    b.check().unwrap();
}

#[test]
fn a_frame_request_releases_a_whole_idle_slot_frame() {
    let mut b = Books::new(G, 1);
    let f = b.new_file(1 << 20);
    slot_frame(&mut b).unwrap();
    let s = b.take_slot(f, 7).unwrap();
    b.finish_slot_load(s, true);
    assert!(!b.has_room());
    assert_eq!(b.victim(Want::Frame), Victim::None, "its slot is pinned");
    b.unpin(Unit::Slot(s), true);
    assert_eq!(b.victim(Want::Frame), Victim::SlotFrame(0));
    assert!(b.remove_slot_frame(0));
    assert_eq!(b.locate(f, 7), Location::Nowhere);
    // The position and the frame come back only once the caller has unmapped the memory.
    assert!(!b.has_room());
    assert_eq!(b.budget().take_position(0), None, "the only position is still mapped");
    b.budget().release_slot_frame(0);
    assert!(b.has_room());
    b.check().unwrap();
}

/// One step of the model-based test.
#[derive(Debug, Clone)]
enum Op {
    Slot {
        file: u8,
        e: u64,
        ok: bool,
    },
    Frame {
        file: u8,
        index: u64,
        ok: bool,
        write: bool,
    },
    Flush {
        file: u8,
    },
    Evict {
        want_frame: bool,
    },
    DropFile {
        file: u8,
    },
    Sweep {
        n: usize,
    },
    /// A lookup outside the books begins (publishing what the catalog recorded) or ends.
    Read {
        begin: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..3, 0u64..24, prop::bool::weighted(0.9)).prop_map(|(file, e, ok)| Op::Slot {
            file,
            e,
            ok
        }),
        (0u8..3, 0u64..6, prop::bool::weighted(0.9), any::<bool>())
            .prop_map(|(file, index, ok, write)| Op::Frame { file, index, ok, write }),
        (0u8..3).prop_map(|file| Op::Flush { file }),
        any::<bool>().prop_map(|want_frame| Op::Evict { want_frame }),
        (0u8..3).prop_map(|file| Op::DropFile { file }),
        (0usize..10).prop_map(|n| Op::Sweep { n }),
        any::<bool>().prop_map(|begin| Op::Read { begin }),
    ]
}

/// Makes room for `want` the way the cache does (a write-back is simulated as success).
fn make_room(b: &mut Books, want: Want) -> bool {
    loop {
        if want == Want::Slot && b.has_free_slot() {
            return true;
        }
        if b.has_room() {
            if want == Want::Slot {
                slot_frame(b);
            }
            return true;
        }
        match b.victim(want) {
            Victim::CleanFrame { file, index } => b.remove_frame(file, index),
            Victim::DirtyFrame { file, index } => {
                let per = b.geometry().per_frame();
                let (d, _) =
                    b.claim_writeback(file, index * per..(index + 1) * per, &HashSet::new());
                b.finish_writeback(file, &d, &d);
            }
            Victim::Slot(s) => b.evict_slot(s),
            Victim::SlotFrame(p) => {
                if b.remove_slot_frame(p) {
                    b.budget().release_slot_frame(p);
                }
            }
            Victim::None => return false,
        }
    }
}

proptest! {
    /// Random requests against books of 1 to 4 frames: after every step the invariants
    /// hold, the budget is never exceeded, and no extent is in two places.
    #[test]
    fn invariants_hold_under_random_requests(
        frames in 1usize..5,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let mut b = Books::new(G, frames);
        let mut files: Vec<FileId> = (0..3).map(|_| b.new_file(24 * 4096)).collect();
        // The directory as published, and what each reader still reading saw of it.
        let mut directory: std::collections::HashMap<SlotId, u64> = Default::default();
        let mut readers: Vec<(u64, std::collections::HashMap<SlotId, u64>)> = Vec::new();
        for op in ops {
            match op {
                Op::Slot { file, e, ok } => {
                    let f = files[file as usize];
                    if b.locate(f, e) != Location::Nowhere {
                        continue;
                    }
                    if !make_room(&mut b, Want::Slot) {
                        continue;
                    }
                    if let Some(s) = b.take_slot(f, e) {
                        b.finish_slot_load(s, ok);
                        b.unpin(Unit::Slot(s), true);
                    }
                }
                Op::Frame { file, index, ok, write } => {
                    let f = files[file as usize];
                    let unit = Unit::Frame { file: f, index };
                    if b.is_mapped(f, index) {
                        b.pin(unit, false);
                    } else {
                        if !make_room(&mut b, Want::Frame) {
                            continue;
                        }
                        file_frame(&mut b, f, index, false);
                    }
                    let per = b.geometry().per_frame();
                    let range = index * per..(index + 1) * per;
                    for (e, slot) in b.claim_moves(f, range.clone()) {
                        b.moved_to_frame(f, e, ok);
                        b.unpin(Unit::Slot(slot), true);
                    }
                    let claimed = b.claim_in_frames(f, range.clone());
                    b.finish_frame_loads(f, &claimed, ok);
                    let valid = range.clone().all(|e| {
                        matches!(
                            b.locate(f, e),
                            Location::Frame(ExtentState::Clean | ExtentState::Dirty)
                        )
                    });
                    if write && valid {
                        b.mark_dirty(f, range);
                    }
                    b.unpin(unit, false);
                }
                Op::Flush { file } => {
                    let f = files[file as usize];
                    let (d, _) = b.claim_writeback(f, 0..24, &HashSet::new());
                    b.finish_writeback(f, &d, &d);
                    prop_assert!(b.dirty_in(f, 0..24).is_empty());
                }
                Op::Evict { want_frame } => {
                    let want = if want_frame { Want::Frame } else { Want::Slot };
                    match b.victim(want) {
                        Victim::CleanFrame { file, index } => b.remove_frame(file, index),
                        Victim::Slot(s) => b.evict_slot(s),
                        Victim::SlotFrame(p) => {
                            if b.remove_slot_frame(p) {
                                b.budget().release_slot_frame(p);
                            }
                        }
                        Victim::DirtyFrame { .. } | Victim::None => {}
                    }
                }
                Op::DropFile { file } => {
                    let f = files[file as usize];
                    let (d, _) = b.claim_writeback(f, 0..24, &HashSet::new());
                    b.finish_writeback(f, &d, &d);
                    b.remove_file(f);
                    files[file as usize] = b.new_file(24 * 4096);
                }
                Op::Sweep { n } => {
                    // The victims one by one would be the oldest units while they are
                    // slots; the sweep takes exactly those, and leaves the rest in order.
                    let before: Vec<Unit> = b.lru.oldest_first().collect();
                    let expected: Vec<(SlotId, (FileId, u64))> = before
                        .iter()
                        .take(n)
                        .map_while(|u| match u {
                            Unit::Slot(s) => Some((*s, b.slot_owner(*s))),
                            Unit::Frame { .. } => None,
                        })
                        .collect();
                    prop_assert_eq!(b.evict_oldest_slots(n), expected.len());
                    for (s, (file, e)) in &expected {
                        let state = b.slot_state(*s);
                        prop_assert!(matches!(state, SlotState::Free | SlotState::Retiring));
                        prop_assert_ne!(b.locate(*file, *e), Location::Slot(*s, SlotState::Clean));
                    }
                    let after: Vec<Unit> = b.lru.oldest_first().collect();
                    prop_assert_eq!(&after[..], &before[expected.len()..]);
                }
                Op::Read { begin: true } => {
                    let catalog = Arc::clone(&b.catalog);
                    let (ticket, ()) = catalog
                        .begin_read(|changes| {
                            for &(slot, key) in changes {
                                if key == EMPTY {
                                    directory.remove(&slot);
                                } else {
                                    directory.insert(slot, key);
                                }
                            }
                            Ok(())
                        })
                        .unwrap();
                    readers.push((ticket, directory.clone()));
                }
                Op::Read { begin: false } => {
                    if let Some((ticket, _)) = readers.pop() {
                        b.catalog.end_read(ticket);
                    }
                }
            }
            // What any reader still reading may find in a slot, the slot still holds.
            for (ticket, seen) in &readers {
                for (&slot, &k) in seen {
                    let held = b.arena.slot(slot);
                    prop_assert!(
                        !matches!(held.state, SlotState::Free | SlotState::Loading)
                            && key(held.owner.0, held.owner.1) == Some(k),
                        "reader {} may find slot {} holding {:#x}, which now holds {:?}",
                        ticket, slot, k, held
                    );
                }
            }
            if let Err(e) = b.check() {
                return Err(TestCaseError::fail(e));
            }
            prop_assert!(b.frames_in_use() <= frames);
            prop_assert_eq!(b.transient_pins(), 0);
        }
    }
}
