//! [`MapHandle`]: the binding's hold on a map, shared by its `MappedFile` and its views.

use std::ffi::CString;
use std::sync::{Arc, Weak};

use gpumap::mapped::DeviceMappedFile;
use gpumap::sync::Mutex;
use pyo3::exceptions::PyRuntimeWarning;
use pyo3::prelude::*;

/// The binding's hold on a map, shared by its `MappedFile` and its views. When the last of
/// them goes, a writable map with dirty bytes is flushed here, and a failure is raised as a
/// `RuntimeWarning`: the library's own flush when its last handle drops can only log (through
/// `tracing`, which Python users do not see). Python code is the only writer of a map it
/// opened, so after this flush nothing dirties it again.
pub(super) struct MapHandle {
    pub(super) map: DeviceMappedFile,
}

impl MapHandle {
    /// The binding's hold on `map`; a writable one is also known to [`flush_writable_maps`].
    pub(super) fn new(map: DeviceMappedFile) -> Arc<MapHandle> {
        let writable = map.is_writable();
        let handle = Arc::new(MapHandle { map });
        if writable {
            let mut open = WRITABLE.lock();
            open.retain(|held| held.strong_count() > 0);
            open.push(Arc::downgrade(&handle));
        }
        handle
    }

    /// Flushes the map; a failure that leaves bytes dirty is a `RuntimeWarning` saying
    /// `when` (the caller has no one to raise it to).
    fn flush_or_warn(&self, py: Python<'_>, when: &str) {
        let dirty = self.map.stats().dirty_bytes;
        if dirty == 0 {
            return;
        }
        let map = self.map.clone();
        let Err(e) = py.detach(move || map.flush()) else { return };
        // A flush fails while an earlier write-back's error sticks, even when it writes
        // everything: only bytes still dirty are worth a warning.
        let left = self.map.stats().dirty_bytes;
        if left == 0 {
            return;
        }
        let message = format!(
            "{left} dirty bytes of {} could not be written back {when}: {}; the cache tries once \
             more as it closes the file, and what that cannot write is lost (flush() or close() \
             raise such errors)",
            self.map.path().display(),
            gpumap::error::Report(&e)
        );
        let message = CString::new(message.replace('\0', "")).unwrap_or_default();
        let category = py.get_type::<PyRuntimeWarning>();
        if let Err(raised) = PyErr::warn(py, &category, &message, 1) {
            // Warnings made errors: there is no caller to raise into from here.
            raised.write_unraisable(py, None);
        }
    }
}

/// Every writable map the binding holds, weakly: the interpreter's exit flushes those still
/// alive, which a thread that never ends (a daemon) or a reference cycle never collected keeps
/// from their release.
static WRITABLE: Mutex<Vec<Weak<MapHandle>>> = Mutex::new(Vec::new());

/// Flushes every writable map still alive in this process (run at the interpreter's exit, as
/// a buffered file's data is flushed): writes made through a map that lives on, held by a
/// daemon thread or a cycle, are otherwise never written back. A failure is a
/// `RuntimeWarning`, as at a map's release.
#[pyfunction]
pub fn flush_writable_maps(py: Python<'_>) {
    let open: Vec<Arc<MapHandle>> = WRITABLE.lock().iter().filter_map(Weak::upgrade).collect();
    for handle in open {
        if !handle.map.is_inherited() {
            handle.flush_or_warn(py, "at the interpreter's exit");
        }
    }
}

impl Drop for MapHandle {
    fn drop(&mut self) {
        // A forked child's copy of its parent's map (a view made before the fork, let go in
        // the child): its dirty bytes are the parent's to write back, and may be older than
        // what the parent has written since.
        if !self.map.is_writable() || self.map.is_inherited() {
            return;
        }
        if self.map.stats().dirty_bytes == 0 {
            return;
        }
        // The last holder may be a DLPack deleter run by a consumer without the GIL. Past the
        // interpreter's exit, which flushed every writable map, the library's own drop flushes
        // what is left and logs a failure.
        crate::interpreter::attach_unless_exiting(|py| {
            self.flush_or_warn(py, "when its last MappedFile and views were released")
        });
    }
}
