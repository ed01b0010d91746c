//! The GPU page cache against reference models (byte vectors mirrored against the files), on
//! host memory (every machine) and on the GPU (where there is one; skipped loudly elsewhere):
//! the semantics mmap users expect, several files in one cache, gathers, advice, a sparse 1 TiB
//! file, and the four defects of the first DeviceMappedFile.

#[macro_use]
mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::random_bytes;
use gpumap::mapped::{Advice, CacheOptions, DeviceCache, DeviceMappedFile, MapOptions};
use gpumap::memory::{Device, DeviceBuffer};
use gpumap::Error;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const FRAME: u64 = 2 * MIB;

on_host_and_gpu!(
    writes_through_a_live_view_survive_a_flush_during_it,
    concurrent_flushes_never_lose_a_write,
    read_only_maps_refuse_writable_views,
    small_views_and_whole_frame_reads_never_deadlock,
    a_file_cut_under_the_map_is_not_grown_back_by_a_flush,
    partial_last_extent_reads_as_the_file_then_zeros,
    many_threads_fault_each_extent_once,
    random_single_extent_views_use_slots_not_frames,
    budget_is_kept_and_pinned_views_are_never_evicted,
    a_view_waits_for_another_threads_view_to_unpin,
    a_view_waiting_in_one_shard_holds_nothing_in_another,
    shards_share_one_budget,
    dirty_frames_are_written_back_before_eviction_and_on_drop,
    a_cancelled_call_never_cuts_a_write_back_short,
    a_cache_of_its_own_holds_single_extent_views_beside_the_whole_file,
    dropping_a_file_gives_its_memory_back_to_the_cache,
    a_file_that_shrinks_under_the_map_is_an_error_not_zeros,
    evict_gives_memory_back_and_faults_again,
    sequential_walks_read_ahead,
    views_and_prefetch_in_batches,
    async_gathers_hand_the_buffer_back,
    gathers_count_each_extent_once,
    read_only_gathers_read_through_a_full_budget,
    shards_split_the_budget_and_views_cross_them,
    bad_requests_are_typed_errors,
    a_terabyte_sparse_file_under_a_small_budget,
    gathers_of_thousands_of_ranges_match_the_model_wherever_their_extents_are,
);

fn scratch() -> tempfile::TempDir {
    let base =
        std::env::var("GPUMAP_BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

/// A file mapped in a cache of its own, with 2 MiB frames (the granularity) to keep budgets
/// small.
fn map(path: &Path, memory: Device, budget: u64, extent: u64, writable: bool) -> DeviceMappedFile {
    cache(memory, budget, extent).open_with(path, MapOptions::new().writable(writable)).unwrap()
}

fn cache(memory: Device, budget: u64, extent: u64) -> DeviceCache {
    sharded_cache(memory, budget, extent, 1)
}

fn sharded_cache(memory: Device, budget: u64, extent: u64, shards: usize) -> DeviceCache {
    let c = CacheOptions::new()
        .memory(memory)
        .frame_size(FRAME)
        .budget(budget)
        .extent_size(extent)
        .shards(shards)
        .build()
        .unwrap();
    assert_eq!(c.shards(), shards);
    c
}

fn writable() -> MapOptions {
    let mut o = MapOptions::new();
    o.writable(true);
    o
}

// ---- the four defects of the first version ----------------------------------------------

/// Defect 1: a flush while a writable view lived marked its extents clean, so what the view
/// wrote afterwards was never written back.
fn writes_through_a_live_view_survive_a_flush_during_it(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("live");
    fs::write(&path, vec![b'.'; 3 * MIB as usize]).unwrap();
    let m = map(&path, memory.clone(), 4 * MIB, 4096, true);
    let mut view = m.view_mut(100, 6).unwrap();
    view.copy_from_host(0, b"first.").unwrap();
    m.flush().unwrap();
    view.copy_from_host(0, b"SECOND").unwrap();
    m.flush().unwrap(); // still alive: written, kept dirty
    drop(view);
    m.close().unwrap();
    assert_eq!(&fs::read(&path).unwrap()[100..106], b"SECOND", "{memory:?}");
}

/// Defect 1, concurrently: one thread writes a counter through views and flushes its range,
/// another flushes the whole map in a loop; after every write-and-flush the file holds it.
fn concurrent_flushes_never_lose_a_write(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("race");
    fs::write(&path, vec![0u8; 4 * MIB as usize]).unwrap();
    let m = map(&path, memory.clone(), 4 * MIB, 4096, true);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                m.flush().unwrap();
            }
        });
        let file = fs::File::open(&path).unwrap();
        let mut last = std::collections::HashMap::new();
        for i in 0u64..400 {
            let offset = (i * 7919 * 8) % (4 * MIB - 8);
            last.insert(offset, i);
            {
                let mut view = m.view_mut(offset, 8).unwrap();
                view.copy_from_host(0, &i.to_le_bytes()).unwrap();
            }
            m.flush_range(offset, 8).unwrap();
            let mut back = [0u8; 8];
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, offset).unwrap();
            assert_eq!(u64::from_le_bytes(back), i, "{memory:?}: write {i} at {offset} lost");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // A write-back that started earlier must not have overwritten a later one's bytes.
        drop(file);
        let on_disk = fs::read(&path).unwrap();
        for (offset, i) in last {
            let got = u64::from_le_bytes(on_disk[offset as usize..][..8].try_into().unwrap());
            assert_eq!(got, i, "{memory:?}: at {offset}, a stale write-back won");
        }
    });
}

/// Defect 2 (the compile-time half is `tests/compile_fail/read_view_writes.rs`): a read view
/// of a writable map has no way to write, and a read-only map gives no writable views.
fn read_only_maps_refuse_writable_views(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("ro");
    fs::write(&path, b"unchanged").unwrap();
    let m = map(&path, memory.clone(), FRAME, 4096, false);
    assert!(matches!(m.view_mut(0, 4), Err(Error::AccessMode { .. })));
    assert!(matches!(m.write(0, b"X"), Err(Error::AccessMode { .. })));
    assert_eq!(fs::read(&path).unwrap(), b"unchanged");
}

