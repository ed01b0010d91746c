//! Real page-cache behaviour on real files.
//!
//! Files live under Cargo's per-target temporary directory (a real disk, unlike a tmpfs
//! `/tmp`, whose pages cannot be evicted). Where the kernel refuses an operation (containers
//! without privileges, tmpfs), a test says so loudly and checks the error or "unknown" path
//! instead of pretending.
#![forbid(unsafe_code)]

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpumap::pagecache::{self, ByteRange, Method, MethodChoice, Residency, ResidentRun, WarmMode};
use gpumap::Error;

const MIB: u64 = 1 << 20;

fn page() -> u64 {
    pagecache::page_size()
}

fn scratch_dir() -> tempfile::TempDir {
    // CARGO_TARGET_TMPDIR is on the same file system as `target/`: real storage.
    tempfile::Builder::new()
        .prefix("pagecache-test-")
        .tempdir_in({
            std::fs::create_dir_all(env!("CARGO_TARGET_TMPDIR")).unwrap();
            env!("CARGO_TARGET_TMPDIR")
        })
        .unwrap()
}

/// A file of `len` bytes of a non-zero pattern, fsynced, so all its pages are clean.
fn write_file(dir: &Path, name: &str, len: u64) -> PathBuf {
    let path = dir.join(name);
    let mut file = File::create(&path).unwrap();
    let chunk: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8 + 1).collect();
    let mut left = len;
    while left > 0 {
        let n = left.min(MIB) as usize;
        file.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    file.sync_all().unwrap();
    path
}

fn cached(path: &Path) -> u64 {
    let r = pagecache::residency(path, ByteRange::ALL).unwrap();
    r.cached_pages.expect("residency of our own file must be known")
}

/// Whether both methods see `pages` cached. `cachestat` counts a page as soon as its read is
/// queued, `mincore` only once the read completed, so asynchronous readahead must settle.
fn settled_at(path: &Path, pages: u64) -> bool {
    let by = |choice| {
        pagecache::residency_with(path, ByteRange::ALL, choice).unwrap().cached_pages.unwrap()
    };
    by(MethodChoice::Auto) == pages && by(MethodChoice::Mincore) == pages
}

/// All pages but at most 1 %. The kernel may reclaim just-read pages of a clean file at
/// any time: on the development machine 2 of 16384 went missing once in about 30 runs, on
/// CI 9 of 8192 right after reading them. The checks tell half from none and from all, and
/// say when pages went missing.
fn nearly_all(cached: u64, pages: u64) -> bool {
    let ok = cached <= pages && cached * 100 >= pages * 99;
    if ok && cached != pages {
        eprintln!("*** NOTE: {} of {pages} pages were reclaimed meanwhile", pages - cached);
    }
    ok
}

/// Read `len` bytes at `offset` with readahead switched off for the descriptor, so exactly
/// the pages read become resident (this disk's readahead window is 8 MiB).
fn read_exactly(path: &Path, offset: u64, len: u64) {
    let file = File::open(path).unwrap();
    nix::fcntl::posix_fadvise(
        file.as_raw_fd(),
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM,
    )
    .unwrap();
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset).unwrap();
}

/// Evict `path` and report whether this kernel/file system let us: `false` (with a loud
/// message) where pages stay resident, e.g. on tmpfs or in a restricted container.
fn evict_or_explain(path: &Path) -> bool {
    let report = pagecache::evict(path, ByteRange::ALL).unwrap();
    let after = report.after.cached_pages.unwrap();
    // The report tells the truth about what stayed.
    assert_eq!(after, cached(path), "evict report disagrees with a fresh look");
    if after * 100 > report.after.total_pages {
        eprintln!(
            "*** NOTE: the kernel kept {after} of {} pages of {} after fdatasync + \
             POSIX_FADV_DONTNEED (tmpfs, or a container that refuses); checking only that \
             the report says so",
            report.after.total_pages,
            path.display()
        );
        return false;
    }
    true
}

