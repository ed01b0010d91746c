//! Values made again in a forked child: [`ForkLocal`] (one object's), a process-wide one, and
//! the slots both keep them in, one lock per fork generation (`ByGeneration`).
//!
//! A child forked from a process that made such a value (the I/O pool, the remote runtime, a
//! map's cache) inherits the value but none of the threads that work on it: work handed to it
//! would wait for ever, and state those threads had half changed (an extent being read, a
//! lock held) stays so. The value is therefore kept with the fork generation it was made in
//! ([`fork_generation`]), and a child makes its own. The parent's is never dropped in a
//! child: dropping it would run the parent's clean-up (a write-back of what the parent had
//! not yet written) from a copy of the parent taken at an arbitrary moment.
#![forbid(unsafe_code)]

use crate::sync::RwLock;

/// How many forks lie between the first process and this one: 0 in a process that was not
/// forked from one using gpumap, one more in each forked child. A value made in another
/// generation was made by a parent.
pub fn fork_generation() -> u64 {
    crate::sys::posix::fork_generation()
}

/// `spawn()`, a thread's start, while no fork can begin; a fork waits for the spawns under way
/// to end. Every thread gpumap starts is started so: a fork in the middle of glibc's
/// `pthread_create` leaves the child a stack whose thread-local blocks it frees twice.
pub fn spawn_apart_from_fork<T>(spawn: impl FnOnce() -> T) -> T {
    crate::sys::posix::spawn_apart_from_fork(spawn)
}

/// The pool `builder` describes, its threads started through [`spawn_apart_from_fork`].
pub(crate) fn build_rayon_pool(
    builder: rayon::ThreadPoolBuilder,
) -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    builder
        .spawn_handler(|thread| {
            let mut spawning = std::thread::Builder::new();
            if let Some(name) = thread.name() {
                spawning = spawning.name(name.to_owned());
            }
            if let Some(size) = thread.stack_size() {
                spawning = spawning.stack_size(size);
            }
            spawn_apart_from_fork(|| spawning.spawn(|| thread.run()))?;
            Ok(())
        })
        .build()
}

/// Generations with a slot of their own in a [`ByGeneration`]; a process forked this many
/// levels below another shares that ancestor's slot.
const GENERATION_SLOTS: usize = 8;

/// A value for each fork generation, each behind a lock of its own, so that a forked child
/// never takes a lock its parent's threads take: one such thread holding it at the fork would
/// hold it for ever in the child, where that thread does not exist. Values of other
/// generations (a parent's, inherited) are forgotten, never dropped (see the module's docs).
pub(crate) struct ByGeneration<T> {
    slots: [RwLock<Option<(u64, T)>>; GENERATION_SLOTS],
}

impl<T: Clone> ByGeneration<T> {
    pub(crate) const fn new() -> Self {
        ByGeneration { slots: [const { RwLock::new(None) }; GENERATION_SLOTS] }
    }

    fn slot(&self, generation: u64) -> &RwLock<Option<(u64, T)>> {
        &self.slots[(generation % GENERATION_SLOTS as u64) as usize]
    }

    /// The value of `generation`, if it was made.
    pub(crate) fn get(&self, generation: u64) -> Option<T> {
        self.read(generation, T::clone)
    }

    /// `read` of the value of `generation`, if it was made, without cloning it.
    pub(crate) fn read<R>(&self, generation: u64, read: impl FnOnce(&T) -> R) -> Option<R> {
        let slot = self.slot(generation).read();
        slot.as_ref().filter(|(made_in, _)| *made_in == generation).map(|(_, v)| read(v))
    }

    /// The value of `generation`, made by `make` where there is none yet. Concurrent first
    /// uses wait for the one that makes it: one value per generation.
    pub(crate) fn get_or_try_make<E>(
        &self,
        generation: u64,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        if let Some(value) = self.get(generation) {
            return Ok(value);
        }
        let mut slot = self.slot(generation).write();
        if let Some((made_in, value)) = slot.as_ref() {
            if *made_in == generation {
                return Ok(value.clone());
            }
        }
        let value = make()?;
        forget_inherited(slot.replace((generation, value.clone())), generation);
        Ok(value)
    }

    /// Makes `value` the value of `generation`; returns the one it replaces, if that was of
    /// `generation` too (one of another is forgotten).
    pub(crate) fn replace(&self, generation: u64, value: T) -> Option<T> {
        let old = self.slot(generation).write().replace((generation, value));
        forget_inherited(old, generation)
    }
}

/// `old` where it was made in `generation`; forgotten where it was made in another.
fn forget_inherited<T>(old: Option<(u64, T)>, generation: u64) -> Option<T> {
    match old {
        Some((made_in, value)) if made_in == generation => Some(value),
        Some(inherited) => {
            std::mem::forget(inherited);
            None
        }
        None => None,
    }
}

impl<T> Drop for ByGeneration<T> {
    fn drop(&mut self) {
        let generation = fork_generation();
        for slot in &mut self.slots {
            drop(forget_inherited(slot.get_mut().take(), generation));
        }
    }
}

/// A process-wide value of type `T` (cheap to clone: an `Arc`), made on first use in each
/// process (see [`ByGeneration`]). Made in a parent, it is never dropped in a child: its
/// threads are not there to join.
pub(crate) struct PerProcess<T> {
    values: ByGeneration<T>,
}