/// Defect 3: on the host backend a frame's lock was held across I/O on the pool that other
/// holders needed; two threads alternating small views and whole-frame reads hung. Each pool
/// size runs under a watchdog.
fn small_views_and_whole_frame_reads_never_deadlock(memory: Device) {
    for threads in [1usize, 2, 3, 4, 8] {
        let dir = scratch();
        let path = dir.path().join("deadlock");
        let data = random_bytes((6 * MIB) as usize, 3);
        fs::write(&path, &data).unwrap();
        let mut handle = gpumap::io::FileHandle::options().unwrap();
        handle.pool(Arc::new(gpumap::io::IoPool::new(threads).unwrap())).task_size(256 << 10);
        let m = cache(memory.clone(), 4 * MIB, 4096)
            .open_with(&path, MapOptions::new().handle_options(handle))
            .unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        let worker = {
            let (m, data) = (m.clone(), data.clone());
            std::thread::spawn(move || {
                std::thread::scope(|s| {
                    s.spawn(|| {
                        for i in 0..300u64 {
                            let offset = (i * 104_729) % (6 * MIB - 100);
                            let view = m.view(offset, 100).unwrap();
                            let mut got = [0u8; 100];
                            view.copy_to_host(0, &mut got).unwrap();
                            assert!(got[..] == data[offset as usize..][..100]);
                        }
                    });
                    s.spawn(|| {
                        let mut frame = vec![0u8; FRAME as usize];
                        for i in 0..60u64 {
                            let offset = (i % 3) * FRAME;
                            m.read(offset, &mut frame).unwrap();
                            assert!(frame[..] == data[offset as usize..][..FRAME as usize]);
                        }
                    });
                });
                let _ = done.send(());
            })
        };
        if finished.recv_timeout(std::time::Duration::from_secs(120)).is_err() {
            panic!("{memory:?} with {threads} pool threads: deadlocked (no progress in 120 s)");
        }
        worker.join().unwrap();
    }
}

/// Defect 4: a file cut by another process while mapped grew back on flush. Now a map never
/// changes the file's length: dirty bytes past the new end are not written, stay dirty, and
/// every flush says so until the file is long enough again and a sync writes them.
fn a_file_cut_under_the_map_is_not_grown_back_by_a_flush(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("cut");
    let mut model = random_bytes((3 * MIB) as usize, 4);
    fs::write(&path, &model).unwrap();
    let m = map(&path, memory.clone(), 4 * MIB, 4096, true);
    let head = random_bytes(1000, 5);
    let tail = random_bytes(1000, 6);
    m.write(10, &head).unwrap();
    m.write(3 * MIB - 1000, &tail).unwrap();
    model[10..1010].copy_from_slice(&head);
    model[(3 * MIB - 1000) as usize..].copy_from_slice(&tail);
    fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(MIB).unwrap();
    match m.flush() {
        Err(Error::FileShrank { len, mapped_len, dirty_bytes, .. }) => {
            assert_eq!((len, mapped_len), (MIB, 3 * MIB));
            assert_eq!(dirty_bytes, 4096, "{memory:?}: the tail's extent stays dirty");
        }
        other => panic!("{memory:?}: expected FileShrank, got {other:?}"),
    }
    assert_eq!(fs::metadata(&path).unwrap().len(), MIB, "{memory:?}: the flush grew the file");
    assert_eq!(&fs::read(&path).unwrap()[10..1010], &head[..], "the part inside was written");
    assert!(matches!(m.flush(), Err(Error::FileShrank { .. })), "the error sticks");
    assert_eq!(m.stats().dirty_bytes, 4096);
    // Long enough again: a sync writes what stayed dirty, and the error is gone.
    fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(3 * MIB).unwrap();
    m.sync().unwrap();
    m.flush().unwrap();
    assert_eq!(m.stats().dirty_bytes, 0);
    let on_disk = fs::read(&path).unwrap();
    assert!(on_disk[(3 * MIB - 1000) as usize..] == tail[..], "{memory:?}");
}

// ---- one cache, three files: a model-based test ------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    View { file: usize, offset: u64, len: u64 },
    Write { file: usize, offset: u64, len: u64, seed: u64 },
    Gather { pieces: Vec<(usize, u64, u64)> },
    Flush { file: usize },
    FlushRange { file: usize, offset: u64, len: u64 },
    Evict { file: usize },
    Advise { file: usize, advice: u8 },
    Prefetch { file: usize, offset: u64, len: u64 },
    Sync,
}

const FILE_LENS: [u64; 3] = [5 * MIB + 123, 4 * MIB, 3 * MIB + 4097];

fn range_in(file: usize) -> impl Strategy<Value = (u64, u64)> {
    let len = FILE_LENS[file];
    (0..len).prop_flat_map(move |o| {
        let room = len - o;
        (Just(o), prop_oneof![0..=room.min(100), 0..=room.min(3 * MIB)])
    })
}

fn op() -> impl Strategy<Value = Op> {
    let file = 0usize..3;
    prop_oneof![
        4 => file.clone().prop_flat_map(|f| range_in(f).prop_map(move |(offset, len)| Op::View { file: f, offset, len })),
        4 => (file.clone(), any::<u64>()).prop_flat_map(|(f, seed)| {
            range_in(f).prop_map(move |(offset, len)| Op::Write { file: f, offset, len, seed })
        }),
        3 => proptest::collection::vec(
            file.clone().prop_flat_map(|f| range_in(f).prop_map(move |(o, l)| (f, o, l.min(70_000)))),
            1..40,
        )
        .prop_map(|pieces| Op::Gather { pieces }),
        1 => file.clone().prop_map(|file| Op::Flush { file }),
        1 => file.clone().prop_flat_map(|f| range_in(f).prop_map(move |(offset, len)| Op::FlushRange { file: f, offset, len })),
        1 => file.clone().prop_map(|file| Op::Evict { file }),
        1 => (file.clone(), 0u8..5).prop_map(|(file, advice)| Op::Advise { file, advice }),
        1 => file.clone().prop_flat_map(|f| range_in(f).prop_map(move |(offset, len)| Op::Prefetch { file: f, offset, len })),
        1 => Just(Op::Sync),
    ]
}

