//! The `gpumap` command against hostile input: special files, sizes meant to exhaust memory,
//! writes that cannot succeed, limits.

mod common;
mod sigint;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn gpumap() -> Command {
    Command::new(common::gpumap_bin())
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("gpumap runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn scratch() -> tempfile::TempDir {
    common::scratch()
}

/// Runs `cmd`, killing it after 20 s: a command that blocks on a FIFO fails instead of hanging.
fn run_bounded(cmd: &mut Command) -> (i32, String, String) {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{cmd:?} still running after 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[test]
fn special_files_are_refused_clearly_and_at_once() {
    let dir = scratch();
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for (args, path, what) in [
        (&["read"][..], fifo.as_path(), "is a FIFO"),
        (&["write", "--size", "4K"][..], fifo.as_path(), "is a FIFO"),
        (&["read", "--verify-pattern"][..], Path::new("/dev/zero"), "is a character device"),
        (&["read", "--verify-pattern"][..], Path::new("/proc/self/status"), "procfs"),
        (&["write", "--size", "4K", "--truncate"][..], Path::new("/dev/null"), "character device"),
        // Checked before the free space (a pseudo file system has none to report).
        (&["write", "--size", "1PiB"][..], Path::new("/proc/self/status"), "procfs"),
        (&["bench", "--host", "--quick"][..], fifo.as_path(), "is a FIFO"),
        (&["bench", "--host", "--quick"][..], Path::new("/proc/self/status"), "procfs"),
    ] {
        let (code, out, err) = run_bounded(gpumap().args(args).arg("--json").arg(path));
        assert_eq!(code, 1, "{args:?} {}: {err}", path.display());
        assert_eq!(json(&out)["error"]["kind"], "not_regular_file", "{out}");
        assert!(err.contains(what) && err.contains("not a regular file"), "{err}");
    }
}

#[test]
fn sizes_are_bounded_before_anything_is_allocated() {
    let dir = scratch();
    let file = dir.path().join("f");
    std::fs::write(&file, vec![0u8; 8192]).unwrap();
    for (args, option) in [
        (&["pagecache", "--map", "--map-width", "100000000000"][..], "--map-width"),
        (&["pagecache", "--map", "--map-width", "4097"][..], "--map-width"),
        (&["pagecache", "--map", "--map-width", "0"][..], "--map-width"),
        (&["read", "--task-size", "0"][..], "--task-size"),
        (&["read", "--threads", "0"][..], "--threads"),
        (&["read", "--threads", "100000"][..], "--threads"),
        (&["bench", "--threads", "1,5000"][..], "--threads"),
        (&["bench", "--threads", "+8"][..], "--threads"),
        (&["bench", "--threads", "4,-1"][..], "--threads"),
        (&["map", "--threads", "+8", "--random", "1"][..], "--threads"),
    ] {
        let (code, _, err) = run_bounded(gpumap().args(args).arg(&file));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(option), "{args:?}: {err}");
    }
    // The widest bar that is allowed works.
    let (code, out, err) =
        run_bounded(gpumap().args(["pagecache", "--map", "--map-width", "4096"]).arg(&file));
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l.trim_start().len() > 4096), "{out}");
    // --task-size 0 is refused as GPUMAP_TASK_SIZE=0 is.
    let (code, _, err) = run(gpumap().arg("read").arg(&file).env("GPUMAP_TASK_SIZE", "0"));
    assert_eq!(code, 1);
    assert!(err.contains("GPUMAP_TASK_SIZE"), "{err}");
}

#[test]
fn write_checks_what_it_needs_before_touching_the_file() {
    let dir = scratch();
    let new = dir.path().join("new");
    // No such GPU (or no GPU at all): nothing is created.
    let (code, _, err) = run(gpumap().args(["write", "--size", "1M", "--device", "77"]).arg(&new));
    assert_eq!(code, 1, "{err}");
    assert!(!new.exists(), "a failed write left {} behind", new.display());
    // An offset and size past what a file can hold.
    let (code, _, err) = run(gpumap().args(["write", "--size", "1M", "--offset", "15E"]).arg(&new));
    assert_eq!(code, 1, "{err}");
    assert!(!new.exists());
    // An existing file is not truncated by a write that cannot run.
    let keep = dir.path().join("keep");
    std::fs::write(&keep, b"precious").unwrap();
    let (code, _, _) =
        run(gpumap().args(["write", "--size", "1M", "--truncate", "--device", "77"]).arg(&keep));
    assert_eq!(code, 1);
    assert_eq!(std::fs::read(&keep).unwrap(), b"precious");
    // A directory is refused before anything happens to it.
    let (code, _, err) = run(gpumap().args(["write", "--size", "1M"]).arg(dir.path()));
    assert_eq!(code, 1);
    assert!(err.contains("Is a directory"), "{err}");
}

