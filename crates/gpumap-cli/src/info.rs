//! `gpumap info`: what this machine offers and the settings in force.

use clap::Args;
use serde::Serialize;

use gpumap::capabilities::{Capabilities, Probe};
use gpumap::config::{Config, Source};
use gpumap::io::gds::CuFileProperties;
use gpumap::memory::Device;

use crate::error::CliResult;
use crate::output;
use crate::schema::{Memory, SCHEMA};
use crate::transfer::human;

/// Arguments of `gpumap info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Print one JSON object instead of text (see docs/cli-json.md).
    #[arg(long)]
    json: bool,
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

/// One setting: its value (numbers for sizes and counts, words for modes) and where it came
/// from (`"default"` or the variable's name).
#[derive(Serialize)]
struct Setting<T> {
    value: T,
    source: String,
}

#[derive(Serialize)]
struct ShownSettings {
    compat_mode: Setting<String>,
    nthreads: Setting<usize>,
    task_size: Setting<u64>,
    gds_threshold: Setting<u64>,
    bounce_buffer_size: Setting<u64>,
    /// `"off"`, `"on"` or `"uncached"`.
    direct_io_read: Setting<String>,
    /// `"off"` or `"on"`: the same words as `direct_io_read`.
    direct_io_write: Setting<String>,
}

fn on_off(value: bool) -> String {
    if value { "on" } else { "off" }.to_owned()
}

impl ShownSettings {
    fn of(config: &Config) -> ShownSettings {
        fn setting<T>(config: &Config, name: &str, value: T) -> Setting<T> {
            let source = match config.source(name) {
                Source::Default => "default".to_owned(),
                Source::Env(var) => var,
            };
            Setting { value, source }
        }
        ShownSettings {
            compat_mode: setting(config, "compat_mode", config.compat_mode.to_string()),
            nthreads: setting(config, "nthreads", config.nthreads),
            task_size: setting(config, "task_size", config.task_size),
            gds_threshold: setting(config, "gds_threshold", config.gds_threshold),
            bounce_buffer_size: setting(config, "bounce_buffer_size", config.bounce_buffer_size),
            direct_io_read: setting(config, "direct_io_read", config.direct_io_read.to_string()),
            direct_io_write: setting(config, "direct_io_write", on_off(config.direct_io_write)),
        }
    }
}

fn report(caps: &Capabilities, config: &Config) -> InfoReport {
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
        settings: ShownSettings::of(config),
    }
}

/// `gpumap info`.
pub fn info(args: &InfoArgs) -> CliResult {
    let caps = Capabilities::probe();
    let config = Config::from_env()?;
    if args.json {
        return output::json(&report(caps, &config));
    }
    output::try_line(caps)?;
    output::try_line("settings:")?;
    let settings = ShownSettings::of(&config);
    let rows: [(&str, String, &str); 7] = [
        ("compat_mode", settings.compat_mode.value.clone(), &settings.compat_mode.source),
        ("nthreads", settings.nthreads.value.to_string(), &settings.nthreads.source),
        ("task_size", human(config.task_size), &settings.task_size.source),
        ("gds_threshold", human(config.gds_threshold), &settings.gds_threshold.source),
        (
            "bounce_buffer_size",
            human(config.bounce_buffer_size),
            &settings.bounce_buffer_size.source,
        ),
        ("direct_io_read", settings.direct_io_read.value.clone(), &settings.direct_io_read.source),
        (
            "direct_io_write",
            settings.direct_io_write.value.clone(),
            &settings.direct_io_write.source,
        ),
    ];
    for (name, value, source) in rows {
        let source = if source == "default" { source.to_owned() } else { format!("from {source}") };
        output::try_line(format!("  {name:<20} {value:<10} ({source})"))?;
    }
    Ok(())
}
