//! Row gathers by index (`DeviceMappedFile::gather_rows`) against a byte-vector model of the
//! file, on host memory (every machine) and on the GPU (where there is one; skipped loudly
//! elsewhere): rows of any size, across extents; int32 and int64 indices, on the host or on the
//! GPU; bad indices named, never read; files cut under the map; writes, flushes and evictions
//! between gathers; many threads gathering while a writer rewrites rows under a budget too
//! small for the file.

#[macro_use]
mod common;

use std::fs;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use common::{random_bytes, retry};
use gpumap::mapped::{
    CacheOptions, DeviceCache, DeviceMappedFile, MapOptions, RowIndices, ZeroCopy,
};
use gpumap::memory::{Device, DeviceBuffer};
use gpumap::Error;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const FRAME: u64 = 2 * MIB;

on_host_and_gpu!(
    rows_of_any_size_match_the_file,
    the_second_gather_finds_the_rows_resident,
    bad_indices_are_named_and_never_read,
    bad_arguments_are_typed_errors,
    a_file_cut_under_the_map_reads_as_cut,
    writes_are_seen_by_the_next_gather,
    gathers_race_a_writer_and_evictions_under_a_small_budget,
    more_rows_than_one_pass,
    zero_copy_rows_match_the_file,
    hot_rows_stay_resident_under_cold_churn,
    misses_past_a_full_cache_are_read_through_then_admitted,
    a_writable_map_fills_the_cache_even_when_full,
    gathers_past_a_full_cache_race_admissions_and_evictions,
    misses_read_in_place_are_then_admitted,
    gathers_with_misses_in_place_race_admissions_and_evictions,
    gathers_of_thousands_of_rows_match_the_file_cold_hot_and_read_through,
);

