//! Whether cuFile can be used on this machine, and every reason it cannot: a usable GPU,
//! cuFile's library and driver, the udev database cuFile registers files through, and WSL;
//! and whether the nvidia-fs module that GPUDirect Storage's DMA goes through is loaded.
//!
//! What compat decides by, probed once per process like the rest of
//! `Capabilities`, which reports the same answers.
#![forbid(unsafe_code)]

use std::sync::OnceLock;

use crate::error::{Error, Report};
use crate::io::gds::CuFileDriver;
use crate::memory::cuda::CudaDevice;

/// Whether the nvidia-fs kernel module — what GPUDirect Storage's DMA goes through — is
/// loaded: it creates `/proc/driver/nvidia-fs` and `/sys/module/nvidia_fs`. A file check, so
/// that deciding against cuFile does not cost opening its driver. Without it, compat mode
/// `Auto` chooses the POSIX path without loading cuFile.
pub fn nvidia_fs_loaded() -> bool {
    std::path::Path::new("/proc/driver/nvidia-fs/version").exists()
        || std::path::Path::new("/sys/module/nvidia_fs").exists()
}

/// `Ok` when `/run/udev/data` is readable, else why not: cuFile looks up the block device
/// there when a file is registered, and registration fails without it (typical in
/// containers). Probed once.
pub(crate) fn run_udev() -> Result<(), String> {
    static RUN_UDEV: OnceLock<Result<(), String>> = OnceLock::new();
    RUN_UDEV
        .get_or_init(|| match std::fs::read_dir("/run/udev/data") {
            Ok(_) => Ok(()),
            Err(e) => Err(format!("/run/udev/data: {e}")),
        })
        .clone()
}

/// Whether this is Windows Subsystem for Linux (`/proc/version` names Microsoft/WSL), where
/// GPUDirect Storage is not supported. Probed once.
pub(crate) fn wsl() -> bool {
    static WSL: OnceLock<bool> = OnceLock::new();
    *WSL.get_or_init(|| {
        std::fs::read_to_string("/proc/version")
            .map(|v| v.to_ascii_lowercase().contains("microsoft") || v.contains("WSL"))
            .unwrap_or(false)
    })
}

/// `Ok` when cuFile can be tried, else every reason it cannot (see [`usable_from`]). Probed
/// once. File registration can still fail per file.
pub(crate) fn cufile_usable() -> Result<(), String> {
    static USABLE: OnceLock<Result<(), String>> = OnceLock::new();
    USABLE
        .get_or_init(|| {
            let udev = run_udev().err();
            usable_from(gpu_reason().as_deref(), cufile_reason().as_deref(), udev.as_deref(), wsl())
        })
        .clone()
}

/// The rule: `Ok` when nothing stands against cuFile, else every reason — no usable GPU
/// (`gpu`), cuFile's library or driver (`cufile`), no udev database (`run_udev`), WSL —
/// joined with "; ".
pub(crate) fn usable_from(
    gpu: Option<&str>,
    cufile: Option<&str>,
    run_udev: Option<&str>,
    wsl: bool,
) -> Result<(), String> {
    let mut reasons = Vec::new();
    if let Some(r) = gpu {
        reasons.push(format!("no usable GPU: {r}"));
    }
    if let Some(r) = cufile {
        reasons.push(r.to_owned());
    }
    if let Some(r) = run_udev {
        reasons.push(format!("cuFile cannot register files without a udev database ({r})"));
    }
    if wsl {
        reasons.push("GPUDirect Storage is not supported under WSL".to_owned());
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons.join("; "))
    }
}

/// Why no GPU can be used, or `None` when one can: no driver, no devices, or the first
/// device's error when none opens.
fn gpu_reason() -> Option<String> {
    let count = match CudaDevice::count() {
        Ok(n) => n,
        Err(e) => return Some(reason_of(e)),
    };
    if count == 0 {
        let version = driver_version_text(CudaDevice::driver_version().unwrap_or(0));
        return Some(format!("driver {version} found but no CUDA devices"));
    }
    let mut first_error = None;
    for ordinal in 0..count {
        match CudaDevice::new(ordinal) {
            Ok(_) => return None,
            Err(e) => {
                first_error.get_or_insert_with(|| Report(&e).to_string());
            }
        }
    }
    Some(first_error.unwrap_or_else(|| "no device could be opened".to_owned()))
}

/// Why cuFile's library cannot be loaded or its driver opened, or `None` when both work.
fn cufile_reason() -> Option<String> {
    if let Err(e) = CuFileDriver::library_name() {
        return Some(reason_of(e));
    }
    CuFileDriver::get().err().map(reason_of)
}

/// The reason an error gives for a missing capability: an `Unavailable`'s own reason, else
/// the whole error.
pub(crate) fn reason_of(e: Error) -> String {
    match e {
        Error::Unavailable { reason, .. } => reason,
        other => Report(&other).to_string(),
    }
}

/// A CUDA driver version as `major.minor` (13000 is 13.0).
pub(crate) fn driver_version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}
