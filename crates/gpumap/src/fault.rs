//! Injected write faults, for testing what a program does when the disk fails (feature
//! `fault-injection`; without it the hook compiles to nothing).
//!
//! Every `pwrite` gpumap issues (host and device paths, flushes and write-backs) asks the
//! armed fault first: writes to a path containing [`WriteFault::path_contains`] succeed until
//! [`WriteFault::after_bytes`] bytes went through (the write that crosses it is cut short at a
//! page multiple), then fail with [`WriteFault::errno`] — `EIO`, `ENOSPC`, ..., or write nothing
//! (errno 0) — until disarmed or `times` failures were reported.
//!
//! ```
//! # #[cfg(feature = "fault-injection")] {
//! use gpumap::fault::{arm_write_fault, disarm, WriteFault};
//! arm_write_fault(WriteFault { path_contains: "table.bin".into(), errno: libc::EIO, after_bytes: 4096, times: 0 });
//! // ... run the code under test, check it reports EIO and loses nothing ...
//! disarm();
//! # }
//! ```
#![forbid(unsafe_code)]

use std::path::Path;

/// A fault to inject into writes (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFault {
    /// Only writes to paths containing this string fail.
    pub path_contains: String,
    /// The error to report (`libc::EIO`, `libc::ENOSPC`, ...); 0: the write returns 0 bytes
    /// instead of an error (a zero-byte write, which carries no errno).
    pub errno: i32,
    /// Bytes that may still be written before writes start failing.
    pub after_bytes: u64,
    /// Failures to report before the fault disarms itself; 0 = until `disarm()`.
    pub times: u32,
}

#[cfg(feature = "fault-injection")]
mod armed {
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::sync::Mutex;

    use super::WriteFault;

    pub(super) static ARMED: AtomicBool = AtomicBool::new(false);
    pub(super) static FAULT: Mutex<Option<(WriteFault, u64, u32)>> = Mutex::new(None);

    pub(super) fn set(fault: Option<WriteFault>) {
        let mut slot = FAULT.lock();
        ARMED.store(fault.is_some(), Ordering::SeqCst);
        *slot = fault.map(|f| (f, 0, 0));
    }
}

/// Arms `fault` for every later write of this process (replacing any armed one).
#[cfg(feature = "fault-injection")]
pub fn arm_write_fault(fault: WriteFault) {
    armed::set(Some(fault));
}

/// Disarms the write fault.
#[cfg(feature = "fault-injection")]
pub fn disarm() {
    armed::set(None);
}

/// How many of `len` bytes a write to `path` may write now, or the armed error.
#[cfg(feature = "fault-injection")]
pub(crate) fn before_write(path: &Path, len: usize) -> std::io::Result<usize> {
    use std::sync::atomic::Ordering;
    if !armed::ARMED.load(Ordering::Relaxed) {
        return Ok(len);
    }
    let mut slot = armed::FAULT.lock();
    let Some((fault, written, failures)) = slot.as_mut() else { return Ok(len) };
    if !path.to_string_lossy().contains(&fault.path_contains) {
        return Ok(len);
    }
    let room = fault.after_bytes.saturating_sub(*written);
    // A short write is cut at a page multiple, as a device cuts one (an O_DIRECT write of an
    // unaligned length would fail with EINVAL instead).
    let allowed = if (len as u64) <= room { len } else { (room / 4096 * 4096) as usize };
    if allowed > 0 {
        *written += allowed as u64;
        return Ok(allowed);
    }
    let errno = fault.errno;
    *failures += 1;
    if fault.times != 0 && *failures >= fault.times {
        *slot = None;
        armed::ARMED.store(false, Ordering::SeqCst);
    }
    if errno == 0 {
        return Ok(0);
    }
    Err(std::io::Error::from_raw_os_error(errno))
}

/// Without the feature: every write goes through whole.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn before_write(_path: &Path, len: usize) -> std::io::Result<usize> {
    Ok(len)
}
