//! The objects of the JSON the commands print, version [`SCHEMA`] (docs/cli-json.md): field
//! names are stable, every field is always present (`null` where it does not apply), and a
//! change that breaks a reader bumps the version.

use serde::Serialize;

use gpumap::config::DirectRead;
use gpumap::io::{FileHandle, IoPath};
use gpumap::memory::Device;

use crate::error::CliError;

/// The version every document carries as `"schema"`.
pub const SCHEMA: u32 = 1;

/// Where a command's bytes live: `{"kind": "gpu", "device": 0, "name": "NVIDIA H100", ...}` or
/// `{"kind": "host", "device": null, "name": "host memory", ...}`.
#[derive(Serialize, Debug, Clone)]
pub struct Memory {
    /// `"gpu"` or `"host"`.
    pub kind: &'static str,
    /// The GPU's ordinal; `null` for host memory.
    pub device: Option<usize>,
    /// The GPU's name, or `"host memory"`.
    pub name: String,
    /// Why host memory stands in for a GPU that was not named (no GPU, and why); `null` when
    /// the memory is what was asked for.
    pub fallback_reason: Option<String>,
}

impl Memory {
    /// `device`, chosen for the reason `fallback_reason` (see [`Memory::fallback_reason`]).
    pub fn new(device: &Device, fallback_reason: Option<String>) -> Memory {
        match device {
            Device::Cuda(gpu) => Memory {
                kind: "gpu",
                device: Some(gpu.ordinal()),
                name: gpu.name().to_owned(),
                fallback_reason: None,
            },
            Device::Host => {
                Memory { kind: "host", device: None, name: "host memory".into(), fallback_reason }
            }
        }
    }

    /// `"GPU 0 (NVIDIA H100)"` or `"host memory"`, for text.
    pub fn describe(&self) -> String {
        match self.device {
            Some(ordinal) => format!("GPU {ordinal} ({})", self.name),
            None => self.name.clone(),
        }
    }
}

/// The path device transfers take: `{"path": "posix" | "cufile", "reason": "..."}`.
#[derive(Serialize, Debug, Clone)]
pub struct TransferPath {
    /// `"cufile"` or `"posix"`.
    pub path: &'static str,
    /// Why.
    pub reason: String,
}

impl TransferPath {
    /// The path `handle` takes for transfers to `device` (host memory: always POSIX).
    pub fn of(handle: &FileHandle, device: &Device) -> TransferPath {
        if device.is_host() {
            return TransferPath {
                path: "posix",
                reason: "host memory is read and written with pread/pwrite".into(),
            };
        }
        let decision = handle.compat_decision();
        let path = match decision.path {
            IoPath::CuFile => "cufile",
            IoPath::Posix => "posix",
        };
        TransferPath { path, reason: decision.reason.clone() }
    }

    /// `"POSIX path"` or `"cuFile path"`, for text.
    pub fn describe(&self) -> &'static str {
        if self.path == "cufile" {
            "cuFile path"
        } else {
            "POSIX path"
        }
    }
}

/// Whether the page-aligned middle of transfers bypasses the page cache:
/// `{"enabled": true, "policy": "uncached", "reason": "..."}`.
#[derive(Serialize, Debug, Clone)]
pub struct DirectIo {
    /// Whether `O_DIRECT` is used (for reads under `uncached`: may be, where a range is not
    /// cached).
    pub enabled: bool,
    /// `"off"`, `"on"` or `"uncached"` for reads; `"off"` or `"on"` for writes.
    pub policy: &'static str,
    /// Why it is (not) used.
    pub reason: String,
}

impl DirectIo {
    /// What `handle` does for reads.
    pub fn for_reads(handle: &FileHandle) -> DirectIo {
        let policy = match handle.direct_read_policy() {
            DirectRead::Off => "off",
            DirectRead::On => "on",
            DirectRead::Uncached => "uncached",
        };
        DirectIo::new(handle, policy)
    }

    /// What `handle` does for writes, where they were asked to use `O_DIRECT` (`asked`).
    pub fn for_writes(handle: &FileHandle, asked: bool) -> DirectIo {
        DirectIo::new(handle, if asked { "on" } else { "off" })
    }

    fn new(handle: &FileHandle, policy: &'static str) -> DirectIo {
        let (enabled, reason) = match (policy, handle.direct_io_status()) {
            ("off", _) => {
                (false, "switched off (--direct, GPUMAP_AUTO_DIRECT_IO_READ/WRITE)".into())
            }
            (_, Err(why)) => (false, why.to_owned()),
            ("uncached", Ok(())) => {
                (true, "O_DIRECT for ranges the page cache does not hold".into())
            }
            (_, Ok(())) => (true, "O_DIRECT for the page-aligned middle of each task".into()),
        };
        DirectIo { enabled, policy, reason }
    }

    /// `"O_DIRECT on"`, `"O_DIRECT off"`, ... for text.
    pub fn describe(&self) -> &'static str {
        match (self.enabled, self.policy) {
            (true, "uncached") => "O_DIRECT where uncached",
            (true, _) => "O_DIRECT on",
            (false, "off") => "O_DIRECT off",
            (false, _) => "O_DIRECT refused",
        }
    }
}

/// `{"schema": 1, "error": {"kind": "io", "message": "...", "errno": 2}}`.
#[derive(Serialize, Debug)]
pub struct ErrorDocument {
    schema: u32,
    error: ErrorObject,
}

/// An error as scripts see it.
#[derive(Serialize, Debug, Clone)]
pub struct ErrorObject {
    /// A stable name: the library's [`gpumap::Error::code`], or `data_differ`, `usage`.
    pub kind: &'static str,
    /// The message with its causes, as printed on standard error.
    pub message: String,
    /// The OS error number, or `null`.
    pub errno: Option<i32>,
}

impl ErrorObject {
    /// `e` for scripts.
    pub fn new(e: &CliError) -> ErrorObject {
        ErrorObject { kind: e.kind(), message: e.to_string(), errno: e.errno() }
    }
}

impl ErrorDocument {
    /// The document for `e`.
    pub fn new(e: &CliError) -> ErrorDocument {
        ErrorDocument { schema: SCHEMA, error: ErrorObject::new(e) }
    }
}
