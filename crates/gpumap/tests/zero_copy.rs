//! The zero-copy tier: rows of a file gathered by the GPU straight from the page cache (host
//! memory stands in with `pread`), checked byte for byte; bad requests are typed errors; the
//! pinned-memory limit holds across files and is given back when they go.

#[macro_use]
mod common;

use std::fs;

use common::random_bytes;
use gpumap::mapped::{CacheOptions, MapOptions, MapRange, ZeroCopy, ZeroCopyFile, ZeroCopyOptions};
use gpumap::memory::{Device, DeviceBuffer};
use gpumap::Error;

on_host_and_gpu!(
    rows_of_any_size_match_the_file,
    bad_requests_are_typed_errors,
    maps_opened_zero_copy_gather_around_the_cache,
);

/// The pinned limit counts every zero-copy file of the process: the tests here run one at a
/// time, so that the limit test sees only its own files.
static SERIAL: gpumap::sync::Mutex<()> = gpumap::sync::Mutex::new(());

fn scratch() -> tempfile::TempDir {
    let base =
        std::env::var("GPUMAP_BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

fn open(path: &std::path::Path, memory: &Device) -> ZeroCopyFile {
    ZeroCopyOptions::new().device(memory.clone()).open(path).unwrap()
}

/// xorshift64 choices.
fn choices(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed;
    move |n| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    }
}

fn rows_of_any_size_match_the_file(memory: Device) {
    let _serial = SERIAL.lock();
    let dir = scratch();
    let path = dir.path().join("rows");
    let data = random_bytes((9 << 20) + 333, 21);
    fs::write(&path, &data).unwrap();
    let file = open(&path, &memory);
    assert_eq!(file.len(), data.len() as u64);
    assert_eq!(file.device_ptr().is_some(), matches!(memory, Device::Cuda(_)), "{memory:?}");
    let mut below = choices(7);
    // Small rows (one launch), rows past the copy kernel's limit (the copy engines), unaligned
    // and empty rows, the file's last byte.
    let mut rows: Vec<(u64, u64)> = Vec::new();
    for i in 0..2000u64 {
        let len = match i % 50 {
            0 => 0,
            1 => 256 << 10,
            2 => (1 << 20) + 17,
            _ => 1 + below(9000),
        };
        rows.push((below(data.len() as u64 - len), len));
    }
    rows.push((data.len() as u64 - 1, 1));
    let total: u64 = rows.iter().map(|r| r.1).sum();
    let mut expected = Vec::with_capacity(total as usize);
    for &(o, n) in &rows {
        expected.extend_from_slice(&data[o as usize..][..n as usize]);
    }
    let mut dst = DeviceBuffer::zeroed(&memory, total as usize + 100).unwrap();
    assert_eq!(file.gather(&rows, dst.view_mut()).unwrap(), total);
    let got = dst.to_vec().unwrap();
    assert!(got[..total as usize] == expected[..], "{memory:?}: gathered rows differ");
    assert!(got[total as usize..].iter().all(|&b| b == 0), "{memory:?}: wrote past the rows");
    // Into host memory, whatever the tier.
    let mut host = vec![0u8; total as usize];
    assert_eq!(file.gather(&rows, &mut host[..]).unwrap(), total);
    assert!(host == expected, "{memory:?}: rows into host memory differ");
    // Many threads at once.
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (file, data, memory) = (&file, &data, &memory);
            s.spawn(move || {
                let mut below = choices(100 + t);
                for _ in 0..20 {
                    let rows: Vec<(u64, u64)> =
                        (0..64).map(|_| (below(data.len() as u64 - 4096), 4096)).collect();
                    let mut dst = DeviceBuffer::zeroed(memory, 64 * 4096).unwrap();
                    file.gather(&rows, dst.view_mut()).unwrap();
                    let got = dst.to_vec().unwrap();
                    for (i, &(o, n)) in rows.iter().enumerate() {
                        assert!(got[i * 4096..][..n as usize] == data[o as usize..][..n as usize]);
                    }
                }
            });
        }
    });
}

fn bad_requests_are_typed_errors(memory: Device) {
    let _serial = SERIAL.lock();
    let dir = scratch();
    let path = dir.path().join("small");
    fs::write(&path, random_bytes(10_000, 22)).unwrap();
    let file = open(&path, &memory);
    let mut dst = DeviceBuffer::zeroed(&memory, 8192).unwrap();
    assert!(matches!(
        file.gather(&[(9_000, 1_001)], dst.view_mut()),
        Err(Error::OutOfRange { offset: 9_000, len: 1_001, file_len: 10_000 })
    ));
    assert!(matches!(
        file.gather(&[(u64::MAX, 2)], dst.view_mut()),
        Err(Error::Overflow { offset: u64::MAX, len: 2 })
    ));
    assert!(matches!(
        file.gather(&[(0, 5000), (5000, 5000)], dst.view_mut()),
        Err(Error::BufferTooSmall { needed: 10_000, available: 8192 })
    ));
    assert_eq!(file.gather(&[], dst.view_mut()).unwrap(), 0);
    let missing = ZeroCopyOptions::new().device(memory.clone()).open(dir.path().join("nope"));
    assert!(matches!(missing, Err(Error::Io { .. })), "{missing:?}");
    let empty = dir.path().join("empty");
    fs::write(&empty, b"").unwrap();
    let empty = open(&empty, &memory);
    assert!(empty.is_empty() && empty.device_ptr().is_none());
    assert_eq!(empty.gather(&[(0, 0)], dst.view_mut()).unwrap(), 0);
}

