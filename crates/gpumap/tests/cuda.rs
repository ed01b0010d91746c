//! The CUDA and cuFile layers. Tests in the first part hold on every machine (on one without
//! CUDA they check that everything reports `Unavailable` with a reason and nothing panics);
//! those in the second need a GPU and skip loudly without one (`GPUMAP_REQUIRE_GPU=1` makes the
//! skip a failure).

mod common;

use std::io::Write;

use gpumap::io::gds::{BatchRead, CuFileDriver, CuFileHandle};
use gpumap::memory::bounce::BouncePool;
use gpumap::memory::cuda::{
    classify_pointer, device_ordinal_of, CudaBuffer, CudaDevice, CudaView, CudaViewMut,
    PinnedBuffer, PointerKind, Stream,
};
use gpumap::{Capabilities, Error};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

// ---- every machine ------------------------------------------------------------------------

/// NVTX ranges cost nothing unless asked for (`GPUMAP_NVTX=1`, or a profiler attached).
#[test]
fn nvtx_ranges_are_off_unless_asked() {
    let asked = std::env::var("GPUMAP_NVTX").is_ok_and(|v| v == "1")
        || std::env::var_os("NVTX_INJECTION64_PATH").is_some_and(|p| !p.is_empty());
    if !asked {
        assert_eq!(gpumap::profiling::nvtx_status(), Ok(false));
    }
}

#[test]
fn probe_explains_every_missing_capability() {
    let caps = Capabilities::probe();
    let report = caps.to_string();
    assert!(report.contains("CUDA"), "{report}");
    assert!(report.contains("cuFile"), "{report}");
    #[cfg(feature = "serde")]
    {
        let json = serde_json::to_string(caps).expect("capabilities serialize");
        assert!(json.contains("\"cuda\""), "{json}");
    }
    if !caps.gpu_available() {
        let reason = caps.cuda_reason().expect("a missing GPU has a reason");
        assert!(!reason.is_empty());
        assert!(caps.cufile_usable().is_err());
    }
    if let Err(reason) = caps.cufile_usable() {
        assert!(!reason.is_empty());
    }
}

