//! `gpumap bench`: the standard workloads on one file, as a table (or JSON lines).

use std::path::PathBuf;

use clap::Args;

use gpumap::memory::cuda::CudaDevice;
use gpumap::{Error, Result};
use gpumap_bench::{append_jsonl, run_device, run_host, BenchOptions, Record};

use crate::output;

/// Arguments of `gpumap bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The file to read (not modified; writes go to a sibling file, removed afterwards).
    file: PathBuf,
    /// Fewer thread counts, a smaller write and fewer random reads.
    #[arg(long)]
    quick: bool,
    /// Thread counts for sequential reads, e.g. 1,4,8,16.
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Measure host memory even where there is a GPU.
    #[arg(long)]
    host: bool,
    /// Also append every measurement to this file (the shared JSON-lines format).
    #[arg(long)]
    jsonl: Option<PathBuf>,
    /// Print JSON lines instead of the table.
    #[arg(long)]
    json: bool,
}

/// `gpumap bench`.
pub fn bench(args: &BenchArgs) -> Result<()> {
    let mut options = if args.quick {
        BenchOptions::quick(&args.file)
    } else {
        BenchOptions::standard(&args.file)
    };
    if let Some(t) = &args.threads {
        if t.contains(&0) {
            return Err(Error::InvalidArgument("--threads: counts must be at least 1".into()));
        }
        options.threads = t.clone();
    }
    let mut records: Vec<Record> = Vec::new();
    let mut sink_error = None;
    let mut emit = |r: &Record| {
        if let Some(path) = &args.jsonl {
            if let Err(e) = append_jsonl(path, r) {
                sink_error.get_or_insert(e);
            }
        }
        if args.json {
            output::line(serde_json::to_string(r).unwrap_or_default());
        } else {
            eprintln!("  {} {} x{}: {:.2} GB/s", r.implementation, r.workload, r.threads, r.gbps);
        }
        records.push(r.clone());
    };
    match (args.host, CudaDevice::new(0)) {
        (false, Ok(device)) => {
            eprintln!("measuring GPU {} ({}) memory", device.ordinal(), device.name());
            run_device(&options, &device, &mut emit)?
        }
        (_, Err(e)) if !args.host => {
            eprintln!("no GPU ({e}): measuring host memory");
            run_host(&options, &mut emit)?
        }
        _ => run_host(&options, &mut emit)?,
    }
    if let Some(e) = sink_error {
        return Err(e);
    }
    if !args.json {
        output::line(format!(
            "{:<24} {:<22} {:>7} {:>10} {:>12}",
            "impl", "workload", "threads", "GB/s", "IOPS"
        ));
        for r in &records {
            let iops = r.iops.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into());
            output::line(format!(
                "{:<24} {:<22} {:>7} {:>10.2} {:>12}",
                r.implementation, r.workload, r.threads, r.gbps, iops
            ));
        }
    }
    Ok(())
}
