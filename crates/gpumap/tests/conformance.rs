//! One conformance suite for every backend: the same cases run against host memory (CI, every
//! machine; `name::host`) and against device memory through each compat mode (`name::gpu`,
//! ignored without `--include-ignored`, which the GPU machine passes with
//! `GPUMAP_REQUIRE_GPU=1`).

#[macro_use]
mod common;

use std::fs;
use std::sync::Arc;

use gpumap::config::CompatMode;
use gpumap::io::{
    pread_files, BatchPiece, DeviceRead, FileHandle, FilePiece, HandleOptions, IoPath, IoPool,
};
use gpumap::memory::cuda::{CudaBuffer, CudaView, CudaViewMut};
use gpumap::memory::{Device, DeviceBuffer, DeviceViewMut};
use gpumap::Error;

use common::random_bytes;

/// Where the bytes of a transfer live, and (on a GPU) the compat mode in force.
struct Backend {
    device: Device,
    mode: CompatMode,
}

impl Backend {
    fn name(&self) -> String {
        match &self.device {
            Device::Host => "host".into(),
            Device::Cuda(_) => format!("device (compat {})", self.mode),
        }
    }

    fn options(&self, threads: usize, task: u64) -> HandleOptions {
        let mut o = FileHandle::options().unwrap();
        o.pool(Arc::new(IoPool::new(threads).unwrap())).task_size(task).direct_io(true, true);
        if !self.device.is_host() {
            o.compat_mode(self.mode);
            // Small bounce buffers and threshold so that every size crosses chunk borders.
            o.bounce_buffer_size(1 << 20).gds_threshold(0);
        }
        o
    }

    fn buffer(&self, len: usize, fill: u8) -> gpumap::Result<DeviceBuffer> {
        let mut buf = DeviceBuffer::alloc(&self.device, len)?;
        buf.fill(fill)?;
        Ok(buf)
    }

    /// Writes `data` at `offset` from this backend's memory; returns the count.
    fn write(&self, fh: &FileHandle, data: &[u8], offset: u64) -> gpumap::Result<usize> {
        let mut buf = self.buffer(data.len(), 0)?;
        buf.copy_from_host(0, data)?;
        fh.write_device(&buf, offset)
    }

    /// Reads `len` bytes at `offset` into this backend's memory; returns the bytes read.
    fn read(&self, fh: &FileHandle, len: usize, offset: u64) -> gpumap::Result<Vec<u8>> {
        let mut buf = self.buffer(len, 0xEE)?;
        let n = fh.read_device(&mut buf, offset)?;
        let mut host = vec![0u8; n];
        buf.copy_to_host(0, &mut host)?;
        Ok(host)
    }
}

/// Device memory in each compat mode (compat off only where cuFile can be used at all:
/// elsewhere its refusal is checked by `compat_modes_tell_the_truth`).
fn gpu_backends(device: gpumap::memory::cuda::CudaDevice) -> Vec<Backend> {
    let mut all = Vec::new();
    for mode in [CompatMode::On, CompatMode::Auto, CompatMode::Off] {
        if mode == CompatMode::Off {
            if let Err(reason) = gpumap::Capabilities::probe().cufile_usable() {
                eprintln!("SKIP device backend with compat off: cuFile unusable here ({reason})");
                continue;
            }
        }
        all.push(Backend { device: Device::Cuda(device.clone()), mode });
    }
    all
}

/// Declares, for each function `name(backend: &Backend)` listed, the tests `name::host` (host
/// memory, always run) and `name::gpu` (device memory in every compat mode; ignored by default,
/// with the reason, like `on_host_and_gpu!`).
macro_rules! on_each_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn host() {
                super::$name(&super::Backend { device: super::Device::Host, mode: super::CompatMode::On })
            }

            #[test]
            #[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
            fn gpu() {
                if let Some(device) = $crate::common::gpu() {
                    for backend in super::gpu_backends(device) {
                        super::$name(&backend);
                    }
                }
            }
        }
    )*};
}

on_each_backend!(
    round_trips_at_odd_sizes_offsets_and_thread_counts,
    cold_reads_under_every_direct_read_policy,
    transfers_beyond_4_gib,
    a_read_only_handle_refuses_writes_before_any_io,
    concurrent_small_futures_coalesce_correctly,
    small_futures_waited_in_any_order_dropped_or_cancelled,
    lone_small_reads_as_the_file_changes,
    bounce_buffers_of_any_size_move_the_right_bytes,
    many_files_read_in_one_pipeline,
);
on_host_and_gpu!(batched_reads_match_the_file);

