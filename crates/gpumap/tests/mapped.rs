//! DeviceMappedFile against a reference model (a plain byte vector mirrored against the file),
//! on host memory (every machine) and on the GPU (where there is one; skipped loudly
//! elsewhere), plus the semantics mmap users expect: budget, pins, single-flight faults,
//! flush, drop, a file that shrinks, read-only maps.

mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;

use common::random_bytes;
use gpumap::mapped::{DeviceMappedFile, MapOptions};
use gpumap::memory::Device;
use gpumap::Error;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// Host memory always; GPU 0 where there is one.
fn memories() -> Vec<Device> {
    let mut all = vec![Device::Host];
    if let Some(gpu) = common::gpu() {
        all.push(Device::Cuda(gpu));
    }
    all
}

fn scratch() -> tempfile::TempDir {
    let base =
        std::env::var("GPUMAP_BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

fn map(path: &Path, memory: Device, budget: u64, extent: u64, writable: bool) -> DeviceMappedFile {
    // 2 MiB frames (the granularity) keep the budgets of these tests small.
    MapOptions::new()
        .memory(memory)
        .frame_size(2 * MIB)
        .budget(budget)
        .extent_size(extent)
        .writable(writable)
        .open(path)
        .unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    Read { offset: u64, len: u64 },
    Write { offset: u64, len: u64, seed: u64 },
    Flush,
    FlushRange { offset: u64, len: u64 },
}

fn ops(file_len: u64) -> impl Strategy<Value = Vec<Op>> {
    let range = (0..file_len).prop_flat_map(move |o| (Just(o), 0..=(file_len - o).min(3 * MIB)));
    let op = prop_oneof![
        4 => range.clone().prop_map(|(offset, len)| Op::Read { offset, len }),
        4 => (range.clone(), any::<u64>())
            .prop_map(|((offset, len), seed)| Op::Write { offset, len, seed }),
        1 => Just(Op::Flush),
        1 => range.prop_map(|(offset, len)| Op::FlushRange { offset, len }),
    ];
    proptest::collection::vec(op, 1..24)
}

/// Runs `ops` against a map and a byte vector; every read must match the vector, and after the
/// final close the file must equal it, at its original length.
fn check_against_model(memory: Device, file_len: u64, budget: u64, extent: u64, ops: &[Op]) {
    let dir = scratch();
    let path = dir.path().join("model");
    let mut model = random_bytes(file_len as usize, file_len ^ extent);
    fs::write(&path, &model).unwrap();
    let m = map(&path, memory.clone(), budget, extent, true);
    assert_eq!(m.len(), file_len);
    for op in ops {
        match *op {
            Op::Read { offset, len } => {
                let mut got = vec![0u8; len as usize];
                m.read(offset, &mut got).unwrap();
                let want = &model[offset as usize..(offset + len) as usize];
                assert!(got == want, "{memory:?}: read {offset}+{len} differs after {ops:?}");
            }
            Op::Write { offset, len, seed } => {
                let data = random_bytes(len as usize, seed);
                m.write(offset, &data).unwrap();
                model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
            }
            Op::Flush => m.flush().unwrap(),
            Op::FlushRange { offset, len } => m.flush_range(offset, len).unwrap(),
        }
        let stats = m.stats();
        assert!(stats.mapped_bytes <= stats.budget, "{stats:?}");
    }
    m.close().unwrap();
    let on_disk = fs::read(&path).unwrap();
    assert_eq!(on_disk.len() as u64, file_len, "the map changed the file's length");
    assert!(on_disk == model, "{memory:?}: the file differs from the model after close");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn reads_and_writes_match_a_byte_vector(
        file_len in 1u64..(9 * MIB),
        frames in 1u64..4,
        extent_shift in 12u32..18,
        ops in (1u64..(9 * MIB)).prop_flat_map(ops),
    ) {
        // Budgets of one to three frames force evictions (and write-backs of dirty frames)
        // as the ops wander over a file of up to five frames.
        for memory in memories() {
            let ops: Vec<Op> = ops.iter().filter(|op| match op {
                Op::Read { offset, len } | Op::Write { offset, len, .. }
                | Op::FlushRange { offset, len } => offset + len <= file_len,
                Op::Flush => true,
            }).cloned().collect();
            // A view can never need more frames than the budget: keep ops within it.
            let budget = frames * 2 * MIB;
            let ops: Vec<Op> = ops.into_iter().filter(|op| match op {
                Op::Read { offset, len } | Op::Write { offset, len, .. } => {
                    len == &0 || (offset + len - 1) / (2 * MIB) - offset / (2 * MIB) < frames
                }
                _ => true,
            }).collect();
            check_against_model(memory.clone(), file_len, budget, 1 << extent_shift, &ops);
        }
    }
}

#[test]
fn partial_last_extent_and_odd_sizes() {
    for memory in memories() {
        for (len, extent) in [(1u64, 4096u64), (5000, 4096), (2 * MIB + 1, 65536), (4095, 4096)] {
            let ops = vec![
                Op::Read { offset: 0, len },
                Op::Write { offset: len - 1, len: 1, seed: 3 },
                Op::Read { offset: len / 2, len: len - len / 2 },
                Op::Flush,
            ];
            check_against_model(memory.clone(), len, 4 * MIB, extent, &ops);
        }
    }
}

#[test]
fn many_threads_fault_each_extent_once() {
    for memory in memories() {
        let dir = scratch();
        let path = dir.path().join("shared");
        let data = random_bytes((6 * MIB + 123) as usize, 5);
        fs::write(&path, &data).unwrap();
        let m = Arc::new(map(&path, memory.clone(), 8 * MIB, 65536, false));
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let m = Arc::clone(&m);
                let data = &data;
                s.spawn(move || {
                    // Overlapping ranges, different starting points.
                    let offset = t * 700_001 % (data.len() as u64 / 2);
                    let len = data.len() as u64 - offset;
                    let mut got = vec![0u8; len as usize];
                    m.read(offset, &mut got).unwrap();
                    assert!(got[..] == data[offset as usize..]);
                });
            }
        });
        let stats = m.stats();
        assert_eq!(stats.bytes_faulted, data.len() as u64, "{memory:?}: an extent was read twice");
        assert_eq!(stats.resident_bytes, data.len() as u64);
        assert_eq!(stats.evictions, 0);
    }
}

