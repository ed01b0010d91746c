//! Python work done on threads of gpumap's own (an I/O thread releasing a buffer export when
//! its transfer ends, a map flushed as its last holder lets go) only before the interpreter's
//! exit: a thread that asks for the GIL while the interpreter finalizes is ended by Python
//! (`pthread_exit`, through Rust frames), which crashes the process. Work an unwaited future
//! left running at exit (a daemon thread's `pwrite`) ends after that point.

use std::sync::atomic::{AtomicBool, Ordering};

use gpumap::sync::{Condvar, Mutex};
use pyo3::ffi;
use pyo3::prelude::*;

/// Set by [`stop_attaching`]: from then on nothing here asks for the GIL.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Threads inside [`attach_unless_exiting`], in the process that counted them (a forked child
/// inherits the count of threads it does not have).
static INSIDE: Mutex<(u64, usize)> = Mutex::new((0, 0));
static LEFT: Condvar = Condvar::new();

/// `work` with the GIL, unless the interpreter is gone or its exit has begun: then `None`, and
/// what `work` would have released stays held (the process is ending).
pub fn attach_unless_exiting<R>(work: impl FnOnce(Python<'_>) -> R) -> Option<R> {
    // SAFETY: a plain query, valid at any time.
    if unsafe { ffi::Py_IsInitialized() } == 0 {
        return None;
    }
    let generation = gpumap::per_process::fork_generation();
    {
        let mut inside = INSIDE.lock();
        if EXITING.load(Ordering::Acquire) {
            return None;
        }
        if inside.0 != generation {
            *inside = (generation, 0);
        }
        inside.1 += 1;
    }
    struct Leave(u64);
    impl Drop for Leave {
        fn drop(&mut self) {
            let mut inside = INSIDE.lock();
            if inside.0 == self.0 {
                inside.1 -= 1;
                if inside.1 == 0 {
                    LEFT.notify_all();
                }
            }
        }
    }
    let _leave = Leave(generation);
    Some(Python::attach(work))
}

/// Run by `gpumapio` at exit, after its other exit work: no thread of gpumap's asks for the
/// GIL from now on, and those already asking are let through first (the GIL released while
/// they finish).
#[pyfunction]
pub fn stop_attaching(py: Python<'_>) {
    EXITING.store(true, Ordering::Release);
    let generation = gpumap::per_process::fork_generation();
    py.detach(|| {
        let mut inside = INSIDE.lock();
        while inside.0 == generation && inside.1 > 0 {
            LEFT.wait(&mut inside);
        }
    });
}
