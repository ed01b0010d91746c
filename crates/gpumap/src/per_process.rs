//! Values made again in a forked child: [`ForkLocal`] (one object's) and a process-wide one.
//!
//! A child forked from a process that made such a value (the I/O pool, the remote runtime, a
//! map's cache) inherits the value but none of the threads that work on it: work handed to it
//! would wait for ever, and state those threads had half changed (an extent being read, a
//! lock held) stays so. The value is therefore kept with the fork generation it was made in
//! ([`fork_generation`]), and a child makes its own. The parent's is never dropped in a
//! child: dropping it would run the parent's clean-up (a write-back of what the parent had
//! not yet written) from a copy of the parent taken at an arbitrary moment.
#![forbid(unsafe_code)]

use std::sync::OnceLock;

use parking_lot::Mutex;

/// How many forks lie between the first process and this one: 0 in a process that was not
/// forked from one using gpumap, one more in each forked child. A value made in another
/// generation was made by a parent.
pub fn fork_generation() -> u64 {
    crate::sys::posix::fork_generation()
}

/// A process-wide value of type `T` (cheap to clone: an `Arc`), made on first use in each
/// process. The first one made lives in a `OnceLock`, read without a lock; a forked child's
/// goes behind a mutex (a grandchild forked while its parent's thread held that mutex for its
/// few instructions would wait on it; no fork is that unlucky in practice). A value made in a
/// parent is never dropped in a child: its threads are not there to join.
pub(crate) struct PerProcess<T> {
    first: OnceLock<(u64, T)>,
    later: Mutex<Option<(u64, T)>>,
}

impl<T: Clone> PerProcess<T> {
    pub(crate) const fn new() -> Self {
        PerProcess { first: OnceLock::new(), later: Mutex::new(None) }
    }

    /// This process's value, if it was made.
    #[cfg(feature = "remote")]
    pub(crate) fn get(&self) -> Option<T> {
        let generation = fork_generation();
        match self.first.get() {
            Some((made_in, value)) if *made_in == generation => Some(value.clone()),
            Some(_) => {
                self.later.lock().as_ref().filter(|(g, _)| *g == generation).map(|(_, v)| v.clone())
            }
            None => None,
        }
    }

    /// This process's value, made by `make` where there is none yet.
    pub(crate) fn get_or_try_make<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let generation = fork_generation();
        match self.first.get() {
            Some((made_in, value)) if *made_in == generation => return Ok(value.clone()),
            Some(_) => {}
            None => {
                let value = make()?;
                // Two first calls at once: one value is kept, the other dropped unused.
                let (_, kept) = self.first.get_or_init(|| (generation, value));
                return Ok(kept.clone());
            }
        }
        in_child(&self.later, generation, make)
    }
}

/// The value `slot` holds for `generation`, a forked child's, made by `make` where it holds
/// none yet; one of an earlier generation (a parent's, inherited) is forgotten, not dropped.
fn in_child<T: Clone, E>(
    slot: &Mutex<Option<(u64, T)>>,
    generation: u64,
    make: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let mut slot = slot.lock();
    if let Some((made_in, value)) = slot.as_ref() {
        if *made_in == generation {
            return Ok(value.clone());
        }
    }
    let value = make()?;
    if let Some(parents) = slot.replace((generation, value.clone())) {
        std::mem::forget(parents);
    }
    Ok(value)
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
    child: Mutex<Option<(u64, T)>>,
}

impl<T: Clone> ForkLocal<T> {
    /// `value`, made in this process.
    pub fn new(value: T) -> Self {
        ForkLocal { made_in: fork_generation(), value: Some(value), child: Mutex::new(None) }
    }

    /// This process's value: the one made at `new`, or in a forked child its own, made by
    /// `make` on first use (and made again in a grandchild).
    pub fn get<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let generation = fork_generation();
        match &self.value {
            Some(value) if generation == self.made_in => Ok(value.clone()),
            _ => in_child(&self.child, generation, make),
        }
    }

    /// This process's value if it has one: the one made at `new`, or a forked child's once
    /// made; `None` in a child that has not used the object.
    pub fn made_here(&self) -> Option<T> {
        let generation = fork_generation();
        match &self.value {
            Some(value) if generation == self.made_in => Some(value.clone()),
            _ => {
                self.child.lock().as_ref().filter(|(g, _)| *g == generation).map(|(_, v)| v.clone())
            }
        }
    }
}

impl<T> Drop for ForkLocal<T> {
    fn drop(&mut self) {
        let generation = fork_generation();
        if generation != self.made_in {
            std::mem::forget(self.value.take());
        }
        if let Some((made_in, value)) = self.child.get_mut().take() {
            if made_in != generation {
                std::mem::forget(value);
            }
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for ForkLocal<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForkLocal").field("value", &self.value).finish_non_exhaustive()
    }
}
