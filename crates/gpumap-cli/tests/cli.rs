//! The `gpumap` binary: the main job end to end, JSON output, and errors a user would hit.

mod common;

use std::process::Command;

fn gpumap() -> Command {
    Command::new(common::gpumap_bin())
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("gpumap runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[test]
fn write_then_read_verifies_and_reports_json() {
    let dir = common::scratch();
    let file = dir.path().join("data.bin");
    let (code, out, err) =
        run(gpumap().args(["write", "--size", "5MiB", "--offset", "4097", "--json"]).arg(&file));
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["op"], "write");
    assert_eq!(report["bytes"], 5 << 20);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 4097 + (5 << 20));

    let (code, out, err) = run(gpumap()
        .args([
            "read",
            "--offset",
            "4097",
            "--verify-pattern",
            "--threads",
            "3",
            "--task-size",
            "64KiB",
            "--json",
        ])
        .arg(&file));
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["verified"], true);
    assert_eq!(report["threads"], 3);
    assert!(report["gbps"].as_f64().unwrap() > 0.0);

    // A byte changed on disk is found, with its offset.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[4097 + 1_000_000] ^= 0xFF;
    std::fs::write(&file, &bytes).unwrap();
    let (code, _, err) =
        run(gpumap().args(["read", "--offset", "4097", "--verify-pattern"]).arg(&file));
    assert_eq!(code, 3, "data that differ have their own exit status: {err}");
    assert!(err.contains(&format!("data differ at offset {}", 4097 + 1_000_000)), "{err}");
    assert!(!err.contains("invalid argument"), "{err}");
    let (code, out, _) =
        run(gpumap().args(["read", "--offset", "4097", "--verify-pattern", "--json"]).arg(&file));
    assert_eq!(code, 3);
    let doc: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(doc["error"]["kind"], "data_differ", "{out}");

    // --verify compares with a plain read of the file: it works where there is no GPU.
    let (code, out, err) = run(gpumap().args(["read", "--verify", "--json"]).arg(&file));
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["verified"], true);
}

#[test]
fn info_json_describes_capabilities_and_settings() {
    let (code, out, err) = run(gpumap().args(["info", "--json"]).env("GPUMAP_TASK_SIZE", "1MiB"));
    assert_eq!(code, 0, "{err}");
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(info["schema"], 1);
    assert_eq!(info["settings"]["task_size"]["value"], 1 << 20);
    assert_eq!(info["settings"]["task_size"]["source"], "GPUMAP_TASK_SIZE");
    assert_eq!(info["settings"]["nthreads"]["source"], "default");
    assert!(info["cuda"]["available"].is_boolean(), "{out}");
    assert!(info["gds"]["available"].is_boolean(), "{out}");
    // O_DIRECT reads and writes in the same words.
    assert_eq!(info["settings"]["direct_io_read"]["value"], "off", "{out}");
    assert_eq!(info["settings"]["direct_io_write"]["value"], "on", "{out}");
    let memory = &info["default_memory"];
    assert!(memory["kind"] == "gpu" || memory["kind"] == "host", "{out}");
    let (_, out, _) = run(gpumap()
        .args(["info", "--json"])
        .env("GPUMAP_AUTO_DIRECT_IO_WRITE", "false")
        .env("GPUMAP_AUTO_DIRECT_IO_READ", "uncached"));
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(info["settings"]["direct_io_write"]["value"], "off", "{out}");
    assert_eq!(info["settings"]["direct_io_read"]["value"], "uncached", "{out}");
    let (code, text, _) = run(gpumap().arg("info"));
    assert_eq!(code, 0);
    assert!(text.contains("task_size") && text.contains("CUDA"), "{text}");
}

