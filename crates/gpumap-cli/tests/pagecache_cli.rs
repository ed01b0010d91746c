//! `gpumap pagecache` end to end: the real binary on real files.
#![forbid(unsafe_code)]

mod common;

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use gpumap::pagecache::{self, ByteRange};

const MIB: u64 = 1 << 20;

fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("pagecache-cli-")
        .tempdir_in({
            std::fs::create_dir_all(env!("CARGO_TARGET_TMPDIR")).unwrap();
            env!("CARGO_TARGET_TMPDIR")
        })
        .unwrap()
}

fn write_file(dir: &Path, name: &str, len: u64) -> PathBuf {
    let path = dir.join(name);
    let mut file = File::create(&path).unwrap();
    file.write_all(&vec![0x5a; len as usize]).unwrap();
    file.sync_all().unwrap();
    path
}

fn gpumap(args: &[&str], paths: &[&Path]) -> Output {
    Command::new(common::gpumap_bin()).arg("pagecache").args(args).args(paths).output().unwrap()
}

fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn cached(path: &Path) -> u64 {
    pagecache::residency(path, ByteRange::ALL).unwrap().cached_pages.unwrap()
}

#[test]
fn table_json_and_map_report_what_the_library_sees() {
    let dir = scratch_dir();
    let path = write_file(dir.path(), "data", 4 * MIB);
    let out = gpumap(&["--warm", "--wait"], &[&path]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("RESIDENT") && table.contains("total (1 files)"), "{table}");
    assert!(table.contains("100.0%") && table.contains("4.0 MiB"), "{table}");

    let out = gpumap(&["--json", "--map"], &[&path]);
    assert!(out.status.success());
    let doc = json(&out);
    let file = &doc["files"][0];
    assert_eq!(file["residency"]["cached_pages"].as_u64(), Some(cached(&path)));
    assert_eq!(file["resident_runs"][0]["len"].as_u64(), Some(4 * MIB));
    assert_eq!(doc["total"]["files"].as_u64(), Some(1));
    assert_eq!(doc["errors"].as_array().map(Vec::len), Some(0));

    let out = gpumap(&["--map", "--map-width", "10"], &[&path]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("[OOOOOOOOOO]"), "{table}");
}

