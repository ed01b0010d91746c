//! An open file of a cache, as the faces see it: the engine's entry for it, how it is being
//! read (for read-ahead), its zero-copy registration; opening, closing (write-back, then the
//! memory goes back), and gathers of ranges of open files, which `DeviceCache` and
//! `DeviceMappedFile` both offer.
#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Arc;

use crate::sync::Mutex;

use super::engine::{self, Backing, Engine, FileEntry, GatherRange};
use super::map_options::{MapOptions, ZeroCopy};
use super::read_ahead::AccessState;
use super::zero_copy::{self, ZeroCopyFile, ZeroCopyOptions};
use crate::error::{Error, Result};
use crate::io::HandleOptions;
use crate::memory::DeviceViewMut;

/// An open file of a cache; closed (written back, its memory given back) when the last map
/// handle and view of it go.
pub(crate) struct OpenFile {
    pub(crate) engine: Arc<Engine>,
    pub(crate) entry: Arc<FileEntry>,
    pub(crate) access: Mutex<AccessState>,
    /// Bytes a walk reads ahead.
    pub(crate) read_ahead: u64,
    /// The file registered for the GPU to read in place (`MapOptions::zero_copy`).
    pub(crate) zero_copy: Option<ZeroCopyFile>,
    /// Whether row gathers still look in the cache first, reading only their misses in place
    /// (`ZeroCopy::Misses`).
    pub(crate) misses_in_place: bool,
    /// The fork generation of the process that opened it (see [`OpenFile::is_inherited`]).
    opened_in: u64,
}

impl OpenFile {
    /// Opens `path` in `engine`'s cache with `options`.
    pub(crate) fn open(
        engine: Arc<Engine>,
        path: &Path,
        options: &MapOptions,
    ) -> Result<Arc<OpenFile>> {
        let writable = options.is_writable();
        let handle_options = match options.handle() {
            Some(o) => o.clone(),
            None => {
                // Write-backs go through the page cache, as an mmap's do: many small scattered
                // writes each made synchronous to the disk by O_DIRECT would crawl, and `sync`
                // makes them durable.
                let mut o = HandleOptions::from_config(crate::config::Config::global()?);
                o.direct_write(false);
                o
            }
        };
        let mode = options.zero_copy_mode();
        let max_pinned = match mode {
            ZeroCopy::Off => None,
            ZeroCopy::On | ZeroCopy::Misses => Some(None),
            ZeroCopy::Within(bytes) | ZeroCopy::MissesWithin(bytes) => Some(Some(bytes)),
        };
        if max_pinned.is_some() && writable {
            return Err(Error::InvalidArgument(format!(
                "{}: the zero-copy tier serves read-only maps; this one is writable",
                path.display()
            )));
        }
        let file = handle_options.open(path, if writable { "r+" } else { "r" })?;
        let zero_copy = match max_pinned {
            Some(max_pinned) => {
                let mut zero_copy = ZeroCopyOptions::new();
                zero_copy.device(engine.device());
                if let Some(bytes) = max_pinned {
                    zero_copy.max_pinned(bytes);
                }
                Some(ZeroCopyFile::with_handle(file.clone(), &zero_copy)?)
            }
            None => None,
        };
        // The registered length where there is one: a file grown since is mapped no further
        // than the memory the GPU may read in place.
        let len = match &zero_copy {
            Some(registered) => registered.len(),
            None => file.len()?,
        };
        let identity = {
            use std::os::unix::fs::MetadataExt;
            let meta = file.file().metadata().map_err(|e| Error::io("fstat", path, None, e))?;
            (meta.dev(), meta.ino())
        };
        let entry = engine.add_file(
            path.to_path_buf(),
            Backing::Local(file),
            Some(identity),
            writable,
            len,
        )?;
        let misses_in_place = matches!(mode, ZeroCopy::Misses | ZeroCopy::MissesWithin(_));
        Ok(Self::opened(engine, entry, options, zero_copy, misses_in_place))
    }

    /// The open file of `entry`, just added to `engine`'s books.
    fn opened(
        engine: Arc<Engine>,
        entry: Arc<FileEntry>,
        options: &MapOptions,
        zero_copy: Option<ZeroCopyFile>,
        misses_in_place: bool,
    ) -> Arc<OpenFile> {
        let access = AccessState { advice: options.access_advice(), ..AccessState::default() };
        Arc::new(OpenFile {
            engine,
            entry,
            access: Mutex::new(access),
            read_ahead: options.read_ahead_bytes(),
            zero_copy,
            misses_in_place,
            opened_in: crate::per_process::fork_generation(),
        })
    }

    /// Whether this is a forked child's copy of its parent's file. The engine's books are then
    /// the parent's, copied at the fork with whatever its threads were doing half done: the
    /// child must not write back the parent's dirty extents (the parent may have written
    /// newer bytes since) nor change the books, so dropping the file or its views there does
    /// nothing.
    pub(crate) fn is_inherited(&self) -> bool {
        crate::per_process::fork_generation() != self.opened_in
    }

