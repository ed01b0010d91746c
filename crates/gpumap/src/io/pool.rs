//! The persistent I/O thread pool, and [`IoFuture`], the handle to work running on it.
//!
//! Threads are created when a pool is built (or resized), never per call: a 4 KiB read must not
//! pay for a `clone(2)`. Work is split into tasks ([`crate::align::split_tasks`]) that run on the
//! pool's threads; a blocking call waits for its tasks, a `p*` call returns an [`IoFuture`].
//!
//! The pool is [rayon](https://docs.rs/rayon)'s: its scoped execution lets tasks borrow
//! disjoint `&mut` pieces of a caller's buffer on persistent threads with no `unsafe` here.
//!
//! Work started through an [`IoFuture`] can be cancelled ([`IoFuture::cancel`]): its flag is
//! the current thread's while the work runs, every task the work splits into checks it before
//! it starts, and tasks inherit it for the tasks they split into in turn.
//!
//! A future completed by the I/O layer itself (not by a pool job) may carry a helper: work the
//! waiting thread can run itself, if it has not started elsewhere, instead of sleeping until
//! another thread has run it and woken it (two hand-offs, which a small read would otherwise
//! wait longer for than for its I/O), or the end of work whose I/O is done and whose copy to
//! the GPU is already queued (a lone small read, `lone_reads`), which the future's own callers
//! complete. `.await` never runs I/O, since an executor's thread must not block on it; it may
//! wait for such a queued copy (microseconds).
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::sync::{Condvar, Mutex};
use rayon::prelude::*;

use crate::align::Task;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::per_process::{ByGeneration, PerProcess};
use crate::sys::posix::fork_generation;

/// A persistent pool of I/O threads. Cheap to share (`Arc`); resizable. A forked child that
/// uses a pool made before the fork (a file opened before it, as a `DataLoader`'s dataset is)
/// gets threads of its own, as many, on first use: it has none of its parent's.
pub struct IoPool {
    /// How many threads the last resize asked for: a forked child makes this many.
    nthreads: AtomicUsize,
    /// The threads of each fork generation (see [`ByGeneration`]).
    threads: ByGeneration<Arc<rayon::ThreadPool>>,
}

impl std::fmt::Debug for IoPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoPool").field("nthreads", &self.nthreads()).finish()
    }
}

/// A transfer's cancellation flag (set by [`IoFuture::cancel`]).
type CancelFlag = Arc<AtomicBool>;

thread_local! {
    /// The cancellation flag of the work this thread runs, if it runs work that can be
    /// cancelled: set for a future's job and for each task, so nested splits inherit it.
    static CANCEL: RefCell<Option<CancelFlag>> = const { RefCell::new(None) };
}

/// Runs `f` with `flag` as this thread's cancellation flag, and puts the previous one back
/// (also when `f` panics): a pool thread that steals other work while it waits must not lend
/// that work its flag.
fn with_cancel<R>(flag: Option<CancelFlag>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<CancelFlag>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            CANCEL.with(|c| *c.borrow_mut() = previous);
        }
    }
    let _restore = Restore(CANCEL.with(|c| c.replace(flag)));
    f()
}

/// A way to stop synchronous work early: work run under it ([`Cancel::run`]) skips the I/O
/// pool tasks it has not started once [`Cancel::cancel`] is called, and fails with an
/// [`Error::Io`] of kind [`std::io::ErrorKind::Interrupted`]; tasks already running finish.
/// For a binding that runs a long call on a thread of its own and must stop it on Ctrl-C: a
/// map's read, gather or view then fails as on a read error (the extents it was reading stay
/// missing; nothing else changes).
#[derive(Debug, Clone, Default)]
pub struct Cancel(CancelFlag);

impl Cancel {
    /// A token not cancelled.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Cancels the work run under this token, now and later.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Runs `work` on this thread under this token (the pool tasks it starts inherit it).
    pub fn run<R>(&self, work: impl FnOnce() -> R) -> R {
        with_cancel(Some(self.0.clone()), work)
    }

