//! Helpers shared by integration tests that need a GPU.
#![allow(dead_code)]

use gpumap::memory::cuda::CudaDevice;

/// Whether the environment demands that GPU tests run (`GPUMAP_REQUIRE_GPU=1`).
pub fn gpu_required() -> bool {
    std::env::var("GPUMAP_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Device 0 when there is one. Otherwise prints a loud `SKIP` line naming the calling test and
/// the reason, and returns `None` — unless `GPUMAP_REQUIRE_GPU=1`, in which case the test fails.
#[track_caller]
pub fn gpu() -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(device) => Some(device),
        Err(e) => {
            let test = std::thread::current().name().unwrap_or("<unknown test>").to_owned();
            if gpu_required() {
                panic!("GPUMAP_REQUIRE_GPU=1 but {test} has no GPU: {e}");
            }
            eprintln!("SKIP {test}: no GPU ({e})");
            None
        }
    }
}