/// A directory on a real disk (cuFile refuses tmpfs): `$GPUMAP_BENCH_DIR` where set (the GPU
/// machine's shimmed disk), else cargo's target tmpdir.
fn test_dir() -> tempfile::TempDir {
    let base =
        std::env::var("GPUMAP_BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

fn round_trips_at_odd_sizes_offsets_and_thread_counts(backend: &Backend) {
    let dir = test_dir();
    for (len, offset) in [
        (0usize, 0u64),
        (1, 0),
        (4095, 1),
        (4096, 4096),
        (4097, 4095),
        ((5 << 20) + 3, 12_345),
        (9 << 20, 0),
    ] {
        for threads in [1usize, 3, 8] {
            let path = dir.path().join(format!("rt-{len}-{offset}-{threads}"));
            let fh = backend.options(threads, 1 << 20).open(&path, "w+").unwrap();
            let data = random_bytes(len, len as u64 + offset);
            let what = format!("{} len {len} offset {offset} threads {threads}", backend.name());
            assert_eq!(backend.write(&fh, &data, offset).unwrap(), len, "{what}");
            // Independent check of the file through std.
            let on_disk = fs::read(&path).unwrap();
            if len > 0 {
                assert!(on_disk[offset as usize..] == data[..], "file content, {what}");
            }
            let back = backend.read(&fh, len, offset).unwrap();
            assert!(back == data, "read back, {what}");
            // Reads that run past the end come back short, not padded.
            let short = backend.read(&fh, len + 10_000, offset).unwrap();
            assert_eq!(short.len(), len, "short read at EOF, {what}");
            fs::remove_file(&path).unwrap();
        }
    }
}

/// Bounce buffer sizes that are not whole pages (KvikIO takes any size above zero) are
/// rounded up at open; transfers through them, `O_DIRECT` on, move exactly the bytes asked.
fn bounce_buffers_of_any_size_move_the_right_bytes(backend: &Backend) {
    let dir = test_dir();
    let len = (3 << 20) + 777;
    let data = random_bytes(len, 23);
    for bounce in [1u64, 1000, 4097, 65_537] {
        let path = dir.path().join(format!("bounce-{bounce}"));
        let mut options = backend.options(3, 1 << 20);
        options.bounce_buffer_size(bounce);
        let fh = options.open(&path, "w+").unwrap();
        let what = format!("{} bounce buffer {bounce}", backend.name());
        assert_eq!(backend.write(&fh, &data, 4099).unwrap(), len, "{what}");
        assert!(fs::read(&path).unwrap()[4099..] == data[..], "file content, {what}");
        assert!(backend.read(&fh, len, 4099).unwrap() == data, "read back, {what}");
        fs::remove_file(&path).unwrap();
    }
    let zero = backend.options(1, 1 << 20).bounce_buffer_size(0).open(dir.path().join("z"), "w");
    assert!(matches!(zero, Err(Error::InvalidArgument(_))), "{zero:?}");
    assert!(!dir.path().join("z").exists(), "a refused open creates nothing");
}

fn cold_reads_under_every_direct_read_policy(backend: &Backend) {
    use gpumap::config::DirectRead;
    use gpumap::pagecache::{evict, residency, ByteRange};
    let dir = test_dir();
    let path = dir.path().join("cold");
    let len = (24 << 20) + 5;
    let data = random_bytes(len, 4242);
    fs::write(&path, &data).unwrap();
    fs::File::open(&path).unwrap().sync_all().unwrap();
    for (policy, offset) in [DirectRead::Off, DirectRead::On, DirectRead::Uncached]
        .into_iter()
        .flat_map(|p| [(p, 0usize), (p, 7)])
    {
        let mut o = backend.options(3, 4 << 20);
        o.direct_read(policy);
        let fh = o.open(&path, "r").unwrap();
        let evicted = evict(&path, ByteRange::ALL).unwrap().after;
        let got = backend.read(&fh, len - offset, offset as u64).unwrap();
        let name = format!("{} {policy} at {offset}", backend.name());
        assert!(got[..] == data[offset..], "{name}: cold read differs");
        let cuda_path = fh.compat_decision().path == IoPath::CuFile;
        let after = residency(&path, ByteRange::ALL).unwrap();
        let (Some(before), Some(cached)) = (evicted.cached_pages, after.cached_pages) else {
            continue;
        };
        // Around the page cache: the cache stays as empty as the eviction left it. Device
        // reads line their bounce buffers up with the file at any offset; a host buffer at
        // file offset 7 is not page aligned where the file's pages start, so it is read
        // buffered.
        let aligned = offset == 0 || !backend.device.is_host();
        let around =
            policy != DirectRead::Off && fh.direct_io_status().is_ok() && !cuda_path && aligned;
        if around && before * 100 <= evicted.total_pages {
            let runs = gpumap::pagecache::residency_map(path.as_path(), ByteRange::ALL)
                .map(|m| format!("{:?}", m.resident_runs))
                .unwrap_or_default();
            assert!(
                cached * 16 <= after.total_pages,
                "{name}: {cached} of {} pages cached after an O_DIRECT read \
                 ({before} after eviction); cached runs: {runs}",
                after.total_pages
            );
        }
    }
}

fn transfers_beyond_4_gib(backend: &Backend) {
    let dir = test_dir();
    let path = dir.path().join("big");
    let fh = backend.options(8, 4 << 20).open(&path, "w+").unwrap();
    let far = (4u64 << 30) + 8191; // past 2^32, unaligned
    fh.set_len(far + (8 << 20)).unwrap();
    let data = random_bytes(3 << 20, 7);
    backend.write(&fh, &data, far).unwrap();
    assert!(backend.read(&fh, data.len(), far).unwrap() == data, "{}", backend.name());
    // One transfer larger than 4 GiB: holes read as zeros, the tail is the data.
    if std::env::var("GPUMAP_SKIP_HUGE").is_err() {
        let whole = backend.read(&fh, (far + data.len() as u64) as usize, 0).unwrap();
        assert_eq!(whole.len() as u64, far + data.len() as u64);
        assert!(whole[..1 << 20].iter().all(|&b| b == 0));
        assert!(whole[far as usize..] == data[..], "{}", backend.name());
    }
    drop(fh);
    fs::remove_file(&path).unwrap();
}

fn a_read_only_handle_refuses_writes_before_any_io(backend: &Backend) {
    let dir = test_dir();
    let path = dir.path().join("ro");
    fs::write(&path, b"unchanged").unwrap();
    let fh = backend.options(2, 1 << 20).open(&path, "r").unwrap();
    match backend.write(&fh, b"XXXX", 0) {
        Err(Error::AccessMode { op, .. }) => assert_eq!(op, "writing"),
        other => panic!("{}: expected AccessMode, got {other:?}", backend.name()),
    }
    assert_eq!(fs::read(&path).unwrap(), b"unchanged");
}

#[test]
fn compat_modes_tell_the_truth() {
    let dir = test_dir();
    let path = dir.path().join("compat");
    fs::write(&path, vec![1u8; 1 << 20]).unwrap();
    let caps = gpumap::Capabilities::probe();
    let mut o = FileHandle::options().unwrap();
    // On: POSIX, and says so.
    let on = o.compat_mode(CompatMode::On).open(&path, "r").unwrap();
    assert_eq!(on.compat_decision().path, IoPath::Posix);
    assert!(on.compat_decision().reason.contains("compat mode is on"));
    // Auto: whichever path, always with a reason.
    let auto = o.compat_mode(CompatMode::Auto).open(&path, "r").unwrap();
    let decision = auto.compat_decision();
    assert!(!decision.reason.is_empty());
    eprintln!("auto chose {:?}: {}", decision.path, decision.reason);
    // Without nvidia-fs (CI, and the GPU test machine), Auto decides without loading cuFile.
    if !gpumap::capabilities::nvidia_fs_loaded() {
        assert_eq!(decision.path, IoPath::Posix);
        assert!(decision.reason.contains("cuFile is not loaded"), "{}", decision.reason);
    }
    // Off: cuFile, or an error that carries the reason.
    match (caps.cufile_usable(), o.compat_mode(CompatMode::Off).open(&path, "r")) {
        (Ok(()), Ok(fh)) => assert_eq!(fh.compat_decision().path, IoPath::CuFile),
        (Ok(()), Err(e)) => eprintln!("cuFile usable but refused this file: {e}"),
        (Err(reason), Err(Error::Unavailable { what: "cuFile", reason: got })) => {
            assert_eq!(got, reason)
        }
        (Err(reason), other) => panic!("cuFile unusable ({reason}) but Off gave {other:?}"),
    }
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn bad_device_buffers_are_caught_before_io() {
    let Some(device) = common::gpu() else { return };
    let dir = test_dir();
    let path = dir.path().join("bad");
    fs::write(&path, vec![9u8; 1 << 20]).unwrap();
    let fh = FileHandle::open(&path, "r+").unwrap();
    // SAFETY (every raw view here): the memory outlives the view, and none is written through;
    // the point is what validation says.
    // A host pointer passed as device memory.
    let host = vec![0u8; 4096];
    let e = unsafe { CudaView::from_raw(host.as_ptr() as u64, host.len()) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // A region longer than its allocation.
    let buf = CudaBuffer::alloc(&device, 4096).unwrap();
    let e = unsafe { CudaViewMut::from_raw(buf.ptr(), 8192) }.unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { needed: 8192, available: 4096 }), "{e}");
    // A freed buffer.
    let ptr = buf.ptr();
    drop(buf);
    assert!(unsafe { CudaView::from_raw(ptr, 4096) }.is_err());
    // A device buffer used as the source of a write to a read-only handle: nothing written.
    let ro = FileHandle::open(&path, "r").unwrap();
    let src = CudaBuffer::zeroed(&device, 4096).unwrap();
    assert!(matches!(ro.write_device(src.view(), 0), Err(Error::AccessMode { .. })));
    assert!(fs::read(&path).unwrap().iter().all(|&b| b == 9));
    // Futures give the same answers, and the buffer back.
    let dst = CudaBuffer::alloc(&device, 1 << 20).unwrap();
    let (dst, n) = fh.pread_device(dst, 0).wait().unwrap();
    assert_eq!(n, 1 << 20);
    assert!(matches!(fh.pread_device(dst, u64::MAX).wait(), Err(Error::Overflow { .. })));
}

/// Host memory; on a GPU, device memory through the POSIX path and, where cuFile can be used,
/// through cuFile's batch API (compat off).
fn batched_reads_match_the_file(memory: Device) {
    let dir = test_dir();
    let path = dir.path().join("batch");
    let data = random_bytes((8 << 20) + 1234, 11);
    fs::write(&path, &data).unwrap();
    let mut cases = vec![(memory.clone(), CompatMode::On)];
    if !memory.is_host() {
        match gpumap::Capabilities::probe().cufile_usable() {
            Ok(()) => cases.push((memory, CompatMode::Off)),
            Err(reason) => eprintln!("SKIP cuFile batch reads: cuFile unusable here ({reason})"),
        }
    }
    for (device, mode) in cases {
        let mut o = FileHandle::options().unwrap();
        o.bounce_buffer_size(64 << 10); // many groups, and one piece larger than a buffer
        o.compat_mode(mode);
        let fh = o.open(&path, "r").unwrap();
        eprintln!("batch reads into {device:?}, compat {mode}: {}", fh.compat_decision().reason);
        check_batch(&device, &fh, &data);
        // Batches from several threads at once (cuFile's batch API stalled on them).
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| check_batch(&device, &fh, &data));
            }
        });
    }
}

