//! The process-wide defaults behind `gpumapio.defaults` (KvikIO's `kvikio.defaults`).
//!
//! They start from gpumap's configuration — `GPUMAP_*` variables, `KVIKIO_*` accepted as
//! aliases — and change through `defaults.set`. A `CuFile` takes compat mode, bounce buffer size
//! and the `O_DIRECT` settings when it is opened; task size and GDS threshold at each call (as
//! KvikIO does); the thread count is the size of the one shared pool, resized in place.
//!
//! Values are taken as KvikIO 26.10's bindings take them (probed on the GPU machine): an int
//! setting takes any int, a bool as 0 or 1, NumPy's integers, and a float truncated toward zero
//! (`4.7` is 4; NaN a `ValueError`, infinity an `OverflowError`, as `int()` raises); a list of
//! statuses takes the same in a `list`. Where KvikIO takes any object's truth (the `O_DIRECT`
//! switches: `"off"` is true there), gpumap takes bools, 0 and 1, and words it knows, and
//! refuses the rest by name.
//!
//! Bad values raise what KvikIO 26.x raises, with its key phrases, so that code written for it
//! keeps working: a wrong type is a `TypeError` ("incorrect type"), a zero count or size a
//! `ValueError` ("must be a positive integer"), a negative one an `OverflowError` ("can't
//! convert negative value"), a value beyond 64 bits an `OverflowError` ("too large to
//! convert"). gpumap's own limits (1024 threads) are `ValueError`s naming the limit.
//!
//! Every name, variable and default comes from the library's one table of settings
//! (`gpumap::config::SETTINGS`), exposed as `_native.settings_table()`; the `http_*` settings
//! (KvikIO's remote-file retries and timeout) are rows of it like the others.

use gpumap::config::{CompatMode, Config, DirectRead, Source, MAX_THREADS, SETTINGS};
use gpumap::io::{HandleOptions, IoPool};
use gpumap::sync::Mutex;
use pyo3::exceptions::{PyKeyError, PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyInt, PyList, PyString};

use crate::errors::check;

/// The settings: the library's [`Config`] (all of [`SETTINGS`], read from the environment by
/// its table) with what `defaults.set` changed, each change recorded as [`Source::Set`] so that
/// automatic choices leave it alone. The thread count lives in the pool itself.
pub type Settings = Config;

static SETTINGS_NOW: Mutex<Option<Settings>> = Mutex::new(None);

/// The current settings (read from the environment on first use).
pub fn current() -> gpumap::Result<Settings> {
    let mut guard = SETTINGS_NOW.lock();
    if let Some(s) = &*guard {
        return Ok(s.clone());
    }
    let s = Config::global()?.clone();
    *guard = Some(s.clone());
    Ok(s)
}

/// Runs `change` on the current settings in place, under one lock, so that no other thread's
/// change in between is lost.
fn change_current(change: impl FnOnce(&mut Settings)) -> gpumap::Result<()> {
    current()?;
    if let Some(s) = SETTINGS_NOW.lock().as_mut() {
        change(s);
    }
    Ok(())
}

/// Changes the setting `field` by `change`, marking it set by the program.
fn update(field: &str, change: impl FnOnce(&mut Settings)) -> gpumap::Result<()> {
    change_current(|s| {
        change(s);
        s.set_source(field, Source::Set);
    })
}

/// Options for opening a file with the current settings; those neither in the environment nor
/// set may be tuned for the file's file system when it opens.
pub fn handle_options() -> gpumap::Result<HandleOptions> {
    Ok(HandleOptions::from_config(&current()?))
}

/// The names `get` and `set` know, in KvikIO's spelling: the table's.
pub fn names() -> Vec<&'static str> {
    SETTINGS.iter().map(|spec| spec.name).collect()
}

