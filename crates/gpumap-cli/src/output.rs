//! Standard output that survives a closed pipe (`gpumap info --json | head -1`), JSON
//! documents, and notes on standard error that `--quiet` silences.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use crate::error::{CliError, CliResult};
use crate::logging::REPORT;

static QUIET: AtomicBool = AtomicBool::new(false);

/// Whether standard output was closed when the command started (`gpumap read f >&-`).
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Finds out whether standard output was closed when the process started
/// (`gpumap read f >&-`). Rust's runtime puts `/dev/null` on a closed standard descriptor before `main` (so no
/// file the command opens can take its number), and the report then went there with exit
/// status 0. The runtime opens it read-write; a shell's `>/dev/null` opens it write-only. So a
/// standard output that is `/dev/null` open read-write was closed, and printing the report is
/// an error instead.
pub fn detect_closed_standard_output() {
    STDOUT_CLOSED.store(stdout_was_closed().unwrap_or(false), Ordering::Relaxed);
}

fn stdout_was_closed() -> Option<bool> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let target = std::fs::metadata("/proc/self/fd/1").ok()?;
    let null = std::fs::metadata("/dev/null").ok()?;
    if !target.file_type().is_char_device() || target.rdev() != null.rdev() {
        return Some(false);
    }
    let info = std::fs::read_to_string("/proc/self/fdinfo/1").ok()?;
    let flags = info.lines().find_map(|l| l.strip_prefix("flags:"))?.trim();
    let flags = u32::from_str_radix(flags, 8).ok()?;
    Some(flags & libc::O_ACCMODE as u32 == libc::O_RDWR as u32)
}

/// Sets `--quiet`: no notes or progress on standard error.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether `--quiet` was given.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Prints `text` and a newline; a closed pipe is [`CliError::ClosedPipe`], for callers that
/// unwind to `main` on the way out.
pub fn try_line(text: impl std::fmt::Display) -> CliResult {
    print_with(|out| writeln!(out, "{text}"))
}

/// Runs `print` on locked standard output and flushes it; a closed pipe is
/// [`CliError::ClosedPipe`].
pub fn print_with(print: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> CliResult {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return Err(CliError::Gpumap(gpumap::Error::Io {
            op: "write to standard output (it was closed when the command started)",
            path: None,
            offset: None,
            source: std::io::Error::from_raw_os_error(libc::EBADF),
        }));
    }
    let mut out = std::io::stdout().lock();
    match print(&mut out).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(CliError::ClosedPipe),
        Err(e) => Err(CliError::Gpumap(gpumap::Error::Io {
            op: "write to standard output",
            path: None,
            offset: None,
            source: e,
        })),
    }
}

/// A path as text lines show it: control characters (a newline, a terminal's escape) written
/// as Rust escapes, so that a file name can neither break a line a script splits nor drive the
/// terminal; bytes that are not UTF-8 as U+FFFD.
pub fn shown(path: &Path) -> String {
    let text = path.to_string_lossy();
    if !text.chars().any(char::is_control) {
        return text.into_owned();
    }
    text.chars()
        .map(|c| if c.is_control() { c.escape_default().collect() } else { c.to_string() })
        .collect()
}

/// A path as a JSON string: one that is not UTF-8 with U+FFFD for what is not (serde would
/// refuse it, and a command's work is done by the time its report is written).
pub fn lossy_path<S: serde::Serializer>(path: &Path, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&path.to_string_lossy())
}

/// [`lossy_path`] of a path that may be missing (`null`).
pub fn lossy_optional_path<S: serde::Serializer>(
    path: &Option<PathBuf>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match path {
        Some(path) => lossy_path(path, serializer),
        None => serializer.serialize_none(),
    }
}

/// Prints `document` as one line of JSON (every document carries its `"schema"`).
pub fn json(document: &impl Serialize) -> CliResult {
    let text = serde_json::to_string(document).map_err(|e| {
        CliError::Gpumap(gpumap::Error::InvalidArgument(format!("cannot encode JSON: {e}")))
    })?;
    try_line(text)
}

/// A note for the person at the terminal, on standard error, unless `--quiet` (the
/// subscriber's filter drops it then).
pub fn note(text: impl std::fmt::Display) {
    tracing::warn!(target: REPORT, "gpumap: {text}");
}

/// The error that ends a command, on standard error, always.
pub fn report_error(e: &CliError) {
    tracing::error!(target: REPORT, "gpumap: {e}");
}

/// Ends the process for `e` where no caller can unwind: removes scratch files, reports
/// anything but a closed pipe, and exits with `e`'s status.
pub fn exit_on(e: CliError) -> ! {
    gpumap::io::scratch::wait_if_ending();
    gpumap::io::scratch::remove_live();
    if !e.is_reported() {
        report_error(&e);
    }
    std::process::exit(i32::from(e.exit_code()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_paths_escape_what_would_break_a_line_or_drive_a_terminal() {
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(shown(Path::new("/data/plain é.bin")), "/data/plain é.bin");
        assert_eq!(shown(Path::new("a\nb\tc\u{1b}[31m")), "a\\nb\\tc\\u{1b}[31m");
        let raw = std::ffi::OsStr::from_bytes(b"x\xff\x07");
        assert_eq!(shown(Path::new(raw)), "x\u{fffd}\\u{7}");
    }
}