/// A map opened with `zero_copy` serves gathers from the page cache: the bytes match, the
/// cache's memory and counters are not touched; mixed with an ordinary map, the gather goes
/// through the cache and is as right; a writable map refuses the tier.
fn maps_opened_zero_copy_gather_around_the_cache(memory: Device) {
    let _serial = SERIAL.lock();
    let dir = scratch();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let (da, db) = (random_bytes(3 << 20, 31), random_bytes(2 << 20, 32));
    fs::write(&a, &da).unwrap();
    fs::write(&b, &db).unwrap();
    let cache = CacheOptions::new()
        .memory(memory.clone())
        .budget(4 << 20)
        .frame_size(2 << 20)
        .extent_size(4096)
        .build()
        .unwrap();
    let za = cache.open_with(&a, MapOptions::new().zero_copy(ZeroCopy::On)).unwrap();
    let mb = cache.open(&b).unwrap();
    let indices: Vec<i64> = (0..500i64).map(|i| (i * 7919 * 61) % ((3 << 20) / 4096)).collect();
    let mut dst = DeviceBuffer::zeroed(&memory, 500 * 4096).unwrap();
    za.gather_rows(&indices, 4096, dst.view_mut()).unwrap();
    let got = dst.to_vec().unwrap();
    for (i, &r) in indices.iter().enumerate() {
        let o = r as usize * 4096;
        assert!(got[i * 4096..][..4096] == da[o..][..4096], "{memory:?}: row {i}");
    }
    // Views, batches of views and reads: the registered file itself, or `pread`.
    let view = za.view(12_345, 70_000).unwrap();
    let mut got = vec![0u8; 70_000];
    view.copy_to_host(0, &mut got).unwrap();
    assert!(got[..] == da[12_345..82_345], "{memory:?}: a view");
    match view.device() {
        Some(device) => {
            assert_eq!(Some(device.ptr()), za.base().map(|b| b + 12_345));
            let mut through_device = vec![0u8; 1000];
            device.copy_to_host(69_000, &mut through_device).unwrap();
            assert!(through_device[..] == da[81_345..82_345], "{memory:?}: through the device");
        }
        None => assert!(matches!(memory, Device::Host)),
    }
    assert!(view.copy_to_host(69_999, &mut [0u8; 2]).is_err());
    let views = za.views(&[(0, 1), ((3 << 20) - 4096, 4096)]).unwrap();
    let mut last = vec![0u8; 4096];
    views[1].copy_to_host(0, &mut last).unwrap();
    assert!(last[..] == da[(3 << 20) - 4096..]);
    let mut read = vec![0u8; 100_000];
    za.read(2 << 20, &mut read).unwrap();
    assert!(read[..] == da[2 << 20..(2 << 20) + 100_000]);
    assert!(za.view(3 << 20, 1).is_err(), "past the end");
    let stats = za.stats();
    assert_eq!(
        (stats.hits, stats.misses, stats.resident_bytes),
        (0, 0, 0),
        "{memory:?}: {stats:?}"
    );
    // Mixed: through the cache.
    let ranges: [MapRange<'_>; 3] =
        [za.range(5, 10_000), mb.range(100, 7_000), za.range(1 << 20, 1)];
    let mut dst = DeviceBuffer::zeroed(&memory, 17_001).unwrap();
    cache.gather(&ranges, dst.view_mut()).unwrap();
    let got = dst.to_vec().unwrap();
    assert!(got[..10_000] == da[5..10_005]);
    assert!(got[10_000..17_000] == db[100..7_100]);
    assert_eq!(got[17_000], da[1 << 20]);
    assert!(za.stats().misses > 0, "{memory:?}: the mixed gather went through the cache");
    let writable = cache.open_with(&b, MapOptions::new().writable(true).zero_copy(ZeroCopy::On));
    assert!(
        matches!(writable, Err(Error::InvalidArgument(ref m)) if m.contains("read-only")),
        "{writable:?}"
    );
}

/// Registration pins the file in host memory: the limit holds across files and comes back
/// when a file is dropped.
#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn the_pinned_limit_holds_across_files() {
    let _serial = SERIAL.lock();
    let Some(device) = common::gpu() else { return };
    let dir = scratch();
    let path = dir.path().join("pinned");
    fs::write(&path, random_bytes(4 << 20, 23)).unwrap();
    let mut options = ZeroCopyOptions::new();
    options.device(Device::Cuda(device)).max_pinned(6 << 20);
    let first = options.open(&path).unwrap();
    match options.open(&path) {
        Err(Error::OutOfBudget { requested, budget, in_use }) => {
            assert_eq!((requested, budget, in_use), (4 << 20, 6 << 20, 4 << 20));
        }
        other => panic!("a second 4 MiB file under a 6 MiB limit: {other:?}"),
    }
    drop(first);
    let again = options.open(&path).unwrap();
    assert_eq!(again.len(), 4 << 20);
}
