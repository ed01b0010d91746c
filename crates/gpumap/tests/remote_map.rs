//! A DeviceCache over remote objects (`DeviceCache::open_remote`), against the HTTP range server
//! and the S3-compatible responder on 127.0.0.1 (tests/remote/server.rs), on host memory (every
//! machine) and on the GPU (where there is one): views, gathers and row gathers checked byte
//! for byte against the object; only missing extents fetched, adjacent ones in one ranged GET;
//! a hot set served with no request at all; eviction under a budget smaller than the object;
//! missing rows, and rows read past a full cache, fetched at once, within the object's bound
//! on requests, and adjacent ones in one GET;
//! server failures typed and not sticky; writable and zero-copy maps refused.
#![cfg(feature = "remote")]

#[macro_use]
mod common;
#[allow(dead_code)]
#[path = "remote/server.rs"]
mod server;

use std::time::Duration;

use common::random_bytes;
use gpumap::error::{Error, RemoteErrorKind};
use gpumap::mapped::{CacheOptions, DeviceCache, DeviceMappedFile, MapOptions, ZeroCopy};
use gpumap::memory::{Device, DeviceBuffer};
use gpumap::remote::{RemoteFile, RemoteOptions};
use server::{aws_environment, Fault, Server};

const MIB: u64 = 1 << 20;
const EXTENT: u64 = 4096;

on_host_and_gpu!(
    views_and_gathers_match_the_object,
    only_missing_extents_are_fetched_adjacent_ones_together,
    row_gathers_match_the_object_and_a_hot_set_costs_no_request,
    a_budget_smaller_than_the_object_evicts_and_reads_again,
    server_failures_are_typed_and_do_not_stick,
    rows_read_past_a_full_cache_are_fetched_at_once_adjacent_ones_together,
    missing_rows_are_fetched_into_the_cache_at_once_adjacent_ones_together,
);

/// An HTTP server holding `len` random bytes at `/table.bin`, and the object opened.
fn served(len: usize, seed: u64) -> (Server, Vec<u8>, RemoteFile) {
    let server = Server::http();
    let bytes = random_bytes(len, seed);
    server.put("/table.bin", bytes.clone());
    let mut options = RemoteOptions::default();
    options.backoff(Duration::from_millis(2), Duration::from_millis(10));
    options.max_attempts(3).unwrap();
    let file =
        RemoteFile::open_with(&format!("{}/table.bin", server.endpoint()), &options).unwrap();
    (server, bytes, file)
}

fn cache(memory: &Device, budget: u64) -> DeviceCache {
    CacheOptions::new()
        .memory(memory.clone())
        .frame_size(2 * MIB)
        .budget(budget)
        .extent_size(EXTENT)
        .build()
        .unwrap()
}

fn map(cache: &DeviceCache, file: RemoteFile) -> DeviceMappedFile {
    cache.open_remote(file, &MapOptions::new()).unwrap()
}

/// Rows `indices` of `row` bytes gathered from `map` into new memory on `memory`, brought back.
fn gather_rows(map: &DeviceMappedFile, memory: &Device, indices: &[i64], row: usize) -> Vec<u8> {
    let mut dst = DeviceBuffer::zeroed(memory, indices.len() * row).unwrap();
    map.gather_rows(indices, row as u64, dst.view_mut()).unwrap();
    dst.to_vec().unwrap()
}

/// Rows `indices` of `bytes` taken as a table of `row`-byte rows.
fn rows_of(bytes: &[u8], indices: &[i64], row: usize) -> Vec<u8> {
    indices.iter().flat_map(|&i| &bytes[i as usize * row..][..row]).copied().collect()
}

fn read(map: &DeviceMappedFile, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    map.read(offset, &mut out).unwrap();
    out
}

