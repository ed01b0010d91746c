//! Flat combining: many threads each with one small piece of work, one of them starting all the
//! pieces queued at that moment in one go (for the GPU: one kernel launch for sixteen copies,
//! instead of sixteen copies serialised in the driver).
//!
//! A thread queues its piece; if no one leads, it *leads*: it takes everything queued, starts
//! it (`launch`), hands the lead to the oldest piece queued meanwhile, waits for what it
//! started (`finish`) and passes the outcome to the threads whose pieces it ran. Batches
//! therefore overlap: the next leader launches while the last batch is still running, and the
//! lead is held only for a launch, not for a launch and its completion.
//!
//! Each thread waits on its own ticket and is woken by name. The first version held the lead
//! across the whole batch and woke every waiter through one condition variable, each of which
//! then took the queue's lock in turn only to find its piece done (sampled on the H100,
//! 2026-11-22: sixteen view threads mostly in that wait, the leader in the driver in 2 % of the
//! samples). Measured there the same day (the CLI, 16 threads of single 4 KiB views under a
//! 64 MiB budget, both builds in one session, two rounds): 145 and 175 k views/s, against 148
//! and 150 k for the first version — within the noise. A view's miss is bounded by a launch and
//! its completion plus the cache's lock, not by this hand-off; this version is kept for its
//! shorter lead and because its waits are per thread.
//!
//! Each leader starts exactly one batch, so a steady stream of pieces from others never keeps a
//! thread here.
#![forbid(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, Thread};

use parking_lot::Mutex;

/// Where a queued piece stands.
const QUEUED: u8 = 0;
/// Its thread is to lead the next batch (its piece is still queued).
const LEAD: u8 = 1;
/// Its batch ran; the outcome is set.
const DONE: u8 = 2;

/// The outcome of a batch, shared by every piece in it.
pub(crate) type Outcome = std::result::Result<(), String>;

/// Pieces of type `T` run in batches by whichever thread leads (see the module docs).
pub(crate) struct Combiner<T> {
    queue: Mutex<Queue<T>>,
}

struct Queue<T> {
    waiting: Vec<(T, Arc<Ticket>)>,
    /// Whether a thread leads now (is running a batch, or has been handed the lead).
    leading: bool,
}

/// One thread's wait for its piece.
struct Ticket {
    thread: Thread,
    state: AtomicU8,
    outcome: OnceLock<Outcome>,
}

impl<T> Default for Combiner<T> {
    fn default() -> Self {
        Combiner { queue: Mutex::new(Queue { waiting: Vec::new(), leading: false }) }
    }
}

impl<T> Combiner<T> {
    /// Queues `piece` and returns once a batch holding it finished: the outcome of that batch.
    /// `launch` and `finish` are called (on this thread) only if this thread leads: `launch`
    /// with every piece queued at that moment, its own among them, to start them; `finish`
    /// with what it returned, to wait for them, after the lead has passed on. A panic in either
    /// is that batch's error, not a hang.
    pub(crate) fn submit<W>(
        &self,
        piece: T,
        launch: impl FnOnce(Vec<T>) -> std::result::Result<W, String>,
        finish: impl FnOnce(W) -> Outcome,
    ) -> Outcome {
        let ticket = Arc::new(Ticket {
            thread: thread::current(),
            state: AtomicU8::new(QUEUED),
            outcome: OnceLock::new(),
        });
        let lead_now = {
            let mut queue = self.queue.lock();
            queue.waiting.push((piece, Arc::clone(&ticket)));
            !std::mem::replace(&mut queue.leading, true)
        };
        if !lead_now {
            match ticket.wait() {
                QUEUED | LEAD => {}
                _ => return ticket.outcome(),
            }
        }
        let batch = std::mem::take(&mut self.queue.lock().waiting);
        let (pieces, tickets): (Vec<T>, Vec<Arc<Ticket>>) = batch.into_iter().unzip();
        let launched = catch_unwind(AssertUnwindSafe(|| launch(pieces)))
            .unwrap_or_else(|_| Err("launching a combined batch panicked".to_owned()));
        {
            let mut queue = self.queue.lock();
            match queue.waiting.first() {
                Some((_, next)) => {
                    next.state.store(LEAD, Ordering::Release);
                    next.thread.unpark();
                }
                None => queue.leading = false,
            }
        }
        let outcome = launched.and_then(|started| {
            catch_unwind(AssertUnwindSafe(|| finish(started)))
                .unwrap_or_else(|_| Err("finishing a combined batch panicked".to_owned()))
        });
        for t in tickets.iter().filter(|t| !Arc::ptr_eq(t, &ticket)) {
            // Only the leader that took a ticket sets it, so this cannot find it set.
            let _ = t.outcome.set(outcome.clone());
            t.state.store(DONE, Ordering::Release);
            t.thread.unpark();
        }
        outcome
    }
}

