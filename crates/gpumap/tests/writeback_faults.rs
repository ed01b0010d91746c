//! Write-back under failing writes: injected EIO and short writes (the `fault-injection`
//! feature's hook, which every `pwrite` gpumap issues asks first), and ENOSPC on a small tmpfs
//! mounted for the test (where this process may mount; skipped loudly elsewhere). Every failure
//! must return an error, keep the bytes dirty, stick to the file until a `sync` writes them all,
//! and leave the file equal to the model byte for byte afterwards.
//!
//! The hook is process-wide: these tests run one at a time (a lock), in their own test binary.

#[macro_use]
mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::random_bytes;
use gpumap::fault::{arm_write_fault, disarm, WriteFault};
use gpumap::mapped::{CacheOptions, MapOptions};
use gpumap::memory::Device;
use gpumap::sync::Mutex;
use gpumap::Error;

const MIB: u64 = 1 << 20;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

on_host_and_gpu!(
    eio_during_a_flush_keeps_bytes_dirty_until_a_sync_writes_them,
    a_failed_write_back_before_eviction_is_returned_and_loses_nothing,
    dropping_a_map_whose_flush_fails_keeps_the_file_intact_where_written,
    a_zero_byte_write_sticks_with_its_kind_and_the_current_dirty_count,
    enospc_on_a_full_file_system,
);

fn scratch() -> tempfile::TempDir {
    let base =
        std::env::var("GPUMAP_BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

fn open(path: &Path, memory: &Device, budget: u64) -> gpumap::mapped::DeviceMappedFile {
    CacheOptions::new()
        .memory(memory.clone())
        .frame_size(2 * MIB)
        .budget(budget)
        .extent_size(4096)
        .build()
        .unwrap()
        .open_with(path, MapOptions::new().writable(true))
        .unwrap()
}

fn fault(path: &Path, errno: i32, after_bytes: u64) -> WriteFault {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    WriteFault { path_contains: name, errno, after_bytes, times: 0 }
}

fn eio_during_a_flush_keeps_bytes_dirty_until_a_sync_writes_them(memory: Device) {
    let _one = ONE_AT_A_TIME.lock();
    for after in [0u64, 5000] {
        let dir = scratch();
        let path = dir.path().join(format!("eio-{after}"));
        let mut model = random_bytes((3 * MIB) as usize, after + 1);
        fs::write(&path, &model).unwrap();
        let m = open(&path, &memory, 4 * MIB);
        let patch = random_bytes(300_000, 2);
        m.write(12_345, &patch).unwrap();
        model[12_345..12_345 + 300_000].copy_from_slice(&patch);
        arm_write_fault(fault(&path, libc::EIO, after));
        let e = m.flush().unwrap_err();
        assert!(matches!(e, Error::WriteBack { .. }), "{memory:?}: {e}");
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{memory:?}: {e}");
        let dirty = m.stats().dirty_bytes;
        assert!(dirty > 0, "{memory:?}: failed extents must stay dirty");
        assert_eq!(m.stats().write_errors, 1);
        disarm();
        // The write succeeds now, but the error sticks until a sync.
        let e = m.flush().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{memory:?}: sticky: {e}");
        m.sync().unwrap();
        m.flush().unwrap();
        assert_eq!(m.stats().dirty_bytes, 0);
        m.close().unwrap();
        assert!(fs::read(&path).unwrap() == model, "{memory:?} after {after}: the file differs");
    }
}

fn a_failed_write_back_before_eviction_is_returned_and_loses_nothing(memory: Device) {
    let _one = ONE_AT_A_TIME.lock();
    let dir = scratch();
    let path = dir.path().join("evict-eio");
    let mut model = random_bytes((6 * MIB) as usize, 3);
    fs::write(&path, &model).unwrap();
    // One frame of budget: reading another frame must evict the dirty one first.
    let m = open(&path, &memory, 2 * MIB);
    let patch = random_bytes(50_000, 4);
    m.write(MIB, &patch).unwrap();
    model[MIB as usize..][..50_000].copy_from_slice(&patch);
    arm_write_fault(fault(&path, libc::EIO, 0));
    let mut far = vec![0u8; 100_000];
    let e = m.read(4 * MIB, &mut far).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{memory:?}: {e}");
    assert_eq!(m.stats().dirty_bytes, 53_248, "{memory:?}: the dirty extents stay");
    disarm();
    m.sync().unwrap();
    m.read(4 * MIB, &mut far).unwrap();
    assert!(far[..] == model[4 * MIB as usize..][..100_000]);
    drop(m);
    assert!(fs::read(&path).unwrap() == model, "{memory:?}: the file differs");
}

fn dropping_a_map_whose_flush_fails_keeps_the_file_intact_where_written(memory: Device) {
    let _one = ONE_AT_A_TIME.lock();
    let dir = scratch();
    let path = dir.path().join("drop-eio");
    let model = random_bytes((2 * MIB) as usize, 5);
    fs::write(&path, &model).unwrap();
    let m = open(&path, &memory, 2 * MIB);
    m.write(100, &random_bytes(1000, 6)).unwrap();
    arm_write_fault(fault(&path, libc::EIO, 0));
    // close returns the error; the file keeps its old bytes (nothing half-written).
    let e = m.close().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    disarm();
    assert!(fs::read(&path).unwrap() == model, "{memory:?}");
}

/// A write that returns 0 bytes carries no errno: the sticky error was rebuilt as "invalid
/// argument" with the dirty count of the first failure. Every later flush must report the same
/// kind (`WriteZero`) with the bytes dirty now.
fn a_zero_byte_write_sticks_with_its_kind_and_the_current_dirty_count(memory: Device) {
    let _one = ONE_AT_A_TIME.lock();
    let dir = scratch();
    let path = dir.path().join("zero-write");
    let mut model = random_bytes((4 * MIB) as usize, 8);
    fs::write(&path, &model).unwrap();
    let m = open(&path, &memory, 4 * MIB);
    let patch = random_bytes(40_000, 9);
    m.write(0, &patch).unwrap();
    model[..40_000].copy_from_slice(&patch);
    arm_write_fault(fault(&path, 0, 0));
    let first = m.flush().unwrap_err();
    assert_eq!(first.kind(), std::io::ErrorKind::WriteZero, "{memory:?}: {first}");
    let Error::WriteBack { dirty_bytes, .. } = first else { panic!("{first:?}") };
    assert_eq!(dirty_bytes, 40_960, "{memory:?}");
    disarm();
    // More dirty bytes since: the sticky error counts them, and keeps its kind.
    let more = random_bytes(4096, 10);
    m.write(2 * MIB, &more).unwrap();
    model[2 * MIB as usize..][..4096].copy_from_slice(&more);
    m.flush_range(0, MIB).unwrap_err();
    let again = m.flush().unwrap_err();
    assert_eq!(again.kind(), std::io::ErrorKind::WriteZero, "{memory:?}: {again}");
    let text = gpumap::error::Report(&again).to_string();
    assert!(!text.contains("invalid argument"), "{memory:?}: {text}");
    // Both flushes wrote everything: nothing is dirty now, and the count says so.
    assert!(matches!(again, Error::WriteBack { dirty_bytes: 0, .. }), "{memory:?}: {again:?}");
    m.sync().unwrap();
    m.close().unwrap();
    assert!(fs::read(&path).unwrap() == model, "{memory:?}: the file differs");
}

/// A tmpfs of `size` bytes mounted for the test, unmounted when dropped.
struct SmallTmpfs {
    dir: PathBuf,
    _keep: tempfile::TempDir,
}

impl SmallTmpfs {
    fn mount(size: u64) -> Option<SmallTmpfs> {
        let keep = tempfile::tempdir().ok()?;
        let dir = keep.path().join("fs");
        fs::create_dir(&dir).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}")])
            .arg("tmpfs")
            .arg(&dir)
            .output()
            .is_ok_and(|o| o.status.success());
        ok.then_some(SmallTmpfs { dir, _keep: keep })
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.dir).status();
    }
}

