//! Defaults and environment settings.
//!
//! Every setting has a `GPUMAP_*` variable; the `KVIKIO_*` name of the same setting is accepted
//! as an alias, so a KvikIO user's environment carries over. When both are set, `GPUMAP_*` wins.
//! A value that cannot be used is an [`Error::InvalidConfig`] naming the variable and its
//! value, never a silent fall-back to the default.
//!
//! [`SETTINGS`] is the one table of them: each row gives the setting's name in KvikIO's Python
//! API, its [`Config`] field, both variables, its default, a line of documentation, how its
//! text is read and how its value is shown. The environment parsing here, the source of each
//! value, `gpumap info` and Python's `gpumapio.defaults` are all derived from it.
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
//! | remote attempts | `GPUMAP_HTTP_MAX_ATTEMPTS` (`KVIKIO_HTTP_MAX_ATTEMPTS`) | 3 |
//! | retried statuses | `GPUMAP_HTTP_STATUS_CODES` (`KVIKIO_HTTP_STATUS_CODES`) | 429,500,502,503,504 |
//! | remote timeout | `GPUMAP_HTTP_TIMEOUT` (`KVIKIO_HTTP_TIMEOUT`) | 60 s |
//!
//! Where a setting is not given, some are chosen per file system (the `tuning` module).
//!
//! Sizes take a number with an optional `dd`-style suffix (see [`parse_size`]): `K`/`KiB` =
//! 1024, `KB` = 1000, and likewise `M`, `G`, `T`, `P`, `E`, in any case. Booleans take
//! `true/false`, `on/off`, `yes/no`, `1/0`. O_DIRECT reads also take `uncached` (see
//! [`DirectRead`]). Thread counts are whole numbers (no suffix) from 1 to [`MAX_THREADS`]; more
//! than four per CPU is allowed but logged as a warning. A value that is not UTF-8 is refused
//! too, not taken for an unset variable.
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::sync::OnceLock;

use crate::error::{Error, Result};

mod parse;
mod table;
mod values;

pub use parse::{check_nthreads, parse_bool, parse_size, MAX_THREADS};
pub use table::{setting, Scope, SettingSpec, SettingValue, SETTINGS};
pub use values::{
    default_nthreads, CompatMode, Config, DirectRead, Source, DEFAULT_TASK_SIZE,
    MAX_BOUNCE_BUFFER_SIZE,
};

impl Default for Config {
    fn default() -> Self {
        let cpus = crate::tuning_facts::cpus();
        Config {
            compat_mode: CompatMode::Auto,
            nthreads: default_nthreads(cpus),
            task_size: DEFAULT_TASK_SIZE,
            gds_threshold: 1 << 20,
            bounce_buffer_size: 4 << 20,
            direct_io_read: DirectRead::Off,
            direct_io_write: true,
            http_max_attempts: 3,
            http_status_codes: vec![429, 500, 502, 503, 504],
            http_timeout: 60,
            sources: Vec::new(),
        }
    }
}

impl Config {
    /// The defaults with the process environment applied.
    pub fn from_env() -> Result<Config> {
        Self::from_os_lookup(|name| std::env::var_os(name))
    }