fn wait_for(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

#[test]
fn evict_read_half_warm() {
    let dir = scratch_dir();
    let len = 64 * MIB;
    let path = write_file(dir.path(), "data", len);
    let pages = len / page();

    let before = pagecache::residency(&path, ByteRange::ALL).unwrap();
    assert_eq!(before.total_pages, pages);
    assert_eq!(before.file_size, len);
    assert_eq!(before.page_size, page());

    if !evict_or_explain(&path) {
        return;
    }
    let after_evict = cached(&path);
    assert!(after_evict * 100 <= pages, "{after_evict} of {pages} pages left after evict");

    // Read the first half without readahead: half is resident.
    read_exactly(&path, 0, len / 2);
    let half = cached(&path);
    let slack = MIB / page();
    assert!(half <= pages / 2 + slack, "{half} of {pages} after half: readahead was on");
    let first_half = pagecache::residency(&path, ByteRange::new(0, len / 2)).unwrap();
    let first_half = first_half.cached_pages.unwrap();
    assert!(nearly_all(first_half, pages / 2), "{first_half} of {} in the first half", pages / 2);
    let second_half = pagecache::residency(&path, ByteRange::from_offset(len / 2)).unwrap();
    assert!(second_half.cached_pages.unwrap() <= slack);

    // Warm by reading: everything resident when it returns.
    pagecache::warm(&path, ByteRange::ALL, WarmMode::Read).unwrap();
    assert!(nearly_all(cached(&path), pages), "{} of {pages} after warm --wait", cached(&path));

    // Warm by advice: asynchronous, so poll.
    assert!(evict_or_explain(&path));
    pagecache::warm(&path, ByteRange::ALL, WarmMode::Advise).unwrap();
    let warmed = || {
        let by = |c| pagecache::residency_with(&path, ByteRange::ALL, c).unwrap().cached_pages;
        nearly_all(by(MethodChoice::Auto).unwrap(), pages)
            && nearly_all(by(MethodChoice::Mincore).unwrap(), pages)
    };
    assert!(wait_for(warmed), "WILLNEED cached {} of {pages}", cached(&path));
}

#[test]
fn cachestat_and_mincore_agree_and_map_is_exact() {
    let dir = scratch_dir();
    let pages = 64;
    let path = write_file(dir.path(), "data", pages * page() - 100);
    if !evict_or_explain(&path) {
        return;
    }
    // WILLNEED reads exactly the advised pages (no readahead past them).
    let p = page();
    pagecache::warm(&path, ByteRange::new(2 * p, 3 * p), WarmMode::Advise).unwrap();
    pagecache::warm(&path, ByteRange::new(10 * p + 7, 1), WarmMode::Advise).unwrap();
    pagecache::warm(&path, ByteRange::from_offset(62 * p), WarmMode::Advise).unwrap();
    assert!(wait_for(|| settled_at(&path, 6)), "cached {} pages, wanted 6", cached(&path));

    let auto = pagecache::residency(&path, ByteRange::ALL).unwrap();
    let mincore = pagecache::residency_with(&path, ByteRange::ALL, MethodChoice::Mincore).unwrap();
    assert_eq!(mincore.method, Method::Mincore);
    assert_eq!(mincore.dirty_pages, None, "mincore cannot know dirty pages");
    assert_eq!(auto.cached_pages, mincore.cached_pages);
    match pagecache::residency_with(&path, ByteRange::ALL, MethodChoice::Cachestat) {
        Ok(cachestat) => {
            assert_eq!(auto.method, Method::Cachestat);
            assert_eq!(cachestat.cached_pages, Some(6));
            assert_eq!(cachestat.dirty_pages, Some(0), "the file was fsynced");
            assert_eq!(cachestat.writeback_pages, Some(0));
            assert!(cachestat.evicted_pages.is_some());
        }
        Err(e) => {
            eprintln!("*** NOTE: cachestat(2) unavailable here ({e}); compared mincore only");
            assert_eq!(e.raw_os_error(), Some(libc::ENOSYS));
            assert_eq!(auto.method, Method::Mincore);
        }
    }

    let map = pagecache::residency_map(&path, ByteRange::ALL).unwrap();
    assert_eq!(map.residency.cached_pages, Some(6));
    assert_eq!(map.pages(), pages);
    let file_len = pages * p - 100;
    assert_eq!(
        map.resident_runs,
        vec![
            ResidentRun { offset: 2 * p, len: 3 * p },
            ResidentRun { offset: 10 * p, len: p },
            ResidentRun { offset: 62 * p, len: file_len - 62 * p },
        ]
    );
    assert!(map.is_resident(2) && map.is_resident(4) && !map.is_resident(5));
    assert!(!map.is_resident(pages), "past the end is not resident");
    assert_eq!(map.resident_pages_in(0..10), 3);
    assert_eq!(map.resident_pages_in(0..u64::MAX), 6);

    // A sub-range map counts only its own pages, indexed from its first page.
    let sub = pagecache::residency_map(&path, ByteRange::new(3 * p + 1, 8 * p)).unwrap();
    assert_eq!(sub.pages(), 9);
    assert_eq!(sub.residency.cached_pages, Some(2 + 1));
    assert!(sub.is_resident(0) && sub.is_resident(1) && !sub.is_resident(2));
}

#[test]
fn dirty_pages_are_counted_by_cachestat() {
    let dir = scratch_dir();
    let path = dir.path().join("dirty");
    let file = File::create(&path).unwrap();
    file.write_all_at(&vec![7u8; (4 * page()) as usize], 0).unwrap();
    let r = match pagecache::residency_with(&path, ByteRange::ALL, MethodChoice::Cachestat) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("*** SKIP: cachestat(2) unavailable here ({e}); dirty counts need it");
            return;
        }
    };
    assert_eq!(r.cached_pages, Some(4));
    // Writeback may already have started; the pages are dirty or under writeback or clean.
    assert!(r.dirty_pages.unwrap() + r.writeback_pages.unwrap() <= 4);
    file.sync_data().unwrap();
    let r = pagecache::residency(&path, ByteRange::ALL).unwrap();
    assert_eq!(r.dirty_pages, Some(0));
    // evict syncs first, so freshly written pages go too.
    file.write_all_at(&vec![8u8; (4 * page()) as usize], 0).unwrap();
    let report = pagecache::evict(&path, ByteRange::ALL).unwrap();
    assert_eq!(report.before.cached_pages, Some(4));
    assert_eq!(report.after.dirty_pages, Some(0));
}