fn enospc_on_a_full_file_system(memory: Device) {
    let _one = ONE_AT_A_TIME.lock();
    let Some(tmpfs) = SmallTmpfs::mount(4 * MIB) else {
        eprintln!("SKIP enospc_on_a_full_file_system: cannot mount a tmpfs here (not root?)");
        return;
    };
    let path = tmpfs.dir.join("sparse");
    let filler = tmpfs.dir.join("filler");
    let _ = fs::remove_file(&path);
    fs::write(&filler, vec![1u8; (2 * MIB) as usize]).unwrap();
    // A hole of 3 MiB: writing it back needs blocks the file system does not have.
    fs::File::create(&path).unwrap().set_len(3 * MIB).unwrap();
    let m = open(&path, &memory, 4 * MIB);
    let data = random_bytes((3 * MIB) as usize, 7);
    m.write(0, &data).unwrap();
    let e = m.flush().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{memory:?}: {e}");
    assert!(m.stats().dirty_bytes > 0, "{memory:?}");
    assert_eq!(fs::metadata(&path).unwrap().len(), 3 * MIB, "the file's length is unchanged");
    fs::remove_file(&filler).unwrap();
    m.sync().unwrap();
    m.close().unwrap();
    assert!(fs::read(&path).unwrap() == data, "{memory:?}: the file differs after the retry");
    fs::remove_file(&path).unwrap();
}
