//! The pool's and `IoFuture`'s tests: tasks, cancellation, helpers.

use std::sync::atomic::AtomicUsize;

use super::*;
use crate::align::split_tasks;

#[test]
fn pieces_line_up_with_tasks() {
    let pool = IoPool::new(3).unwrap();
    let tasks = split_tasks(100, 1 << 20, 64 << 10);
    let mut buf = vec![0u8; 1 << 20];
    let n = pool
        .run_split(&tasks, &mut buf, |task, piece| {
            assert_eq!(piece.len() as u64, task.len);
            for (i, b) in piece.iter_mut().enumerate() {
                *b = ((task.offset + i as u64) % 251) as u8;
            }
            Ok(piece.len())
        })
        .unwrap();
    assert_eq!(n, 1 << 20);
    assert!(buf.iter().enumerate().all(|(i, b)| *b == ((100 + i as u64) % 251) as u8));
}

#[test]
fn a_read_counts_only_the_prefix_it_delivered() {
    let pool = IoPool::new(4).unwrap();
    let page = crate::align::PAGE_SIZE as usize;
    let tasks = split_tasks(0, 8 * page as u64, page as u64);
    let mut buf = vec![0u8; 8 * page];
    // The file was cut inside task 3 while tasks 5 to 7 had already read theirs in full.
    let n = pool
        .run_split(&tasks, &mut buf, |task, piece| {
            Ok(match task.offset as usize / page {
                3 => piece.len() / 2,
                4 => 0,
                _ => piece.len(),
            })
        })
        .unwrap();
    assert_eq!(n, 3 * page + page / 2);
    // A read that is only short at the end counts everything.
    let n = pool
        .run_split(&tasks, &mut buf, |task, piece| {
            Ok(if task.offset as usize / page == 7 { 100 } else { piece.len() })
        })
        .unwrap();
    assert_eq!(n, 7 * page + 100);
}

#[test]
fn first_error_in_order_and_panics_become_errors() {
    let pool = IoPool::new(2).unwrap();
    let r = pool.run((0..8).collect(), |i| {
        if i == 5 {
            panic!("boom");
        }
        if i >= 3 {
            return Err(Error::InvalidArgument(format!("item {i}")));
        }
        Ok(1)
    });
    // Items not started once one failed are skipped: the error is the first in item order
    // among the items that ran (which of 3..8 depends on the threads' timing).
    let failed = |m: &str| (3..8).filter(|&i| i != 5).any(|i| m == format!("item {i}"));
    assert!(
        matches!(r, Err(Error::InvalidArgument(ref m)) if failed(m))
            || matches!(r, Err(Error::TaskPanicked(ref m)) if m == "boom"),
        "{r:?}"
    );
    let r = pool.run(vec![0, 1], |i| if i == 1 { panic!("boom") } else { Ok(1) });
    assert!(matches!(r, Err(Error::TaskPanicked(ref m)) if m == "boom"), "{r:?}");
}

#[test]
fn items_not_started_after_a_failure_are_skipped() {
    // One thread takes the items in order: those after the failing one are never run.
    let pool = IoPool::new(1).unwrap();
    let ran = AtomicUsize::new(0);
    let r = pool.run((0..100).collect(), |i| {
        ran.fetch_add(1, Ordering::Relaxed);
        if i == 10 {
            return Err(Error::InvalidArgument(format!("item {i}")));
        }
        Ok(1)
    });
    assert!(matches!(r, Err(Error::InvalidArgument(ref m)) if m == "item 10"), "{r:?}");
    assert_eq!(ran.load(Ordering::Relaxed), 11);
    // With several threads, a failing first item stops most of the rest.
    let pool = IoPool::new(4).unwrap();
    let ran = AtomicUsize::new(0);
    let r = pool.run((0..10_000).collect(), |i| {
        ran.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_micros(50));
        if i % 2 == 0 {
            return Err(Error::InvalidArgument("even".into()));
        }
        Ok(1)
    });
    assert!(r.is_err() && ran.load(Ordering::Relaxed) < 100, "{}", ran.load(Ordering::Relaxed));
    // And a run without failures runs every item.
    let ran = AtomicUsize::new(0);
    let n = pool.run((0..1000).collect(), |_| {
        ran.fetch_add(1, Ordering::Relaxed);
        Ok(1)
    });
    assert_eq!((n.unwrap(), ran.load(Ordering::Relaxed)), (1000, 1000));
}