fn scratch() -> tempfile::TempDir {
    let base =
        std::env::var("GPUMAP_BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

fn cache(memory: Device, budget: u64, extent: u64) -> DeviceCache {
    CacheOptions::new()
        .memory(memory)
        .frame_size(FRAME)
        .budget(budget)
        .extent_size(extent)
        .build()
        .unwrap()
}

/// The rows `indices` of `model`, `row_size` bytes each, packed: what a gather must return.
fn expected(model: &[u8], indices: &[i64], row_size: usize) -> Vec<u8> {
    indices.iter().flat_map(|&i| &model[i as usize * row_size..][..row_size]).copied().collect()
}

/// Gathers `indices` (as int64, and again as int32) of `map` and returns what arrived.
fn gather(map: &DeviceMappedFile, memory: &Device, indices: &[i64], row_size: usize) -> Vec<u8> {
    let mut dst = DeviceBuffer::zeroed(memory, (indices.len() * row_size).max(1)).unwrap();
    map.gather_rows(indices, row_size as u64, dst.view_mut()).unwrap();
    let mut wide = dst.to_vec().unwrap();
    let narrow: Vec<i32> = indices.iter().map(|&i| i as i32).collect();
    let mut dst = DeviceBuffer::zeroed(memory, (indices.len() * row_size).max(1)).unwrap();
    map.gather_rows(&narrow, row_size as u64, dst.view_mut()).unwrap();
    assert!(dst.to_vec().unwrap() == wide, "int32 and int64 indices gather the same rows");
    wide.truncate(indices.len() * row_size);
    wide
}

/// `count` pseudo-random indices below `rows`, with repeats, the first and the last row.
fn some_indices(rows: u64, count: usize, seed: u64) -> Vec<i64> {
    let noise = random_bytes(count * 8, seed);
    let mut v: Vec<i64> = noise
        .chunks_exact(8)
        .map(|c| (u64::from_le_bytes(c.try_into().unwrap()) % rows) as i64)
        .collect();
    if count >= 4 {
        v[0] = 0;
        v[1] = rows as i64 - 1;
        v[2] = v[3];
    }
    v
}

fn rows_of_any_size_match_the_file(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("table");
    let data = random_bytes((3 * MIB + 123) as usize, 1);
    fs::write(&path, &data).unwrap();
    let c = cache(memory.clone(), 8 * MIB, 4096);
    let map = c.open(&path).unwrap();
    // Within an extent, exactly one, across two, across several; odd sizes that cross extent
    // borders at every offset.
    for (k, row_size) in [1usize, 7, 512, 3000, 4096, 5000, 10_000, 65_537].into_iter().enumerate()
    {
        let rows = data.len() as u64 / row_size as u64;
        let indices = some_indices(rows, 300, k as u64 + 10);
        let got = gather(&map, &memory, &indices, row_size);
        assert!(got == expected(&data, &indices, row_size), "{memory:?}: rows of {row_size} bytes");
    }
}

fn the_second_gather_finds_the_rows_resident(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("table");
    let data = random_bytes((4 * MIB) as usize, 2);
    fs::write(&path, &data).unwrap();
    let c = cache(memory.clone(), 8 * MIB, 4096);
    let map = c.open(&path).unwrap();
    let indices = some_indices(4 * MIB / 512, 2000, 3);
    let first = gather(&map, &memory, &indices, 512);
    let after_first = map.stats();
    let second = gather(&map, &memory, &indices, 512);
    let after_second = map.stats();
    assert!(first == expected(&data, &indices, 512) && second == first, "{memory:?}");
    // Every row of the second gather (twice: int64 and int32) was found resident, through the
    // directory, with no read of the file.
    assert_eq!(
        after_second.bytes_faulted, after_first.bytes_faulted,
        "{memory:?}: {after_second:?}"
    );
    assert_eq!(after_second.hits - after_first.hits, 2 * indices.len() as u64, "{memory:?}");
}

fn bad_indices_are_named_and_never_read(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("table");
    // 1000 whole rows of 100 bytes and a partial one: row 1000 is not a row.
    let data = random_bytes(100_050, 4);
    fs::write(&path, &data).unwrap();
    let c = cache(memory.clone(), 4 * MIB, 4096);
    let map = c.open(&path).unwrap();
    let cases: &[(&[i64], u64, i64)] = &[
        (&[0, 1, 2, -1, 5], 3, -1),
        (&[999, 1000], 1, 1000),
        (&[5, i64::MAX, -7], 1, i64::MAX),
        (&[i64::MIN], 0, i64::MIN),
        (&[3, 4, 1 << 40, 5, -1], 2, 1 << 40),
    ];
    for &(indices, position, index) in cases {
        let mut dst = DeviceBuffer::zeroed(&memory, indices.len() * 100).unwrap();
        match map.gather_rows(indices, 100, dst.view_mut()) {
            Err(Error::RowIndex { position: p, index: i, rows: 1000 }) => {
                assert_eq!((p, i), (position, index), "{memory:?}: {indices:?}")
            }
            other => panic!("{memory:?}: {indices:?} gave {other:?}"),
        }
    }
    let narrow: &[i32] = &[7, i32::MIN];
    let mut dst = DeviceBuffer::zeroed(&memory, 200).unwrap();
    let e = map.gather_rows(narrow, 100, dst.view_mut()).unwrap_err();
    assert!(
        matches!(e, Error::RowIndex { position: 1, index, .. } if index == i64::from(i32::MIN))
    );
    assert_eq!(
        e.to_string(),
        "row index -2147483648 at position 1 is outside the file's 1000 rows"
    );
    // Bad indices far apart in a gather of thousands (several tasks where it is shared among
    // threads): the lowest position is named, whichever task meets its index first.
    let mut many: Vec<i64> = (0..12_000).map(|i| i % 1000).collect();
    many[9_000] = -3;
    many[5_000] = 1000;
    many[11_999] = 5000;
    let mut dst = DeviceBuffer::zeroed(&memory, many.len() * 100).unwrap();
    let e = map.gather_rows(&many, 100, dst.view_mut());
    assert!(
        matches!(e, Err(Error::RowIndex { position: 5_000, index: 1000, rows: 1000 })),
        "{memory:?}: {e:?}"
    );
    // Rows of the file's whole length or more: not one row fits.
    let e = map.gather_rows(
        &[0i64],
        100_051,
        DeviceBuffer::zeroed(&memory, 100_051).unwrap().view_mut(),
    );
    assert!(matches!(e, Err(Error::RowIndex { position: 0, index: 0, rows: 0 })), "{e:?}");
    // The map still serves good rows.
    let got = gather(&map, &memory, &[999, 0], 100);
    assert!(got == expected(&data, &[999, 0], 100));
}

fn bad_arguments_are_typed_errors(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("table");
    fs::write(&path, random_bytes(1 << 16, 5)).unwrap();
    let map = cache(memory.clone(), 4 * MIB, 4096).open(&path).unwrap();
    let mut dst = DeviceBuffer::zeroed(&memory, 1024).unwrap();
    assert!(matches!(map.gather_rows(&[1i64], 0, dst.view_mut()), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        map.gather_rows(&[1i64, 2, 3], 512, dst.view_mut()),
        Err(Error::BufferTooSmall { needed: 1536, available: 1024 })
    ));
    assert!(matches!(
        map.gather_rows(&[1i64, 2], u64::MAX / 2 + 1, dst.view_mut()),
        Err(Error::Overflow { .. })
    ));
    // No rows: nothing to do, nothing written.
    dst.view_mut().fill(0xab).unwrap();
    let none: &[i64] = &[];
    map.gather_rows(none, 512, dst.view_mut()).unwrap();
    assert!(dst.to_vec().unwrap().iter().all(|&b| b == 0xab));
    assert!(RowIndices::from(none).is_empty());
}

fn a_file_cut_under_the_map_reads_as_cut(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("table");
    let data = random_bytes((MIB) as usize, 6);
    fs::write(&path, &data).unwrap();
    let map = cache(memory.clone(), 4 * MIB, 4096).open(&path).unwrap();
    let all: Vec<i64> = (0..1024).collect();
    assert!(gather(&map, &memory, &all, 1024) == data, "{memory:?}");
    // Cut to 300 rows and a bit: rows 0..300 still read, row 300 on are past the end, however
    // resident they are.
    fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(300 * 1024 + 10).unwrap();
    let got = gather(&map, &memory, &[299, 0, 150], 1024);
    assert!(got == expected(&data, &[299, 0, 150], 1024));
    let mut dst = DeviceBuffer::zeroed(&memory, 2 * 1024).unwrap();
    match map.gather_rows(&[10i64, 300], 1024, dst.view_mut()) {
        Err(Error::UnexpectedEof { offset, wanted: 1024, file_len, .. }) => {
            assert_eq!((offset, file_len), (300 * 1024, 300 * 1024 + 10), "{memory:?}")
        }
        other => panic!("{memory:?}: {other:?}"),
    }
    // Past the rows mapped is still a bad index, not a short file.
    assert!(matches!(
        map.gather_rows(&[1024i64], 1024, dst.view_mut()),
        Err(Error::RowIndex { rows: 1024, .. })
    ));
}

fn writes_are_seen_by_the_next_gather(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("table");
    let mut model = random_bytes((6 * MIB) as usize, 7);
    fs::write(&path, &model).unwrap();
    // A budget smaller than the file: gathers evict each other's rows too.
    let c = cache(memory.clone(), 4 * MIB, 4096);
    let map = c.open_with(&path, MapOptions::new().writable(true)).unwrap();
    let rows = model.len() as u64 / 700;
    for round in 0..6u64 {
        let indices = some_indices(rows, 500, 100 + round);
        assert!(gather(&map, &memory, &indices, 700) == expected(&model, &indices, 700));
        // Rewrite some of the rows just gathered (their slots go stale), through `write` and
        // through a writable view.
        for (k, &i) in indices.iter().enumerate().step_by(7) {
            let bytes = vec![(round * 31 + k as u64) as u8; 700];
            let offset = i as u64 * 700;
            if k % 2 == 0 {
                map.write(offset, &bytes).unwrap();
            } else {
                let mut view = map.view_mut(offset, 700).unwrap();
                view.copy_from_host(0, &bytes).unwrap();
            }
            model[offset as usize..][..700].copy_from_slice(&bytes);
        }
        assert!(gather(&map, &memory, &indices, 700) == expected(&model, &indices, 700));
        match round % 3 {
            0 => map.flush().unwrap(),
            1 => map.evict().unwrap(),
            _ => {}
        }
    }
    map.sync().unwrap();
    assert!(fs::read(&path).unwrap() == model, "{memory:?}: the file holds every write");
}

/// Row `r`'s bytes at version `v`: 4-byte words `(r << 8) | v`, so a row read from the wrong
/// slot (another row's bytes) shows, while a row caught half rewritten still reads as words
/// of its own versions.
fn row_bytes(r: u32, v: u32, row_size: usize) -> Vec<u8> {
    std::iter::repeat_n(((r << 8) | v).to_le_bytes(), row_size / 4).flatten().collect()
}

/// Sets its flag when dropped, also while a panic unwinds.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn gathers_race_a_writer_and_evictions_under_a_small_budget(memory: Device) {
    const ROW: usize = 1024;
    const ROWS: u32 = 8192; // 8 MiB, four times the budget
    let dir = scratch();
    let path = dir.path().join("table");
    let data: Vec<u8> = (0..ROWS).flat_map(|r| row_bytes(r, 0, ROW)).collect();
    fs::write(&path, &data).unwrap();
    let c = cache(memory.clone(), 2 * MIB, 4096);
    let map = c.open_with(&path, MapOptions::new().writable(true)).unwrap();
    let versions: Arc<Vec<AtomicU32>> = Arc::new((0..ROWS).map(|_| AtomicU32::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            // The others stop when the writer does, also when it fails: a failure, not a hang.
            let _stop_when_done = StopOnDrop(&stop);
            for round in 0..150u64 {
                let r = (round.wrapping_mul(2_654_435_761) % u64::from(ROWS)) as u32;
                let v = versions[r as usize].load(Ordering::Relaxed) + 1;
                // A write needs the budget's one frame for a moment, which four gatherers may
                // hold past the pin wait: it tries again.
                retry(|| map.write(u64::from(r) * ROW as u64, &row_bytes(r, v & 0xff, ROW)));
                versions[r as usize].store(v, Ordering::Release);
                if round % 50 == 49 {
                    retry(|| map.flush());
                }
            }
        });
        // Evictions of everything no one pins, racing the gathers' kernels and the writer:
        // slots are reused under gathers that may still be reading (their readers hold them).
        let evictor = s.spawn(|| {
            let mut evictions = 0u32;
            while !stop.load(Ordering::Acquire) || evictions < 3 {
                map.evict().unwrap();
                evictions += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        });
        let readers: Vec<_> = (0..4u64)
            .map(|t| {
                let (map, memory, versions, stop) = (&map, &memory, &versions, &stop);
                s.spawn(move || {
                    let mut gathers = 0;
                    while !stop.load(Ordering::Acquire) || gathers < 20 {
                        // Every fourth gather takes thousands of rows: on host memory, shared
                        // among the pool's threads.
                        let count = if gathers % 4 == 3 { 9_000 } else { 256 };
                        let indices = some_indices(u64::from(ROWS), count, t * 1000 + gathers);
                        // The version each row had before the gather: it must read that one or
                        // a later one, never an earlier one, never another row's.
                        let before: Vec<u32> = indices
                            .iter()
                            .map(|&i| versions[i as usize].load(Ordering::Acquire))
                            .collect();
                        let mut dst = DeviceBuffer::zeroed(memory, count * ROW).unwrap();
                        retry(|| map.gather_rows(&indices, ROW as u64, dst.view_mut()));
                        let got = dst.to_vec().unwrap();
                        for (k, &i) in indices.iter().enumerate() {
                            for word in got[k * ROW..][..ROW].chunks_exact(4) {
                                let w = u32::from_le_bytes(word.try_into().unwrap());
                                assert_eq!(
                                    w >> 8,
                                    i as u32,
                                    "{memory:?}: row {i} read another row"
                                );
                                let v = w & 0xff;
                                let newest = versions[i as usize].load(Ordering::Acquire);
                                let (low, high) = (before[k], newest);
                                assert!(
                                    (low..=high).any(|x| x & 0xff == v),
                                    "{memory:?}: row {i} read version {v}, had {low}..={high}"
                                );
                            }
                        }
                        gathers += 1;
                    }
                })
            })
            .collect();
        writer.join().unwrap();
        evictor.join().unwrap();
        for r in readers {
            r.join().unwrap();
        }
    });
    let final_rows: Vec<i64> = (0..i64::from(ROWS)).collect();
    let got = gather(&map, &memory, &final_rows, ROW);
    map.sync().unwrap();
    let on_disk = fs::read(&path).unwrap();
    for r in 0..ROWS {
        let v = versions[r as usize].load(Ordering::Relaxed) & 0xff;
        let want = row_bytes(r, v, ROW);
        assert!(got[r as usize * ROW..][..ROW] == want[..], "{memory:?}: row {r}");
        assert!(on_disk[r as usize * ROW..][..ROW] == want[..], "{memory:?}: row {r} on disk");
    }
}

