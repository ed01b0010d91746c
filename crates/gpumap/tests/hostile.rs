//! What a hostile caller found in the library (issue 20, round two), each case a test that
//! failed before its fix: a map of one cache handed to another, end-of-file errors that named
//! the wrong length, budget and view errors that said the wrong thing, procfs files taken for
//! empty ones, and files cut under a map that still read as they were. On host memory (every
//! machine) and on the GPU (where there is one; skipped loudly elsewhere).

#[macro_use]
mod common;

use std::fs;
use std::path::Path;

use common::random_bytes;
use gpumap::io::FileHandle;
use gpumap::mapped::{
    CacheOptions, DeviceCache, DeviceMappedFile, MapOptions, ZeroCopy, ZeroCopyOptions,
};
use gpumap::memory::{Device, DeviceBuffer};
use gpumap::pagecache::{self, ByteRange};
use gpumap::Error;

const MIB: u64 = 1 << 20;
const FRAME: u64 = 2 * MIB;

on_host_and_gpu!(
    views_refuse_a_map_of_another_cache,
    end_of_file_errors_give_the_real_length_and_the_range,
    a_request_larger_than_the_budget_says_so,
    view_errors_name_the_view,
    a_file_cut_under_a_map_reads_as_cut_on_every_tier,
    flushes_on_many_threads_end_while_a_writable_view_lives,
);

fn scratch() -> tempfile::TempDir {
    let base =
        std::env::var("GPUMAP_BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

fn cache(memory: &Device, budget: u64) -> DeviceCache {
    CacheOptions::new()
        .memory(memory.clone())
        .frame_size(FRAME)
        .budget(budget)
        .extent_size(4096)
        .build()
        .unwrap()
}

fn cut(path: &Path, len: u64) {
    fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

/// File ids are numbered per cache, so a range of another cache's map, accepted by `views`,
/// was filed under a file of this cache: that file's views read the other file's bytes, and its
/// write-back wrote them into its own file.
fn views_refuse_a_map_of_another_cache(memory: Device) {
    let dir = scratch();
    let (a_path, b_path) = (dir.path().join("a"), dir.path().join("b"));
    let a_bytes = random_bytes(64 << 10, 1);
    fs::write(&a_path, &a_bytes).unwrap();
    fs::write(&b_path, random_bytes(64 << 10, 2)).unwrap();
    let one = cache(&memory, 4 * FRAME);
    let two = cache(&memory, 4 * FRAME);
    let a = one.open_with(&a_path, MapOptions::new().writable(true)).unwrap();
    let b = two.open(&b_path).unwrap();
    match one.views(&[b.range(0, 4096)]) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("another cache"), "{m}"),
        other => panic!("{memory:?}: a map of another cache was accepted: {other:?}"),
    }
    let mut dst = DeviceBuffer::zeroed(&one.device(), 4096).unwrap();
    assert!(matches!(
        one.gather(&[b.range(0, 4096)], dst.view_mut()),
        Err(Error::InvalidArgument(_))
    ));
    // Nothing of b reached a's books: a reads as a, and writes back only what was written.
    let mut head = vec![0u8; 4096];
    a.read(0, &mut head).unwrap();
    assert!(head[..] == a_bytes[..4096], "{memory:?}: a reads another file's bytes");
    a.write(100, b"W").unwrap();
    a.flush().unwrap();
    let mut expected = a_bytes.clone();
    expected[100] = b'W';
    assert!(fs::read(&a_path).unwrap() == expected, "{memory:?}: a's file holds foreign bytes");
}

/// The error named the offset asked for as the file's end; it gives the file's real length,
/// and the range asked for.
fn end_of_file_errors_give_the_real_length_and_the_range(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("cut");
    fs::write(&path, random_bytes((16 * MIB) as usize, 3)).unwrap();
    let m = cache(&memory, 4 * FRAME).open(&path).unwrap();
    cut(&path, MIB);
    let mut buf = vec![0u8; 4096];
    let e = m.read(8 * MIB, &mut buf).unwrap_err();
    assert!(matches!(e, Error::UnexpectedEof { file_len, .. } if file_len == MIB), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("is 1048576 bytes long"), "{memory:?}: {text}");
    assert!(text.contains("8388608..8392704"), "{memory:?}: {text}");
    // A view that must fault past the end says the same.
    let e = m.view(12 * MIB, 3 * 4096).unwrap_err();
    assert!(e.to_string().contains("is 1048576 bytes long"), "{memory:?}: {e}");

    let small = dir.path().join("small");
    fs::write(&small, random_bytes((4 * MIB) as usize, 4)).unwrap();
    let fh = FileHandle::open(&small, "r").unwrap();
    let e = fh.read_exact(&mut buf, 1 << 40).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("is 4194304 bytes long"), "{text}");
    assert!(text.contains(&format!("{}..{}", 1u64 << 40, (1u64 << 40) + 4096)), "{text}");
    let mut dst = DeviceBuffer::zeroed(&memory, 4096).unwrap();
    let e = fh.read_device_exact(&mut dst, 1 << 40).unwrap_err();
    assert!(e.to_string().contains("is 4194304 bytes long"), "{memory:?}: {e}");
}

