//! `gpumap bench`: the standard workloads on one file, as a table (or JSON lines).

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use gpumap::memory::cuda::CudaDevice;
use gpumap_bench::{append_jsonl, run_device, run_host, BenchOptions, Record};

use crate::error::{CliError, CliResult};
use crate::output;
use crate::schema::SCHEMA;
use crate::units::rate_text;

/// Arguments of `gpumap bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The file to read (not modified; writes go to a new scratch file beside it, removed on
    /// every way out, Ctrl-C included).
    file: PathBuf,
    /// Fewer thread counts, a smaller write and fewer random reads.
    #[arg(long)]
    quick: bool,
    /// Thread counts for sequential reads, e.g. 1,4,8,16.
    #[arg(long, value_delimiter = ',', value_parser = crate::transfer::threads_arg)]
    threads: Option<Vec<usize>>,
    /// Measure host memory even where there is a GPU.
    #[arg(long)]
    host: bool,
    /// Also append every measurement to this file (the shared JSON-lines format).
    #[arg(long)]
    jsonl: Option<PathBuf>,
    /// Print each measurement as a JSON line instead of the table (errors too; see
    /// docs/cli-json.md).
    #[arg(long)]
    json: bool,
}

/// A measurement as `--json` prints it: the record with the schema version.
#[derive(Serialize)]
struct Line<'a> {
    schema: u32,
    #[serde(flatten)]
    record: &'a Record,
}

/// `gpumap bench`.
pub fn bench(args: &BenchArgs) -> CliResult {
    let mut options = if args.quick {
        BenchOptions::quick(&args.file)
    } else {
        BenchOptions::standard(&args.file)
    };
    if let Some(t) = &args.threads {
        if t.iter().any(|&n| gpumap::config::check_nthreads(n).is_err()) {
            return Err(CliError::Usage(format!(
                "--threads: counts must be from 1 to {}",
                gpumap::config::MAX_THREADS
            )));
        }
        options.threads = t.clone();
    }
    if let Some(path) = &args.jsonl {
        // Refused now, not after minutes of measuring: a directory, a path in no directory,
        // a file that may not be written.
        std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|source| {
            gpumap::Error::Io { op: "open", path: Some(path.clone()), offset: None, source }
        })?;
    }
    let mut records: Vec<Record> = Vec::new();
    let mut failed: Option<CliError> = None;
    let mut emit = |r: &Record| {
        if let Some(path) = &args.jsonl {
            if let Err(e) = append_jsonl(path, r) {
                failed.get_or_insert(e.into());
            }
        }
        if args.json {
            if let Err(e) = output::json(&Line { schema: SCHEMA, record: r }) {
                // The reader is gone or the output broken: nothing more to measure for.
                output::exit_on(e);
            }
        } else {
            output::note(format!(
                "{} {} x{}: {}",
                r.implementation,
                r.workload,
                r.threads,
                rate_text(r.gbps * 1e9)
            ));
        }
        records.push(r.clone());
    };
    if args.host {
        run_host(&options, &mut emit)?;
    } else {
        match CudaDevice::new(0) {
            Ok(device) => {
                let name = device.name();
                output::note(format!("measuring GPU {} ({name}) memory", device.ordinal()));
                run_device(&options, &device, &mut emit)?
            }
            Err(e) => {
                output::note(format!(
                    "no GPU ({}): host memory stands in (--host asks for it and skips this note)",
                    gpumap::error::Report(&e)
                ));
                run_host(&options, &mut emit)?
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    if !args.json {
        output::try_line(format!(
            "{:<24} {:<22} {:>7} {:>10} {:>12}",
            "impl", "workload", "threads", "GB/s", "IOPS"
        ))?;
        for r in &records {
            let iops = r.iops.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into());
            output::try_line(format!(
                "{:<24} {:<22} {:>7} {:>10.2} {:>12}",
                r.implementation, r.workload, r.threads, r.gbps, iops
            ))?;
        }
    }
    Ok(())
}