    /// Whether the token the calling thread's work runs under ([`Cancel::run`], or an
    /// [`IoFuture`]'s) has been cancelled; `false` outside any. For a long loop of the
    /// caller's own inside such work, to stop where the pool would skip its next task.
    pub fn current_is_cancelled() -> bool {
        CANCEL.with(|c| c.borrow().as_ref().is_some_and(|flag| flag.load(Ordering::Relaxed)))
    }
}

/// Runs `work` with no cancellation flag, whatever work this thread runs: for what must not be
/// cut short by a cancelled caller, such as the write-back that makes room for its reads (a
/// cancelled write-back would leave the file's error sticky until a `sync`).
pub(crate) fn uncancelled<R>(work: impl FnOnce() -> R) -> R {
    with_cancel(None, work)
}

/// The cancel flag of the work this thread runs for the pool, if any: work that runs its own
/// loop (a remote read's requests) checks it, as the pool checks it between tasks.
#[cfg(feature = "remote")]
pub(crate) fn current_cancel() -> Option<CancelFlag> {
    CANCEL.with(|c| c.borrow().clone())
}

/// The error of a task skipped because its transfer was cancelled. Made for every task left,
/// so it allocates nothing.
pub(crate) fn cancelled() -> Error {
    Error::io_nopath(
        "run a task of a cancelled transfer",
        std::io::Error::from(std::io::ErrorKind::Interrupted),
    )
}

impl IoPool {
    /// A pool of `nthreads` threads (1 to [`crate::config::MAX_THREADS`]).
    pub fn new(nthreads: usize) -> Result<IoPool> {
        let pool = IoPool { nthreads: AtomicUsize::new(nthreads), threads: ByGeneration::new() };
        pool.threads.replace(fork_generation(), Arc::new(build(nthreads)?));
        Ok(pool)
    }

    /// The process-wide pool, sized by [`Config::nthreads`] (`GPUMAP_NTHREADS`); a forked
    /// child makes its own (it has none of its parent's threads).
    pub fn global() -> Result<Arc<IoPool>> {
        static GLOBAL: PerProcess<Arc<IoPool>> = PerProcess::new();
        GLOBAL.get_or_try_make(|| Ok(Arc::new(IoPool::new(Config::global()?.nthreads)?)))
    }

    /// Number of threads: this process's, or as many as it will make.
    pub fn nthreads(&self) -> usize {
        let current = self.threads.read(fork_generation(), |threads| threads.current_num_threads());
        current.unwrap_or_else(|| self.nthreads.load(Ordering::Relaxed))
    }

    /// Replaces the threads with `nthreads` new ones. Work already running finishes on the old
    /// threads, which exit when it is done. Of two resizes at once, the one that installs its
    /// threads last stays.
    pub fn set_nthreads(&self, nthreads: usize) -> Result<()> {
        if nthreads != self.nthreads() {
            let fresh = Arc::new(build(nthreads)?);
            drop(self.threads.replace(fork_generation(), fresh));
            self.nthreads.store(nthreads, Ordering::Relaxed);
        }
        Ok(())
    }

    /// This process's threads: made again, as many, where the pool's were made before a fork.
    fn threads(&self) -> Result<Arc<rayon::ThreadPool>> {
        // The count read from the atomic: `nthreads` would take the slot's lock, which
        // `get_or_try_make` holds while it makes.
        let wanted = || self.nthreads.load(Ordering::Relaxed);
        self.threads.get_or_try_make(fork_generation(), || Ok(Arc::new(build(wanted())?)))
    }

