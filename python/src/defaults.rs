//! The process-wide defaults behind `gpumapio.defaults` (KvikIO's `kvikio.defaults`).
//!
//! They start from gpumap's configuration — `GPUMAP_*` variables, `KVIKIO_*` accepted as
//! aliases — and change through `defaults.set`. A `CuFile` takes compat mode, bounce buffer size
//! and the `O_DIRECT` settings when it is opened; task size and GDS threshold at each call (as
//! KvikIO does); the thread count is the size of the one shared pool, resized in place.

use std::sync::Mutex;

use gpumap::align::PAGE_SIZE as PAGE;
use gpumap::config::{CompatMode, Config, DirectRead, MAX_THREADS};
use gpumap::io::{HandleOptions, IoPool};
use pyo3::exceptions::{PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

use crate::errors::check;

/// The settings that are not the pool's size.
#[derive(Clone, Copy)]
pub struct Settings {
    pub compat_mode: CompatMode,
    pub task_size: u64,
    pub gds_threshold: u64,
    pub bounce_buffer_size: u64,
    pub direct_io_read: DirectRead,
    pub direct_io_write: bool,
}

static SETTINGS: Mutex<Option<Settings>> = Mutex::new(None);

/// The current settings (read from the environment on first use).
pub fn current() -> gpumap::Result<Settings> {
    let mut guard = SETTINGS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = *guard {
        return Ok(s);
    }
    let c = Config::global()?;
    let s = Settings {
        compat_mode: c.compat_mode,
        task_size: c.task_size,
        gds_threshold: c.gds_threshold,
        bounce_buffer_size: c.bounce_buffer_size,
        direct_io_read: c.direct_io_read,
        direct_io_write: c.direct_io_write,
    };
    *guard = Some(s);
    Ok(s)
}

fn update(change: impl FnOnce(&mut Settings)) -> gpumap::Result<()> {
    let mut s = current()?;
    change(&mut s);
    *SETTINGS.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
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
pub const NAMES: [&str; 7] = [
    "compat_mode",
    "num_threads",
    "task_size",
    "gds_threshold",
    "bounce_buffer_size",
    "auto_direct_io_read",
    "auto_direct_io_write",
];

fn unknown(name: &str) -> PyErr {
    PyKeyError::new_err(format!(
        "{name:?} is not a setting gpumapio knows; the settings are {} (KvikIO's http_* \
         settings are for remote files, which gpumap does not read)",
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
        other => return Err(unknown(other)),
    })
}

/// An int setting in `least..=most`: a bool or any other type is a `TypeError`, a value
/// outside the range a `ValueError` naming the bound it crosses. Compared as Python ints, so a
/// value of any size gets the same message (never an `OverflowError`).
fn size_value(name: &str, value: &Bound<'_, PyAny>, least: u64, most: u64) -> PyResult<u64> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int, not {}",
            value.get_type().name()?
        )));
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
            let n = size_value(name, value, PAGE, u64::MAX - (PAGE - 1))?;
            if n % PAGE != 0 {
                return Err(PyValueError::new_err(format!(
                    "bounce_buffer_size {n}: must be a multiple of 4096 (bounce buffers are used \
                     for O_DIRECT)"
                )));
            }
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
