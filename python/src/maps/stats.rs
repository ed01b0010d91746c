//! The library's statistics of a cache and of its files, as the dicts `stats()` returns.

use gpumap::mapped::{CacheStats, FileStats};
use pyo3::prelude::*;
use pyo3::types::PyDict;

pub(super) fn file_stats<'py>(py: Python<'py>, s: &FileStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("len", s.len)?;
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    d.set_item("fault_reads", s.fault_reads)?;
    d.set_item("bytes_faulted", s.bytes_faulted)?;
    d.set_item("rows_read_through", s.rows_read_through)?;
    d.set_item("evictions", s.evictions)?;
    d.set_item("bytes_written_back", s.bytes_written_back)?;
    d.set_item("write_errors", s.write_errors)?;
    d.set_item("resident_bytes", s.resident_bytes)?;
    d.set_item("dirty_bytes", s.dirty_bytes)?;
    d.set_item("frames", s.frames)?;
    d.set_item("slots", s.slots)?;
    Ok(d)
}

pub(super) fn cache_stats<'py>(py: Python<'py>, s: &CacheStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("budget", s.budget)?;
    d.set_item("shards", s.shards)?;
    d.set_item("frame_size", s.frame_size)?;
    d.set_item("extent_size", s.extent_size)?;
    d.set_item("used_bytes", s.used_bytes)?;
    d.set_item("slots_in_use", s.slots_in_use)?;
    d.set_item("files", s.files)?;
    d.set_item("totals", file_stats(py, &s.totals)?)?;
    d.set_item("map_seconds", s.map_seconds)?;
    d.set_item("fault_seconds", s.fault_seconds)?;
    Ok(d)
}
