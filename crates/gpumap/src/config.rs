//! Defaults and environment settings.
//!
//! Every setting has a `GPUMAP_*` variable; the `KVIKIO_*` name of the same setting is accepted
//! as an alias, so a KvikIO user's environment carries over. When both are set, `GPUMAP_*` wins.
//! A value that cannot be used is an [`Error::InvalidConfig`] naming the variable and its
//! value, never a silent fall-back to the default.
//!
//! | setting | variable (alias) | default |
//! |---|---|---|
//! | compat mode | `GPUMAP_COMPAT_MODE` (`KVIKIO_COMPAT_MODE`) | `auto` |
//! | worker threads | `GPUMAP_NTHREADS` (`KVIKIO_NTHREADS`) | CPUs, at most 16 |
//! | task size | `GPUMAP_TASK_SIZE` (`KVIKIO_TASK_SIZE`) | 4 MiB |
//! | cuFile threshold | `GPUMAP_GDS_THRESHOLD` (`KVIKIO_GDS_THRESHOLD`) | 1 MiB |
//! | bounce buffer size | `GPUMAP_BOUNCE_BUFFER_SIZE` (`KVIKIO_BOUNCE_BUFFER_SIZE`) | 4 MiB |
//! | O_DIRECT reads | `GPUMAP_AUTO_DIRECT_IO_READ` (`KVIKIO_AUTO_DIRECT_IO_READ`) | off |
//! | O_DIRECT writes | `GPUMAP_AUTO_DIRECT_IO_WRITE` (`KVIKIO_AUTO_DIRECT_IO_WRITE`) | on |
//!
//! Sizes take a number with an optional `dd`-style suffix (see [`parse_size`]): `K`/`KiB` =
//! 1024, `KB` = 1000, and likewise `M`, `G`, `T`, `P`, `E`, in any case. Booleans take
//! `true/false`, `on/off`, `yes/no`, `1/0`. O_DIRECT reads also take `uncached` (see
//! [`DirectRead`]). Thread counts are whole numbers (no suffix) from 1 to [`MAX_THREADS`]; more
//! than four per CPU is allowed but logged as a warning. A value that is not UTF-8 is refused
//! too, not taken for an unset variable.
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use crate::error::{Error, Result};

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
}

/// gpumap's settings. `Config::default()` is the built-in defaults; [`Config::from_env`] reads
/// the environment on top of them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
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
    /// Where each setting came from, by setting name.
    pub sources: Vec<(&'static str, Source)>,
}

impl Default for Config {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        Config {
            compat_mode: CompatMode::Auto,
            nthreads: cpus.clamp(1, 16),
            task_size: 4 << 20,
            gds_threshold: 1 << 20,
            bounce_buffer_size: 4 << 20,
            direct_io_read: DirectRead::Off,
            direct_io_write: true,
            sources: Vec::new(),
        }
    }
}

#[derive(Clone, Copy)]
enum Setting {
    CompatMode,
    Nthreads,
    TaskSize,
    GdsThreshold,
    BounceBufferSize,
    DirectIoRead,
    DirectIoWrite,
}

/// The variables, as (setting, its field name, gpumap name, KvikIO alias).
const VARS: [(Setting, &str, &str, &str); 7] = [
    (Setting::CompatMode, "compat_mode", "GPUMAP_COMPAT_MODE", "KVIKIO_COMPAT_MODE"),
    (Setting::Nthreads, "nthreads", "GPUMAP_NTHREADS", "KVIKIO_NTHREADS"),
    (Setting::TaskSize, "task_size", "GPUMAP_TASK_SIZE", "KVIKIO_TASK_SIZE"),
    (Setting::GdsThreshold, "gds_threshold", "GPUMAP_GDS_THRESHOLD", "KVIKIO_GDS_THRESHOLD"),
    (
        Setting::BounceBufferSize,
        "bounce_buffer_size",
        "GPUMAP_BOUNCE_BUFFER_SIZE",
        "KVIKIO_BOUNCE_BUFFER_SIZE",
    ),
    (
        Setting::DirectIoRead,
        "direct_io_read",
        "GPUMAP_AUTO_DIRECT_IO_READ",
        "KVIKIO_AUTO_DIRECT_IO_READ",
    ),
    (
        Setting::DirectIoWrite,
        "direct_io_write",
        "GPUMAP_AUTO_DIRECT_IO_WRITE",
        "KVIKIO_AUTO_DIRECT_IO_WRITE",
    ),
];

