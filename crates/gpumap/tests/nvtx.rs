//! NVTX ranges: asked for with `GPUMAP_NVTX=1`, they load from the CUDA toolkit where it is
//! (the GPU machine must have it: CUDA 13's `libnvtx3interop.so.1`) and transfers run inside
//! them; where the library is missing the reason is given and transfers run as before. One
//! test per process: the setting is read once.

mod common;

use gpumap::io::FileHandle;
use gpumap::memory::{Device, DeviceBuffer};

#[test]
fn ranges_asked_for_load_from_the_toolkit_or_say_why_not() {
    // SAFETY of set_var: the only test of this binary, before any thread reads the variable.
    std::env::set_var("GPUMAP_NVTX", "1");
    let status = gpumap::profiling::nvtx_status();
    if common::gpu_required() {
        assert_eq!(status, Ok(true), "GPUMAP_REQUIRE_GPU=1: the toolkit's NVTX library must load");
    }
    match &status {
        Ok(on) => assert!(on, "asked for: on, or an error"),
        Err(reason) => assert!(reason.contains("NVTX"), "{reason}"),
    }
    let device = Device::auto();
    // A transfer inside the ranges (or without them) is unchanged.
    let base =
        std::env::var("GPUMAP_BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(base).unwrap();
    let path = dir.path().join("nvtx");
    let data = common::random_bytes(3 << 20, 41);
    std::fs::write(&path, &data).unwrap();
    let file = FileHandle::open(&path, "r").unwrap();
    let mut buf = DeviceBuffer::zeroed(&device, data.len()).unwrap();
    assert_eq!(file.read_device(buf.view_mut(), 0).unwrap(), data.len());
    assert!(buf.to_vec().unwrap() == data, "{device:?}");
}