    /// Runs the read `work(task, piece)` for every task, each on its own piece of `buf` (the
    /// pieces are the tasks' ranges of `buf`, which must cover it), in parallel; returns the
    /// length of the prefix of `buf` that was filled (see [`delivered_prefix`]), or the first
    /// error in task order. Blocks until every task has finished.
    pub(crate) fn run_split<F>(&self, tasks: &[Task], buf: &mut [u8], work: F) -> Result<usize>
    where
        F: Fn(Task, &mut [u8]) -> Result<usize> + Sync,
    {
        let mut pieces = Vec::with_capacity(tasks.len());
        let mut rest = buf;
        for task in tasks {
            let (piece, tail) = rest.split_at_mut(task.len as usize);
            pieces.push((*task, piece));
            rest = tail;
        }
        let counts = self.run_each(pieces, |(task, piece)| work(task, piece))?;
        Ok(delivered_prefix(tasks, &counts))
    }

    /// Runs `work(task, piece)` for every task on its piece of the read-only `buf`.
    pub(crate) fn run_split_ref<F>(&self, tasks: &[Task], buf: &[u8], work: F) -> Result<usize>
    where
        F: Fn(Task, &[u8]) -> Result<usize> + Sync,
    {
        let pieces: Vec<(Task, &[u8])> = tasks
            .iter()
            .map(|t| (*t, &buf[t.buf_offset as usize..(t.buf_offset + t.len) as usize]))
            .collect();
        self.run(pieces, |(task, piece)| work(task, piece))
    }

    /// Runs `work` on every item in parallel, sums the counts; the first error in item order
    /// wins. For writes and other work whose items all complete or fail; a read, whose items
    /// may come up short, counts only its [`delivered_prefix`].
    pub(crate) fn run<T, F>(&self, items: Vec<T>, work: F) -> Result<usize>
    where
        T: Send,
        F: Fn(T) -> Result<usize> + Sync,
    {
        Ok(self.run_each(items, work)?.into_iter().sum())
    }

    /// Runs `work` on every item in parallel and returns each item's count, in item order; the
    /// first error in item order, among the items that ran, wins. Once an item has failed,
    /// items not yet started are skipped: the call fails anyway, and a failing source (a server answering 503, a disk
    /// returning EIO) is not asked again for every item left. A single item runs on the calling
    /// thread (no hand-off for small transfers). Where the calling thread runs cancellable
    /// work, an item that has not started when the work is cancelled is skipped with an error
    /// of kind `Interrupted`.
    pub(crate) fn run_each<T, F>(&self, items: Vec<T>, work: F) -> Result<Vec<usize>>
    where
        T: Send,
        F: Fn(T) -> Result<usize> + Sync,
    {
        let cancel = CANCEL.with(|c| c.borrow().clone());
        let failed = AtomicBool::new(false);
        // `Err(None)`: skipped after another item failed.
        let guarded = |item: T| -> std::result::Result<usize, Option<Error>> {
            if cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Err(Some(cancelled()));
            }
            if failed.load(Ordering::Relaxed) {
                return Err(None);
            }
            with_cancel(cancel.clone(), || {
                catch_unwind(AssertUnwindSafe(|| work(item)))
                    .unwrap_or_else(|p| Err(panic_error(p)))
            })
            .map_err(|e| {
                failed.store(true, Ordering::Relaxed);
                Some(e)
            })
        };
        let results: Vec<std::result::Result<usize, Option<Error>>> = if items.len() <= 1 {
            items.into_iter().map(guarded).collect()
        } else {
            let pool = self.threads()?;
            wait_apart(&pool, || {
                Ok(pool.install(|| items.into_par_iter().with_max_len(1).map(guarded).collect()))
            })?
        };
        let mut counts = Vec::with_capacity(results.len());
        let mut skipped = false;
        for result in results {
            match result {
                Ok(n) => counts.push(n),
                Err(Some(e)) => return Err(e),
                Err(None) => skipped = true,
            }
        }
        if skipped {
            // Unreachable: an item is skipped only after another failed, whose error is above.
            return Err(cancelled());
        }
        Ok(counts)
    }

    /// Runs `job` on the pool and returns a future of its result.
    pub(crate) fn spawn<T, F>(&self, job: F) -> IoFuture<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        let threads = match self.threads() {
            Ok(threads) => threads,
            Err(e) => {
                let (future, completer) = IoFuture::pending();
                completer.complete(Err(e));
                return future;
            }
        };
        let slot = Arc::new(FutureSlot::default());
        let done = slot.clone();
        threads.spawn(move || {
            let flag = done.cancelled.clone();
            let result = with_cancel(Some(flag), || {
                catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|p| Err(panic_error(p)))
            });
            done.complete(result);
        });
        IoFuture { slot }
    }
}