fn views_and_gathers_match_the_object(memory: Device) {
    let (_server, bytes, file) = served((5 * MIB + 777) as usize, 1);
    let c = cache(&memory, 16 * MIB);
    let m = map(&c, file);
    assert_eq!(m.len(), bytes.len() as u64);
    assert!(m.path().to_string_lossy().ends_with("/table.bin"), "{}", m.path().display());
    // Odd offsets and sizes, across extents and frames, up to the last byte.
    let cases: &[(u64, usize)] = &[
        (0, 1),
        (4095, 2),
        (12_345, 100_000),
        (2 * MIB - 3, 9),
        (5 * MIB, 777),
        (bytes.len() as u64 - 1, 1),
    ];
    for &(offset, len) in cases {
        assert!(
            read(&m, offset, len) == bytes[offset as usize..][..len],
            "{memory:?} {offset}+{len}"
        );
        let view = m.view(offset, len as u64).unwrap();
        let mut out = vec![0u8; len];
        view.copy_to_host(0, &mut out).unwrap();
        assert!(out == bytes[offset as usize..][..len], "{memory:?} view {offset}+{len}");
    }
    let mut dst = DeviceBuffer::zeroed(&memory, 3000).unwrap();
    c.gather(&[m.range(100, 1000), m.range(4 * MIB, 2000)], dst.view_mut()).unwrap();
    let got = dst.to_vec().unwrap();
    assert!(got[..1000] == bytes[100..1100] && got[1000..] == bytes[(4 * MIB) as usize..][..2000]);
    // Past the end: typed, before any request.
    let e = m.view(bytes.len() as u64 - 10, 11).unwrap_err();
    assert!(matches!(e, Error::OutOfRange { .. }), "{e:?}");
}

fn only_missing_extents_are_fetched_adjacent_ones_together(memory: Device) {
    let (server, bytes, file) = served((4 * MIB) as usize, 2);
    let c = cache(&memory, 16 * MIB);
    let m = map(&c, file);
    let gets = server.gets();
    // Sixteen adjacent extents, missing: fetched together, in far fewer requests than extents.
    assert!(
        read(&m, 8 * EXTENT, (16 * EXTENT) as usize)
            == bytes[(8 * EXTENT) as usize..][..(16 * EXTENT) as usize]
    );
    let first = server.gets() - gets;
    assert!((1..=4).contains(&first), "{memory:?}: {first} GETs for 16 adjacent extents");
    // The same bytes again, and any part of them: no request.
    let before = server.gets();
    assert!(read(&m, 8 * EXTENT + 5, 1000) == bytes[(8 * EXTENT + 5) as usize..][..1000]);
    let _ = read(&m, 8 * EXTENT, (16 * EXTENT) as usize);
    assert_eq!(server.gets(), before, "{memory:?}: resident extents were fetched again");
    // A range half resident: only its missing extents are fetched.
    let heads = server.heads();
    assert!(
        read(&m, 20 * EXTENT, (8 * EXTENT) as usize)
            == bytes[(20 * EXTENT) as usize..][..(8 * EXTENT) as usize]
    );
    let stats = m.stats();
    assert_eq!(stats.bytes_faulted, 20 * EXTENT, "{memory:?}: {stats:?}");
    assert_eq!(server.heads(), heads, "the object's size is known from the open");
}

fn row_gathers_match_the_object_and_a_hot_set_costs_no_request(memory: Device) {
    let (server, bytes, file) = served((2 * MIB + 300) as usize, 3);
    let c = cache(&memory, 8 * MIB);
    let m = map(&c, file);
    let row = 512usize;
    let rows = bytes.len() / row;
    let indices: Vec<i64> = (0..3000).map(|i| ((i * 7919) % rows) as i64).collect();
    let gather = |indices: &[i64]| gather_rows(&m, &memory, indices, row);
    let expected = rows_of(&bytes, &indices, row);
    assert!(gather(&indices) == expected, "{memory:?}");
    let before = server.gets();
    assert!(gather(&indices) == expected, "{memory:?}");
    assert_eq!(server.gets(), before, "{memory:?}: a resident hot set made requests");
    // A row index past the table: named, nothing read.
    let mut dst = DeviceBuffer::zeroed(&memory, row).unwrap();
    let e = m.gather_rows(&[rows as i64][..], row as u64, dst.view_mut()).unwrap_err();
    assert!(e.to_string().contains(&rows.to_string()), "{e}");
}

