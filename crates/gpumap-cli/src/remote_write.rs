//! `gpumap write s3://...`: the generated pattern written from GPU (or host) memory as a new S3
//! object, through a multipart upload, and the rate reported.

use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use gpumap::memory::{DeviceBuffer, HostBuffer};
use gpumap::remote::{RemoteOptions, RemoteWriter};
use gpumap::Error;

use crate::error::CliResult;
use crate::output;
use crate::schema::{Memory, SCHEMA};
use crate::transfer::{
    human, in_pieces, progress_bar, rate_text, size_arg, stage_pattern, WriteArgs,
};

/// Options of writes to `s3://` URLs (refused for local files).
#[derive(Args, Debug)]
pub struct RemoteWriteArgs {
    /// Bytes of each part of the upload but the last, 5MiB to 5GiB (default: 16 MiB); an
    /// object holds 10,000 parts at most.
    #[arg(long, value_parser = size_arg)]
    part_size: Option<u64>,
    /// Parts held in memory and sent at once, 1 to 1024 (default: 64, within 4 GiB).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=gpumap::remote::MAX_IN_FLIGHT as u64))]
    max_in_flight: Option<u64>,
    /// Requests made for one part before giving up (default: the http_max_attempts setting,
    /// GPUMAP_HTTP_MAX_ATTEMPTS or KVIKIO_HTTP_MAX_ATTEMPTS; 3 as KvikIO's).
    #[arg(long = "http-max-attempts", value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: Option<u32>,
    /// Seconds one request may take, body included (default: the http_timeout setting; 60 as
    /// KvikIO's).
    #[arg(long = "http-timeout", value_parser = clap::value_parser!(u64).range(1..))]
    timeout: Option<u64>,
    /// HTTP statuses retried, comma-separated (default: the http_status_codes setting;
    /// 429,500,502,503,504 as KvikIO's).
    #[arg(long = "http-status-codes", value_delimiter = ',')]
    status_codes: Option<Vec<u16>>,
}

impl RemoteWriteArgs {
    /// The first of these options given, for refusing it with a local file.
    pub(crate) fn given_flag(&self) -> Option<&'static str> {
        [
            (self.part_size.is_some(), "--part-size"),
            (self.max_in_flight.is_some(), "--max-in-flight"),
            (self.max_attempts.is_some(), "--http-max-attempts"),
            (self.timeout.is_some(), "--http-timeout"),
            (self.status_codes.is_some(), "--http-status-codes"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    fn options(&self) -> gpumap::Result<RemoteOptions> {
        let mut options = RemoteOptions::from_config(gpumap::config::Config::global()?)?;
        if let Some(bytes) = self.part_size {
            options.part_size(bytes)?;
        }
        if let Some(n) = self.max_in_flight {
            options.max_in_flight(Some(n as usize))?;
        }
        if let Some(n) = self.max_attempts {
            options.max_attempts(n)?;
        }
        if let Some(seconds) = self.timeout {
            options.timeout(Duration::from_secs(seconds))?;
        }
        if let Some(codes) = &self.status_codes {
            options.retry_status_codes(codes)?;
        }
        Ok(options)
    }
}

/// What one remote write did, for the text line and `--json` (schema 1, `op` `"write"`).
#[derive(Serialize, Debug)]
struct RemoteWriteReport {
    schema: u32,
    op: &'static str,
    /// The URL, without credentials.
    url: String,
    offset: u64,
    bytes: u64,
    /// Seconds from the first write to the completed upload (generating the pattern is not
    /// counted).
    seconds: f64,
    gbps: f64,
    runs_gbps: Vec<f64>,
    part_size: u64,
    /// Parts held and sent at once, at most.
    max_in_flight: usize,
    memory: Memory,
    /// Always `true`: the object exists, whole, once the upload is completed.
    durable: bool,
}

/// `gpumap write` of a URL: a new object of `--size` bytes of the pattern, or none at all.
pub fn write(args: &WriteArgs, url: &str) -> CliResult {
    if let Some(flag) = args.local_only_flag() {
        return Err(
            Error::InvalidArgument(format!("{flag} applies to local files, not to {url}")).into()
        );
    }
    if args.offset != 0 {
        return Err(Error::InvalidArgument(format!(
            "--offset {}: an object is written whole, from byte 0, not into an existing one",
            args.offset
        ))
        .into());
    }
    let size = usize::try_from(args.size).map_err(|_| {
        Error::InvalidArgument(format!("--size {} does not fit in memory", args.size))
    })?;
    let options = args.remote.options()?;
    let (device, memory) = args.options.placement.memory()?;
    let writer = RemoteWriter::create_with(url, &options)?;
    // Written in order, a piece at a time: parts fill and go out as the pieces pass them.
    let piece = size.clamp(1, 64 << 20);
    let mut staged = DeviceBuffer::alloc(&device, piece)?;
    let mut pattern_buf = if device.is_host() { None } else { Some(HostBuffer::new(piece)?) };
    let bar = progress_bar(args.size, args.options.json, "write");
    let mut seconds = 0.0;
    // On any error the writer is dropped unfinished, which aborts the upload.
    in_pieces(size, piece, &bar, |at, n| {
        stage_pattern(&mut staged, pattern_buf.as_mut(), at as u64, n)?;
        let start = Instant::now();
        writer.pwrite_device(staged.view().slice(0..n)?, at as u64)?;
        seconds += start.elapsed().as_secs_f64();
        Ok(())
    })?;
    let start = Instant::now();
    let bytes = writer.finish()?;
    seconds += start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let gbps = bytes as f64 / f64::max(seconds, 1e-9) / 1e9;
    let report = RemoteWriteReport {
        schema: SCHEMA,
        op: "write",
        url: writer.url().to_string(),
        offset: 0,
        bytes,
        seconds,
        gbps,
        runs_gbps: vec![gbps],
        part_size: writer.part_size(),
        max_in_flight: writer.max_parts_held(),
        memory,
        durable: true,
    };
    if args.options.json {
        return output::json(&report);
    }
    output::try_line(format!(
        "wrote {} bytes to {} in {:.3} s: {} (parts of {}, {} in flight at most, {})",
        report.bytes,
        report.url,
        report.seconds,
        rate_text(report.gbps * 1e9),
        human(report.part_size),
        report.max_in_flight,
        report.memory.describe(),
    ))
}
