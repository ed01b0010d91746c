//! [`lock`](lock()): hold a range of a file resident with `mlock` ([`LockedRange`]), checked
//! first against `RLIMIT_MEMLOCK` and the memory available.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use super::proc::{has_capability, kib_value, memory_available_and_total, proc_status_field};
use super::range::{ByteRange, Span};
use super::residency::{residency_of, MethodChoice};
use super::target::{Opened, Target};
use crate::error::{Error, Result};
use crate::sys::pagecache as sys;

/// A range held resident with `mlock`; dropping it unlocks (and unmaps) the range.
#[derive(Debug)]
pub struct LockedRange {
    window: Option<sys::FileWindow>,
    path: Option<PathBuf>,
    offset: u64,
    len: u64,
}

impl LockedRange {
    /// First byte of the locked range.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes in the locked range.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes pinned, in whole pages.
    pub fn locked_bytes(&self) -> u64 {
        self.window.as_ref().map_or(0, sys::FileWindow::len)
    }

    /// The file, when it was given by path.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Unlock now and see any error (dropping unlocks too, silently).
    pub fn unlock(mut self) -> Result<()> {
        match self.window.take() {
            Some(window) => window.unlock(self.path.as_deref(), self.offset),
            None => Ok(()),
        }
    }
}

impl Drop for LockedRange {
    fn drop(&mut self) {
        if let Some(window) = self.window.take() {
            // Unmapping (when `window` drops) unlocks too, so an error here loses nothing.
            let _ = window.unlock(self.path.as_deref(), self.offset);
        }
    }
}

/// Read `range` of `target` into the page cache and keep it there (`mmap` + `mlock`) until
/// the returned [`LockedRange`] is dropped.
///
/// Checked before anything is locked, as [`Error::ResourceLimit`]: without `CAP_IPC_LOCK`,
/// the range plus what the process already holds locked must fit `RLIMIT_MEMLOCK` (often
/// 8 MiB); and the part of the range not yet cached must fit the memory available
/// (`MemAvailable`) less an eighth of the machine's memory, kept for everything else — locked
/// pages cannot be reclaimed, and locking a large sparse file would otherwise end in the OOM
/// killer. On 32-bit targets the range must also fit the address space.
#[doc(alias = "mlock")]
pub fn lock<'a>(target: impl Into<Target<'a>>, range: ByteRange) -> Result<LockedRange> {
    let opened = Opened::open(target.into())?;
    let span = range.resolve(opened.size)?;
    let window = if span.pages() == 0 {
        None
    } else {
        check_lockable(&opened, &span)?;
        let window = sys::FileWindow::map(
            opened.fd(),
            opened.path(),
            span.aligned_offset(),
            span.aligned_len(),
        )?;
        let locked = window.lock(opened.path(), span.aligned_offset());
        locked.map_err(|e| shrank_while_locking(&opened, &span).unwrap_or(e))?;
        Some(window)
    };
    Ok(LockedRange { window, path: opened.path, offset: span.offset, len: span.len })
}

/// The error of a lock that failed because the file was cut while its pages were faulted in
/// (`mlock` then fails with `ENOMEM`, which would read as the memory limit), where it was.
fn shrank_while_locking(opened: &Opened, span: &Span) -> Option<Error> {
    let now = opened.file.metadata().ok()?.len();
    let end = span.offset + span.len;
    let why = format!(
        "the file shrank to {now} bytes while bytes {}..{end} of it were being locked",
        span.offset
    );
    (now < end).then(|| Error::Io {
        op: "mlock",
        path: opened.path.clone(),
        offset: Some(span.offset),
        source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, why),
    })
}

/// `CAP_IPC_LOCK`: locking beyond `RLIMIT_MEMLOCK`.
const CAP_IPC_LOCK: u32 = 14;

