//! `gpumap bench`: its records printed once, and a scratch file that never is the input and
//! never stays behind (errors, Ctrl-C).

mod common;
mod sigint;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn gpumap() -> Command {
    Command::new(common::gpumap_bin())
}

fn scratch() -> tempfile::TempDir {
    common::scratch()
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn input(dir: &Path, name: &str) -> (PathBuf, Vec<u8>) {
    let path = dir.join(name);
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    (path, data)
}

#[test]
fn records_print_once_and_the_input_survives_its_old_scratch_name() {
    let dir = scratch();
    // The name the scratch file used to get (with_extension): bench deleted its own input.
    let (file, data) = input(dir.path(), "data.gpumap-bench-write");
    let jsonl = dir.path().join("results.jsonl");
    let out = gpumap()
        .args(["bench", "--quick", "--host", "--threads", "1", "--json", "--jsonl"])
        .arg(&jsonl)
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed: Vec<serde_json::Value> =
        stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let appended: Vec<serde_json::Value> = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!printed.is_empty());
    assert_eq!(printed.len(), appended.len(), "each record once on stdout: {stdout}");
    let key = |r: &serde_json::Value| format!("{} {} {}", r["impl"], r["workload"], r["threads"]);
    for (p, a) in printed.iter().zip(&appended) {
        assert_eq!(p["schema"], 1, "{p}");
        assert_eq!(key(p), key(a));
    }
    assert!(printed.iter().any(|r| r["workload"] == "seq_write"), "{stdout}");
    assert_eq!(std::fs::read(&file).unwrap(), data, "the input was modified");
    assert_eq!(names(dir.path()), ["data.gpumap-bench-write", "results.jsonl"]);
}

#[test]
fn the_scratch_file_goes_on_ctrl_c() {
    let dir = scratch();
    let (file, data) = input(dir.path(), "data");
    // The quick bench's writes of 1 MiB take milliseconds: on a loaded machine the bench may
    // end before the signal lands, or before a scratch file is seen. Such a run proves only
    // that the file went on the way out; the bench is run again until Ctrl-C catches one.
    for _ in 0..50 {
        let mut child = sigint::with_default_sigint(&mut gpumap())
            .args(["bench", "--quick", "--host", "--threads", "1"])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        let scratch = loop {
            if let Some(name) = names(dir.path()).into_iter().find(|n| n.contains("gpumap-scratch"))
            {
                break Some(dir.path().join(name));
            }
            if child.try_wait().unwrap().is_some() {
                break None;
            }
            assert!(Instant::now() < deadline, "no scratch file after 120 s");
            std::thread::sleep(Duration::from_millis(1));
        };
        if let Some(scratch) = &scratch {
            let pid = libc::pid_t::try_from(child.id()).unwrap();
            // SAFETY: kill(2) takes no pointers; `pid` is our own child, not yet reaped.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
            let status = child.wait().unwrap();
            assert!(
                !scratch.exists(),
                "{} stayed behind ({status}; {:?})",
                scratch.display(),
                names(dir.path())
            );
            assert_eq!(names(dir.path()), ["data"]);
            assert_eq!(std::fs::read(&file).unwrap(), data);
            if status.signal().is_some() {
                assert_eq!(
                    status.signal(),
                    Some(libc::SIGINT),
                    "ended by Ctrl-C as without gpumap"
                );
                return;
            }
            assert!(status.success(), "the bench ended first, and well: {status}");
        } else {
            assert!(child.wait().unwrap().success(), "the bench ended before writing, and well");
            assert_eq!(names(dir.path()), ["data"]);
        }
    }
    panic!("in 50 runs the bench always ended before Ctrl-C reached it");
}

#[test]
fn the_scratch_file_goes_when_a_write_fails() {
    let dir = scratch();
    let (file, _) = input(dir.path(), "data");
    // RLIMIT_FSIZE of 2 MiB with SIGXFSZ ignored: the first 256 MiB write fails with EFBIG,
    // as on a full disk.
    let out = Command::new("bash")
        .args(["-c", r#"trap '' XFSZ; ulimit -f 2048; exec "$0" "$@""#])
        .arg(common::gpumap_bin())
        .args(["bench", "--quick", "--host", "--threads", "1"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("File too large"), "{stderr}");
    assert_eq!(names(dir.path()), ["data"]);
}
