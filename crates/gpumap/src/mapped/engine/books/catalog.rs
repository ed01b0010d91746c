//! What lookups outside the books see of the slots — the GPU's, through the cache's directory
//! (`engine::directory`), which a kernel reads while the books go on changing — and when a slot
//! such a lookup could still see may hold other bytes.
//!
//! The books record here which extent each clean slot holds (`fill`) and when a slot stops
//! holding it (`retire`). A reader first publishes what was recorded since the last reader (so
//! it sees every retirement recorded before it began) and gets a ticket, the number of that
//! publication; it gives the ticket back when its lookups are over. A slot retired now is
//! cleared from the directory by the next publication, `P`: it may hold other bytes once every
//! reader still reading has a ticket of at least `P` — none of them can see the old entry.
//! With no reader, at once.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::sync::Mutex;

use super::ids::{FileId, SlotId};
use crate::error::Result;

/// The directory's word for a slot that holds nothing lookups may see.
pub(crate) const EMPTY: u64 = u64::MAX;

/// Bits of a key that number the file; the rest number the extent.
const FILE_BITS: u32 = 24;
const EXTENT_BITS: u32 = 64 - FILE_BITS;

/// The directory's key of extent `e` of `file`: `(file << 40) | e` (the layout kernels see in
/// `gpumap_table.h`); `None` where the numbers do not fit, and the extent is then never in the
/// directory (its lookups miss, and the host serves it).
pub(crate) fn key(file: FileId, e: u64) -> Option<u64> {
    (u64::from(file) < 1 << FILE_BITS && e < 1 << EXTENT_BITS)
        .then_some((u64::from(file) << EXTENT_BITS) | e)
        .filter(|&k| k != EMPTY)
}

/// The books' record of what readers see (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    state: Mutex<CatalogState>,
    /// Held while a publication is written: one at a time, in order, and without `state`'s
    /// lock, which the books take under their own.
    publishing: Mutex<()>,
    /// The lowest ticket of a reader still reading (`u64::MAX`: none).
    oldest_reader: AtomicU64,
    /// Slots retired so far: how fast lookups' slots are being replaced.
    retired: AtomicU64,
}

#[derive(Debug, Default)]
struct CatalogState {
    /// What the next publication writes: each changed slot's key now, or [`EMPTY`] (one entry
    /// a slot, so it never outgrows the slots however long no reader comes).
    pending: BTreeMap<SlotId, u64>,
    /// Publications so far.
    published: u64,
    /// Whether a publication of changes taken from `pending` is being written: changes
    /// recorded meanwhile go to the one after it.
    in_flight: bool,
    /// Tickets of the readers reading, and how many hold each.
    readers: BTreeMap<u64, u32>,
}

impl CatalogState {
    /// The publication that will carry a change recorded now.
    fn next_publication(&self) -> u64 {
        self.published + 1 + u64::from(self.in_flight)
    }

    fn oldest(&self) -> u64 {
        self.readers.keys().next().copied().unwrap_or(u64::MAX)
    }
}

impl Catalog {
    /// A catalog with nothing recorded and no reader.
    pub(crate) fn new() -> Arc<Catalog> {
        Arc::new(Catalog {
            state: Mutex::new(CatalogState::default()),
            publishing: Mutex::new(()),
            oldest_reader: AtomicU64::new(u64::MAX),
            retired: AtomicU64::new(0),
        })
    }

    /// Records that slot `slot` holds the extent of `key` (its bytes are in place).
    pub(crate) fn fill(&self, slot: SlotId, key: u64) {
        self.state.lock().pending.insert(slot, key);
    }

    /// Records that slot `slot` no longer holds what it was filled with; returns the
    /// publication that clears it, which [`reusable`](Self::reusable) then asks about.
    pub(crate) fn retire(&self, slot: SlotId) -> u64 {
        self.retired.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.lock();
        state.pending.insert(slot, EMPTY);
        state.next_publication()
    }

    /// Slots retired since the catalog began.
    pub(crate) fn retired(&self) -> u64 {
        self.retired.load(Ordering::Relaxed)
    }

    /// Whether a slot retired for publication `publication` may hold other bytes: no reader
    /// that could see its old entry is still reading.
    pub(crate) fn reusable(&self, publication: u64) -> bool {
        self.oldest_reader.load(Ordering::Acquire) >= publication
    }