/// `OutOfBudget` for a request larger than the whole budget said that memory was "in use and
/// none can be evicted", even with nothing pinned.
fn a_request_larger_than_the_budget_says_so(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("big");
    fs::write(&path, random_bytes((16 * MIB) as usize, 5)).unwrap();
    let m = cache(&memory, 2 * FRAME).open(&path).unwrap();
    let e = m.view(0, 3 * FRAME).unwrap_err();
    assert!(matches!(e, Error::OutOfBudget { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("the request alone exceeds the 4194304-byte budget"), "{text}");
    assert!(!text.contains("none can be evicted"), "{text}");
}

/// Errors about a view named the file's range and length where they meant the view's.
fn view_errors_name_the_view(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("view");
    fs::write(&path, random_bytes((4 * MIB) as usize, 6)).unwrap();
    let m: DeviceMappedFile = cache(&memory, 4 * FRAME).open(&path).unwrap();
    let view = m.view(MIB, 1000).unwrap();
    let mut too_much = vec![0u8; 100];
    let e = view.copy_to_host(950, &mut too_much).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfView { offset: 950, len: 100, view_offset: 1_048_576, view_len: 1000 }
        ),
        "{memory:?}: {e:?}"
    );
    assert_eq!(
        e.to_string(),
        "range 950..1050 is outside the view of 1000 bytes (file bytes 1048576..1049576)"
    );
}

/// A file cut under its map reads as cut, on every tier: a gather or read of a range past the
/// new end fails with `UnexpectedEof` naming the new length, whatever the map still holds of it
/// (the cache's resident extents, or the zero-copy tier's pages, which stay pinned and returned
/// the old bytes); what lies within the new end still reads.
fn a_file_cut_under_a_map_reads_as_cut_on_every_tier(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("tiers");
    let len = 8 * MIB;
    let data = random_bytes(len as usize, 7);
    fs::write(&path, &data).unwrap();
    let zero_copy_allowed = |m: gpumap::Result<DeviceMappedFile>| match m {
        Err(Error::Unavailable { .. }) => None,
        m => Some(m.unwrap()),
    };
    let cached = cache(&memory, 8 * FRAME).open(&path).unwrap();
    let zero_copy = zero_copy_allowed(
        cache(&memory, 2 * FRAME).open_with(&path, MapOptions::new().zero_copy(ZeroCopy::On)),
    );
    let file = ZeroCopyOptions::new().device(memory.clone()).open(&path);
    let rows = [(0u64, 4096u64), (6 * MIB, 4096)];
    let mut dst = DeviceBuffer::zeroed(&memory, 8192).unwrap();
    // Resident before the cut.
    cached.gather(&rows, dst.view_mut()).unwrap();
    cut(&path, 2 * MIB);
    let expect_cut = |what: &str, r: gpumap::Result<()>| match r {
        Err(Error::UnexpectedEof { file_len, offset, .. }) => {
            assert_eq!((file_len, offset), (2 * MIB, 6 * MIB), "{memory:?} {what}")
        }
        other => panic!("{memory:?} {what}: a range past the new end read {other:?}"),
    };
    expect_cut("cached gather", cached.gather(&rows, dst.view_mut()));
    let mut buf = vec![0u8; 4096];
    expect_cut("cached read", cached.read(6 * MIB, &mut buf));
    if let Some(z) = &zero_copy {
        expect_cut("zero-copy gather", z.gather(&rows, dst.view_mut()));
        expect_cut("zero-copy read", z.read(6 * MIB, &mut buf));
    }
    if let Ok(f) = &file {
        expect_cut("ZeroCopyFile::gather", f.gather(&rows, dst.view_mut()).map(|_| ()));
    }
    // Within the new end, every tier still reads the file's bytes.
    let inside = [(4096u64, 4096u64)];
    for (what, r) in [
        ("cached", Some(cached.gather(&inside, dst.view_mut()))),
        ("zero-copy", zero_copy.as_ref().map(|z| z.gather(&inside, dst.view_mut()))),
    ] {
        if let Some(r) = r {
            r.unwrap();
            assert!(dst.to_vec().unwrap()[..4096] == data[4096..8192], "{memory:?} {what}");
        }
    }
}

/// A /proc file's size says nothing of its content: its residency was reported as an empty
/// file's, where `read` and `map` refuse it.
/// A writable view keeps its extents dirty after a flush. Flushes on several threads at once
/// each waited for the extents another was writing, then claimed and wrote them again, for
/// ever: every flush spun, and `close` waited for them (2026-11-29, a hostile probe).
fn flushes_on_many_threads_end_while_a_writable_view_lives(memory: Device) {
    let dir = scratch();
    let path = dir.path().join("flushes");
    fs::write(&path, vec![b'.'; MIB as usize]).unwrap();
    let mut options = gpumap::mapped::MapOptions::new();
    options.writable(true);
    let m = cache(&memory, 4 * FRAME).open_with(&path, &options).unwrap();
    let mut view = m.view_mut(0, MIB).unwrap();
    let bytes = random_bytes(MIB as usize, 7);
    view.copy_from_host(0, &bytes).unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            let (m, done) = (&m, done.clone());
            scope.spawn(move || {
                for k in 0..50u64 {
                    let flushed = if t % 2 == 0 {
                        m.flush()
                    } else {
                        let offset = (t * 7919 + k * 104_729) % MIB;
                        m.flush_range(offset, (MIB - offset).min(200_000))
                    };
                    flushed.unwrap();
                }
                done.send(()).unwrap();
            });
        }
        for t in 0..8 {
            let waited = finished.recv_timeout(std::time::Duration::from_secs(60));
            // A hang would leave the scope waiting: end the process with the reason instead.
            if waited.is_err() {
                eprintln!("{memory:?}: {} of 8 flushing threads never ended", 8 - t);
                std::process::exit(1);
            }
        }
    });
    drop(view);
    m.close().unwrap();
    assert!(fs::read(&path).unwrap() == bytes, "{memory:?}");
}

#[test]
fn page_cache_residency_refuses_procfs_files() {
    match pagecache::residency(Path::new("/proc/cpuinfo"), ByteRange::ALL) {
        Err(Error::NotRegularFile { what, .. }) => assert!(what.contains("procfs"), "{what}"),
        other => panic!("/proc/cpuinfo: {other:?}"),
    }
}
