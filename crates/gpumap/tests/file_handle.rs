//! FileHandle on host memory, against real files: round trips at awkward sizes and offsets,
//! every thread count, open flags against their POSIX meaning, and bad input.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::Arc;

use common::random_bytes;
use gpumap::io::{FileHandle, HandleOptions, IoPool};
use gpumap::memory::HostBuffer;
use gpumap::Error;
use proptest::prelude::*;

fn options(threads: usize, task_size: u64, direct: bool) -> HandleOptions {
    let mut o = FileHandle::options().unwrap();
    o.pool(Arc::new(IoPool::new(threads).unwrap())).task_size(task_size).direct_io(direct, direct);
    o
}

/// Writes `data` at `offset` through gpumap, reads it back through gpumap and through std::fs,
/// and checks both byte for byte.
fn round_trip(
    dir: &std::path::Path,
    len: usize,
    offset: u64,
    threads: usize,
    task: u64,
    direct: bool,
) {
    let path = dir.join(format!("rt-{len}-{offset}-{threads}-{task}-{direct}"));
    let data = random_bytes(len, len as u64 ^ offset);
    let opts = options(threads, task, direct);
    let fh = opts.open(&path, "w+").unwrap();
    // Through a page-aligned buffer so the O_DIRECT middle is really exercised.
    let mut src = HostBuffer::new(len).unwrap();
    src.copy_from_slice(&data);
    assert_eq!(fh.write(&src, offset).unwrap(), len);
    assert_eq!(fh.len().unwrap(), if len == 0 { 0 } else { offset + len as u64 });

    let mut back = HostBuffer::new(len).unwrap();
    assert_eq!(fh.read(&mut back, offset).unwrap(), len);
    assert!(
        back[..] == data[..],
        "gpumap read differs (len {len} offset {offset} threads {threads})"
    );

    let mut via_std = vec![0u8; len];
    let mut f = fs::File::open(&path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut via_std).unwrap();
    assert!(via_std == data, "std read differs (len {len} offset {offset})");
    // The bytes before `offset` are a hole of zeros.
    if offset > 0 && len > 0 {
        let mut head = vec![1u8; offset.min(8192) as usize];
        assert_eq!(fh.read(&mut head, 0).unwrap(), head.len());
        assert!(head.iter().all(|&b| b == 0));
    }
    fs::remove_file(&path).unwrap();
}

