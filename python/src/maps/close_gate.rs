//! [`CloseGate`]: whether a `MappedFile` is open, and the calls in flight through it.
//!
//! `close` promises that every write it let in is written back when it returns, and that no
//! call gets in after: so it shuts the gate first, waits for the calls already through, and
//! only then flushes. A flush that fails opens the gate again (the dirty bytes are kept, for
//! another try).

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

use gpumap::sync::{Condvar, Mutex};

thread_local! {
    /// The gates this thread holds a passage of (their addresses, once per passage): a close
    /// on a thread inside a call of the same map (a buffer's export, or a `__del__` the
    /// garbage collector runs during the call) would wait for its own passage for ever.
    static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// The open state of one `MappedFile`.
#[derive(Default)]
pub(super) struct CloseGate {
    state: Mutex<State>,
    /// Signalled when the last call in flight leaves, and when a close ends.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    phase: Phase,
    in_flight: usize,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Phase {
    #[default]
    Open,
    /// A close waits for the calls in flight, or flushes.
    Closing,
    Closed,
}

/// A call let in: the gate does not close before it is dropped. Dropped on the thread that
/// entered (not `Send`), which holds it in [`HELD`] meanwhile.
pub(super) struct Passage {
    gate: Arc<CloseGate>,
    _this_thread: PhantomData<*const ()>,
}

impl CloseGate {
    /// A gate already closed: a map closed before the fork that copied it.
    pub(super) fn closed() -> CloseGate {
        let state = State { phase: Phase::Closed, in_flight: 0 };
        CloseGate { state: Mutex::new(state), changed: Condvar::new() }
    }

    /// A passage for one call, or `None` once a close has begun.
    pub(super) fn enter(self: &Arc<Self>) -> Option<Passage> {
        let mut state = self.state.lock();
        if state.phase != Phase::Open {
            return None;
        }
        state.in_flight += 1;
        HELD.with(|held| held.borrow_mut().push(self.address()));
        Some(Passage { gate: self.clone(), _this_thread: PhantomData })
    }

    /// Whether this thread is inside a call let in by this gate (see [`HELD`]).
    pub(super) fn held_here(&self) -> bool {
        HELD.with(|held| held.borrow().contains(&self.address()))
    }

    fn address(&self) -> usize {
        self as *const CloseGate as usize
    }

    /// Shuts the gate, waits for the calls in flight, then runs `finish` (the flush): closed
    /// where it succeeds, open again where it fails. A close already in progress elsewhere is
    /// waited for first; closing a closed gate runs nothing. Blocks: call it without the GIL,
    /// as the calls it waits for may need it to finish.
    pub(super) fn close<E>(&self, finish: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let mut state = self.state.lock();
        loop {
            match state.phase {
                Phase::Closed => return Ok(()),
                Phase::Closing => self.changed.wait(&mut state),
                Phase::Open => break,
            }
        }
        state.phase = Phase::Closing;
        while state.in_flight > 0 {
            self.changed.wait(&mut state);
        }
        drop(state);
        // A `finish` that panics (caught at the Python boundary) leaves the gate open, not
        // closing for ever.
        let reopen = Reopen(self);
        let outcome = finish();
        std::mem::forget(reopen);
        self.end_close(if outcome.is_ok() { Phase::Closed } else { Phase::Open });
        outcome
    }

    fn end_close(&self, phase: Phase) {
        self.state.lock().phase = phase;
        self.changed.notify_all();
    }
}

/// Opens the gate again when dropped: a close that did not end.
struct Reopen<'a>(&'a CloseGate);

impl Drop for Reopen<'_> {
    fn drop(&mut self) {
        self.0.end_close(Phase::Open);
    }
}

impl Drop for Passage {
    fn drop(&mut self) {
        let address = self.gate.address();
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(at) = held.iter().rposition(|&a| a == address) {
                held.swap_remove(at);
            }
        });
        let mut state = self.gate.state.lock();
        state.in_flight -= 1;
        let last = state.in_flight == 0;
        drop(state);
        if last {
            self.gate.changed.notify_all();
        }
    }
}