fn more_rows_than_one_pass(memory: Device) {
    // Past a pass of 2^20 rows: positions and destinations continue across passes, and a bad
    // index in a later pass is named by its position in the whole array.
    let dir = scratch();
    let path = dir.path().join("table");
    let data = random_bytes((MIB) as usize, 8);
    fs::write(&path, &data).unwrap();
    let map = cache(memory.clone(), 4 * MIB, 4096).open(&path).unwrap();
    let count = (1 << 20) + 4321;
    let indices: Vec<i32> = (0..count).map(|k| ((k * 7919) % (1 << 18)) as i32).collect();
    let mut dst = DeviceBuffer::zeroed(&memory, count * 4).unwrap();
    map.gather_rows(&indices, 4, dst.view_mut()).unwrap();
    let got = dst.to_vec().unwrap();
    for (k, &i) in indices.iter().enumerate().step_by(997).chain([(count - 1, &indices[count - 1])])
    {
        assert_eq!(got[k * 4..][..4], data[i as usize * 4..][..4], "{memory:?}: position {k}");
    }
    let mut bad = indices.clone();
    bad[count - 2] = 1 << 18;
    match map.gather_rows(&bad, 4, dst.view_mut()) {
        Err(Error::RowIndex { position, index, rows }) => {
            assert_eq!((position, index, rows), (count as u64 - 2, 1 << 18, 1 << 18))
        }
        other => panic!("{memory:?}: {other:?}"),
    }
}