/// Runs `ops` against three files in one cache and three byte vectors: every view and gather
/// must match the vectors, memory in use never exceeds the budget, and after closing the files
/// equal the vectors at their original lengths.
fn check_three_files(memory: Device, (frames, shards): (u64, usize), extent: u64, ops: &[Op]) {
    let dir = scratch();
    let budget = frames * FRAME;
    let c = sharded_cache(memory.clone(), budget, extent, shards);
    let mut models = Vec::new();
    let mut maps = Vec::new();
    for (i, &len) in FILE_LENS.iter().enumerate() {
        let path = dir.path().join(format!("model-{i}"));
        let data = random_bytes(len as usize, len ^ extent);
        fs::write(&path, &data).unwrap();
        models.push((path.clone(), data));
        maps.push(c.open_with(&path, &writable()).unwrap());
    }
    let fits =
        |len: u64, offset: u64| len == 0 || (offset + len - 1) / FRAME - offset / FRAME < frames;
    for op in ops {
        match op {
            Op::View { file, offset, len } => {
                if !fits(*len, *offset) {
                    continue;
                }
                let view = maps[*file].view(*offset, *len).unwrap();
                let mut got = vec![0u8; *len as usize];
                view.copy_to_host(0, &mut got).unwrap();
                let want = &models[*file].1[*offset as usize..(*offset + *len) as usize];
                assert!(got == want, "{memory:?}: view {op:?} differs");
                if let (Some(device), Some(base)) = (view.device(), maps[*file].base()) {
                    if *len > extent || offset / extent != (offset + len - 1) / extent {
                        assert_eq!(device.ptr(), base + offset, "a wide view is at base + offset");
                    }
                }
            }
            Op::Write { file, offset, len, seed } => {
                let data = random_bytes(*len as usize, *seed);
                maps[*file].write(*offset, &data).unwrap();
                models[*file].1[*offset as usize..(*offset + *len) as usize].copy_from_slice(&data);
            }
            Op::Gather { pieces } => {
                let total: u64 = pieces.iter().map(|p| p.2).sum();
                let mut dst = DeviceBuffer::zeroed(&c.device(), total as usize).unwrap();
                let ranges: Vec<_> = pieces.iter().map(|&(f, o, l)| maps[f].range(o, l)).collect();
                c.gather(&ranges, dst.view_mut()).unwrap();
                let got = dst.to_vec().unwrap();
                let mut at = 0usize;
                for &(f, o, l) in pieces {
                    let want = &models[f].1[o as usize..(o + l) as usize];
                    assert!(
                        got[at..at + l as usize] == *want,
                        "{memory:?}: gathered {f}@{o}+{l} differs"
                    );
                    at += l as usize;
                }
            }
            Op::Flush { file } => maps[*file].flush().unwrap(),
            Op::FlushRange { file, offset, len } => maps[*file].flush_range(*offset, *len).unwrap(),
            Op::Evict { file } => maps[*file].evict().unwrap(),
            Op::Advise { file, advice } => {
                let advice = [
                    Advice::Normal,
                    Advice::Sequential,
                    Advice::Random,
                    Advice::WillNeed,
                    Advice::DontNeed,
                ][*advice as usize];
                maps[*file].advise(0, FILE_LENS[*file] / 2, advice).unwrap();
            }
            Op::Prefetch { file, offset, len } => {
                if fits(*len, *offset) {
                    // May find the budget pinned by read-ahead; what it does is checked by reads.
                    let _ = maps[*file].prefetch(*offset, *len).wait();
                }
            }
            Op::Sync => c.sync().unwrap(),
        }
        let stats = c.stats();
        assert!(
            stats.used_bytes <= stats.budget,
            "{memory:?}: over budget after {op:?}: {stats:?}"
        );
    }
    for m in maps {
        m.close().unwrap();
    }
    for (path, model) in &models {
        let on_disk = fs::read(path).unwrap();
        assert_eq!(on_disk.len(), model.len(), "a map changed a file's length");
        assert!(
            on_disk == *model,
            "{memory:?}: {} differs from its model after close",
            path.display()
        );
    }
}