#[test]
fn budget_is_kept_and_pinned_views_are_never_evicted() {
    for memory in memories() {
        let dir = scratch();
        let path = dir.path().join("budget");
        let data = random_bytes((8 * MIB) as usize, 6);
        fs::write(&path, &data).unwrap();
        let m = map(&path, memory.clone(), 2 * MIB, 65536, false);
        // A view larger than the budget can never fit.
        match m.view(0, 3 * MIB) {
            Err(Error::OutOfBudget { requested, budget, .. }) => {
                assert_eq!((requested, budget), (4 * MIB, 2 * MIB))
            }
            other => panic!("{memory:?}: expected OutOfBudget, got {other:?}"),
        }
        // One frame of budget, pinned by a live view: another frame cannot come in.
        let held = m.view(0, 4096).unwrap();
        match m.view(6 * MIB, 4096) {
            Err(Error::OutOfBudget { in_use, .. }) => assert_eq!(in_use, 2 * MIB),
            other => panic!("{memory:?}: expected OutOfBudget while pinned, got {other:?}"),
        }
        let mut first = vec![0u8; 4096];
        held.copy_to_host(0, &mut first).unwrap();
        assert!(first[..] == data[..4096], "{memory:?}: the pinned view's bytes changed");
        drop(held);
        // Unpinned: the old frame is evicted for the new one.
        let mut got = vec![0u8; 4096];
        m.read(6 * MIB, &mut got).unwrap();
        assert!(got[..] == data[6 * MIB as usize..][..4096]);
        let stats = m.stats();
        assert_eq!(stats.evictions, 1, "{stats:?}");
        assert_eq!(stats.mapped_bytes, 2 * MIB);
    }
}

#[test]
fn dirty_frames_are_written_back_before_eviction_and_on_drop() {
    for memory in memories() {
        let dir = scratch();
        let path = dir.path().join("evict-dirty");
        let mut model = random_bytes((6 * MIB) as usize, 7);
        fs::write(&path, &model).unwrap();
        {
            let m = map(&path, memory.clone(), 2 * MIB, 4096, true);
            let patch = random_bytes(10_000, 8);
            m.write(MIB, &patch).unwrap();
            model[MIB as usize..][..10_000].copy_from_slice(&patch);
            // Another frame pushes the dirty one out: it must reach the file first.
            let mut got = vec![0u8; 100];
            m.read(5 * MIB, &mut got).unwrap();
            let stats = m.stats();
            assert_eq!(stats.evictions, 1);
            assert!(stats.bytes_written_back >= 10_000, "{stats:?}");
            assert!(fs::read(&path).unwrap() == model, "{memory:?}: write-back before eviction");
            // Dirty again, then dropped without flush: the drop writes it back.
            let patch = random_bytes(3, 9);
            m.write(6 * MIB - 3, &patch).unwrap();
            model[(6 * MIB - 3) as usize..].copy_from_slice(&patch);
            assert_eq!(m.stats().dirty_bytes, 4096);
        }
        assert!(fs::read(&path).unwrap() == model, "{memory:?}: drop did not flush");
    }
}