fn zero_copy_rows_match_the_file(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("table");
    let data = random_bytes((MIB + 77) as usize, 9);
    fs::write(&path, &data).unwrap();
    let c = cache(memory.clone(), 4 * MIB, 4096);
    let map =
        c.open_with(&path, MapOptions::new().zero_copy(gpumap::mapped::ZeroCopy::On)).unwrap();
    for row_size in [3usize, 4096, 10_000] {
        let rows = data.len() as u64 / row_size as u64;
        let indices = some_indices(rows, 200, row_size as u64);
        assert!(gather(&map, &memory, &indices, row_size) == expected(&data, &indices, row_size));
        let mut dst = DeviceBuffer::zeroed(&memory, 2 * row_size).unwrap();
        assert!(matches!(
            map.gather_rows(&[0i64, rows as i64], row_size as u64, dst.view_mut()),
            Err(Error::RowIndex { position: 1, .. })
        ));
    }
    fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096 * 10).unwrap();
    let mut dst = DeviceBuffer::zeroed(&memory, 4096).unwrap();
    assert!(matches!(
        map.gather_rows(&[10i64], 4096, dst.view_mut()),
        Err(Error::UnexpectedEof { offset: 40960, .. })
    ));
}

// ---- GPU only: indices in device memory, the caller's stream ----------------------------

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn device_indices_and_the_callers_stream() {
    use gpumap::mapped::IndexWidth;
    use gpumap::memory::cuda::{CudaBuffer, Stream};
    use gpumap::memory::StreamRef;
    let Some(device) = common::gpu() else { return };
    let memory = Device::Cuda(device.clone());
    let dir = scratch();
    let path = dir.path().join("table");
    let data = random_bytes((2 * MIB) as usize, 10);
    fs::write(&path, &data).unwrap();
    let c = cache(memory.clone(), 4 * MIB, 4096);
    let map = c.open(&path).unwrap();
    let indices = some_indices(2 * MIB / 300, 3000, 11);
    let bytes: Vec<u8> = indices.iter().flat_map(|i| i.to_ne_bytes()).collect();
    let mut on_device = CudaBuffer::alloc(&device, bytes.len()).unwrap();
    on_device.copy_from_host(0, &bytes).unwrap();
    let stream = Stream::new(&device).unwrap();
    for round in 0..2 {
        let mut dst = DeviceBuffer::zeroed(&memory, indices.len() * 300).unwrap();
        let source = RowIndices::on_device(on_device.view(), IndexWidth::I64).unwrap();
        if round == 0 {
            map.gather_rows(source, 300, dst.view_mut()).unwrap();
        } else {
            map.gather_rows_on(source, 300, dst.view_mut(), StreamRef::of(&stream)).unwrap();
        }
        assert!(dst.to_vec().unwrap() == expected(&data, &indices, 300), "round {round}");
    }
    // The same device indices on a map whose misses are read in place: rows from both tiers.
    let small = cache(memory.clone(), 2 * MIB, 4096);
    let in_place = small.open_with(&path, MapOptions::new().zero_copy(ZeroCopy::Misses)).unwrap();
    for round in 0..3 {
        let mut dst = DeviceBuffer::zeroed(&memory, indices.len() * 300).unwrap();
        let source = RowIndices::on_device(on_device.view(), IndexWidth::I64).unwrap();
        in_place.gather_rows_on(source, 300, dst.view_mut(), StreamRef::of(&stream)).unwrap();
        assert!(dst.to_vec().unwrap() == expected(&data, &indices, 300), "in place, round {round}");
        small.wait_for_admissions();
    }
    assert!(in_place.stats().rows_read_through > 0 && in_place.stats().hits > 0);
    // A bad index on the device is named too.
    let mut bad = bytes.clone();
    bad[8 * 17..8 * 18].copy_from_slice(&(-5i64).to_ne_bytes());
    on_device.copy_from_host(0, &bad).unwrap();
    let source = RowIndices::on_device(on_device.view(), IndexWidth::I64).unwrap();
    let mut dst = DeviceBuffer::zeroed(&memory, indices.len() * 300).unwrap();
    assert!(matches!(
        map.gather_rows(source, 300, dst.view_mut()),
        Err(Error::RowIndex { position: 17, index: -5, .. })
    ));
    // Not a whole number of indices.
    assert!(RowIndices::on_device(on_device.view().slice(0..12).unwrap(), IndexWidth::I64).is_err());
}

