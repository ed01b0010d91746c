//! FileHandle throughput into host memory, beside memcpy, dd and cat on the same file.
//!
//!     cargo bench --bench filehandle -- --jsonl OUT.jsonl FILE [--quick]
//!
//! Speaks the JSON-lines format of `shared/gpu/README.md`; on the GPU machine it is staged as
//! `bench-filehandle` and run by `on-device.sh bench`.
use std::process::ExitCode;

use gpumap::bench::{append_jsonl, parse_bench_args, run_host, BenchOptions};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (jsonl, file, quick) = match parse_bench_args(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if gpumap::Capabilities::probe().gpu_available() && std::env::var("GPUMAP_BENCH_HOST").is_err()
    {
        // Host-memory figures next to device figures would read as device results in the
        // side-by-side table; bench-device measures device memory here.
        eprintln!("bench-filehandle: a GPU is present, host-memory workloads skipped (GPUMAP_BENCH_HOST=1 runs them)");
        return ExitCode::SUCCESS;
    }
    let mut options = BenchOptions::standard(file);
    if quick {
        options.threads = vec![1, 2];
        options.write_threads = vec![1, 2];
        options.write_bytes = 256 << 20;
        options.random_ops = 4096;
    }
    let mut failed = false;
    let result = run_host(&options, &mut |record| {
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