    /// Maps the remote object `file` in `engine`'s cache, read-only: its extents are read
    /// with ranged GETs when they miss (adjacent missing extents in one request), and stay
    /// resident as a local file's do. Writable and zero-copy options are refused: a remote
    /// object is replaced whole, never written in place, and has no pages to read in place.
    #[cfg(feature = "remote")]
    pub(crate) fn open_remote(
        engine: Arc<Engine>,
        file: crate::remote::RemoteFile,
        options: &MapOptions,
    ) -> Result<Arc<OpenFile>> {
        let shown = file.url().redacted();
        if options.is_writable() {
            return Err(Error::InvalidArgument(format!(
                "{shown} is a remote object: it is mapped read-only"
            )));
        }
        if !matches!(options.zero_copy_mode(), ZeroCopy::Off) {
            return Err(Error::InvalidArgument(format!(
                "{shown} is a remote object: the zero-copy tier reads local files in place"
            )));
        }
        let pool = crate::io::IoPool::global()?;
        let len = file.len();
        let backing = Backing::Remote { file, pool };
        let entry = engine.add_file(std::path::PathBuf::from(shown), backing, None, false, len)?;
        Ok(Self::opened(engine, entry, options, None, false))
    }

    /// `Ok` when `[offset, offset + len)` lies within the mapped length.
    pub(crate) fn check(&self, offset: u64, len: u64) -> Result<()> {
        crate::align::check_range(offset, len, self.entry.len)
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        if self.is_inherited() {
            return;
        }
        // The last handle and the last view are gone: write back what is dirty (errors can only
        // be logged here; `close` returns them), then give the memory back.
        if self.entry.writable {
            let all = 0..self.engine.geometry.extents(self.entry.len);
            if let Err(e) = engine::write_back(&self.engine, &self.entry, all) {
                tracing::warn!(
                    "flushing {} on drop failed: {}",
                    self.entry.path.display(),
                    crate::error::Report(&e)
                );
            }
        }
        self.engine.remove_file(&self.entry);
    }
}

/// Checks `ranges` — `(file, offset, len)`, files of `engine`'s cache — and returns their
/// total length: each within its mapped length and, one `fstat` per file, within its length
/// now (a file cut under its map reads as cut, whatever the cache still holds of it). A file of
/// another cache must never reach these books: file ids are numbered per cache, so its extents
/// would be filed under another file of this one (whose reads would then return them, and whose
/// write-back would write them into that file).
pub(crate) fn check_ranges(engine: &Arc<Engine>, ranges: &[(&OpenFile, u64, u64)]) -> Result<u64> {
    let mut total = 0u64;
    // (file, the range asked of it that ends furthest).
    let mut furthest: Vec<(&OpenFile, u64, u64)> = Vec::new();
    for &(file, offset, len) in ranges {
        if !Arc::ptr_eq(&file.engine, engine) {
            return Err(Error::InvalidArgument(format!(
                "{} is open in another cache",
                file.entry.path.display()
            )));
        }
        file.check(offset, len)?;
        total = total.checked_add(len).ok_or(Error::Overflow { offset: total, len })?;
        let end = offset + len;
        match furthest.iter_mut().find(|f| std::ptr::eq(f.0, file)) {
            Some(f) if f.1 + f.2 < end => *f = (file, offset, len),
            Some(_) => {}
            None => furthest.push((file, offset, len)),
        }
    }
    for (file, offset, len) in furthest {
        file.entry.file.expect_ranges([(offset, len)])?;
    }
    Ok(total)
}

/// Copies `ranges` (checked by [`check_ranges`]), packed one after another, into `dst`; or,
/// without `dst`, only makes them resident. Ranges all of zero-copy files are read in place.
pub(crate) fn gather(
    engine: &Engine,
    ranges: &[(&OpenFile, u64, u64)],
    dst: Option<DeviceViewMut<'_>>,
) -> Result<()> {
    if let Some(dst) = dst {
        let zero_copy: Option<Vec<_>> = ranges
            .iter()
            .map(|&(f, offset, len)| Some((f.zero_copy.as_ref()?, offset, len)))
            .collect();
        if let Some(rows) = zero_copy.filter(|rows| !rows.is_empty()) {
            return zero_copy::copy_rows(&rows, dst);
        }
        return engine::gather(engine, &batch(ranges), Some(dst));
    }
    // Zero-copy files need nothing made resident.
    let cached: Vec<(&OpenFile, u64, u64)> =
        ranges.iter().copied().filter(|(f, ..)| f.zero_copy.is_none()).collect();
    engine::gather(engine, &batch(&cached), None)
}

fn batch<'a>(ranges: &[(&'a OpenFile, u64, u64)]) -> Vec<GatherRange<'a>> {
    ranges
        .iter()
        .map(|&(file, offset, len)| GatherRange { entry: &file.entry, offset, len })
        .collect()
}
