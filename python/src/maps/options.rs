//! Python arguments of the map classes turned into the library's options: the device, the
//! options a map is opened with, and madvise-like advice.

use gpumap::mapped::{Advice, ZeroCopy};
use gpumap::memory::Device;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBool;

use crate::errors::check;

/// `device`: `None`/`"auto"` (GPU 0 where there is one), an ordinal, or `"host"`.
pub(super) fn device_arg(device: Option<&Bound<'_, PyAny>>) -> PyResult<Device> {
    let Some(device) = device else { return Ok(Device::auto()) };
    if let Ok(ordinal) = device.extract::<usize>() {
        return check(device.py(), Device::cuda(ordinal));
    }
    if let Ok(number) = device.extract::<i128>() {
        return Err(PyValueError::new_err(format!(
            "device {number}: a GPU ordinal is 0 or more (or \"cuda:N\", \"host\", \"auto\")"
        )));
    }
    let Ok(name) = device.extract::<String>() else {
        return Err(PyTypeError::new_err(format!(
            "device {}: expected a GPU ordinal, \"cuda:N\", \"host\" or \"auto\"",
            device.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".to_owned())
        )));
    };
    match name.as_str() {
        "auto" => Ok(Device::auto()),
        "host" | "cpu" => Ok(Device::Host),
        other => match other.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
            Some(ordinal) => check(device.py(), Device::cuda(ordinal)),
            None => Err(PyValueError::new_err(format!(
                "device {other:?}: expected a GPU ordinal, \"cuda:N\", \"host\" or \"auto\""
            ))),
        },
    }
}

/// What both ways of opening a map take (`DeviceCache.open`, `MappedFile.open`).
/// `zero_copy`: `None`/`False`, `True`, or `"misses"` (the cache in front of the tier).
pub(super) fn map_options(
    writable: bool,
    advice: &str,
    zero_copy: Option<&Bound<'_, PyAny>>,
    max_pinned: Option<u64>,
    read_ahead: Option<u64>,
) -> PyResult<gpumap::mapped::MapOptions> {
    let mut o = gpumap::mapped::MapOptions::new();
    o.writable(writable).advice(advice_arg(advice)?);
    let mode = match zero_copy {
        None => None,
        Some(v) if v.is_instance_of::<PyBool>() => v.extract::<bool>()?.then_some(false),
        Some(v) if v.extract::<String>().is_ok_and(|s| s == "misses") => Some(true),
        Some(v) => {
            return Err(PyValueError::new_err(format!(
                "zero_copy {}: expected True, False or \"misses\"",
                v.repr()?
            )))
        }
    };
    o.zero_copy(match (mode, max_pinned) {
        (None, _) => ZeroCopy::Off,
        (Some(false), None) => ZeroCopy::On,
        (Some(false), Some(bytes)) => ZeroCopy::Within(bytes),
        (Some(true), None) => ZeroCopy::Misses,
        (Some(true), Some(bytes)) => ZeroCopy::MissesWithin(bytes),
    });
    if let Some(bytes) = read_ahead {
        o.read_ahead(bytes);
    }
    Ok(o)
}

pub(super) fn advice_arg(advice: &str) -> PyResult<Advice> {
    Ok(match advice {
        "normal" => Advice::Normal,
        "sequential" => Advice::Sequential,
        "random" => Advice::Random,
        "willneed" => Advice::WillNeed,
        "dontneed" => Advice::DontNeed,
        other => {
            return Err(PyValueError::new_err(format!(
                "advice {other:?}: expected normal, sequential, random, willneed or dontneed"
            )))
        }
    })
}
