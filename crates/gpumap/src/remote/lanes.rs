//! The lanes a large remote read's requests are shared among: threads of their own, each with a
//! single-threaded runtime and stores (and so connections) of its own.
//!
//! On the library's shared runtime a body is received by whichever worker drives its
//! connection, then copied into place by the thread that asked for it: every byte crosses
//! cores cold, and every piece is a wake-up. A lane receives its bodies and copies them where
//! they belong on one thread, while the bytes are still in that core's cache
//! (docs/decisions/0025-remote-read-lanes.md).
//!
//! A connection belongs to the runtime it was opened on, so a store used by a lane is that
//! lane's own, made from the file's [`StoreRecipe`](super::client::StoreRecipe) and kept on
//! the lane's [`StoreShelf`] while its owner lives; a lane's runtime runs only while the lane
//! works, so when an owner goes every lane is asked to drop its stores and let their
//! connections close.
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::sync::Arc;

use object_store::ObjectStore;

use crate::error::{Error, Result};
use crate::io::pool::{started, wait_apart};
use crate::per_process::PerProcess;
use crate::remote::stores::{self, StoreOwner, StoreShelf};

/// Threads one read's requests are shared among, at most (and no more than the CPUs).
pub const MAX_LANES: usize = 16;

/// Scheduler rounds a lane gives its runtime after dropping stores, so that the tasks of
/// their connections see their clients gone and close their sockets.
const CLOSING_ROUNDS: usize = 4;

/// Asks every lane to drop the stores whose owners are gone (a [`StoreOwner`]'s drop).
fn forget_dead_on_every_lane() {
    if let Some(pool) = LANES.get() {
        pool.spawn_broadcast(|_| {
            let taken = LANE_STATE.with(|cell| cell.borrow_mut().take());
            if let Some(mut state) = taken {
                state.forget_dead();
                LANE_STATE.with(|cell| *cell.borrow_mut() = Some(state));
            }
        });
    }
}

/// What one lane thread keeps between reads.
struct LaneState {
    runtime: tokio::runtime::Runtime,
    stores: StoreShelf,
}

impl LaneState {
    fn new() -> Result<LaneState> {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
                Error::Unavailable { what: "a remote read lane's runtime", reason: e.to_string() }
            })?;
        Ok(LaneState { runtime, stores: StoreShelf::default() })
    }

    /// Drops the stores whose owners are gone, then lets their connections close.
    fn forget_dead(&mut self) {
        if self.stores.forget_dead() {
            self.let_connections_close();
        }
    }

    fn let_connections_close(&self) {
        self.runtime.block_on(async {
            for _ in 0..CLOSING_ROUNDS {
                tokio::task::yield_now().await;
            }
        });
    }
}

thread_local! {
    /// This thread's lane state, made at its first read (lane threads only).
    static LANE_STATE: RefCell<Option<LaneState>> = const { RefCell::new(None) };
}

/// Runs `work` on the calling lane thread's state, made on first use. The state is taken out
/// for the call, so a nested call (none is made) would find none and make a second.
fn with_lane_state<T>(work: impl FnOnce(&mut LaneState) -> T) -> Result<T> {
    let taken = LANE_STATE.with(|cell| cell.borrow_mut().take());
    let mut state = match taken {
        Some(state) => state,
        None => LaneState::new()?,
    };
    let out = work(&mut state);
    LANE_STATE.with(|cell| *cell.borrow_mut() = Some(state));
    Ok(out)
}

/// The lanes' threads, made at first use (in a forked child, its own): one per core, to
/// [`MAX_LANES`], as a read is shared among that many ([`lane_count`]).
static LANES: PerProcess<Arc<rayon::ThreadPool>> = PerProcess::new();

/// How many lanes there are: a read uses at most this many, and each lane's store keeps
/// idle connections for its share of a file's requests in flight.
pub(crate) fn lane_count() -> usize {
    MAX_LANES.min(crate::tuning_facts::cpus()).max(1)
}

fn lanes() -> Result<Arc<rayon::ThreadPool>> {
    LANES.get_or_try_make(|| {
        stores::when_an_owner_goes("lanes", forget_dead_on_every_lane);
        let lanes = crate::per_process::build_rayon_pool(
            rayon::ThreadPoolBuilder::new()
                .num_threads(lane_count())
                .thread_name(|i| format!("gpumap-lane-{i}")),
        )
        .map_err(|e| Error::Unavailable { what: "the remote read lanes", reason: e.to_string() })?;
        // Started before use, as the I/O pool's are: see `started`.
        started(lanes).map(Arc::new)
    })
}

/// Turns a lane's runtime gives its other tasks after a part's work (see [`Lane::block_on`]).
const SETTLE_YIELDS: usize = 4;

/// One lane at work: its runtime, and the stores it keeps.
pub(crate) struct Lane<'a> {
    state: &'a mut LaneState,
}