impl IoPool {
    /// Runs `job` on the pool with no future (it reports through its own means), and no
    /// cancellation.
    pub(crate) fn spawn_detached(&self, job: impl FnOnce() + Send + 'static) {
        let run = move || {
            with_cancel(None, || {
                if let Err(p) = catch_unwind(AssertUnwindSafe(job)) {
                    tracing::warn!("gpumap: {}", panic_error(p));
                }
            })
        };
        match self.threads() {
            Ok(threads) => threads.spawn(run),
            Err(e) => {
                // Its caller waits on what the job does: run here rather than never.
                tracing::warn!("gpumap: {e}; running the job on the calling thread");
                run()
            }
        }
    }
}

/// Bytes a parallel read delivered from its start: the counts of `tasks` (consecutive, in file
/// order) up to and including the first that came up short.
///
/// A task reads less than its length only where the file ended. Tasks run at once, so when
/// another process truncates the file during the read, a task before the cut can come up
/// short while a task after it, which ran first, read its whole range: the bytes in between
/// were never read. Summing the counts would report them as read; the prefix does not.
pub(crate) fn delivered_prefix(tasks: &[Task], counts: &[usize]) -> usize {
    prefix_of(tasks.iter().map(|t| t.len).zip(counts.iter().copied()))
}

/// The same of reads given in order as `(bytes asked, bytes read)`: the counts up to and
/// including the first short one.
pub(crate) fn prefix_of(reads: impl IntoIterator<Item = (u64, usize)>) -> usize {
    let mut delivered = 0;
    for (asked, count) in reads {
        delivered += count;
        if (count as u64) < asked {
            break;
        }
    }
    delivered
}

/// Runs `work`, which waits for `pool`'s workers, so that the wait runs nothing else: on this
/// thread, or, where this thread is a worker of another rayon pool, on a scoped thread of its
/// own that this one joins. A rayon worker waiting for another pool runs its own pool's queued
/// jobs meanwhile; where those wait for `pool` in turn (thousands of queued reads), each nests
/// on the same stack until it overflows.
pub(crate) fn wait_apart<R: Send>(
    pool: &rayon::ThreadPool,
    work: impl FnOnce() -> Result<R> + Send,
) -> Result<R> {
    if rayon::current_thread_index().is_none() || pool.current_thread_index().is_some() {
        return work();
    }
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new().name("gpumap-wait".to_owned());
        let waiter = crate::per_process::spawn_apart_from_fork(|| thread.spawn_scoped(scope, work))
            .map_err(|e| Error::Unavailable {
                what: "a thread to wait for another pool's work",
                reason: e.to_string(),
            })?;
        waiter.join().unwrap_or_else(|_| {
            Err(Error::TaskPanicked("a thread waiting for another pool's work panicked".into()))
        })
    })
}

fn build(nthreads: usize) -> Result<rayon::ThreadPool> {
    if let Err(reason) = crate::config::check_nthreads(nthreads) {
        return Err(Error::InvalidArgument(format!("thread count {nthreads}: {reason}")));
    }
    let pool = crate::per_process::build_rayon_pool(
        rayon::ThreadPoolBuilder::new()
            .num_threads(nthreads)
            .thread_name(|i| format!("gpumap-io-{i}")),
    )
    .map_err(|e| Error::io_nopath("spawn I/O threads", std::io::Error::other(e.to_string())))?;
    started(pool)
}