#[test]
fn round_trips_at_edge_sizes_every_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    for len in [0usize, 1, 4095, 4096, 4097, (3 << 20) + 123, 9 << 20] {
        for offset in [0u64, 1, 4096, 12_345] {
            for threads in [1usize, 2, 3, 8] {
                for direct in [false, true] {
                    round_trip(dir.path(), len, offset, threads, 1 << 20, direct);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_round_trips(len in 0usize..(6 << 20), offset in 0u64..(1 << 22),
                          threads in 1usize..9, task in 4096u64..(2 << 20), direct: bool) {
        let dir = tempfile::tempdir().unwrap();
        round_trip(dir.path(), len, offset, threads, task, direct);
    }
}

#[test]
fn beyond_4_gib_in_a_sparse_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse");
    let fh = options(4, 1 << 20, true).open(&path, "w+").unwrap();
    let far = (5u64 << 30) + 4095; // past 2^32, unaligned
    fh.set_len(6 << 30).unwrap();
    let data = random_bytes(3 << 20, 99);
    fh.write(&data, far).unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(fh.read(&mut back, far).unwrap(), data.len());
    assert!(back == data);
    // A read spanning the 4 GiB boundary (holes read as zeros).
    let mut span = vec![7u8; 2 << 20];
    assert_eq!(fh.read(&mut span, (4u64 << 30) - (1 << 20)).unwrap(), span.len());
    assert!(span.iter().all(|&b| b == 0));
    // Checked against std at the far offset.
    let mut f = fs::File::open(&path).unwrap();
    f.seek(SeekFrom::Start(far)).unwrap();
    let mut via_std = vec![0u8; data.len()];
    f.read_exact(&mut via_std).unwrap();
    assert!(via_std == data);
    assert_eq!(fh.len().unwrap(), 6 << 30);
}

#[test]
fn short_reads_at_end_of_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short");
    fs::write(&path, random_bytes(10_000, 1)).unwrap();
    let fh = options(4, 4096, false).open(&path, "r").unwrap();
    let mut buf = vec![0u8; 20_000];
    assert_eq!(fh.read(&mut buf, 0).unwrap(), 10_000);
    assert_eq!(fh.read(&mut buf, 9_000).unwrap(), 1_000);
    assert_eq!(fh.read(&mut buf, 50_000).unwrap(), 0);
    assert_eq!(fh.read_at(&mut buf, 9_999).unwrap(), 1);
    match fh.read_exact(&mut buf, 5_000) {
        Err(Error::UnexpectedEof { offset: 5_000, wanted: 20_000, file_len: 10_000, .. }) => {}
        other => panic!("expected UnexpectedEof, got {other:?}"),
    }
}

#[test]
fn futures_return_buffers_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("futures");
    let data = random_bytes(1 << 20, 5);
    let fh = options(4, 64 << 10, false).open(&path, "w+").unwrap();
    let writes: Vec<_> = (0..16)
        .map(|i| fh.pwrite(data[i * 65536..(i + 1) * 65536].to_vec(), i as u64 * 65536))
        .collect();
    for w in writes {
        let (_, n) = w.wait().unwrap();
        assert_eq!(n, 65536);
    }
    let reads: Vec<_> = (0..256).map(|i| fh.pread(vec![0u8; 4096], i * 4096)).collect();
    for (i, r) in reads.into_iter().enumerate() {
        let (buf, n) = r.wait().unwrap();
        assert_eq!(n, 4096);
        assert!(buf[..] == data[i * 4096..(i + 1) * 4096]);
    }
    let f = fh.pread(vec![0u8; 10], 1 << 30);
    let (_, n) = f.wait().unwrap();
    assert_eq!(n, 0, "a read past the end reads nothing");
}