/// `gpumap info` shows every row of the library's settings table, in text and JSON, and the
/// facts of a path: a setting added to the table alone, or to info alone, fails here.
#[test]
fn info_shows_every_setting_of_the_table_and_the_facts_of_a_path() {
    let dir = common::scratch();
    let (code, out, err) = run(gpumap().args(["info", "--json"]).arg(dir.path()));
    assert_eq!(code, 0, "{err}");
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    let shown = info["settings"].as_object().unwrap();
    assert_eq!(shown.len(), gpumap::config::SETTINGS.len(), "{out}");
    let config = gpumap::Config::default();
    for spec in &gpumap::config::SETTINGS {
        let setting = &shown[spec.field];
        if spec.field == "direct_io_write" {
            // On tmpfs auto-tuning turns O_DIRECT writes off: the file system refuses them.
            assert!(["default", "auto"].contains(&setting["source"].as_str().unwrap()), "{out}");
        } else {
            assert_eq!(setting["source"], "default", "{}: {out}", spec.field);
            let value = spec.value(&config).to_string();
            let json = &setting["value"];
            let text = match json {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Array(a) => {
                    a.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
                }
                other => other.to_string(),
            };
            assert_eq!(text, value, "{}: {out}", spec.field);
        }
    }
    assert_eq!(info["facts"]["path"], dir.path().to_str().unwrap(), "{out}");
    assert!(info["facts"]["file_system"]["kind"].is_string(), "{out}");
    assert!(info["facts"]["cpus"].as_u64().unwrap() >= 1, "{out}");
    assert_eq!(info["remote"]["max_in_flight"], 64, "{out}");
    assert!(shown["nthreads"]["reason"].as_str().unwrap().contains("CPUs"), "{out}");
    // The environment wins over any automatic choice, and says so.
    let (_, out, _) =
        run(gpumap().args(["info", "--json"]).arg(dir.path()).env("KVIKIO_NTHREADS", "3"));
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(info["settings"]["nthreads"]["value"], 3, "{out}");
    assert_eq!(info["settings"]["nthreads"]["source"], "KVIKIO_NTHREADS", "{out}");
    assert!(info["settings"]["nthreads"]["reason"].is_null(), "{out}");
    let (code, text, _) = run(gpumap().arg("info").arg(dir.path()));
    assert_eq!(code, 0);
    for spec in &gpumap::config::SETTINGS {
        assert!(text.contains(&format!("  {} ", spec.field)), "{}: {text}", spec.field);
    }
    assert!(text.contains("facts: ") && text.contains(dir.path().to_str().unwrap()), "{text}");
    let (code, _, err) = run(gpumap().arg("info").arg(dir.path().join("missing")));
    assert_eq!(code, 1, "{err}");
}

#[test]
fn user_errors_are_clear_and_typed() {
    let dir = common::scratch();
    let file = dir.path().join("small");
    std::fs::write(&file, vec![1u8; 1000]).unwrap();
    // A bad environment value names the variable and its value.
    let (code, _, err) = run(gpumap().arg("read").arg(&file).env("GPUMAP_TASK_SIZE", "-4"));
    assert_eq!(code, 1);
    assert!(err.contains("GPUMAP_TASK_SIZE") && err.contains("\"-4\""), "{err}");
    // A range past the end of the file carries the values.
    let (code, _, err) = run(gpumap().args(["read", "--offset", "900", "--len", "200"]).arg(&file));
    assert_eq!(code, 1);
    assert!(err.contains("900..1100") && err.contains("1000 bytes"), "{err}");
    // Missing file.
    let (code, _, err) = run(gpumap().arg("read").arg(dir.path().join("nope")));
    assert_eq!(code, 1);
    assert!(err.contains("No such file"), "{err}");
    // Bad sizes are rejected by the argument parser (exit 2), naming the option.
    let (code, _, err) = run(gpumap().args(["write", "--size", "lots"]).arg(&file));
    assert_eq!(code, 2);
    assert!(err.contains("--size"), "{err}");
    // The file was not touched by any of it.
    assert_eq!(std::fs::read(&file).unwrap(), vec![1u8; 1000]);
}

#[test]
fn cold_repeated_reads_report_every_run() {
    let dir = common::scratch();
    let file = dir.path().join("cold.bin");
    let (code, _, err) = run(gpumap().args(["write", "--size", "8MiB"]).arg(&file));
    assert_eq!(code, 0, "{err}");
    for policy in ["uncached", "on", "off"] {
        let (code, out, err) = run(gpumap()
            .args(["read", "--cold", "--repeat", "3", "--verify-pattern", "--json", "--direct"])
            .arg(policy)
            .arg(&file));
        assert_eq!(code, 0, "{policy}: {err}");
        let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(report["cold"], true);
        assert_eq!(report["verified"], true);
        let runs: Vec<f64> =
            report["runs_gbps"].as_array().unwrap().iter().map(|r| r.as_f64().unwrap()).collect();
        assert_eq!(runs.len(), 3, "{out}");
        let fastest = runs.iter().copied().fold(0.0, f64::max);
        assert!((report["gbps"].as_f64().unwrap() - fastest).abs() < 1e-9, "{out}");
        let direct = &report["direct_io"];
        assert_eq!(direct["policy"], policy, "{out}");
        assert!(direct["reason"].is_string(), "{out}");
        let enabled = direct["enabled"].as_bool().unwrap();
        match policy {
            "off" => assert!(!enabled, "{out}"),
            // On or uncached: used where the file system allows O_DIRECT.
            _ => assert!(enabled || direct["reason"].as_str().unwrap().contains("refused")),
        }
    }
    let (code, _, err) = run(gpumap().args(["read", "--direct", "sometimes"]).arg(&file));
    assert_eq!(code, 2);
    assert!(err.contains("uncached"), "{err}");
}

