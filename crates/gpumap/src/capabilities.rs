//! What this machine offers: the CUDA driver and its devices, cuFile (GPUDirect Storage), and
//! the environment cuFile depends on. Every "no" carries the reason found by probing, so that
//! `gpumap info` and fallback decisions can say *why* a fast path is not taken.
//!
//! The probes compat decides by (the udev database, WSL, nvidia-fs, whether cuFile can be
//! used) live below, in the io layer, and are reported from here.
#![forbid(unsafe_code)]

use std::fmt;
use std::sync::OnceLock;

use crate::io::gds::{CuFileDriver, CuFileProperties};
use crate::io::gds_probe::{self, driver_version_text as version, reason_of};
use crate::memory::cuda::CudaDevice;

pub use crate::io::gds_probe::nvidia_fs_loaded;

/// The outcome of probing for one capability.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Probe<T> {
    /// Present; what was found.
    Available(T),
    /// Absent or unusable.
    Missing {
        /// Why, in words (the library names searched, the failing call and its status, ...).
        reason: String,
    },
}

impl<T> Probe<T> {
    /// Whether the capability is present.
    pub fn is_available(&self) -> bool {
        matches!(self, Probe::Available(_))
    }

    /// The value when present.
    pub fn available(&self) -> Option<&T> {
        match self {
            Probe::Available(v) => Some(v),
            Probe::Missing { .. } => None,
        }
    }

    /// The reason when missing.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Probe::Available(_) => None,
            Probe::Missing { reason } => Some(reason),
        }
    }

    fn missing(reason: impl Into<String>) -> Self {
        Probe::Missing { reason: reason.into() }
    }
}

/// The CUDA driver and its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CudaInfo {
    /// `cuDriverGetVersion` (e.g. 13000 for CUDA 13.0).
    pub driver_version: i32,
    /// The devices, by ordinal.
    pub devices: Vec<DeviceInfo>,
}

/// One CUDA device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Device name; empty if the device could not be opened.
    pub name: String,
    /// Total memory in bytes; 0 if the device could not be opened.
    pub total_memory: usize,
    /// PCI bus id, when reported.
    pub pci_bus_id: String,
    /// Why the device could not be opened, if it could not.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub error: Option<String>,
}

/// cuFile (GPUDirect Storage).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CuFileInfo {
    /// The library name (or `GPUMAP_CUFILE_LIBRARY` path) that loaded.
    pub library: String,
    /// Whether `cuFileDriverOpen` succeeded, with the driver's properties.
    pub driver: Probe<CuFileDriverInfo>,
}

/// The opened cuFile driver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CuFileDriverInfo {
    /// `cuFileDriverGetProperties`, when the library reports them.
    pub properties: Option<CuFileProperties>,
}

/// What this machine offers, probed once per process ([`Capabilities::probe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Capabilities {
    /// The CUDA driver and devices.
    pub cuda: Probe<CudaInfo>,
    /// cuFile library and driver.
    pub cufile: Probe<CuFileInfo>,
    /// Whether `/run/udev/data` is readable: cuFile looks up the block device there when a file
    /// is registered, and registration fails without it (typical in containers).
    pub run_udev: Probe<()>,
    /// Whether this is Windows Subsystem for Linux (`/proc/version` names Microsoft/WSL), where
    /// GPUDirect Storage is not supported.
    pub wsl: bool,
}

fn probe_cuda() -> Probe<CudaInfo> {
    let count = match CudaDevice::count() {
        Ok(n) => n,
        Err(e) => return Probe::missing(reason_of(e)),
    };
    let driver_version = CudaDevice::driver_version().unwrap_or(0);
    if count == 0 {
        return Probe::missing(format!(
            "driver {} found but no CUDA devices",
            version(driver_version)
        ));
    }
    let devices = (0..count)
        .map(|ordinal| match CudaDevice::new(ordinal) {
            Ok(d) => DeviceInfo {
                ordinal,
                name: d.name().to_owned(),
                total_memory: d.total_memory(),
                pci_bus_id: d.pci_bus_id().to_owned(),
                error: None,
            },
            Err(e) => DeviceInfo {
                ordinal,
                name: String::new(),
                total_memory: 0,
                pci_bus_id: String::new(),
                error: Some(crate::error::Report(&e).to_string()),
            },
        })
        .collect();
    Probe::Available(CudaInfo { driver_version, devices })
}

