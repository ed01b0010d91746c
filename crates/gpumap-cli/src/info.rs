//! `gpumap info [PATH]`: what this machine offers, the settings in force, each with where it
//! came from, and the facts the automatic choices were made from (for `PATH`'s file system).

use clap::Args;
use serde::Serialize;

use gpumap::capabilities::{Capabilities, Probe};
use std::path::PathBuf;

use gpumap::config::{Config, SettingSpec, SettingValue, Source, SETTINGS};
use gpumap::io::gds::CuFileProperties;
use gpumap::memory::Device;
use gpumap::remote::AUTO_IN_FLIGHT;
use gpumap::tuning::{self, Choice, FileSystem};
use gpumap::tuning_facts;

use crate::error::CliResult;
use crate::output;
use crate::schema::{Memory, SCHEMA};
use crate::units::human;

/// Arguments of `gpumap info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Print one JSON object instead of text (see docs/cli-json.md).
    #[arg(long)]
    json: bool,
    /// A file or directory: show the file system it is on and the settings chosen for it.
    path: Option<PathBuf>,
}

/// `gpumap info --json` (schema 1).
#[derive(Serialize)]
struct InfoReport {
    schema: u32,
    cuda: Cuda,
    cufile: CuFile,
    /// Whether GPUDirect Storage can be tried, and if not, every reason.
    gds: Availability,
    /// `/run/udev/data`, which cuFile needs to register files.
    udev_database: Availability,
    wsl: bool,
    /// The memory `read`, `write` and `map` use without `--device`/`--host`.
    default_memory: Memory,
    settings: ShownSettings,
    /// What the automatic choices of `settings` were made from.
    facts: ShownFacts,
    remote: ShownRemote,
}

#[derive(Serialize)]
struct Availability {
    available: bool,
    reason: Option<String>,
}

impl<T> From<&Probe<T>> for Availability {
    fn from(probe: &Probe<T>) -> Self {
        Availability { available: probe.is_available(), reason: probe.reason().map(str::to_owned) }
    }
}

#[derive(Serialize)]
struct Cuda {
    available: bool,
    reason: Option<String>,
    driver_version: Option<i32>,
    devices: Vec<Gpu>,
}

#[derive(Serialize)]
struct Gpu {
    ordinal: usize,
    name: String,
    total_memory: usize,
    pci_bus_id: String,
    /// Why the device could not be opened; `null` when it could.
    error: Option<String>,
}

#[derive(Serialize)]
struct CuFile {
    available: bool,
    reason: Option<String>,
    library: Option<String>,
    driver_open: bool,
    driver_reason: Option<String>,
    properties: Option<CuFileProperties>,
}

/// One setting: its value (numbers for sizes and counts, words for modes, a list for status
/// codes), where it came from (`"default"`, `"auto"` or the variable's name) and, where
/// auto-tuning has a rule for it, why this value.
#[derive(Serialize)]
struct Setting {
    value: serde_json::Value,
    source: String,
    reason: Option<String>,
}

/// The settings in the order of the library's table, keyed by their `Config` field.
type ShownSettings = serde_json::Map<String, serde_json::Value>;

/// What the automatic choices were made from.
#[derive(Serialize)]
struct ShownFacts {
    cpus: usize,
    gpus: Option<usize>,
    /// The path asked about, `null` without one.
    #[serde(serialize_with = "output::lossy_optional_path")]
    path: Option<PathBuf>,
    /// `{kind: "local" | "memory" | "network" | "unknown", name}`, `null` without a path.
    file_system: Option<FileSystem>,
    rotational: Option<bool>,
}

/// Remote objects: requests in flight per file, which `RemoteOptions::max_in_flight` sets.
#[derive(Serialize)]
struct ShownRemote {
    max_in_flight: usize,
    source: &'static str,
    reason: &'static str,
}

const REMOTE_IN_FLIGHT_REASON: &str = "object stores serve each connection far slower than a \
     NIC takes, so many ranged requests run at once, every read of the file sharing them";

fn json_value(value: &SettingValue) -> serde_json::Value {
    match value {
        SettingValue::Count(n) | SettingValue::Size(n) => (*n).into(),
        SettingValue::Word(w) => w.clone().into(),
        SettingValue::Codes(codes) => codes.clone().into(),
    }
}