/// Budgets in frames, and the shards they are split into: one to four frames in one shard
/// (exact LRU across the cache), or shards of two and four frames — the files' seven frames
/// then crowd each shard's share, and views wider than a frame cross shards.
fn layout() -> impl Strategy<Value = (u64, usize)> {
    prop_oneof![
        2 => (1u64..5).prop_map(|frames| (frames, 1)),
        1 => prop_oneof![Just((4, 2)), Just((8, 4)), Just((8, 2))],
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Budgets of one to four frames (up to 2048 slots of 4 KiB) force evictions across files,
    /// write-backs of dirty frames and slot frames given up for file frames.
    #[test]
    fn three_files_in_one_cache_match_their_models_on_host(
        layout in layout(),
        extent_shift in prop_oneof![Just(12u32), Just(14), Just(16)],
        ops in proptest::collection::vec(op(), 1..30),
    ) {
        check_three_files(Device::Host, layout, 1 << extent_shift, &ops);
    }

    /// The same on the GPU.
    #[test]
    #[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
    fn three_files_in_one_cache_match_their_models_on_gpu(
        layout in layout(),
        extent_shift in prop_oneof![Just(12u32), Just(14), Just(16)],
        ops in proptest::collection::vec(op(), 1..30),
    ) {
        if let Some(device) = common::gpu() {
            check_three_files(Device::Cuda(device), layout, 1 << extent_shift, &ops);
        }
    }
}

// ---- semantics --------------------------------------------------------------------------

fn partial_last_extent_reads_as_the_file_then_zeros(memory: Device) {
    for (len, extent) in [(1u64, 4096u64), (5000, 4096), (2 * MIB + 1, 65536), (4095, 4096)] {
        let dir = scratch();
        let path = dir.path().join("odd");
        let mut model = random_bytes(len as usize, len);
        fs::write(&path, &model).unwrap();
        let m = map(&path, memory.clone(), 4 * MIB, extent, true);
        let mut got = vec![0u8; len as usize];
        m.read(0, &mut got).unwrap();
        assert!(got == model);
        m.write(len - 1, b"Z").unwrap();
        model[len as usize - 1] = b'Z';
        let view = m.view(len / 2, len - len / 2).unwrap();
        let mut tail = vec![0u8; (len - len / 2) as usize];
        view.copy_to_host(0, &mut tail).unwrap();
        assert!(tail[..] == model[(len / 2) as usize..]);
        drop(view);
        m.close().unwrap();
        assert_eq!(fs::read(&path).unwrap(), model, "{memory:?} len {len}");
    }
}

fn many_threads_fault_each_extent_once(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("shared");
    let data = random_bytes((6 * MIB + 123) as usize, 5);
    fs::write(&path, &data).unwrap();
    let m = map(&path, memory.clone(), 8 * MIB, 65536, false);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (m, data) = (&m, &data);
            s.spawn(move || {
                let offset = t * 700_001 % (data.len() as u64 / 2);
                let mut got = vec![0u8; data.len() - offset as usize];
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

fn random_single_extent_views_use_slots_not_frames(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("sparse-use");
    let len = 64 * MIB;
    let data = random_bytes(len as usize, 9);
    fs::write(&path, &data).unwrap();
    // One frame of budget: 512 slots of 4 KiB. Frames would hold one useful extent each.
    let m = map(&path, memory.clone(), FRAME, 4096, false);
    let offsets: Vec<u64> =
        (0..400u64).map(|i| (i * 2_654_435_761) % (len / 4096) * 4096).collect();
    for &o in &offsets {
        let view = m.view(o, 4096).unwrap();
        let mut got = [0u8; 16];
        view.copy_to_host(100, &mut got).unwrap();
        assert!(got[..] == data[o as usize + 100..][..16]);
    }
    let before = m.stats();
    assert_eq!(before.frames, 0, "{memory:?}: a random 4 KiB view mapped a frame");
    assert!(before.slots >= 390, "{memory:?}: {before:?}");
    // All of them still resident: viewing them again reads nothing.
    for &o in &offsets {
        drop(m.view(o, 4096).unwrap());
    }
    assert_eq!(m.stats().misses, before.misses, "{memory:?}: resident extents were read again");
}

fn budget_is_kept_and_pinned_views_are_never_evicted(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("budget");
    let data = random_bytes((8 * MIB) as usize, 6);
    fs::write(&path, &data).unwrap();
    let m = CacheOptions::new()
        .memory(memory.clone())
        .frame_size(FRAME)
        .budget(FRAME)
        .extent_size(65536)
        .pin_wait(std::time::Duration::ZERO)
        .build()
        .unwrap()
        .open(&path)
        .unwrap();
    match m.view(0, 3 * MIB) {
        Err(Error::OutOfBudget { requested, budget, .. }) => {
            assert_eq!((requested, budget), (4 * MIB, FRAME))
        }
        other => panic!("{memory:?}: expected OutOfBudget, got {other:?}"),
    }
    // One frame of budget, pinned by a live wide view: no other frame can come in.
    let held = m.view(0, 100_000).unwrap();
    match m.view(6 * MIB, 100_000) {
        Err(Error::OutOfBudget { in_use, .. }) => assert_eq!(in_use, FRAME),
        other => panic!("{memory:?}: expected OutOfBudget while pinned, got {other:?}"),
    }
    let mut first = vec![0u8; 4096];
    held.copy_to_host(0, &mut first).unwrap();
    assert!(first[..] == data[..4096], "{memory:?}: the pinned view's bytes changed");
    drop(held);
    let mut got = vec![0u8; 100_000];
    m.read(6 * MIB, &mut got).unwrap();
    assert!(got[..] == data[6 * MIB as usize..][..100_000]);
    let stats = m.stats();
    assert_eq!(stats.evictions, 1, "{stats:?}");
    assert!(m.cache_stats().used_bytes <= FRAME);
}

fn a_view_waits_for_another_threads_view_to_unpin(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("wait");
    let data = random_bytes((6 * MIB) as usize, 18);
    fs::write(&path, &data).unwrap();
    let m = map(&path, memory.clone(), FRAME, 65536, false);
    let held = m.view(0, 100_000).unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| m.view(4 * MIB, 100_000).map(|v| v.len()));
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(held);
        assert_eq!(waiter.join().unwrap().unwrap(), 100_000, "{memory:?}");
    });
}

/// Two shards sharing a budget of four frames (even frames in one shard, odd in the other).
/// Views pin frames 0 and 1, one in each shard; a view over frames 5 to 7 needs three more,
/// which the budget cannot give until those pins go, so it waits — holding nothing while it
/// waits: a third view over frames 3 and 4 (one in each shard) gets them meanwhile (were the
/// waiter's frames still pinned, it would fail after the pin wait), and the waiter gets its
/// view once the first two views go.
fn a_view_waiting_in_one_shard_holds_nothing_in_another(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("shards-wait");
    let data = random_bytes((16 * MIB) as usize, 19);
    fs::write(&path, &data).unwrap();
    let c = sharded_cache(memory.clone(), 4 * FRAME, 65536, 2);
    let m = c.open(&path).unwrap();
    let held = [m.view(0, 100_000).unwrap(), m.view(FRAME, 100_000).unwrap()];
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let v = m.view(5 * FRAME + 7, 2 * FRAME)?;
            let mut got = vec![0u8; 2 * FRAME as usize];
            v.copy_to_host(0, &mut got)?;
            Ok::<_, Error>(got)
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        let third = m.view(3 * FRAME, 2 * FRAME).map(|v| v.len());
        assert_eq!(third.unwrap(), 2 * FRAME, "{memory:?}: the budget was held by a waiting view");
        assert!(!waiter.is_finished(), "{memory:?}: two frames are still pinned");
        drop(held);
        let got = waiter.join().unwrap().unwrap();
        assert!(got[..] == data[(5 * FRAME + 7) as usize..][..2 * FRAME as usize], "{memory:?}");
    });
    assert!(c.stats().used_bytes <= 4 * FRAME);
}

/// The budget is the cache's, not a share per shard: views pinning every frame one shard may
/// hold by its share leave the other shards' frames usable by that shard's requests (with fixed
/// shares, the request waited for the pins and failed with `OutOfBudget`).
fn shards_share_one_budget(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("shared-budget");
    let data = random_bytes((16 * MIB) as usize, 23);
    fs::write(&path, &data).unwrap();
    let c = CacheOptions::new()
        .memory(memory.clone())
        .frame_size(FRAME)
        .budget(4 * FRAME)
        .extent_size(65536)
        .shards(2)
        .pin_wait(Duration::ZERO)
        .build()
        .unwrap();
    let m = c.open(&path).unwrap();
    // Frames 0 and 2 are shard 0's; its share of two frames is pinned.
    let held = [m.view(0, 100_000).unwrap(), m.view(2 * FRAME, 100_000).unwrap()];
    // Frame 4 is shard 0's too: it must come from the rest of the budget.
    let v = m.view(4 * FRAME + 5, 100_000).unwrap();
    let mut got = vec![0u8; 100_000];
    v.copy_to_host(0, &mut got).unwrap();
    assert!(got[..] == data[(4 * FRAME + 5) as usize..][..100_000], "{memory:?}");
    // And frame 6 (shard 0) by evicting what shard 1 holds idle, when the budget is full.
    let w = m.view(FRAME, 100_000).map(|w| w.len()).unwrap();
    assert_eq!(w, 100_000);
    let x = m.view(6 * FRAME, 100_000).unwrap();
    x.copy_to_host(0, &mut got).unwrap();
    assert!(got[..] == data[(6 * FRAME) as usize..][..100_000], "{memory:?}");
    drop((held, v, x));
    assert!(c.stats().used_bytes <= 4 * FRAME);
}

fn dirty_frames_are_written_back_before_eviction_and_on_drop(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("evict-dirty");
    let mut model = random_bytes((6 * MIB) as usize, 7);
    fs::write(&path, &model).unwrap();
    {
        let m = map(&path, memory.clone(), FRAME, 4096, true);
        let patch = random_bytes(10_000, 8);
        m.write(MIB, &patch).unwrap();
        model[MIB as usize..][..10_000].copy_from_slice(&patch);
        // Another frame pushes the dirty one out: it must reach the file first.
        let mut got = vec![0u8; 100_000];
        m.read(4 * MIB, &mut got).unwrap();
        let stats = m.stats();
        assert!(stats.evictions >= 1);
        assert!(stats.bytes_written_back >= 10_000, "{stats:?}");
        assert!(fs::read(&path).unwrap() == model, "{memory:?}: write-back before eviction");
        let patch = random_bytes(3, 9);
        m.write(6 * MIB - 3, &patch).unwrap();
        model[(6 * MIB - 3) as usize..].copy_from_slice(&patch);
        assert_eq!(m.stats().dirty_bytes, 4096);
    }
    assert!(fs::read(&path).unwrap() == model, "{memory:?}: drop did not flush");
}

