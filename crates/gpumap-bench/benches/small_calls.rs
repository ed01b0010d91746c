//! The latency of one small read into GPU memory and of its parts (a 4 KiB `pread` into pinned
//! memory, a 4 KiB copy up), each call waited for before the next.
//!
//!     cargo bench --bench small_calls -- --jsonl OUT.jsonl FILE [--quick]
//!
//! Speaks the JSON-lines format of `docs/benchmarks.md`; staged as `bench-small_calls`. Without
//! a GPU it says so and exits successfully, measuring nothing.
use gpumap::memory::cuda::CudaDevice;
use gpumap_bench::{run_small_calls, target_main};

fn main() -> std::process::ExitCode {
    target_main(|options, emit| match CudaDevice::new(0) {
        Ok(device) => run_small_calls(options, &device, emit),
        Err(e) => {
            tracing::warn!("bench-small_calls: no GPU, nothing measured ({e})");
            Ok(())
        }
    })
}