impl<T: Clone> PerProcess<T> {
    pub(crate) const fn new() -> Self {
        PerProcess { values: ByGeneration::new() }
    }

    /// This process's value, if it was made.
    #[cfg(feature = "remote")]
    pub(crate) fn get(&self) -> Option<T> {
        self.values.get(fork_generation())
    }

    /// This process's value, made by `make` where there is none yet.
    pub(crate) fn get_or_try_make<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        self.values.get_or_try_make(fork_generation(), make)
    }
}

/// A value of one object (not of the whole process) that is bound to the process that made
/// it: a remote file's store, whose pooled connections are driven by that process's runtime;
/// a Python map's cache and open file, whose extents that process's threads read. A forked
/// child that uses the object gets a value of its own, made on first use.
///
/// Dropped in a child, the parent's value (and a value of an earlier child's) is forgotten,
/// not dropped (see the module's docs); its memory is the child's copy, given back at exit.
pub struct ForkLocal<T> {
    made_in: u64,
    /// `None` only once dropped.
    value: Option<T>,
    /// The values of forked children, made on their first use.
    children: ByGeneration<T>,
}

impl<T: Clone> ForkLocal<T> {
    /// `value`, made in this process.
    pub fn new(value: T) -> Self {
        ForkLocal { made_in: fork_generation(), value: Some(value), children: ByGeneration::new() }
    }

    /// This process's value: the one made at `new`, or in a forked child its own, made by
    /// `make` on first use (and made again in a grandchild).
    pub fn get<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let generation = fork_generation();
        match &self.value {
            Some(value) if generation == self.made_in => Ok(value.clone()),
            _ => self.children.get_or_try_make(generation, make),
        }
    }

    /// This process's value if it has one: the one made at `new`, or a forked child's once
    /// made; `None` in a child that has not used the object.
    pub fn made_here(&self) -> Option<T> {
        let generation = fork_generation();
        match &self.value {
            Some(value) if generation == self.made_in => Some(value.clone()),
            _ => self.children.get(generation),
        }
    }
}

impl<T> Drop for ForkLocal<T> {
    fn drop(&mut self) {
        let generation = fork_generation();
        if generation != self.made_in {
            std::mem::forget(self.value.take());
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for ForkLocal<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForkLocal").field("value", &self.value).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A value that counts its drops.
    #[derive(Clone)]
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn each_generation_makes_its_value_once() {
        let values = ByGeneration::<u64>::new();
        let mut made = 0;
        for generation in [0, 0, 1, 0, 1, 2] {
            let value = values.get_or_try_make(generation, || {
                made += 1;
                Ok::<_, ()>(generation * 10)
            });
            assert_eq!(value, Ok(generation * 10));
        }
        assert_eq!(made, 3);
        assert_eq!(values.get(3), None);
        assert_eq!(values.get(2), Some(20));
    }

    #[test]
    fn a_failed_make_leaves_nothing_and_the_next_use_makes_again() {
        let values = ByGeneration::<u64>::new();
        assert_eq!(values.get_or_try_make(0, || Err("no threads")), Err("no threads"));
        assert_eq!(values.get(0), None);
        assert_eq!(values.get_or_try_make(0, || Ok::<_, &str>(7)), Ok(7));
    }

    /// A thread of the parent that held its generation's lock at the fork holds it for ever in
    /// the child: the child's generation must not need it.
    #[test]
    fn a_lock_held_for_ever_by_another_generation_blocks_no_other() {
        let values = ByGeneration::<u64>::new();
        values.replace(0, 1);
        std::mem::forget(values.slot(0).write());
        for generation in 1..GENERATION_SLOTS as u64 {
            assert_eq!(
                values.get_or_try_make(generation, || Ok::<_, ()>(generation)),
                Ok(generation)
            );
            assert_eq!(values.get(generation), Some(generation));
        }
    }

    #[test]
    fn another_generations_value_is_forgotten_never_dropped() {
        let drops = Arc::new(AtomicUsize::new(0));
        let values = ByGeneration::new();
        let counted = || Counted(drops.clone());
        // Generation 0's value, then one of the generation that shares its slot.
        values.replace(0, counted());
        let shared = GENERATION_SLOTS as u64;
        assert!(values.get_or_try_make(shared, || Ok::<_, ()>(counted())).is_ok());
        assert_eq!(drops.load(Ordering::SeqCst), 1, "only the clone handed out was dropped");
        assert!(values.replace(shared, counted()).is_some(), "its own generation's comes back");
        drop(values);
        // This process is generation 0: the slot holding generation 8's value forgets it.
        assert_eq!(drops.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_fork_local_is_its_makers_and_a_childs_is_made_on_use() {
        let local = ForkLocal::new(5u64);
        assert_eq!(local.get(|| Ok::<_, ()>(6)), Ok(5));
        assert_eq!(local.made_here(), Some(5));
        assert_eq!(local.children.get_or_try_make(local.made_in + 1, || Ok::<_, ()>(6)), Ok(6));
        assert_eq!(local.get(|| Ok::<_, ()>(7)), Ok(5), "the maker's own is unchanged");
    }
}