#[test]
fn a_file_that_shrinks_under_the_map_is_an_error_not_zeros() {
    for memory in memories() {
        let dir = scratch();
        let path = dir.path().join("shrink");
        fs::write(&path, random_bytes((3 * MIB) as usize, 10)).unwrap();
        let m = map(&path, memory.clone(), 4 * MIB, 65536, false);
        let mut head = vec![0u8; 100];
        m.read(0, &mut head).unwrap();
        fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(MIB).unwrap();
        let mut tail = vec![0u8; 100];
        match m.read(2 * MIB + 5, &mut tail) {
            Err(Error::UnexpectedEof { .. }) => {}
            other => panic!("{memory:?}: expected UnexpectedEof, got {other:?}"),
        }
        // What was resident before stays readable.
        m.read(0, &mut head).unwrap();
    }
}

#[test]
fn bad_requests_are_typed_errors() {
    let dir = scratch();
    let path = dir.path().join("bad");
    fs::write(&path, random_bytes(10_000, 11)).unwrap();
    for memory in memories() {
        let m = map(&path, memory.clone(), 2 * MIB, 4096, false);
        assert!(matches!(m.view(9_000, 2_000), Err(Error::OutOfRange { file_len: 10_000, .. })));
        assert!(matches!(m.view(u64::MAX, 2), Err(Error::Overflow { .. })));
        assert!(matches!(m.view_mut(0, 10), Err(Error::AccessMode { .. })));
        let view = m.view(100, 50).unwrap();
        let mut too_much = vec![0u8; 51];
        assert!(matches!(view.copy_to_host(0, &mut too_much), Err(Error::OutOfRange { .. })));
        assert!(view.region().is_some() == matches!(memory.clone(), Device::Cuda(_)));
        assert_eq!(m.base().is_some(), matches!(memory.clone(), Device::Cuda(_)));
        // An empty view of an empty range is fine.
        assert!(m.view(10_000, 0).unwrap().is_empty());
    }
    for frame in [0u64, MIB, 3 * MIB] {
        let got = MapOptions::new().memory(Device::Host).frame_size(frame).open(&path);
        assert!(matches!(got, Err(Error::InvalidArgument(_))), "frame {frame}: {got:?}");
    }
    for extent in [0u64, 1000, 2048, 3 * 4096, 16 * MIB] {
        let got = MapOptions::new().memory(Device::Host).extent_size(extent).open(&path);
        assert!(matches!(got, Err(Error::InvalidArgument(_))), "extent {extent}: {got:?}");
    }
    let missing = MapOptions::new().memory(Device::Host).open(dir.path().join("nope"));
    assert!(matches!(missing, Err(Error::Io { .. })));
}

#[test]
fn device_views_are_device_memory_at_base_plus_offset() {
    let Some(device) = common::gpu() else { return };
    let dir = scratch();
    let path = dir.path().join("device");
    let data = random_bytes((5 * MIB + 17) as usize, 12);
    fs::write(&path, &data).unwrap();
    let m = map(&path, Device::Cuda(device.clone()), 4 * MIB, 65536, false);
    let base = m.base().unwrap();
    let view = m.view(3 * MIB + 5, MIB).unwrap();
    let region = view.region().unwrap();
    assert_eq!(region.ptr(), base + 3 * MIB + 5);
    // The region is plain device memory: a plain driver copy sees the file's bytes.
    let mut got = vec![0u8; MIB as usize];
    region.copy_to_host(0, &mut got).unwrap();
    assert!(got[..] == data[(3 * MIB + 5) as usize..][..MIB as usize]);
}

#[test]
fn evict_gives_memory_back_and_faults_again() {
    for memory in memories() {
        let dir = scratch();
        let path = dir.path().join("evict");
        let mut model = random_bytes((5 * MIB) as usize, 13);
        fs::write(&path, &model).unwrap();
        let m = map(&path, memory.clone(), 6 * MIB, 65536, true);
        let patch = random_bytes(777, 14);
        m.write(3 * MIB, &patch).unwrap();
        model[3 * MIB as usize..][..777].copy_from_slice(&patch);
        let held = m.view(0, 100).unwrap(); // frame 0 stays
        m.evict().unwrap();
        let stats = m.stats();
        assert_eq!(stats.mapped_bytes, 2 * MIB, "{memory:?}: only the pinned frame stays");
        assert_eq!(stats.dirty_bytes, 0);
        assert!(fs::read(&path).unwrap() == model, "{memory:?}: evict did not write back");
        drop(held);
        let before = m.stats().bytes_faulted;
        let mut got = vec![0u8; model.len()];
        m.read(0, &mut got).unwrap();
        assert!(got == model);
        // Everything but the one extent the pinned view had was read again.
        assert_eq!(m.stats().bytes_faulted - before, 5 * MIB - 65536);
    }
}