fn a_budget_smaller_than_the_object_evicts_and_reads_again(memory: Device) {
    let (server, bytes, file) = served((12 * MIB + 5) as usize, 4);
    let c = cache(&memory, 4 * MIB);
    let m = map(&c, file);
    for pass in 0..2 {
        for offset in (0..bytes.len() as u64).step_by(MIB as usize + 4093) {
            let len = 70_000.min(bytes.len() - offset as usize);
            assert!(
                read(&m, offset, len) == bytes[offset as usize..][..len],
                "{memory:?} pass {pass} at {offset}"
            );
        }
    }
    let stats = c.stats();
    assert!(stats.used_bytes <= 4 * MIB, "{memory:?}: {stats:?}");
    assert!(m.stats().evictions > 0, "{memory:?}: {:?}", m.stats());
    assert!(server.gets() > 0);
}

fn server_failures_are_typed_and_do_not_stick(memory: Device) {
    let (server, bytes, file) = served((MIB) as usize, 5);
    let c = cache(&memory, 8 * MIB);
    let m = map(&c, file);
    // Three 503s: the attempts (3) run out on the first request.
    server.inject([Fault::Status(503), Fault::Status(503), Fault::Status(503)]);
    let mut out = vec![0u8; 5000];
    let e = m.read(10_000, &mut out).unwrap_err();
    assert!(
        matches!(e, Error::Remote { kind: RemoteErrorKind::Status, status: Some(503), .. }),
        "{memory:?}: {e:?}"
    );
    // A body cut short: an error, never bytes reported read.
    server.inject([Fault::Truncate, Fault::Truncate, Fault::Truncate]);
    assert!(m.read(300_000, &mut out).is_err());
    // The server recovers: the same ranges read whole and right.
    assert!(read(&m, 10_000, 5000) == bytes[10_000..15_000], "{memory:?}");
    assert!(read(&m, 300_000, 5000) == bytes[300_000..305_000], "{memory:?}");
}

fn rows_read_past_a_full_cache_are_fetched_at_once_adjacent_ones_together(memory: Device) {
    let server = Server::http();
    let bytes = random_bytes((8 * MIB) as usize, 8);
    server.put("/table.bin", bytes.clone());
    let mut options = RemoteOptions::default();
    options.backoff(Duration::from_millis(2), Duration::from_millis(10));
    options.max_attempts(3).unwrap();
    options.max_in_flight(Some(6)).unwrap();
    let file =
        RemoteFile::open_with(&format!("{}/table.bin", server.endpoint()), &options).unwrap();
    // One frame of budget, filled: the rows after it are read past the cache.
    let c = cache(&memory, 2 * MIB);
    let m = map(&c, file);
    let _ = read(&m, 0, (2 * MIB) as usize);
    let row = 512usize;
    let gather = |indices: &[i64]| gather_rows(&m, &memory, indices, row);
    let expected = |indices: &[i64]| rows_of(&bytes, indices, row);
    // A failing server: a typed error, then the same rows whole once it recovers (first, while
    // no rows read through are being offered to the cache in the background).
    server.inject([Fault::Status(503), Fault::Status(503), Fault::Status(503)]);
    let mut dst = DeviceBuffer::zeroed(&memory, row).unwrap();
    let e = m.gather_rows(&[9000i64][..], row as u64, dst.view_mut()).unwrap_err();
    assert!(matches!(e, Error::Remote { status: Some(503), .. }), "{memory:?}: {e:?}");
    assert!(gather(&[9000, 9001]) == expected(&[9000, 9001]), "{memory:?}");
    // Rows far apart, each GET slowed: they are in flight together, never past the bound.
    server.delay_gets(Duration::from_millis(30));
    server.restart_max_active_gets();
    let far: Vec<i64> = (0..48).map(|i| 4096 + i * 251).collect();
    assert!(gather(&far) == expected(&far), "{memory:?}");
    let most = server.max_active_gets();
    // (One at a time, with the offers to the cache in the background, made 2.)
    assert!((4..=6).contains(&most), "{memory:?}: {most} GETs at once, the bound is 6");
    server.delay_gets(Duration::ZERO);
    // Sixteen adjacent rows, given in any order: one request.
    let adjacent: Vec<i64> = (0..16).map(|i| 12_000 + (i * 5) % 16).collect();
    let before = server.gets();
    assert!(gather(&adjacent) == expected(&adjacent), "{memory:?}");
    let gets = server.gets() - before;
    assert_eq!(gets, 1, "{memory:?}: {gets} GETs for 16 adjacent rows read through");
}