fn check_batch(device: &Device, fh: &FileHandle, data: &[u8]) {
    let mut dst = DeviceBuffer::alloc(device, 16 << 20).unwrap();
    dst.fill(0xAB).unwrap();
    // (destination offset, length, file offset): adjacent runs, gaps, a piece larger than a
    // bounce buffer, a short read at the end of the file and one entirely past it.
    let mut pieces = Vec::new();
    let mut at = 0usize;
    for i in 0..300u64 {
        let len = [4096usize, 1, 65536, 777][i as usize % 4];
        let gap = if i % 7 == 0 { 4096 } else { 0 };
        at += gap;
        pieces.push((at, len, (i * 7919 * 4096) % (8 << 20)));
        at += len;
    }
    pieces.push((at, 200 << 10, 1 << 20)); // larger than a bounce buffer
    at += 200 << 10;
    pieces.push((at, 5000, data.len() as u64 - 1000)); // short: 1000 bytes
    at += 5000;
    pieces.push((at, 4096, data.len() as u64 + 10)); // past the end: 0 bytes
    let ranges: Vec<(usize, usize)> = pieces.iter().map(|&(d, len, _)| (d, len)).collect();
    let mut reads: Vec<DeviceRead> = dst
        .view_mut()
        .carve(&ranges)
        .unwrap()
        .into_iter()
        .zip(&pieces)
        .map(|(dst, &(_, _, offset))| DeviceRead { dst, offset })
        .collect();
    let counts = fh.read_device_batch(&mut reads).unwrap();
    drop(reads);
    let host = dst.to_vec().unwrap();
    for (&(d, len, offset), &n) in pieces.iter().zip(&counts) {
        let available = (data.len() as u64).saturating_sub(offset).min(len as u64) as usize;
        assert_eq!(n, available, "count of the piece at file offset {offset}");
        if n > 0 {
            let o = offset as usize;
            assert!(host[d..d + n] == data[o..o + n], "bytes of the piece at file offset {offset}");
        }
        assert!(host[d + n..d + len].iter().all(|&b| b == 0xAB), "bytes past a short read touched");
    }
    // Gaps between pieces are untouched.
    let first_gap = pieces[7].0 - 4096;
    assert!(host[first_gap..first_gap + 4096].iter().all(|&b| b == 0xAB));
    // The future form, on an owned buffer, and errors before any I/O.
    let batch: Vec<BatchPiece> = pieces
        .iter()
        .map(|&(dst_offset, len, offset)| BatchPiece { dst_offset, len, offset })
        .collect();
    let (dst, again) = fh.pread_device_batch(dst, batch).wait().unwrap();
    assert_eq!(again, counts);
    let overlapping = vec![
        BatchPiece { dst_offset: 0, len: 10, offset: 0 },
        BatchPiece { dst_offset: 5, len: 10, offset: 0 },
    ];
    let e = fh.pread_device_batch(dst, overlapping).wait().unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("overlaps")), "{e}");
    let mut small = DeviceBuffer::alloc(device, 10).unwrap();
    let mut bad = vec![DeviceRead { dst: small.view_mut(), offset: u64::MAX - 1 }];
    assert!(matches!(fh.read_device_batch(&mut bad), Err(Error::Overflow { .. })));
}

