//! `gpumap write s3://...` (or `gs://...`, `az://...`): the generated pattern written from GPU
//! (or host) memory as a new object, through a multipart upload, and the rate reported.

use std::time::Instant;

use serde::Serialize;

use gpumap::memory::{DeviceBuffer, HostBuffer};
use gpumap::remote::RemoteWriter;
use gpumap::Error;

use crate::error::CliResult;
use crate::output;
use crate::progress::{in_pieces, progress_bar};
use crate::schema::{Memory, SCHEMA};
use crate::transfer::{stage_pattern, WriteArgs};
use crate::units::{human, rate_text};

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