#[test]
fn evict_and_warm_change_residency() {
    let dir = scratch_dir();
    let path = write_file(dir.path(), "data", 8 * MIB);
    let out = gpumap(&["--evict", "--json"], &[&path]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = json(&out);
    let after = doc["files"][0]["residency"]["cached_pages"].as_u64().unwrap();
    let pages = doc["files"][0]["residency"]["total_pages"].as_u64().unwrap();
    assert!(doc["files"][0]["before_evict"].is_object());
    if after * 100 > pages {
        eprintln!("*** NOTE: eviction refused here ({after} of {pages} pages stayed)");
        return;
    }
    assert!(cached(&path) * 100 <= pages);
    // One megabyte, read: exactly that range is reported as resident.
    let out = gpumap(&["--warm", "--wait", "--range", "1M:1M", "--json"], &[&path]);
    assert!(out.status.success());
    let residency = &json(&out)["files"][0]["residency"];
    assert_eq!(residency["total_pages"].as_u64(), Some(MIB / pagecache::page_size()));
    assert_eq!(residency["cached_pages"], residency["total_pages"]);
}

#[test]
fn bad_paths_are_reported_and_the_rest_still_processed() {
    let dir = scratch_dir();
    let good = write_file(dir.path(), "good", MIB);
    let small = write_file(dir.path(), "small", 10);
    let missing = dir.path().join("missing");
    let subdir = dir.path().join("subdir");
    fs::create_dir(&subdir).unwrap();

    let out = gpumap(&["--json"], &[&missing, &subdir, &good]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("missing") && stderr.contains("No such file"), "{stderr}");
    assert!(stderr.contains("is a directory (use --recursive)"), "{stderr}");
    let doc = json(&out);
    assert_eq!(doc["files"].as_array().unwrap().len(), 1);
    assert_eq!(doc["errors"].as_array().unwrap().len(), 2);
    assert_eq!(doc["total"]["errors"].as_u64(), Some(2));

    // A range past the end of one file fails that file only.
    let out = gpumap(&["--range", "0:100", "--json"], &[&small, &good]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("outside the file of 10 bytes"), "{stderr}");
    assert_eq!(json(&out)["files"][0]["residency"]["len"].as_u64(), Some(100));

    // Unreadable: mode 000 (root reads it anyway, so also a socket, which nobody can open).
    let unreadable = write_file(dir.path(), "unreadable", 10);
    fs::set_permissions(&unreadable, fs::Permissions::from_mode(0o000)).unwrap();
    let socket = dir.path().join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let out = gpumap(&[], &[&socket, &unreadable, &good]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("socket"), "{stderr}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("good"), "{table}");

    // Arguments clap refuses exit with 2.
    let out = gpumap(&["--wait"], &[&good]);
    assert_eq!(out.status.code(), Some(2));
    let out = gpumap(&["--range", "12"], &[&good]);
    assert_eq!(out.status.code(), Some(2));
    let out = gpumap(&["--evict", "--warm"], &[&good]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn recursive_walks_trees_without_following_links() {
    let dir = scratch_dir();
    let a = write_file(dir.path(), "a", 3 * MIB);
    fs::create_dir_all(dir.path().join("x/y")).unwrap();
    write_file(&dir.path().join("x"), "b", 5000);
    write_file(&dir.path().join("x/y"), "c", 0);
    std::os::unix::fs::symlink(&a, dir.path().join("x/link-to-a")).unwrap();
    std::os::unix::fs::symlink(dir.path(), dir.path().join("x/y/loop")).unwrap();

    let out = gpumap(&["-r", "--json"], &[dir.path()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = json(&out);
    let names: Vec<String> = doc["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().rsplit('/').next().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(doc["total"]["skipped"].as_u64(), Some(2));
    assert_eq!(doc["total"]["bytes"].as_u64(), Some(3 * MIB + 5000));
}

#[test]
fn lock_holds_pages_until_the_process_ends() {
    let dir = scratch_dir();
    let path = write_file(dir.path(), "data", 2 * MIB);
    pagecache::evict(&path, ByteRange::ALL).unwrap();
    let mut child = Command::new(common::gpumap_bin())
        .args(["pagecache", "--lock", "--range", "0:1M"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The table is printed once the locks are taken.
    let stdout = child.stdout.take().unwrap();
    let mut total_line = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if line.contains("total (") {
            total_line = Some(line);
            break;
        }
    }
    let status = child.try_wait().unwrap();
    if total_line.is_none() || status.is_some() {
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        eprintln!("*** NOTE: --lock did not hold ({status:?}): {stderr}");
        assert!(stderr.contains("mlock"), "{stderr}");
        return;
    }
    let range = ByteRange::new(0, MIB);
    let locked = pagecache::residency(&path, range).unwrap();
    assert_eq!(locked.cached_pages, Some(locked.total_pages));
    let report = pagecache::evict(&path, ByteRange::ALL).unwrap();
    assert_eq!(
        pagecache::residency(&path, range).unwrap().cached_pages,
        Some(locked.total_pages),
        "locked pages survive eviction; {report:?}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    pagecache::evict(&path, ByteRange::ALL).unwrap();
    assert!(pagecache::residency(&path, range).unwrap().cached_pages < Some(locked.total_pages));
}

#[test]
fn unprivileged_users_see_unknown_and_a_clear_drop_all_error() {
    let dir = scratch_dir();
    let path = write_file(dir.path(), "root-owned", MIB);
    let owner = std::os::unix::fs::MetadataExt::uid(&fs::metadata(&path).unwrap());
    if owner != 0 {
        eprintln!("*** NOTE: not root: cannot switch to another user; checking --drop-all only");
        let out = gpumap(&["--drop-all"], &[]);
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("CAP_SYS_ADMIN"), "{stderr}");
        }
        return;
    }
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let as_nobody = |args: &[&str], paths: &[&Path]| {
        Command::new(common::gpumap_bin())
            .arg("pagecache")
            .args(args)
            .args(paths)
            .uid(65534)
            .gid(65534)
            .output()
    };
    let out = match as_nobody(&["--json"], &[&path]) {
        Ok(out) if out.status.code() != Some(126) => out,
        other => {
            eprintln!("*** SKIP: cannot run gpumap as nobody: {other:?}");
            return;
        }
    };
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = json(&out);
    let residency = &doc["files"][0]["residency"];
    assert!(residency["cached_pages"].is_null(), "must be unknown, not all: {residency}");
    assert!(residency["unknown_reason"].as_str().unwrap().contains("owns or may write"));
    assert_eq!(doc["total"]["unknown_files"].as_u64(), Some(1));

    // The reason is said once, not under every file it applies to.
    let second = write_file(dir.path(), "root-owned-too", MIB);
    fs::set_permissions(&second, fs::Permissions::from_mode(0o644)).unwrap();
    let out = as_nobody(&[], &[&path, &second]).unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(table.matches("(unknown:").count(), 1, "{table}");
    assert!(table.contains("2 unknown"), "{table}");

    let out = as_nobody(&["--drop-all"], &[]).unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("CAP_SYS_ADMIN") && stderr.contains("drop_caches"), "{stderr}");
}

#[test]
fn summary_and_columns_for_scripts_and_big_trees() {
    let dir = scratch_dir();
    for i in 0..5 {
        write_file(dir.path(), &format!("f{i}"), 100 * 1024);
    }
    let out = gpumap(&["-r", "--warm", "--wait", "--summary"], &[dir.path()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(table.lines().count(), 2, "a header and the total: {table}");
    assert!(table.lines().nth(1).unwrap().ends_with("total (5 files)"), "{table}");
    let out = gpumap(&["-r", "--summary", "--json"], &[dir.path()]);
    let doc = json(&out);
    assert_eq!(doc["schema"], 1);
    assert!(doc.get("files").is_none(), "--summary leaves the files out: {doc}");
    assert_eq!(doc["total"]["files"], 5);
    assert_eq!(doc["total"]["bytes"], 5 * 100 * 1024);

    // -o chooses and orders columns (any case, RES for RESIDENT); +LIST adds, -NAME removes.
    let out = gpumap(&["-o", "pages,res,file", "--no-headings"], &[&dir.path().join("f0")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    let first: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(first[0], "25/25", "{table}");
    assert!(first.last().unwrap().ends_with("f0"), "{table}");
    assert_eq!(table.lines().count(), 2, "no header: {table}");
    let out = gpumap(&["-o", "+EVICTED,-DIRTY,-WRITEBACK"], &[&dir.path().join("f0")]);
    let header = String::from_utf8_lossy(&out.stdout).lines().next().unwrap().to_owned();
    let header: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(header, ["RESIDENT", "%", "PAGES", "SIZE", "FILE", "EVICTED"]);
    let out = gpumap(&["-o", "-DIRTY,-writeback,-PERCENT"], &[&dir.path().join("f0")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let header = String::from_utf8_lossy(&out.stdout).lines().next().unwrap().to_owned();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["RESIDENT", "PAGES", "SIZE", "FILE"]
    );
    let out = gpumap(&["-o", "RES,BOGUS"], &[&dir.path().join("f0")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("BOGUS"));
}

#[test]
fn errors_in_the_json_document_are_objects_with_kind_and_errno() {
    let dir = scratch_dir();
    let good = write_file(dir.path(), "good", MIB);
    let missing = dir.path().join("missing");
    let out = gpumap(&["--json"], &[&missing, dir.path(), &good]);
    assert_eq!(out.status.code(), Some(1));
    let doc = json(&out);
    assert_eq!(doc["schema"], 1);
    let errors = doc["errors"].as_array().unwrap();
    assert_eq!(errors[0]["error"]["kind"], "io");
    assert_eq!(errors[0]["error"]["errno"], libc::ENOENT);
    assert_eq!(errors[1]["error"]["kind"], "is_a_directory");
    // One document on stdout, nothing after it.
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim().lines().count(), 1);
    // The path is named once in each line on stderr.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let missing_line = stderr.lines().find(|l| l.contains("missing")).unwrap();
    assert_eq!(missing_line.matches(&*missing.to_string_lossy()).count(), 1, "{stderr}");
}

#[test]
fn evicting_a_tree_drops_every_file() {
    let dir = scratch_dir();
    let mut files = Vec::new();
    for i in 0..50 {
        files.push(write_file(dir.path(), &format!("f{i}"), 64 * 1024));
    }
    // Half of them dirty (written, not synced): those must be synced before dropping.
    for f in files.iter().step_by(2) {
        fs::OpenOptions::new().write(true).open(f).unwrap().write_all(&[1u8; 8192]).unwrap();
    }
    let out = gpumap(&["-r", "--evict", "--json"], &[dir.path()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = json(&out);
    let after = doc["total"]["cached_pages"].as_u64().unwrap();
    if after > 0 {
        eprintln!("*** NOTE: {after} pages stayed (eviction refused here)");
        return;
    }
    for f in &files {
        assert_eq!(cached(f), 0, "{}", f.display());
    }
}