#[test]
fn windows_cover_files_larger_than_one_map() {
    // 3 GiB sparse: mincore runs over several 1 GiB windows; nothing is written to disk.
    let dir = scratch_dir();
    let path = dir.path().join("sparse");
    let file = File::create(&path).unwrap();
    let len = 3 << 30;
    file.set_len(len).unwrap();
    if !evict_or_explain(&path) {
        return;
    }
    let p = page();
    let spots = [(1 << 30) - p, 1 << 30, (3 << 30) - p];
    for spot in spots {
        pagecache::warm(&path, ByteRange::new(spot, 1), WarmMode::Advise).unwrap();
    }
    assert!(wait_for(|| settled_at(&path, 3)), "cached {} pages of the holes", cached(&path));
    let map = pagecache::residency_map(&path, ByteRange::ALL).unwrap();
    assert_eq!(map.pages(), len / p);
    assert_eq!(
        map.resident_runs,
        vec![
            ResidentRun { offset: (1 << 30) - p, len: 2 * p },
            ResidentRun { offset: spots[2], len: p }
        ]
    );
    let by_mincore = pagecache::residency_with(&path, ByteRange::ALL, MethodChoice::Mincore);
    assert_eq!(by_mincore.unwrap().cached_pages, Some(3));
}

#[test]
fn zero_length_files_and_empty_ranges() {
    let dir = scratch_dir();
    let path = dir.path().join("empty");
    File::create(&path).unwrap();
    for choice in [MethodChoice::Auto, MethodChoice::Mincore] {
        let r = pagecache::residency_with(&path, ByteRange::ALL, choice).unwrap();
        assert_eq!((r.total_pages, r.cached_pages, r.file_size), (0, Some(0), 0));
        assert_eq!(r.fraction(), Some(1.0));
    }
    let map = pagecache::residency_map(&path, ByteRange::ALL).unwrap();
    assert!(map.resident_runs.is_empty());
    pagecache::warm(&path, ByteRange::ALL, WarmMode::Read).unwrap();
    pagecache::warm(&path, ByteRange::ALL, WarmMode::Advise).unwrap();
    let report = pagecache::evict(&path, ByteRange::ALL).unwrap();
    assert_eq!(report.after.total_pages, 0);
    let locked = pagecache::lock(&path, ByteRange::ALL).unwrap();
    assert!(locked.is_empty());
    assert_eq!(locked.locked_bytes(), 0);
    // An empty range at the end of a non-empty file is fine too.
    let path = write_file(dir.path(), "small", 10);
    let r = pagecache::residency(&path, ByteRange::new(10, 0)).unwrap();
    assert_eq!(r.total_pages, 0);
}