impl Config {
    /// The defaults with the process environment applied.
    pub fn from_env() -> Result<Config> {
        Self::from_os_lookup(|name| std::env::var_os(name))
    }

    /// [`Config::from_lookup`] over raw values. A value that is not UTF-8 is an error naming
    /// its variable: `std::env::var` reports it as unset, which would put the default in its
    /// place silently.
    fn from_os_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Config> {
        for (_, _, name, alias) in VARS {
            let found = [name, alias].into_iter().find_map(|var| lookup(var).map(|v| (var, v)));
            if let Some((var, raw)) = found.filter(|(_, raw)| raw.to_str().is_none()) {
                return Err(Error::InvalidConfig {
                    var: var.to_string(),
                    value: raw.to_string_lossy().into_owned(),
                    reason: "not valid UTF-8".into(),
                });
            }
        }
        Self::from_lookup(|name| lookup(name).and_then(|raw| raw.into_string().ok()))
    }

    /// The process-wide configuration, read from the environment once.
    pub fn global() -> Result<&'static Config> {
        static GLOBAL: OnceLock<std::result::Result<Config, (String, String, String)>> =
            OnceLock::new();
        match GLOBAL.get_or_init(|| {
            Config::from_env().map_err(|e| match e {
                Error::InvalidConfig { var, value, reason } => (var, value, reason),
                other => (String::new(), String::new(), other.to_string()),
            })
        }) {
            Ok(c) => Ok(c),
            Err((var, value, reason)) => Err(Error::InvalidConfig {
                var: var.clone(),
                value: value.clone(),
                reason: reason.clone(),
            }),
        }
    }

    /// The defaults with settings taken from `lookup(variable name)` (tests use a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut config = Config::default();
        for (setting, field, name, alias) in VARS {
            let found = [name, alias].into_iter().find_map(|var| lookup(var).map(|v| (var, v)));
            let Some((var, value)) = found else {
                config.sources.push((field, Source::Default));
                continue;
            };
            let invalid = |reason: String| Error::InvalidConfig {
                var: var.to_string(),
                value: value.clone(),
                reason,
            };
            match setting {
                Setting::CompatMode => config.compat_mode = value.parse().map_err(invalid)?,
                Setting::Nthreads => {
                    let n = parse_count(&value).map_err(invalid)?;
                    if let Some(warning) = check_nthreads(n).map_err(invalid)? {
                        tracing::warn!("{var}={value}: {warning}");
                    }
                    config.nthreads = n;
                }
                Setting::TaskSize => {
                    config.task_size = parse_size(&value).map_err(invalid)?;
                    if config.task_size == 0 {
                        return Err(invalid("expected a size above zero".into()));
                    }
                }
                Setting::BounceBufferSize => {
                    let n = parse_size(&value).map_err(invalid)?;
                    if n == 0 {
                        // Any other size is taken, rounded up to whole pages where files open.
                        return Err(invalid("expected a size above zero".into()));
                    }
                    config.bounce_buffer_size = n;
                }
                Setting::GdsThreshold => {
                    config.gds_threshold = parse_size(&value).map_err(invalid)?
                }
                Setting::DirectIoRead => config.direct_io_read = value.parse().map_err(invalid)?,
                Setting::DirectIoWrite => {
                    config.direct_io_write = parse_bool(&value).map_err(invalid)?
                }
            }
            config.sources.push((field, Source::Env(var.to_string())));
        }
        Ok(config)
    }

    /// Where `setting` (a field name) came from.
    pub fn source(&self, setting: &str) -> Source {
        self.sources
            .iter()
            .find(|(s, _)| *s == setting)
            .map(|(_, src)| src.clone())
            .unwrap_or(Source::Default)
    }
}

