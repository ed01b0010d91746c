//! Read a whole file into device memory, check every byte, print the throughput.
//!
//! `FileHandle::read_device` splits the read into tasks on the I/O pool: into a GPU they go
//! through pinned bounce buffers (or cuFile, where GPUDirect Storage works); without a GPU,
//! host memory stands in for it and the same call reads straight into it.
//!
//! Usage: cargo run --release -p gpumap --example read_file [FILE]
//! (without FILE: 64 MiB of generated data in a temporary directory)

use std::os::unix::fs::FileExt;
use std::process::ExitCode;
use std::time::Instant;

use gpumap::io::FileHandle;
use gpumap::memory::{Device, DeviceBuffer};
use gpumap::pagecache::{self, ByteRange};

mod common;
use common::{input, Result};

fn run() -> Result<()> {
    let (_dir, path) = input("read_file.bin", 64 << 20)?;

    // GPU 0 where there is one, else host memory.
    let device = Device::auto();
    let fh = FileHandle::open(&path, "r")?;
    let len = fh.len()?;
    println!("reading {} ({len} bytes) into {}", path.display(), device.describe());

    // How much of the file the page cache holds decides what the read measures: memory or disk.
    let cached = pagecache::residency(&path, ByteRange::ALL)?;
    match cached.fraction() {
        Some(f) => println!("page cache holds {:.0}% of it before the read", f * 100.0),
        None => println!("page-cache residency unknown: {:?}", cached.unknown_reason),
    }

    // Read it twice: the first transfer of a process also pays one-time costs (the I/O pool's
    // threads, pinned bounce buffers, the path decision), the second shows the steady rate.
    let mut buffer = DeviceBuffer::alloc(&device, usize::try_from(len)?)?;
    for round in ["first read", "read again"] {
        buffer.fill(0)?;
        let start = Instant::now();
        let n = fh.read_device(&mut buffer, 0)?;
        let secs = start.elapsed().as_secs_f64();
        println!("{round}: {n} bytes in {:.1} ms, {:.2} GB/s", secs * 1e3, n as f64 / secs / 1e9);
        if n as u64 != len {
            return Err(format!("short read: {n} of {len} bytes").into());
        }
    }
    let decision = fh.compat_decision();
    println!("device path: {:?} ({})", decision.path, decision.reason);

    // Check: the buffer against the file, read again with std, in 8 MiB chunks.
    let file = std::fs::File::open(&path)?;
    let mut want = vec![0u8; 8 << 20];
    let mut got = vec![0u8; 8 << 20];
    let mut offset = 0u64;
    while offset < len {
        let k = (len - offset).min(want.len() as u64) as usize;
        file.read_exact_at(&mut want[..k], offset)?;
        buffer.copy_to_host(offset as usize, &mut got[..k])?;
        if let Some(i) = (0..k).find(|&i| want[i] != got[i]) {
            let at = offset + i as u64;
            return Err(
                format!("mismatch at byte {at}: file {}, buffer {}", want[i], got[i]).into()
            );
        }
        offset += k as u64;
    }
    println!("verified: all {len} bytes in {} match the file", device.describe());
    Ok(())
}

fn main() -> ExitCode {
    common::main("read_file", run)
}
