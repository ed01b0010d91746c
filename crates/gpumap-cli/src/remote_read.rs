//! `gpumap read s3://...` and `gpumap read https://...`: a remote object read with ranged GETs
//! into GPU (or host) memory, and the rate reported.

use std::time::Instant;

use serde::Serialize;

use gpumap::memory::DeviceBuffer;
use gpumap::remote::RemoteFile;
use gpumap::Error;

use crate::error::{CliError, CliResult};
use crate::output;
use crate::schema::{Memory, SCHEMA};
use crate::transfer::ReadArgs;
use crate::units::{human, rate_text};

/// What one remote read did, for the text line and `--json` (schema 1, `op` `"read"`).
#[derive(Serialize, Debug)]
struct RemoteReport {
    schema: u32,
    op: &'static str,
    /// The URL, without credentials.
    url: String,
    offset: u64,
    bytes: u64,
    seconds: f64,
    gbps: f64,
    runs_gbps: Vec<f64>,
    /// Ranged GETs in flight at most (`null`: picked from each read's size).
    max_in_flight: Option<u64>,
    request_size: u64,
    memory: Memory,
}

/// `gpumap read` of a URL.
pub fn read(args: &ReadArgs, url: &str) -> CliResult {
    if let Some(flag) = args.local_only_flag() {
        return Err(
            Error::InvalidArgument(format!("{flag} applies to local files, not to {url}")).into()
        );
    }
    let options = args.remote.options()?;
    let (device, memory) = args.options.placement.memory()?;
    let file = RemoteFile::open_with(url, &options)?;
    let len = crate::transfer::read_len(args.offset, args.len, file.len())?;
    let size = usize::try_from(len)
        .map_err(|_| Error::InvalidArgument(format!("--len {len} does not fit in memory")))?;
    let mut buf = DeviceBuffer::alloc(&device, size).map_err(|error| CliError::Hinted {
        hint: format!(
            "reading {} whole needs {} of {} at once: read part of it with --offset and --len",
            file.url(),
            human(len),
            memory.describe()
        ),
        error,
    })?;
    let mut runs = Vec::with_capacity(args.repeat as usize);
    for _ in 0..args.repeat {
        let start = Instant::now();
        file.read_device(buf.view_mut(), args.offset)?;
        runs.push(start.elapsed().as_secs_f64());
    }
    if args.verify_pattern {
        let data = buf.to_vec()?;
        if let Some(offset) = crate::pattern::first_mismatch(&data, args.offset) {
            return Err(CliError::DataDiffer {
                offset,
                memory: memory.describe(),
                reference: "the pattern gpumap write generates",
            });
        }
    }
    let seconds = runs.iter().copied().fold(f64::INFINITY, f64::min);
    let rate = |seconds: f64| len as f64 / seconds.max(1e-9) / 1e9;
    let report = RemoteReport {
        schema: SCHEMA,
        op: "read",
        url: file.url().to_string(),
        offset: args.offset,
        bytes: len,
        seconds,
        gbps: rate(seconds),
        runs_gbps: runs.iter().map(|&s| rate(s)).collect(),
        max_in_flight: args.remote.max_in_flight,
        request_size: file.options().get_request_size(),
        memory,
    };
    if args.options.json {
        return output::json(&report);
    }
    output::try_line(format!(
        "read {} bytes from {} at offset {} in {:.3} s: {} ({} requests of {} in flight at most, {}){}",
        report.bytes,
        report.url,
        report.offset,
        report.seconds,
        rate_text(report.gbps * 1e9),
        report.max_in_flight.map_or("auto".to_owned(), |n| n.to_string()),
        human(report.request_size),
        report.memory.describe(),
        if args.verify_pattern { ", verified" } else { "" },
    ))
}
