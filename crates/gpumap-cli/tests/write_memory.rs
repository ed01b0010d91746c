//! `gpumap write --size` streams: its memory does not grow with the size. Its own test binary,
//! so that the peak memory of waited-for children is this one run's.

mod common;

use std::process::Command;

#[test]
fn a_large_write_needs_no_more_memory_than_a_small_one() {
    let dir = common::scratch();
    let file = dir.path().join("big");
    // 320 MiB in 64 MiB pieces (1 thread, 64 KiB tasks); holding it all, as before, took
    // twice the size (the pattern, then its copy in the stand-in device memory).
    let status = Command::new(common::gpumap_bin())
        .args(["write", "--host", "--size", "320MiB", "--threads", "1", "--task-size", "64K"])
        .arg(&file)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 320 << 20);
    let usage =
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
    let peak_mib = usage.max_rss() / 1024; // KiB on Linux
    assert!(peak_mib < 160, "gpumap write peaked at {peak_mib} MiB for a 320 MiB write");
    // And the bytes are the pattern across the pieces' boundaries.
    for boundary in [64u64 << 20, 128 << 20, 256 << 20] {
        let offset = (boundary - 4096).to_string();
        let out = Command::new(common::gpumap_bin())
            .args(["read", "--host", "--verify-pattern", "--len", "8K", "--offset", &offset])
            .arg(&file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}
