//! FileHandle throughput into and out of GPU memory (the POSIX pipelined path and, where
//! cuFile registers the file, the cuFile path), beside a pinned host-to-device copy.
//!
//!     cargo bench --bench device -- --jsonl OUT.jsonl FILE [--quick]
//!
//! Speaks the JSON-lines format of `shared/gpu/README.md`; staged as `bench-device`. Without a
//! GPU it says so and exits successfully, measuring nothing.
use std::process::ExitCode;

use gpumap::bench::{append_jsonl, parse_bench_args, run_device, BenchOptions};
use gpumap::memory::cuda::CudaDevice;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (jsonl, file, quick) = match parse_bench_args(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let device = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("bench-device: no GPU, nothing measured ({e})");
            return ExitCode::SUCCESS;
        }
    };
    let mut options = BenchOptions::standard(file);
    if quick {
        options.threads = vec![1, 8];
        options.write_threads = vec![1, 8];
        options.write_bytes = 256 << 20;
        options.random_ops = 4096;
    }
    let mut failed = false;
    let result = run_device(&options, &device, &mut |record| {
        if let Err(e) = append_jsonl(&jsonl, record) {
            eprintln!("cannot record a result: {e}");
            failed = true;
        }
    });
    match result {
        Ok(()) if !failed => ExitCode::SUCCESS,
        Ok(()) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}