/// A call cancelled (Ctrl-C in Python) while it wrote back dirty frames to make room: the
/// write-back ran under the call's token, was cut short, and left the file's error sticky,
/// so every later flush failed until a `sync`. Write-backs are never cancelled now; the
/// reads are.
fn a_cancelled_call_never_cuts_a_write_back_short(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("cancel-dirty");
    let mut model = random_bytes((8 * MIB) as usize, 17);
    fs::write(&path, &model).unwrap();
    let m = map(&path, memory.clone(), 2 * FRAME, 4096, true);
    let patch = random_bytes((2 * FRAME) as usize, 18);
    m.write(0, &patch).unwrap();
    model[..patch.len()].copy_from_slice(&patch);
    let cancel = gpumap::io::Cancel::new();
    cancel.cancel();
    // The whole budget is dirty: this view must write it back to get room, then read.
    let view = cancel.run(|| m.view(6 * MIB, 100_000));
    assert!(
        matches!(&view, Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::Interrupted),
        "{memory:?}: the cancelled view's reads ran: {:?}",
        view.map(|_| ())
    );
    assert!(m.stats().bytes_written_back >= FRAME, "{memory:?}: {:?}", m.stats());
    // A flush under a cancelled token writes too, and nothing is left failing.
    m.write(MIB, &patch[..4096]).unwrap();
    model[MIB as usize..][..4096].copy_from_slice(&patch[..4096]);
    cancel.run(|| m.flush()).unwrap();
    m.flush().unwrap();
    assert!(fs::read(&path).unwrap() == model, "{memory:?}: the file lost a write");
    let mut got = vec![0u8; 100_000];
    m.read(6 * MIB, &mut got).unwrap();
    assert!(got[..] == model[(6 * MIB) as usize..][..100_000], "{memory:?}");
}

/// A cache made for one file (`CacheOptions::for_file`, as `DeviceMappedFile::open` makes)
/// served single-extent views from slots, which filled frames a view of the whole file then
/// needed: with as many such views held as a frame has extents, or with extents as large as a
/// frame, the whole file no longer fitted. There they are read into their frames.
fn a_cache_of_its_own_holds_single_extent_views_beside_the_whole_file(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("own-cache");
    let len = 16 * MIB;
    let data = random_bytes(len as usize, 19);
    fs::write(&path, &data).unwrap();
    for extent in [4096, 64 << 10, 8 * MIB] {
        let mut o = CacheOptions::for_file(len);
        o.memory(memory.clone()).extent_size(extent);
        let m = o.build().unwrap().open(&path).unwrap();
        let singles: Vec<_> = (0..len / extent)
            .step_by(((len / extent) / 300).max(1) as usize)
            .map(|e| {
                let view = m.view(e * extent, extent.min(4096)).unwrap();
                (e * extent, view)
            })
            .collect();
        let whole = m.view(0, len).unwrap();
        let mut got = vec![0u8; 4096];
        whole.copy_to_host(len - 4096, &mut got).unwrap();
        assert!(got[..] == data[(len - 4096) as usize..], "{memory:?}, extent {extent}");
        for (at, view) in &singles {
            view.copy_to_host(0, &mut got[..16]).unwrap();
            assert!(got[..16] == data[*at as usize..][..16], "{memory:?}, extent {extent}");
        }
    }
}

fn dropping_a_file_gives_its_memory_back_to_the_cache(memory: Device) {
    let dir = scratch();
    let c = cache(memory.clone(), 4 * FRAME, 4096);
    let a = dir.path().join("a");
    fs::write(&a, random_bytes((3 * MIB) as usize, 1)).unwrap();
    let m = c.open(&a).unwrap();
    let mut buf = vec![0u8; (3 * MIB) as usize];
    m.read(0, &mut buf).unwrap();
    drop(m.view(5 * 4096, 10).unwrap());
    assert!(c.stats().used_bytes >= 2 * FRAME);
    assert_eq!(c.stats().files, 1);
    drop(m);
    let stats = c.stats();
    assert_eq!((stats.files, stats.slots_in_use), (0, 0), "{stats:?}");
    assert!(stats.used_bytes <= FRAME, "{memory:?}: only an empty slot frame may stay: {stats:?}");
}

fn a_file_that_shrinks_under_the_map_is_an_error_not_zeros(memory: Device) {
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
    let mut rows = DeviceBuffer::zeroed(&m.device(), 200).unwrap();
    assert!(matches!(
        m.gather(&[(0, 100), (2 * MIB + 5, 100)], rows.view_mut()),
        Err(Error::UnexpectedEof { .. })
    ));
    m.read(0, &mut head).unwrap();
}

/// A gather's counters: rows sharing an extent cost one read (the others are hits); a second
/// gather of resident rows reads nothing; the file's short last extent counts its real bytes.
fn gathers_count_each_extent_once(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("counts");
    let len = 3 * MIB + 1000;
    let data = random_bytes(len as usize, 18);
    fs::write(&path, &data).unwrap();
    let m = map(&path, memory.clone(), 4 * MIB, 4096, false);
    // Eight rows over five extents: two pairs share one, one row is the file's last 1000 bytes.
    let rows: Vec<(u64, u64)> = vec![
        (0, 100),
        (200, 100),
        (MIB, 4096),
        (MIB + 8192, 50),
        (MIB + 8192 + 60, 50),
        (2 * MIB + 4096 * 3, 10),
        (len - 1000, 1000),
        (7, 3),
    ];
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let mut dst = DeviceBuffer::zeroed(&m.device(), total as usize).unwrap();
    m.gather(&rows, dst.view_mut()).unwrap();
    let got = dst.to_vec().unwrap();
    let mut at = 0;
    for &(o, l) in &rows {
        assert!(got[at..][..l as usize] == data[o as usize..][..l as usize], "{memory:?}: row {o}");
        at += l as usize;
    }
    let stats = m.stats();
    assert_eq!((stats.misses, stats.hits), (5, 3), "{memory:?}");
    assert_eq!(stats.fault_reads, 5, "{memory:?}");
    assert_eq!(stats.bytes_faulted, 4 * 4096 + 1000, "{memory:?}");
    m.gather(&rows, dst.view_mut()).unwrap();
    let again = m.stats();
    assert_eq!((again.misses, again.hits), (5, 3 + 8), "{memory:?}: resident rows were read");
    assert_eq!(again.fault_reads, 5, "{memory:?}");
}

