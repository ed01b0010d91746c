//! The process-wide defaults behind `gpumapio.defaults` (KvikIO's `kvikio.defaults`).
//!
//! They start from gpumap's configuration — `GPUMAP_*` variables, `KVIKIO_*` accepted as
//! aliases — and change through `defaults.set`. A `CuFile` takes compat mode, bounce buffer size
//! and the `O_DIRECT` settings when it is opened; task size and GDS threshold at each call (as
//! KvikIO does); the thread count is the size of the one shared pool, resized in place.
//!
//! Bad values raise what KvikIO 26.x raises, with its key phrases, so that code written for it
//! keeps working: a wrong type is a `TypeError` ("incorrect type"), a zero count or size a
//! `ValueError` ("must be a positive integer"), a negative one an `OverflowError` ("can't
//! convert negative value"), a value beyond 64 bits an `OverflowError` ("too large to
//! convert"). gpumap's own limits (1024 threads) are `ValueError`s naming the limit.
//!
//! The `http_*` settings (KvikIO's remote-file retries and timeout) are kept here, with KvikIO's
//! defaults and `KVIKIO_HTTP_*` variables (`GPUMAP_HTTP_*` win), for the remote-file readers.

use gpumap::config::{CompatMode, Config, DirectRead, MAX_THREADS};
use gpumap::io::{HandleOptions, IoPool};
use parking_lot::Mutex;
use pyo3::exceptions::{PyKeyError, PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyString};

use crate::errors::check;

/// The settings that are not the pool's size.
#[derive(Clone, Debug)]
pub struct Settings {
    pub compat_mode: CompatMode,
    pub task_size: u64,
    pub gds_threshold: u64,
    /// As set (any size above zero); files round it up to whole pages when they open.
    pub bounce_buffer_size: u64,
    pub direct_io_read: DirectRead,
    pub direct_io_write: bool,
    /// Attempts of one remote request before its error is raised (KvikIO: 3).
    pub http_max_attempts: u64,
    /// HTTP statuses that are retried (KvikIO: 429, 500, 502, 503, 504).
    pub http_status_codes: Vec<i32>,
    /// Seconds one remote request may take (KvikIO: 60).
    pub http_timeout: u64,
}

/// KvikIO's defaults for the remote settings.
const HTTP_MAX_ATTEMPTS: u64 = 3;
const HTTP_STATUS_CODES: [i32; 5] = [429, 500, 502, 503, 504];
const HTTP_TIMEOUT: u64 = 60;

/// The value of `GPUMAP_<name>`, else of `KVIKIO_<name>`, with the variable's name.
fn variable(name: &str) -> Option<(String, String)> {
    ["GPUMAP_", "KVIKIO_"].iter().find_map(|prefix| {
        let var = format!("{prefix}{name}");
        std::env::var(&var).ok().map(|value| (var, value))
    })
}

fn invalid_variable(var: String, value: String, reason: &str) -> gpumap::Error {
    gpumap::Error::InvalidConfig { var, value, reason: reason.to_string() }
}

/// A positive whole number from the environment, or `default`.
fn positive_variable(name: &str, default: u64) -> gpumap::Result<u64> {
    match variable(name) {
        None => Ok(default),
        Some((var, value)) => match value.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(invalid_variable(var, value, "expected a positive integer")),
        },
    }
}

/// Status codes from the environment (`"429,500,503"`), or KvikIO's.
fn status_codes_variable() -> gpumap::Result<Vec<i32>> {
    match variable("HTTP_STATUS_CODES") {
        None => Ok(HTTP_STATUS_CODES.to_vec()),
        Some((var, value)) => value
            .split(',')
            .map(|code| code.trim().parse::<i32>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| invalid_variable(var, value, "expected integers separated by commas")),
    }
}

static SETTINGS: Mutex<Option<Settings>> = Mutex::new(None);

