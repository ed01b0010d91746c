//! FileHandle throughput into and out of GPU memory (the POSIX pipelined path and, where
//! cuFile registers the file, the cuFile path), beside a pinned host-to-device copy.
//!
//!     cargo bench --bench device -- --jsonl OUT.jsonl FILE [--quick]
//!
//! Speaks the JSON-lines format of `docs/benchmarks.md`; staged as `bench-device`. Without a
//! GPU it says so and exits successfully, measuring nothing.
use gpumap::memory::cuda::CudaDevice;
use gpumap_bench::{run_device, target_main};

fn main() -> std::process::ExitCode {
    target_main(|options, emit| match CudaDevice::new(0) {
        Ok(device) => run_device(options, &device, emit),
        Err(e) => {
            tracing::warn!("bench-device: no GPU, nothing measured ({e})");
            Ok(())
        }
    })
}
