//! The threads small remote reads run on: each drives a single-threaded runtime for its whole
//! life, with stores (and so connections) of its own, so that a request, the I/O of its
//! connection and every wake-up between the two stay on one thread.
//!
//! On the library's shared multi-threaded runtime a request and its connection are tasks that
//! any worker may run, and each hand-over between them can wake another thread: a request of
//! a few hundred bytes then costs more in scheduling than in HTTP
//! (docs/decisions/0030-small-remote-reads-on-loops.md).
//!
//! Reads of a request of hundreds of KiB or more go to loops of their own ([`LoopSet::Large`]),
//! more of them than the small reads get: receiving such a body keeps a loop's thread busy,
//! and the small reads' round trips gain nothing from more threads than they have
//! (docs/decisions/0033-large-remote-reads-on-loops-of-their-own.md).
//!
//! A store's reads are placed on its loops in turn ([`Queues`]). Each loop has its share of
//! the store's requests in flight, and runs that many workers for it at most: a worker takes
//! the store's reads queued on that loop one after another, then those still queued on the
//! store's other loops, and ends when there are none. So a read queued while the loop's
//! workers are busy costs its caller a push, not a wake-up of another thread; a loop never
//! needs more connections than its share; and a loop whose thread is slow (its requests slow,
//! or the thread descheduled) does not keep the reads placed on it waiting while the others
//! idle.
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::sync::Mutex;
use futures_util::FutureExt;
use object_store::ObjectStore;

use crate::error::{Error, Result};
use crate::per_process::PerProcess;
use crate::remote::stores::{self, StoreOwner, StoreShelf};

/// The request loops of a process in one [`LoopSet`]: one thread each ([`LoopSet::count`]).
pub(crate) struct Loops {
    handles: Vec<tokio::runtime::Handle>,
    /// Dropped (so closed) with the loops: each loop's thread ends when its sender goes.
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

thread_local! {
    /// The stores of the loop this thread runs (loop threads only).
    static SHELF: RefCell<StoreShelf> = RefCell::new(StoreShelf::default());
}

/// The loops of this process, made at first use (in a forked child, its own): the small
/// reads' and the large ones'.
static LOOPS: [PerProcess<Arc<Loops>>; 2] = [PerProcess::new(), PerProcess::new()];

/// Request loops a process has for small reads at most (and no more than the CPUs).
const MAX_SMALL_LOOPS: usize = 8;

/// Request loops a process has for large reads at most (and no more than the CPUs).
const MAX_LARGE_LOOPS: usize = 16;

/// The least a read is to go to the large reads' loops.
pub(crate) const LARGE_READ: usize = 256 << 10;

/// Which of a process's request loops a read goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoopSet {
    /// Reads of less than [`LARGE_READ`]: rows, extents, small ranges.
    Small,
    /// Reads of [`LARGE_READ`] or more, whose bodies keep a thread busy.
    Large,
}

impl LoopSet {
    /// The set a read of `len` bytes goes to.
    pub(crate) fn for_len(len: usize) -> LoopSet {
        if len >= LARGE_READ {
            LoopSet::Large
        } else {
            LoopSet::Small
        }
    }

    /// How many loops the set has.
    pub(crate) fn count(self) -> usize {
        let most = match self {
            LoopSet::Small => MAX_SMALL_LOOPS,
            LoopSet::Large => MAX_LARGE_LOOPS,
        };
        most.min(crate::tuning_facts::cpus()).max(1)
    }

    /// What its threads are called, before the loop's index.
    fn thread_name(self) -> &'static str {
        match self {
            LoopSet::Small => "gpumap-loop-",
            LoopSet::Large => "gpumap-large-loop-",
        }
    }

    /// The set's loops in this process.
    fn loops(self) -> Result<Arc<Loops>> {
        LOOPS[self as usize].get_or_try_make(|| {
            stores::when_an_owner_goes("loops", forget_dead_on_every_loop);
            Loops::start(self).map(Arc::new)
        })
    }
}

/// Asks every loop to drop the stores whose owners are gone (a [`StoreOwner`]'s drop); a loop
/// runs always, so their connections close as soon as it drops them.
fn forget_dead_on_every_loop() {
    for loops in LOOPS.iter().filter_map(PerProcess::get) {
        for handle in &loops.handles {
            handle.spawn(async {
                SHELF.with(|shelf| shelf.borrow_mut().forget_dead());
            });
        }
    }
}