fn missing_rows_are_fetched_into_the_cache_at_once_adjacent_ones_together(memory: Device) {
    let server = Server::http();
    let bytes = random_bytes((8 * MIB) as usize, 9);
    server.put("/table.bin", bytes.clone());
    let mut options = RemoteOptions::default();
    options.max_in_flight(Some(6)).unwrap();
    let file =
        RemoteFile::open_with(&format!("{}/table.bin", server.endpoint()), &options).unwrap();
    // Room for the whole object: every miss is read into the cache.
    let c = cache(&memory, 16 * MIB);
    let m = map(&c, file);
    let row = 512usize;
    let gather = |indices: &[i64]| gather_rows(&m, &memory, indices, row);
    let expected = |indices: &[i64]| rows_of(&bytes, indices, row);
    // Rows of extents far apart, each GET slowed: in flight together, never past the bound.
    server.delay_gets(Duration::from_millis(30));
    server.restart_max_active_gets();
    let far: Vec<i64> = (0..48).map(|i| 64 + i * 251).collect();
    assert!(gather(&far) == expected(&far), "{memory:?}");
    let most = server.max_active_gets();
    assert!((4..=6).contains(&most), "{memory:?}: {most} GETs at once, the bound is 6");
    server.delay_gets(Duration::ZERO);
    // A row in each of sixteen adjacent extents, given in any order: one request.
    let per_extent = (EXTENT as usize / row) as i64;
    let adjacent: Vec<i64> = (0..16).map(|i| (1500 + (i * 5) % 16) * per_extent + 3).collect();
    let before = server.gets();
    assert!(gather(&adjacent) == expected(&adjacent), "{memory:?}");
    let gets = server.gets() - before;
    assert_eq!(gets, 1, "{memory:?}: {gets} GETs for 16 adjacent missing extents");
    // They are in the cache now, whole: their other rows cost no request.
    let neighbours: Vec<i64> = adjacent.iter().map(|i| i + 1).collect();
    let before = server.gets();
    assert!(gather(&neighbours) == expected(&neighbours), "{memory:?}");
    assert_eq!(server.gets(), before, "{memory:?}: resident extents were fetched again");
}

#[test]
fn writable_and_zero_copy_maps_of_objects_are_refused() {
    let (_server, _bytes, file) = served(10_000, 6);
    let c = cache(&Device::Host, 4 * MIB);
    let mut writable = MapOptions::new();
    writable.writable(true);
    let e = c.open_remote(file.clone(), &writable).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("read-only"), "{e}");
    let mut zero_copy = MapOptions::new();
    zero_copy.zero_copy(ZeroCopy::On);
    let e = c.open_remote(file, &zero_copy).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("zero-copy"), "{e}");
}

#[test]
fn s3_objects_map_as_http_ones_do() {
    aws_environment();
    let server = Server::s3("GPUMAPTESTKEYID");
    let bytes = random_bytes(300_001, 7);
    server.put("/test-bucket/t/table.bin", bytes.clone());
    let mut options = RemoteOptions::default();
    options.s3_endpoint(Some(server.endpoint()));
    let file = RemoteFile::open_with("s3://test-bucket/t/table.bin", &options).unwrap();
    let c = cache(&Device::Host, 4 * MIB);
    let m = map(&c, file);
    assert!(read(&m, 1, 300_000) == bytes[1..]);
    assert_eq!(m.path().to_string_lossy(), "s3://test-bucket/t/table.bin");
}
