//! `gpumap map`: map a file into GPU memory and walk it through views, under a budget.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use serde::Serialize;

use gpumap::mapped::{MapOptions, MapStats};
use gpumap::{Error, Result};

use crate::transfer::{size_arg, MemoryArgs};
use crate::{output, pattern};

/// Arguments of `gpumap map`.
#[derive(Args, Debug)]
pub struct MapArgs {
    /// The file to map.
    file: PathBuf,
    /// Device memory the map may use, e.g. 512MiB (whole 2 MiB frames).
    #[arg(long, default_value = "1GiB", value_parser = size_arg)]
    budget: u64,
    /// Unit of validity and I/O: a power of two from 4KiB to 2MiB.
    #[arg(long, default_value = "64KiB", value_parser = size_arg)]
    extent: u64,
    /// Unit of device memory (mapped, evicted, budgeted): a multiple of 2MiB (default 8MiB).
    #[arg(long, value_parser = size_arg)]
    frame: Option<u64>,
    /// Bytes per view when walking the file in order (at most the budget).
    #[arg(long, default_value = "64MiB", value_parser = size_arg)]
    window: u64,
    /// Instead of walking in order, open this many views at random aligned offsets.
    #[arg(long)]
    random: Option<u64>,
    /// Bytes per random view.
    #[arg(long, default_value = "4KiB", value_parser = size_arg)]
    block: u64,
    /// Check every byte seen against the pattern `gpumap write` generates.
    #[arg(long)]
    verify_pattern: bool,
    #[command(flatten)]
    placement: MemoryArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    file: PathBuf,
    memory: String,
    access: &'static str,
    views: u64,
    bytes_viewed: u64,
    seconds: f64,
    gbps: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    verified: Option<bool>,
    stats: MapStats,
}

/// `gpumap map`.
pub fn map(args: &MapArgs) -> Result<()> {
    let mut options = MapOptions::new();
    options.memory(args.placement.device()?).budget(args.budget).extent_size(args.extent);
    if let Some(frame) = args.frame {
        options.frame_size(frame);
    }
    let map = options.open(&args.file)?;
    let len = map.len();
    // Views of whole frames, as many as the budget holds at most.
    let frame = map.frame_size();
    let budget_frames = (map.stats().budget / frame).max(1);
    let window = (args.window / frame).clamp(1, budget_frames) * frame;
    let mut seen = Vec::new();
    let check = |seen: &mut Vec<u8>, view: &gpumap::mapped::View| -> Result<()> {
        if !args.verify_pattern {
            return Ok(());
        }
        seen.resize(view.len() as usize, 0);
        view.copy_to_host(0, seen)?;
        match pattern::first_mismatch(seen, view.offset()) {
            Some(at) => Err(Error::InvalidArgument(format!(
                "--verify-pattern: byte at offset {at} differs from the pattern gpumap write generates"
            ))),
            None => Ok(()),
        }
    };
    let start = Instant::now();
    let (mut views, mut bytes) = (0u64, 0u64);
    match args.random {
        None => {
            let mut offset = 0;
            while offset < len {
                let view = map.view(offset, window.min(len - offset))?;
                check(&mut seen, &view)?;
                offset += view.len();
                bytes += view.len();
                views += 1;
            }
        }
        Some(count) => {
            if args.block == 0 || args.block > len {
                return Err(Error::InvalidArgument(format!(
                    "--block {} does not fit in a file of {len} bytes",
                    args.block
                )));
            }
            let count = usize::try_from(count).map_err(|_| {
                Error::InvalidArgument(format!("--random {count} is too many views"))
            })?;
            for offset in gpumap_bench::random_offsets(len, args.block, count) {
                let view = map.view(offset, args.block)?;
                check(&mut seen, &view)?;
                bytes += args.block;
                views += 1;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let report = Report {
        file: args.file.clone(),
        memory: map.memory(),
        access: if args.random.is_some() { "random" } else { "sequential" },
        views,
        bytes_viewed: bytes,
        seconds,
        gbps: bytes as f64 / seconds.max(1e-9) / 1e9,
        verified: args.verify_pattern.then_some(true),
        stats: map.stats(),
    };
    if args.json {
        let text = serde_json::to_string(&report)
            .map_err(|e| Error::InvalidArgument(format!("cannot print JSON: {e}")))?;
        output::line(text);
    } else {
        let s = &report.stats;
        output::line(format!(
            "mapped {} ({} bytes) into {}: {} {} views of {} bytes in {:.3} s, {:.2} GB/s{}",
            report.file.display(),
            s.len,
            report.memory,
            report.views,
            report.access,
            report.bytes_viewed,
            report.seconds,
            report.gbps,
            if report.verified == Some(true) { ", pattern verified" } else { "" }
        ));
        output::line(format!(
            "  faults: {} reads, {} bytes, {:.3} s; mapping memory: {:.3} s; evictions: {}; \
             resident {} of budget {} bytes",
            s.fault_reads,
            s.bytes_faulted,
            s.fault_seconds,
            s.map_seconds,
            s.evictions,
            s.resident_bytes,
            s.budget
        ));
    }
    Ok(())
}