/// A read placed on a loop: given the loop's store of the object (or why there is none), the
/// work to run there.
pub(crate) type Job = Box<
    dyn FnOnce(Result<Arc<dyn ObjectStore>>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send,
>;

/// How a loop makes its own store of the objects a [`Queues`] serves, and who owns it.
#[derive(Clone)]
pub(crate) struct StoreSource {
    pub(crate) owner: Arc<StoreOwner>,
    pub(crate) make: Arc<dyn Fn() -> Result<Arc<dyn ObjectStore>> + Send + Sync>,
}

/// The queues of one store's reads on the loops of one set: one per loop it uses.
pub(crate) struct Queues {
    set: LoopSet,
    queues: Arc<[LoopQueue]>,
    /// The queue the next read goes to.
    next: AtomicUsize,
    source: StoreSource,
}

/// One store's reads waiting on one loop, and its workers there.
struct LoopQueue {
    /// The workers it may have at once: the loop's share of the store's requests in flight.
    share: usize,
    waiting: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    jobs: VecDeque<Job>,
    workers: usize,
}

impl Queues {
    /// Queues on the loops of `set` for a store with `in_flight` requests at most, shared out
    /// among the loops (as many as there are, and no more than `in_flight`).
    pub(crate) fn new(set: LoopSet, in_flight: usize, source: StoreSource) -> Queues {
        let used = in_flight.clamp(1, set.count());
        let queues = (0..used)
            .map(|at| LoopQueue { share: share_of(in_flight, used, at), waiting: Mutex::default() })
            .collect();
        Queues { set, queues, next: AtomicUsize::new(0), source }
    }

    /// Runs `job` on the next loop in turn, after the reads queued there before it. Where the
    /// loops cannot be started, it runs at once with that error in place of a store (its
    /// future must then finish without waiting).
    pub(crate) fn submit(&self, job: Job) {
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.queues.len();
        let queue = &self.queues[at];
        let start_worker = {
            let mut waiting = queue.waiting.lock();
            waiting.jobs.push_back(job);
            let start = waiting.workers < queue.share;
            waiting.workers += usize::from(start);
            start
        };
        if !start_worker {
            return;
        }
        match self.set.loops() {
            Ok(loops) => {
                let worker = Worker { queues: Arc::clone(&self.queues), at };
                loops.handles[at].spawn(work(worker, self.source.clone()));
            }
            Err(e) => {
                let jobs = {
                    let mut waiting = queue.waiting.lock();
                    waiting.workers -= 1;
                    std::mem::take(&mut waiting.jobs)
                };
                for job in jobs {
                    let why = Error::Unavailable {
                        what: "the remote request loops",
                        reason: e.to_string(),
                    };
                    if job(Err(why)).now_or_never().is_none() {
                        tracing::warn!(
                            "a remote read failed without a loop did not finish at once"
                        );
                    }
                }
            }
        }
    }
}

/// Which queue of a store a worker belongs to.
struct Worker {
    queues: Arc<[LoopQueue]>,
    at: usize,
}

impl Worker {
    /// The next read for this worker: the first waiting on its own loop, else the first
    /// waiting on another (in turn from the next loop on), else none, and then the worker has
    /// left its queue. Only its own queue's emptiness is decided under that queue's lock:
    /// reads queued on another loop keep one of that loop's workers, so they are never left
    /// without one.
    fn next_job(&self) -> Option<Job> {
        let own = &self.queues[self.at];
        if let Some(job) = own.waiting.lock().jobs.pop_front() {
            return Some(job);
        }
        let count = self.queues.len();
        for other in (1..count).map(|step| (self.at + step) % count) {
            if let Some(job) = self.queues[other].waiting.lock().jobs.pop_front() {
                return Some(job);
            }
        }
        let mut waiting = own.waiting.lock();
        let job = waiting.jobs.pop_front();
        if job.is_none() {
            waiting.workers -= 1;
        }
        job
    }
}

/// A worker: runs reads one after another (its own loop's first) and ends when there are none
/// left.
async fn work(worker: Worker, source: StoreSource) {
    let mut slot = WorkerSlot { worker: Some(worker), source: source.clone() };
    loop {
        let Some(worker) = slot.worker.as_ref() else { return };
        let Some(job) = worker.next_job() else {
            slot.worker = None;
            return;
        };
        let store = SHELF.with(|shelf| {
            shelf.borrow_mut().store(&source.owner, || (source.make)()).map(|(store, _)| store)
        });
        job(store).await;
    }
}

/// A worker's place in its queue: given back if the worker ends without emptying the queue
/// (a read panicked, or the loop went), and another started where reads still wait.
struct WorkerSlot {
    worker: Option<Worker>,
    source: StoreSource,
}

impl Drop for WorkerSlot {
    fn drop(&mut self) {
        let Some(worker) = self.worker.take() else { return };
        let queue = &worker.queues[worker.at];
        let mut waiting = queue.waiting.lock();
        if waiting.jobs.is_empty() {
            waiting.workers -= 1;
            return;
        }
        drop(waiting);
        // The slot passes to a new worker on the same loop (this runs on it).
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(work(worker, self.source.clone()));
        } else {
            queue.waiting.lock().workers -= 1;
        }
    }
}

