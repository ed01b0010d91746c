//! Which path a file's device transfers take — cuFile or POSIX — and why.
//!
//! | mode | cuFile usable and GDS-capable | cuFile usable, compatibility mode only | cuFile unusable |
//! |---|---|---|---|
//! | `On`   | POSIX (cuFile never loaded) | POSIX | POSIX |
//! | `Auto` | cuFile | POSIX (faster; see below) | POSIX, with the reason |
//! | `Off`  | cuFile | cuFile | error, with the reason |
//!
//! "Compatibility mode only": the cuFile driver opens and registers the file, but neither the
//! nvidia-fs module is loaded nor can the file be reached by DMA, so cuFile itself falls back to
//! `pread` into its own bounce buffers — one 4 MiB-ish transfer at a time per call, with no
//! overlap of disk and PCIe. gpumap's POSIX path does the same work pipelined, so `Auto` picks
//! it there; `Off` still forces cuFile (to test the cuFile path, or on a system whose DMA
//! support cuFile reports in a way gpumap does not recognise). Where the nvidia-fs module is
//! not loaded at all, `Auto` decides without opening cuFile's driver (half a second of a
//! process's first transfer).
#![forbid(unsafe_code)]

use std::fs::File;
use std::path::Path;

use crate::config::CompatMode;
use crate::error::{Error, Report, Result};
use crate::io::gds::{CuFileDriver, CuFileHandle};
use crate::io::gds_probe;
use crate::sys::posix;

/// The path a file's device transfers take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum IoPath {
    /// cuFile (`cuFileRead`/`cuFileWrite`), GPUDirect Storage where the system supports it.
    CuFile,
    /// `pread`/`pwrite` through pinned bounce buffers, pipelined with the copies to the GPU.
    Posix,
}

/// The compat-mode decision for one file, with the reason a person can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CompatDecision {
    /// The mode asked for.
    pub requested: CompatMode,
    /// The path chosen.
    pub path: IoPath,
    /// Why.
    pub reason: String,
}

/// Decides the path for `path` (already open as `file`) and registers it with cuFile when that
/// is the choice. `Off` turns every reason against cuFile into an error.
pub(crate) fn decide(
    mode: CompatMode,
    path: &Path,
    readable: bool,
    writable: bool,
) -> Result<(CompatDecision, Option<CuFileHandle>)> {
    let posix = |reason: String| {
        Ok((CompatDecision { requested: mode, path: IoPath::Posix, reason }, None))
    };
    let refuse = |reason: String| -> Result<(CompatDecision, Option<CuFileHandle>)> {
        match mode {
            CompatMode::Off => Err(Error::Unavailable { what: "cuFile", reason }),
            _ => posix(reason),
        }
    };
    if mode == CompatMode::On {
        return posix("compat mode is on: the POSIX path is used and cuFile is not loaded".into());
    }
    // `Auto` picks cuFile only for GPUDirect Storage, which needs nvidia-fs: without the module
    // the answer is known before cuFile's driver is opened, which costs a large part of a
    // process's first transfer (docs/decisions/0006-compat-auto-needs-nvidia-fs.md has the
    // figures).
    if mode == CompatMode::Auto && !gds_probe::nvidia_fs_loaded() {
        return posix(
            "nvidia-fs is not loaded, so cuFile could only run its own unpipelined POSIX \
             compatibility path; gpumap's pipelined POSIX path is used and cuFile is not loaded \
             (GPUMAP_COMPAT_MODE=off forces cuFile)"
                .into(),
        );
    }
    if let Err(reason) = gds_probe::cufile_usable() {
        return refuse(reason);
    }
    let driver = match CuFileDriver::get() {
        Ok(d) => d,
        Err(e) => return refuse(Report(&e).to_string()),
    };
    let gds_capable = driver.properties().is_some_and(|p| p.nvfs_version != (0, 0));
    if mode == CompatMode::Auto && !gds_capable {
        return posix(
            "nvidia-fs is not loaded, so cuFile could only run its own unpipelined POSIX \
             compatibility path; gpumap's pipelined POSIX path is used instead \
             (GPUMAP_COMPAT_MODE=off forces cuFile)"
                .into(),
        );
    }
    // cuFile moves data by DMA only on an O_DIRECT descriptor.
    let file: File = match posix::open_direct(path, readable, writable) {
        Ok(Some(f)) => f,
        Ok(None) => return refuse("the file system refuses O_DIRECT, which cuFile needs".into()),
        Err(e) => return refuse(Report(&e).to_string()),
    };
    match CuFileHandle::register(&file, path) {
        Ok(handle) => {
            let reason = if gds_capable {
                "cuFile registered the file and nvidia-fs is loaded (GPUDirect Storage)".to_string()
            } else {
                "compat mode is off: cuFile is used (in its own compatibility mode here, as \
                 nvidia-fs is not loaded)"
                    .to_string()
            };
            Ok((CompatDecision { requested: mode, path: IoPath::CuFile, reason }, Some(handle)))
        }
        Err(e) => refuse(format!("cuFile could not register the file: {}", Report(&e))),
    }
}
