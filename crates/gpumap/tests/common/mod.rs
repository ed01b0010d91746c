//! Helpers shared by integration tests: test data, and the GPU for tests that need one.
#![allow(dead_code)]

use gpumap::memory::cuda::CudaDevice;

/// Declares, for each function `name(memory: Device)` listed, the tests `name::host` (always
/// run) and `name::gpu`: ignored by default, with the reason `cargo test` prints beside it and
/// counts in its summary; `cargo test -- --include-ignored` runs it (scripts/test.sh does where
/// `nvidia-smi` finds a GPU), and it skips loudly where there is none, unless
/// `GPUMAP_REQUIRE_GPU=1` makes that a failure.
#[macro_export]
macro_rules! on_host_and_gpu {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn host() {
                super::$name(gpumap::memory::Device::Host)
            }

            #[test]
            #[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
            fn gpu() {
                if let Some(device) = $crate::common::gpu() {
                    super::$name(gpumap::memory::Device::Cuda(device))
                }
            }
        }
    )*};
}

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

/// `f()`, again while the cache answers `OutOfBudget`: where threads share a budget of a frame
/// or two, one of them may wait past the cache's pin wait for the others' pins, which is an
/// answer, not a fault. Any other error fails the test.
pub fn retry<T>(mut f: impl FnMut() -> gpumap::Result<T>) -> T {
    loop {
        match f() {
            Ok(t) => return t,
            Err(gpumap::Error::OutOfBudget { .. }) => {
                std::thread::sleep(std::time::Duration::from_micros(200))
            }
            Err(e) => panic!("{e}"),
        }
    }
}