#[test]
fn open_flags_mean_what_posix_says() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flags");
    let opts = options(2, 1 << 20, false);

    // r: missing file is an error, nothing created.
    assert!(matches!(opts.open(&path, "r"), Err(Error::Io { .. })));
    assert!(!path.exists());
    // w: creates, writes; cannot read.
    let fh = opts.open(&path, "w").unwrap();
    fh.write(b"hello world", 0).unwrap();
    assert!(matches!(fh.read(&mut [0u8; 4], 0), Err(Error::AccessMode { .. })));
    drop(fh);
    assert_eq!(fs::read(&path).unwrap(), b"hello world");
    // r: reads; writing fails before touching the file.
    let fh = opts.open(&path, "r").unwrap();
    let mut buf = [0u8; 5];
    fh.read(&mut buf, 6).unwrap();
    assert_eq!(&buf, b"world");
    assert!(matches!(fh.write(b"X", 0), Err(Error::AccessMode { .. })));
    assert!(matches!(fh.set_len(0), Err(Error::AccessMode { .. })));
    drop(fh);
    assert_eq!(fs::read(&path).unwrap(), b"hello world");
    // r+: reads and writes in place, no truncation.
    let fh = opts.open(&path, "r+").unwrap();
    fh.write(b"J", 0).unwrap();
    drop(fh);
    assert_eq!(fs::read(&path).unwrap(), b"Jello world");
    // a: appends; positional writes and reads refused.
    let fh = opts.open(&path, "a").unwrap();
    fh.append(b"!").unwrap();
    assert!(matches!(fh.write(b"?", 0), Err(Error::AccessMode { .. })));
    assert!(matches!(fh.read(&mut buf, 0), Err(Error::AccessMode { .. })));
    drop(fh);
    assert_eq!(fs::read(&path).unwrap(), b"Jello world!");
    // a+: appends and reads.
    let fh = opts.open(&path, "a+").unwrap();
    fh.append(b"?").unwrap();
    let mut all = [0u8; 13];
    assert_eq!(fh.read(&mut all, 0).unwrap(), 13);
    assert_eq!(&all, b"Jello world!?");
    assert!(matches!(opts.open(&path, "r+").unwrap().append(b"x"), Err(Error::AccessMode { .. })));
    // w+: truncates on open, reads back.
    let fh = opts.open(&path, "w+").unwrap();
    assert_eq!(fh.len().unwrap(), 0);
    fh.write(b"new", 0).unwrap();
    let mut three = [0u8; 3];
    fh.read(&mut three, 0).unwrap();
    assert_eq!(&three, b"new");
    // a creates a missing file.
    let fresh = dir.path().join("fresh");
    opts.open(&fresh, "a").unwrap().append(b"1").unwrap();
    assert_eq!(fs::read(&fresh).unwrap(), b"1");
    // The "mode" bits apply to created files.
    let mut private = opts.clone();
    private.mode(0o600);
    let secret = dir.path().join("secret");
    private.open(&secret, "w").unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(fs::metadata(&secret).unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn bad_input_is_a_typed_error_and_leaves_files_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(2, 1 << 20, false);
    let path = dir.path().join("keep");
    fs::write(&path, b"precious").unwrap();

    // Missing file: the errno survives.
    let e = opts.open(dir.path().join("missing"), "r").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    assert!(e.to_string().contains("missing"), "{e}");
    // A directory.
    let e = opts.open(dir.path(), "r").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EISDIR), "{e}");
    // Bad flags, before any open (so "w"-like truncation never happens).
    for bad in ["rw", "x", "", "w++"] {
        assert!(matches!(opts.open(&path, bad), Err(Error::InvalidFlags(ref f)) if f == bad));
    }
    // Offset overflow: no write happens.
    let fh = opts.open(&path, "r+").unwrap();
    match fh.write(b"zz", u64::MAX - 1) {
        Err(Error::Overflow { offset, len: 2 }) => assert_eq!(offset, u64::MAX - 1),
        other => panic!("expected Overflow, got {other:?}"),
    }
    assert!(matches!(fh.read(&mut [0u8; 2], i64::MAX as u64), Err(Error::Overflow { .. })));
    assert!(matches!(fh.pread(vec![0u8; 2], u64::MAX).wait(), Err(Error::Overflow { .. })));
    assert!(matches!(fh.set_len(u64::MAX), Err(Error::Overflow { .. })));
    drop(fh);
    assert_eq!(fs::read(&path).unwrap(), b"precious");
    // No permission: a mode-000 file. Root bypasses file modes; the CLI tests check the same
    // EACCES as `nobody` (gpumap-cli/tests/cli.rs, `permission_denied_names_the_file`).
    let locked = dir.path().join("locked");
    fs::write(&locked, b"x").unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).unwrap();
    if fs::File::open(&locked).is_err() {
        let denied = opts.open(&locked, "r").unwrap_err();
        assert_eq!(denied.raw_os_error(), Some(libc::EACCES), "{denied}");
        assert_eq!(denied.kind(), std::io::ErrorKind::PermissionDenied);
    }
    assert_eq!(fs::metadata(&locked).unwrap().len(), 1);
}

#[test]
fn durability_calls_and_set_len() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("durable");
    let fh = options(2, 1 << 20, true).open(&path, "w+").unwrap();
    fh.write(&random_bytes(100_000, 3), 0).unwrap();
    fh.sync_data().unwrap();
    fh.sync_all().unwrap();
    fh.set_len(10).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), 10);
    fh.set_len(1 << 20).unwrap();
    let mut tail = vec![1u8; 100];
    fh.read(&mut tail, 500_000).unwrap();
    assert!(tail.iter().all(|&b| b == 0));
    let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(b"abc").unwrap();
    assert_eq!(fh.len().unwrap(), (1 << 20) + 3);
}

/// Pages of `path` in the page cache.
fn cached_pages(path: &std::path::Path) -> (u64, u64) {
    let r = gpumap::pagecache::residency(path, gpumap::pagecache::ByteRange::ALL).unwrap();
    (r.cached_pages.expect("residency of our own file is known"), r.total_pages)
}

