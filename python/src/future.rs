//! `IOFuture` (what `CuFile.pread` / `pwrite` return) and `IOFutureStream` (what the
//! stream-ordered calls return).
//!
//! A future can be waited on from any thread, by any number of threads: the first `get()` waits
//! with the GIL released and keeps the result; every `get()` returns it (or raises the same
//! error). The memory of the transfer stays referenced until the transfer is done, whether or
//! not anyone waits.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use gpumap::io::IoFuture;
use gpumap::sync::Mutex;
use pyo3::prelude::*;

use crate::errors::{panicked, to_py, SIGNAL_POLL};

/// Work in flight, type-erased.
pub trait Pending: Send {
    /// Whether the work has finished.
    fn is_done(&self) -> bool;
    /// Waits; returns the count and what kept the memory alive (dropped later, with the GIL).
    fn wait(self: Box<Self>) -> (gpumap::Result<usize>, Option<Box<dyn Any + Send>>);
    /// Waits up to `timeout`; whether the work has finished. Work that cannot be waited for in
    /// steps (stream-ordered transfers) says so at once, and `wait` then blocks.
    fn wait_timeout(&self, timeout: Duration) -> bool {
        let _ = timeout;
        true
    }
    /// Asks the work to stop early (see `IoFuture::cancel`); by default it runs to its end.
    fn cancel(&self) {}
}

impl<B: Send + 'static> Pending for IoFuture<(B, usize)> {
    fn is_done(&self) -> bool {
        IoFuture::is_done(self)
    }

    fn wait_timeout(&self, timeout: Duration) -> bool {
        IoFuture::wait_timeout(self, timeout)
    }

    fn cancel(&self) {
        IoFuture::cancel(self)
    }

    fn wait(self: Box<Self>) -> (gpumap::Result<usize>, Option<Box<dyn Any + Send>>) {
        match IoFuture::wait(*self) {
            Ok((keep, n)) => (Ok(n), Some(Box::new(keep))),
            Err(e) => (Err(e), None),
        }
    }
}

enum State {
    Pending(Box<dyn Pending>),
    Done(Result<usize, Arc<gpumap::Error>>),
    Panicked(String),
}

/// Shared by both future classes.
struct SharedOutcome {
    state: Mutex<State>,
}

impl SharedOutcome {
    fn new(state: State) -> SharedOutcome {
        SharedOutcome { state: Mutex::new(state) }
    }

    /// Waits for the work in steps of [`SIGNAL_POLL`], with the GIL released, running Python's
    /// signal handlers between them: when one raises (Ctrl-C), the work is cancelled, its
    /// running tasks are waited for, and the handler's exception is raised (a later `get()`
    /// raises the transfer's own error, its cancellation).
    fn get(&self, py: Python<'_>) -> PyResult<usize> {
        loop {
            let step = py.detach(|| {
                let mut state = self.state.lock();
                if let State::Pending(pending) = &*state {
                    if !pending.wait_timeout(SIGNAL_POLL) {
                        return None;
                    }
                }
                Some(Self::finish(&mut state))
            });
            if let Some((outcome, keep)) = step {
                drop(keep); // releases the Python buffer, with the GIL held
                return match outcome {
                    Ok(n) => Ok(n),
                    Err(Ok(e)) => Err(to_py(py, &e)),
                    Err(Err(message)) => Err(pyo3::exceptions::PyRuntimeError::new_err(message)),
                };
            }
            if let Err(signal) = py.check_signals() {
                let (_, keep) = py.detach(|| {
                    let mut state = self.state.lock();
                    if let State::Pending(pending) = &*state {
                        pending.cancel();
                    }
                    Self::finish(&mut state)
                });
                drop(keep);
                return Err(signal);
            }
        }
    }

    /// Waits for pending work to end (at once when it has) and stores its result; returns the
    /// stored result and what kept the memory alive, if it was still kept.
    #[allow(clippy::type_complexity)]
    fn finish(
        state: &mut State,
    ) -> (Result<usize, Result<Arc<gpumap::Error>, String>>, Option<Box<dyn Any + Send>>) {
        let mut keep = None;
        if let State::Pending(_) = state {
            let taken = std::mem::replace(state, State::Done(Ok(0)));
            if let State::Pending(pending) = taken {
                *state =
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pending.wait()))
                    {
                        Ok((result, kept)) => {
                            keep = kept;
                            State::Done(result.map_err(Arc::new))
                        }
                        Err(payload) => State::Panicked(panicked(payload).to_string()),
                    };
            }
        }
        let outcome = match &*state {
            State::Done(Ok(n)) => Ok(*n),
            State::Done(Err(e)) => Err(Ok(e.clone())),
            State::Panicked(m) => Err(Err(m.clone())),
            // Replaced just above.
            State::Pending(_) => Err(Err("the transfer's result was lost".to_owned())),
        };
        (outcome, keep)
    }

    fn done(&self) -> bool {
        match self.state.try_lock() {
            Some(state) => match &*state {
                State::Pending(p) => p.is_done(),
                _ => true,
            },
            // Another thread is inside `get()`: it holds the lock until the work is done and
            // its result stored, so "not yet" is right until then.
            None => false,
        }
    }
}

/// The result of a `CuFile.pread` / `pwrite`: `get()` waits and returns the bytes moved.
#[pyclass(module = "gpumapio", name = "IOFuture", frozen)]
pub struct IOFuture {
    slot: SharedOutcome,
}

impl IOFuture {
    /// A future of work in flight.
    pub fn pending(work: Box<dyn Pending>) -> IOFuture {
        IOFuture { slot: SharedOutcome::new(State::Pending(work)) }
    }

    /// A future that is already complete.
    pub fn ready(result: gpumap::Result<usize>) -> IOFuture {
        IOFuture { slot: SharedOutcome::new(State::Done(result.map_err(Arc::new))) }
    }
}

#[pymethods]
impl IOFuture {
    /// Waits until the transfer is done (the GIL is released meanwhile) and returns the number
    /// of bytes read or written; raises the transfer's error. Any thread may call it, any
    /// number of times.
    fn get(&self, py: Python<'_>) -> PyResult<usize> {
        self.slot.get(py)
    }

    /// Whether the transfer is done (`get()` then returns at once).
    fn done(&self) -> bool {
        self.slot.done()
    }

    fn __repr__(&self) -> String {
        format!("<gpumapio.IOFuture done={}>", if self.slot.done() { "True" } else { "False" })
    }
}

/// The result of a stream-ordered transfer (`CuFile.raw_read_async`, `raw_write_async`):
/// `check_bytes_done()` waits for it and returns the bytes moved. Keep it alive until then.
#[pyclass(module = "gpumapio", name = "IOFutureStream", frozen)]
pub struct IOFutureStream {
    slot: SharedOutcome,
}

impl IOFutureStream {
    /// A stream transfer in flight.
    pub fn pending(work: Box<dyn Pending>) -> IOFutureStream {
        IOFutureStream { slot: SharedOutcome::new(State::Pending(work)) }
    }

    /// A stream transfer that completed before the call returned.
    pub fn ready(result: gpumap::Result<usize>) -> IOFutureStream {
        IOFutureStream { slot: SharedOutcome::new(State::Done(result.map_err(Arc::new))) }
    }
}

#[pymethods]
impl IOFutureStream {
    /// Waits until the stream has carried out the transfer; returns the bytes moved.
    fn check_bytes_done(&self, py: Python<'_>) -> PyResult<usize> {
        self.slot.get(py)
    }

    /// Whether the transfer is known to be done.
    fn done(&self) -> bool {
        self.slot.done()
    }
}
