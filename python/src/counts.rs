//! Offsets, lengths and sizes taken from Python as `u64`, refused by name when out of range.
//! PyO3's own `u64` raises `OverflowError("can't convert negative int to unsigned")` for `-1`:
//! naming neither the argument nor the value. gpumap's own calls raise the `ValueError` their
//! API documents; the KvikIO-compatible ones (`CuFile`, `Mmap`, `cufile_driver`) keep the
//! `OverflowError` KvikIO's conversions raise, so that code catching it still does, with the
//! argument and the value named.

use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::PyTypeInfo;

/// `ob` as a `u64`; a negative int, or one past `u64`, is an `E` naming `name` and the value.
/// Anything else that is not an int keeps PyO3's `TypeError`, which names the argument.
fn checked<E: PyTypeInfo>(name: &str, ob: &Bound<'_, PyAny>) -> PyResult<u64> {
    match ob.extract::<u64>() {
        Ok(value) => Ok(value),
        Err(e) if e.is_instance_of::<PyOverflowError>(ob.py()) => {
            let shown = ob.repr().map(|r| r.to_string()).unwrap_or_default();
            let why = match ob.lt(0) {
                Ok(true) => "is negative",
                _ => "is past the largest value, 2**64 - 1",
            };
            Err(PyErr::from_type(E::type_object(ob.py()), format!("{name} {shown} {why}")))
        }
        Err(e) => Err(e),
    }
}

/// [`checked`], raising `ValueError`: gpumap's own calls.
pub(crate) fn count(name: &str, ob: &Bound<'_, PyAny>) -> PyResult<u64> {
    checked::<PyValueError>(name, ob)
}

/// [`checked`], raising `OverflowError`: the KvikIO-compatible calls.
pub(crate) fn kvikio_count(name: &str, ob: &Bound<'_, PyAny>) -> PyResult<u64> {
    checked::<PyOverflowError>(name, ob)
}

/// `None`, or [`count`].
fn count_or_none(name: &str, ob: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    if ob.is_none() {
        return Ok(None);
    }
    count(name, ob).map(Some)
}

/// One function per argument name, for `#[pyo3(from_py_with = ...)]`.
macro_rules! counts {
    ($($function:ident: $name:literal),* $(,)?) => {$(
        pub(crate) fn $function(ob: &Bound<'_, PyAny>) -> PyResult<u64> {
            count($name, ob)
        }
    )*};
}

/// As [`counts`], for arguments that may be `None`.
macro_rules! counts_or_none {
    ($($function:ident: $name:literal),* $(,)?) => {$(
        pub(crate) fn $function(ob: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
            count_or_none($name, ob)
        }
    )*};
}

counts! {
    at: "at",
    offset: "offset",
    length: "length",
    budget: "budget",
    extent_size: "extent_size",
    row_size: "row_size",
}

counts_or_none! {
    length_or_none: "length",
    budget_or_none: "budget",
    frame_size_or_none: "frame_size",
    max_pinned_or_none: "max_pinned",
    read_ahead_or_none: "read_ahead",
}

/// `length` as a `usize`, named as [`count`] names it.
pub(crate) fn length_in_memory(ob: &Bound<'_, PyAny>) -> PyResult<usize> {
    let value = count("length", ob)?;
    usize::try_from(value)
        .map_err(|_| PyValueError::new_err(format!("length {value} does not fit in memory")))
}

/// A list of offsets, each checked as [`count`] checks one, named with its position.
pub(crate) fn offsets(ob: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let mut out = Vec::new();
    for (position, item) in ob.try_iter()?.enumerate() {
        out.push(count(&format!("offsets[{position}]"), &item?)?);
    }
    Ok(out)
}

/// The KvikIO-compatible calls' counts, each raising `OverflowError` (see the module's docs).
pub(crate) mod kvikio {
    use pyo3::exceptions::PyOverflowError;
    use pyo3::prelude::*;

    use super::kvikio_count;

    macro_rules! kvikio_counts {
        ($($function:ident: $name:literal -> $t:ty),* $(,)?) => {$(
            pub(crate) fn $function(ob: &Bound<'_, PyAny>) -> PyResult<$t> {
                let value = kvikio_count($name, ob)?;
                <$t>::try_from(value).map_err(|_| {
                    PyOverflowError::new_err(format!("{} {value} does not fit in memory", $name))
                })
            }
        )*};
    }

    macro_rules! kvikio_counts_or_none {
        ($($function:ident: $name:literal -> $t:ty),* $(,)?) => {$(
            pub(crate) fn $function(ob: &Bound<'_, PyAny>) -> PyResult<Option<$t>> {
                if ob.is_none() {
                    return Ok(None);
                }
                let value = kvikio_count($name, ob)?;
                <$t>::try_from(value).map(Some).map_err(|_| {
                    PyOverflowError::new_err(format!("{} {value} does not fit in memory", $name))
                })
            }
        )*};
    }

    kvikio_counts! {
        offset: "offset" -> u64,
        file_offset: "file_offset" -> u64,
        initial_map_offset: "initial_map_offset" -> u64,
        dev_offset: "dev_offset" -> usize,
        kb: "kb" -> usize,
        threshold_kb: "threshold_kb" -> usize,
        device: "device" -> usize,
    }

    kvikio_counts_or_none! {
        size: "size" -> u64,
        size_in_memory: "size" -> usize,
        task_size: "task_size" -> u64,
        initial_map_size: "initial_map_size" -> u64,
    }

    /// `mode`, permission bits as `open(2)` takes them.
    pub(crate) fn mode(ob: &Bound<'_, PyAny>) -> PyResult<u32> {
        let value = kvikio_count("mode", ob)?;
        u32::try_from(value)
            .map_err(|_| PyOverflowError::new_err(format!("mode {value:#o} is not a file mode")))
    }

    /// `map_flags`, `mmap(2)`'s flags (a C `int`), or `None`.
    pub(crate) fn map_flags(ob: &Bound<'_, PyAny>) -> PyResult<Option<i32>> {
        if ob.is_none() {
            return Ok(None);
        }
        match ob.extract::<i32>() {
            Err(e) if e.is_instance_of::<PyOverflowError>(ob.py()) => {
                let shown = ob.repr().map(|r| r.to_string()).unwrap_or_default();
                Err(PyOverflowError::new_err(format!("map_flags {shown} is not a C int")))
            }
            other => other.map(Some),
        }
    }
}
