//! The `gpumap` command against hostile input: special files, sizes meant to exhaust memory,
//! writes that cannot succeed, limits.

mod common;

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