/// The most threads an I/O pool may have. Each thread of the POSIX path to device memory
/// keeps two pinned bounce buffers (4 MiB each by default), so 1024 threads already pin 8 GiB.
pub const MAX_THREADS: usize = 1024;

/// Checks a thread count: an error outside `1..=`[`MAX_THREADS`]; a warning (`Ok(Some(..))`)
/// above four threads per CPU, where threads contend for cores and each still holds its
/// buffers; `Ok(None)` otherwise.
pub fn check_nthreads(n: usize) -> std::result::Result<Option<String>, String> {
    if n == 0 || n > MAX_THREADS {
        return Err(format!("expected a thread count from 1 to {MAX_THREADS}"));
    }
    let cpus = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    Ok((n > 4 * cpus).then(|| {
        format!(
            "{n} threads for {cpus} CPUs: more than four a CPU rarely helps, and each thread of \
             the device path pins its own bounce buffers"
        )
    }))
}

/// Parses a count (of threads): decimal digits only, as `--threads` takes it. Not a size:
/// with `dd` suffixes `1K` would be 1024 threads and `8B` eight.
fn parse_count(text: &str) -> std::result::Result<usize, String> {
    let digits = text.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("expected a whole number of threads from 1 to {MAX_THREADS}"));
    }
    Ok(digits.parse().unwrap_or(usize::MAX)) // only too many digits fail: check_nthreads refuses
}

/// Parses a byte count the way `dd` reads one: decimal digits, then an optional suffix.
///
/// | suffix | multiplier |
/// |---|---|
/// | none, `B` | 1 |
/// | `K`, `KiB` | 1024 |
/// | `KB` | 1000 |
/// | `M`, `MiB` / `MB` | 1024² / 1000² |
/// | `G`, `T`, `P`, `E` (with `iB` or `B`) | likewise |
///
/// Suffixes are case-insensitive (`4k`, `4kib` and `4KiB` are all 4096; `4mb` and `4MB` are
/// both 4,000,000); a space between number and suffix is allowed. Unlike `dd`, a lone `B`
/// means bytes, not 512-byte blocks. Signs, fractions and results above `u64::MAX` are
/// rejected.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let text = text.trim();
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(
            "expected a non-negative whole number, optionally with a suffix such as 4MiB".into()
        );
    }
    let number: u64 = digits.parse().map_err(|_| "number too large".to_string())?;
    let multiplier = size_multiplier(suffix.trim())?;
    number.checked_mul(multiplier).ok_or_else(|| "size too large (above 2^64 - 1 bytes)".into())
}

/// The multiplier of a size suffix (see [`parse_size`]).
fn size_multiplier(suffix: &str) -> std::result::Result<u64, String> {
    let unknown = || {
        format!(
            "unknown size suffix {suffix:?}: use K, M, G, T, P or E for powers of 1024 (KiB, \
             MiB, ... alike) and KB, MB, ... for powers of 1000, in any case"
        )
    };
    let lower = suffix.to_ascii_lowercase();
    let mut chars = lower.chars();
    let power = match chars.next() {
        None | Some('b') if lower.len() <= 1 => return Ok(1),
        Some('k') => 1,
        Some('m') => 2,
        Some('g') => 3,
        Some('t') => 4,
        Some('p') => 5,
        Some('e') => 6,
        _ => return Err(unknown()),
    };
    let base: u64 = match chars.as_str() {
        "" | "ib" => 1024,
        "b" => 1000,
        _ => return Err(unknown()),
    };
    Ok(base.pow(power))
}