#[test]
fn cancel_skips_the_tasks_not_started_and_waits_for_those_running() {
    let pool = Arc::new(IoPool::new(1).unwrap());
    let started = Arc::new(AtomicUsize::new(0));
    let (p, s) = (pool.clone(), started.clone());
    let future = pool.spawn(move || {
        p.run((0..1000).collect(), |_: usize| {
            s.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
            Ok(1)
        })
    });
    while started.load(Ordering::SeqCst) < 5 {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!future.wait_timeout(Duration::from_millis(1)));
    future.cancel();
    let r = future.wait();
    assert!(
        matches!(&r, Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::Interrupted),
        "{r:?}"
    );
    let ran = started.load(Ordering::SeqCst);
    assert!(ran < 1000, "{ran} tasks ran");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(started.load(Ordering::SeqCst), ran, "a task started after the future was done");
    // The pool's thread takes other work afterwards, uncancelled.
    let p = pool.clone();
    let again = pool.spawn(move || p.run(vec![1; 10], Ok));
    assert!(again.wait_timeout(Duration::from_secs(10)));
    assert_eq!(again.wait().unwrap(), 10);
    assert_eq!(pool.run(vec![1; 3], Ok).unwrap(), 3);
}

#[test]
fn a_cancel_token_stops_the_pool_tasks_of_work_run_under_it() {
    let pool = IoPool::new(2).unwrap();
    let cancel = Cancel::new();
    let started = AtomicUsize::new(0);
    let r = std::thread::scope(|scope| {
        let running = scope.spawn(|| {
            cancel.run(|| {
                pool.run((0..1000).collect(), |_: usize| {
                    started.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(1));
                    Ok(1)
                })
            })
        });
        while started.load(Ordering::SeqCst) < 5 {
            std::thread::sleep(Duration::from_millis(1));
        }
        cancel.cancel();
        running.join().unwrap()
    });
    assert!(
        matches!(&r, Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::Interrupted),
        "{r:?}"
    );
    let ran = started.load(Ordering::SeqCst);
    assert!(ran < 1000, "{ran} tasks ran");
    // The token stays cancelled; work outside it, on this thread and the pool's, is not.
    assert!(cancel.is_cancelled());
    assert!(cancel.run(|| pool.run(vec![1; 3], Ok)).is_err());
    assert_eq!(pool.run(vec![1; 3], Ok).unwrap(), 3);
    assert_eq!(Cancel::new().run(|| pool.run(vec![1; 3], Ok)).unwrap(), 3);
}

#[test]
fn work_sees_whether_the_token_it_runs_under_is_cancelled() {
    assert!(!Cancel::current_is_cancelled(), "outside any token");
    let cancel = Cancel::new();
    let seen = cancel.run(|| {
        let before = Cancel::current_is_cancelled();
        cancel.cancel();
        // An uncancelled stretch inside (a write-back) sees no token at all.
        (before, Cancel::current_is_cancelled(), uncancelled(Cancel::current_is_cancelled))
    });
    assert_eq!(seen, (false, true, false));
    assert!(!Cancel::current_is_cancelled(), "the token is this thread's no longer");
}

/// The state a test helper shares: the completer (which another thread may take, to
/// complete the future itself) and the threads the helper ran on.
type Shared = (Arc<Mutex<Option<Completer<usize>>>>, Arc<Mutex<Vec<std::thread::ThreadId>>>);

/// A pending future whose helper, as a queued small read's, completes it with 1 when run
/// (or, cancelled, with the cancellation) where the completer is still there, and leaves
/// polls to the thread that has the work.
fn helped() -> (IoFuture<usize>, Shared) {
    let (future, completer) = IoFuture::pending();
    let shared: Shared = (Arc::new(Mutex::new(Some(completer))), Arc::default());
    let (c, ran_on) = shared.clone();
    future.set_helper(Box::new(move |help| {
        let result = match help {
            Help::Run => Ok(1),
            Help::Cancel => Err(cancelled()),
            Help::Poll | Help::Finish => return false,
        };
        ran_on.lock().push(std::thread::current().id());
        let taken = c.lock().take();
        if let Some(completer) = taken {
            completer.complete(result);
        }
        true
    }));
    (future, shared)
}

