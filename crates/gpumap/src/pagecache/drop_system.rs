//! [`drop_system`](drop_system()): drop the whole machine's clean page cache through
//! `/proc/sys/vm/drop_caches`.
#![forbid(unsafe_code)]

use std::fs::OpenOptions;
use std::io;
use std::path::Path;

use crate::error::{Error, Result};
use crate::sys::pagecache as sys;

/// The kernel's knob for dropping clean caches system-wide.
const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

/// Drop the whole system's clean page cache (and, with `reclaim_dentries`, the dentry and
/// inode caches): `sync`, then write `1` (or `3`) to `/proc/sys/vm/drop_caches`.
///
/// Needs root (`CAP_SYS_ADMIN`) and a writable `/proc/sys`; without them the error says so
/// and keeps the OS error (`EACCES`, `EPERM` or `EROFS`). Dirty pages are written first, but
/// pages that are mapped, locked or dirtied meanwhile stay.
#[doc(alias = "drop_caches")]
#[doc(alias = "drop_system_page_cache")]
pub fn drop_system(reclaim_dentries: bool) -> Result<()> {
    const NEEDS: &str = "writing vm.drop_caches (needs root with CAP_SYS_ADMIN and a writable \
                         /proc/sys, which containers usually mount read-only)";
    let path = Path::new(DROP_CACHES);
    // Open before syncing so that an unprivileged call fails fast instead of syncing first.
    let mut knob = OpenOptions::new().write(true).open(path).map_err(|e| Error::Io {
        op: if is_permission_error(&e) { NEEDS } else { "open" },
        path: Some(path.to_path_buf()),
        offset: None,
        source: e,
    })?;
    sys::sync_all();
    let value: &[u8] = if reclaim_dentries { b"3\n" } else { b"1\n" };
    io::Write::write_all(&mut knob, value).map_err(|e| Error::Io {
        op: if is_permission_error(&e) { NEEDS } else { "write" },
        path: Some(path.to_path_buf()),
        offset: None,
        source: e,
    })
}

fn is_permission_error(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS))
}