fn concurrent_small_futures_coalesce_correctly(backend: &Backend) {
    let dir = test_dir();
    let path = dir.path().join("futures");
    let data = random_bytes((4 << 20) + 321, 5);
    fs::write(&path, &data).unwrap();
    let mut o = FileHandle::options().unwrap();
    o.pool(Arc::new(IoPool::new(4).unwrap()));
    o.bounce_buffer_size(256 << 10); // reads up to 64 KiB coalesce; groups of at most 256 KiB
    let fh = o.open(&path, "r").unwrap();
    // One buffer leaked for the test's life: its disjoint 'static views travel with the
    // futures and come back with them.
    let whole: &'static mut DeviceBuffer =
        Box::leak(Box::new(backend.buffer(40 << 20, 0xCD).unwrap()));
    // 2000 futures in flight: adjacent and scattered destinations, sizes 1 B to 64 KiB (the
    // largest beside a 256 KiB one that takes the ordinary path), some past the end.
    let mut pieces = Vec::new();
    let mut at = 0usize;
    for i in 0..2000u64 {
        let len = [4096usize, 3, 65536, 512, 4096][i as usize % 5];
        at += if i % 11 == 0 { 100 } else { 0 };
        pieces.push((at, len, (i * 104_729) % (data.len() as u64 + 5000)));
        at += len;
    }
    pieces.push((at, 256 << 10, 4096));
    assert!(at + (256 << 10) <= 40 << 20);
    let ranges: Vec<(usize, usize)> = pieces.iter().map(|&(d, len, _)| (d, len)).collect();
    let views: Vec<DeviceViewMut<'static>> = whole.view_mut().carve(&ranges).unwrap();
    let futures: Vec<_> =
        views.into_iter().zip(&pieces).map(|(v, p)| fh.pread_device(v, p.2)).collect();
    let mut counts = Vec::new();
    let mut back = Vec::new();
    for f in futures {
        let (view, n) = f.wait().unwrap();
        counts.push(n);
        let mut bytes = vec![0u8; view.len()];
        view.copy_to_host(0, &mut bytes).unwrap();
        back.push(bytes);
    }
    for ((&(_, len, offset), &n), bytes) in pieces.iter().zip(&counts).zip(&back) {
        let what = format!("{} read at file offset {offset}", backend.name());
        let available = (data.len() as u64).saturating_sub(offset).min(len as u64) as usize;
        assert_eq!(n, available, "count of the {what}");
        if n > 0 {
            let o = offset as usize;
            assert!(bytes[..n] == data[o..o + n], "bytes of the {what}");
        }
        assert!(bytes[n..].iter().all(|&b| b == 0xCD), "bytes past a short {what} touched");
    }
}