/// Sets its flag when dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A pending future whose helper owns its completer, as a lone read's does: the work ends
/// when `ended` is set; polls complete it then, waits and `.await` wait for it.
fn owning_helper(ended: Arc<AtomicBool>) -> (IoFuture<usize>, Arc<AtomicBool>) {
    let (future, completer) = IoFuture::pending();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = DropFlag(dropped.clone());
    let mut completer = Some(completer);
    future.set_helper(Box::new(move |help| {
        let _flag = &flag;
        match help {
            Help::Cancel => return false,
            Help::Poll if !ended.load(Ordering::SeqCst) => return false,
            Help::Poll => {}
            Help::Run | Help::Finish => {
                while !ended.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
            }
        }
        if let Some(c) = completer.take() {
            c.complete(Ok(5));
        }
        true
    }));
    (future, dropped)
}

#[test]
fn a_poll_never_waits_for_a_helper_running_elsewhere() {
    // A waiter runs a helper that blocks until released; meanwhile, polls from another
    // thread answer at once (not done), and the end of the wait completes the future.
    let (future, completer) = IoFuture::<usize>::pending();
    let release = Arc::new(AtomicBool::new(false));
    let running = Arc::new(AtomicBool::new(false));
    let (r, go) = (release.clone(), running.clone());
    let mut completer = Some(completer);
    future.set_helper(Box::new(move |help| {
        if help != Help::Run {
            return false;
        }
        go.store(true, Ordering::SeqCst);
        while !r.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        if let Some(c) = completer.take() {
            c.complete(Ok(3));
        }
        true
    }));
    std::thread::scope(|s| {
        let waiter = s.spawn(|| future.wait_timeout(Duration::from_secs(10)));
        // Releases the helper after 2 s at the latest, so that a poll that waited for it
        // fails the check below instead of hanging.
        s.spawn(|| {
            let start = Instant::now();
            while !release.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(5));
            }
            release.store(true, Ordering::SeqCst);
        });
        while !running.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let start = Instant::now();
        assert!(!future.is_done());
        // What `.await` asks (it needs the future itself, which the waiter borrows).
        future.help(Help::Finish);
        assert!(!future.finished());
        assert!(start.elapsed() < Duration::from_secs(1), "a poll waited for the helper");
        release.store(true, Ordering::SeqCst);
        assert!(waiter.join().unwrap());
    });
    assert!(future.is_done());
    assert_eq!(future.wait().unwrap(), 3);
}

#[test]
fn a_helper_that_owns_its_completer_is_polled_awaited_and_freed() {
    // Polled: not done until the work ends, then done without a wait; the helper is
    // dropped once done with.
    let ended = Arc::new(AtomicBool::new(false));
    let (future, dropped) = owning_helper(ended.clone());
    assert!(!future.is_done());
    future.cancel();
    assert!(!future.is_done(), "a cancel ends nothing that is past its I/O");
    ended.store(true, Ordering::SeqCst);
    assert!(future.is_done());
    assert!(dropped.load(Ordering::SeqCst));
    assert_eq!(future.wait().unwrap(), 5);
    // Awaited with no runtime: the first poll finishes it.
    let (future, _) = owning_helper(Arc::new(AtomicBool::new(true)));
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut future = std::pin::pin!(future);
    assert!(matches!(future.as_mut().poll(&mut cx), Poll::Ready(Ok(5))));
    // Dropped unwaited: the helper, and with it the completer, are freed.
    let (future, dropped) = owning_helper(Arc::new(AtomicBool::new(false)));
    drop(future);
    assert!(dropped.load(Ordering::SeqCst), "the helper outlived its future");
    // Waited from two threads at once (in steps, by reference): both see it end.
    let ended = Arc::new(AtomicBool::new(false));
    let (future, _) = owning_helper(ended.clone());
    std::thread::scope(|s| {
        let waiters: Vec<_> =
            (0..2).map(|_| s.spawn(|| future.wait_timeout(Duration::from_secs(10)))).collect();
        std::thread::sleep(Duration::from_millis(10));
        ended.store(true, Ordering::SeqCst);
        for w in waiters {
            assert!(w.join().unwrap());
        }
    });
    assert_eq!(future.wait().unwrap(), 5);
}