#[test]
fn uncached_policy_reads_cold_ranges_around_the_page_cache() {
    use gpumap::config::DirectRead;
    use gpumap::pagecache::{evict, ByteRange};
    // A real disk (the per-target temporary directory): tmpfs has no O_DIRECT and never evicts.
    fs::create_dir_all(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("uncached");
    let len = 64usize << 20;
    let data = random_bytes(len, 77);
    fs::write(&path, &data).unwrap();
    fs::File::open(&path).unwrap().sync_all().unwrap();
    let task = 4u64 << 20;
    let open = |policy: DirectRead| {
        let mut o = options(2, task, false);
        o.direct_read(policy);
        o.open(&path, "r").unwrap()
    };
    let uncached = open(DirectRead::Uncached);
    assert_eq!(uncached.direct_read_policy(), DirectRead::Uncached);
    let mut buf = HostBuffer::new(len).unwrap();

    let report = evict(&path, ByteRange::ALL).unwrap();
    let evicted = report.after.cached_pages.unwrap() * 100 <= report.after.total_pages;
    if let (Err(why), _) | (_, Err(why)) = (
        uncached.direct_io_status(),
        if evicted { Ok(()) } else { Err("the kernel kept the pages after eviction") },
    ) {
        eprintln!("*** SKIP (cache checks): {why}; checking the bytes only");
        assert_eq!(uncached.read(&mut buf, 0).unwrap(), len);
        assert!(buf[..] == data[..]);
        return;
    }

    // Cold: every task goes around the page cache, which stays (almost) empty.
    assert_eq!(uncached.read(&mut buf, 0).unwrap(), len);
    assert!(buf[..] == data[..], "uncached read of a cold file differs");
    let (cached, total) = cached_pages(&path);
    assert!(cached * 16 <= total, "O_DIRECT read left {cached} of {total} pages cached");

    // An unaligned start (buffer and file agree modulo the page, so the middle can still go
    // around the cache): the buffered head must not make the rest buffered through the
    // read-ahead it sets off.
    evict(&path, ByteRange::ALL).unwrap();
    let mut shifted = HostBuffer::new(len).unwrap();
    assert_eq!(uncached.read(&mut shifted[7..], 7).unwrap(), len - 7);
    assert!(shifted[7..] == data[7..], "uncached read at offset 7 differs");
    let (cached, total) = cached_pages(&path);
    assert!(cached * 16 <= total, "read at offset 7 left {cached} of {total} pages cached");

    // The same cold read with the default policy fills the cache.
    evict(&path, ByteRange::ALL).unwrap();
    assert_eq!(open(DirectRead::Off).read(&mut buf, 0).unwrap(), len);
    let (cached, total) = cached_pages(&path);
    assert!(cached * 10 >= total * 9, "buffered read left only {cached} of {total} cached");

    // The second half cached: it is read from the cache, the first half around it, so the
    // read adds at most the tasks where the halves meet. (The second half, not the first: a
    // buffered read of the cached first half would set off read-ahead into the second, which
    // then counts as cached by the time its tasks look.)
    evict(&path, ByteRange::ALL).unwrap();
    let mut half = vec![0u8; len / 2];
    let half_at = (len / 2) as u64;
    std::os::unix::fs::FileExt::read_exact_at(&fs::File::open(&path).unwrap(), &mut half, half_at)
        .unwrap();
    let (before, total) = cached_pages(&path);
    buf.fill(0);
    assert_eq!(uncached.read(&mut buf, 0).unwrap(), len);
    assert!(buf[..] == data[..], "uncached read of a half-cached file differs");
    let (after, _) = cached_pages(&path);
    let task_pages = task / 4096;
    assert!(before * 2 >= total * 9 / 10, "only {before} of {total} pages cached by half a read");
    assert!(
        after <= before + 2 * task_pages,
        "uncached read grew the cache from {before} to {after} pages of {total}"
    );
}

/// Opens `path` with `flags` on another thread and waits at most 10 s: before non-regular
/// files were refused, opening a FIFO blocked until a writer came, forever in a test.
fn open_within_10s(path: &std::path::Path, flags: &'static str) -> gpumap::Result<FileHandle> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = path.to_path_buf();
    std::thread::spawn(move || tx.send(FileHandle::open(&path, flags)));
    rx.recv_timeout(std::time::Duration::from_secs(10)).expect("open returned within 10 s")
}

#[test]
fn only_regular_files_open_and_nothing_blocks_or_is_truncated() {
    use std::os::unix::net::UnixListener;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let socket = dir.path().join("socket");
    let _listener = UnixListener::bind(&socket).unwrap();
    for (path, flags, what) in [
        (fifo.as_path(), "r", "a FIFO"),
        (fifo.as_path(), "w", "a FIFO"),
        (fifo.as_path(), "r+", "a FIFO"),
        (fifo.as_path(), "a", "a FIFO"),
        (std::path::Path::new("/dev/zero"), "r", "a character device"),
        (std::path::Path::new("/dev/null"), "w", "a character device"),
        (socket.as_path(), "r", "a socket"),
        (std::path::Path::new("/proc/self/status"), "r", "a pseudo file (procfs)"),
        (std::path::Path::new("/proc/cpuinfo"), "r", "a pseudo file (procfs)"),
    ] {
        match open_within_10s(path, flags) {
            Err(Error::NotRegularFile { path: Some(p), what: w }) => {
                assert_eq!((p.as_path(), w), (path, what), "{flags}")
            }
            other => panic!("{} {flags}: expected NotRegularFile, got {other:?}", path.display()),
        }
    }
    if std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
        let e = open_within_10s(
            std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled"),
            "r",
        )
        .unwrap_err();
        assert!(matches!(e, Error::NotRegularFile { what: "a pseudo file (sysfs)", .. }), "{e}");
    }
    // A regular file, also through a symbolic link, opens, and its descriptor blocks as usual.
    let file = dir.path().join("regular");
    fs::write(&file, b"data").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    let fh = open_within_10s(&link, "r+").unwrap();
    let flags = nix::fcntl::fcntl(
        std::os::fd::AsRawFd::as_raw_fd(fh.file()),
        nix::fcntl::FcntlArg::F_GETFL,
    )
    .unwrap();
    assert_eq!(flags & libc::O_NONBLOCK, 0);
    let mut back = [0u8; 4];
    assert_eq!(fh.read(&mut back, 0).unwrap(), 4);
    assert_eq!(&back, b"data");
}