#[test]
fn a_write_that_fails_midway_leaves_no_new_file() {
    let dir = scratch();
    let new = dir.path().join("new");
    // RLIMIT_FSIZE at 1 MiB with SIGXFSZ ignored: the write fails with EFBIG after the file was
    // created and its first megabyte written (as ENOSPC would).
    let script = r#"trap '' XFSZ; ulimit -f 1024; exec "$0" "$@""#;
    let (code, out, err) = run(Command::new("bash")
        .args(["-c", script])
        .arg(common::gpumap_bin())
        .args(["write", "--host", "--size", "8M", "--json"])
        .arg(&new));
    assert_eq!(code, 1, "{out} {err}");
    assert_eq!(json(&out)["error"]["errno"], libc::EFBIG, "{out}");
    assert!(!new.exists(), "the failed write left {} behind", new.display());
    // A file that was there stays (the part written is the caller's to judge).
    let old = dir.path().join("old");
    std::fs::write(&old, b"x").unwrap();
    let (code, _, _) = run(Command::new("bash")
        .args(["-c", script])
        .arg(common::gpumap_bin())
        .args(["write", "--host", "--size", "8M"])
        .arg(&old));
    assert_eq!(code, 1);
    assert!(old.exists());
}

#[test]
fn lock_beyond_rlimit_memlock_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data");
    std::fs::write(&file, vec![1u8; 4 << 20]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    // A 1 MiB limit; as root, run as nobody so that CAP_IPC_LOCK does not lift it.
    let mut cmd = Command::new("bash");
    cmd.args(["-c", r#"ulimit -l 1024; exec "$0" "$@""#]);
    if running_as_root() {
        cmd.args(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
    }
    let (code, out, err) = run_bounded(
        cmd.arg(common::gpumap_bin()).args(["pagecache", "--lock", "--json"]).arg(&file),
    );
    assert_eq!(code, 1, "{out} {err}");
    let doc = json(&out);
    let error = &doc["errors"][0]["error"];
    assert_eq!(error["kind"], "resource_limit", "{out}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("RLIMIT_MEMLOCK") && message.contains("4194304"), "{message}");
    assert!(err.contains("RLIMIT_MEMLOCK"), "{err}");
}

fn running_as_root() -> bool {
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0
}

/// Issue 20, round two: a report written to a closed standard output was lost with exit
/// status 0 (Rust's runtime puts /dev/null there before `main`). A user's own `>/dev/null`
/// stays a success.
#[test]
fn a_closed_standard_output_is_an_error_not_a_lost_report() {
    let dir = scratch();
    let file = dir.path().join("data");
    let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&file, &data).unwrap();
    for args in [&["read", "--host"][..], &["read", "--host", "--json"][..]] {
        let (code, _, err) = run_bounded(
            Command::new("sh")
                .args(["-c", r#"exec "$0" "$@" >&-"#])
                .arg(common::gpumap_bin())
                .args(args)
                .arg(&file),
        );
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains("standard output"), "{args:?}: {err}");
    }
    assert!(std::fs::read(&file).unwrap() == data);
    let (code, _, err) = run_bounded(
        Command::new("sh")
            .args(["-c", r#"exec "$0" "$@" >/dev/null"#])
            .arg(common::gpumap_bin())
            .args(["read", "--host"])
            .arg(&file),
    );
    assert_eq!(code, 0, "a redirection to /dev/null is the user's choice: {err}");
    // A write with standard output closed still writes its file, then says the report is lost.
    let out = dir.path().join("written");
    let (code, _, err) = run_bounded(
        Command::new("sh")
            .args(["-c", r#"exec "$0" "$@" >&-"#])
            .arg(common::gpumap_bin())
            .args(["write", "--host", "--size", "1M"])
            .arg(&out),
    );
    assert_eq!(code, 1, "{err}");
    assert_eq!(std::fs::metadata(&out).unwrap().len(), 1 << 20);
}

/// `pagecache` on a /proc file was a 0-byte success, where `read` and `map` refuse it.
#[test]
fn pagecache_refuses_procfs_files_as_read_does() {
    let (code, out, err) = run_bounded(gpumap().args(["pagecache", "--json", "/proc/cpuinfo"]));
    assert_eq!(code, 1, "{out} {err}");
    assert!(err.contains("procfs") && err.contains("not a regular file"), "{err}");
}

/// `bench` of an empty file printed 0.00 GB/s for every workload and exited 0.
#[test]
fn bench_refuses_an_empty_file() {
    let dir = scratch();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let (code, out, err) = run_bounded(gpumap().args(["bench", "--host", "--quick"]).arg(&empty));
    assert_eq!(code, 1, "{out} {err}");
    assert!(err.contains("is empty"), "{err}");
    assert!(!out.contains("0.00"), "{out}");
}

/// `bench --jsonl` into a path it cannot write failed after every workload had run.
#[test]
fn bench_refuses_an_unwritable_jsonl_path_before_measuring() {
    let dir = scratch();
    let data = dir.path().join("data");
    std::fs::write(&data, vec![1u8; 1 << 20]).unwrap();
    let (code, out, err) = run_bounded(
        gpumap()
            .args(["bench", "--host", "--quick", "--json", "--jsonl"])
            .arg(dir.path())
            .arg(&data),
    );
    assert_eq!(code, 1, "{out} {err}");
    assert!(!out.contains("workload"), "nothing measured first: {out}");
    assert_eq!(json(out.lines().last().unwrap())["error"]["kind"], "io", "{out}");
    assert!(err.contains("Is a directory"), "{err}");
}

/// A usage error as JSON kept only clap's first line ("cannot be used with:"), not the
/// arguments it named.
#[test]
fn usage_errors_as_json_name_the_arguments() {
    let dir = scratch();
    let file = dir.path().join("f");
    std::fs::write(&file, vec![0u8; 4096]).unwrap();
    let (code, out, _) =
        run(gpumap().args(["pagecache", "--lock", "--warm", "--evict", "--json"]).arg(&file));
    assert_eq!(code, 2, "{out}");
    let message = json(&out)["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("--lock") && message.contains("--warm"), "{message}");
    assert!(!message.contains("Usage:"), "{message}");
}

/// `write --size` far past the free space streamed until the disk was full; it is refused
/// before the file is created.
#[test]
fn write_refuses_a_size_past_the_free_space_before_creating_anything() {
    let dir = scratch();
    let new = dir.path().join("huge");
    let (code, out, err) =
        run_bounded(gpumap().args(["write", "--host", "--size", "1PiB", "--json"]).arg(&new));
    assert_eq!(code, 1, "{out} {err}");
    assert_eq!(json(&out)["error"]["kind"], "resource_limit", "{out}");
    assert!(err.contains("free space"), "{err}");
    assert!(!new.exists(), "the refused write created {}", new.display());
    // An existing file is checked for what the write adds past its end only.
    let old = dir.path().join("old");
    std::fs::write(&old, vec![7u8; 1 << 20]).unwrap();
    let (code, _, err) = run_bounded(gpumap().args(["write", "--host", "--size", "1M"]).arg(&old));
    assert_eq!(code, 0, "{err}");
}

/// Ctrl-C during `write` of a new file left the partial file behind; like a failed write, it
/// is removed, and the process ends by the signal as it would have.
#[test]
fn an_interrupted_write_of_a_new_file_leaves_nothing_behind() {
    let dir = scratch();
    let new = dir.path().join("interrupted");
    // Large enough to be still running when the signal comes, small enough to fit.
    let free = gpumap::io::available_space(dir.path()).unwrap();
    let size = (free / 2).min(16 << 30);
    if size < (1 << 30) {
        eprintln!(
            "SKIP an_interrupted_write_of_a_new_file_leaves_nothing_behind: {free} bytes free"
        );
        return;
    }
    let mut child = sigint::with_default_sigint(&mut gpumap())
        .args(["write", "--host", "--threads", "1", "--size"])
        .arg(size.to_string())
        .arg(&new)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(&new).map_or(0, |m| m.len()) == 0 {
        assert!(Instant::now() < deadline, "the write never started");
        assert!(child.try_wait().unwrap().is_none(), "the write ended before the signal");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}");
    assert!(!new.exists(), "the interrupted write left {} behind", new.display());
}

/// Reading a whole 64 GiB (sparse) file failed with "mmap anonymous buffer failed", with no
/// word of reading a part instead.
#[test]
fn a_read_too_large_for_memory_says_how_to_read_less() {
    let overcommit = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap_or_default();
    if overcommit.trim() == "1" {
        eprintln!("SKIP a_read_too_large_for_memory_says_how_to_read_less: overcommit is on");
        return;
    }
    let dir = scratch();
    let sparse = dir.path().join("sparse");
    let file = std::fs::File::create(&sparse).unwrap();
    if file.set_len(1 << 40).is_err() {
        eprintln!("SKIP a_read_too_large_for_memory_says_how_to_read_less: no 1 TiB sparse file");
        return;
    }
    let (code, out, err) = run_bounded(gpumap().args(["read", "--host", "--json"]).arg(&sparse));
    assert_eq!(code, 1, "{out} {err}");
    assert!(err.contains("--offset") && err.contains("--len"), "{err}");
    assert!(err.contains("1 TiB"), "{err}");
}

/// `gpumap write` from GPU memory (host memory without a GPU) ends with no warning: on the
/// H100 its streams' events were destroyed after their context, as the process exited, and
/// every run printed `warning: cuEventDestroy failed: unknown`.
#[test]
fn a_write_ends_without_warnings() {
    let dir = common::scratch();
    let file = dir.path().join("w");
    let (code, _, err) = run(gpumap().args(["write", "--size", "64MiB"]).arg(&file));
    assert_eq!(code, 0, "{err}");
    assert!(!err.to_lowercase().contains("warn"), "{err}");
    assert!(!err.contains("failed"), "{err}");
}

/// A standard error that cannot be written (full, or a pipe whose reader left) panicked the
/// command (tracing-subscriber reports a failed write with `eprintln!`), losing the report
/// on standard output; the notes are dropped now and the command runs to its end.
#[test]
fn an_unwritable_standard_error_loses_notes_not_the_command() {
    let dir = scratch();
    let file = dir.path().join("data");
    std::fs::write(&file, vec![5u8; 100_000]).unwrap();
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    // No --host: the "no GPU" note goes to standard error where there is no GPU.
    let (code, out, _) =
        run_bounded(gpumap().args(["read", "--json", "-v"]).arg(&file).stderr(full));
    assert_eq!(code, 0, "{out}");
    assert_eq!(json(&out)["bytes"], 100_000, "{out}");
}

/// `ulimit -f` killed a write with SIGXFSZ (status 153): no report, and `bench`'s scratch file
/// left behind. The write now fails with EFBIG, reported with its file and offset, and the
/// scratch file is removed.
#[test]
fn a_write_past_the_file_size_limit_is_an_error_not_a_kill() {
    let dir = scratch();
    let limited = |args: &[&str]| {
        let mut cmd = Command::new("sh");
        // 1024 blocks of 1 KiB (sh's unit for -f) = 1 MiB.
        cmd.arg("-c").arg("ulimit -f 1024 && exec \"$0\" \"$@\"").arg(common::gpumap_bin());
        cmd.args(args).current_dir(dir.path());
        run_bounded(&mut cmd)
    };
    let (code, out, err) = limited(&["write", "--host", "--json", "--size", "4MiB", "big"]);
    assert_eq!(code, 1, "{out} {err}");
    let error = &json(&out)["error"];
    assert!(error["message"].as_str().unwrap().contains("big"), "{out}");
    assert!(err.contains("File too large"), "{err}");
    std::fs::write(dir.path().join("data"), vec![1u8; 8 << 20]).unwrap();
    let (code, out, err) = limited(&["bench", "--host", "--quick", "--json", "data"]);
    assert_ne!(code, 128 + libc::SIGXFSZ, "{out} {err}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("scratch"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?} ({err})");
}

/// A file name that is not UTF-8 failed `--json` after the work was done ("cannot encode
/// JSON"); it is written with U+FFFD for the bytes that are not.
#[test]
fn json_reports_name_files_whose_names_are_not_utf8() {
    use std::os::unix::ffi::OsStrExt;
    let dir = scratch();
    let name = std::ffi::OsStr::from_bytes(b"new\xffw");
    let (code, out, err) = run_bounded(
        gpumap().args(["write", "--host", "--json", "--size", "64KiB"]).arg(dir.path().join(name)),
    );
    assert_eq!(code, 0, "{out} {err}");
    assert!(json(&out)["file"].as_str().unwrap().ends_with("new\u{fffd}w"), "{out}");
    let (code, out, err) =
        run_bounded(gpumap().args(["pagecache", "-r", "--json"]).arg(dir.path()));
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.contains("new\u{fffd}w"), "{out}");
}

/// Usage errors that said something else: `map --block 0` / `--row-size 0` were "does not fit
/// in every file"; `pagecache --dentries` beside paths was silently ignored (clap's `requires`
/// let it through), where `--wait` without `--warm` is refused.
#[test]
fn usage_errors_say_what_is_wrong() {
    let dir = scratch();
    let file = dir.path().join("data");
    std::fs::write(&file, vec![0u8; 100_000]).unwrap();
    for (args, said) in [
        (&["map", "--host", "--random", "10", "--block", "0"][..], "0: must be at least 1 byte"),
        (&["map", "--host", "--rows", "10", "--row-size", "0"], "0: must be at least 1 byte"),
        (&["pagecache", "--dentries"], "--dentries applies to --drop-all only"),
    ] {
        let (code, _, err) = run_bounded(gpumap().args(args).arg(&file));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(said), "{args:?}: {err}");
    }
}
