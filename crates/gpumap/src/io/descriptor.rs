//! File descriptors handed over by number or borrowed from a file, as bindings get them
//! (Python's `fileno()`): duplicated to be held safely, and their open flags read.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, RawFd};

use crate::sys::posix;

/// A file of its own on the open file description the number `fd` names in this process (a
/// close-on-exec duplicate), so that it stays open while the caller's descriptor is closed. A
/// number that names no open descriptor is `EBADF`; what the number names is the caller's
/// word, as with `os.dup`.
#[doc(alias = "dup")]
#[doc(alias = "F_DUPFD_CLOEXEC")]
pub fn duplicate(fd: RawFd) -> io::Result<File> {
    posix::fcntl_dupfd_cloexec(fd).map(File::from)
}

/// The open flags of `fd`: its access mode (`O_RDONLY`, `O_WRONLY` or `O_RDWR`) with
/// `O_APPEND`, `O_DIRECT` and the other status flags, as `fcntl(fd, F_GETFL)` reports them.
#[doc(alias = "fcntl")]
#[doc(alias = "F_GETFL")]
pub fn open_flags(fd: impl AsFd) -> io::Result<i32> {
    posix::fcntl_getfl(fd.as_fd())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn a_duplicate_outlives_the_descriptor_it_was_made_from() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, b"abc").unwrap();
        let original = File::open(&path).unwrap();
        let duplicate = duplicate(original.as_raw_fd()).unwrap();
        drop(original);
        assert_eq!(std::io::read_to_string(&duplicate).unwrap(), "abc");
        assert_eq!(super::duplicate(-1).unwrap_err().raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn open_flags_say_how_the_file_was_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let file = File::create(&path).unwrap();
        assert_eq!(open_flags(&file).unwrap() & libc::O_ACCMODE, libc::O_WRONLY);
        let file = std::fs::OpenOptions::new().read(true).append(true).open(&path).unwrap();
        let flags = open_flags(&file).unwrap();
        assert_eq!(flags & libc::O_ACCMODE, libc::O_RDWR);
        assert_ne!(flags & libc::O_APPEND, 0);
    }
}
