//! The `gpumap` command as scripts use it: one size syntax, versioned JSON (errors included),
//! exit statuses, quiet and verbose runs, closed pipes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn gpumap() -> Command {
    Command::new(common::gpumap_bin())
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("gpumap runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {text}"))
}

fn scratch() -> tempfile::TempDir {
    common::scratch()
}

/// A file of `len` pattern bytes (`gpumap write`).
fn pattern_file(dir: &Path, name: &str, len: &str) -> PathBuf {
    let path = dir.join(name);
    let (code, _, err) = run(gpumap().args(["write", "--host", "--size", len]).arg(&path));
    assert_eq!(code, 0, "{err}");
    path
}

/// Whether this machine has a GPU gpumap can use (`gpumap info --json`).
fn has_gpu() -> bool {
    let (_, out, _) = run(gpumap().args(["info", "--json"]));
    json(&out)["cuda"]["available"] == true
}

#[test]
fn one_size_syntax_everywhere() {
    let dir = scratch();
    let file = pattern_file(dir.path(), "data", "5MiB");
    // dd: K/M/G are powers of 1024 with or without iB, powers of 1000 with B; any case.
    for (text, bytes) in [
        ("4MB", 4_000_000u64),
        ("4mb", 4_000_000),
        ("4M", 4 << 20),
        ("4mib", 4 << 20),
        ("3k", 3072),
        ("3KB", 3000),
    ] {
        let (code, out, err) =
            run(gpumap().args(["read", "--host", "--json", "--len", text]).arg(&file));
        assert_eq!(code, 0, "read --len {text}: {err}");
        assert_eq!(json(&out)["bytes"], bytes, "read --len {text}");
        let range = format!("0:{text}");
        let (code, out, err) =
            run(gpumap().args(["pagecache", "--json", "--range", &range]).arg(&file));
        assert_eq!(code, 0, "pagecache --range {range}: {err}");
        assert_eq!(json(&out)["files"][0]["residency"]["len"], bytes, "pagecache --range {range}");
    }
    let (code, _, err) = run(gpumap().args(["read", "--len", "4parsecs"]).arg(&file));
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(gpumap().args(["pagecache", "--range", "0:4parsecs"]).arg(&file));
    assert_eq!(code, 2, "{err}");
}

#[test]
fn json_documents_carry_the_schema_and_stable_objects() {
    let dir = scratch();
    let file = dir.path().join("data");
    let (code, out, err) =
        run(gpumap().args(["write", "--host", "--size", "1MiB", "--sync", "--json"]).arg(&file));
    assert_eq!(code, 0, "{err}");
    let write = json(&out);
    let (code, out, err) = run(gpumap().args(["read", "--json"]).arg(&file));
    assert_eq!(code, 0, "{err}");
    let read = json(&out);
    for (doc, op) in [(&write, "write"), (&read, "read")] {
        assert_eq!(doc["schema"], 1, "{doc}");
        assert_eq!(doc["op"], op);
        // Every field is there, null where it does not apply.
        for field in [
            "file",
            "offset",
            "bytes",
            "seconds",
            "gbps",
            "runs_gbps",
            "cold",
            "threads",
            "task_size",
            "verified",
            "durable",
        ] {
            assert!(doc.get(field).is_some(), "{op}: no {field}: {doc}");
        }
        let memory = &doc["memory"];
        assert!(memory["kind"] == "gpu" || memory["kind"] == "host", "{doc}");
        assert!(memory["name"].is_string() && memory.get("device").is_some(), "{doc}");
        assert_eq!(memory["device"].is_null(), memory["kind"] == "host", "{doc}");
        let path = &doc["transfer_path"];
        assert!(path["path"] == "posix" || path["path"] == "cufile", "{doc}");
        assert!(path["reason"].is_string(), "{doc}");
        assert!(doc["direct_io"]["enabled"].is_boolean(), "{doc}");
        assert!(doc["direct_io"]["reason"].is_string(), "{doc}");
    }
    assert_eq!(write["durable"], true);
    assert!(read["durable"].is_null() && read["verified"].is_null(), "{read}");
    assert_eq!(read["runs_gbps"].as_array().map(Vec::len), Some(1));
    // --host is what was asked for: no fallback reason.
    assert!(write["memory"]["fallback_reason"].is_null(), "{write}");
    let (_, out, _) = run(gpumap().args(["pagecache", "--json"]).arg(&file));
    assert_eq!(json(&out)["schema"], 1);
}