#[test]
fn without_cuda_constructors_are_unavailable() {
    if CudaDevice::count().is_ok_and(|n| n > 0) {
        eprintln!("SKIP without_cuda_constructors_are_unavailable: a GPU is present");
        return;
    }
    match CudaDevice::new(0) {
        Err(Error::Unavailable { what, reason }) => {
            assert!(!reason.is_empty(), "{what} without a reason");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let host = [0u8; 64];
    assert!(matches!(
        // SAFETY: `host` outlives the view, and the view is only validated, never used.
        unsafe { CudaView::from_raw(host.as_ptr() as u64, host.len()) },
        Err(Error::Unavailable { .. })
    ));
    assert_eq!(classify_pointer(host.as_ptr() as usize), PointerKind::PageableHost);
    assert!(matches!(device_ordinal_of(host.as_ptr() as u64), Err(Error::Unavailable { .. })));
    assert!(!Capabilities::probe().gpu_available());
}

#[test]
fn without_cuda_the_reason_names_libcuda() {
    if CudaDevice::count().is_ok() {
        eprintln!("SKIP without_cuda_the_reason_names_libcuda: the CUDA driver loads");
        return;
    }
    let reason = Capabilities::probe().cuda_reason().unwrap_or_default().to_owned();
    assert!(reason.contains("libcuda") || reason.contains("cuInit"), "{reason}");
}

#[test]
fn cufile_driver_errs_with_a_reason_or_opens() {
    match CuFileDriver::get() {
        Ok(driver) => assert!(!driver.library().is_empty()),
        Err(Error::Unavailable { what, reason }) => {
            assert_eq!(what, "cuFile");
            assert!(!reason.is_empty());
            if CuFileDriver::library_name().is_err() {
                assert!(reason.contains("libcufile"), "{reason}");
            }
        }
        Err(other) => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn cufile_registration_without_driver_is_unavailable() {
    if CuFileDriver::get().is_ok() {
        eprintln!("SKIP cufile_registration_without_driver_is_unavailable: cuFile opens");
        return;
    }
    let file = tempfile::tempfile().expect("temp file");
    let err = CuFileHandle::register(&file, std::path::Path::new("/tmp/x")).unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
}

// ---- GPU ------------------------------------------------------------------------------------

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn gpu_device_reports_itself() {
    let Some(dev) = common::gpu() else { return };
    assert_eq!(dev.ordinal(), 0);
    assert!(!dev.name().is_empty());
    assert!(dev.total_memory() > 0);
    assert!(CudaDevice::count().expect("count") >= 1);
    dev.bind_to_thread().expect("bind");
    dev.bind_to_thread().expect("bind again");
    let caps = Capabilities::probe();
    assert!(caps.gpu_available(), "{caps}");
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn gpu_buffer_round_trip_and_bounds() {
    let Some(dev) = common::gpu() else { return };
    let len = 1 << 20;
    let data = pattern(len, 7);
    let mut buf = CudaBuffer::alloc(&dev, len).expect("alloc");
    assert_eq!(buf.len(), len);
    buf.copy_from_host(0, &data).expect("h2d");
    let mut back = vec![0u8; len];
    buf.copy_to_host(0, &mut back).expect("d2h");
    assert_eq!(back, data);

    let mut part = vec![0u8; 100];
    buf.copy_to_host(len - 100, &mut part).expect("tail");
    assert_eq!(part, data[len - 100..]);
    assert!(matches!(buf.copy_to_host(len - 99, &mut part), Err(Error::OutOfRange { .. })));
    assert!(matches!(buf.copy_from_host(len, &[1]), Err(Error::OutOfRange { .. })));

    let zeroed = CudaBuffer::zeroed(&dev, 4096).expect("zeroed");
    let mut z = vec![1u8; 4096];
    zeroed.copy_to_host(0, &mut z).expect("d2h");
    assert!(z.iter().all(|&b| b == 0));

    let empty = CudaBuffer::alloc(&dev, 0).expect("empty alloc");
    assert!(empty.is_empty());

    let region = buf.view();
    let sub = region.slice(4096..8192).expect("sub");
    assert_eq!(sub.ptr(), region.ptr() + 4096);
    assert!(region.slice(len - 1..len + 1).is_err());
    let (a, b) = buf.view_mut().split_at_mut(4096).expect("split");
    assert_eq!((a.len(), b.len(), b.ptr() - a.ptr()), (4096, len - 4096, 4096));
    assert!(buf.view_mut().chunks_mut(0).is_err());
    assert_eq!(buf.view_mut().chunks_mut(4096).expect("chunks").count(), len.div_ceil(4096));
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn gpu_from_raw_validates() {
    let Some(dev) = common::gpu() else { return };
    let buf = CudaBuffer::alloc(&dev, 1 << 16).expect("alloc");
    // SAFETY (all the raw views below): `buf` and `pinned` outlive them and nothing writes
    // through them; the freed pointer is only validated.
    let r = unsafe { CudaView::from_raw(buf.ptr(), buf.len()) }.expect("whole allocation");
    assert_eq!(r.len(), buf.len());
    assert_eq!(r.device_ordinal(), 0);
    unsafe { CudaView::from_raw(buf.ptr() + 100, buf.len() - 100) }.expect("interior range");
    match unsafe { CudaViewMut::from_raw(buf.ptr() + 100, buf.len()) } {
        Err(Error::BufferTooSmall { needed, available }) => {
            assert_eq!(needed, buf.len() as u64);
            assert_eq!(available, buf.len() as u64 - 100);
        }
        other => panic!("expected BufferTooSmall, got {other:?}"),
    }
    let host = [0u8; 64];
    match unsafe { CudaView::from_raw(host.as_ptr() as u64, 64) } {
        Err(Error::InvalidArgument(msg)) => {
            assert!(msg.contains("host") || msg.contains("not memory CUDA knows"), "{msg}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let pinned = PinnedBuffer::new(&dev, 4096).expect("pinned");
    assert!(matches!(
        unsafe { CudaView::from_raw(pinned.as_slice().as_ptr() as u64, 16) },
        Err(Error::InvalidArgument(_))
    ));
    // Other tests of this binary allocate at the same time, and the driver may hand a freed
    // address straight to one of them, which then validates rightly: a freed pointer must fail
    // in one of a few tries (a check that let freed pointers through would pass none).
    let freed_rejected = (0..8).any(|_| {
        let freed = {
            let gone = CudaBuffer::alloc(&dev, 1 << 20).expect("alloc");
            gone.ptr()
        };
        unsafe { CudaView::from_raw(freed, 16) }.is_err()
    });
    assert!(freed_rejected, "a freed pointer must not validate");
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn gpu_pointer_classification() {
    let Some(dev) = common::gpu() else { return };
    let buf = CudaBuffer::alloc(&dev, 4096).expect("alloc");
    assert_eq!(classify_pointer(buf.ptr() as usize), PointerKind::Device { ordinal: 0 });
    let pinned = PinnedBuffer::new(&dev, 4096).expect("pinned");
    assert_eq!(classify_pointer(pinned.as_slice().as_ptr() as usize), PointerKind::PinnedHost);
    let host = vec![0u8; 4096];
    assert_eq!(classify_pointer(host.as_ptr() as usize), PointerKind::PageableHost);
    assert_eq!(device_ordinal_of(buf.ptr() + 4095).expect("device memory"), 0);
    assert!(matches!(
        device_ordinal_of(pinned.as_slice().as_ptr() as u64),
        Err(Error::InvalidArgument(_))
    ));
    assert!(device_ordinal_of(host.as_ptr() as u64).is_err());
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn gpu_pinned_buffer_is_page_aligned() {
    let Some(dev) = common::gpu() else { return };
    let pinned = PinnedBuffer::new(&dev, 3 << 20).expect("pinned");
    assert_eq!(pinned.as_slice().as_ptr() as usize % 4096, 0);
    assert_eq!(pinned.len(), 3 << 20);
    assert!(pinned.as_slice().iter().all(|&b| b == 0));
    // Many at once, small and odd sizes too: the driver may carve these out of one larger
    // allocation, and O_DIRECT through them needs every one page aligned.
    let mut held = Vec::new();
    for len in [1usize, 100, 4096, 5000, 64 << 10, 1 << 20, 4 << 20] {
        for _ in 0..6 {
            let mut b = PinnedBuffer::new(&dev, len).expect("pinned");
            assert_eq!(b.as_slice().as_ptr() as usize % 4096, 0, "{len}-byte pinned buffer");
            assert_eq!(b.len(), len);
            b.as_mut_slice().fill(0x5A);
            held.push(b);
        }
    }
    // Sixteen threads pinning, writing and releasing at once (a pool's workers on a process's
    // first transfer): every buffer is its own, zeroed, and keeps what its thread wrote.
    std::thread::scope(|scope| {
        for t in 0..16u8 {
            let dev = &dev;
            scope.spawn(move || {
                for round in 0..3u8 {
                    let mut pair: Vec<PinnedBuffer> = (0..2)
                        .map(|_| PinnedBuffer::new(dev, (4 << 20) + 4097).expect("pinned"))
                        .collect();
                    for (k, b) in pair.iter_mut().enumerate() {
                        assert!(b.as_slice().iter().all(|&x| x == 0), "a new buffer is zeroed");
                        b.as_mut_slice().fill(t ^ round ^ k as u8);
                    }
                    for (k, b) in pair.iter().enumerate() {
                        assert!(b.as_slice().iter().all(|&x| x == t ^ round ^ k as u8));
                    }
                }
            });
        }
    });
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn gpu_pinned_buffers_made_together_are_disjoint_and_each_copies() {
    let Some(dev) = common::gpu() else { return };
    assert!(PinnedBuffer::new_many(&dev, 4096, 0).expect("none").is_empty());
    let empties = PinnedBuffer::new_many(&dev, 0, 3).expect("empty ones");
    assert!(empties.len() == 3 && empties.iter().all(PinnedBuffer::is_empty));
    // An odd length, so that the buffers do not tile the registration exactly.
    let len = (1 << 20) + 4097;
    let mut buffers = PinnedBuffer::new_many(&dev, len, 5).expect("pinned together");
    assert_eq!(buffers.len(), 5);
    let mut starts: Vec<usize> = buffers.iter().map(|b| b.as_slice().as_ptr() as usize).collect();
    for (b, start) in buffers.iter().zip(&starts) {
        assert_eq!(b.len(), len);
        assert_eq!(start % 4096, 0, "every buffer starts on a page");
        assert!(b.as_slice().iter().all(|&x| x == 0), "a new buffer is zeroed");
    }
    starts.sort_unstable();
    assert!(starts.windows(2).all(|w| w[1] - w[0] >= len), "the buffers overlap: {starts:?}");
    for (k, b) in buffers.iter_mut().enumerate() {
        b.as_mut_slice().copy_from_slice(&pattern(len, k as u8));
    }
    // Each one is pinned memory the copy engine reads and writes: up, and down into another.
    let stream = Stream::new(&dev).expect("stream");
    let mut dst = CudaBuffer::alloc(&dev, len).expect("alloc");
    let mut last = buffers.pop().expect("five");
    for (k, b) in buffers.into_iter().enumerate() {
        stream.upload(b, 0, len, dst.view_mut(), 0).expect("upload").wait().expect("up");
        last =
            stream.download(dst.view(), 0, last, 0, len).expect("download").wait().expect("down");
        assert!(last.as_slice() == pattern(len, k as u8), "buffer {k} came back changed");
    }
    // The first buffers dropped above; the last keeps the shared registration alive.
    assert!(last.as_slice() == pattern(len, 3));
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn gpu_bounce_pool_grows_in_groups_under_many_threads() {
    let Some(dev) = common::gpu() else { return };
    let pool = BouncePool::new(&dev, (1 << 20) + 512, 32).expect("pool");
    let first = pool.acquire().expect("first");
    assert_eq!(pool.allocated(), 2, "a pool pins two buffers first");
    drop(first);
    // Sixteen threads take two buffers each at once, as a transfer's workers do: the pool
    // reaches its bound, and every buffer held at the same time is a different one.
    let barrier = std::sync::Barrier::new(16);
    let held: Vec<Vec<usize>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..16u8)
            .map(|t| {
                let (pool, barrier) = (&pool, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    let mut pair = [pool.acquire().expect("a"), pool.acquire().expect("b")];
                    for (k, b) in pair.iter_mut().enumerate() {
                        b.fill(t.wrapping_mul(2).wrapping_add(k as u8));
                    }
                    barrier.wait();
                    for (k, b) in pair.iter().enumerate() {
                        let want = t.wrapping_mul(2).wrapping_add(k as u8);
                        assert!(b.iter().all(|&x| x == want), "another thread wrote here");
                    }
                    let starts = pair.iter().map(|b| b.as_ptr() as usize).collect();
                    barrier.wait();
                    starts
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).collect()
    });
    let mut starts: Vec<usize> = held.into_iter().flatten().collect();
    starts.sort_unstable();
    starts.dedup();
    assert_eq!(starts.len(), 32, "32 buffers held at once, each its own");
    assert_eq!(pool.allocated(), 32);
    assert!(pool.try_acquire().expect("try").is_some(), "every buffer came back");
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn gpu_stream_double_buffered_round_trip() {
    let Some(dev) = common::gpu() else { return };
    let chunk = 1 << 20;
    let total = 4 * chunk + 12345;
    let data = pattern(total, 3);
    let pool = BouncePool::new(&dev, chunk, 2).expect("pool");
    let stream = Stream::new(&dev).expect("stream");
    let mut dst = CudaBuffer::alloc(&dev, total).expect("alloc");

    // Upload: fill one buffer while the previous one is in flight.
    let mut in_flight = None;
    // Copies in flight together need disjoint destinations: one view per chunk.
    let targets = dst.view_mut().chunks_mut(chunk).expect("chunks");
    for (piece, target) in data.chunks(chunk).zip(targets) {
        let mut buf = pool.acquire().expect("acquire");
        buf[..piece.len()].copy_from_slice(piece);
        let next = stream.upload(buf, 0, piece.len(), target, 0).expect("upload");
        if let Some(prev) = in_flight.replace(next) {
            drop(prev.wait().expect("wait"));
        }
    }
    if let Some(last) = in_flight {
        drop(last.wait().expect("wait"));
    }
    assert!(pool.allocated() <= 2);

    // Download with the same pool.
    let mut back = vec![0u8; total];
    for (i, out) in back.chunks_mut(chunk).enumerate() {
        let buf = pool.acquire().expect("acquire");
        let flight = stream.download(dst.view(), i * chunk, buf, 0, out.len()).expect("download");
        let buf = flight.wait().expect("wait");
        out.copy_from_slice(&buf[..out.len()]);
    }
    assert_eq!(back, data);

    // Bounds: a copy longer than the staging buffer or past the region is refused.
    let buf = pool.acquire().expect("acquire");
    assert!(stream.upload(buf, 0, chunk + 1, dst.view_mut(), 0).is_err());
    let buf = pool.acquire().expect("acquire");
    assert!(stream.upload(buf, 0, 16, dst.view_mut(), total - 8).is_err());
    stream.synchronize().expect("sync");

    // Dropping an un-waited copy waits for it.
    let buf = pool.acquire().expect("acquire");
    let flight = stream.upload(buf, 0, chunk, dst.view_mut(), 0).expect("upload");
    drop(flight);
    assert!(pool.try_acquire().expect("try").is_some());

    let s1 = Stream::for_current_thread(&dev).expect("thread stream");
    let s2 = Stream::for_current_thread(&dev).expect("thread stream");
    assert!(std::rc::Rc::ptr_eq(&s1, &s2));
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn gpu_bounce_pool_is_bounded() {
    let Some(dev) = common::gpu() else { return };
    let pool = BouncePool::new(&dev, 1 << 16, 2).expect("pool");
    let a = pool.acquire().expect("a");
    let b = pool.acquire().expect("b");
    assert_eq!(a.len(), 1 << 16);
    assert!(pool.try_acquire().expect("try").is_none());
    drop(a);
    let c = pool.try_acquire().expect("try").expect("recycled buffer");
    assert_eq!(pool.allocated(), 2);
    drop((b, c));
    let shared = BouncePool::for_device(&dev, 1 << 16, 3).expect("shared");
    let again = BouncePool::for_device(&dev, 1 << 16, 5).expect("shared");
    assert!(std::sync::Arc::ptr_eq(&shared, &again));
    assert_eq!(again.max_buffers(), 5);
}

#[test]
#[ignore = "needs a GPU: --include-ignored runs it (GPUMAP_REQUIRE_GPU=1: a missing GPU fails)"]
fn gpu_cufile_round_trip_or_reason() {
    let Some(dev) = common::gpu() else { return };
    if let Err(e) = CuFileDriver::get() {
        eprintln!("cuFile unavailable on this GPU machine: {e}");
        assert!(matches!(e, Error::Unavailable { .. }));
        return;
    }
    let len = 1 << 20;
    let data = pattern(len, 11);
    // cuFile refuses tmpfs: use the GPU run's disk-backed folder, else cargo's target tmp dir.
    let parent =
        std::env::var("GPUMAP_BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    std::fs::create_dir_all(&parent).expect("test dir");
    let dir = tempfile::tempdir_in(&parent).expect("temp dir");
    let path = dir.path().join("gds.bin");
    std::fs::File::create(&path).and_then(|mut f| f.write_all(&vec![0u8; len])).expect("file");
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).expect("open");
    let handle = match CuFileHandle::register(&file, &path) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("cuFile refused the file (the fallback reason): {e}");
            assert!(matches!(e, Error::CuFile { .. } | Error::Unavailable { .. }), "{e:?}");
            if let Error::CuFile { name, .. } = &e {
                assert!(!name.is_empty());
            }
            return;
        }
    };
    let mut src = CudaBuffer::alloc(&dev, len).expect("alloc");
    src.copy_from_host(0, &data).expect("h2d");
    assert_eq!(handle.write(src.view(), 0, len, 0).expect("cuFileWrite"), len);

    let mut dst = CudaBuffer::zeroed(&dev, len).expect("alloc");
    assert_eq!(handle.read(dst.view_mut(), 0, len, 0).expect("cuFileRead"), len);
    let mut back = vec![0u8; len];
    dst.copy_to_host(0, &mut back).expect("d2h");
    assert_eq!(back, data);

    // Batch: four quarter reads into a fresh buffer.
    let mut dst2 = CudaBuffer::zeroed(&dev, len).expect("alloc");
    let q = len / 4;
    let mut ios: Vec<BatchRead> = dst2
        .view_mut()
        .chunks_mut(q)
        .expect("chunks")
        .enumerate()
        .map(|(i, dst)| BatchRead { dst, dst_offset: 0, len: q, file_offset: (i * q) as u64 })
        .collect();
    match handle.read_batch(&mut ios) {
        Ok(results) => {
            for r in results {
                assert_eq!(r.expect("batch entry"), q);
            }
            dst2.copy_to_host(0, &mut back).expect("d2h");
            assert_eq!(back, data);
        }
        Err(e) => eprintln!("cuFile batch API not usable here: {e}"),
    }

    // Out-of-range requests are refused before reaching cuFile.
    assert!(handle.read(dst.view_mut(), 1, len, 0).is_err());

    // Registered buffer + stream-ordered read, where supported.
    match CuFileHandle::register_buffer(dst.view()) {
        Ok(reg) => assert_eq!(reg.region(), dst.view()),
        Err(e) => eprintln!("cuFileBufRegister not usable here: {e}"),
    }
    let stream = Stream::new(&dev).expect("stream");
    match handle.read_async(&stream, dst.view_mut(), 0, len, 0).and_then(|io| io.wait()) {
        Ok(n) => assert_eq!(n, len),
        Err(e) => eprintln!("cuFileReadAsync not usable here: {e}"),
    }
}