/// The current settings (read from the environment on first use).
pub fn current() -> gpumap::Result<Settings> {
    let mut guard = SETTINGS.lock();
    if let Some(s) = &*guard {
        return Ok(s.clone());
    }
    let c = Config::global()?;
    let s = Settings {
        compat_mode: c.compat_mode,
        task_size: c.task_size,
        gds_threshold: c.gds_threshold,
        bounce_buffer_size: c.bounce_buffer_size,
        direct_io_read: c.direct_io_read,
        direct_io_write: c.direct_io_write,
        http_max_attempts: positive_variable("HTTP_MAX_ATTEMPTS", HTTP_MAX_ATTEMPTS)?,
        http_status_codes: status_codes_variable()?,
        http_timeout: positive_variable("HTTP_TIMEOUT", HTTP_TIMEOUT)?,
    };
    *guard = Some(s.clone());
    Ok(s)
}

fn update(change: impl FnOnce(&mut Settings)) -> gpumap::Result<()> {
    let mut s = current()?;
    change(&mut s);
    *SETTINGS.lock() = Some(s);
    Ok(())
}

/// Options for opening a file with the current settings.
pub fn handle_options() -> gpumap::Result<HandleOptions> {
    let s = current()?;
    let mut o = gpumap::io::FileHandle::options()?;
    o.compat_mode(s.compat_mode)
        .task_size(s.task_size)
        .gds_threshold(s.gds_threshold)
        .bounce_buffer_size(s.bounce_buffer_size)
        .direct_read(s.direct_io_read)
        .direct_write(s.direct_io_write);
    Ok(o)
}

/// The names `get` and `set` know, in KvikIO's spelling.
pub const NAMES: [&str; 10] = [
    "compat_mode",
    "num_threads",
    "task_size",
    "gds_threshold",
    "bounce_buffer_size",
    "auto_direct_io_read",
    "auto_direct_io_write",
    "http_max_attempts",
    "http_status_codes",
    "http_timeout",
];

fn unknown(name: &str) -> PyErr {
    PyKeyError::new_err(format!(
        "{name:?} is not a setting gpumapio knows; the settings are {}",
        NAMES.join(", ")
    ))
}

fn compat_mode_number(mode: CompatMode) -> u8 {
    // KvikIO's CompatMode values.
    match mode {
        CompatMode::Off => 0,
        CompatMode::On => 1,
        CompatMode::Auto => 2,
    }
}

/// `defaults.get(name)`: compat mode as its KvikIO number (wrapped into `CompatMode` in Python),
/// sizes and counts as ints, `O_DIRECT` reads as a bool or `"uncached"`.
#[pyfunction]
pub fn defaults_get(py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
    let s = check(py, current())?;
    Ok(match name {
        "compat_mode" => compat_mode_number(s.compat_mode).into_pyobject(py)?.into_any().unbind(),
        "num_threads" => {
            check(py, IoPool::global())?.nthreads().into_pyobject(py)?.into_any().unbind()
        }
        "task_size" => s.task_size.into_pyobject(py)?.into_any().unbind(),
        "gds_threshold" => s.gds_threshold.into_pyobject(py)?.into_any().unbind(),
        "bounce_buffer_size" => s.bounce_buffer_size.into_pyobject(py)?.into_any().unbind(),
        "auto_direct_io_read" => match s.direct_io_read {
            DirectRead::Uncached => "uncached".into_pyobject(py)?.into_any().unbind(),
            other => PyBool::new(py, other == DirectRead::On).to_owned().into_any().unbind(),
        },
        "auto_direct_io_write" => PyBool::new(py, s.direct_io_write).to_owned().into_any().unbind(),
        "http_max_attempts" => s.http_max_attempts.into_pyobject(py)?.into_any().unbind(),
        "http_status_codes" => PyList::new(py, &s.http_status_codes)?.into_any().unbind(),
        "http_timeout" => s.http_timeout.into_pyobject(py)?.into_any().unbind(),
        other => return Err(unknown(other)),
    })
}