fn read_only_gathers_read_through_a_full_budget(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("through");
    let data = random_bytes((8 * MIB) as usize, 19);
    fs::write(&path, &data).unwrap();
    let c = CacheOptions::new()
        .memory(memory.clone())
        .frame_size(FRAME)
        .budget(2 * FRAME)
        .extent_size(4096)
        .pin_wait(Duration::from_millis(50))
        .build()
        .unwrap();
    // The writable map is of a copy: a cache holds a file writable under one entry only.
    let copy = dir.path().join("through-writable");
    fs::write(&copy, &data).unwrap();
    let read_only = c.open(&path).unwrap();
    let writable = c.open_with(&copy, &writable()).unwrap();
    // Two views pin the whole budget; the rows lie elsewhere, two extents each.
    let held = (read_only.view(0, FRAME).unwrap(), read_only.view(FRAME, FRAME).unwrap());
    let rows: Vec<(u64, u64)> =
        (0..100u64).map(|i| (4 * MIB + (i * 37 * 4096) % (4 * MIB - 8192) + i, 5000)).collect();
    let mut dst = DeviceBuffer::zeroed(&c.device(), 100 * 5000).unwrap();
    let check = |dst: &DeviceBuffer, what: &str| {
        let got = dst.to_vec().unwrap();
        for (k, &(o, l)) in rows.iter().enumerate() {
            let want = &data[o as usize..][..l as usize];
            assert!(&got[k * 5000..][..5000] == want, "{memory:?}: {what}: row {o}");
        }
    };
    // A read-only file's rows are read straight into the buffer: no room, no wait, no error.
    read_only.gather(&rows, dst.view_mut()).unwrap();
    check(&dst, "read through");
    let stats = read_only.stats();
    assert_eq!((stats.frames, stats.slots), (2, 0), "{memory:?}: nothing cached: {stats:?}");
    assert!(stats.misses >= 100, "{memory:?}: {stats:?}");
    // A writable file's extents need a home (a write may follow): it waits, then fails.
    match writable.gather(&rows, dst.view_mut()) {
        Err(Error::OutOfBudget { .. }) => {}
        other => panic!("{memory:?}: expected OutOfBudget for a writable map, got {other:?}"),
    }
    // With room again, the same rows are cached.
    drop(held);
    dst.fill(0).unwrap();
    read_only.gather(&rows, dst.view_mut()).unwrap();
    check(&dst, "cached");
    assert!(read_only.stats().slots > 0, "{memory:?}: {:?}", read_only.stats());
}

fn shards_split_the_budget_and_views_cross_them(memory: Device) {
    let shards_for = |frames: u64, shards: Option<usize>| {
        let mut options = CacheOptions::new();
        options.memory(memory.clone()).frame_size(FRAME).budget(frames * FRAME);
        if let Some(n) = shards {
            options.shards(n);
        }
        options.build().map(|c| c.shards())
    };
    // By default: one shard under eight frames, else the most (up to 16) of at least two
    // frames each that divide the budget.
    for (frames, expected) in [(4, 1), (7, 1), (8, 4), (9, 1), (12, 4), (40, 8), (48, 16), (64, 16)]
    {
        assert_eq!(shards_for(frames, None).unwrap(), expected, "{memory:?}: {frames} frames");
    }
    assert_eq!(shards_for(8, Some(2)).unwrap(), 2);
    assert_eq!(shards_for(2, Some(1)).unwrap(), 1);
    for (frames, shards) in [(8, 3), (8, 8), (6, 4), (4, 0)] {
        match shards_for(frames, Some(shards)) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("shards"), "{m}"),
            other => panic!("{frames} frames in {shards} shards: {other:?}"),
        }
    }

    let dir = scratch();
    let path = dir.path().join("sharded");
    let len = 20 * MIB + 333;
    let data = random_bytes(len as usize, 77);
    fs::write(&path, &data).unwrap();
    let c = sharded_cache(memory.clone(), 8 * FRAME, 4096, 4);
    let m = c.open(&path).unwrap();
    // A view of the whole budget spans every shard, two frames in each.
    let offset = FRAME / 2;
    let whole = m.view(offset, 8 * FRAME - offset).unwrap();
    let mut got = vec![0u8; (8 * FRAME - offset) as usize];
    whole.copy_to_host(0, &mut got).unwrap();
    assert!(got[..] == data[offset as usize..][..got.len()], "{memory:?}: whole-budget view");
    drop(whole);
    match m.view(0, 8 * FRAME + 1) {
        Err(Error::OutOfBudget { requested, budget, .. }) => {
            assert_eq!((requested, budget), (9 * FRAME, 8 * FRAME), "{memory:?}")
        }
        other => panic!("{memory:?}: a view wider than the budget: {other:?}"),
    }
    // Rows over the whole file, in every shard: counted once each, resident the second time
    // (a slot frame in each shard holds them all, once the view's frames went).
    m.evict().unwrap();
    let rows: Vec<(u64, u64)> = (0..64).map(|i| (i * (len / 64) / 4096 * 4096, 4096)).collect();
    let mut dst = DeviceBuffer::zeroed(&c.device(), 64 * 4096).unwrap();
    let before = m.stats();
    m.gather(&rows, dst.view_mut()).unwrap();
    let got = dst.to_vec().unwrap();
    for (i, &(o, l)) in rows.iter().enumerate() {
        assert!(got[i * 4096..][..l as usize] == data[o as usize..][..l as usize], "row {o}");
    }
    let first = m.stats();
    assert_eq!(first.hits + first.misses - before.hits - before.misses, 64, "{memory:?}");
    m.gather(&rows, dst.view_mut()).unwrap();
    let second = m.stats();
    assert_eq!((second.misses, second.hits), (first.misses, first.hits + 64), "{memory:?}");
    let stats = c.stats();
    assert!(stats.used_bytes <= stats.budget, "{memory:?}: {stats:?}");
    assert_eq!(stats.totals.len, len, "{memory:?}: the file's length counted once");
    drop(m);
    let after = c.stats();
    assert_eq!((after.files, after.slots_in_use), (0, 0), "{memory:?}: {after:?}");
}

