//! The settings' values: [`Config`] and the types of its fields. Reading them from the
//! environment is the parent module's; their names, parsers and docs are in `table`.

use std::fmt;
use std::str::FromStr;

use super::parse::parse_bool;

/// Whether to use cuFile (GPUDirect Storage) or the POSIX path. KvikIO's names and semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum CompatMode {
    /// POSIX path only; cuFile is never loaded.
    On,
    /// cuFile only; a file cuFile cannot serve fails to open, with the reason.
    Off,
    /// cuFile where it works, POSIX elsewhere; the reason for each file's choice is recorded.
    #[default]
    Auto,
}

impl FromStr for CompatMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "on" | "true" | "yes" | "1" => Ok(CompatMode::On),
            "off" | "false" | "no" | "0" => Ok(CompatMode::Off),
            "auto" => Ok(CompatMode::Auto),
            _ => Err("expected on, off or auto (or true/false, yes/no, 1/0)".into()),
        }
    }
}

impl fmt::Display for CompatMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CompatMode::On => "on",
            CompatMode::Off => "off",
            CompatMode::Auto => "auto",
        })
    }
}

/// When reads bypass the page cache with `O_DIRECT` (for the page-aligned middle of a task, and
/// where the file system allows it).
///
/// A read from the page cache runs at memory speed; the same read with `O_DIRECT` goes to the
/// disk, many times slower. A read of data that is not
/// cached goes to the disk either way, and `O_DIRECT` then saves the copy through the page
/// cache and leaves the cache to the data that was there. `Uncached` gets both: it asks the
/// kernel how much of each task's range is cached (`cachestat(2)`, one call per task of 1 MiB
/// or more; `mincore` where that is missing) and reads with `O_DIRECT` only where almost
/// nothing is.
///
/// The default is `Off`, as in KvikIO and every buffered tool: a file read twice is read from
/// memory the second time. `Uncached` suits data loaded once, such as a checkpoint: it does not
/// push the rest of the page cache out, but then a second read goes to the disk again, since
/// the first one left nothing in the cache. It is not there for speed: cold reads are bound by
/// the disk either way (docs/decisions/0011-reads-buffered-by-default.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum DirectRead {
    /// Always through the page cache (KvikIO's default).
    #[default]
    Off,
    /// Always `O_DIRECT` where possible (`KVIKIO_AUTO_DIRECT_IO_READ=true`).
    On,
    /// `O_DIRECT` for tasks of which less than an eighth is cached when the task starts, else
    /// buffered. Where the kernel will not say what is cached, buffered. A buffered read sets
    /// off the kernel's read-ahead past its end, so the part of a file that follows a cached
    /// part tends to be read buffered too.
    Uncached,
}

impl FromStr for DirectRead {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "uncached" | "auto" => Ok(DirectRead::Uncached),
            other => match parse_bool(other) {
                Ok(true) => Ok(DirectRead::On),
                Ok(false) => Ok(DirectRead::Off),
                Err(_) => {
                    Err("expected uncached (or auto), true/false, on/off, yes/no or 1/0".into())
                }
            },
        }
    }
}

impl fmt::Display for DirectRead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DirectRead::On => "on",
            DirectRead::Off => "off",
            DirectRead::Uncached => "uncached",
        })
    }
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase", tag = "kind", content = "var"))]
pub enum Source {
    /// The built-in default.
    Default,
    /// An environment variable (its name).
    Env(String),
    /// The program, after the environment was read (Python's `gpumapio.defaults.set`).
    Set,
}

/// gpumap's settings. `Config::default()` is the built-in defaults; [`Config::from_env`] reads
/// the environment on top of them. Each field is one row of [`SETTINGS`](super::SETTINGS).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Config {
    /// cuFile or POSIX.
    pub compat_mode: CompatMode,
    /// Threads of the default I/O pool.
    pub nthreads: usize,
    /// Largest piece one task moves; a transfer is split into pieces of this size.
    pub task_size: u64,
    /// Transfers to device memory smaller than this use the POSIX path even where cuFile works.
    pub gds_threshold: u64,
    /// Size of each pinned bounce buffer of the POSIX path to device memory. 4 MiB, not
    /// KvikIO's 16 MiB: the buffers of all threads together then stay in the CPU's cache, and
    /// warm reads to the GPU were faster (docs/decisions/0005-bounce-buffers-4mib.md).
    pub bounce_buffer_size: u64,
    /// When to read the page-aligned middle of a task with `O_DIRECT`.
    pub direct_io_read: DirectRead,
    /// Write the page-aligned middle of a transfer with `O_DIRECT` where the file system allows.
    pub direct_io_write: bool,
    /// Attempts of one remote request before its error is returned (KvikIO's default: 3).
    pub http_max_attempts: u64,
    /// HTTP statuses of a remote request that are retried (KvikIO's: 429, 500, 502, 503, 504).
    pub http_status_codes: Vec<i32>,
    /// Seconds one remote request may take (KvikIO's default: 60).
    pub http_timeout: u64,
    /// Where each setting came from, by field name.
    pub sources: Vec<(&'static str, Source)>,
}

/// The thread count where none is given: one a CPU, at most 16, since each thread of the device
/// path pins bounce buffers of its own.
pub fn default_nthreads(cpus: usize) -> usize {
    cpus.clamp(1, 16)
}

/// The task size where none is given (docs/decisions/0005-bounce-buffers-4mib.md).
pub const DEFAULT_TASK_SIZE: u64 = 4 << 20;

/// The largest bounce buffer size taken: files round the size up to whole pages when they
/// open, which a larger one would overflow.
pub const MAX_BOUNCE_BUFFER_SIZE: u64 = u64::MAX - 4095;
