//! [`warm`](warm()): bring a range of a file into the page cache, by advice or by reading it.
#![forbid(unsafe_code)]

use std::io;
use std::os::unix::fs::FileExt;

use super::range::ByteRange;
use super::target::{Opened, Target};
use crate::error::Result;
use crate::sys::pagecache as sys;

/// Bytes per `pread` when warming by reading.
const READ_CHUNK_BYTES: usize = 1 << 20;

/// How [`warm`](warm()) brings a range into the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum WarmMode {
    /// `POSIX_FADV_WILLNEED`: asynchronous readahead; returns before the data is cached, and
    /// the kernel may read less under memory pressure.
    #[default]
    Advise,
    /// Read the range (1 MiB at a time, sequential readahead advised) and return when done.
    Read,
}

/// Bring `range` of `target` into the page cache.
#[doc(alias = "posix_fadvise")]
#[doc(alias = "POSIX_FADV_WILLNEED")]
pub fn warm<'a>(target: impl Into<Target<'a>>, range: ByteRange, mode: WarmMode) -> Result<()> {
    let opened = Opened::open(target.into())?;
    let span = range.resolve(opened.size)?;
    if span.pages() == 0 {
        return Ok(());
    }
    match mode {
        WarmMode::Advise => {
            // The kernel reads at most max(readahead window, device I/O size) per WILLNEED
            // call and silently ignores the rest, so advise one window at a time.
            let chunk = willneed_chunk_bytes(opened.device, span.page);
            let end = span.aligned_offset() + span.aligned_len();
            let mut offset = span.aligned_offset();
            while offset < end {
                let len = (end - offset).min(chunk);
                sys::fadvise(opened.fd(), opened.path(), offset, len, sys::Advice::WillNeed)?;
                offset += len;
            }
            Ok(())
        }
        WarmMode::Read => {
            // A hint only; reading works without it.
            let _ = sys::fadvise(
                opened.fd(),
                opened.path(),
                span.aligned_offset(),
                span.aligned_len(),
                sys::Advice::Sequential,
            );
            read_range(&opened, span.aligned_offset(), span.offset + span.len)
        }
    }
}

/// The readahead window of the device holding a file (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`),
/// in bytes, at least a page; 128 KiB (the kernel default) when it cannot be read.
fn willneed_chunk_bytes(device: u64, page: u64) -> u64 {
    const KERNEL_DEFAULT: u64 = 128 << 10;
    let (major, minor) = (libc::major(device as libc::dev_t), libc::minor(device as libc::dev_t));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    let bytes = std::fs::read_to_string(knob)
        .ok()
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .filter(|kb| *kb > 0)
        .map_or(KERNEL_DEFAULT, |kb| kb.saturating_mul(1024));
    (bytes / page).max(1) * page
}

fn read_range(opened: &Opened, start: u64, end: u64) -> Result<()> {
    let mut buffer = vec![0u8; READ_CHUNK_BYTES];
    let mut offset = start;
    while offset < end {
        let want = usize::try_from(end - offset).map_or(buffer.len(), |r| r.min(buffer.len()));
        match opened.file.read_at(&mut buffer[..want], offset) {
            // The file shrank since we looked: nothing more to cache.
            Ok(0) => break,
            Ok(n) => offset += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(opened.io_error("pread", Some(offset), e)),
        }
    }
    Ok(())
}
