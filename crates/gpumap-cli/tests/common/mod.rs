//! Helpers shared by the CLI tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The `gpumap` binary under test: `$GPUMAP_BIN` where set (the GPU machine runs these tests
/// from a staged copy), else the one cargo built.
pub fn gpumap_bin() -> PathBuf {
    let bin: PathBuf = std::env::var_os("GPUMAP_BIN")
        .map_or_else(|| env!("CARGO_BIN_EXE_gpumap").into(), PathBuf::from);
    // A copied test binary looks for cargo's build: say so, rather than "not found" per test.
    assert!(
        bin.is_file(),
        "no gpumap binary at {}: set GPUMAP_BIN to it (on the GPU machine: $PWD/.gpu/bin/gpumap)",
        bin.display()
    );
    bin
}

/// A scratch directory on real storage (cargo's target tmpdir, created if missing).
pub fn scratch() -> tempfile::TempDir {
    let base = env!("CARGO_TARGET_TMPDIR");
    std::fs::create_dir_all(base).expect("the scratch directory can be created");
    tempfile::tempdir_in(base).expect("a scratch directory")
}