    /// Begins a reader: what was recorded since the last publication goes to `publish` (which
    /// writes it into the directory, in stream order before the reader's lookups), and the
    /// reader's ticket is returned with `publish`'s result. On an error nothing is published
    /// and the changes stay pending.
    pub(crate) fn begin_read<T>(
        &self,
        publish: impl FnOnce(&[(SlotId, u64)]) -> Result<T>,
    ) -> Result<(u64, T)> {
        let _one_at_a_time = self.publishing.lock();
        // The reader counts from here, with the ticket of the publication it is about to
        // write: a slot retired meanwhile is cleared only by the one after, and must wait for
        // this reader, which may yet see it.
        let (changes, ticket) = {
            let mut state = self.state.lock();
            let changes: Vec<(SlotId, u64)> =
                std::mem::take(&mut state.pending).into_iter().collect();
            state.in_flight = !changes.is_empty();
            let ticket = state.published + u64::from(state.in_flight);
            *state.readers.entry(ticket).or_default() += 1;
            self.oldest_reader.store(state.oldest(), Ordering::Release);
            (changes, ticket)
        };
        let made = publish(&changes);
        let mut state = self.state.lock();
        state.in_flight = false;
        match made {
            Ok(made) => {
                state.published = ticket;
                Ok((ticket, made))
            }
            Err(e) => {
                // Back in, under what was recorded meanwhile (which is newer); no reader.
                for (slot, key) in changes {
                    state.pending.entry(slot).or_insert(key);
                }
                drop(state);
                self.end_read(ticket);
                Err(e)
            }
        }
    }

    /// Ends a reader begun with `ticket`: its lookups are over.
    pub(crate) fn end_read(&self, ticket: u64) {
        let mut state = self.state.lock();
        if let Some(n) = state.readers.get_mut(&ticket) {
            *n -= 1;
            if *n == 0 {
                state.readers.remove(&ticket);
            }
        }
        self.oldest_reader.store(state.oldest(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retired_slot_is_reusable_once_the_readers_that_could_see_it_are_done() {
        let c = Catalog::new();
        c.fill(3, 30);
        // No reader: reusable at once.
        let p = c.retire(3);
        assert!(c.reusable(p));
        // A reader publishes both changes, then the slot is filled again and retired.
        let (t1, seen) = c.begin_read(|p| Ok(p.to_vec())).unwrap();
        assert_eq!(seen, vec![(3, EMPTY)], "a slot's last change is the one published");
        c.fill(3, 31);
        let p = c.retire(3);
        assert!(p > t1 && !c.reusable(p), "the reader may see the entry filled before");
        // A second reader publishes the retirement: it cannot see the old entry.
        let (t2, _) = c.begin_read(|p| Ok(p.len())).unwrap();
        assert_eq!(t2, p);
        c.end_read(t1);
        assert!(c.reusable(p), "the only reader left has a ticket of the clearing publication");
        c.end_read(t2);
        assert!(c.reusable(u64::MAX));
    }

    #[test]
    fn a_failed_publication_keeps_the_changes_pending() {
        let c = Catalog::new();
        c.fill(1, 10);
        let failed: Result<(u64, ())> =
            c.begin_read(|_| Err(crate::Error::InvalidArgument("device gone".into())));
        assert!(failed.is_err());
        assert!(c.reusable(1), "a failed reader holds nothing");
        let (_, seen) = c.begin_read(|p| Ok(p.to_vec())).unwrap();
        assert_eq!(seen, vec![(1, 10)]);
    }

    #[test]
    fn a_slot_retired_while_a_publication_is_written_waits_for_its_reader() {
        let c = Catalog::new();
        c.fill(1, 10);
        c.fill(2, 20);
        // While the reader writes the publication that fills slot 1, slot 1 is retired: the
        // reader may see it once its publication is in, so the slot is not reusable until the
        // reader is done — even though no reader was registered when the write began.
        let (ticket, retired_at) = c
            .begin_read(|changes| {
                assert_eq!(changes, [(1, 10), (2, 20)]);
                let at = c.retire(1);
                assert!(!c.reusable(at), "the reader being published may see slot 1");
                Ok(at)
            })
            .unwrap();
        assert_eq!(retired_at, ticket + 1, "cleared by the next publication, not this one");
        assert!(!c.reusable(retired_at));
        c.end_read(ticket);
        assert!(c.reusable(retired_at));
        let (_, seen) = c.begin_read(|p| Ok(p.to_vec())).unwrap();
        assert_eq!(seen, vec![(1, EMPTY)]);
    }

    #[test]
    fn keys_fit_or_are_none() {
        assert_eq!(key(1, 2), Some((1 << 40) | 2));
        assert_eq!(key((1 << 24) - 1, (1 << 40) - 2), Some(u64::MAX - 1));
        assert_eq!(key((1 << 24) - 1, (1 << 40) - 1), None, "the directory's empty word");
        assert_eq!(key(1 << 24, 0), None);
        assert_eq!(key(0, 1 << 40), None);
    }
}
