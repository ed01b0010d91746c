//! [`Target`]: the file a call asks about — a path, an open file or a descriptor — and the
//! file opened for the call (`Opened`), with its size, owner and device.
#![forbid(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The file to ask about: a path, an open [`File`], or a borrowed descriptor.
///
/// Functions take `impl Into<Target>`, so `residency(Path::new("x"), ..)`,
/// `residency("x", ..)` and `residency(&file, ..)` all work.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// Opened read-only (and non-blocking, so a FIFO is refused rather than waited on).
    Path(&'a Path),
    /// An open file; its offset is not changed.
    File(&'a File),
    /// A borrowed descriptor (duplicated for the call; its offset is not changed).
    Fd(BorrowedFd<'a>),
}

impl<'a> From<&'a Path> for Target<'a> {
    fn from(p: &'a Path) -> Self {
        Target::Path(p)
    }
}
impl<'a> From<&'a PathBuf> for Target<'a> {
    fn from(p: &'a PathBuf) -> Self {
        Target::Path(p)
    }
}
impl<'a> From<&'a str> for Target<'a> {
    fn from(p: &'a str) -> Self {
        Target::Path(Path::new(p))
    }
}
impl<'a> From<&'a File> for Target<'a> {
    fn from(f: &'a File) -> Self {
        Target::File(f)
    }
}
impl<'a> From<BorrowedFd<'a>> for Target<'a> {
    fn from(fd: BorrowedFd<'a>) -> Self {
        Target::Fd(fd)
    }
}

/// An opened target: the file, its path when known, its size and owner.
pub(super) struct Opened {
    pub(super) file: File,
    pub(super) path: Option<PathBuf>,
    pub(super) size: u64,
    pub(super) owner_uid: u32,
    /// `st_dev`: the device (and so the readahead settings) the file lives on.
    pub(super) device: u64,
}

impl Opened {
    /// Opens `target` for the call (see [`Target`]); refuses anything but a regular file or
    /// a block device.
    pub(super) fn open(target: Target<'_>) -> Result<Opened> {
        let (file, path) = match target {
            Target::Path(p) => {
                let file = OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(p)
                    .map_err(|e| Error::io("open", p, None, e))?;
                (file, Some(p.to_path_buf()))
            }
            Target::File(f) => (f.try_clone().map_err(|e| Error::io_nopath("dup", e))?, None),
            Target::Fd(fd) => {
                (File::from(fd.try_clone_to_owned().map_err(|e| Error::io_nopath("dup", e))?), None)
            }
        };
        let meta = file.metadata().map_err(|e| Error::Io {
            op: "fstat",
            path: path.clone(),
            offset: None,
            source: e,
        })?;
        let kind = meta.file_type();
        let size = if kind.is_file() {
            // A /proc or /sys file's size says nothing about its content, and it has no pages in
            // the cache: refused, as `read` and `map` refuse it, rather than reported empty.
            let named = path.clone().unwrap_or_else(|| PathBuf::from("the file"));
            let magic = crate::sys::posix::file_system_magic(&file, &named)?;
            if let Some(what) = crate::sys::posix::pseudo_file_system(magic) {
                return Err(Error::NotRegularFile { path, what });
            }
            meta.len()
        } else if kind.is_block_device() {
            // fstat reports 0 for block devices; their size is where a seek to the end lands.
            // The descriptor may be a duplicate sharing the caller's offset, so put it back.
            block_device_size(&file).map_err(|e| Error::Io {
                op: "lseek",
                path: path.clone(),
                offset: None,
                source: e,
            })?
        } else {
            let what = if kind.is_dir() {
                return Err(Error::Io {
                    op: "open",
                    path,
                    offset: None,
                    source: io::Error::from_raw_os_error(libc::EISDIR),
                });
            } else if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_socket() {
                "a socket"
            } else if kind.is_char_device() {
                "a character device"
            } else {
                "a special file"
            };
            return Err(Error::NotRegularFile { path, what });
        };
        Ok(Opened { file, path, size, owner_uid: meta.uid(), device: meta.dev() })
    }

    pub(super) fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
    pub(super) fn io_error(
        &self,
        op: &'static str,
        offset: Option<u64>,
        source: io::Error,
    ) -> Error {
        Error::Io { op, path: self.path.clone(), offset, source }
    }
}

fn block_device_size(mut file: &File) -> io::Result<u64> {
    let position = file.stream_position()?;
    let size = file.seek(SeekFrom::End(0))?;
    file.seek(SeekFrom::Start(position))?;
    Ok(size)
}