/// `pool` once every one of its threads has started. A starting thread sets up process-wide
/// state on first use (crossbeam-epoch's collector, which rayon's queues use; the allocator's
/// record of the thread), under locks and one-time initializers; a fork while one of them is
/// held, which a file opened just before a fork would meet, leaves it held for ever in the
/// child, whose own threads then wait on it at their start.
pub(crate) fn started(pool: rayon::ThreadPool) -> Result<rayon::ThreadPool> {
    wait_apart(&pool, || {
        pool.broadcast(|_| ());
        Ok(())
    })?;
    Ok(pool)
}

fn panic_error(payload: Box<dyn std::any::Any + Send>) -> Error {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    Error::TaskPanicked(msg)
}

/// What a future's [`Helper`] is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Help {
    /// Run the work on the calling thread, or wait for its end (a waiter that would otherwise
    /// sleep).
    Run,
    /// End it unstarted, with the error of a cancelled transfer ([`cancelled`]).
    Cancel,
    /// Complete the future if the work has ended, without blocking ([`IoFuture::is_done`]).
    Poll,
    /// Complete the future if no I/O is left, waiting for a copy to the GPU already queued
    /// (`.await`, which must not block on I/O).
    Finish,
}

/// Work a future's callers can take on. Called by wait ([`Help::Run`]), cancel
/// ([`Help::Cancel`]), [`IoFuture::is_done`] ([`Help::Poll`]) and `.await` ([`Help::Finish`]),
/// one call at a time (under the future's helper lock); it answers whether it is done with, and
/// is then dropped. Where it takes the work it completes the future itself; where the work has
/// started elsewhere it does nothing, and the caller waits. A dropped future drops its helper,
/// which may own the future's completer.
pub(crate) type Helper = Box<dyn FnMut(Help) -> bool + Send>;

/// How long a waiter keeps checking whether its work is done before it sleeps: small work a
/// pool thread has taken ends within about this, and would otherwise wait for a wake-up too.
const SPIN: Duration = Duration::from_micros(50);

struct FutureSlot<T> {
    state: Mutex<FutureSlotState<T>>,
    ready: Condvar,
    /// Set by [`IoFuture::cancel`]; read by the tasks of the work (see [`with_cancel`]).
    cancelled: CancelFlag,
    /// Taken by the first wait or cancel (see [`Helper`]).
    helper: Mutex<Option<Helper>>,
    /// The fork generation of the process whose threads do the work.
    made_in: u64,
}

struct FutureSlotState<T> {
    result: Option<Result<T>>,
    finished: bool,
    waker: Option<Waker>,
}

impl<T> Default for FutureSlotState<T> {
    fn default() -> Self {
        FutureSlotState { result: None, finished: false, waker: None }
    }
}

impl<T> Default for FutureSlot<T> {
    fn default() -> Self {
        FutureSlot {
            state: Mutex::new(FutureSlotState::default()),
            ready: Condvar::new(),
            cancelled: Arc::new(AtomicBool::new(false)),
            helper: Mutex::new(None),
            made_in: fork_generation(),
        }
    }
}