impl Ticket {
    /// Waits until the piece is done or its thread is to lead; returns which. (`park` returns
    /// at once when the unpark came first, so a wake-up between the check and the park is not
    /// lost; it may also return for no reason, hence the loop.)
    fn wait(&self) -> u8 {
        loop {
            let state = self.state.load(Ordering::Acquire);
            if state != QUEUED {
                return state;
            }
            thread::park();
        }
    }

    fn outcome(&self) -> Outcome {
        self.outcome
            .get()
            .cloned()
            .unwrap_or_else(|| Err("a combined batch lost its outcome".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[test]
    fn every_piece_runs_exactly_once_and_batches_form() {
        let combiner = Combiner::default();
        let ran = Mutex::new(Vec::new());
        let batches = AtomicUsize::new(0);
        let threads = 8;
        let per_thread = 2000;
        thread::scope(|s| {
            for t in 0..threads {
                let (combiner, ran, batches) = (&combiner, &ran, &batches);
                s.spawn(move || {
                    for i in 0..per_thread {
                        let outcome = combiner.submit(
                            t * per_thread + i,
                            |pieces: Vec<usize>| {
                                batches.fetch_add(1, Ordering::Relaxed);
                                Ok(pieces)
                            },
                            |pieces| {
                                if i % 97 == 0 {
                                    // A slow batch, so that others queue and launch meanwhile.
                                    thread::sleep(Duration::from_micros(200));
                                }
                                ran.lock().extend(pieces);
                                Ok(())
                            },
                        );
                        assert_eq!(outcome, Ok(()));
                    }
                });
            }
        });
        let ran = ran.into_inner();
        assert_eq!(ran.len(), threads * per_thread, "a piece ran twice or never");
        let distinct: HashSet<usize> = ran.iter().copied().collect();
        assert_eq!(distinct.len(), threads * per_thread);
        assert!(batches.load(Ordering::Relaxed) <= threads * per_thread);
    }

    #[test]
    fn a_batch_error_or_panic_reaches_every_piece_in_it() {
        let combiner = Combiner::default();
        let outcomes = Mutex::new(Vec::new());
        thread::scope(|s| {
            for t in 0..6u32 {
                let (combiner, outcomes) = (&combiner, &outcomes);
                s.spawn(move || {
                    for i in 0..500u32 {
                        let piece = t * 1000 + i;
                        let outcome = combiner.submit(
                            piece,
                            |pieces: Vec<u32>| {
                                if pieces.iter().any(|p| p % 100 == 3) {
                                    panic!("a piece ending in 03 (this panic is the test)");
                                }
                                Ok(pieces)
                            },
                            |pieces| {
                                if pieces.iter().any(|p| p % 100 == 5) {
                                    panic!("a piece ending in 05 (this panic is the test)");
                                }
                                if pieces.iter().any(|p| p % 10 == 7) {
                                    return Err("a piece ending in 7".to_owned());
                                }
                                Ok(())
                            },
                        );
                        outcomes.lock().push((piece, outcome));
                    }
                });
            }
        });
        let outcomes = outcomes.into_inner();
        assert_eq!(outcomes.len(), 3000);
        for (piece, outcome) in outcomes {
            // A piece that fails its own batch can never come back Ok.
            if piece % 100 == 3 || piece % 100 == 5 || piece % 10 == 7 {
                assert!(outcome.is_err(), "piece {piece} came back {outcome:?}");
            }
        }
    }
}