/// Whether `span` of `opened` can be locked without passing `RLIMIT_MEMLOCK` or running the
/// machine out of memory (see [`lock`](lock())).
fn check_lockable(opened: &Opened, span: &Span) -> Result<()> {
    let memlock = if has_capability(CAP_IPC_LOCK) {
        None
    } else {
        let locked = proc_status_field("VmLck:").and_then(|v| kib_value(&v)).unwrap_or(0);
        sys::memlock_limit().map(|limit| (limit, locked))
    };
    let cached = residency_of(opened, span, MethodChoice::Auto)
        .ok()
        .and_then(|r| r.cached_bytes())
        .unwrap_or(0);
    lock_verdict(span.aligned_len(), cached, memlock, memory_available_and_total())
}

/// The rule of [`check_lockable`]: `bytes` to lock, `cached` of them already in the page
/// cache; `memlock` the limit and what the process holds locked (`None`: no limit applies);
/// `memory` the machine's available and total memory (`None`: unknown, not checked).
fn lock_verdict(
    bytes: u64,
    cached: u64,
    memlock: Option<(u64, u64)>,
    memory: Option<(u64, u64)>,
) -> Result<()> {
    if let Some((limit, locked)) = memlock {
        let available = limit.saturating_sub(locked);
        if bytes > available {
            return Err(Error::ResourceLimit {
                resource: "RLIMIT_MEMLOCK",
                requested: bytes,
                available,
                hint: "raise the limit (ulimit -l, LimitMEMLOCK= for a systemd service) or run \
                       with CAP_IPC_LOCK",
            });
        }
    }
    if let Some((available, total)) = memory {
        let new_bytes = bytes.saturating_sub(cached);
        let spare = available.saturating_sub(total / 8);
        if new_bytes > spare {
            return Err(Error::ResourceLimit {
                resource: "the memory available (MemAvailable, less an eighth of MemTotal)",
                requested: new_bytes,
                available: spare,
                hint: "lock a smaller range; locked pages cannot be reclaimed",
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Report;

    #[test]
    fn locks_are_checked_against_memlock_and_memory_first() {
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        let limit_of = |e: Error| match e {
            Error::ResourceLimit { resource, requested, available, .. } => {
                (resource, requested, available)
            }
            other => panic!("expected ResourceLimit, got {other:?}"),
        };
        // 8 MiB limit, 6 MiB already locked: 4 MiB more do not fit, 2 MiB do.
        let e = lock_verdict(4 * MIB, 0, Some((8 * MIB, 6 * MIB)), None).unwrap_err();
        assert_eq!(limit_of(e), ("RLIMIT_MEMLOCK", 4 * MIB, 2 * MIB));
        assert!(lock_verdict(2 * MIB, 0, Some((8 * MIB, 6 * MIB)), None).is_ok());
        // No limit (CAP_IPC_LOCK, or unlimited): memory decides. 64 GiB of a sparse file on a
        // 24 GiB machine with 20 GiB available: 17 GiB may be added.
        let memory = Some((20 * GIB, 24 * GIB));
        let (resource, requested, available) =
            limit_of(lock_verdict(64 * GIB, 0, None, memory).unwrap_err());
        assert!(resource.contains("MemAvailable"), "{resource}");
        assert_eq!((requested, available), (64 * GIB, 17 * GIB));
        // What is cached already costs nothing new.
        assert!(lock_verdict(30 * GIB, 14 * GIB, None, memory).is_ok());
        assert!(lock_verdict(64 * GIB, 0, None, None).is_ok());
        let shown = Report(&lock_verdict(9 * MIB, 0, Some((8 * MIB, 0)), None).unwrap_err());
        assert!(shown.to_string().contains("RLIMIT_MEMLOCK"), "{shown}");
    }

    #[test]
    fn a_lock_failing_on_a_file_cut_meanwhile_says_so() {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(1 << 20).unwrap();
        let opened = Opened::open(Target::Path(file.path())).unwrap();
        let span = ByteRange::new(4096, 65536).resolve(opened.size).unwrap();
        assert!(shrank_while_locking(&opened, &span).is_none(), "the file is whole");
        file.as_file().set_len(8192).unwrap();
        let shown = Report(&shrank_while_locking(&opened, &span).unwrap()).to_string();
        assert!(shown.contains("shrank to 8192 bytes while bytes 4096..69632"), "{shown}");
        assert!(!shown.contains("RLIMIT"), "{shown}");
    }
}