fn bad_requests_are_typed_errors(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("bad");
    fs::write(&path, random_bytes(10_000, 11)).unwrap();
    let own = cache(memory.clone(), FRAME, 4096);
    let m = own.open(&path).unwrap();
    assert!(matches!(m.view(9_000, 2_000), Err(Error::OutOfRange { file_len: 10_000, .. })));
    assert!(matches!(m.view(u64::MAX, 2), Err(Error::Overflow { .. })));
    let view = m.view(100, 50).unwrap();
    let mut too_much = vec![0u8; 51];
    assert!(matches!(
        view.copy_to_host(0, &mut too_much),
        Err(Error::OutOfView { offset: 0, len: 51, view_offset: 100, view_len: 50 })
    ));
    assert_eq!(view.device().is_some(), matches!(memory, Device::Cuda(_)));
    assert_eq!(m.base().is_some(), matches!(memory, Device::Cuda(_)));
    assert!(m.view(10_000, 0).unwrap().is_empty());
    let mut small = DeviceBuffer::zeroed(&m.device(), 10).unwrap();
    assert!(matches!(
        m.gather(&[(0, 8), (8, 8)], small.view_mut()),
        Err(Error::BufferTooSmall { needed: 16, available: 10 })
    ));
    let other = cache(memory.clone(), FRAME, 4096).open(&path).unwrap();
    let e = own.gather(&[other.range(0, 4)], small.view_mut()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(ref s) if s.contains("another cache")), "{e}");
}

#[test]
fn bad_options_are_typed_errors() {
    let dir = scratch();
    let path = dir.path().join("bad");
    fs::write(&path, random_bytes(10_000, 11)).unwrap();
    // 8 MiB: frames of 8 MiB by default.
    let host = || {
        let mut o = CacheOptions::new();
        o.memory(Device::Host).budget(8 * MIB);
        o
    };
    for frame in [0u64, MIB, 3 * MIB, 1 << 40] {
        let got = host().frame_size(frame).build();
        assert!(matches!(got, Err(Error::InvalidArgument(_))), "frame {frame}: {got:?}");
    }
    for extent in [0u64, 1000, 2048, 3 * 4096, 16 * MIB] {
        let got = host().extent_size(extent).build();
        assert!(matches!(got, Err(Error::InvalidArgument(_))), "extent {extent}: {got:?}");
    }
    for budget in [0u64, MIB, u64::MAX] {
        let got = host().budget(budget).build();
        assert!(
            matches!(got, Err(Error::InvalidArgument(ref m)) if m.contains("budget")),
            "budget {budget}: {got:?}"
        );
    }
    let missing = host().build().unwrap().open(dir.path().join("nope"));
    assert!(matches!(missing, Err(Error::Io { .. })));
    assert!(matches!(DeviceMappedFile::open(dir.path().join("nope")), Err(Error::Io { .. })));
    assert!(DeviceMappedFile::open(&path).is_ok());
}

fn evict_gives_memory_back_and_faults_again(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("evict");
    let mut model = random_bytes((5 * MIB) as usize, 13);
    fs::write(&path, &model).unwrap();
    let m = map(&path, memory.clone(), 6 * MIB, 65536, true);
    let patch = random_bytes(777, 14);
    m.write(3 * MIB, &patch).unwrap();
    model[3 * MIB as usize..][..777].copy_from_slice(&patch);
    let held = m.view(0, 100_000).unwrap(); // frame 0 stays
    m.evict().unwrap();
    let stats = m.stats();
    assert_eq!(stats.frames, 1, "{memory:?}: only the pinned frame stays");
    assert_eq!(stats.dirty_bytes, 0);
    assert!(fs::read(&path).unwrap() == model, "{memory:?}: evict did not write back");
    drop(held);
    let before = m.stats().bytes_faulted;
    let mut got = vec![0u8; model.len()];
    m.read(0, &mut got).unwrap();
    assert!(got == model);
    assert_eq!(m.stats().bytes_faulted - before, 5 * MIB - 2 * 65536, "{memory:?}");
}