#[test]
fn file_and_descriptor_targets_match_paths() {
    let dir = scratch_dir();
    let path = write_file(dir.path(), "data", 3 * page() + 5);
    let mut file = File::open(&path).unwrap();
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(17)).unwrap();
    let by_path = pagecache::residency(&path, ByteRange::ALL).unwrap();
    let by_file = pagecache::residency(&file, ByteRange::ALL).unwrap();
    let by_fd = pagecache::residency(file.as_fd(), ByteRange::ALL).unwrap();
    assert_eq!(by_path, by_file);
    assert_eq!(by_path, by_fd);
    assert_eq!(by_path.total_pages, 4);
    assert_eq!(std::io::Seek::stream_position(&mut file).unwrap(), 17, "offset untouched");
}

#[test]
fn bad_input_gives_clear_errors() {
    let dir = scratch_dir();
    let missing = dir.path().join("missing");
    let e = pagecache::residency(&missing, ByteRange::ALL).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    assert!(e.to_string().contains("missing"), "{e}");

    let e = pagecache::residency(dir.path(), ByteRange::ALL).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EISDIR), "{e}");

    let path = write_file(dir.path(), "ten", 10);
    let e = pagecache::residency(&path, ByteRange::new(5, 10)).unwrap_err();
    assert!(matches!(e, Error::OutOfRange { offset: 5, len: 10, file_len: 10 }), "{e}");
    let e = pagecache::evict(&path, ByteRange::from_offset(11)).unwrap_err();
    assert!(matches!(e, Error::OutOfRange { .. }), "{e}");
    let e = pagecache::warm(&path, ByteRange::new(u64::MAX, 1), WarmMode::Read).unwrap_err();
    assert!(matches!(e, Error::Overflow { .. }), "{e}");
    let e = pagecache::lock(&path, ByteRange::new(0, 11)).unwrap_err();
    assert!(matches!(e, Error::OutOfRange { .. }), "{e}");

    // A socket cannot be opened by anyone, root included.
    let socket = dir.path().join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let e = pagecache::residency(&socket, ByteRange::ALL).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "{e}");

    // A FIFO is refused, not waited on.
    let fifo = dir.path().join("fifo");
    if Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
        let e = pagecache::residency(&fifo, ByteRange::ALL).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    let unreadable = write_file(dir.path(), "unreadable", 10);
    fs::set_permissions(&unreadable, fs::Permissions::from_mode(0o000)).unwrap();
    match pagecache::residency(&unreadable, ByteRange::ALL) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}"),
        Ok(_) => eprintln!(
            "*** NOTE: running with CAP_DAC_OVERRIDE (root): a mode-000 file is readable; \
             the unprivileged case is covered by unprivileged_callers_get_unknown_not_all"
        ),
    }
}