impl std::fmt::Debug for Queues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shares: Vec<usize> = self.queues.iter().map(|q| q.share).collect();
        f.debug_struct("Queues")
            .field("set", &self.set)
            .field("shares", &shares)
            .finish_non_exhaustive()
    }
}

/// Loop `at`'s share of `in_flight` requests shared among `used` loops: together exactly
/// `in_flight`, each within one of the others.
fn share_of(in_flight: usize, used: usize, at: usize) -> usize {
    let used = used.max(1);
    in_flight / used + usize::from(at < in_flight % used)
}

impl Loops {
    /// Starts the loops of `set`, each on a thread of its own.
    fn start(set: LoopSet) -> Result<Loops> {
        let count = set.count();
        let unavailable =
            |reason: String| Error::Unavailable { what: "the remote request loops", reason };
        let mut handles = Vec::with_capacity(count);
        let mut stops = Vec::with_capacity(count);
        for index in 0..count {
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let (started, handle) = std::sync::mpsc::sync_channel(1);
            let thread = std::thread::Builder::new().name(format!("{}{index}", set.thread_name()));
            crate::per_process::spawn_apart_from_fork(|| {
                thread.spawn(move || {
                    let runtime =
                        tokio::runtime::Builder::new_current_thread().enable_all().build();
                    let runtime = match runtime {
                        Ok(runtime) => runtime,
                        Err(e) => {
                            let _ = started.send(Err(e.to_string()));
                            return;
                        }
                    };
                    let _ = started.send(Ok(runtime.handle().clone()));
                    // Runs what is placed on it until its `Loops` goes (a duplicate made by a
                    // racing first use, the only one ever dropped).
                    runtime.block_on(async {
                        let _ = stopped.await;
                    });
                    SHELF.with(|shelf| shelf.borrow_mut().clear());
                })
            })
            .map_err(|e| unavailable(e.to_string()))?;
            let handle = handle
                .recv()
                .map_err(|_| unavailable("a loop thread ended before it started".to_owned()))?
                .map_err(unavailable)?;
            handles.push(handle);
            stops.push(stop);
        }
        Ok(Loops { handles, _stops: stops })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    fn memory_source() -> StoreSource {
        StoreSource {
            owner: Arc::new(StoreOwner::default()),
            make: Arc::new(|| Ok(Arc::new(InMemory::new()) as Arc<dyn ObjectStore>)),
        }
    }

    fn job<F>(work: impl FnOnce(Result<Arc<dyn ObjectStore>>) -> F + Send + 'static) -> Job
    where
        F: Future<Output = ()> + Send + 'static,
    {
        Box::new(move |store| Box::pin(work(store)))
    }

    #[test]
    fn shares_add_up_to_the_bound_and_differ_by_one_at_most() {
        for in_flight in 1..70 {
            for used in 1..=in_flight.min(16) {
                let shares: Vec<usize> =
                    (0..used).map(|at| share_of(in_flight, used, at)).collect();
                assert_eq!(shares.iter().sum::<usize>(), in_flight);
                assert!(shares.iter().all(|&s| s >= 1));
                assert!(shares.iter().max().unwrap() - shares.iter().min().unwrap() <= 1);
            }
        }
    }

    /// Held by the tests whose reads block a loop's thread, or that count what each loop
    /// runs: the loops are the process's, shared by the tests running at once, and a thread
    /// blocked by one test would make another's reads run elsewhere.
    static BLOCKING_TESTS: crate::sync::Mutex<()> = crate::sync::Mutex::new(());

    /// `count` reads on `queues` that each hold their loop's thread until all of them run,
    /// which they can only do on `count` different loops; the threads' names.
    fn one_read_on_each_loop(queues: &Queues, count: usize) -> Vec<String> {
        let all_running = Arc::new(std::sync::Barrier::new(count));
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..count {
            let (tx, all_running) = (tx.clone(), all_running.clone());
            queues.submit(job(move |_| async move {
                all_running.wait();
                let _ = tx.send(std::thread::current().name().map(str::to_owned));
            }));
        }
        drop(tx);
        rx.iter().map(|name| name.expect("a loop thread has a name")).collect()
    }

    #[test]
    fn reads_go_to_every_loop_in_turn_and_each_loop_keeps_its_own_store() {
        let _alone = BLOCKING_TESTS.lock();
        let count = LoopSet::Small.count();
        let queues = Queues::new(LoopSet::Small, count, memory_source());
        let names: std::collections::HashSet<String> =
            one_read_on_each_loop(&queues, count).into_iter().collect();
        assert_eq!(names.len(), count, "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("gpumap-loop-")), "{names:?}");

        let queues = Queues::new(LoopSet::Small, 2 * count, memory_source());
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..4 * count {
            let tx = tx.clone();
            queues.submit(job(move |store| async move {
                let name = std::thread::current().name().map(str::to_owned);
                let _ = tx.send((name, store.map(|s| Arc::as_ptr(&s) as *const () as usize)));
            }));
        }
        drop(tx);
        let seen: Vec<_> = rx.iter().collect();
        assert_eq!(seen.len(), 4 * count);
        let mut by_thread = std::collections::HashMap::new();
        for (name, store) in seen {
            let name = name.expect("a loop thread has a name");
            assert!(name.starts_with("gpumap-loop-"), "{name}");
            // A loop's later reads of the store find the store its first one made.
            let store = store.unwrap();
            assert_eq!(*by_thread.entry(name).or_insert(store), store);
        }
    }

    #[test]
    fn large_reads_run_on_loops_of_their_own() {
        let _alone = BLOCKING_TESTS.lock();
        assert_eq!(LoopSet::for_len(LARGE_READ - 1), LoopSet::Small);
        assert_eq!(LoopSet::for_len(LARGE_READ), LoopSet::Large);
        assert!(LoopSet::Large.count() >= LoopSet::Small.count());
        let count = LoopSet::Large.count();
        let queues = Queues::new(LoopSet::Large, count, memory_source());
        let names: std::collections::HashSet<String> =
            one_read_on_each_loop(&queues, count).into_iter().collect();
        assert_eq!(names.len(), count, "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("gpumap-large-loop-")), "{names:?}");
    }

    #[test]
    fn reads_queued_behind_a_stalled_loop_run_on_the_others() {
        let _alone = BLOCKING_TESTS.lock();
        let count = LoopSet::Small.count();
        if count < 2 {
            return; // one loop: there is no other to take its reads
        }
        // A worker a loop. Read 0 stalls the thread that runs it (loop 0's, unless another
        // took it first) until the end; reads 1..count hold theirs until every read is queued,
        // so that read `count`, queued on loop 0, waits behind the stalled read or is free to
        // run on loop 0 when they finish.
        let queues = Queues::new(LoopSet::Small, count, memory_source());
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (stalled_on_tx, stalled_on) = std::sync::mpsc::channel();
        queues.submit(job(move |_| async move {
            let _ = stalled_on_tx.send(std::thread::current().name().map(str::to_owned));
            let _ = released.recv_timeout(Duration::from_secs(30));
        }));
        let all_queued = Arc::new(std::sync::Barrier::new(count));
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 1..count {
            let (tx, all_queued) = (tx.clone(), all_queued.clone());
            queues.submit(job(move |_| async move {
                all_queued.wait();
                let _ = tx.send(None);
            }));
        }
        queues.submit(job(move |_| async move {
            let _ = tx.send(std::thread::current().name().map(str::to_owned));
        }));
        all_queued.wait();
        let ran_on = (0..count)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)))
            .find_map(|got| got.expect("a read queued behind a stalled loop waited for it"));
        let stalled = stalled_on.recv_timeout(Duration::from_secs(10));
        let _ = release.send(());
        let ran_on = ran_on.expect("the last read ran on a loop thread with a name");
        let stalled = stalled.expect("the stalling read ran").expect("a loop thread has a name");
        assert_ne!(ran_on, stalled, "it ran on the stalled loop");
    }

    #[test]
    fn a_loop_runs_no_more_reads_of_a_store_at_once_than_its_share() {
        let _alone = BLOCKING_TESTS.lock();
        let count = LoopSet::Small.count();
        let in_flight = count + 1; // the first loop's share is 2, the others' 1
        let queues = Queues::new(LoopSet::Small, in_flight, memory_source());
        let running: Arc<Vec<AtomicUsize>> =
            Arc::new((0..count).map(|_| AtomicUsize::new(0)).collect());
        let most: Arc<Vec<AtomicUsize>> =
            Arc::new((0..count).map(|_| AtomicUsize::new(0)).collect());
        let (tx, rx) = std::sync::mpsc::channel();
        let reads = 8 * count;
        for _ in 0..reads {
            let (running, most, tx) = (running.clone(), most.clone(), tx.clone());
            queues.submit(job(move |_| async move {
                let name = std::thread::current().name().unwrap_or_default().to_owned();
                let at: usize = name.trim_start_matches("gpumap-loop-").parse().unwrap();
                let now = running[at].fetch_add(1, Ordering::SeqCst) + 1;
                most[at].fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                running[at].fetch_sub(1, Ordering::SeqCst);
                let _ = tx.send(());
            }));
        }
        drop(tx);
        assert_eq!(rx.iter().count(), reads);
        for at in 0..count {
            let share = share_of(in_flight, count, at);
            let seen = most[at].load(Ordering::SeqCst);
            assert!(seen >= 1 && seen <= share, "loop {at}: {seen} at once, share {share}");
        }
        assert_eq!(most[0].load(Ordering::SeqCst), 2, "the first loop used its share of two");
    }

    #[test]
    fn a_read_that_panics_leaves_the_reads_after_it_to_run() {
        let queues = Queues::new(LoopSet::Small, 1, memory_source()); // one loop, one worker
        let (tx, rx) = std::sync::mpsc::channel();
        let ran_on = Arc::new(AtomicBool::new(false));
        queues.submit(job(|_| async { panic!("loop test panic") }));
        for _ in 0..3 {
            let (tx, ran_on) = (tx.clone(), ran_on.clone());
            queues.submit(job(move |_| async move {
                ran_on.store(true, Ordering::SeqCst);
                let _ = tx.send(());
            }));
        }
        drop(tx);
        for _ in 0..3 {
            rx.recv_timeout(Duration::from_secs(10)).expect("a read after the panic never ran");
        }
        assert!(ran_on.load(Ordering::SeqCst));
        // The slot was given back: a later read runs too.
        let (tx, rx) = std::sync::mpsc::channel();
        queues.submit(job(move |_| async move {
            let _ = tx.send(());
        }));
        rx.recv_timeout(Duration::from_secs(10)).expect("the queue lost its worker");
    }

    #[test]
    fn an_owners_drop_asks_every_loop_of_both_sets_to_forget_its_stores() {
        let source = memory_source();
        let mut stores = Vec::new();
        let mut all_queues = Vec::new();
        for set in [LoopSet::Small, LoopSet::Large] {
            let count = set.count();
            let queues = Queues::new(set, count, source.clone());
            let (tx, rx) = std::sync::mpsc::channel();
            for _ in 0..count {
                let tx = tx.clone();
                queues.submit(job(move |store| async move {
                    let _ = tx.send(store.map(|s| Arc::downgrade(&s)));
                }));
            }
            drop(tx);
            let made: Vec<_> = rx.iter().map(Result::unwrap).collect();
            assert_eq!(made.len(), count, "{set:?}");
            stores.extend(made);
            all_queues.push(queues);
        }
        drop((all_queues, source));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while stores.iter().any(|weak| weak.upgrade().is_some()) {
            assert!(std::time::Instant::now() < deadline, "a store outlived its owner");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_store_that_cannot_be_made_reaches_the_read_as_its_error() {
        let source = StoreSource {
            owner: Arc::new(StoreOwner::default()),
            make: Arc::new(|| Err(Error::InvalidArgument("no store".into()))),
        };
        let queues = Queues::new(LoopSet::Small, 1, source);
        let (tx, rx) = std::sync::mpsc::channel();
        queues.submit(job(move |store| async move {
            let _ = tx.send(store.err().map(|e| e.to_string()));
        }));
        let got = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(got.is_some_and(|e| e.contains("no store")));
    }
}