/// Parses a boolean the way KvikIO does: `true/false`, `on/off`, `yes/no`, `1/0`, any case.
pub fn parse_bool(text: &str) -> std::result::Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" | "1" => Ok(true),
        "false" | "off" | "no" | "0" => Ok(false),
        _ => Err("expected true/false, on/off, yes/no or 1/0".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<Config> {
        let map: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let c = with(&[]).unwrap();
        assert_eq!(c.compat_mode, CompatMode::Auto);
        assert_eq!(c.task_size, 4 << 20);
        assert_eq!(c.bounce_buffer_size, 4 << 20);
        assert!(c.nthreads >= 1);
        assert_eq!(c.source("task_size"), Source::Default);
    }

    #[test]
    fn every_setting_parses() {
        let c = with(&[
            ("GPUMAP_COMPAT_MODE", "ON"),
            ("GPUMAP_NTHREADS", "7"),
            ("GPUMAP_TASK_SIZE", "1MiB"),
            ("GPUMAP_GDS_THRESHOLD", "64K"),
            ("GPUMAP_BOUNCE_BUFFER_SIZE", "8M"),
            ("GPUMAP_AUTO_DIRECT_IO_READ", "yes"),
            ("GPUMAP_AUTO_DIRECT_IO_WRITE", "false"),
        ])
        .unwrap();
        assert_eq!(c.compat_mode, CompatMode::On);
        assert_eq!(c.nthreads, 7);
        assert_eq!(c.task_size, 1 << 20);
        assert_eq!(c.gds_threshold, 64 << 10);
        assert_eq!(c.bounce_buffer_size, 8 << 20);
        assert!(c.direct_io_read == DirectRead::On && !c.direct_io_write);
        for (_, setting, _, _) in VARS {
            assert!(matches!(c.source(setting), Source::Env(_)), "{setting} not read");
        }
    }

    #[test]
    fn kvikio_aliases_and_precedence() {
        let c = with(&[("KVIKIO_COMPAT_MODE", "off"), ("KVIKIO_NTHREADS", "3")]).unwrap();
        assert_eq!(c.compat_mode, CompatMode::Off);
        assert_eq!(c.source("nthreads"), Source::Env("KVIKIO_NTHREADS".into()));
        let c = with(&[("KVIKIO_NTHREADS", "3"), ("GPUMAP_NTHREADS", "5")]).unwrap();
        assert_eq!(c.nthreads, 5);
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (var, value) in [
            ("GPUMAP_NTHREADS", "-4"),
            ("GPUMAP_NTHREADS", "0"),
            ("GPUMAP_TASK_SIZE", "-1"),
            ("GPUMAP_TASK_SIZE", "1.5M"),
            ("GPUMAP_TASK_SIZE", "4 parsecs"),
            ("KVIKIO_GDS_THRESHOLD", "99999999999999999999"),
            ("GPUMAP_BOUNCE_BUFFER_SIZE", "0"),
            ("GPUMAP_COMPAT_MODE", "sometimes"),
            ("GPUMAP_AUTO_DIRECT_IO_READ", "maybe"),
        ] {
            match with(&[(var, value)]) {
                Err(Error::InvalidConfig { var: v, value: got, .. }) => {
                    assert_eq!((v.as_str(), got.as_str()), (var, value))
                }
                other => panic!("{var}={value}: expected InvalidConfig, got {other:?}"),
            }
        }
    }

    #[test]
    fn any_positive_bounce_buffer_size_is_taken() {
        for (value, want) in [("1", 1), ("1000", 1000), ("4097", 4097), ("4M", 4 << 20)] {
            let c = with(&[("KVIKIO_BOUNCE_BUFFER_SIZE", value)]).unwrap();
            assert_eq!(c.bounce_buffer_size, want, "{value}");
        }
    }

    #[test]
    fn direct_read_values() {
        for (text, want) in [
            ("uncached", DirectRead::Uncached),
            ("AUTO", DirectRead::Uncached),
            ("true", DirectRead::On),
            ("on", DirectRead::On),
            ("0", DirectRead::Off),
            ("no", DirectRead::Off),
        ] {
            assert_eq!(text.parse::<DirectRead>(), Ok(want), "{text}");
            assert_eq!(want.to_string().parse::<DirectRead>(), Ok(want));
        }
        assert_eq!(Config::default().direct_io_read, DirectRead::Off);
        let c = with(&[("KVIKIO_AUTO_DIRECT_IO_READ", "false")]).unwrap();
        assert_eq!(c.direct_io_read, DirectRead::Off);
    }

    #[test]
    fn sizes_follow_dd_with_one_case_rule() {
        for (text, want) in [
            ("0", 0u64),
            ("4096", 4096),
            ("4096B", 4096),
            ("4096b", 4096),
            ("4K", 4096),
            ("4k", 4096),
            ("4KiB", 4096),
            ("4kib", 4096),
            ("4KIB", 4096),
            ("4KB", 4000),
            ("4kB", 4000),
            ("4kb", 4000),
            ("4MB", 4_000_000),
            ("4mb", 4_000_000),
            ("4M", 4 << 20),
            ("4MiB", 4 << 20),
            (" 2G ", 2 << 30),
            ("2 GiB", 2 << 30),
            ("1GB", 1_000_000_000),
            ("3T", 3 << 40),
            ("1PiB", 1 << 50),
            ("1EB", 1_000_000_000_000_000_000),
            ("15E", 15 << 60),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text:?}");
        }
        for bad in [
            "",
            "-1",
            "+1",
            "1.5M",
            "K",
            "4 parsecs",
            "4Q",
            "4KiBs",
            "4iB",
            "4Bi",
            "16E",
            "20000000000T",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// The README's size rule written out plainly, as the reference `parse_size` must agree
    /// with: whitespace around, ASCII digits, whitespace, then a suffix from a table, in any
    /// ASCII case; the product in 128 bits, refused above `u64::MAX`.
    fn model_size(text: &str) -> Option<u64> {
        let text = text.trim_matches(char::is_whitespace);
        let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() {
            return None;
        }
        let suffix = text[digits.len()..].trim_matches(char::is_whitespace).to_ascii_lowercase();
        let mut table = vec![(String::new(), 1u128), ("b".to_string(), 1)];
        for (i, p) in ["k", "m", "g", "t", "p", "e"].into_iter().enumerate() {
            let power = i as u32 + 1;
            table.push((p.to_string(), 1024u128.pow(power)));
            table.push((format!("{p}ib"), 1024u128.pow(power)));
            table.push((format!("{p}b"), 1000u128.pow(power)));
        }
        let multiplier = table.iter().find(|(s, _)| *s == suffix)?.1;
        let significant = digits.trim_start_matches('0');
        if significant.len() > 20 {
            return None; // more than u64::MAX before any suffix
        }
        let number: u128 = if significant.is_empty() { 0 } else { significant.parse().ok()? };
        u64::try_from(number.checked_mul(multiplier)?).ok()
    }

    /// Text shaped like a size: digits (sometimes too many), spaces and suffix letters, so
    /// the cases reach the suffix table and the overflow checks, not just the first byte.
    fn size_like() -> impl Strategy<Value = String> {
        "[ \t\u{a0}\u{3000}]{0,2}[0-9]{0,26}[ \t]{0,2}[bBiIkKmMgGtTpPeEsQ\u{212a}]{0,4}[ \n]{0,2}"
    }

    proptest! {
        #[test]
        fn sizes_agree_with_the_model_for_any_text(text in any::<String>()) {
            prop_assert_eq!(parse_size(&text).ok(), model_size(&text), "{:?}", text);
        }

        #[test]
        fn sizes_agree_with_the_model_for_size_like_text(text in size_like()) {
            prop_assert_eq!(parse_size(&text).ok(), model_size(&text), "{:?}", text);
        }

        #[test]
        fn huge_sizes_are_refused_not_wrapped(
            n in prop_oneof![any::<u64>(), (u64::MAX >> 12)..=u64::MAX, 0u64..1 << 20],
            suffix in prop::sample::select(vec![
                "", "B", "K", "KiB", "kb", "M", "MIB", "mB", "G", "gib", "GB", "T", "TiB", "TB",
                "P", "PiB", "PB", "E", "EiB", "EB",
            ]),
        ) {
            let multiplier = model_size(&format!("1{suffix}")).unwrap();
            let text = format!("{n}{suffix}");
            prop_assert_eq!(parse_size(&text).ok(), n.checked_mul(multiplier), "{}", text);
        }

        #[test]
        fn other_settings_parse_any_text_without_panicking(text in any::<String>()) {
            let lower = text.trim().to_ascii_lowercase();
            let truthy = ["true", "on", "yes", "1"].contains(&lower.as_str());
            let falsy = ["false", "off", "no", "0"].contains(&lower.as_str());
            prop_assert_eq!(parse_bool(&text).ok(), (truthy || falsy).then_some(truthy));
            let mode = text.parse::<CompatMode>();
            prop_assert_eq!(mode.is_ok(), truthy || falsy || lower == "auto");
            let direct = text.parse::<DirectRead>();
            prop_assert_eq!(direct.is_ok(), truthy || falsy || lower == "auto" || lower == "uncached");
        }

        /// Any value in any variable: a config, or an InvalidConfig naming a variable that was
        /// set and the value it held; never a panic, never a value taken silently.
        #[test]
        fn any_environment_gives_a_config_or_names_the_bad_variable(
            values in proptest::collection::vec(
                prop::option::of(prop_oneof![any::<String>(), size_like(), Just("auto".to_string())]),
                14,
            ),
        ) {
            let names: Vec<&str> = VARS.iter().flat_map(|(_, _, n, a)| [*n, *a]).collect();
            let env: HashMap<&str, String> = names
                .iter()
                .zip(&values)
                .filter_map(|(n, v)| v.clone().map(|v| (*n, v)))
                .collect();
            match Config::from_lookup(|k| env.get(k).cloned()) {
                Ok(config) => {
                    for (_, field, name, alias) in VARS {
                        let set = env.contains_key(name) || env.contains_key(alias);
                        prop_assert_eq!(matches!(config.source(field), Source::Env(_)), set);
                    }
                }
                Err(Error::InvalidConfig { var, value, reason }) => {
                    prop_assert_eq!(env.get(var.as_str()), Some(&value), "{}", reason);
                }
                Err(other) => prop_assert!(false, "not InvalidConfig: {other:?}"),
            }
        }

        /// Raw bytes in any variable: the same verdict as the text they spell, or, where they
        /// are not UTF-8 and the variable is the one read, an error naming it.
        #[test]
        fn any_bytes_in_the_environment_are_refused_or_read_as_text(
            values in proptest::collection::vec(
                prop::option::of(prop_oneof![
                    any::<Vec<u8>>(),
                    size_like().prop_map(String::into_bytes),
                    Just(b"4K\xc3".to_vec()),
                ]),
                14,
            ),
        ) {
            use std::os::unix::ffi::OsStringExt;
            let names: Vec<&str> = VARS.iter().flat_map(|(_, _, n, a)| [*n, *a]).collect();
            let env: HashMap<&str, Vec<u8>> = names
                .iter()
                .zip(&values)
                .filter_map(|(n, v)| v.clone().map(|v| (*n, v)))
                .collect();
            let got = Config::from_os_lookup(|k| env.get(k).cloned().map(OsString::from_vec));
            let bad_bytes = VARS.iter().find_map(|(_, _, n, a)| {
                let raw = env.get(n).or_else(|| env.get(a))?;
                std::str::from_utf8(raw).is_err().then_some(if env.contains_key(n) { *n } else { *a })
            });
            match bad_bytes {
                Some(var) => prop_assert!(
                    matches!(&got, Err(Error::InvalidConfig { var: v, reason, .. }) if v == var && reason.contains("UTF-8")),
                    "{var}: {got:?}"
                ),
                None => {
                    let text = |k: &str| env.get(k).map(|v| String::from_utf8(v.clone()).unwrap());
                    prop_assert_eq!(got.ok(), Config::from_lookup(text).ok());
                }
            }
        }

        /// A thread count is a plain whole number from 1 to MAX_THREADS, as `--threads` takes
        /// it: size suffixes would make `1K` a thousand and twenty-four threads.
        #[test]
        fn thread_counts_are_whole_numbers_without_suffixes(text in prop_oneof![
            size_like(),
            "[ +-]?[0-9]{1,5}[ ]?",
            "[0-9]{1,4} ?[bBkK]{1,2}",
            any::<String>(),
        ]) {
            let t = text.trim();
            let plain = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
            let expected = t.parse::<usize>().ok().filter(|n| plain && (1..=MAX_THREADS).contains(n));
            let got = with(&[("GPUMAP_NTHREADS", text.as_str())]).ok().map(|c| c.nthreads);
            prop_assert_eq!(got, expected, "{:?}", text);
        }
    }

    #[test]
    fn values_that_are_not_utf8_are_refused_by_name() {
        use std::os::unix::ffi::OsStringExt;
        let env = |pairs: Vec<(&'static str, Vec<u8>)>| {
            move |k: &str| {
                pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from_vec(v.clone()))
            }
        };
        match Config::from_os_lookup(env(vec![("KVIKIO_TASK_SIZE", b"4M\xff".to_vec())])) {
            Err(Error::InvalidConfig { var, value, reason }) => {
                assert_eq!((var.as_str(), value.as_str()), ("KVIKIO_TASK_SIZE", "4M\u{fffd}"));
                assert!(reason.contains("UTF-8"), "{reason}");
            }
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
        // The alias is not consulted where the gpumap name is set, bytes or not.
        let c = Config::from_os_lookup(env(vec![
            ("GPUMAP_TASK_SIZE", b"1M".to_vec()),
            ("KVIKIO_TASK_SIZE", b"\xff".to_vec()),
        ]))
        .unwrap();
        assert_eq!(c.task_size, 1 << 20);
    }

    #[test]
    fn thread_counts_take_no_size_suffix() {
        for text in ["1b", "8B", "1K", "1k", "2 KiB", "+4", "4.0", ""] {
            match with(&[("GPUMAP_NTHREADS", text)]) {
                Err(Error::InvalidConfig { value, .. }) => assert_eq!(value, text),
                other => panic!("GPUMAP_NTHREADS={text:?}: expected InvalidConfig, got {other:?}"),
            }
        }
        assert_eq!(with(&[("GPUMAP_NTHREADS", " 0012 ")]).unwrap().nthreads, 12);
        let huge = with(&[("GPUMAP_NTHREADS", "99999999999999999999999")]);
        assert!(
            matches!(huge, Err(Error::InvalidConfig { reason, .. }) if reason.contains("1024"))
        );
    }

    #[test]
    fn thread_counts_are_bounded_and_many_warn() {
        assert!(check_nthreads(0).is_err());
        assert!(check_nthreads(MAX_THREADS + 1).is_err());
        assert_eq!(check_nthreads(1), Ok(None));
        let cpus = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
        if 4 * cpus < MAX_THREADS {
            assert!(check_nthreads(MAX_THREADS).unwrap().is_some());
        }
        match with(&[("GPUMAP_NTHREADS", "5000")]) {
            Err(Error::InvalidConfig { reason, .. }) => {
                assert!(reason.contains("1024"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
}