#[test]
fn map_walks_files_in_one_cache_under_a_budget() {
    let dir = common::scratch();
    let (a, b) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
    for (file, size) in [(&a, "12MiB"), (&b, "5MiB")] {
        let (code, _, err) = run(gpumap().args(["write", "--size", size]).arg(file));
        assert_eq!(code, 0, "{err}");
    }
    let (code, out, err) = run(gpumap()
        .args([
            "map",
            "--budget",
            "8MiB",
            "--frame",
            "2MiB",
            "--window",
            "2MiB",
            "--verify-pattern",
            "--json",
        ])
        .arg(&a)
        .arg(&b));
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["schema"], 1);
    assert_eq!(report["verified"], true);
    assert_eq!(report["bytes_viewed"], 17 << 20);
    assert_eq!(report["files"].as_array().unwrap().len(), 2);
    assert_eq!(report["files"][0]["stats"]["bytes_faulted"], 12 << 20, "{out}");
    assert_eq!(report["files"][1]["stats"]["bytes_faulted"], 5 << 20, "{out}");
    assert_eq!(report["cache"]["budget"], 8 << 20);
    assert!(report["cache"]["used_bytes"].as_u64().unwrap() <= 8 << 20);
    assert!(report["files"][0]["stats"]["evictions"].as_u64().unwrap() > 0, "{out}");
    // Without read-ahead every window is read when it is asked for; with the default budget
    // (1 GiB) the frames are 32 MiB.
    let (code, out, err) = run(gpumap()
        .args(["map", "--read-ahead", "0", "--window", "2MiB", "--verify-pattern", "--json"])
        .arg(&a));
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["verified"], true);
    assert_eq!(report["files"][0]["stats"]["bytes_faulted"], 12 << 20, "{out}");
    assert_eq!(report["files"][0]["stats"]["hits"], 0, "nothing was read ahead: {out}");
    assert_eq!(report["cache"]["frame_size"], 32 << 20, "{out}");
}

#[test]
fn map_reads_at_random_from_threads_in_batches_and_views() {
    let dir = common::scratch();
    let (a, b) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
    for file in [&a, &b] {
        let (code, _, err) = run(gpumap().args(["write", "--size", "9MiB"]).arg(file));
        assert_eq!(code, 0, "{err}");
    }
    for (threads, batch) in [("1", "1"), ("4", "1"), ("3", "64")] {
        let (code, out, err) = run(gpumap()
            .args([
                "map", "--random", "700", "--block", "4KiB", "--extent", "4KiB", "--budget", "2MiB",
            ])
            .args(["--frame", "2MiB", "--threads", threads, "--batch", batch, "--advise", "random"])
            .args(["--verify-pattern", "--json"])
            .arg(&a)
            .arg(&b));
        assert_eq!(code, 0, "{err}");
        let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(report["views"], 700);
        assert_eq!(report["access"], "random");
        assert_eq!(report["threads"], threads.parse::<u64>().unwrap());
        let files = report["files"].as_array().unwrap();
        let seen: u64 = files
            .iter()
            .map(|f| f["stats"]["hits"].as_u64().unwrap() + f["stats"]["misses"].as_u64().unwrap())
            .sum();
        assert_eq!(seen, 700, "every 4 KiB read is one extent, a hit or a miss: {out}");
        assert!(files.iter().all(|f| f["stats"]["frames"] == 0), "random reads use slots: {out}");
    }
    // Two shards of the budget, from 16 threads: every read verified, the split reported.
    let (code, out, err) = run(gpumap()
        .args([
            "map", "--random", "2000", "--block", "4KiB", "--extent", "4KiB", "--budget", "8MiB",
        ])
        .args(["--frame", "2MiB", "--shards", "2", "--threads", "16", "--verify-pattern", "--json"])
        .arg(&a)
        .arg(&b));
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["cache"]["shards"], 2, "{out}");
    let (code, out, _) =
        run(gpumap().args(["map", "--random", "10", "--advise", "willneed"]).arg(&a));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hits") && out.contains("misses"), "{out}");
}

