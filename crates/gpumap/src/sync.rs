//! Locks without poisoning, over the standard library's: the `Mutex`, `Condvar` and `RwLock`
//! every part of gpumap and its Python bindings uses.
//!
//! Why not `parking_lot`'s (docs/decisions/0044): a contended `parking_lot` lock parks its
//! thread in one table shared by the whole process, each of whose buckets has a lock of its own
//! that a parking or waking thread holds for an instant. A fork at that instant (a DataLoader
//! starting its workers while a thread of the parent waits for a read) leaves the bucket locked
//! for ever in the child, and the child's first contended lock that hashes to it waits for
//! ever: locks that the child made itself, that no parent thread ever held. The standard
//! library's locks on Linux wait on their own word (a futex), so only a lock that a parent
//! thread held at the fork can be held in the child, which the per-process state
//! ([`per_process`](crate::per_process)) keeps apart.
//!
//! A lock whose holder panicked is taken as it is, as `parking_lot`'s are: every structure
//! behind these locks is kept consistent at each step, and a panic is already reported where
//! it happened.

use std::ops::{Deref, DerefMut};
use std::sync::{PoisonError, TryLockError};
use std::time::{Duration, Instant};

/// A mutual-exclusion lock; [`lock`](Self::lock) never fails.
#[derive(Default)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

/// The hold of a [`Mutex`]: unlocked when dropped.
pub struct MutexGuard<'a, T: ?Sized> {
    mutex: &'a Mutex<T>,
    /// `None` only inside [`Condvar`]'s waits and [`MutexGuard::unlocked`], which put it back
    /// before they return.
    held: Option<std::sync::MutexGuard<'a, T>>,
}

impl<T> Mutex<T> {
    /// A lock holding `value`.
    pub const fn new(value: T) -> Mutex<T> {
        Mutex(std::sync::Mutex::new(value))
    }

    /// The value, the lock gone.
    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Waits for the lock and holds it until the guard is dropped.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        let held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        MutexGuard { mutex: self, held: Some(held) }
    }

    /// The lock if it is free now, without waiting.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let held = match self.0.try_lock() {
            Ok(held) => held,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(MutexGuard { mutex: self, held: Some(held) })
    }

    /// The value, through an exclusive borrow: no locking needed.
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.try_lock() {
            Some(held) => f.debug_tuple("Mutex").field(&&*held).finish(),
            None => f.write_str("Mutex(<locked>)"),
        }
    }
}

impl<'a, T: ?Sized> MutexGuard<'a, T> {
    /// Runs `work` with the lock released, and takes it again before returning.
    pub fn unlocked<R>(guard: &mut Self, work: impl FnOnce() -> R) -> R {
        drop(guard.held.take());
        let result = work();
        guard.held = Some(guard.mutex.0.lock().unwrap_or_else(PoisonError::into_inner));
        result
    }

    fn take(&mut self) -> std::sync::MutexGuard<'a, T> {
        match self.held.take() {
            Some(held) => held,
            // Every path that takes the hold puts it back before anyone can see the guard.
            None => unreachable!("a MutexGuard without its hold"),
        }
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        match &self.held {
            Some(held) => held,
            None => unreachable!("a MutexGuard without its hold"),
        }
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match &mut self.held {
            Some(held) => held,
            None => unreachable!("a MutexGuard without its hold"),
        }
    }
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: ?Sized + std::fmt::Display> std::fmt::Display for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// Whether a timed wait on a [`Condvar`] ran out its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// True when the wait ended because its time ran out, not a notification.
    pub fn timed_out(self) -> bool {
        self.0
    }
}

/// A condition variable over [`Mutex`]: waits take the guard by `&mut`, as `parking_lot`'s do.
#[derive(Default, Debug)]
pub struct Condvar(std::sync::Condvar);

impl Condvar {
    /// A condition variable no one waits on.
    pub const fn new() -> Condvar {
        Condvar(std::sync::Condvar::new())
    }

    /// Releases the lock, waits for a notification (or a spurious wake-up), and takes the
    /// lock again.
    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        let held = guard.take();
        guard.held = Some(self.0.wait(held).unwrap_or_else(PoisonError::into_inner));
    }

    /// [`wait`](Self::wait), for at most `timeout`.
    pub fn wait_for<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        timeout: Duration,
    ) -> WaitTimeoutResult {
        let held = guard.take();
        let (held, result) =
            self.0.wait_timeout(held, timeout).unwrap_or_else(PoisonError::into_inner);
        guard.held = Some(held);
        WaitTimeoutResult(result.timed_out())
    }

    /// [`wait`](Self::wait), until `deadline` at the latest.
    pub fn wait_until<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        deadline: Instant,
    ) -> WaitTimeoutResult {
        self.wait_for(guard, deadline.saturating_duration_since(Instant::now()))
    }

    /// Wakes one waiting thread, if any.
    pub fn notify_one(&self) {
        self.0.notify_one();
    }

    /// Wakes every waiting thread.
    pub fn notify_all(&self) {
        self.0.notify_all();
    }
}

/// A reader-writer lock; [`read`](Self::read) and [`write`](Self::write) never fail.
#[derive(Default, Debug)]
pub struct RwLock<T: ?Sized>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    /// A lock holding `value`.
    pub const fn new(value: T) -> RwLock<T> {
        RwLock(std::sync::RwLock::new(value))
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Shared access, once no writer holds the lock.
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Exclusive access, once no one else holds the lock.
    pub fn write(&self) -> std::sync::RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value, through an exclusive borrow: no locking needed.
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_lock_whose_holder_panicked_is_taken_as_it_is() {
        let shared = Arc::new(Mutex::new(1));
        let other = shared.clone();
        let _ = std::thread::spawn(move || {
            let mut held = other.lock();
            *held = 2;
            panic!("while holding the lock");
        })
        .join();
        assert_eq!(*shared.lock(), 2);
        assert_eq!(*shared.try_lock().expect("free"), 2);
    }

    #[test]
    fn try_lock_refuses_a_held_lock_and_unlocked_releases_it_for_its_work() {
        let lock = Mutex::new(0);
        let mut held = lock.lock();
        assert!(lock.try_lock().is_none());
        MutexGuard::unlocked(&mut held, || *lock.try_lock().expect("released") = 5);
        assert_eq!(*held, 5);
        assert!(lock.try_lock().is_none(), "taken again");
    }

    #[test]
    fn a_wait_ends_with_a_notification_or_its_time() {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let other = pair.clone();
        let notifier = std::thread::spawn(move || {
            *other.0.lock() = true;
            other.1.notify_all();
        });
        let mut ready = pair.0.lock();
        while !*ready {
            pair.1.wait(&mut ready);
        }
        drop(ready);
        notifier.join().unwrap();
        let mut held = pair.0.lock();
        let start = Instant::now();
        assert!(pair.1.wait_for(&mut held, Duration::from_millis(20)).timed_out());
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert!(pair.1.wait_until(&mut held, Instant::now()).timed_out(), "a deadline passed");
        *held = false; // the guard holds the lock again after each wait
    }

    #[test]
    fn rwlock_readers_share_and_writers_exclude() {
        let lock = RwLock::new(3);
        {
            let (a, b) = (lock.read(), lock.read());
            assert_eq!(*a + *b, 6);
        }
        *lock.write() += 1;
        assert_eq!(*lock.read(), 4);
    }
}
