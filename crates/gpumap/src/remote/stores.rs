//! The stores a thread with a runtime of its own keeps (a read lane, a request loop): one per
//! file it has served, made from the file's [`StoreRecipe`](super::client::StoreRecipe), so
//! that the file's connections on that thread live on that thread's runtime.
//!
//! A store is kept while its [`StoreOwner`] lives (at most [`MAX_KEPT_STORES`] a thread). When
//! an owner goes, the hooks of [`when_an_owner_goes`] ask each such thread to drop its stores,
//! so that their connections close soon after the file does, not at the thread's next read.
#![forbid(unsafe_code)]

use std::sync::{Arc, Weak};

use crate::sync::Mutex;
use object_store::ObjectStore;

use crate::error::Result;

/// Stores a thread keeps at once: the files read most recently. An older one is dropped, and
/// its connections closed, when a newer one needs the room.
pub(crate) const MAX_KEPT_STORES: usize = 4;

/// The owner of the stores that threads make from one recipe: they are kept while it lives, and
/// dropped (their connections closed) soon after it goes.
#[derive(Debug, Default)]
pub(crate) struct StoreOwner {
    alive: Arc<()>,
}

impl StoreOwner {
    fn key(&self) -> Weak<()> {
        Arc::downgrade(&self.alive)
    }
}

impl Drop for StoreOwner {
    fn drop(&mut self) {
        // Let go first, so that the threads find this owner gone however soon they look.
        drop(std::mem::take(&mut self.alive));
        let hooks = HOOKS.lock().clone();
        for (_, hook) in hooks {
            hook();
        }
    }
}

/// What runs when an owner goes ([`when_an_owner_goes`]): the name of the threads it tells,
/// and the function that tells them.
type Hook = (&'static str, fn());

static HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());

/// Has `hook` run whenever a [`StoreOwner`] goes: it asks the threads named `threads` to
/// [`forget_dead`](StoreShelf::forget_dead). A second call with the same name does nothing.
pub(crate) fn when_an_owner_goes(threads: &'static str, hook: fn()) {
    let mut hooks = HOOKS.lock();
    if !hooks.iter().any(|(name, _)| *name == threads) {
        hooks.push((threads, hook));
    }
}

/// The stores one thread keeps, by the owner they were made for; oldest first. What is kept
/// is a store, or a store with what goes with it on that thread (`T`, cheap to clone).
pub(crate) struct StoreShelf<T = Arc<dyn ObjectStore>> {
    stores: Vec<(Weak<()>, T)>,
}

impl<T> Default for StoreShelf<T> {
    fn default() -> Self {
        StoreShelf { stores: Vec::new() }
    }
}

impl<T: Clone> StoreShelf<T> {
    /// The store for `owner`, made by `make` the first time (and again after it was dropped
    /// for room); `true` beside it where a store was dropped, whose connections the caller's
    /// runtime should let close.
    pub(crate) fn store(
        &mut self,
        owner: &StoreOwner,
        make: impl FnOnce() -> Result<T>,
    ) -> Result<(T, bool)> {
        let mut dropped = self.forget_dead();
        let key = owner.key();
        if let Some((_, store)) = self.stores.iter().find(|(k, _)| k.ptr_eq(&key)) {
            return Ok((store.clone(), dropped));
        }
        let store = make()?;
        if self.stores.len() >= MAX_KEPT_STORES {
            self.stores.remove(0);
            dropped = true;
        }
        self.stores.push((key, store.clone()));
        Ok((store, dropped))
    }

    /// Drops the stores whose owners are gone; `true` where there were any.
    pub(crate) fn forget_dead(&mut self) -> bool {
        let before = self.stores.len();
        self.stores.retain(|(owner, _)| owner.strong_count() > 0);
        self.stores.len() < before
    }

    /// How many stores it keeps.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.stores.len()
    }

    /// Drops every store.
    pub(crate) fn clear(&mut self) {
        self.stores.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn memory_store() -> Result<Arc<dyn ObjectStore>> {
        Ok(Arc::new(InMemory::new()))
    }

    #[test]
    fn a_shelf_keeps_one_store_per_live_owner_within_its_bound() {
        let owners: Vec<StoreOwner> =
            (0..MAX_KEPT_STORES + 2).map(|_| StoreOwner::default()).collect();
        let mut shelf: StoreShelf = StoreShelf::default();
        let mut made = 0;
        let mut make = || {
            made += 1;
            memory_store()
        };
        let (first, dropped) = shelf.store(&owners[0], &mut make).unwrap();
        assert!(!dropped);
        let (again, _) = shelf.store(&owners[0], &mut make).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        let mut drops = 0;
        for owner in &owners[1..] {
            drops += usize::from(shelf.store(owner, &mut make).unwrap().1);
        }
        assert_eq!(shelf.len(), MAX_KEPT_STORES);
        assert_eq!(drops, owners.len() - MAX_KEPT_STORES);
        // The oldest were dropped for room: asking for the first again makes a new one.
        let (remade, dropped) = shelf.store(&owners[0], &mut make).unwrap();
        assert!(dropped);
        assert!(!Arc::ptr_eq(&first, &remade));
        assert_eq!(made, MAX_KEPT_STORES + 3);
    }

    #[test]
    fn a_store_is_kept_while_its_owner_lives_and_dropped_after() {
        let mut shelf: StoreShelf = StoreShelf::default();
        let owner = StoreOwner::default();
        let weak = Arc::downgrade(&shelf.store(&owner, memory_store).unwrap().0);
        assert!(weak.upgrade().is_some(), "the shelf keeps the store while its owner lives");
        let again = shelf.store(&owner, || Err(crate::Error::InvalidArgument("made twice".into())));
        assert!(Arc::ptr_eq(&again.unwrap().0, &weak.upgrade().unwrap()));
        drop(owner);
        assert!(shelf.forget_dead());
        assert!(weak.upgrade().is_none(), "the store outlived its owner");
        assert_eq!(shelf.len(), 0);
        assert!(!shelf.forget_dead());
    }
}
