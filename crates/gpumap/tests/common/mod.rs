//! Helpers shared by integration tests: test data, and the GPU for tests that need one.
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

/// `len` pseudo-random bytes (xorshift64), the same for the same `seed`: test data whose
/// every window differs from every other, so a misplaced byte shows.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