// ---- a model of the file under any sequence of operations (host memory) -----------------

#[derive(Debug, Clone)]
enum Op {
    Gather(Vec<u32>),
    Write { row: u32, byte: u8 },
    WriteThroughView { row: u32, byte: u8 },
    Flush,
    Evict,
}

const MODEL_ROW: u64 = 1500;
const MODEL_ROWS: u32 = (5 * MIB / MODEL_ROW) as u32;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(0..MODEL_ROWS, 1..300).prop_map(Op::Gather),
        2 => (0..MODEL_ROWS, any::<u8>()).prop_map(|(row, byte)| Op::Write { row, byte }),
        1 => (0..MODEL_ROWS, any::<u8>()).prop_map(|(row, byte)| Op::WriteThroughView { row, byte }),
        1 => Just(Op::Flush),
        1 => Just(Op::Evict),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn gathers_match_a_model_of_the_file(ops in prop::collection::vec(op(), 1..40)) {
        let dir = scratch();
        let path = dir.path().join("table");
        let mut model = random_bytes((5 * MIB) as usize, 12);
        fs::write(&path, &model).unwrap();
        let memory = Device::Host;
        let map = cache(memory.clone(), 2 * MIB, 4096)
            .open_with(&path, MapOptions::new().writable(true))
            .unwrap();
        let row = MODEL_ROW as usize;
        for op in ops {
            match op {
                Op::Gather(rows) => {
                    let indices: Vec<i64> = rows.iter().map(|&r| i64::from(r)).collect();
                    let got = gather(&map, &memory, &indices, row);
                    prop_assert!(got == expected(&model, &indices, row));
                }
                Op::Write { row: r, byte } => {
                    map.write(u64::from(r) * MODEL_ROW, &vec![byte; row]).unwrap();
                    model[r as usize * row..][..row].fill(byte);
                }
                Op::WriteThroughView { row: r, byte } => {
                    let offset = u64::from(r) * MODEL_ROW;
                    // A view needs all its frames at once: one across two frames cannot fit
                    // a budget of one, and says so with the typed error, writing nothing.
                    let crosses = offset / FRAME != (offset + MODEL_ROW - 1) / FRAME;
                    match map.view_mut(offset, MODEL_ROW) {
                        Ok(mut view) => {
                            view.copy_from_host(0, &vec![byte; row]).unwrap();
                            model[r as usize * row..][..row].fill(byte);
                        }
                        Err(Error::OutOfBudget { .. }) if crosses => {}
                        Err(e) => prop_assert!(false, "view of row {r}: {e}"),
                    }
                }
                Op::Flush => map.flush().unwrap(),
                Op::Evict => map.evict().unwrap(),
            }
        }
        map.sync().unwrap();
        prop_assert!(fs::read(&path).unwrap() == model);
    }
}