impl Lane<'_> {
    /// This lane's store for `owner`, made by `make` the first time (and again after it was
    /// dropped for room).
    pub(crate) fn store(
        &mut self,
        owner: &StoreOwner,
        make: impl FnOnce() -> Result<Arc<dyn ObjectStore>>,
    ) -> Result<Arc<dyn ObjectStore>> {
        let (store, dropped) = self.state.stores.store(owner, make)?;
        if dropped {
            self.state.let_connections_close();
        }
        Ok(store)
    }

    /// Runs `work` to completion on this lane's runtime.
    pub(crate) fn block_on<T>(&self, work: impl std::future::Future<Output = T>) -> T {
        self.state.runtime.block_on(async {
            let out = work.await;
            // This runtime runs only while a lane works: let the connection tasks that the
            // work's end woke (connections its pool let go, past its idle bound) close their
            // sockets now, not at the lane's next read.
            for _ in 0..SETTLE_YIELDS {
                tokio::task::yield_now().await;
            }
            out
        })
    }
}

/// Runs `work(part, index, lane)` for every part, each on a lane thread, and returns once
/// every part is done (so nothing still writes into what the parts borrow): the first error
/// in part order, else `Ok`. Parts beyond the lanes free at the moment wait their turn.
///
/// Called from a worker of another rayon pool (the I/O pool, running a `pread`), it waits on a
/// thread of its own ([`wait_apart`]).
pub(crate) fn run<T, F>(parts: Vec<T>, work: F) -> Result<()>
where
    T: Send,
    F: Fn(T, usize, &mut Lane<'_>) -> Result<()> + Sync,
{
    let pool = lanes()?;
    wait_apart(&pool, || run_on(&pool, parts, &work))
}

/// [`run`]'s parts in one `pool.scope`, which returns once every part is done.
fn run_on<T, F>(pool: &rayon::ThreadPool, parts: Vec<T>, work: &F) -> Result<()>
where
    T: Send,
    F: Fn(T, usize, &mut Lane<'_>) -> Result<()> + Sync,
{
    let mut outcomes: Vec<Option<Result<()>>> = parts.iter().map(|_| None).collect();
    pool.scope(|scope| {
        for (index, (part, outcome)) in parts.into_iter().zip(outcomes.iter_mut()).enumerate() {
            scope.spawn(move |_| {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    with_lane_state(|state| work(part, index, &mut Lane { state }))
                }));
                *outcome = Some(match ran {
                    Ok(done) => done.and_then(|worked| worked),
                    Err(_) => Err(Error::TaskPanicked("a remote read lane panicked".into())),
                });
            });
        }
    });
    outcomes.into_iter().try_for_each(|outcome| {
        outcome.unwrap_or_else(|| Err(Error::TaskPanicked("a remote read lane never ran".into())))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn memory_store() -> Result<Arc<dyn ObjectStore>> {
        Ok(Arc::new(InMemory::new()))
    }

    #[test]
    fn every_part_runs_once_and_the_first_error_in_part_order_is_returned() {
        let seen = crate::sync::Mutex::new(Vec::new());
        run((0..40).collect(), |part: usize, index, _lane| {
            assert_eq!(part, index);
            seen.lock().push(part);
            Ok(())
        })
        .unwrap();
        let mut seen = seen.into_inner();
        seen.sort_unstable();
        assert_eq!(seen, (0..40).collect::<Vec<_>>());

        let failed = run((0..8).collect(), |part: usize, _, _| match part {
            3 => Err(Error::InvalidArgument("three".into())),
            5 => Err(Error::InvalidArgument("five".into())),
            _ => Ok(()),
        });
        assert!(matches!(failed, Err(Error::InvalidArgument(m)) if m == "three"));
    }

    #[test]
    fn a_panicking_part_is_an_error_and_the_others_finish() {
        let done = std::sync::atomic::AtomicUsize::new(0);
        let outcome = run((0..6).collect(), |part: usize, _, _| {
            if part == 2 {
                panic!("lane test panic");
            }
            done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        assert!(matches!(outcome, Err(Error::TaskPanicked(_))));
        assert_eq!(done.into_inner(), 5);
        // The lanes still work afterwards.
        run(vec![()], |(), _, lane| lane.block_on(async { Ok(()) })).unwrap();
    }

    #[test]
    fn an_owners_drop_asks_every_lane_thread_to_forget_it() {
        let owner = StoreOwner::default();
        let store = crate::sync::Mutex::new(None);
        run(vec![()], |(), _, lane| {
            *store.lock() = Some(Arc::downgrade(&lane.store(&owner, memory_store)?));
            Ok(())
        })
        .unwrap();
        let weak = store.into_inner().unwrap();
        drop(owner);
        // The owner's drop asks every lane to forget it; they do so as soon as they are free.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while weak.upgrade().is_some() {
            assert!(std::time::Instant::now() < deadline, "the store outlived its owner");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