/// `_native.settings_table()`: the library's one table of settings, one dict per setting with
/// its `name`, `field`, `env`, `alias`, `default`, `scope` and `doc`, for `gpumapio.defaults`
/// to build its names and documentation from.
#[pyfunction]
pub fn settings_table(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let rows = PyList::empty(py);
    for spec in &SETTINGS {
        let row = PyDict::new(py);
        row.set_item("name", spec.name)?;
        row.set_item("field", spec.field)?;
        row.set_item("env", spec.env)?;
        row.set_item("alias", spec.alias)?;
        row.set_item("default", spec.default)?;
        row.set_item("scope", format!("{:?}", spec.scope).to_lowercase())?;
        row.set_item("doc", spec.doc)?;
        rows.append(row)?;
    }
    Ok(rows)
}

fn unknown(name: &str) -> PyErr {
    PyKeyError::new_err(format!(
        "{name:?} is not a setting gpumapio knows; the settings are {}",
        names().join(", ")
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

/// `value` as the Python int KvikIO's bindings make of it: an int as it is (a bool is one),
/// an object with `__index__` (NumPy's integers) through it, a number with `__int__` (a float)
/// truncated toward zero by `int()`, whose own errors (NaN, infinity) pass on. `None` for
/// anything else: strings, `None`, containers.
fn kvikio_int<'py>(value: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    if value.is_instance_of::<PyInt>() {
        return Ok(Some(value.clone()));
    }
    if value.is_instance_of::<PyString>() || value.is_instance_of::<PyBytes>() {
        return Ok(None);
    }
    if value.hasattr("__index__")? {
        return value.py().import("operator")?.call_method1("index", (value,)).map(Some);
    }
    if value.hasattr("__int__")? {
        return value.py().import("builtins")?.getattr("int")?.call1((value,)).map(Some);
    }
    Ok(None)
}

/// An int setting in `least..=most`, raising what KvikIO raises where it refuses the value too
/// (see the module's documentation); `most` is gpumap's own limit, a `ValueError` naming it.
/// Compared as Python ints, so a value of any size gets its message.
fn size_value(name: &str, value: &Bound<'_, PyAny>, least: u64, most: u64) -> PyResult<u64> {
    let taken = named_int(name, value)?;
    let Some(value) = taken else {
        return Err(PyTypeError::new_err(format!(
            "{name} has incorrect type (expected int, got {})",
            value.get_type().name()?
        )));
    };
    let value = &value;
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

/// [`kvikio_int`], its failures naming the setting: `int(nan)` and `int(inf)` name none.
fn named_int<'py>(name: &str, value: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    kvikio_int(value).map_err(|e| {
        let py = value.py();
        PyErr::from_type(e.get_type(py), format!("{name} {value}: {}", e.value(py)))
    })
}

/// KvikIO's `http_timeout` is a signed count of seconds: zero and negative values are both a
/// `ValueError` ("must be a positive integer").
fn seconds_value(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    // Not a number: `size_value`'s TypeError, naming the type given.
    let Some(n) = named_int(name, value)? else { return size_value(name, value, 1, u64::MAX) };
    if n.le(0)? {
        return Err(PyValueError::new_err(format!("{name} must be a positive integer, got {n}")));
    }
    size_value(name, &n, 1, u64::MAX)
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
        .map(|item| {
            let Some(code) = kvikio_int(&item)? else {
                return Err(PyTypeError::new_err(format!(
                    "{name} has incorrect type (expected list of int, holds {})",
                    item.get_type().name()?
                )));
            };
            code.extract::<i32>().map_err(|_| {
                PyOverflowError::new_err(format!(
                    "{name}: status {code} is too large to convert to a C int"
                ))
            })
        })
        .collect()
}