/// An int setting in `least..=most`, raising what KvikIO raises where it refuses the value too
/// (see the module's documentation); `most` is gpumap's own limit, a `ValueError` naming it.
/// Compared as Python ints, so a value of any size gets its message.
fn size_value(name: &str, value: &Bound<'_, PyAny>, least: u64, most: u64) -> PyResult<u64> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{name} has incorrect type (expected int, got {})",
            value.get_type().name()?
        )));
    }
    if value.lt(0)? {
        return Err(PyOverflowError::new_err(format!(
            "{name} {value}: can't convert negative value to an unsigned size"
        )));
    }
    if value.gt(u64::MAX)? {
        return Err(PyOverflowError::new_err(format!(
            "{name} {value} is too large to convert to a 64-bit size (at most {most})"
        )));
    }
    if least == 1 && value.eq(0)? {
        return Err(PyValueError::new_err(format!("{name} must be a positive integer, got 0")));
    }
    if value.lt(least)? {
        return Err(PyValueError::new_err(format!("{name} must be at least {least}, got {value}")));
    }
    if value.gt(most)? {
        return Err(PyValueError::new_err(format!(
            "{name} {value} is too large: at most {most}{}",
            if name == "num_threads" { " (gpumap's limit on I/O threads)" } else { "" }
        )));
    }
    value.extract()
}

/// KvikIO's `http_timeout` is a signed count of seconds: zero and negative values are both a
/// `ValueError` ("must be a positive integer").
fn seconds_value(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if value.is_instance_of::<PyInt>() && !value.is_instance_of::<PyBool>() && value.le(0)? {
        return Err(PyValueError::new_err(format!(
            "{name} must be a positive integer, got {value}"
        )));
    }
    size_value(name, value, 1, u64::MAX)
}

/// A list of ints (HTTP statuses), each fitting a C int as KvikIO's do; anything else is a
/// `TypeError` (an `OverflowError` for an int too large).
fn status_codes_value(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Vec<i32>> {
    let list = value.cast::<PyList>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} has incorrect type (expected list of int, got {})",
            value.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        ))
    })?;
    list.iter()
        .map(|code| {
            if code.is_instance_of::<PyBool>() || !code.is_instance_of::<PyInt>() {
                return Err(PyTypeError::new_err(format!(
                    "{name} has incorrect type (expected list of int, holds {})",
                    code.get_type().name()?
                )));
            }
            code.extract::<i32>().map_err(|_| {
                PyOverflowError::new_err(format!(
                    "{name}: status {code} is too large to convert to a C int"
                ))
            })
        })
        .collect()
}

/// `value` as a small int, if it is an int (not a bool) that fits; `None` for ints of any size
/// outside `i64` (which are then out of range, whatever the setting).
fn small_int(value: &Bound<'_, PyAny>) -> Option<i64> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return None;
    }
    value.extract().ok()
}

/// What a bool setting takes.
const BOOL: &str = "a bool, 0 or 1, or a string such as \"on\" or \"off\"";

/// A bool setting; `expected` says what it takes, in its errors.
fn bool_value(name: &str, value: &Bound<'_, PyAny>, expected: &str) -> PyResult<bool> {
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(b.is_true());
    }
    if let Ok(s) = value.cast::<PyString>() {
        return gpumap::config::parse_bool(&s.to_cow()?)
            .map_err(|e| PyValueError::new_err(format!("{name}: {e}")));
    }
    if value.is_instance_of::<PyInt>() {
        return match small_int(value) {
            Some(n @ (0 | 1)) => Ok(n == 1),
            _ => Err(PyValueError::new_err(format!("{name} must be {expected}, got {value}"))),
        };
    }
    Err(PyTypeError::new_err(format!(
        "{name} must be {expected}, not {}",
        value.get_type().name()?
    )))
}