#[test]
fn a_zero_task_size_is_refused_before_any_file_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new");
    let e = options(1, 0, false).open(&path, "w").unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("task size 0")), "{e}");
    assert!(!path.exists());
}

#[test]
fn a_read_racing_a_truncation_reports_only_the_prefix_it_delivered() {
    const LEN: usize = 16 << 20;
    const CUT: u64 = 4 << 20;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shrinking");
    let data = Arc::new(random_bytes(LEN, 99));
    fs::write(&path, &data[..]).unwrap();
    let fh = options(8, 64 << 10, false).open(&path, "r").unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Another process's view of the file: cut it, then write the rest back, again and again.
    let cutter = {
        let (path, data, stop) = (path.clone(), data.clone(), stop.clone());
        std::thread::spawn(move || {
            let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                file.set_len(CUT).unwrap();
                std::os::unix::fs::FileExt::write_all_at(&file, &data[CUT as usize..], CUT)
                    .unwrap();
            }
        })
    };
    let mut buf = vec![0u8; LEN];
    let (mut reads, mut short) = (0, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline && (short < 20 || reads < 50) {
        // Bytes no task read must not look like file data.
        buf.fill(0xEE);
        let n = fh.read(&mut buf, 0).unwrap();
        reads += 1;
        short += usize::from(n < LEN);
        if let Some(at) = buf[..n].iter().zip(&data[..n]).position(|(a, b)| a != b) {
            panic!("read {reads} reported {n} bytes, but byte {at} was never read");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    cutter.join().unwrap();
    eprintln!("{reads} reads, {short} of them short");
}
