//! A process that `SIGINT` ends while it holds a scratch file: the file is removed, and the
//! process ends by the signal, even where it would end on its own just then (an error that the
//! removal caused). The test runs itself again as the child process.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use gpumap::io::ScratchFile;

/// Set in the child's environment: the directory to work in.
const CHILD: &str = "GPUMAP_TERMINATION_TEST_DIR";
const TEST: &str = "a_program_ending_on_its_own_after_the_cleanup_ends_by_the_signal";

#[test]
fn a_program_ending_on_its_own_after_the_cleanup_ends_by_the_signal() {
    if let Some(dir) = std::env::var_os(CHILD) {
        child(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("input"), b"kept").unwrap();
    // The race it guards against is won by either side: several runs.
    for _ in 0..20 {
        let status = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST, "--test-threads=1", "--nocapture"])
            .env(CHILD, dir.path())
            .status()
            .unwrap();
        assert_eq!(status.signal(), Some(libc::SIGINT), "ended by Ctrl-C: {status}");
        let names: Vec<_> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["input"], "the scratch file went, the input stayed");
    }
}

/// Holds a scratch file, is sent `SIGINT`, and once the file is gone ends on its own, as a
/// write to the removed file would make it fail.
fn child(dir: &Path) -> ! {
    // A test run in the background of a shell without job control starts with SIGINT ignored,
    // which scratch files leave as it is (as any program would): the default, as at a terminal.
    // SAFETY: signal(2) takes no pointers.
    assert_ne!(unsafe { libc::signal(libc::SIGINT, libc::SIG_DFL) }, libc::SIG_ERR);
    let scratch = ScratchFile::beside(&dir.join("input")).unwrap();
    let path = scratch.path().to_path_buf();
    // SAFETY: raise(3) takes no pointers.
    unsafe { libc::raise(libc::SIGINT) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while path.exists() {
        // Exits rather than hang: the parent reports the status.
        if std::time::Instant::now() > deadline {
            std::process::exit(4);
        }
        std::thread::yield_now();
    }
    gpumap::io::scratch::wait_if_ending();
    std::process::exit(3);
}