/// Rows found by lookups (the kernel's, on a GPU) never pass through the books' LRU list; the
/// harvest of their used marks must keep a hot set resident while a stream of cold rows churns
/// through the rest of the budget.
fn hot_rows_stay_resident_under_cold_churn(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("table");
    fs::write(&path, random_bytes((64 * MIB) as usize, 13)).unwrap();
    // 512 slots of 4 KiB; 100 hot rows, then 150 new cold rows a round.
    let map = cache(memory.clone(), 2 * MIB, 4096).open(&path).unwrap();
    let hot: Vec<i64> = (0..100).map(|k| k * 97).collect();
    let mut cold_rows = 0;
    let mut next_cold = 10_000i64;
    for _ in 0..40 {
        gather(&map, &memory, &hot, 4096);
        let cold: Vec<i64> = (next_cold..next_cold + 150).collect();
        next_cold += 150;
        cold_rows += cold.len() as u64;
        gather(&map, &memory, &cold, 4096);
    }
    let faults = map.stats().fault_reads;
    // Every cold row once, the hot ones once at first and a few times while the marks build
    // up; without the harvest, every hot row is read again every few rounds.
    assert!(faults <= cold_rows + 3 * 100, "{memory:?}: {faults} reads for {cold_rows} cold rows");
}

