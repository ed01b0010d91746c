//! [`MapHandle`]: the binding's hold on a map, shared by its `MappedFile` and its views.

use std::ffi::CString;

use gpumap::mapped::DeviceMappedFile;
use pyo3::exceptions::PyRuntimeWarning;
use pyo3::ffi;
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
    pub(super) fn new(map: DeviceMappedFile) -> MapHandle {
        MapHandle { map }
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
        let dirty = self.map.stats().dirty_bytes;
        // SAFETY: a plain query, valid at any time.
        if dirty == 0 || unsafe { ffi::Py_IsInitialized() } == 0 {
            return; // nothing to lose, or no interpreter left to tell (the library still logs)
        }
        // The last holder may be a DLPack deleter run by a consumer without the GIL.
        Python::attach(|py| {
            let map = self.map.clone();
            let Err(e) = py.detach(move || map.flush()) else { return };
            // A flush fails while an earlier write-back's error sticks, even when it writes
            // everything: only bytes still dirty are worth a warning.
            let left = self.map.stats().dirty_bytes;
            if left == 0 {
                return;
            }
            let message = format!(
                "{left} dirty bytes of {} could not be written back when its last MappedFile and \
                 views were released: {}; the cache tries once more as it closes the file, and \
                 what that cannot write is lost (flush() or close() raise such errors)",
                self.map.path().display(),
                gpumap::error::Report(&e)
            );
            let message = CString::new(message.replace('\0', "")).unwrap_or_default();
            let category = py.get_type::<PyRuntimeWarning>();
            if let Err(raised) = PyErr::warn(py, &category, &message, 1) {
                // Warnings made errors: there is no caller to raise into from here.
                raised.write_unraisable(py, None);
            }
        });
    }
}
