//! The plan of a gather round: what each row does, decided from a snapshot of where the books
//! found its extent before the round claimed anything. A pure function, kept apart from the
//! code that takes the pins, claims and slots it calls for (`gather`), and tested from a table,
//! as glommio tests its read coalescer.
#![forbid(unsafe_code)]

use super::books::{ExtentState, FileId, IndexHashMap, Location, SlotId, SlotState};

/// What a round does with one row: one extent of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowPlan {
    /// Resident in its file frame: pin the frame, copy from it.
    HitFrame,
    /// Resident in this clean slot: pin it, copy from it.
    HitSlot(SlotId),
    /// Its frame is mapped and the extent absent there: claim it and read it into the frame.
    ReadIntoFrame,
    /// Nowhere: it needs a slot (or, in a budget with no room, to be read through).
    NeedSlot,
    /// Someone else is reading it, or its frame is being evicted: left to the next round.
    Defer,
    /// An earlier row of the round (this index into the rows) reads the same extent: served by
    /// that read, not one of its own.
    SameAs(usize),
}

/// Plans a round: row `i` wants extent `keys[i].1` of file `keys[i].0`, which the books found at
/// `located[i]`. An extent asked for by several rows is read once, by the first.
pub(crate) fn plan_rows(keys: &[(FileId, u64)], located: &[Location]) -> Vec<RowPlan> {
    debug_assert_eq!(keys.len(), located.len());
    // (file, extent) -> the row that reads it.
    let mut reader: IndexHashMap<(FileId, u64), usize> = IndexHashMap::default();
    reader.reserve(keys.len());
    keys.iter()
        .zip(located)
        .enumerate()
        .map(|(row, (&key, &location))| {
            if let Some(&first) = reader.get(&key) {
                return RowPlan::SameAs(first);
            }
            let plan = match location {
                Location::Frame(ExtentState::Clean | ExtentState::Dirty) => RowPlan::HitFrame,
                Location::Slot(slot, SlotState::Clean) => RowPlan::HitSlot(slot),
                Location::Frame(ExtentState::Absent) => RowPlan::ReadIntoFrame,
                Location::Nowhere => RowPlan::NeedSlot,
                Location::Frame(ExtentState::Loading) | Location::Slot(..) => RowPlan::Defer,
            };
            if matches!(plan, RowPlan::ReadIntoFrame | RowPlan::NeedSlot) {
                reader.insert(key, row);
            }
            plan
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use Location::{Frame, Nowhere, Slot};
    use RowPlan::*;

    #[test]
    fn rows_are_planned_from_where_their_extents_are() {
        // (file, extent), where the books found it, the plan.
        let table: &[((FileId, u64), Location, RowPlan)] = &[
            ((0, 1), Frame(ExtentState::Clean), HitFrame),
            ((0, 2), Frame(ExtentState::Dirty), HitFrame),
            ((0, 3), Slot(7, SlotState::Clean), HitSlot(7)),
            ((0, 4), Frame(ExtentState::Absent), ReadIntoFrame),
            ((0, 5), Nowhere, NeedSlot),
            ((0, 6), Frame(ExtentState::Loading), Defer),
            ((0, 7), Slot(8, SlotState::Loading), Defer),
            ((0, 8), Slot(9, SlotState::Stale), Defer),
            // The same extents again: a read serves every row of its extent; resident and
            // deferred ones are planned again, each row its own pin.
            ((0, 4), Frame(ExtentState::Absent), SameAs(3)),
            ((0, 5), Nowhere, SameAs(4)),
            ((0, 1), Frame(ExtentState::Clean), HitFrame),
            ((0, 6), Frame(ExtentState::Loading), Defer),
            // Another file's extent of the same number is another extent.
            ((1, 5), Nowhere, NeedSlot),
            ((1, 5), Nowhere, SameAs(12)),
        ];
        let keys: Vec<(FileId, u64)> = table.iter().map(|r| r.0).collect();
        let located: Vec<Location> = table.iter().map(|r| r.1).collect();
        let expected: Vec<RowPlan> = table.iter().map(|r| r.2).collect();
        assert_eq!(plan_rows(&keys, &located), expected);
    }

    #[test]
    fn an_empty_round_plans_nothing() {
        assert!(plan_rows(&[], &[]).is_empty());
    }
}