#[test]
fn with_json_errors_are_json_on_stdout_too() {
    let dir = scratch();
    let missing = dir.path().join("missing");
    let (code, out, err) = run(gpumap().args(["read", "--json"]).arg(&missing));
    assert_eq!(code, 1);
    let doc = json(&out);
    assert_eq!(doc["schema"], 1);
    assert_eq!(doc["error"]["kind"], "io");
    assert_eq!(doc["error"]["errno"], libc::ENOENT);
    assert!(doc["error"]["message"].as_str().unwrap().contains("missing"), "{out}");
    assert!(err.contains("No such file"), "{err}");
    // The OS error is shown once (the error's source is not repeated in its message).
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
    // Refused command lines too, with clap's status.
    let (code, out, _) = run(gpumap().args(["read", "--json", "--len", "lots"]).arg(&missing));
    assert_eq!(code, 2);
    assert_eq!(json(&out)["error"]["kind"], "usage");
    // Without --json, stdout stays empty.
    let (code, out, _) = run(gpumap().arg("read").arg(&missing));
    assert_eq!((code, out.as_str()), (1, ""));
    // A bad setting, as JSON, names its variable.
    let (code, out, _) = run(gpumap().args(["info", "--json"]).env("GPUMAP_NTHREADS", "5000"));
    assert_eq!(code, 1);
    let doc = json(&out);
    assert_eq!(doc["error"]["kind"], "invalid_config");
    assert!(doc["error"]["message"].as_str().unwrap().contains("GPUMAP_NTHREADS"), "{out}");
    assert!(doc["error"]["errno"].is_null());
}

#[test]
fn offsets_past_the_end_fail_the_same_with_and_without_len() {
    let dir = scratch();
    let file = dir.path().join("small");
    std::fs::write(&file, vec![7u8; 1000]).unwrap();
    for extra in [&[][..], &["--len", "0"][..], &["--len", "10"][..]] {
        let (code, out, err) = run(gpumap()
            .args(["read", "--host", "--json", "--offset", "2000"])
            .args(extra)
            .arg(&file));
        assert_eq!(code, 1, "{extra:?}: {out}");
        assert_eq!(json(&out)["error"]["kind"], "out_of_range", "{extra:?}");
        assert!(err.contains("1000 bytes"), "{err}");
    }
    // At the end: an empty read, either way.
    for extra in [&[][..], &["--len", "0"][..]] {
        let (code, out, err) = run(gpumap()
            .args(["read", "--host", "--json", "--offset", "1000"])
            .args(extra)
            .arg(&file));
        assert_eq!(code, 0, "{err}");
        assert_eq!(json(&out)["bytes"], 0);
    }
}

#[test]
fn a_reason_is_said_once_and_quiet_says_nothing() {
    let dir = scratch();
    let file = pattern_file(dir.path(), "data", "1MiB");
    let (code, out, err) = run(gpumap().arg("read").arg(&file));
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    // The result line names the memory; why there is no GPU is not repeated in it.
    assert!(!out.contains("searched") && !out.contains("not found") && out.len() < 200, "{out}");
    if !has_gpu() {
        assert_eq!(err.matches("host memory stands in").count(), 1, "{err}");
    }
    let (code, out, err) = run(gpumap().args(["-q", "read"]).arg(&file));
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 1);
    assert_eq!(err, "", "--quiet leaves stderr to errors");
    let (code, _, err) = run(gpumap().args(["read", "--quiet"]).arg(dir.path().join("gone")));
    assert_eq!(code, 1);
    assert!(err.contains("No such file"), "errors still show: {err}");
}