/// `value` as a small int, if it is a number other than a bool or a string (see
/// [`kvikio_int`]) whose int fits; `Ok(None)` for other types, `Err` where `int()` refuses it;
/// `Some(None)` for ints outside `i64` (which are then out of range, whatever the setting).
fn small_int(value: &Bound<'_, PyAny>) -> PyResult<Option<Option<i64>>> {
    if value.is_instance_of::<PyBool>() {
        return Ok(None);
    }
    Ok(kvikio_int(value)?.map(|n| n.extract().ok()))
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
    // A number is 0 or 1 exactly (a float too): KvikIO's truth of 0.5 or 7 is no answer here.
    if let Some(n) = small_int(value)? {
        return match n {
            Some(n @ (0 | 1)) if value.eq(n)? => Ok(n == 1),
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
    // KvikIO's numbers (CompatMode is an IntEnum: OFF=0, ON=1, AUTO=2), a float truncated.
    if let Some(n) = small_int(value)? {
        return match n {
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

/// `(value, kind, variable)` of the setting `name`: its value as `defaults_get` gives it and
/// where it came from (`"default"`, `"env"` with the variable's name, or `"set"`), so that
/// `defaults.set`'s context manager puts back both: a setting restored to its default is again
/// left to automatic choices.
#[pyfunction]
pub fn defaults_saved(
    py: Python<'_>,
    name: &str,
) -> PyResult<(Py<PyAny>, &'static str, Option<String>)> {
    let value = defaults_get(py, name)?;
    let field = gpumap::config::setting(name).ok_or_else(|| unknown(name))?.field;
    Ok(match check(py, current())?.source(field) {
        Source::Default => (value, "default", None),
        Source::Env(var) => (value, "env", Some(var)),
        Source::Set => (value, "set", None),
    })
}

/// Puts back what [`defaults_saved`] gave: the value, through `defaults_set`'s checks, then
/// where it came from.
#[pyfunction]
#[pyo3(signature = (name, value, kind, var=None))]
pub fn defaults_put_back(
    py: Python<'_>,
    name: &str,
    value: &Bound<'_, PyAny>,
    kind: &str,
    var: Option<String>,
) -> PyResult<()> {
    let source = match (kind, var) {
        ("default", None) => Source::Default,
        ("env", Some(var)) => Source::Env(var),
        ("set", None) => Source::Set,
        (kind, var) => {
            return Err(PyValueError::new_err(format!(
                "{name}: {kind:?} with {var:?} is not a source defaults_saved gives"
            )))
        }
    };
    defaults_set(py, name, value)?;
    let field = gpumap::config::setting(name).ok_or_else(|| unknown(name))?.field;
    check(py, change_current(|s| s.set_source(field, source)))
}

/// `defaults.set(name, value)` for one setting; the Python side keeps the old values for the
/// context manager.
#[pyfunction]
pub fn defaults_set(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    match name {
        "compat_mode" => {
            let mode = compat_mode_value(value)?;
            check(py, update("compat_mode", |s| s.compat_mode = mode))
        }
        "num_threads" => {
            let n = size_value(name, value, 1, MAX_THREADS as u64)?;
            let pool = check(py, IoPool::global())?;
            crate::errors::nogil(py, move || pool.set_nthreads(n as usize))?;
            check(py, update("nthreads", |s| s.nthreads = n as usize))
        }
        "task_size" => {
            let n = size_value(name, value, 1, u64::MAX)?;
            check(py, update("task_size", |s| s.task_size = n))
        }
        "gds_threshold" => {
            let n = size_value(name, value, 0, u64::MAX)?;
            check(py, update("gds_threshold", |s| s.gds_threshold = n))
        }
        "bounce_buffer_size" => {
            // Any size above zero, as KvikIO takes it; files round it up to whole pages (what
            // `O_DIRECT` needs) when they open. The ceiling leaves room for that rounding.
            let n = size_value(name, value, 1, gpumap::config::MAX_BOUNCE_BUFFER_SIZE)?;
            check(py, update("bounce_buffer_size", |s| s.bounce_buffer_size = n))
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
            check(py, update("direct_io_read", |s| s.direct_io_read = policy))
        }
        "auto_direct_io_write" => {
            let on = bool_value(name, value, BOOL)?;
            check(py, update("direct_io_write", |s| s.direct_io_write = on))
        }
        "http_max_attempts" => {
            let n = size_value(name, value, 1, u64::MAX)?;
            check(py, update("http_max_attempts", |s| s.http_max_attempts = n))
        }
        "http_status_codes" => {
            let codes = status_codes_value(name, value)?;
            check(py, update("http_status_codes", move |s| s.http_status_codes = codes))
        }
        "http_timeout" => {
            let n = seconds_value(name, value)?;
            check(py, update("http_timeout", |s| s.http_timeout = n))
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
