//! One measurement ([`Record`]) and its JSON-lines output.

use std::path::Path;

use serde::Serialize;

use gpumap::error::{Error, Result};

use crate::files::io_error;

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// Implementation (`gpumap-filehandle`, `memcpy`, `dd`, ...); ours start with `gpumap`.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// Workload name (`seq_read_warm`, `rand_read_4k_cold`, ...).
    pub workload: String,
    /// Threads used.
    pub threads: usize,
    /// Bytes moved.
    pub bytes: u64,
    /// Seconds taken.
    pub seconds: f64,
    /// Rate in GB/s (10^9 bytes per second).
    pub gbps: f64,
    /// Operations, for random reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops: Option<u64>,
    /// Operations per second, for random reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iops: Option<f64>,
}

impl Record {
    pub(crate) fn new(
        implementation: &str,
        workload: &str,
        threads: usize,
        bytes: u64,
        seconds: f64,
    ) -> Record {
        let seconds = seconds.max(1e-9);
        Record {
            implementation: implementation.into(),
            workload: workload.into(),
            threads,
            bytes,
            seconds: (seconds * 1e6).round() / 1e6,
            gbps: ((bytes as f64 / seconds / 1e9) * 1000.0).round() / 1000.0,
            ops: None,
            iops: None,
        }
    }

    pub(crate) fn with_ops(mut self, ops: u64) -> Record {
        self.ops = Some(ops);
        self.iops = Some((ops as f64 / self.seconds * 10.0).round() / 10.0);
        self
    }
}

/// Appends `record` as one JSON line to `out` (printing is the caller's: `gpumap bench
/// --json --jsonl F` prints each record once).
pub fn append_jsonl(out: &Path, record: &Record) -> Result<()> {
    use std::io::Write;
    let line = serde_json::to_string(record)
        .map_err(|e| Error::InvalidArgument(format!("cannot encode record: {e}")))?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .map_err(|e| io_error("open", Some(out), e))?;
    writeln!(f, "{line}").map_err(|e| io_error("write", Some(out), e))
}