#[test]
fn diagnostics_go_through_the_log_levels() {
    let dir = scratch();
    let file = pattern_file(dir.path(), "data", "64KiB");
    // A library warning (more than four threads a CPU) shows by default, not with -q, nor
    // when GPUMAP_LOG asks for errors only.
    let cpus = std::thread::available_parallelism().unwrap().get();
    let too_many = (4 * cpus + 1).to_string();
    let many = || {
        let mut cmd = gpumap();
        cmd.env("GPUMAP_NTHREADS", &too_many).args(["read", "--host"]).arg(&file);
        cmd
    };
    let (code, _, err) = run(&mut many());
    assert_eq!(code, 0, "{err}");
    let setting = format!("GPUMAP_NTHREADS={too_many}");
    assert!(err.contains("gpumap: warning:") && err.contains(&setting), "{err}");
    let (_, _, err) = run(many().arg("-q"));
    assert!(!err.contains("warning"), "{err}");
    let (_, _, err) = run(many().env("GPUMAP_LOG", "error"));
    assert!(!err.contains("warning"), "{err}");
    // -v adds info (which path and why), -vv debug with each event's module.
    let (_, _, err) = run(gpumap().args(["read", "--host"]).arg(&file));
    assert!(!err.contains("info:"), "{err}");
    let (_, _, err) = run(gpumap().args(["-v", "read", "--host"]).arg(&file));
    assert!(err.contains("gpumap: info: POSIX path"), "{err}");
    let (_, _, err) = run(gpumap().args(["read", "--host", "-vv"]).arg(&file));
    assert!(err.contains("gpumap: info: gpumap::transfer: POSIX path"), "{err}");
    let (_, _, err) = run(gpumap()
        .args(["read", "--host"])
        .arg(&file)
        .env("GPUMAP_LOG", "gpumap::transfer=info"));
    assert!(err.contains("POSIX path"), "{err}");
    // A directive that does not parse is an error naming the variable.
    let (code, _, err) =
        run(gpumap().args(["read", "--host"]).arg(&file).env("GPUMAP_LOG", "gpumap=[[loud"));
    assert_eq!(code, 1);
    assert!(err.contains("GPUMAP_LOG"), "{err}");
    // Thread counts: bounded, with the same warning for --threads.
    let (code, _, err) = run(gpumap().args(["read", "--host", "--threads", "5000"]).arg(&file));
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(gpumap().args(["read", "--host", "--threads", &too_many]).arg(&file));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("--threads {too_many}")), "{err}");
}

/// Runs `args` with standard output closed before the first write (what `| head -0` does, and
/// what `| head -1` does to every line after the first) and returns the status and stderr.
fn with_closed_stdout(args: &[&str], paths: &[&Path]) -> (Option<i32>, String) {
    // The read end is closed before the child starts: closing it after the spawn raced with a
    // quick child writing everything into the pipe's buffer first (exit 0 on a busy machine).
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child =
        gpumap().args(args).args(paths).stdout(writer).stderr(Stdio::piped()).spawn().unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn closed_pipes_end_every_command_quietly_with_141() {
    let dir = scratch();
    let file = pattern_file(dir.path(), "data", "1MiB");
    std::fs::create_dir(dir.path().join("tree")).unwrap();
    for i in 0..20 {
        std::fs::write(dir.path().join(format!("tree/{i}")), b"x").unwrap();
    }
    let tree = dir.path().join("tree");
    let out = dir.path().join("out");
    for (args, paths) in [
        (&["info"][..], &[][..]),
        (&["info", "--json"][..], &[][..]),
        (&["read", "--host"][..], &[file.as_path()][..]),
        (&["read", "--host", "--json"][..], &[file.as_path()][..]),
        (&["write", "--host", "--size", "64K"][..], &[out.as_path()][..]),
        (&["pagecache", "-r"][..], &[tree.as_path()][..]),
        (&["pagecache", "-r", "--json"][..], &[tree.as_path()][..]),
        (&["pagecache", "-r", "--summary"][..], &[tree.as_path()][..]),
        (&["pagecache", "--evict"][..], &[file.as_path()][..]),
    ] {
        let (code, err) = with_closed_stdout(args, paths);
        assert_eq!(code, Some(141), "{args:?}: {err}");
        assert_eq!(err, "", "{args:?}");
    }
}