fn sequential_walks_read_ahead(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("walk");
    let data = random_bytes((16 * MIB) as usize, 15);
    fs::write(&path, &data).unwrap();
    let window = 2 * MIB;
    let walk = || {
        let m = map(&path, memory.clone(), 8 * MIB, 65536, false);
        m.advise(0, 16 * MIB, Advice::Sequential).unwrap();
        let mut got = vec![0u8; window as usize];
        for offset in (0..16 * MIB).step_by(window as usize) {
            let view = m.view(offset, window).unwrap();
            view.copy_to_host(0, &mut got).unwrap();
            assert!(
                got[..] == data[offset as usize..][..window as usize],
                "{memory:?} at {offset}"
            );
        }
        m
    };
    // Each byte is read once — but a read-ahead that the scheduler holds back until the walk
    // has passed its window (two busy cores, tests running beside this one) can read that
    // window again: measured once in 120 runs with both cores otherwise busy, never when idle,
    // and once two windows in a CI run. So a walk gets three tries, each on a fresh map, and
    // one of them must read each byte once (or one window again).
    let mut tries = Vec::new();
    let m = loop {
        let m = walk();
        let stats = m.stats();
        if (16 * MIB..=16 * MIB + window).contains(&stats.bytes_faulted) {
            break m;
        }
        tries.push(stats);
        assert!(tries.len() < 3, "{memory:?}: each byte read once, in none of 3 walks: {tries:?}");
    };
    let stats = m.stats();
    assert!(stats.hits > 0, "{memory:?}: read-ahead had nothing ready: {stats:?}");
    // A second pass reads ahead too: its first view starts reading the windows after it,
    // which the first pass evicted (the budget holds half the file).
    // (Read-ahead starts before the view waits for its own window, and on a machine with
    // cores to spare may be done by the time the view returns.)
    let before = m.stats().misses;
    drop(m.view(0, window).unwrap());
    let window_extents = window / 65536;
    let own = m.stats().misses - before;
    assert!(own >= window_extents, "{memory:?}: window 0 was resident after the first pass");
    let deadline = Instant::now() + Duration::from_secs(20);
    while m.stats().misses - before == window_extents {
        assert!(Instant::now() < deadline, "{memory:?}: no read-ahead in the second pass");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn views_and_prefetch_in_batches(memory: Device) {
    let dir = scratch();
    let c = cache(memory.clone(), 8 * FRAME, 4096);
    let path = dir.path().join("batch");
    let data = random_bytes((10 * MIB) as usize, 16);
    fs::write(&path, &data).unwrap();
    let m = c.open(&path).unwrap();
    let ranges: Vec<(u64, u64)> =
        (0..300u64).map(|i| ((i * 7919 * 4096) % (10 * MIB - 9000), 9000)).collect();
    let views = m.views(&ranges).unwrap();
    for (view, &(o, l)) in views.iter().zip(&ranges) {
        let mut got = vec![0u8; l as usize];
        view.copy_to_host(0, &mut got).unwrap();
        assert!(got[..] == data[o as usize..][..l as usize]);
    }
    drop(views);
    m.prefetch(0, MIB).wait().unwrap();
    let before = m.stats().misses;
    drop(m.view(0, MIB).unwrap());
    assert_eq!(m.stats().misses, before, "{memory:?}: the prefetched range was read again");
    assert!(matches!(m.prefetch(10 * MIB, 1).wait(), Err(Error::OutOfRange { .. })));
}

fn async_gathers_hand_the_buffer_back(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("async");
    let data = random_bytes((3 * MIB) as usize, 17);
    fs::write(&path, &data).unwrap();
    let m = map(&path, memory.clone(), 4 * MIB, 4096, false);
    let dst = DeviceBuffer::zeroed(&m.device(), 3 * 5000).unwrap();
    let dst =
        m.gather_async(vec![(7, 5000), (MIB, 5000), (3 * MIB - 5000, 5000)], dst).wait().unwrap();
    let got = dst.to_vec().unwrap();
    assert!(got[..5000] == data[7..5007]);
    assert!(got[10_000..] == data[(3 * MIB - 5000) as usize..]);
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn device_views_are_device_memory_at_base_plus_offset() {
    let Some(device) = common::gpu() else { return };
    let dir = scratch();
    let path = dir.path().join("device");
    let data = random_bytes((5 * MIB + 17) as usize, 12);
    fs::write(&path, &data).unwrap();
    let m = map(&path, Device::Cuda(device.clone()), 4 * MIB, 65536, false);
    let base = m.base().unwrap();
    let view = m.view(3 * MIB + 5, MIB).unwrap();
    let region = view.device().unwrap();
    assert_eq!(region.ptr(), base + 3 * MIB + 5);
    // Plain device memory: a plain driver copy sees the file's bytes.
    let mut got = vec![0u8; MIB as usize];
    region.copy_to_host(0, &mut got).unwrap();
    assert!(got[..] == data[(3 * MIB + 5) as usize..][..MIB as usize]);
}

/// A 1 TiB sparse file under a small budget (host 64 MiB, GPU 256 MiB): random views and
/// gathers see the blocks written into it, and zeros elsewhere; the budget holds.
fn a_terabyte_sparse_file_under_a_small_budget(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("tera");
    let len = 1u64 << 40;
    let file = fs::File::create(&path).unwrap();
    if file.set_len(len).is_err() {
        eprintln!("SKIP a_terabyte_sparse_file_under_a_small_budget: no sparse files here");
        return;
    }
    let mut blocks = Vec::new();
    for i in 0..64u64 {
        let offset =
            i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % (len - 8192) / 4096 * 4096 + (i % 3) * 100;
        let data = random_bytes(5000, i);
        std::os::unix::fs::FileExt::write_all_at(&file, &data, offset).unwrap();
        blocks.push((offset, data));
    }
    drop(file);
    let budget = if memory.is_host() { 64 * MIB } else { 256 * MIB };
    let c = cache(memory.clone(), budget, 4096);
    let m = c.open(&path).unwrap();
    for (offset, data) in &blocks {
        let view = m.view(*offset, 100).unwrap();
        let mut got = vec![0u8; 100];
        view.copy_to_host(0, &mut got).unwrap();
        assert!(got[..] == data[..100], "{memory:?}: block at {offset}");
    }
    let ranges: Vec<(u64, u64)> = blocks.iter().map(|(o, d)| (*o, d.len() as u64)).collect();
    let mut rows = DeviceBuffer::zeroed(&c.device(), 64 * 5000).unwrap();
    m.gather(&ranges, rows.view_mut()).unwrap();
    let got = rows.to_vec().unwrap();
    for (i, (_, data)) in blocks.iter().enumerate() {
        assert!(got[i * 5000..(i + 1) * 5000] == data[..], "{memory:?}: gathered block {i}");
    }
    // Holes read as zeros, far apart.
    for k in 0..200u64 {
        let offset = (k * 5_368_709_121) % (len - 4096);
        if blocks.iter().any(|(o, d)| offset < o + d.len() as u64 + 8192 && *o < offset + 8192) {
            continue;
        }
        let view = m.view(offset, 64).unwrap();
        let mut got = [1u8; 64];
        view.copy_to_host(0, &mut got).unwrap();
        assert_eq!(got, [0u8; 64], "{memory:?}: hole at {offset}");
        let stats = c.stats();
        assert!(stats.used_bytes <= stats.budget, "{stats:?}");
    }
}

/// Gathers of thousands of ranges (more than one task's worth where a host gather's copies are
/// shared among the pool's threads: decision 0036), of any length and across extents, whose
/// extents are in frames (a wide view made them resident), in slots (an earlier gather), not
/// yet resident, or, past a full budget of a read-only map, read through: each byte where the
/// model says, also after writes.
fn gathers_of_thousands_of_ranges_match_the_model_wherever_their_extents_are(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("table");
    let mut model = random_bytes((12 * MIB + 77) as usize, 36);
    fs::write(&path, &model).unwrap();
    let noise = random_bytes(6_000 * 16, 37);
    let ranges: Vec<(u64, u64)> = noise
        .chunks_exact(16)
        .map(|c| {
            let (a, b) = c.split_at(8);
            let len = 1 + u64::from_le_bytes(b.try_into().unwrap()) % 6_000;
            let offset = u64::from_le_bytes(a.try_into().unwrap()) % (model.len() as u64 - len);
            (offset, len)
        })
        .collect();
    let check = |m: &DeviceMappedFile, model: &[u8], ranges: &[(u64, u64)], what: &str| {
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        let mut dst = DeviceBuffer::zeroed(&memory, total as usize).unwrap();
        m.gather(ranges, dst.view_mut()).unwrap();
        let got = dst.to_vec().unwrap();
        let mut at = 0usize;
        for &(o, n) in ranges {
            let want = &model[o as usize..(o + n) as usize];
            assert!(got[at..at + n as usize] == *want, "{memory:?}, {what}: {o}+{n} differs");
            at += n as usize;
        }
    };
    // Room for the whole file, and rounds of up to a quarter of the budget's 32,768 extents:
    // frames, slots and misses mixed in one gather, then after writes.
    let c = cache(memory.clone(), 128 * MIB, 4096);
    let m = c.open_with(&path, &writable()).unwrap();
    drop(m.view(3 * MIB, 2 * MIB + 5).unwrap());
    check(&m, &model, &ranges[..1_500], "a first quarter");
    check(&m, &model, &ranges, "mixed");
    for k in 0..50u64 {
        let (offset, len) = ranges[(k * 97) as usize];
        let bytes = random_bytes(len as usize, 100 + k);
        m.write(offset, &bytes).unwrap();
        model[offset as usize..(offset + len) as usize].copy_from_slice(&bytes);
    }
    check(&m, &model, &ranges, "after writes");
    m.sync().unwrap();
    drop(m);
    // A read-only map under a budget of a sixth of the file: rounds, and extents read through.
    let c = cache(memory.clone(), 2 * MIB, 4096);
    let m = c.open(&path).unwrap();
    check(&m, &model, &ranges, "read through, cold");
    check(&m, &model, &ranges, "read through, again");
}