/// Once the budget is full, a read-only file's misses are read from the file past the cache
/// (the right bytes, rows of odd sizes across extents), and the extents of rows missed a second
/// time are admitted in the background: after `wait_for_admissions` the next gather of those
/// rows finds them resident. Rows missed once are not admitted.
fn misses_past_a_full_cache_are_read_through_then_admitted(memory: Device) {
    const ROW: usize = 3000;
    let dir = scratch();
    let path = dir.path().join("table");
    let data = random_bytes((16 * MIB) as usize, 21);
    fs::write(&path, &data).unwrap();
    // One frame: 512 slots of 4 KiB, filled by the first gather.
    let c = cache(memory.clone(), 2 * MIB, 4096);
    let map = c.open(&path).unwrap();
    let rows = data.len() as u64 / ROW as u64;
    let fill = some_indices(rows, 2000, 22);
    assert!(gather(&map, &memory, &fill, ROW) == expected(&data, &fill, ROW), "{memory:?}");
    assert_eq!(c.stats().used_bytes, c.stats().budget, "{memory:?}: the cache is full");
    c.wait_for_admissions();
    // 100 rows of at most two extents each: they fit the budget once admitted.
    // One gather at a time here: a gather's lookups running beside an admission may leave it
    // no slot to reuse, and then it admits less.
    let hot = some_indices(rows, 100, 23);
    let mut read_through = map.stats().rows_read_through;
    for pass in ["first", "second"] {
        let mut dst = DeviceBuffer::zeroed(&memory, hot.len() * ROW).unwrap();
        map.gather_rows(hot.as_slice(), ROW as u64, dst.view_mut()).unwrap();
        assert!(dst.to_vec().unwrap() == expected(&data, &hot, ROW), "{memory:?} {pass}");
        let after = map.stats();
        // Missed once, the rows are read through again: their first miss admitted nothing
        // (bar a few whose doorkeeper bit another extent set).
        let least = if pass == "first" { 1 } else { hot.len() as u64 * 3 / 4 };
        assert!(after.rows_read_through >= read_through + least, "{memory:?} {pass}: {after:?}");
        read_through = after.rows_read_through;
        c.wait_for_admissions();
    }
    let settled = map.stats();
    let narrow: Vec<i32> = hot.iter().map(|&i| i as i32).collect();
    let mut dst = DeviceBuffer::zeroed(&memory, hot.len() * ROW).unwrap();
    map.gather_rows(narrow.as_slice(), ROW as u64, dst.view_mut()).unwrap();
    assert!(dst.to_vec().unwrap() == expected(&data, &hot, ROW), "{memory:?}");
    let last = map.stats();
    assert_eq!(last.rows_read_through, settled.rows_read_through, "{memory:?}: {last:?}");
    assert_eq!(last.hits - settled.hits, hot.len() as u64, "{memory:?}: {last:?}");
}

/// A writable map's newest bytes may be dirty in the cache: its misses always go through the
/// cache, full or not.
fn a_writable_map_fills_the_cache_even_when_full(memory: Device) {
    const ROW: usize = 1000;
    let dir = scratch();
    let path = dir.path().join("table");
    let mut model = random_bytes((8 * MIB) as usize, 24);
    fs::write(&path, &model).unwrap();
    let c = cache(memory.clone(), 2 * MIB, 4096);
    let map = c.open_with(&path, MapOptions::new().writable(true)).unwrap();
    let rows = model.len() as u64 / ROW as u64;
    for round in 0..4u64 {
        let written = some_indices(rows, 50, 25 + round);
        for &r in &written {
            let bytes = vec![round as u8 + 1; ROW];
            map.write(r as u64 * ROW as u64, &bytes).unwrap();
            model[r as usize * ROW..][..ROW].copy_from_slice(&bytes);
        }
        let asked = some_indices(rows, 1500, 30 + round);
        assert!(gather(&map, &memory, &asked, ROW) == expected(&model, &asked, ROW));
        assert!(gather(&map, &memory, &written, ROW) == expected(&model, &written, ROW));
    }
    assert_eq!(c.stats().used_bytes, c.stats().budget, "{memory:?}: the cache was full");
    assert_eq!(map.stats().rows_read_through, 0, "{memory:?}");
}

/// Gathers of a read-only file under a full cache from several threads, while admissions run
/// in the background and another thread evicts everything now and then (so the cache goes from
/// full to empty and back): every row is the file's.
fn gathers_past_a_full_cache_race_admissions_and_evictions(memory: Device) {
    race_gathers_with_admissions_and_evictions(memory, &MapOptions::new());
}

/// The same race with the cache in front of the zero-copy tier: the kernel reads the misses in
/// place while admissions and evictions change what is resident.
fn gathers_with_misses_in_place_race_admissions_and_evictions(memory: Device) {
    race_gathers_with_admissions_and_evictions(
        memory,
        MapOptions::new().zero_copy(ZeroCopy::Misses),
    );
}