fn compat_mode_value(value: &Bound<'_, PyAny>) -> PyResult<CompatMode> {
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(if b.is_true() { CompatMode::On } else { CompatMode::Off });
    }
    if value.is_instance_of::<PyInt>() {
        // KvikIO's numbers (CompatMode is an IntEnum: OFF=0, ON=1, AUTO=2).
        return match small_int(value) {
            Some(0) => Ok(CompatMode::Off),
            Some(1) => Ok(CompatMode::On),
            Some(2) => Ok(CompatMode::Auto),
            _ => Err(PyValueError::new_err(format!(
                "compat_mode {value}: expected CompatMode.OFF (0), ON (1) or AUTO (2)"
            ))),
        };
    }
    if let Ok(s) = value.cast::<PyString>() {
        return s
            .to_cow()?
            .parse()
            .map_err(|e: String| PyValueError::new_err(format!("compat_mode: {e}")));
    }
    Err(PyTypeError::new_err(format!(
        "compat_mode must be a CompatMode, bool or str, not {}",
        value.get_type().name()?
    )))
}

/// `defaults.set(name, value)` for one setting; the Python side keeps the old values for the
/// context manager.
#[pyfunction]
pub fn defaults_set(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    match name {
        "compat_mode" => {
            let mode = compat_mode_value(value)?;
            check(py, update(|s| s.compat_mode = mode))
        }
        "num_threads" => {
            let n = size_value(name, value, 1, MAX_THREADS as u64)?;
            let pool = check(py, IoPool::global())?;
            crate::errors::nogil(py, move || pool.set_nthreads(n as usize))
        }
        "task_size" => {
            let n = size_value(name, value, 1, u64::MAX)?;
            check(py, update(|s| s.task_size = n))
        }
        "gds_threshold" => {
            let n = size_value(name, value, 0, u64::MAX)?;
            check(py, update(|s| s.gds_threshold = n))
        }
        "bounce_buffer_size" => {
            // Any size above zero, as KvikIO takes it; files round it up to whole pages (what
            // `O_DIRECT` needs) when they open. The ceiling leaves room for that rounding.
            let n = size_value(name, value, 1, u64::MAX - 4095)?;
            check(py, update(|s| s.bounce_buffer_size = n))
        }
        "auto_direct_io_read" => {
            let policy = match value.cast::<PyString>() {
                Ok(s) => s
                    .to_cow()?
                    .parse::<DirectRead>()
                    .map_err(|e| PyValueError::new_err(format!("auto_direct_io_read: {e}")))?,
                Err(_) => {
                    let expected =
                        "a bool, 0 or 1, or a string such as \"on\", \"off\" or \"uncached\"";
                    if bool_value(name, value, expected)? {
                        DirectRead::On
                    } else {
                        DirectRead::Off
                    }
                }
            };
            check(py, update(|s| s.direct_io_read = policy))
        }
        "auto_direct_io_write" => {
            let on = bool_value(name, value, BOOL)?;
            check(py, update(|s| s.direct_io_write = on))
        }
        "http_max_attempts" => {
            let n = size_value(name, value, 1, u64::MAX)?;
            check(py, update(|s| s.http_max_attempts = n))
        }
        "http_status_codes" => {
            let codes = status_codes_value(name, value)?;
            check(py, update(move |s| s.http_status_codes = codes))
        }
        "http_timeout" => {
            let n = seconds_value(name, value)?;
            check(py, update(|s| s.http_timeout = n))
        }
        other => Err(unknown(other)),
    }
}

/// Whether the POSIX path is what a file opened now would use for device transfers: compat mode
/// on, or auto where cuFile would run only its own compatibility path (KvikIO's
/// `is_compat_mode_preferred`).
#[pyfunction]
pub fn is_compat_mode_preferred(py: Python<'_>) -> PyResult<bool> {
    let s = check(py, current())?;
    Ok(match s.compat_mode {
        CompatMode::On => true,
        CompatMode::Off => false,
        CompatMode::Auto => py.detach(|| {
            let usable = gpumap::Capabilities::probe().cufile_usable().is_ok();
            let gds = usable
                && gpumap::io::gds::CuFileDriver::get()
                    .ok()
                    .and_then(|d| d.properties().copied())
                    .is_some_and(|p| p.nvfs_version != (0, 0));
            !gds
        }),
    })
}