/// A read's destination that reports its bytes when it is let go: by the waiter once it has
/// the result, or by the I/O layer when the future was dropped unwaited or the read cancelled.
struct Tracked {
    buf: DeviceBuffer,
    index: usize,
    report: std::sync::mpsc::Sender<(usize, Vec<u8>)>,
}

impl gpumap::memory::OwnedDeviceMemory for Tracked {
    fn device_view_mut(&mut self) -> DeviceViewMut<'_> {
        gpumap::memory::OwnedDeviceMemory::device_view_mut(&mut self.buf)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut bytes = vec![0u8; self.buf.len()];
        // An empty report fails the test where a copy fails; Drop must not panic.
        if self.buf.copy_to_host(0, &mut bytes).is_err() {
            bytes.clear();
        }
        let _ = self.report.send((self.index, bytes));
    }
}

/// What a waiting thread does with a future.
#[derive(Clone, Copy, Debug)]
enum Fate {
    Wait,
    WaitInSteps,
    Cancel,
    Drop,
}

fn small_futures_waited_in_any_order_dropped_or_cancelled(backend: &Backend) {
    let dir = test_dir();
    let path = dir.path().join("waited");
    let data = random_bytes((1 << 20) + 77, 9);
    fs::write(&path, &data).unwrap();
    let mut o = FileHandle::options().unwrap();
    o.pool(Arc::new(IoPool::new(3).unwrap()));
    o.bounce_buffer_size(256 << 10); // reads up to 64 KiB are queued to coalesce
    let fh = o.open(&path, "r").unwrap();
    let (report, reports) = std::sync::mpsc::channel();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // Reads of 1 B to 64 KiB at random offsets, some past the end; their futures, each with
    // its fate, dealt at random to four threads that each take them in a random order.
    let count = 600usize;
    let mut reads = Vec::new();
    let mut hands: Vec<Vec<(usize, Fate, _)>> = (0..4).map(|_| Vec::new()).collect();
    for index in 0..count {
        let len = [1usize, 100, 4096, 4097, 65536][index % 5];
        let offset = next() % (data.len() as u64 + 10_000);
        let buf = backend.buffer(len, 0xCD).unwrap();
        let fate = [Fate::Wait, Fate::Wait, Fate::WaitInSteps, Fate::Cancel, Fate::Drop]
            [(next() % 5) as usize];
        let future = fh.pread_device(Tracked { buf, index, report: report.clone() }, offset);
        reads.push((len, offset, fate));
        let hand = (next() % 4) as usize;
        let at = (next() as usize) % (hands[hand].len() + 1);
        hands[hand].insert(at, (index, fate, future));
    }
    drop(report);
    let counts: Vec<Vec<(usize, gpumap::Result<usize>)>> = std::thread::scope(|scope| {
        let threads: Vec<_> = hands
            .into_iter()
            .map(|hand| {
                scope.spawn(move || {
                    let mut counts = Vec::new();
                    for (index, fate, future) in hand {
                        let result = match fate {
                            Fate::Drop => continue,
                            Fate::Wait => future.wait(),
                            Fate::WaitInSteps => {
                                while !future.wait_timeout(std::time::Duration::from_micros(50)) {}
                                assert!(future.is_done());
                                future.wait()
                            }
                            Fate::Cancel => {
                                future.cancel();
                                future.wait()
                            }
                        };
                        // The destination is let go (and reports) here.
                        counts.push((index, result.map(|(_, n)| n)));
                    }
                    counts
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let mut results: Vec<Option<gpumap::Result<usize>>> = (0..count).map(|_| None).collect();
    for (index, result) in counts.into_iter().flatten() {
        results[index] = Some(result);
    }
    // Every destination is let go exactly once, those of dropped futures too.
    let mut seen = vec![false; count];
    for _ in 0..count {
        let (index, bytes) = reports
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a read's destination was never let go");
        assert!(!std::mem::replace(&mut seen[index], true), "read {index} let go twice");
        let (len, offset, fate) = reads[index];
        let what = format!("{} read {index} ({fate:?}) of {len} at {offset}", backend.name());
        assert_eq!(bytes.len(), len, "copy back of the {what}");
        let available = (data.len() as u64).saturating_sub(offset).min(len as u64) as usize;
        let untouched = bytes.iter().all(|&b| b == 0xCD);
        match &results[index] {
            Some(Ok(n)) => assert_eq!(*n, available, "count of the {what}"),
            // Only a cancelled read may fail, and only unread.
            Some(Err(gpumap::Error::Io { source, .. }))
                if matches!(fate, Fate::Cancel)
                    && source.kind() == std::io::ErrorKind::Interrupted =>
            {
                assert!(untouched, "the cancelled {what} wrote bytes");
                continue;
            }
            Some(Err(e)) => panic!("the {what} failed: {e}"),
            None => assert!(matches!(fate, Fate::Drop), "the {what} has no result"),
        }
        if available > 0 {
            let o = offset as usize;
            assert!(bytes[..available] == data[o..o + available], "bytes of the {what}");
        }
        assert!(bytes[available..].iter().all(|&b| b == 0xCD), "bytes past the short {what}");
    }
    assert!(reports.try_recv().is_err(), "a destination was let go twice");
}

/// Polls `future` to its end with a waker that does nothing, as an executor that polls again
/// at once would.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::yield_now();
    }
}

/// Small reads submitted one at a time, each ended (waited, polled, awaited, cancelled or
/// dropped) before the next, so each is alone on the handle — on a GPU they are read as they
/// are submitted where the page cache holds their bytes — while the file is rewritten in
/// place and dropped from the page cache between them; then four threads at once on the
/// same handle. Every destination is checked against a byte model of the file when it is let
/// go.
fn lone_small_reads_as_the_file_changes(backend: &Backend) {
    let dir = test_dir();
    let path = dir.path().join("lone");
    let mut data = random_bytes((1 << 20) + 77, 21);
    fs::write(&path, &data).unwrap();
    let mut o = FileHandle::options().unwrap();
    o.pool(Arc::new(IoPool::new(3).unwrap()));
    o.bounce_buffer_size(256 << 10);
    let fh = o.open(&path, "r").unwrap();
    let writer = fs::OpenOptions::new().write(true).open(&path).unwrap();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (report, reports) = std::sync::mpsc::channel();
    let fates = ["wait", "poll", "await", "cancel", "drop"];
    for index in 0..400usize {
        if index % 50 == 49 {
            // Rewritten in place: later reads see the new bytes.
            use std::os::unix::fs::FileExt;
            let at = (next() % data.len() as u64) as usize;
            let len = (70_000).min(data.len() - at);
            let fresh = random_bytes(len, index as u64);
            writer.write_all_at(&fresh, at as u64).unwrap();
            data[at..at + len].copy_from_slice(&fresh);
        }
        if index % 70 == 69 {
            // Nothing cached: the reads after this one wait for the disk.
            gpumap::pagecache::evict(&path, gpumap::pagecache::ByteRange::ALL).unwrap();
        }
        let len = [1usize, 100, 4096, 4097, 65536, 8192][index % 6];
        let offset = next() % (data.len() as u64 + 10_000);
        let fate = fates[(next() % 5) as usize];
        let buf = backend.buffer(len, 0xCD).unwrap();
        let future = fh.pread_device(Tracked { buf, index, report: report.clone() }, offset);
        let result = match fate {
            "wait" => Some(future.wait()),
            "poll" => {
                while !future.is_done() {
                    std::thread::yield_now();
                }
                Some(future.wait())
            }
            "await" => Some(block_on(future)),
            "cancel" => {
                future.cancel();
                Some(future.wait())
            }
            _ => {
                drop(future);
                None
            }
        };
        let cancelled = matches!(
            &result,
            Some(Err(Error::Io { source, .. })) if source.kind() == std::io::ErrorKind::Interrupted
        );
        let what = format!("{} lone read {index} ({fate}) of {len} at {offset}", backend.name());
        let count = match result {
            Some(Ok((tracked, n))) => {
                drop(tracked);
                Some(n)
            }
            Some(Err(_)) if cancelled => None,
            Some(Err(e)) => panic!("the {what} failed: {e}"),
            None => None,
        };
        // Let go by now (waited, or dropped: a dropped read's memory goes after its copy).
        let (at, bytes) = reports
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the {what}'s destination was never let go"));
        assert_eq!(at, index, "{what}");
        let available = (data.len() as u64).saturating_sub(offset).min(len as u64) as usize;
        if let Some(n) = count {
            assert_eq!(n, available, "count of the {what}");
        }
        let untouched = bytes.iter().all(|&b| b == 0xCD);
        if cancelled && untouched {
            continue;
        }
        if available > 0 {
            let o = offset as usize;
            assert!(bytes[..available] == data[o..o + available], "bytes of the {what}");
        }
        assert!(bytes[available..].iter().all(|&b| b == 0xCD), "bytes past the short {what}");
    }
    // More handles than the process keeps lone-read buffers, each with one read held unwaited:
    // the reads past the pool's bound queue instead, and every one arrives.
    let handles: Vec<FileHandle> = (0..100).map(|_| o.open(&path, "r").unwrap()).collect();
    let held: Vec<_> = handles
        .iter()
        .enumerate()
        .map(|(i, fh)| {
            let offset = (i as u64 * 10_007) % data.len() as u64;
            (offset, fh.pread_device(backend.buffer(4096, 0xCD).unwrap(), offset))
        })
        .collect();
    for (offset, future) in held {
        let (buf, n) = future.wait().unwrap();
        let available = (data.len() as u64 - offset).min(4096) as usize;
        assert_eq!(n, available, "held read at {offset}");
        let mut bytes = vec![0u8; 4096];
        buf.copy_to_host(0, &mut bytes).unwrap();
        let o = offset as usize;
        assert!(bytes[..n] == data[o..o + n], "held read at {offset}");
    }
    // Four threads at once on one handle: one read may run as it is submitted, the others queue.
    let data = &data;
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let fh = &fh;
            scope.spawn(move || {
                for i in 0..200u64 {
                    let len = [4096usize, 512, 65536][(i % 3) as usize];
                    let offset = (i * 7919 + t * 104_729) % data.len() as u64;
                    let buf = backend.buffer(len, 0xCD).unwrap();
                    let (buf, n) = fh.pread_device(buf, offset).wait().unwrap();
                    let available = (data.len() as u64 - offset).min(len as u64) as usize;
                    assert_eq!(n, available, "thread {t} read {i}");
                    let mut bytes = vec![0u8; len];
                    buf.copy_to_host(0, &mut bytes).unwrap();
                    let o = offset as usize;
                    assert!(bytes[..n] == data[o..o + n], "thread {t} read {i} at {offset}");
                }
            });
        }
    });
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn stream_ordered_transfers_in_every_compat_mode() {
    use gpumap::memory::cuda::Stream;
    let Some(device) = common::gpu() else { return };
    let dir = test_dir();
    for mode in [CompatMode::On, CompatMode::Auto, CompatMode::Off] {
        let path = dir.path().join(format!("async-{mode}"));
        let data = random_bytes((3 << 20) + 4096, 3);
        let mut o = FileHandle::options().unwrap();
        o.compat_mode(mode);
        o.gds_threshold(0);
        let fh = match o.open(&path, "w+") {
            Ok(fh) => fh,
            Err(e) if mode == CompatMode::Off => {
                eprintln!("compat off unavailable here: {e}");
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        let stream = Stream::new(&device).unwrap();
        let mut src = CudaBuffer::alloc(&device, data.len()).unwrap();
        src.copy_from_host(0, &data).unwrap();
        let n = fh.write_async(src.view(), 4096, &stream).unwrap().wait().unwrap();
        assert_eq!(n, data.len(), "{mode}");
        let mut dst = CudaBuffer::zeroed(&device, data.len()).unwrap();
        let n = fh.read_async(dst.view_mut(), 4096, &stream).unwrap().wait().unwrap();
        assert_eq!(n, data.len(), "{mode}");
        let mut back = vec![0u8; data.len()];
        dst.copy_to_host(0, &mut back).unwrap();
        assert!(back == data, "{mode}: {:?}", fh.compat_decision());
        let ro = FileHandle::open(&path, "r").unwrap();
        assert!(matches!(ro.write_async(src.view(), 0, &stream), Err(Error::AccessMode { .. })));
    }
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn cudarc_slices_are_device_memory_too() {
    let Some(_device) = common::gpu() else { return };
    let dir = test_dir();
    let path = dir.path().join("cudarc");
    let data = random_bytes((2 << 20) + 17, 9);
    fs::write(&path, &data).unwrap();
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let mut slice = stream.alloc_zeros::<u8>(data.len()).unwrap();
    let region = CudaViewMut::from_cudarc(&mut slice, &stream).unwrap();
    assert_eq!(region.len(), data.len());
    let fh = FileHandle::open(&path, "r").unwrap();
    assert_eq!(fh.read_device(region, 0).unwrap(), data.len());
    let back: Vec<u8> = stream.clone_dtoh(&slice).unwrap();
    assert!(back == data);
    // Views: a CudaView and a CudaViewMut of part of a slice, each read into at its own start.
    let mut other = stream.alloc_zeros::<u8>(data.len()).unwrap();
    {
        let mut view = other.slice_mut(100..4196);
        let region = CudaViewMut::from_cudarc(&mut view, &stream).unwrap();
        assert_eq!(region.len(), 4096);
        assert_eq!(fh.read_device(region, 5).unwrap(), 4096);
    }
    {
        let mut view = other.slice_mut(8192..(1 << 20));
        let region = CudaViewMut::from_cudarc(&mut view, &stream).unwrap();
        let len = region.len();
        assert_eq!(len, (1 << 20) - 8192);
        assert_eq!(fh.read_device(region, 12_345).unwrap(), len);
    }
    let back: Vec<u8> = stream.clone_dtoh(&other).unwrap();
    assert!(back[..100].iter().all(|&b| b == 0), "bytes before the first view touched");
    assert!(back[100..4196] == data[5..4101], "first view's read differs");
    assert!(back[4196..8192].iter().all(|&b| b == 0), "bytes between the views touched");
    assert!(back[8192..1 << 20] == data[12_345..12_345 + (1 << 20) - 8192], "second differs");
    // Registering the buffer with cuFile is a no-op on the POSIX path, and works on cuFile's.
    let region = CudaView::from_cudarc(&slice, &stream).unwrap();
    let registered = fh.buffer_register(region).unwrap();
    assert_eq!(registered.is_some(), fh.compat_decision().path == IoPath::CuFile);
}

/// The pieces a checkpoint load makes, from three files in one call: a whole file, a slice at
/// an odd offset, a range cut by the end of its file, an empty one, a strided column of a
/// table, and a strided piece whose last runs pass the end of its file; then strided pieces of
/// more than [`SMALL_READ`](gpumap::io::SMALL_READ) bytes (read in groups of runs), one of them
/// passing the end of its file too.
fn many_files_read_in_one_pipeline(backend: &Backend) {
    let dir = test_dir();
    let sizes = [(9 << 20) + 123, 3 << 20, 70_000];
    let mut data = Vec::new();
    let mut files = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        let bytes = random_bytes(n, 40 + k as u64);
        let path = dir.path().join(format!("shard-{k}"));
        fs::write(&path, &bytes).unwrap();
        files.push(backend.options(4, 1 << 20).open(&path, "r").unwrap());
        data.push(bytes);
    }
    let pieces = vec![
        FilePiece::range(0, 0, 0, sizes[0]),
        FilePiece::range(1, 4096 + 5, 10 << 20, (2 << 20) + 1),
        FilePiece::range(2, 69_000, 13 << 20, 5000),
        FilePiece::range(2, 7, 14 << 20, 0),
        FilePiece { file: 2, offset: 250, dst_offset: 15 << 20, len: 500, count: 50, stride: 1000 },
        FilePiece {
            file: 1,
            offset: (3 << 20) - 2500,
            dst_offset: (15 << 20) + 30_000,
            len: 1000,
            count: 4,
            stride: 1200,
        },
        FilePiece {
            file: 0,
            offset: 77,
            dst_offset: 16 << 20,
            len: 100_000,
            count: 12,
            stride: 300_001,
        },
        FilePiece {
            file: 1,
            offset: 5,
            dst_offset: 20 << 20,
            len: 150_000,
            count: 22,
            stride: 150_007,
        },
    ];
    let buf = backend.buffer(24 << 20, 0xEE).unwrap();
    let (buf, counts) = pread_files(files, buf, pieces.clone()).wait().unwrap();
    let mut host = vec![0u8; buf.len()];
    buf.copy_to_host(0, &mut host).unwrap();
    for (p, &n) in pieces.iter().zip(&counts) {
        let src = &data[p.file];
        let mut want = 0;
        for k in 0..p.count {
            let at = p.offset as usize + k * p.stride as usize;
            let got = src.len().saturating_sub(at).min(p.len);
            let to = p.dst_offset + k * p.len;
            assert_eq!(
                &host[to..to + got],
                &src[at..at + got],
                "{}: {p:?} run {k}",
                backend.name()
            );
            want += got;
            if got < p.len {
                break;
            }
        }
        assert_eq!(n, want, "{}: {p:?}", backend.name());
    }
    // The strided pieces past the end: two whole runs and 100 bytes of the third; and of the
    // large one, its runs up to the one the file's end cuts.
    assert_eq!(counts[5], 2100, "{}", backend.name());
    let cut = (sizes[1] - 5) / 150_007;
    let last = (sizes[1] - 5 - cut * 150_007).min(150_000);
    assert_eq!(counts[7], cut * 150_000 + last, "{}", backend.name());
    assert!(counts[7] < 22 * 150_000, "{}", backend.name());
}