#[test]
fn lock_keeps_pages_resident_until_dropped() {
    let dir = scratch_dir();
    let len = 4 * MIB;
    let path = write_file(dir.path(), "data", len);
    if !evict_or_explain(&path) {
        return;
    }
    let range = ByteRange::new(MIB, MIB);
    let locked = match pagecache::lock(&path, range) {
        Ok(locked) => locked,
        Err(e) => {
            eprintln!("*** NOTE: mlock refused here ({e}); checking the error only");
            assert!(matches!(e.raw_os_error(), Some(libc::ENOMEM | libc::EPERM | libc::EAGAIN)));
            return;
        }
    };
    assert_eq!((locked.offset(), locked.len(), locked.locked_bytes()), (MIB, MIB, MIB));
    let locked_pages = MIB / page();
    let r = pagecache::residency(&path, range).unwrap();
    assert_eq!(r.cached_pages, Some(locked_pages));
    // Locked pages survive eviction.
    let report = pagecache::evict(&path, ByteRange::ALL).unwrap();
    assert!(report.after.cached_pages.unwrap() >= locked_pages);
    assert_eq!(pagecache::residency(&path, range).unwrap().cached_pages, Some(locked_pages));
    drop(locked);
    let report = pagecache::evict(&path, ByteRange::ALL).unwrap();
    assert!(report.after.cached_pages.unwrap() * 100 <= report.after.total_pages);
    // Explicit unlock reports errors instead of swallowing them.
    pagecache::lock(&path, range).unwrap().unlock().unwrap();
}

#[test]
fn drop_system_works_or_says_why() {
    // Dropping the whole machine's cache slows everyone else down: do it only when asked.
    if std::env::var_os("GPUMAP_TEST_DROP_SYSTEM").is_none() {
        eprintln!(
            "*** SKIP: drop_system(…) for real needs GPUMAP_TEST_DROP_SYSTEM=1 (it empties \
             the whole machine's page cache); the unprivileged error is checked by \
             unprivileged_callers_get_unknown_not_all"
        );
        return;
    }
    match pagecache::drop_system(false) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("*** NOTE: drop_system refused: {e}");
            assert!(e.to_string().contains("CAP_SYS_ADMIN"), "{e}");
        }
    }
}

/// The Linux 5.2 `mincore` trap: as an unprivileged user, a file we may neither write nor own
/// must come back "unknown", never "all resident". Runs this test binary again as `nobody`.
#[test]
fn unprivileged_callers_get_unknown_not_all() {
    const CHILD: &str = "GPUMAP_PAGECACHE_CHILD_FILES";
    if let Some(files) = std::env::var_os(CHILD) {
        for path in std::env::split_paths(&files) {
            for choice in [MethodChoice::Auto, MethodChoice::Mincore] {
                let line = match pagecache::residency_with(&path, ByteRange::ALL, choice) {
                    Ok(r) => describe(&r),
                    Err(e) => format!("error {e}"),
                };
                println!("CHILD {} {choice:?} {line}", path.display());
            }
        }
        match pagecache::drop_system(false) {
            Ok(()) => println!("CHILD drop ok"),
            Err(e) => println!("CHILD drop {:?} {e}", e.raw_os_error()),
        }
        return;
    }
    if gpumap_is_root() {
        run_as_nobody(CHILD);
    } else {
        eprintln!("*** NOTE: not root; checking the trap as the current user only");
        // A root-owned, non-writable file: /etc/passwd is on every Linux system.
        let r = pagecache::residency("/etc/passwd", ByteRange::ALL).unwrap();
        assert!(!r.is_known() && r.unknown_reason.is_some(), "{r:?}");
    }
}

fn describe(r: &Residency) -> String {
    match r.cached_pages {
        Some(c) => format!("known {c}/{}", r.total_pages),
        None => format!("unknown {}", r.unknown_reason.as_deref().unwrap_or("")),
    }
}

fn gpumap_is_root() -> bool {
    // Owner of a fresh file is our effective uid.
    let dir = scratch_dir();
    let path = write_file(dir.path(), "whoami", 1);
    std::os::unix::fs::MetadataExt::uid(&fs::metadata(path).unwrap()) == 0
}

