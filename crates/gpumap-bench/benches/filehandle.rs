//! FileHandle throughput into host memory, beside memcpy, dd and cat on the same file.
//!
//!     cargo bench --bench filehandle -- --jsonl OUT.jsonl FILE [--quick]
//!
//! Speaks the JSON-lines format of `docs/benchmarks.md`; on the GPU machine it is staged as
//! `bench-filehandle` and run by `on-device.sh bench`, where it measures nothing unless
//! `GPUMAP_BENCH_HOST=1`: host-memory figures next to device figures would read as device
//! results in the side-by-side table, and `bench-device` measures device memory there.
use gpumap_bench::{run_host, target_main};

fn main() -> std::process::ExitCode {
    target_main(|options, emit| {
        let gpu = gpumap::Capabilities::probe().gpu_available();
        if gpu && std::env::var("GPUMAP_BENCH_HOST").is_err() {
            tracing::info!("bench-filehandle: a GPU is present, host-memory workloads skipped");
            return Ok(());
        }
        run_host(options, emit)
    })
}
