//! Lookups by kernels of one's own (`DeviceCache::lookup_scope`): the table a scope hands out
//! is `kernels/gpumap_table.h`'s layout, and following it as a kernel would (`gpumap_lookup`,
//! step for step, on the table's words copied down from the GPU) finds every resident extent's
//! bytes; while a scope lives, a fault that needs a slot it could see waits, then fails with
//! `OutOfBudget` instead of hanging, and succeeds once the scope ends.

mod common;

use std::fs;
use std::time::{Duration, Instant};

use common::random_bytes;
use gpumap::mapped::{CacheOptions, DeviceCache, MapOptions};
use gpumap::memory::cuda::{CudaDevice, CudaView, Stream};
use gpumap::memory::{Device, DeviceBuffer, StreamRef};
use gpumap::Error;

const MIB: u64 = 1 << 20;
const EXTENT: u64 = 4096;
const HASH_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// Bytes at device address `ptr`, copied to the host.
fn device_bytes(ptr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: the test reads memory the cache owns and keeps alive (the scope holds the
    // table's arrays in place), never past the sizes the table gives.
    let view = unsafe { CudaView::from_raw(ptr, len) }.unwrap();
    view.copy_to_host(0, &mut out).unwrap();
    out
}

fn word(bytes: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn half(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap())
}

/// `gpumap_table` of `gpumap_table.h`, read from the device.
struct Table {
    owners: Vec<u8>,
    buckets: Vec<u8>,
    arena: u64,
    bucket_mask: u64,
    bucket_bits: u32,
    max_probes: u32,
    extent_shift: u32,
}

impl Table {
    fn read(ptr: u64) -> Table {
        let t = device_bytes(ptr, 64);
        let (slots, bucket_mask) = (word(&t, 32) as usize, word(&t, 40));
        Table {
            owners: device_bytes(word(&t, 0), slots * 8),
            buckets: device_bytes(word(&t, 8), (bucket_mask as usize + 1) * 8),
            arena: word(&t, 16),
            bucket_mask,
            bucket_bits: half(&t, 48),
            max_probes: half(&t, 52),
            extent_shift: half(&t, 56),
        }
    }

    /// `gpumap_lookup`, step for step.
    fn lookup(&self, key: u64) -> Option<u64> {
        let slots = self.owners.len() as u64 / 8;
        let mut b = key.wrapping_mul(HASH_MULTIPLIER) >> (64 - self.bucket_bits);
        for _ in 0..self.max_probes {
            let v = word(&self.buckets, 8 * b as usize);
            if v == 0 {
                return None;
            }
            if v != u64::MAX {
                let slot = v - 1;
                if slot < slots && word(&self.owners, 8 * slot as usize) == key {
                    return Some(slot);
                }
            }
            b = (b + 1) & self.bucket_mask;
        }
        None
    }
}

fn gpu_cache(device: &CudaDevice, budget: u64) -> DeviceCache {
    let mut options = CacheOptions::new();
    options
        .memory(Device::Cuda(device.clone()))
        .budget(budget)
        .frame_size(2 * MIB)
        .extent_size(EXTENT)
        .pin_wait(Duration::from_millis(300));
    options.build().unwrap()
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn a_host_cache_has_no_scope() {
    let Some(device) = common::gpu() else { return };
    let mut options = CacheOptions::new();
    options.memory(Device::Host).budget(2 * MIB).frame_size(2 * MIB);
    let stream = Stream::new(&device).unwrap();
    let e = options.build().unwrap().lookup_scope(StreamRef::of(&stream)).unwrap_err();
    assert!(matches!(e, Error::Unavailable { what: "lookup scope", .. }), "{e:?}");
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn a_scope_table_finds_resident_extents_and_holds_their_slots() {
    let Some(device) = common::gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (path, other_path) = (dir.path().join("table"), dir.path().join("other"));
    let data = random_bytes((8 * MIB) as usize, 51);
    fs::write(&path, &data).unwrap();
    fs::write(&other_path, &data).unwrap();
    // One frame: 512 slots of 4 KiB.
    let cache = gpu_cache(&device, 2 * MIB);
    // Writable: its gathers always fill the cache (a read-only map's read past a full one).
    let map = cache.open_with(&path, MapOptions::new().writable(true)).unwrap();
    let rows: Vec<i64> = (0..300).map(|k| (k * 7919) % (8 * MIB as i64 / 512)).collect();
    let mut dst = DeviceBuffer::zeroed(&Device::Cuda(device.clone()), rows.len() * 512).unwrap();
    map.gather_rows(rows.as_slice(), 512, dst.view_mut()).unwrap();
    let stream = Stream::new(&device).unwrap();
    let scope = cache.lookup_scope(StreamRef::of(&stream)).unwrap();
    let file = scope.file_number(&map).unwrap();
    let table = Table::read(scope.table_ptr());
    assert_eq!(table.extent_shift, EXTENT.trailing_zeros());
    let mut found = 0;
    for &r in &rows {
        let extent = r as u64 * 512 / EXTENT;
        let Some(slot) = table.lookup((file << 40) | extent) else { continue };
        found += 1;
        let bytes = device_bytes(table.arena + (slot << table.extent_shift), EXTENT as usize);
        let at = (extent * EXTENT) as usize;
        assert!(bytes == data[at..at + EXTENT as usize], "extent {extent} in slot {slot}");
    }
    assert!(found > 0, "no resident extent found through the table");
    // A map of another cache is refused by name.
    let other = gpu_cache(&device, 2 * MIB).open(&other_path).unwrap();
    assert!(matches!(scope.file_number(&other), Err(Error::InvalidArgument(_))));
    // While the scope lives, the full cache cannot reuse a slot the scope could see: a gather
    // that needs more room than is free waits for it up to the pin wait, then fails, never
    // hangs and never reads a slot refilled under the scope; once the scope ends, it succeeds.
    let far: Vec<i64> = (0..1500).map(|k| 8 * MIB as i64 / 512 - 1 - k * 8).collect();
    let memory = Device::Cuda(device.clone());
    let mut far_dst = DeviceBuffer::zeroed(&memory, far.len() * 512).unwrap();
    let started = Instant::now();
    match map.gather_rows(far.as_slice(), 512, far_dst.view_mut()) {
        Err(Error::OutOfBudget { .. }) => {}
        Ok(()) => check_rows(&data, &far, &far_dst),
        Err(e) => panic!("a gather inside a lookup scope: {e:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    scope.end().unwrap();
    map.gather_rows(far.as_slice(), 512, far_dst.view_mut()).unwrap();
    check_rows(&data, &far, &far_dst);
}

fn check_rows(data: &[u8], rows: &[i64], got: &DeviceBuffer) {
    let got = got.to_vec().unwrap();
    for (k, &r) in rows.iter().enumerate() {
        let at = r as usize * 512;
        assert!(got[k * 512..][..512] == data[at..at + 512], "row {r}");
    }
}