#[test]
fn a_waiter_runs_the_helper_once_on_its_own_thread() {
    let here = std::thread::current().id();
    // Waited: the helper ran here, once.
    let (future, (_, ran_on)) = helped();
    assert!(!future.is_done());
    assert_eq!(future.wait().unwrap(), 1);
    assert_eq!(*ran_on.lock(), [here]);
    // Waited in steps: the first step helps, the later ones find it done.
    let (future, (_, ran_on)) = helped();
    assert!(future.wait_timeout(Duration::from_millis(1)));
    assert!(future.wait_timeout(Duration::ZERO));
    assert!(future.is_done());
    assert_eq!(future.wait().unwrap(), 1);
    assert_eq!(*ran_on.lock(), [here]);
    // Cancelled while unstarted: the helper ends it so, and a later wait does not run it.
    let (future, (_, ran_on)) = helped();
    future.cancel();
    assert!(future.is_done());
    let r = future.wait();
    assert!(
        matches!(&r, Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::Interrupted),
        "{r:?}"
    );
    assert_eq!(ran_on.lock().len(), 1);
}

#[test]
fn a_waiter_whose_work_started_elsewhere_sleeps_until_it_ends() {
    // The work was taken by another thread before the wait: the helper finds nothing, and
    // the waiter is woken by the other thread's completion.
    let (future, (completer, ran_on)) = helped();
    let taken = completer.lock().take().unwrap();
    let other = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        taken.complete(Ok(7));
    });
    assert!(!future.wait_timeout(Duration::from_millis(1)));
    assert_eq!(future.wait().unwrap(), 7);
    assert_eq!(ran_on.lock().len(), 1);
    other.join().unwrap();
    // Dropped unwaited: the helper is dropped, never run, and the work ends elsewhere.
    let (future, (completer, ran_on)) = helped();
    drop(future);
    completer.lock().take().unwrap().complete(Ok(1));
    assert!(ran_on.lock().is_empty());
    // A helper that panics is logged; the waiter still gets the completer's answer.
    let (future, completer) = IoFuture::<usize>::pending();
    future.set_helper(Box::new(move |_| {
        let _keep = &completer;
        panic!("helper");
    }));
    assert!(matches!(future.wait(), Err(Error::TaskPanicked(_))));
}

#[test]
fn futures_complete_and_resize_keeps_working() {
    let pool = IoPool::new(2).unwrap();
    let futures: Vec<_> = (0..64).map(|i| pool.spawn(move || Ok(i * 2))).collect();
    pool.set_nthreads(5).unwrap();
    assert_eq!(pool.nthreads(), 5);
    let sum: usize = futures.into_iter().map(|f| f.wait().unwrap()).sum();
    assert_eq!(sum, (0..64).map(|i| i * 2).sum::<usize>());
    assert!(IoPool::new(0).is_err());
    let f = pool.spawn(|| -> Result<()> { panic!("inside") });
    assert!(matches!(f.wait(), Err(Error::TaskPanicked(_))));
}

#[test]
fn jobs_of_one_pool_running_another_pools_tasks_do_not_nest() {
    // A file opened with a pool of its own, read from another pool's job: that job's worker
    // once ran its own pool's queued jobs while it waited, each waiting in turn, until its
    // stack overflowed (as the remote read lanes did).
    let (a, b) = (IoPool::new(2).unwrap(), Arc::new(IoPool::new(2).unwrap()));
    let futures: Vec<_> = (0..6000)
        .map(|_| {
            let b = Arc::clone(&b);
            a.spawn(move || {
                b.run(vec![1usize, 2], |n| {
                    std::thread::sleep(Duration::from_micros(50));
                    Ok(n)
                })
            })
        })
        .collect();
    for future in futures {
        assert_eq!(future.wait().unwrap(), 3);
    }
}
