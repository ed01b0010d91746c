//! Offsets, lengths and sizes taken from Python as `u64`, refused by name when out of range.
//! PyO3's own `u64` raises `OverflowError("can't convert negative int to unsigned")` for `-1`:
//! not the `ValueError` the API documents, and naming neither the argument nor the value.

use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;

/// `ob` as a `u64`; a negative int, or one past `u64`, is a `ValueError` naming `name` and the
/// value. Anything else that is not an int keeps PyO3's `TypeError`, which names the argument.
pub(crate) fn count(name: &str, ob: &Bound<'_, PyAny>) -> PyResult<u64> {
    match ob.extract::<u64>() {
        Ok(value) => Ok(value),
        Err(e) if e.is_instance_of::<PyOverflowError>(ob.py()) => {
            let shown = ob.repr().map(|r| r.to_string()).unwrap_or_default();
            let why = match ob.lt(0) {
                Ok(true) => "is negative",
                _ => "is past the largest value, 2**64 - 1",
            };
            Err(PyValueError::new_err(format!("{name} {shown} {why}")))
        }
        Err(e) => Err(e),
    }
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