fn probe_cufile() -> Probe<CuFileInfo> {
    let library = match CuFileDriver::library_name() {
        Ok(name) => name.to_owned(),
        Err(e) => return Probe::missing(reason_of(e)),
    };
    let driver = match CuFileDriver::get() {
        Ok(d) => Probe::Available(CuFileDriverInfo { properties: d.properties().copied() }),
        Err(e) => Probe::missing(reason_of(e)),
    };
    Probe::Available(CuFileInfo { library, driver })
}

impl Capabilities {
    /// Probes the machine once per process and returns the cached answer. Never panics: missing
    /// libraries and failing calls become [`Probe::Missing`] with their reason.
    pub fn probe() -> &'static Capabilities {
        static CAPS: OnceLock<Capabilities> = OnceLock::new();
        CAPS.get_or_init(|| Capabilities {
            cuda: probe_cuda(),
            cufile: probe_cufile(),
            run_udev: match gds_probe::run_udev() {
                Ok(()) => Probe::Available(()),
                Err(reason) => Probe::Missing { reason },
            },
            wsl: gds_probe::wsl(),
        })
    }

    /// Whether at least one CUDA device can be used.
    pub fn gpu_available(&self) -> bool {
        self.cuda.available().is_some_and(|c| c.devices.iter().any(|d| d.error.is_none()))
    }

    /// Why no GPU can be used, or `None` when one can.
    pub fn cuda_reason(&self) -> Option<&str> {
        match &self.cuda {
            Probe::Missing { reason } => Some(reason),
            Probe::Available(_) if self.gpu_available() => None,
            Probe::Available(c) => c
                .devices
                .iter()
                .find_map(|d| d.error.as_deref())
                .or(Some("no device could be opened")),
        }
    }

    /// `Ok` when cuFile can be tried, else every reason it cannot (library, driver, `/run/udev`,
    /// WSL, no GPU), joined with "; ". File registration can still fail per file; that error is
    /// reported by [`crate::io::gds::CuFileHandle::register`].
    pub fn cufile_usable(&self) -> Result<(), String> {
        let cufile = match &self.cufile {
            Probe::Missing { reason } => Some(reason.as_str()),
            Probe::Available(info) => info.driver.reason(),
        };
        gds_probe::usable_from(self.cuda_reason(), cufile, self.run_udev.reason(), self.wsl)
    }
}

fn human_bytes(bytes: usize) -> String {
    const GIB: usize = 1 << 30;
    const MIB: usize = 1 << 20;
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    }
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cuda {
            Probe::Available(c) => {
                writeln!(
                    f,
                    "CUDA: driver {} ({} device(s))",
                    version(c.driver_version),
                    c.devices.len()
                )?;
                for d in &c.devices {
                    match &d.error {
                        None => writeln!(
                            f,
                            "  GPU {}: {}, {} (PCI {})",
                            d.ordinal,
                            d.name,
                            human_bytes(d.total_memory),
                            if d.pci_bus_id.is_empty() { "?" } else { &d.pci_bus_id }
                        )?,
                        Some(e) => writeln!(f, "  GPU {}: unusable: {e}", d.ordinal)?,
                    }
                }
            }
            Probe::Missing { reason } => writeln!(f, "CUDA: not available: {reason}")?,
        }
        match &self.cufile {
            Probe::Available(info) => {
                writeln!(f, "cuFile: library {}", info.library)?;
                match &info.driver {
                    Probe::Available(d) => match &d.properties {
                        Some(p) => writeln!(
                            f,
                            "  driver: open (nvidia-fs {}.{}, max direct I/O {}, max batch {})",
                            p.nvfs_version.0,
                            p.nvfs_version.1,
                            human_bytes(p.max_direct_io_size),
                            p.max_batch_io_size
                        )?,
                        None => writeln!(f, "  driver: open")?,
                    },
                    Probe::Missing { reason } => writeln!(f, "  driver: not open: {reason}")?,
                }
            }
            Probe::Missing { reason } => writeln!(f, "cuFile: not available: {reason}")?,
        }
        match &self.run_udev {
            Probe::Available(()) => writeln!(f, "udev database: present")?,
            Probe::Missing { reason } => writeln!(f, "udev database: missing ({reason})")?,
        }
        writeln!(f, "WSL: {}", if self.wsl { "yes" } else { "no" })?;
        match self.cufile_usable() {
            Ok(()) => write!(f, "GPUDirect Storage: can be tried"),
            Err(r) => write!(f, "GPUDirect Storage: not usable: {r}"),
        }
    }
}
