//! A file's bytes as memory a GPU reads directly: a read-only shared mapping of the file,
//! registered with the driver (its pages pinned in the page cache), so that kernels read the
//! page cache over the bus with no copy into device memory first.
//!
//! Mapping a file is `unsafe` in Rust because the process reads memory another process may
//! change or cut (a read past a truncation raises `SIGBUS`). Here the CPU never reads the
//! mapping: only the device does, through pinned pages, which stay resident whatever happens
//! to the file; a file cut while registered leaves the device reading the old pages.

use std::fs::File;
use std::path::Path;
use std::ptr::NonNull;

use memmap2::{Mmap, MmapOptions};

use super::cuda::HostRegistration;
use crate::error::{Error, Result};

/// A file mapped read-only and registered for the GPU (see the module docs).
pub(crate) struct RegisteredFile {
    // Dropped before the mapping it registers.
    registration: Option<HostRegistration>,
    _map: Option<Mmap>,
    len: usize,
}

impl RegisteredFile {
    /// Maps `len` bytes of `file` (at `path`, for errors) and registers them; a current context
    /// is needed (the caller binds one). An empty file maps and registers nothing. A failed
    /// `mmap` is an [`Error::Io`] with its errno (`EACCES` for a file not open for reading,
    /// `ENOMEM` past the address-space limit).
    pub(crate) fn new(file: &File, path: &Path, len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Self { registration: None, _map: None, len });
        }
        // SAFETY: the mapping is never read by the CPU (see the module docs): no reference to
        // its bytes is created, so a concurrent change or cut of the file cannot break Rust's
        // rules; only the device reads it, through the pinned pages.
        let map = unsafe { MmapOptions::new().len(len).map(file) }
            .map_err(|e| Error::io("mmap", path, None, e))?;
        let ptr = NonNull::new(map.as_ptr().cast_mut())
            .ok_or_else(|| Error::InvalidArgument("mmap returned a null pointer".to_owned()))?;
        // SAFETY: `map` is mapped and readable for `len` bytes, and this struct drops the
        // registration before the mapping.
        let registration = unsafe { HostRegistration::read_only(ptr, len)? };
        Ok(Self { registration: Some(registration), _map: Some(map), len })
    }

    /// Where kernels read the file's first byte (0 for an empty file).
    pub(crate) fn device_ptr(&self) -> u64 {
        self.registration.as_ref().map_or(0, HostRegistration::device_ptr)
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_mapping_is_an_io_error_with_its_errno_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("write-only");
        std::fs::write(&path, [7u8; 4096]).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        // Fails in mmap, before any driver call: no GPU needed.
        let Err(e) = RegisteredFile::new(&file, &path, 4096) else {
            panic!("a write-only file was mapped for reading")
        };
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
        assert!(e.to_string().contains("write-only"), "{e}");
    }
}