impl<T> FutureSlot<T> {
    fn complete(&self, result: Result<T>) {
        let waker = {
            let mut state = self.state.lock();
            state.result = Some(result);
            state.finished = true;
            state.waker.take()
        };
        self.ready.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The result of work running on an [`IoPool`]: wait for it ([`IoFuture::wait`]), poll it
/// ([`IoFuture::is_done`]), or `.await` it (it is a [`Future`]; no runtime needed).
///
/// Dropping an `IoFuture` does not cancel the work: it finishes in the background, and the
/// buffer it owns is freed then.
#[must_use = "the transfer's result (and its buffer) come back only through the future"]
pub struct IoFuture<T> {
    slot: Arc<FutureSlot<T>>,
}

impl<T> IoFuture<T> {
    /// Blocks until the work is done and returns its result. Work that has not started yet
    /// may run on the calling thread (a small read still queued, see
    /// [`FileHandle::pread_device`](crate::io::FileHandle::pread_device)).
    pub fn wait(self) -> Result<T> {
        // Work already done needs no helper, nor the locks a helper takes to find that out.
        if !self.finished() {
            self.check_not_inherited()?;
            self.help(Help::Run);
            self.spin(SPIN);
        }
        let mut state = self.slot.state.lock();
        while !state.finished {
            self.slot.ready.wait(&mut state);
        }
        take(&mut state)
    }

    /// Whether the work has finished (then [`IoFuture::wait`] returns at once). Never blocks on
    /// I/O; a lone small read whose copy to the GPU has ended is completed here.
    pub fn is_done(&self) -> bool {
        if self.finished() {
            return true;
        }
        self.help(Help::Poll);
        self.finished()
    }

    fn finished(&self) -> bool {
        self.slot.state.lock().finished
    }

    /// An error for a wait, in a forked child, on work its parent started and had not finished
    /// at the fork: the threads doing it are not in the child, so it would never finish there.
    fn check_not_inherited(&self) -> Result<()> {
        if self.slot.made_in == fork_generation() {
            return Ok(());
        }
        Err(Error::io_nopath(
            "wait for work started before this process was forked",
            std::io::Error::other(
                "the threads doing it are in the parent process; wait for it there, or start \
                 it again here",
            ),
        ))
    }

    /// Waits up to `timeout` for the work; returns whether it has finished. A caller that must
    /// react to something else meanwhile (a Python binding checking for Ctrl-C) waits in steps.
    /// As in [`IoFuture::wait`], work not started yet may run on the calling thread, however
    /// long it takes.
    ///
    /// In a forked child, work its parent started counts as finished here, as
    /// [`IoFuture::wait`] then fails at once.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let start = Instant::now();
        if self.finished() || self.check_not_inherited().is_err() {
            return true;
        }
        self.help(Help::Run);
        if self.spin(SPIN.min(timeout.saturating_sub(start.elapsed()))) {
            return true;
        }
        let mut state = self.slot.state.lock();
        if !state.finished {
            let left = timeout.saturating_sub(start.elapsed());
            let _ = self.slot.ready.wait_for(&mut state, left);
        }
        state.finished
    }

    /// Asks the work to stop: the tasks of a transfer started on the pool that have not started
    /// yet are skipped, and the transfer fails with an [`Error::Io`] of kind
    /// [`std::io::ErrorKind::Interrupted`] (unless it finished first). Tasks already running
    /// finish: the future is done, and the memory free, only when they have. A map's prefetch
    /// stops so between its reads. A small read still queued to be coalesced is dropped from
    /// the queue unread, and fails so at once; a remote read of one request (a task of the
    /// remote runtime) drops its request; other work that does not run in pool tasks (a small
    /// read being coalesced, a lone small read whose copy to the GPU is queued) runs to its
    /// end.
    pub fn cancel(&self) {
        self.slot.cancelled.store(true, Ordering::Relaxed);
        self.help(Help::Cancel);
    }

    /// Runs the future's helper, if it has one, on this thread, and drops it once it is done
    /// with. The lock is held over the call so that two callers of one future never both find
    /// it missing while the other runs it (one of them would then sleep with nobody left to
    /// complete the future); a helper completes futures, never takes another's helper lock. A
    /// poll or `.await` that finds the helper running on another thread (a waiter reading a
    /// queued read) leaves it there rather than wait on that I/O: the future completes, and
    /// wakes its waker, when the other thread is done. A panic in the helper is logged, not
    /// passed on: the helper's own completers have completed the futures it took.
    fn help(&self, help: Help) {
        let mut slot = match help {
            Help::Poll | Help::Finish => match self.slot.helper.try_lock() {
                Some(slot) => slot,
                None => return,
            },
            Help::Run | Help::Cancel => self.slot.helper.lock(),
        };
        let Some(helper) = slot.as_mut() else { return };
        match catch_unwind(AssertUnwindSafe(|| helper(help))) {
            Ok(false) => {}
            Ok(true) => *slot = None,
            Err(p) => {
                tracing::warn!("gpumap: {}", panic_error(p));
                *slot = None;
            }
        }
    }

    /// Checks for up to `limit` whether the work is done, yielding the processor in between;
    /// whether it is.
    fn spin(&self, limit: Duration) -> bool {
        let start = Instant::now();
        loop {
            if self.finished() {
                return true;
            }
            if start.elapsed() >= limit {
                return false;
            }
            std::thread::yield_now();
        }
    }
}

impl<T> IoFuture<T> {
    /// A future completed later through its [`Completer`].
    pub(crate) fn pending() -> (IoFuture<T>, Completer<T>) {
        let slot = Arc::new(FutureSlot::default());
        (IoFuture { slot: slot.clone() }, Completer { slot: Some(slot) })
    }