fn run_as_nobody(child_var: &str) {
    const NOBODY: u32 = 65534;
    let dir = scratch_dir();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let foreign = write_file(dir.path(), "foreign", 8 * page());
    fs::set_permissions(&foreign, fs::Permissions::from_mode(0o644)).unwrap();
    let writable = write_file(dir.path(), "writable", 8 * page());
    fs::set_permissions(&writable, fs::Permissions::from_mode(0o666)).unwrap();
    let owned = write_file(dir.path(), "owned", 8 * page());
    std::os::unix::fs::chown(&owned, Some(NOBODY), Some(NOBODY)).unwrap();
    // Make residency recognisable: all cached (just written), then half evicted.
    for path in [&foreign, &writable, &owned] {
        pagecache::evict(path, ByteRange::new(0, 4 * page())).unwrap();
    }
    let expected = cached(&foreign);

    let exe = std::env::current_exe().unwrap();
    let files = std::env::join_paths([&foreign, &writable, &owned]).unwrap();
    let output = Command::new(&exe)
        .args(["--exact", "unprivileged_callers_get_unknown_not_all", "--nocapture"])
        .env(child_var, files)
        .uid(NOBODY)
        .gid(NOBODY)
        .output();
    let output = match output {
        Ok(o) => o,
        Err(e) => {
            eprintln!("*** SKIP: cannot run the test binary as nobody ({e})");
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("CHILD ")).collect();
    if lines.is_empty() {
        eprintln!(
            "*** SKIP: the test binary did not run as nobody (is {} readable by all?): {}",
            exe.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        return;
    }
    let find = |path: &Path, choice: &str| -> String {
        let prefix = format!("CHILD {} {choice} ", path.display());
        lines
            .iter()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no line for {prefix} in {stdout}"))
            .to_owned()
    };
    for choice in ["Auto", "Mincore"] {
        let foreign_line = find(&foreign, choice);
        assert!(foreign_line.starts_with("unknown "), "{choice}: {foreign_line}");
        assert!(foreign_line.contains("owns or may write"), "{foreign_line}");
        let want = format!("known {expected}/8");
        assert_eq!(find(&writable, choice), want, "{choice}: writable by nobody");
        assert_eq!(find(&owned, choice), want, "{choice}: owned by nobody");
    }
    let drop_line = lines.iter().find(|l| l.starts_with("CHILD drop")).unwrap();
    assert!(drop_line.contains("CAP_SYS_ADMIN"), "{drop_line}");
    assert!(!drop_line.contains("drop ok"));
}

// `Command::uid` lives in an extension trait.
use std::os::unix::process::CommandExt as _;

/// Cross-check with util-linux `fincore` on the same snapshot.
#[test]
fn resident_pages_match_fincore() {
    let fincore = Path::new("/usr/bin/fincore");
    let fincore = if fincore.exists() { fincore.to_path_buf() } else { PathBuf::from("fincore") };
    let probe = Command::new(&fincore).arg("--version").output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        let message = "util-linux `fincore` not found: the cross-check with fincore did NOT run";
        if std::env::var("GPUMAP_REQUIRE_FINCORE").as_deref() == Ok("1") {
            panic!("{message}, and GPUMAP_REQUIRE_FINCORE=1 requires it");
        }
        eprintln!(
            "\n*** SKIP *** {message} (install util-linux; CI sets GPUMAP_REQUIRE_FINCORE=1)\n"
        );
        return;
    }

    let dir = scratch_dir();
    let p = page();
    let empty = dir.path().join("empty");
    File::create(&empty).unwrap();
    let one_byte = write_file(dir.path(), "one_byte", 1);
    let cached_file = write_file(dir.path(), "cached", 3 * p + 100);
    let half = write_file(dir.path(), "half", 16 * MIB);
    let evicted = write_file(dir.path(), "evicted", 2 * MIB + 1);
    let sparse = dir.path().join("sparse");
    {
        let f = OpenOptions::new().create(true).truncate(true).write(true).open(&sparse).unwrap();
        f.set_len(8 * MIB).unwrap();
        f.write_all_at(&vec![1u8; MIB as usize], 4 * MIB).unwrap();
        f.sync_all().unwrap();
    }
    for path in [&half, &evicted, &sparse] {
        pagecache::evict(path, ByteRange::ALL).unwrap();
    }
    read_exactly(&half, 0, 8 * MIB);
    read_exactly(&sparse, 3 * MIB, 2 * MIB);

    let files = [&empty, &one_byte, &cached_file, &half, &evicted, &sparse];
    let ours_before: Vec<Residency> =
        files.iter().map(|f| pagecache::residency(*f, ByteRange::ALL).unwrap()).collect();
    let output = Command::new(&fincore)
        .args(["--bytes", "--noheadings", "--output", "RES,PAGES,SIZE,FILE", "--raw"])
        .args(files)
        .output()
        .unwrap();
    assert!(output.status.success(), "fincore: {}", String::from_utf8_lossy(&output.stderr));
    let ours_after: Vec<Residency> =
        files.iter().map(|f| pagecache::residency(*f, ByteRange::ALL).unwrap()).collect();
    assert_eq!(ours_before, ours_after, "the snapshot changed while fincore ran");
    let by_mincore: Vec<Residency> = files
        .iter()
        .map(|f| pagecache::residency_with(*f, ByteRange::ALL, MethodChoice::Mincore).unwrap())
        .collect();

    let stdout = String::from_utf8(output.stdout).unwrap();
    let rows: Vec<Vec<&str>> = stdout.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(rows.len(), files.len(), "fincore printed:\n{stdout}");
    let mut nonzero = 0;
    for ((row, ours), mincore) in rows.iter().zip(&ours_before).zip(&by_mincore) {
        let [res, pages, size, file] = row[..] else { panic!("odd fincore row {row:?}") };
        let (res, pages, size): (u64, u64, u64) =
            (res.parse().unwrap(), pages.parse().unwrap(), size.parse().unwrap());
        let context = format!("{file}: fincore RES={res} PAGES={pages} SIZE={size}, ours {ours:?}");
        assert_eq!(ours.cached_pages, Some(pages), "{context}");
        assert_eq!(mincore.cached_pages, Some(pages), "mincore: {context}");
        assert_eq!(ours.cached_bytes(), Some(res), "{context}");
        assert_eq!(ours.file_size, size, "{context}");
        nonzero += u64::from(pages > 0);
    }
    assert!(nonzero >= 3, "the snapshot should have several partly cached files:\n{stdout}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Any range either covers exactly the pages it touches, or is refused because it runs
    /// past the end of the file; both methods agree on every count.
    #[test]
    fn ranges_cover_the_pages_they_touch(
        size in 0u64..(5 * 4096 + 3),
        offset in 0u64..(6 * 4096),
        len in proptest::option::of(0u64..(6 * 4096)),
    ) {
        let dir = scratch_dir();
        let path = write_file(dir.path(), "f", size);
        let range = ByteRange { offset, len };
        let result = pagecache::residency(&path, range);
        let end = offset + len.unwrap_or(size.saturating_sub(offset));
        if offset > size || end > size {
            let refused = matches!(result, Err(Error::OutOfRange { .. }));
            proptest::prop_assert!(refused, "{result:?}");
            return Ok(());
        }
        let r = result.unwrap();
        let p = page();
        let expected_pages = if end == offset { 0 } else { end.div_ceil(p) - offset / p };
        proptest::prop_assert_eq!(r.total_pages, expected_pages);
        proptest::prop_assert_eq!(r.len, end - offset);
        let mincore = pagecache::residency_with(&path, range, MethodChoice::Mincore).unwrap();
        proptest::prop_assert_eq!(r.cached_pages, mincore.cached_pages);
        let map = pagecache::residency_map(&path, range).unwrap();
        proptest::prop_assert_eq!(map.residency.cached_pages, r.cached_pages);
        let run_bytes: u64 = map.resident_runs.iter().map(|run| run.len).sum();
        proptest::prop_assert!(run_bytes <= expected_pages * p);
    }
}
