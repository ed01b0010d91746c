//! [`ScratchFile`]: a file a benchmark or tool writes to and throws away, which never replaces
//! an existing file and is removed on every way out of the process.
#![forbid(unsafe_code)]

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use crate::sync::Mutex;

use crate::error::{Error, Result};

/// Scratch files alive in this process, for removal when a signal ends it.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A new, empty file beside another (same directory, so same file system and device), removed
/// when dropped — on success, on error returns such as `ENOSPC`, on panics — and when the
/// process is ended by `SIGINT` (Ctrl-C), `SIGTERM` or `SIGHUP`.
///
/// The name is `.NAME.gpumap-scratch.PID.N` and the file is created with `O_EXCL`, so it is
/// always a file that did not exist: never the file it is beside, whatever that is called.
///
/// The first scratch file of a process installs handlers for those three signals (those whose
/// disposition is still the default): they remove every live scratch file, then end the process
/// by the same signal. A program that handles the signals itself keeps its handlers and should
/// drop its scratch files on the way out.
///
/// ```
/// # let dir = std::env::temp_dir();
/// # let data = dir.join("scratch-doc-data.bin");
/// # std::fs::write(&data, b"input")?;
/// let scratch = gpumap::io::ScratchFile::beside(&data)?;
/// let fh = gpumap::io::FileHandle::open(scratch.path(), "w")?;
/// fh.write(b"thrown away", 0)?;
/// let path = scratch.path().to_path_buf();
/// drop(scratch);
/// assert!(!path.exists());
/// # std::fs::remove_file(&data)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ScratchFile {
    path: PathBuf,
}

/// Installs the handlers that remove live scratch files on `SIGINT`, `SIGTERM` and `SIGHUP`
/// (once per process).
fn install_handlers() {
    static HANDLERS: Once = Once::new();
    HANDLERS.call_once(|| {
        let signals = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];
        if let Err(e) = crate::sys::signals::on_termination(&signals, remove_live) {
            tracing::warn!("scratch files will stay behind if the process is interrupted: {e}");
        }
    });
}

