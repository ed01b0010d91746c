//! The table of settings ([`SETTINGS`]): every name a setting goes by, its default, its
//! meaning, how its text is read and how its value is shown.

use std::fmt;

use super::parse::{check_nthreads, parse_bool, parse_count, parse_size};
use super::values::{Config, MAX_BOUNCE_BUFFER_SIZE};

/// What a setting governs, and so where a change to it takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Each open file: a handle takes it when it opens (`HandleOptions`).
    Handle,
    /// The shared I/O pool: its size.
    Pool,
    /// Remote objects (HTTP, S3): each remote file takes it when it opens.
    Remote,
}

/// A setting's value as shown (by `gpumap info`, and to Python): numbers for counts and sizes,
/// words for modes, a list for status codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingValue {
    /// A count (threads, attempts, seconds).
    Count(u64),
    /// A size in bytes.
    Size(u64),
    /// A mode or a switch, as the words the variables take (`auto`, `on`, `uncached`).
    Word(String),
    /// A list of HTTP statuses.
    Codes(Vec<i32>),
}

impl fmt::Display for SettingValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingValue::Count(n) | SettingValue::Size(n) => write!(f, "{n}"),
            SettingValue::Word(w) => f.write_str(w),
            SettingValue::Codes(codes) => {
                let text: Vec<String> = codes.iter().map(i32::to_string).collect();
                f.write_str(&text.join(","))
            }
        }
    }
}

/// Parses a setting's text into a [`Config`]: `Ok(Some(warning))` where the value is taken
/// but deserves a warning, `Err(reason)` where it is refused.
type Parse = fn(&mut Config, &str) -> std::result::Result<Option<String>, String>;

/// One setting: every name it goes by, its default, what it means, how its text is read and
/// how its value is shown. [`SETTINGS`] lists them all; the environment parsing, the source
/// reporting, `gpumap info` and the Python binding's `defaults` all walk that one list, so a
/// setting added there reaches each of them (and the tests fail where one lags behind).
#[derive(Debug, Clone, Copy)]
pub struct SettingSpec {
    /// KvikIO's Python name (`gpumapio.defaults.get(name)`).
    pub name: &'static str,
    /// The [`Config`] field, also the key of `gpumap info --json`'s settings.
    pub field: &'static str,
    /// The `GPUMAP_*` variable.
    pub env: &'static str,
    /// KvikIO's `KVIKIO_*` variable, read where the `GPUMAP_*` one is unset.
    pub alias: &'static str,
    /// The default, as a reader would write it.
    pub default: &'static str,
    /// A valid value other than the default (for tests and examples).
    pub example: &'static str,
    /// Where a change takes effect.
    pub scope: Scope,
    /// What the setting means, in one line.
    pub doc: &'static str,
    parse: Parse,
    show: fn(&Config) -> SettingValue,
}

impl SettingSpec {
    /// Reads `text` (as the environment variable holds it) into `config`'s field:
    /// `Ok(Some(warning))` where the value is taken with a warning, `Err(reason)` where it is
    /// refused.
    pub fn parse_into(
        &self,
        config: &mut Config,
        text: &str,
    ) -> std::result::Result<Option<String>, String> {
        (self.parse)(config, text)
    }

    /// `config`'s value of this setting.
    pub fn value(&self, config: &Config) -> SettingValue {
        (self.show)(config)
    }
}

/// A size above zero.
fn positive_size(text: &str) -> std::result::Result<u64, String> {
    match parse_size(text)? {
        0 => Err("expected a size above zero".into()),
        n => Ok(n),
    }
}

/// A whole number above zero, without suffixes (KvikIO's remote settings).
fn positive_integer(text: &str) -> std::result::Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a positive integer".into()),
    }
}

/// HTTP statuses separated by commas (`"429,500,503"`).
fn status_codes(text: &str) -> std::result::Result<Vec<i32>, String> {
    text.split(',')
        .map(|code| code.trim().parse::<i32>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| "expected integers separated by commas".into())
}