#[test]
fn larger_frames_keep_the_same_semantics() {
    for memory in memories() {
        let ops = vec![
            Op::Write { offset: 100, len: 3 * MIB, seed: 1 },
            Op::Read { offset: 9 * MIB, len: 2 * MIB },
            Op::Write { offset: 17 * MIB, len: 5, seed: 2 },
            Op::Read { offset: 0, len: 4 * MIB },
            Op::FlushRange { offset: 0, len: MIB },
            Op::Read { offset: 16 * MIB, len: 3 * MIB },
        ];
        let dir = scratch();
        let path = dir.path().join("big-frames");
        let len = 19 * MIB + 7;
        let mut model = random_bytes(len as usize, 21);
        fs::write(&path, &model).unwrap();
        let m = MapOptions::new()
            .memory(memory.clone())
            .frame_size(8 * MIB)
            .budget(8 * MIB)
            .writable(true)
            .open(&path)
            .unwrap();
        assert_eq!(m.frame_size(), 8 * MIB);
        for op in &ops {
            match *op {
                Op::Read { offset, len } => {
                    let mut got = vec![0u8; len as usize];
                    m.read(offset, &mut got).unwrap();
                    assert!(got[..] == model[offset as usize..(offset + len) as usize]);
                }
                Op::Write { offset, len, seed } => {
                    let data = random_bytes(len as usize, seed);
                    m.write(offset, &data).unwrap();
                    model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                }
                Op::Flush => m.flush().unwrap(),
                Op::FlushRange { offset, len } => m.flush_range(offset, len).unwrap(),
            }
            assert!(m.stats().mapped_bytes <= 8 * MIB);
        }
        assert!(m.stats().evictions >= 3, "{:?}", m.stats());
        m.close().unwrap();
        assert!(fs::read(&path).unwrap() == model, "{memory:?}");
    }
}

/// Diagnostic, run by hand on the GPU machine (`--ignored --nocapture`): the same warm read
/// into a plain device buffer and into a map, in one process.
#[test]
#[ignore]
fn diagnose_fault_throughput() {
    use gpumap::io::FileHandle;
    use gpumap::memory::cuda::CudaBuffer;
    let Some(device) = common::gpu() else { return };
    let path = std::env::var("GPUMAP_DIAG_FILE").unwrap();
    let fh = FileHandle::open(&path, "r").unwrap();
    let len = fh.len().unwrap();
    let mut buf = CudaBuffer::alloc(&device, len as usize).unwrap();
    for _ in 0..2 {
        let t = std::time::Instant::now();
        fh.read_device(buf.view_mut(), 0).unwrap();
        eprintln!("DeviceBuffer: {:.2} GB/s", len as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    for frame in [2 * MIB, 32 * MIB] {
        let m = MapOptions::new()
            .memory(Device::Cuda(device.clone()))
            .frame_size(frame)
            .extent_size(2 * MIB)
            .budget(len.next_multiple_of(frame))
            .open(&path)
            .unwrap();
        let _base = m.base().unwrap();
        for round in 0..3 {
            m.evict().unwrap();
            let t = std::time::Instant::now();
            drop(m.view(0, len).unwrap());
            eprintln!(
                "map frame {frame} round {round}: {:.2} GB/s {:?}",
                len as f64 / t.elapsed().as_secs_f64() / 1e9,
                m.stats()
            );
        }
    }
}

#[test]
fn threads_under_a_tight_budget_see_the_files_bytes() {
    for memory in memories() {
        let dir = scratch();
        let path = dir.path().join("stress");
        let data = random_bytes((12 * MIB + 333) as usize, 15);
        fs::write(&path, &data).unwrap();
        let m = map(&path, memory.clone(), 6 * MIB, 65536, false);
        let busy = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (m, data, busy, memory) = (&m, &data, &busy, &memory);
                s.spawn(move || {
                    let mut x = 0x2545_F491_4F6C_DD1Du64 ^ t;
                    for _ in 0..60 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let len = x % MIB + 1;
                        let offset = (x >> 20) % (data.len() as u64 - len);
                        let mut got = vec![0u8; len as usize];
                        loop {
                            match m.read(offset, &mut got) {
                                Ok(()) => break,
                                // Every frame pinned by other threads' views: try again.
                                Err(Error::OutOfBudget { .. }) => {
                                    busy.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    std::thread::yield_now();
                                }
                                Err(e) => panic!("{memory:?}: {e}"),
                            }
                        }
                        assert!(got[..] == data[offset as usize..][..len as usize], "{memory:?}");
                    }
                });
            }
        });
        let stats = m.stats();
        assert!(stats.mapped_bytes <= 6 * MIB, "{stats:?}");
        assert!(stats.evictions > 0, "{stats:?}");
        eprintln!("{memory:?}: {stats:?}, {} busy retries", busy.into_inner());
    }
}