impl ScratchFile {
    /// Creates the scratch file in the directory of `beside` (which need not exist).
    pub fn beside(beside: &Path) -> Result<ScratchFile> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        install_handlers();
        let dir = match beside.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = beside.file_name().map_or("scratch".into(), |n| n.to_string_lossy());
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!(".{name}.gpumap-scratch.{}.{n}", std::process::id()));
            // Registered before it exists, so that no signal can come between creating the
            // file and being able to remove it.
            LIVE.lock().push(path.clone());
            let scratch = ScratchFile { path };
            match OpenOptions::new().write(true).create_new(true).open(&scratch.path) {
                Ok(_) => return Ok(scratch),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // Someone else's: never ours to remove.
                    scratch.forget();
                }
                Err(e) => {
                    let e = Error::io("create scratch file", &scratch.path, None, e);
                    scratch.forget();
                    return Err(e);
                }
            }
        }
    }

    /// Creates `path` new (`O_EXCL`), a file the caller is about to fill (`gpumap write` of a
    /// new file): until [`keep`](Self::keep) says it is complete, it is removed as a scratch
    /// file is — when dropped (an error return, a panic) and when `SIGINT`, `SIGTERM` or
    /// `SIGHUP` ends the process — so that no half-written file stays behind. `Ok(None)` where
    /// a file of that name exists (made by someone else since the caller looked): never this
    /// process's to remove, so the caller writes it as an existing file.
    ///
    /// The path is registered for removal only once the file is created: a signal between the
    /// two leaves an empty file behind, where registering first could remove another
    /// process's file of that name.
    pub fn create_new(path: &Path) -> Result<Option<ScratchFile>> {
        install_handlers();
        match OpenOptions::new().write(true).create_new(true).open(path) {
            Ok(_) => {
                LIVE.lock().push(path.to_path_buf());
                Ok(Some(ScratchFile { path: path.to_path_buf() }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(Error::io("create", path, None, e)),
        }
    }

    /// The file is complete: it stays, and nothing removes it any more.
    pub fn keep(self) {
        self.forget();
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Unregisters the path without removing it.
    fn forget(self) {
        LIVE.lock().retain(|p| p != &self.path);
        std::mem::forget(self);
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let mut live = LIVE.lock();
        // Removed while the lock is held, so the signal thread cannot remove it a second time
        // (after someone else created a file of that name).
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("cannot remove scratch file {}: {e}", self.path.display());
            }
        }
        live.retain(|p| p != &self.path);
    }
}

/// Never returns where `SIGINT`, `SIGTERM` or `SIGHUP` is ending the process (its scratch
/// files being removed, or removed): the signal thread ends it by that signal within moments.
/// Returns at once otherwise. For a program about to end on its own, so that it ends as the
/// signal would have ended it, not by an error the cleanup caused (a scratch file gone from
/// under a write) or a success that raced the signal.
pub fn wait_if_ending() {
    while crate::sys::signals::ending() {
        std::thread::park();
    }
}

/// Removes every live scratch file now. For a program about to end without unwinding
/// (`std::process::exit` runs no destructors); the signal handlers do the same.
pub fn remove_live() {
    for path in LIVE.lock().drain(..) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: `remove_live` acts on every scratch file of the process, so the cases must
    // not run side by side.
    #[test]
    fn scratch_files_are_new_private_and_removed_on_every_path() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("data.bin");
        std::fs::write(&input, b"keep me").unwrap();
        let a = ScratchFile::beside(&input).unwrap();
        let b = ScratchFile::beside(a.path()).unwrap();
        assert_ne!(a.path(), b.path());
        assert_ne!(a.path(), input);
        assert_eq!(a.path().parent(), Some(dir.path()));
        assert_eq!(std::fs::metadata(a.path()).unwrap().len(), 0);
        let (pa, pb) = (a.path().to_path_buf(), b.path().to_path_buf());
        drop(a);
        drop(b);
        assert!(!pa.exists() && !pb.exists());
        assert_eq!(std::fs::read(&input).unwrap(), b"keep me");
        assert!(!LIVE.lock().iter().any(|p| p == &pa || p == &pb));

        // Names that exist are stepped over, never taken or removed.
        let probe = ScratchFile::beside(&input).unwrap();
        let name = probe.path().file_name().unwrap().to_string_lossy().into_owned();
        let (stem, n) = name.rsplit_once('.').unwrap();
        let taken: Vec<PathBuf> = (1..4)
            .map(|k| {
                let path = dir.path().join(format!("{stem}.{}", n.parse::<u64>().unwrap() + k));
                std::fs::write(&path, b"theirs").unwrap();
                path
            })
            .collect();
        let scratch = ScratchFile::beside(&input).unwrap();
        assert!(!taken.contains(&scratch.path().to_path_buf()), "{}", scratch.path().display());
        drop(scratch);
        for path in &taken {
            assert_eq!(std::fs::read(path).unwrap(), b"theirs");
        }

        // A file created new is removed unless kept; one that exists is never taken.
        let target = dir.path().join("made.bin");
        let made = ScratchFile::create_new(&target).unwrap().expect("a new file");
        assert!(target.exists() && LIVE.lock().contains(&target));
        drop(made);
        assert!(!target.exists());
        std::fs::write(&target, b"theirs").unwrap();
        assert!(ScratchFile::create_new(&target).unwrap().is_none());
        assert_eq!(std::fs::read(&target).unwrap(), b"theirs");
        assert!(!LIVE.lock().contains(&target));
        std::fs::remove_file(&target).unwrap();
        ScratchFile::create_new(&target).unwrap().unwrap().keep();
        assert!(target.exists() && !LIVE.lock().contains(&target));
        let missing_dir = dir.path().join("no/such/dir/x.bin");
        assert!(matches!(ScratchFile::create_new(&missing_dir), Err(Error::Io { .. })));

        // Before an exit that runs no destructors.
        remove_live();
        assert!(!probe.path().exists());
        drop(probe); // already gone: no error
        assert!(LIVE.lock().is_empty());
    }
}