/// Each setting with its source: an explicit value (a variable) wins; else the automatic
/// choice where tuning has a rule for the setting (`"auto"` where the facts moved it off the
/// default); else the default.
fn settings_of(
    config: &Config,
    choices: &[Choice],
) -> Vec<(&'static SettingSpec, SettingValue, Setting)> {
    SETTINGS
        .iter()
        .map(|spec| {
            let choice = choices.iter().find(|c| c.setting == spec.field);
            let (value, source, reason) = match (config.source(spec.field), choice) {
                (Source::Env(var), _) => (spec.value(config), var, None),
                (Source::Set, _) => (spec.value(config), "set".to_owned(), None),
                (Source::Default, Some(c)) => (
                    c.value.clone(),
                    if c.tuned { "auto" } else { "default" }.to_owned(),
                    Some(c.reason.clone()),
                ),
                (Source::Default, None) => (spec.value(config), "default".to_owned(), None),
            };
            let shown = Setting { value: json_value(&value), source, reason };
            (spec, value, shown)
        })
        .collect()
}

fn shown_settings(config: &Config, choices: &[Choice]) -> ShownSettings {
    settings_of(config, choices)
        .into_iter()
        .map(|(spec, _, shown)| {
            (spec.field.to_owned(), serde_json::to_value(shown).unwrap_or_default())
        })
        .collect()
}

fn report(
    caps: &Capabilities,
    config: &Config,
    facts: ShownFacts,
    choices: &[Choice],
) -> InfoReport {
    let cuda_info = caps.cuda.available();
    let cufile_info = caps.cufile.available();
    let device = Device::auto();
    let fallback =
        device.is_host().then(|| format!("no GPU: {}", caps.cuda_reason().unwrap_or("none found")));
    InfoReport {
        schema: SCHEMA,
        cuda: Cuda {
            available: caps.gpu_available(),
            reason: caps.cuda_reason().map(str::to_owned),
            driver_version: cuda_info.map(|c| c.driver_version),
            devices: cuda_info
                .map(|c| {
                    c.devices
                        .iter()
                        .map(|d| Gpu {
                            ordinal: d.ordinal,
                            name: d.name.clone(),
                            total_memory: d.total_memory,
                            pci_bus_id: d.pci_bus_id.clone(),
                            error: d.error.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        },
        cufile: CuFile {
            available: caps.cufile.is_available(),
            reason: caps.cufile.reason().map(str::to_owned),
            library: cufile_info.map(|c| c.library.clone()),
            driver_open: cufile_info.is_some_and(|c| c.driver.is_available()),
            driver_reason: cufile_info.and_then(|c| c.driver.reason().map(str::to_owned)),
            properties: cufile_info.and_then(|c| c.driver.available()).and_then(|d| d.properties),
        },
        gds: match caps.cufile_usable() {
            Ok(()) => Availability { available: true, reason: None },
            Err(reason) => Availability { available: false, reason: Some(reason) },
        },
        udev_database: Availability::from(&caps.run_udev),
        wsl: caps.wsl,
        default_memory: Memory::new(&device, fallback),
        settings: shown_settings(config, choices),
        facts,
        remote: ShownRemote {
            max_in_flight: AUTO_IN_FLIGHT,
            source: "auto",
            reason: REMOTE_IN_FLIGHT_REASON,
        },
    }
}

/// `gpumap info [PATH]`.
pub fn info(args: &InfoArgs) -> CliResult {
    let caps = Capabilities::probe();
    let config = Config::from_env()?;
    let gpus = caps.cuda.available().map(|c| c.devices.len());
    let facts = tuning_facts::gather(args.path.as_deref(), gpus)?;
    let choices = tuning::tune(&facts);
    let shown_facts = ShownFacts {
        cpus: facts.cpus,
        gpus: facts.gpus,
        path: args.path.clone(),
        file_system: facts.file_system,
        rotational: facts.rotational,
    };
    if args.json {
        return output::json(&report(caps, &config, shown_facts, &choices));
    }
    output::try_line(caps)?;
    let known = |fact: Option<String>| fact.unwrap_or_else(|| "unknown".to_owned());
    let mut line =
        format!("facts: {} CPUs, GPUs {}", facts.cpus, known(gpus.map(|n| n.to_string())));
    if let (Some(path), Some(fs)) = (&args.path, facts.file_system) {
        let spins = known(facts.rotational.map(|r| if r { "yes" } else { "no" }.to_owned()));
        line += &format!(", {} on {fs}, rotational disk {spins}", output::shown(path));
    }
    output::try_line(line)?;
    output::try_line("settings:")?;
    for (spec, value, shown) in settings_of(&config, &choices) {
        let value = match value {
            SettingValue::Size(n) => human(n),
            other => other.to_string(),
        };
        let source = match (shown.source.as_str(), &shown.reason) {
            ("auto", Some(reason)) => format!("auto: {reason}"),
            ("default" | "set", _) => shown.source.clone(),
            (var, _) => format!("from {var}"),
        };
        output::try_line(format!("  {:<20} {value:<10} ({source})", spec.field))?;
    }
    output::try_line(format!(
        "remote: up to {AUTO_IN_FLIGHT} requests in flight per file (auto: {REMOTE_IN_FLIGHT_REASON})"
    ))?;
    Ok(())
}