#[test]
fn map_gathers_rows_by_index_and_verifies_them() {
    let dir = common::scratch();
    let (a, b) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
    for (file, size) in [(&a, "9MiB"), (&b, "3MiB")] {
        let (code, _, err) = run(gpumap().args(["write", "--size", size]).arg(file));
        assert_eq!(code, 0, "{err}");
    }
    // Rows that do not divide the extent (and cross extents), from threads, under a budget
    // smaller than the files: every row checked against the pattern.
    for (row_size, threads, batch) in [("512", "1", "1"), ("1000", "3", "257"), ("9KiB", "2", "8")]
    {
        let (code, out, err) = run(gpumap()
            .args(["map", "--rows", "3000", "--row-size", row_size, "--extent", "4KiB"])
            .args(["--budget", "4MiB", "--frame", "2MiB", "--threads", threads, "--batch", batch])
            .args(["--verify-pattern", "--json"])
            .arg(&a)
            .arg(&b));
        assert_eq!(code, 0, "--row-size {row_size}: {err}");
        let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(report["views"], 3000, "{out}");
        assert_eq!(report["access"], "rows", "{out}");
        assert_eq!(report["verified"], true, "{out}");
    }
    // The same rows with the misses read in place (the cache in front of the zero-copy tier).
    let (code, out, err) = run(gpumap()
        .args(["map", "--rows", "3000", "--row-size", "1000", "--extent", "4KiB"])
        .args(["--budget", "4MiB", "--frame", "2MiB", "--threads", "2", "--batch", "100"])
        .args(["--zero-copy", "misses", "--verify-pattern", "--json"])
        .arg(&a));
    assert_eq!(code, 0, "--zero-copy misses: {err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["verified"], true, "{out}");
    assert!(report["files"][0]["stats"]["rows_read_through"].as_u64() > Some(0), "{out}");
    for (args, wanted) in [
        (vec!["--rows", "5", "--row-size", "0"], "--row-size 0"),
        (vec!["--rows", "5", "--row-size", "1GiB"], "--row-size 1073741824"),
        (vec!["--rows", "5", "--random", "5"], "--random"),
        (vec!["--rows", "5", "--batch", "1000000", "--row-size", "64KiB"], "more than 4 GiB"),
    ] {
        let (code, _, err) = run(gpumap().arg("map").args(&args).arg(&a));
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(wanted), "{args:?}: {err}");
    }
}

#[test]
fn map_rejects_bad_sizes_before_allocating() {
    let dir = common::scratch();
    let file = dir.path().join("small.bin");
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    for (args, wanted) in [
        (vec!["--extent", "3KiB"], "extent size 3072"),
        (vec!["--budget", "1MiB"], "less than one frame of 8388608 bytes"),
        (vec!["--budget", "64MiB", "--shards", "3"], "3 shards for a budget of 8 frames"),
        (vec!["--budget", "64MiB", "--shards", "8"], "8 shards for a budget of 8 frames"),
        (vec!["--frame", "1TiB"], "frame size 1099511627776"),
        (vec!["--read-ahead", "lots"], "--read-ahead"),
        (vec!["--budget", "100000TiB"], "exceeds"),
        (vec!["--random", "18446744073709551615"], "--random 18446744073709551615"),
        (vec!["--random", "5", "--block", "2MiB"], "--block 2097152"),
        (
            vec!["--random", "5", "--batch", "1000000", "--block", "64KiB"],
            "more than 4 GiB per call",
        ),
    ] {
        let (code, _, err) = run(gpumap().arg("map").args(&args).arg(&file));
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(wanted), "{args:?}: {err}");
    }
}

#[test]
fn permission_denied_names_the_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("locked");
    std::fs::write(&locked, b"x").unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Root bypasses file modes: run as `nobody` (util-linux setpriv) when we are root.
    let mut cmd = if running_as_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(common::gpumap_bin());
        c
    } else {
        gpumap()
    };
    let (code, _out, err) = run(cmd.arg("read").arg(&locked));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("open failed on") && err.contains("Permission denied"), "{err}");
    assert_eq!(std::fs::metadata(&locked).unwrap().len(), 1);
}

/// Whether this process runs as root (files it creates are then readable whatever their mode).
fn running_as_root() -> bool {
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0
}