/// The one table of settings, in the order `gpumap info` shows them.
pub const SETTINGS: [SettingSpec; 10] = [
    SettingSpec {
        name: "compat_mode",
        field: "compat_mode",
        env: "GPUMAP_COMPAT_MODE",
        alias: "KVIKIO_COMPAT_MODE",
        default: "auto",
        example: "on",
        scope: Scope::Handle,
        doc: "on: POSIX path only; off: cuFile or fail; auto: cuFile where it is real GDS",
        parse: |c, text| {
            c.compat_mode = text.parse()?;
            Ok(None)
        },
        show: |c| SettingValue::Word(c.compat_mode.to_string()),
    },
    SettingSpec {
        name: "num_threads",
        field: "nthreads",
        env: "GPUMAP_NTHREADS",
        alias: "KVIKIO_NTHREADS",
        default: "CPUs, at most 16",
        example: "3",
        scope: Scope::Pool,
        doc: "threads of the shared I/O pool, 1 to 1024",
        parse: |c, text| {
            let n = parse_count(text)?;
            let warning = check_nthreads(n)?;
            c.nthreads = n;
            Ok(warning)
        },
        show: |c| SettingValue::Count(c.nthreads as u64),
    },
    SettingSpec {
        name: "task_size",
        field: "task_size",
        env: "GPUMAP_TASK_SIZE",
        alias: "KVIKIO_TASK_SIZE",
        default: "4 MiB",
        example: "1 MiB",
        scope: Scope::Handle,
        doc: "largest piece one task moves; a transfer is split into pieces of this size",
        parse: |c, text| {
            c.task_size = positive_size(text)?;
            Ok(None)
        },
        show: |c| SettingValue::Size(c.task_size),
    },
    SettingSpec {
        name: "gds_threshold",
        field: "gds_threshold",
        env: "GPUMAP_GDS_THRESHOLD",
        alias: "KVIKIO_GDS_THRESHOLD",
        default: "1 MiB",
        example: "64 KiB",
        scope: Scope::Handle,
        doc: "device transfers smaller than this use the POSIX path even where cuFile works",
        parse: |c, text| {
            c.gds_threshold = parse_size(text)?;
            Ok(None)
        },
        show: |c| SettingValue::Size(c.gds_threshold),
    },
    SettingSpec {
        name: "bounce_buffer_size",
        field: "bounce_buffer_size",
        env: "GPUMAP_BOUNCE_BUFFER_SIZE",
        alias: "KVIKIO_BOUNCE_BUFFER_SIZE",
        default: "4 MiB",
        example: "8 MiB",
        scope: Scope::Handle,
        doc: "size of each pinned staging buffer, rounded up to whole pages where a file opens",
        parse: |c, text| {
            // Any other size is taken, rounded up to whole pages where files open.
            let size = positive_size(text)?;
            if size > MAX_BOUNCE_BUFFER_SIZE {
                return Err(format!(
                    "expected at most {MAX_BOUNCE_BUFFER_SIZE} bytes (files round it up to whole pages)"
                ));
            }
            c.bounce_buffer_size = size;
            Ok(None)
        },
        show: |c| SettingValue::Size(c.bounce_buffer_size),
    },
    SettingSpec {
        name: "auto_direct_io_read",
        field: "direct_io_read",
        env: "GPUMAP_AUTO_DIRECT_IO_READ",
        alias: "KVIKIO_AUTO_DIRECT_IO_READ",
        default: "off",
        example: "uncached",
        scope: Scope::Handle,
        doc: "O_DIRECT for the aligned middle of reads: off, on, or uncached",
        parse: |c, text| {
            c.direct_io_read = text.parse()?;
            Ok(None)
        },
        show: |c| SettingValue::Word(c.direct_io_read.to_string()),
    },
    SettingSpec {
        name: "auto_direct_io_write",
        field: "direct_io_write",
        env: "GPUMAP_AUTO_DIRECT_IO_WRITE",
        alias: "KVIKIO_AUTO_DIRECT_IO_WRITE",
        default: "on",
        example: "off",
        scope: Scope::Handle,
        doc: "O_DIRECT for the aligned middle of writes: on or off",
        parse: |c, text| {
            c.direct_io_write = parse_bool(text)?;
            Ok(None)
        },
        show: |c| SettingValue::Word(if c.direct_io_write { "on" } else { "off" }.into()),
    },
    SettingSpec {
        name: "http_max_attempts",
        field: "http_max_attempts",
        env: "GPUMAP_HTTP_MAX_ATTEMPTS",
        alias: "KVIKIO_HTTP_MAX_ATTEMPTS",
        default: "3",
        example: "9",
        scope: Scope::Remote,
        doc: "attempts of one remote request before its error is returned",
        parse: |c, text| {
            c.http_max_attempts = positive_integer(text)?;
            Ok(None)
        },
        show: |c| SettingValue::Count(c.http_max_attempts),
    },
    SettingSpec {
        name: "http_status_codes",
        field: "http_status_codes",
        env: "GPUMAP_HTTP_STATUS_CODES",
        alias: "KVIKIO_HTTP_STATUS_CODES",
        default: "429,500,502,503,504",
        example: "500,503",
        scope: Scope::Remote,
        doc: "HTTP statuses of a remote request that are retried, separated by commas",
        parse: |c, text| {
            c.http_status_codes = status_codes(text)?;
            Ok(None)
        },
        show: |c| SettingValue::Codes(c.http_status_codes.clone()),
    },
    SettingSpec {
        name: "http_timeout",
        field: "http_timeout",
        env: "GPUMAP_HTTP_TIMEOUT",
        alias: "KVIKIO_HTTP_TIMEOUT",
        default: "60",
        example: "7",
        scope: Scope::Remote,
        doc: "seconds one remote request may take",
        parse: |c, text| {
            c.http_timeout = positive_integer(text)?;
            Ok(None)
        },
        show: |c| SettingValue::Count(c.http_timeout),
    },
];

/// The row of [`SETTINGS`] whose Python name or [`Config`] field is `name`.
pub fn setting(name: &str) -> Option<&'static SettingSpec> {
    SETTINGS.iter().find(|s| s.name == name || s.field == name)
}
