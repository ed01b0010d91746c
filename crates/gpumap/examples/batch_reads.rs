//! Many random 4 KiB reads into device memory in one batch, checked against the file.
//!
//! Into a GPU, each small read on its own pays for one host-to-device copy (a fixed cost, and
//! the driver serialises them: docs/decisions/0007-small-reads-packed.md). `FileHandle::read_device_batch` reads all the pieces into pinned
//! memory and copies each run of adjacent destinations once, so here, where the destinations
//! are one buffer's consecutive 4 KiB slots, the whole batch goes up in a few copies. Without
//! a GPU, host memory stands in and the pieces are read straight into it, in parallel.
//!
//! Usage: cargo run --release -p gpumap --example batch_reads [FILE]
//! (without FILE: 64 MiB of generated data in a temporary directory)

use std::os::unix::fs::FileExt;
use std::process::ExitCode;
use std::time::Instant;

use gpumap::io::{DeviceRead, FileHandle};
use gpumap::memory::{Device, DeviceBuffer};

mod common;
use common::{input, Result, SplitMix};

const PIECE: usize = 4096;
const READS: usize = 8192;

fn run() -> Result<()> {
    let (_dir, path) = input("batch_reads.bin", 64 << 20)?;
    let device = Device::auto();
    let fh = FileHandle::open(&path, "r")?;
    let len = fh.len()?;
    if len < PIECE as u64 {
        return Err(format!("{} is shorter than one {PIECE}-byte piece", path.display()).into());
    }

    // Random page-aligned file offsets (repeats allowed), and one buffer with a slot for each.
    let mut rng = SplitMix(2);
    let pages = len / PIECE as u64;
    let offsets: Vec<u64> = (0..READS).map(|_| rng.next_u64() % pages * PIECE as u64).collect();
    let mut buffer = DeviceBuffer::zeroed(&device, READS * PIECE)?;
    println!(
        "{READS} reads of {PIECE} bytes at random offsets of {} ({len} bytes) into {}",
        path.display(),
        device.describe()
    );

    // Twice: the first batch of a process also pays one-time costs (the I/O pool's threads,
    // pinned buffers, on a GPU the copy kernel's module), the second shows the steady rate.
    let file = std::fs::File::open(&path)?;
    let mut want = vec![0u8; PIECE];
    for round in ["first batch", "batch again"] {
        buffer.fill(0)?;
        // One DeviceRead per piece: slot i of the buffer receives the page at offsets[i].
        let slots = buffer.view_mut().chunks_mut(PIECE)?;
        let mut reads: Vec<DeviceRead<'_>> = slots
            .into_iter()
            .zip(&offsets)
            .map(|(dst, &offset)| DeviceRead { dst, offset })
            .collect();
        let start = Instant::now();
        let counts = fh.read_device_batch(&mut reads)?;
        let secs = start.elapsed().as_secs_f64();
        drop(reads); // the views borrow the buffer
        println!(
            "{round}: {:.1} ms, {:.0} reads/s, {:.2} GB/s",
            secs * 1e3,
            READS as f64 / secs,
            (READS * PIECE) as f64 / secs / 1e9
        );

        // Check every piece against the file.
        let got = buffer.to_vec()?;
        for (i, (&offset, &count)) in offsets.iter().zip(&counts).enumerate() {
            if count != PIECE {
                return Err(format!("read {i} at {offset}: {count} bytes, not {PIECE}").into());
            }
            file.read_exact_at(&mut want, offset)?;
            if got[i * PIECE..(i + 1) * PIECE] != want[..] {
                return Err(format!("read {i} at offset {offset}: differs from the file").into());
            }
        }
    }
    println!("verified: all {READS} pieces match the file, both times");

    // For comparison: the first 1024 of the same reads, one call each (into a second buffer).
    let some = 1024;
    let mut single = DeviceBuffer::zeroed(&device, some * PIECE)?;
    let start = Instant::now();
    for (slot, &offset) in single.view_mut().chunks_mut(PIECE)?.into_iter().zip(&offsets) {
        fh.read_device(slot, offset)?;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "the first {some} again, one read_device call each: {:.0} reads/s",
        some as f64 / secs
    );
    if single.to_vec()? != buffer.to_vec()?[..some * PIECE] {
        return Err("single reads differ from the batch's".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    common::main("batch_reads", run)
}
