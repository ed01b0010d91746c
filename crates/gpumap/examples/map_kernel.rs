//! Map a file into a GPU page cache and hand its bytes to a kernel, with no copy of our own.
//!
//! A `DeviceCache` holds files in device memory under one budget; `DeviceMappedFile::view`
//! faults a range in (reading what is missing) and pins it while the `View` lives, and
//! `View::device()` is its GPU memory: a device address a kernel can read. The kernel here is
//! hand-written PTX (a byte sum), loaded with `cuModuleLoadData` and launched through cudarc,
//! over the file in windows, so a file larger than the budget works too.
//!
//! Without a GPU, host memory stands in for the cache's memory: `View::device()` is `None`, the
//! kernel is skipped (the example says why) and the same sum is computed from
//! `View::copy_to_host`. Either way the result is checked against a sum over the file's bytes
//! read with std. `GPUMAP_REQUIRE_GPU=1` makes a missing GPU an error.
//!
//! Usage: cargo run --release -p gpumap --example map_kernel [FILE]
//! (without FILE: 40 MiB of generated data in a temporary directory)

use std::io::Read;
use std::process::ExitCode;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use gpumap::mapped::{CacheOptions, DeviceMappedFile};
use gpumap::memory::cuda::CudaDevice;

mod common;
use common::{input, Result};

/// Bytes per view: the kernel runs once per window.
const WINDOW: u64 = 16 << 20;

/// `byte_sum(const u8 *data, u64 len, u64 *sum)`: `*sum += data[0] + ... + data[len - 1]`.
/// Each thread adds up a grid-strided share of the bytes, then adds its total atomically.
const BYTE_SUM_PTX: &str = r#"
.version 7.0
.target sm_52
.address_size 64

.visible .entry byte_sum(.param .u64 data, .param .u64 len, .param .u64 sum)
{
    .reg .pred %p<2>;
    .reg .b16 %rs<2>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<10>;

    ld.param.u64 %rd1, [data];
    ld.param.u64 %rd2, [len];
    ld.param.u64 %rd3, [sum];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd3, %rd3;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;        // i = blockIdx.x * blockDim.x + threadIdx.x
    mul.wide.u32 %rd6, %r4, %r2;     // stride = gridDim.x * blockDim.x
    mov.u64 %rd7, 0;                 // this thread's total
$L_loop:
    setp.ge.u64 %p1, %rd4, %rd2;
    @%p1 bra $L_done;
    add.u64 %rd8, %rd1, %rd4;
    ld.global.u8 %rs1, [%rd8];
    cvt.u64.u16 %rd9, %rs1;
    add.u64 %rd7, %rd7, %rd9;
    add.u64 %rd4, %rd4, %rd6;
    bra.uni $L_loop;
$L_done:
    red.global.add.u64 [%rd3], %rd7;
    ret;
}
"#;

fn run() -> Result<()> {
    let (_dir, path) = input("map_kernel.bin", 40 << 20)?;

    // One cache (GPU 0 where there is one, else host memory) with room for a few windows.
    let cache = CacheOptions::new().budget(4 * WINDOW).build()?;
    let map = cache.open(&path)?;
    println!(
        "mapped {} ({} bytes) in a cache of {} MiB in {}",
        path.display(),
        map.len(),
        (4 * WINDOW) >> 20,
        map.memory()
    );

    let sum = match cache.device().as_cuda() {
        Some(gpu) => sum_with_kernel(&map, gpu.ordinal())?,
        None => {
            // Device::auto() chose host memory; asking for GPU 0 again says why.
            let why =
                CudaDevice::new(0).err().map_or("host memory was chosen".into(), |e| e.to_string());
            if std::env::var("GPUMAP_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                return Err(format!("GPUMAP_REQUIRE_GPU=1 but there is no GPU: {why}").into());
            }
            println!("kernel skipped: no GPU ({why}); summing the views on the host instead");
            sum_on_host(&map)?
        }
    };
    let stats = map.stats();
    println!(
        "sum of the bytes through the map: {sum} ({} MiB faulted in by {} reads)",
        stats.bytes_faulted >> 20,
        stats.fault_reads
    );

    // The reference: the same sum over the file read with std.
    let mut file = std::fs::File::open(&path)?;
    let (mut want, mut chunk) = (0u64, vec![0u8; 8 << 20]);
    loop {
        let n = file.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        want += chunk[..n].iter().map(|&b| u64::from(b)).sum::<u64>();
    }
    if sum != want {
        return Err(format!("sum through the map is {sum}, the file's is {want}").into());
    }
    println!("verified: equals the sum over the file read with std");
    Ok(())
}

/// The byte sum of the mapped file, by `byte_sum` launched on each window's GPU memory.
fn sum_with_kernel(map: &DeviceMappedFile, ordinal: usize) -> Result<u64> {
    // cudarc retains the same primary context as gpumap, so the map's addresses are valid in it.
    let ctx = CudaContext::new(ordinal)?;
    let stream: Arc<CudaStream> = ctx.default_stream();
    let module = ctx.load_module(Ptx::from_src(BYTE_SUM_PTX))?; // cuModuleLoadData, no NVRTC
    let byte_sum: CudaFunction = module.load_function("byte_sum")?;
    let mut total: CudaSlice<u64> = stream.alloc_zeros(1)?;
    let mut offset = 0;
    while offset < map.len() {
        let view = map.view(offset, WINDOW.min(map.len() - offset))?; // resident and pinned
        let memory = view.device().ok_or("a view of a GPU cache without GPU memory")?;
        let (ptr, len) = (memory.ptr(), memory.len() as u64);
        let blocks = len.div_ceil(256).min(1024) as u32;
        let config =
            LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: byte_sum's parameters are (u64 address, u64 length, u64 *sum), as pushed;
        // it reads [ptr, ptr + len), which `view` keeps resident until it is dropped, after the
        // stream has finished the kernel (synchronize below).
        unsafe {
            stream.launch_builder(&byte_sum).arg(&ptr).arg(&len).arg(&mut total).launch(config)?
        };
        stream.synchronize()?; // the kernel must be done before the view unpins the memory
        drop(view);
        offset += len;
    }
    println!("kernel byte_sum ran on GPU {ordinal} over {} windows", map.len().div_ceil(WINDOW));
    Ok(stream.clone_dtoh(&total)?[0])
}

/// The same sum without a GPU: each window's view copied out and summed on the CPU.
fn sum_on_host(map: &DeviceMappedFile) -> Result<u64> {
    let mut sum = 0u64;
    let mut offset = 0;
    let mut bytes = vec![0u8; WINDOW as usize];
    while offset < map.len() {
        let view = map.view(offset, WINDOW.min(map.len() - offset))?;
        assert!(view.device().is_none(), "host memory has no device address");
        let window = &mut bytes[..view.len() as usize];
        view.copy_to_host(0, window)?;
        sum += window.iter().map(|&b| u64::from(b)).sum::<u64>();
        offset += view.len();
    }
    Ok(sum)
}

fn main() -> ExitCode {
    common::main("map_kernel", run)
}