    /// Gives the future work its waiter may take on (see [`Helper`]); replaces any before.
    pub(crate) fn set_helper(&self, helper: Helper) {
        *self.slot.helper.lock() = Some(helper);
    }
}

/// The completing side of [`IoFuture::pending`]. Dropped without completing, it completes the
/// future with an error, so that no waiter hangs.
pub(crate) struct Completer<T> {
    slot: Option<Arc<FutureSlot<T>>>,
}

impl<T> Completer<T> {
    /// Completes the future.
    pub(crate) fn complete(mut self, result: Result<T>) {
        if let Some(slot) = self.slot.take() {
            slot.complete(result);
        }
    }

    /// Completes the future with `work`'s result, run on a thread of its own named `name`
    /// (`work` gets the future's [`Cancel`]); with [`Error::Unavailable`] where no thread can
    /// be started, as under a process's thread limit.
    pub(crate) fn complete_on_a_thread_of_its_own(
        mut self,
        name: &str,
        work: impl FnOnce(Cancel) -> Result<T> + Send + 'static,
    ) where
        T: Send + 'static,
    {
        let Some(slot) = self.slot.take() else { return };
        let cancel = Cancel(slot.cancelled.clone());
        // The thread's own completer is made on it: were the spawn to fail, the closure dropped
        // with it must not complete the future first, with a panic's message.
        let for_thread = slot.clone();
        let thread = std::thread::Builder::new().name(name.to_owned());
        let spawned = crate::per_process::spawn_apart_from_fork(|| {
            thread.spawn(move || {
                let completer = Completer { slot: Some(for_thread) };
                completer.complete(work(cancel));
            })
        });
        if let Err(e) = spawned {
            slot.complete(Err(Error::Unavailable {
                what: "a thread for work in the background",
                reason: e.to_string(),
            }));
        }
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.complete(Err(Error::TaskPanicked("the transfer was abandoned".into())));
        }
    }
}

fn take<T>(state: &mut FutureSlotState<T>) -> Result<T> {
    state.result.take().unwrap_or_else(|| {
        Err(Error::TaskPanicked("the result of this transfer was already taken".into()))
    })
}

impl<T> Future for IoFuture<T> {
    type Output = Result<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        if !self.finished() {
            self.help(Help::Finish);
        }
        let mut state = self.slot.state.lock();
        if state.finished {
            Poll::Ready(take(&mut state))
        } else {
            state.waker = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

impl<T> Drop for IoFuture<T> {
    fn drop(&mut self) {
        // A helper may own the future's completer (a lone read's, which holds the slot): dropped
        // here, not with the slot, or the two would keep each other alive. Its own drop ends its
        // work first.
        let helper = self.slot.helper.lock().take();
        drop(helper);
    }
}

impl<T> std::fmt::Debug for IoFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoFuture").field("done", &self.is_done()).finish()
    }
}

#[cfg(test)]
mod tests;