fn race_gathers_with_admissions_and_evictions(memory: Device, options: &MapOptions) {
    const ROW: usize = 700;
    let dir = scratch();
    let path = dir.path().join("table");
    let data = random_bytes((12 * MIB) as usize, 26);
    fs::write(&path, &data).unwrap();
    let c = cache(memory.clone(), 2 * MIB, 4096);
    let map = c.open_with(&path, options).unwrap();
    let rows = data.len() as u64 / ROW as u64;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(std::time::Duration::from_millis(5));
                map.evict().unwrap();
                c.wait_for_admissions();
            }
        });
        let readers: Vec<_> = (0..4u64)
            .map(|t| {
                let (map, memory, data) = (&map, &memory, &data);
                s.spawn(move || {
                    for round in 0..30 {
                        let asked = some_indices(rows, 800, 100 * t + round);
                        let got = gather(map, memory, &asked, ROW);
                        assert!(got == expected(data, &asked, ROW), "thread {t} round {round}");
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
        stop.store(true, Ordering::Release);
    });
    c.wait_for_admissions();
    assert!(map.stats().rows_read_through > 0, "{memory:?}: {:?}", map.stats());
}

/// The cache in front of the zero-copy tier: a gather's misses are read in place (counted as
/// read past the cache) whether or not the budget has room, their extents are admitted in the
/// background, and the next gather finds them resident. Bad indices and a file cut under the
/// map are named as on the other tiers.
fn misses_read_in_place_are_then_admitted(memory: Device) {
    const ROW: usize = 3000;
    let dir = scratch();
    let path = dir.path().join("table");
    let data = random_bytes((16 * MIB) as usize, 41);
    fs::write(&path, &data).unwrap();
    let c = cache(memory.clone(), 2 * MIB, 4096);
    let map = c.open_with(&path, MapOptions::new().zero_copy(ZeroCopy::Misses)).unwrap();
    let rows = data.len() as u64 / ROW as u64;
    // An empty cache: every row a miss, read in place, none through the cache's fill.
    let first = some_indices(rows, 2000, 42);
    let mut dst = DeviceBuffer::zeroed(&memory, first.len() * ROW).unwrap();
    map.gather_rows(first.as_slice(), ROW as u64, dst.view_mut()).unwrap();
    assert!(dst.to_vec().unwrap() == expected(&data, &first, ROW), "{memory:?}");
    let stats = map.stats();
    assert_eq!(stats.rows_read_through, first.len() as u64, "{memory:?}: {stats:?}");
    c.wait_for_admissions();
    assert!(c.stats().used_bytes > 0, "{memory:?}: an admission ran: {:?}", c.stats());
    // A hot set that fits the budget: read in place once, admitted, then all hits.
    let hot = some_indices(rows, 100, 43);
    for _ in 0..2 {
        assert!(gather(&map, &memory, &hot, ROW) == expected(&data, &hot, ROW), "{memory:?}");
        c.wait_for_admissions();
    }
    let settled = map.stats();
    assert!(gather(&map, &memory, &hot, ROW) == expected(&data, &hot, ROW), "{memory:?}");
    let last = map.stats();
    // `gather` gathers twice (int32 and int64 indices).
    assert_eq!(last.hits - settled.hits, 2 * hot.len() as u64, "{memory:?}: {last:?}");
    assert_eq!(last.rows_read_through, settled.rows_read_through, "{memory:?}: {last:?}");
    // Views and reads still read in place.
    let mut bytes = vec![0u8; 5000];
    map.read(12_345, &mut bytes).unwrap();
    assert!(bytes[..] == data[12_345..17_345], "{memory:?}");
    let mut dst = DeviceBuffer::zeroed(&memory, 2 * ROW).unwrap();
    assert!(matches!(
        map.gather_rows(&[0i64, rows as i64], ROW as u64, dst.view_mut()),
        Err(Error::RowIndex { position: 1, .. })
    ));
    fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(ROW as u64 * 10).unwrap();
    let mut dst = DeviceBuffer::zeroed(&memory, ROW).unwrap();
    assert!(matches!(
        map.gather_rows(&[4000i64], ROW as u64, dst.view_mut()),
        Err(Error::UnexpectedEof { .. })
    ));
}

/// Thousands of rows in one gather (several tasks' worth where a host gather is shared among the
/// pool's threads: decision 0036): a third of them first, then all of them (resident rows and
/// misses mixed in every task), then all again (hot); and past a budget that holds a fraction of
/// them (read through); rows within and across extents.
fn gathers_of_thousands_of_rows_match_the_file_cold_hot_and_read_through(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("table");
    let data = random_bytes((6 * MIB + 5) as usize, 31);
    fs::write(&path, &data).unwrap();
    for (budget, row) in [(16 * MIB, 512usize), (16 * MIB, 1500), (2 * MIB, 512), (2 * MIB, 6000)] {
        let map = cache(memory.clone(), budget, 4096).open(&path).unwrap();
        let rows = data.len() as u64 / row as u64;
        let all = some_indices(rows, 12_000, row as u64 + budget);
        let third: Vec<i64> = all.iter().copied().step_by(3).collect();
        for (pass, indices) in [("a third", &third), ("mixed", &all), ("hot", &all)] {
            let got = gather(&map, &memory, indices, row);
            assert!(
                got == expected(&data, indices, row),
                "{memory:?}: {pass} rows of {row} bytes under a budget of {budget}"
            );
        }
    }
}
