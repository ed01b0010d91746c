//! The gate of the background admission (`admission`): one admission runs at a time; a claim
//! is the right to run it, and waiting for none running is how callers see its effects. Apart
//! from the admission itself so that the engine's state can hold the gate without importing
//! what admits.
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::sync::{Condvar, Mutex};

/// Whether an admission is running, and a way to wait for none.
#[derive(Default)]
pub(crate) struct Admissions {
    running: Mutex<bool>,
    finished: Condvar,
}

impl Admissions {
    /// Waits until no admission runs.
    pub(crate) fn wait_idle(&self) {
        let mut running = self.running.lock();
        while *running {
            self.finished.wait(&mut running);
        }
    }
}

/// The right to run the engine's one admission, given back when dropped.
pub(crate) struct AdmissionClaim {
    gate: Arc<Admissions>,
}

impl AdmissionClaim {
    /// The claim, or `None` while another admission runs.
    pub(crate) fn try_take(gate: &Arc<Admissions>) -> Option<AdmissionClaim> {
        let mut running = gate.running.lock();
        if *running {
            return None;
        }
        *running = true;
        Some(AdmissionClaim { gate: Arc::clone(gate) })
    }
}

impl Drop for AdmissionClaim {
    fn drop(&mut self) {
        *self.gate.running.lock() = false;
        self.gate.finished.notify_all();
    }
}
