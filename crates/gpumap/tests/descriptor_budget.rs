//! The descriptors gpumap opens for its I/O threads' small reads (decision 0022): they read the
//! same bytes, stay within their budget (a quarter of the open-files limit) however many files
//! are open, and are closed with their file. Its own test binary, re-run as a child under a
//! low `ulimit -n`: the budget follows the process's limit, read once.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use gpumap::io::{FileHandle, IoPool};

const CHILD: &str = "GPUMAP_DESCRIPTOR_BUDGET_CHILD";
const LIMIT: usize = 96;
const THREADS: usize = 8;

/// The descriptors open on files under `dir`. Only those: other threads open and close
/// descriptors of their own at any time (glibc reads `/sys/devices/system/cpu/online` on a
/// new thread's first allocation), which a count of all of them would catch now and then.
fn descriptors_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

fn bytes_of(k: usize) -> Vec<u8> {
    (0..(256 << 10)).map(|i: usize| (i.wrapping_mul(31) ^ k.wrapping_mul(97)) as u8).collect()
}

fn open(pool: &Arc<IoPool>, path: &Path) -> FileHandle {
    let mut options = FileHandle::options().unwrap();
    // Tasks of 4 KiB: every read is many small reads on the pool's threads.
    options.pool(Arc::clone(pool)).task_size(4096);
    options.open(path, "r").unwrap()
}

fn read_back(handle: &FileHandle, k: usize) {
    let mut buf = vec![0u8; 256 << 10];
    assert_eq!(handle.read(&mut buf, 0).unwrap(), buf.len());
    assert!(buf == bytes_of(k), "file {k} read back wrong");
}

#[test]
fn extra_descriptors_stay_within_the_budget_and_close_with_their_file() {
    if !Path::new("/proc/self/fd").is_dir() {
        eprintln!("SKIPPED: no /proc/self/fd here, so no descriptors of their own to count");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {LIMIT} && exec \"$0\" --exact child --ignored --nocapture"))
        .arg(&exe)
        .env(CHILD, "1")
        .output()
        .unwrap();
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the child failed:\n{log}");
    assert!(log.contains("1 passed"), "the child test did not run:\n{log}");
}

#[test]
#[ignore = "run by extra_descriptors_stay_within_the_budget_and_close_with_their_file, under a low ulimit -n"]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let open_descriptors = || descriptors_under(&root);
    let paths: Vec<_> = (0..12)
        .map(|k| {
            let path = dir.path().join(format!("f{k}"));
            std::fs::write(&path, bytes_of(k)).unwrap();
            path
        })
        .collect();
    let pool = Arc::new(IoPool::new(THREADS).unwrap());
    let before = open_descriptors();
    let handles: Vec<_> = paths.iter().map(|p| open(&pool, p)).collect();
    let own = open_descriptors() - before;
    for (k, handle) in handles.iter().enumerate() {
        read_back(handle, k);
    }
    let extra = open_descriptors() - before - own;
    assert!(extra <= LIMIT / 4, "{extra} extra descriptors, over a budget of {}", LIMIT / 4);
    // The readers got descriptors of their own (how many threads took part in each read is
    // the scheduler's choice, so only more than one is asked for).
    assert!(extra >= 2, "only {extra} extra descriptors: the threads shared one");
    drop(handles);
    assert_eq!(open_descriptors(), before, "descriptors left open after their files closed");
    // The budget is given back with the files: new files get descriptors again.
    let again: Vec<_> = paths.iter().map(|p| open(&pool, p)).collect();
    let own = open_descriptors() - before;
    for (k, handle) in again.iter().enumerate() {
        read_back(handle, k);
    }
    let extra = open_descriptors() - before - own;
    assert!((2..=LIMIT / 4).contains(&extra), "{extra} extra descriptors after the first closed");
}