    /// [`Config::from_lookup`] over raw values. A value that is not UTF-8 is an error naming
    /// its variable: `std::env::var` reports it as unset, which would put the default in its
    /// place silently.
    fn from_os_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Config> {
        for spec in &SETTINGS {
            let found =
                [spec.env, spec.alias].into_iter().find_map(|var| lookup(var).map(|v| (var, v)));
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

    /// The defaults with settings taken from `lookup(variable name)` (tests use a map), each
    /// read by its row of [`SETTINGS`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut config = Config::default();
        for spec in &SETTINGS {
            let found =
                [spec.env, spec.alias].into_iter().find_map(|var| lookup(var).map(|v| (var, v)));
            let Some((var, value)) = found else {
                config.sources.push((spec.field, Source::Default));
                continue;
            };
            match spec.parse_into(&mut config, &value) {
                Ok(Some(warning)) => tracing::warn!("{var}={value}: {warning}"),
                Ok(None) => {}
                Err(reason) => {
                    return Err(Error::InvalidConfig { var: var.to_string(), value, reason })
                }
            }
            config.sources.push((spec.field, Source::Env(var.to_string())));
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

    /// Records that `setting` (a field name of [`SETTINGS`]) now has a value from `source`;
    /// names outside the table are ignored.
    pub fn set_source(&mut self, setting: &str, source: Source) {
        let Some(spec) = self::setting(setting) else { return };
        self.sources.retain(|(s, _)| *s != spec.field);
        self.sources.push((spec.field, source));
    }

    /// Whether `setting` (a field name) was given by the environment or the program rather
    /// than left at its default: automatic choices apply only where it was not.
    pub fn is_explicit(&self, setting: &str) -> bool {
        self.source(setting) != Source::Default
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
    fn the_table_names_each_setting_once_in_both_spellings() {
        let columns: [fn(&SettingSpec) -> &'static str; 4] =
            [|s| s.name, |s| s.field, |s| s.env, |s| s.alias];
        for column in columns {
            let values: std::collections::HashSet<_> = SETTINGS.iter().map(column).collect();
            assert_eq!(values.len(), SETTINGS.len(), "a name appears twice: {values:?}");
        }
        for spec in &SETTINGS {
            let suffix = spec.env.strip_prefix("GPUMAP_").expect("GPUMAP_ variable");
            assert_eq!(spec.alias.strip_prefix("KVIKIO_"), Some(suffix), "{}", spec.name);
            assert!(!spec.doc.is_empty() && !spec.doc.contains('\n'), "{}", spec.name);
            assert_eq!(setting(spec.name).map(|s| s.env), Some(spec.env));
            assert_eq!(setting(spec.field).map(|s| s.env), Some(spec.env));
        }
    }

    /// The defaults the table states are the ones `Config::default` holds (the thread count's
    /// depends on the machine and is checked against its rule).
    #[test]
    fn the_table_states_the_defaults_config_has() {
        let defaults = Config::default();
        for spec in &SETTINGS {
            if spec.field == "nthreads" {
                let cpus = crate::tuning_facts::cpus();
                assert_eq!(spec.value(&defaults), SettingValue::Count(cpus.min(16) as u64));
                continue;
            }
            let mut parsed = Config::default();
            spec.parse_into(&mut parsed, spec.default).unwrap();
            assert_eq!(spec.value(&parsed), spec.value(&defaults), "{}", spec.name);
            // The value shown reads back as itself.
            let mut again = Config::default();
            spec.parse_into(&mut again, &spec.value(&defaults).to_string()).unwrap();
            assert_eq!(again, defaults, "{}", spec.name);
        }
    }

    /// Each row's example moves its own field and no other, read from either variable: a
    /// row whose parser wrote the wrong field, or a field no row reads, would show here.
    #[test]
    fn each_row_reads_its_own_field() {
        let defaults = Config::default();
        for spec in &SETTINGS {
            for var in [spec.env, spec.alias] {
                let c = with(&[(var, spec.example)]).unwrap();
                assert_ne!(spec.value(&c), spec.value(&defaults), "{var}={}", spec.example);
                assert_eq!(c.source(spec.field), Source::Env(var.into()));
                for other in SETTINGS.iter().filter(|o| o.field != spec.field) {
                    assert_eq!(
                        other.value(&c),
                        other.value(&defaults),
                        "{var} moved {}",
                        other.name
                    );
                    assert_eq!(c.source(other.field), Source::Default);
                }
            }
        }
    }

    /// The documents that list the settings list every row: the README's table (variables)
    /// and docs/cli-json.md (the keys of `gpumap info --json`).
    #[test]
    fn the_documents_list_every_setting() {
        let readme = include_str!("../../../../README.md");
        let cli_json = include_str!("../../../../docs/cli-json.md");
        for spec in &SETTINGS {
            assert!(readme.contains(spec.env), "README.md lacks {}", spec.env);
            assert!(
                cli_json.contains(&format!("`{}`", spec.field)),
                "cli-json.md lacks {}",
                spec.field
            );
        }
    }

    #[test]
    fn sources_set_by_the_program() {
        let mut c = with(&[("GPUMAP_TASK_SIZE", "1M")]).unwrap();
        assert!(c.is_explicit("task_size") && !c.is_explicit("gds_threshold"));
        c.set_source("gds_threshold", Source::Set);
        c.set_source("num_threads", Source::Set);
        c.set_source("no_such_setting", Source::Set);
        assert_eq!(c.source("gds_threshold"), Source::Set);
        assert_eq!(c.source("nthreads"), Source::Set);
        assert_eq!(c.sources.iter().filter(|(f, _)| *f == "nthreads").count(), 1);
    }

    #[test]
    fn remote_settings_parse_as_kvikio_reads_them() {
        let c = with(&[
            ("KVIKIO_HTTP_MAX_ATTEMPTS", "9"),
            ("KVIKIO_HTTP_STATUS_CODES", "500, 503"),
            ("GPUMAP_HTTP_TIMEOUT", " 7 "),
        ])
        .unwrap();
        assert_eq!((c.http_max_attempts, c.http_timeout), (9, 7));
        assert_eq!(c.http_status_codes, vec![500, 503]);
        for (var, value) in [
            ("KVIKIO_HTTP_TIMEOUT", "0"),
            ("KVIKIO_HTTP_MAX_ATTEMPTS", "3K"),
            ("GPUMAP_HTTP_STATUS_CODES", "500;503"),
        ] {
            assert!(
                matches!(with(&[(var, value)]), Err(Error::InvalidConfig { var: v, .. }) if v == var)
            );
        }
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
        for spec in &SETTINGS[..7] {
            assert!(matches!(c.source(spec.field), Source::Env(_)), "{} not read", spec.field);
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
        // The ceiling defaults.set keeps: past it, every file's open failed rounding it up.
        let largest = MAX_BOUNCE_BUFFER_SIZE.to_string();
        assert!(with(&[("KVIKIO_BOUNCE_BUFFER_SIZE", largest.as_str())]).is_ok());
        let past = (MAX_BOUNCE_BUFFER_SIZE + 1).to_string();
        assert!(matches!(
            with(&[("KVIKIO_BOUNCE_BUFFER_SIZE", past.as_str())]),
            Err(crate::error::Error::InvalidConfig { .. })
        ));
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
                20,
            ),
        ) {
            let names: Vec<&str> = SETTINGS.iter().flat_map(|s| [s.env, s.alias]).collect();
            let env: HashMap<&str, String> = names
                .iter()
                .zip(&values)
                .filter_map(|(n, v)| v.clone().map(|v| (*n, v)))
                .collect();
            match Config::from_lookup(|k| env.get(k).cloned()) {
                Ok(config) => {
                    for spec in &SETTINGS {
                        let set = env.contains_key(spec.env) || env.contains_key(spec.alias);
                        prop_assert_eq!(matches!(config.source(spec.field), Source::Env(_)), set);
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
                20,
            ),
        ) {
            use std::os::unix::ffi::OsStringExt;
            let names: Vec<&str> = SETTINGS.iter().flat_map(|s| [s.env, s.alias]).collect();
            let env: HashMap<&str, Vec<u8>> = names
                .iter()
                .zip(&values)
                .filter_map(|(n, v)| v.clone().map(|v| (*n, v)))
                .collect();
            let got = Config::from_os_lookup(|k| env.get(k).cloned().map(OsString::from_vec));
            let bad_bytes = SETTINGS.iter().find_map(|s| {
                let raw = env.get(s.env).or_else(|| env.get(s.alias))?;
                std::str::from_utf8(raw).is_err().then_some(if env.contains_key(s.env) { s.env } else { s.alias })
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
        let cpus = crate::tuning_facts::cpus();
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
