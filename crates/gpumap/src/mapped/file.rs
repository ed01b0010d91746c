//! A file's face on a cache: [`DeviceMappedFile`] — views, reads and writes through the cache,
//! gathers, prefetch and advice, flush and sync — and [`MapRange`], a range of it for gathers
//! across the files of a cache.
#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Arc;

use super::engine::{self, AdmissionClaim, Engine, MissesInPlace, PinFor, Pins};
use super::handle::{self, OpenFile};
use super::map_options::{Advice, MapOptions};
use super::read_ahead::{self, Walk};
use super::row_indices::RowIndices;
use super::sizing::Requested;
use super::stats::{CacheStats, FileStats};
use super::view::{View, ViewMut};
use crate::error::{Error, Result};
use crate::io::IoFuture;
use crate::memory::{Device, DeviceViewMut, OwnedDeviceMemory, StreamRef};

/// A file mapped into device memory: mmap semantics on the GPU, in a
/// [`DeviceCache`](super::DeviceCache).
///
/// The file is one contiguous range of device addresses, `base() + offset`. Nothing is resident
/// at first; a [`View`] of a range faults in what is missing and pins it until dropped. Memory
/// comes from the cache's budget, shared by its files and evicted least recently used first,
/// after its dirty extents were written back. [`flush`](Self::flush) writes every dirty extent
/// back; [`sync`](Self::sync) also makes it durable.
///
/// Without a GPU (or with [`Device::Host`]) host memory stands in: the same books, faults and
/// write-backs; there is no device address range then, so [`View::device`] is `None` and data
/// moves with [`View::copy_to_host`] / [`ViewMut::copy_from_host`] (which work on both).
///
/// Semantics, as users of mmap expect them:
/// - A read-write map never changes the file's length. The partial last extent reads as the
///   file's bytes, then zeros.
/// - Bytes written through a live [`ViewMut`] count as dirty until a write-back that started
///   after the view was dropped has finished; a flush while it lives writes them but keeps them
///   dirty. Finish the work that writes through a view (synchronize its stream) before dropping
///   it.
/// - A failed write-back keeps its extents dirty, returns the error, and makes every later
///   flush return it until a [`sync`](Self::sync) writes every byte ([`Error::WriteBack`]).
/// - Dropping the last handle (and view) flushes, logging errors; [`close`](Self::close)
///   returns them.
/// - A file cut under the map reads as cut: a read or gather of a range past its new end is
///   [`Error::UnexpectedEof`] naming its length now, whatever the map still holds; dirty bytes
///   past it are not written back ([`Error::FileShrank`]).
/// - Memory never exceeds the budget; a view needing more than the budget, or more than views
///   leave unpinned, is [`Error::OutOfBudget`].
/// - Two threads faulting the same extent cause one read; views pin their memory, so eviction
///   never takes it from under a live view.
/// - A single-extent read view may be served from a slot (random-access residency); if the
///   extent is later written through a writable view, a read view taken before keeps the bytes
///   it had.
/// - A map is its process's: a forked child opens the file again. Dropping an inherited map or
///   view in the child does nothing (no write-back of the parent's dirty extents), and calls
///   on it may wait for the parent's threads.
///
/// ```
/// use gpumap::mapped::DeviceMappedFile;
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("weights.bin");
/// # std::fs::write(&path, vec![7u8; 3 << 20])?;
/// let map = DeviceMappedFile::open(&path)?;
/// let view = map.view(4096, 1 << 20)?;          // faults in what is missing, pins it
/// if let Some(device) = view.device() {           // GPU memory, for kernels
///     println!("{:#x}", device.ptr());
/// }
/// let mut first = [0u8; 16];
/// view.copy_to_host(0, &mut first)?;               // works on both backends
/// assert_eq!(first, [7u8; 16]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct DeviceMappedFile {
    inner: Arc<OpenFile>,
}

impl std::fmt::Debug for DeviceMappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMappedFile")
            .field("path", &self.inner.entry.path)
            .field("len", &self.len())
            .field("writable", &self.inner.entry.writable)
            .field("memory", &self.memory())
            .finish()
    }
}

/// A range of a mapped file, for [`DeviceCache::gather`](super::DeviceCache::gather).
#[derive(Debug, Clone, Copy)]
pub struct MapRange<'a> {
    map: &'a DeviceMappedFile,
    offset: u64,
    len: u64,
}

impl MapRange<'_> {
    /// The range as the engine takes it: the open file, offset and length.
    pub(crate) fn parts(&self) -> (&OpenFile, u64, u64) {
        (&self.map.inner, self.offset, self.len)
    }

    /// A view of the range (see [`DeviceMappedFile::view`]).
    pub(crate) fn view(&self) -> Result<View> {
        self.map.view(self.offset, self.len)
    }
}

impl DeviceMappedFile {
    pub(crate) fn from_open(inner: Arc<OpenFile>) -> Self {
        DeviceMappedFile { inner }
    }

    /// Maps `path` read-only with the default [`MapOptions`], in a cache of its own: a budget
    /// of the whole file up to 4 GiB ([`CacheOptions::for_file`](super::CacheOptions::for_file)),
    /// 64 KiB extents, frames by budget, GPU 0 where there is one. For other sizes, build a [`DeviceCache`](super::DeviceCache) with
    /// [`CacheOptions`](super::CacheOptions) and open the file in it.
    pub fn open(path: impl AsRef<Path>) -> Result<DeviceMappedFile> {
        Self::open_with(path, &MapOptions::new())
    }

    /// Maps `path` with `options`, in a cache of its own sized as [`open`](Self::open) sizes it.
    pub fn open_with(path: impl AsRef<Path>, options: &MapOptions) -> Result<DeviceMappedFile> {
        let path = path.as_ref();
        let len = std::fs::metadata(path)
            .map_err(|e| Error::Io {
                op: "stat",
                path: Some(path.to_path_buf()),
                offset: None,
                source: e,
            })?
            .len();
        let engine = Arc::new(Engine::new(&Requested::for_file(len).resolve()?)?);
        Ok(DeviceMappedFile { inner: OpenFile::open(engine, path, options)? })
    }

    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.inner.engine
    }

    pub(crate) fn entry(&self) -> &engine::FileEntry {
        &self.inner.entry
    }

    /// The path it was opened with (a remote object's URL, without credentials).
    pub fn path(&self) -> &Path {
        &self.entry().path
    }

    /// Whether it maps a remote object (`DeviceCache::open_remote`, with the `remote` feature).
    pub fn is_remote(&self) -> bool {
        self.entry().file.is_remote()
    }

    /// Bytes mapped: the file's length when it was mapped.
    pub fn len(&self) -> u64 {
        self.entry().len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether writes are allowed.
    pub fn is_writable(&self) -> bool {
        self.entry().writable
    }

    /// Whether this map was opened in another process: the parent this one was forked from.
    /// Its cache's books are then the parent's, copied at the fork, so a child neither writes
    /// back nor unmaps anything of it (dropping it there does nothing); a child maps the file
    /// again to use it.
    pub fn is_inherited(&self) -> bool {
        self.inner.is_inherited()
    }

    /// The device address of the file's first byte; the file's byte `o` is at `base() + o`
    /// while a view pins it (on a zero-copy map: always, in the registered page cache). `None`
    /// on the host backend.
    pub fn base(&self) -> Option<u64> {
        match &self.inner.zero_copy {
            Some(file) => file.device_ptr(),
            None => self.engine().store.base(&self.entry().memory),
        }
    }

    /// The cache's frame size.
    pub fn frame_size(&self) -> u64 {
        self.engine().geometry.frame
    }

    /// The cache's extent size.
    pub fn extent_size(&self) -> u64 {
        self.engine().geometry.extent
    }

    /// Where the cache's memory is.
    pub fn device(&self) -> Device {
        self.engine().device()
    }

    /// Where the bytes live: `"GPU 0 (NVIDIA H100 PCIe)"` or `"host memory"`.
    pub fn memory(&self) -> String {
        self.engine().store.describe()
    }

    /// What this file has done so far.
    pub fn stats(&self) -> FileStats {
        FileStats::from(self.engine().file_numbers(self.entry().id))
    }

    /// What the cache the file is in holds and has done (over all its files).
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats::new(self.engine())
    }

    /// `[offset, offset + len)` of this file, for
    /// [`DeviceCache::gather`](super::DeviceCache::gather).
    pub fn range(&self, offset: u64, len: u64) -> MapRange<'_> {
        MapRange { map: self, offset, len }
    }

    /// A read-only view of `[offset, offset + len)`, resident and pinned until dropped.
    ///
    /// A range within one extent is served from wherever the extent is, and a missing one is
    /// read into a slot (one extent of memory) unless the file is advised `Sequential` or its
    /// cache was made to hold it whole ([`CacheOptions::for_file`](super::CacheOptions::for_file),
    /// as [`DeviceMappedFile::open`] makes it), which reads it into its frame; a wider
    /// range is one contiguous piece of memory at `base() + offset`, its frames mapped as
    /// needed. A view starting where the previous one ended (or any view of a `Sequential`
    /// file) reads the next windows ahead in the background. On a map opened with
    /// [`MapOptions::zero_copy`] the view is the registered file itself: no cache memory.
    pub fn view(&self, offset: u64, len: u64) -> Result<View> {
        self.inner.check(offset, len)?;
        if self.inner.zero_copy.is_some() {
            return Ok(View::new(self.inner.clone(), offset, len, Pins::ZeroCopy));
        }
        let g = self.engine().geometry;
        let advice = self.inner.access.lock().advice;
        let extents = g.extents_covering(offset, len);
        let single = extents.end - extents.start == 1;
        let pins = if single && advice != Advice::Sequential && !self.engine().views_in_frames {
            engine::pin_extent(self.engine(), self.entry(), extents.start)?
        } else {
            // Before this window is waited for, so that the pool reads the next ones meanwhile.
            self.read_ahead(offset, len);
            engine::pin_frames(self.engine(), self.entry(), offset, len, PinFor::Read)?
        };
        Ok(View::new(self.inner.clone(), offset, len, pins))
    }

    /// A writable view of `[offset, offset + len)` (always contiguous, in the file's frames);
    /// its extents count as dirty until written back after it is dropped. `AccessMode` on a
    /// read-only map.
    pub fn view_mut(&self, offset: u64, len: u64) -> Result<ViewMut> {
        if !self.is_writable() {
            return Err(Error::AccessMode {
                path: self.path().to_path_buf(),
                mode: "r".to_owned(),
                op: "writing (open the map writable)",
            });
        }
        self.inner.check(offset, len)?;
        let pins = engine::pin_frames(self.engine(), self.entry(), offset, len, PinFor::Write)?;
        Ok(ViewMut::new(View::new(self.inner.clone(), offset, len, pins)))
    }

    /// Views of many ranges: the missing extents of all of them are read together first (one
    /// batch, as [`gather`](Self::gather) does), then each view is taken.
    pub fn views(&self, ranges: &[(u64, u64)]) -> Result<Vec<View>> {
        let parts: Vec<(&OpenFile, u64, u64)> =
            ranges.iter().map(|&(offset, len)| (&*self.inner, offset, len)).collect();
        handle::check_ranges(self.engine(), &parts)?;
        handle::gather(self.engine(), &parts, None)?;
        ranges.iter().map(|&(offset, len)| self.view(offset, len)).collect()
    }

    /// A view of `[offset, offset + len)` in the file's frames, whatever its size: the windows
    /// of `read`, which walk a range, want its frames rather than slots.
    fn window(&self, offset: u64, len: u64) -> Result<View> {
        let pins = engine::pin_frames(self.engine(), self.entry(), offset, len, PinFor::Read)?;
        Ok(View::new(self.inner.clone(), offset, len, pins))
    }

    /// Starts reading the windows after `[offset, offset + len)` when the access is a walk (see
    /// [`read_ahead::plan`]), each piece one job on the file's pool.
    fn read_ahead(&self, offset: u64, len: u64) {
        let g = self.engine().geometry;
        let walk = Walk {
            read_ahead: self.inner.read_ahead,
            budget: self.engine().max_frames as u64 * g.frame,
            frame: g.frame,
            extent: g.extent,
            file_len: self.len(),
        };
        let pieces = read_ahead::plan(&mut self.inner.access.lock(), &walk, offset, len);
        for (from, n) in pieces {
            let map = self.clone();
            self.entry().file.pool().spawn_detached(move || {
                // A piece the walk has passed by the time the pool gets here is not read: it
                // would only push out what the walk needs next.
                if map.inner.access.lock().last_end.is_some_and(|end| end > from) {
                    return;
                }
                let pinned =
                    engine::pin_frames(map.engine(), map.entry(), from, n, PinFor::ReadAhead);
                if let Err(e) = pinned {
                    tracing::debug!(
                        "read-ahead of {from}+{n} in {} skipped: {e}",
                        map.path().display()
                    );
                }
            });
        }
    }

    /// Reads `[offset, offset + len)` in the background (in the file's frames); the future
    /// completes when it is resident. It does not pin: later requests may evict it.
    /// [`IoFuture::cancel`] stops it between its reads (what it read stays resident).
    pub fn prefetch(&self, offset: u64, len: u64) -> IoFuture<()> {
        let map = self.clone();
        let (future, completer) = IoFuture::pending();
        // On a thread of its own: a prefetch may wait for memory others are reading, and the
        // I/O pool's threads must stay free for those reads.
        completer.complete_on_a_thread_of_its_own("gpumap-prefetch", move |cancel| {
            cancel.run(|| {
                map.inner.check(offset, len)?;
                engine::pin_frames(map.engine(), map.entry(), offset, len, PinFor::Prefetch)?;
                Ok(())
            })
        });
        future
    }

    /// Advice about `[offset, offset + len)` (see [`Advice`]): `Normal`, `Sequential` and
    /// `Random` set how the whole file is read; `WillNeed` prefetches the range in the
    /// background; `DontNeed` writes back and evicts it.
    pub fn advise(&self, offset: u64, len: u64, advice: Advice) -> Result<()> {
        self.inner.check(offset, len)?;
        match advice {
            Advice::Normal | Advice::Sequential | Advice::Random => {
                let mut access = self.inner.access.lock();
                access.advice = advice;
                access.ahead_until = 0;
                access.last_end = None;
                Ok(())
            }
            Advice::WillNeed => {
                // Fire and forget: its outcome shows in the stats.
                drop(self.prefetch(offset, len));
                Ok(())
            }
            Advice::DontNeed => engine::evict(self.engine(), self.entry(), offset, len),
        }
    }

    /// Copies `[offset, offset + dst.len())` of the file (through the cache) into `dst`, in
    /// windows of at most half the budget.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.inner.check(offset, dst.len() as u64)?;
        self.entry().file.expect_ranges([(offset, dst.len() as u64)])?;
        if let Some(file) = &self.inner.zero_copy {
            return file.read_at(offset, dst);
        }
        let mut done = 0usize;
        while done < dst.len() {
            let at = offset + done as u64;
            let n = self.window_at(at).min((dst.len() - done) as u64) as usize;
            let view = self.window(at, n as u64)?;
            view.copy_to_host(0, &mut dst[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// Copies `src` to `[offset, offset + src.len())` of the map (written back later, like a
    /// write to an mmap), in windows of at most half the budget.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.inner.check(offset, src.len() as u64)?;
        let mut done = 0usize;
        while done < src.len() {
            let at = offset + done as u64;
            let n = self.window_at(at).min((src.len() - done) as u64) as usize;
            let mut view = self.view_mut(at, n as u64)?;
            view.copy_from_host(0, &src[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// The longest window from `offset` that lies in at most half the budget's frames (at least
    /// one): it ends at a frame border, so it never needs more frames than that.
    fn window_at(&self, offset: u64) -> u64 {
        let g = self.engine().geometry;
        let frames = (self.engine().max_frames as u64 / 2).max(1);
        frames * g.frame - offset % g.frame
    }

    /// Copies ranges of this file, packed one after another, into `dst` (see
    /// [`DeviceCache::gather`](super::DeviceCache::gather)).
    pub fn gather<'a>(
        &self,
        ranges: &[(u64, u64)],
        dst: impl Into<DeviceViewMut<'a>>,
    ) -> Result<()> {
        let parts: Vec<(&OpenFile, u64, u64)> =
            ranges.iter().map(|&(offset, len)| (&*self.inner, offset, len)).collect();
        gather_parts(self.engine(), &parts, dst.into())
    }

    /// Copies rows `indices` of the file — row `i` is bytes `i * row_size .. (i + 1) *
    /// row_size` — in order into `dst`, and returns when they are all there.
    ///
    /// On a GPU, one kernel launch finds the rows whose extents are resident (through the
    /// cache's directory) and copies them; the host reads the rest through the cache, which
    /// keeps them for the next gather. Once the budget is full, the missing rows of a read-only
    /// file are read from the file on the pool's threads instead, and their extents are made
    /// resident in the background, one batch at a time (see
    /// [`DeviceCache::wait_for_admissions`](super::DeviceCache::wait_for_admissions)). Indices in GPU memory ([`RowIndices::on_device`]) stay
    /// there for every resident row. With [`MapOptions::zero_copy`], rows are read in place
    /// from the registered file; with [`ZeroCopy::Misses`](super::ZeroCopy::Misses), the kernel
    /// copies the resident rows from the cache and reads the others in place, in one launch,
    /// and their extents are admitted in the background. The kernel runs on gpumap's stream for the calling thread;
    /// [`gather_rows_on`](Self::gather_rows_on) puts it on yours.
    ///
    /// A negative index, or one past the last whole row, is [`Error::RowIndex`] naming the
    /// first such one; it is never read (rows before it may have been copied). A row past the
    /// end of a file cut under the map is [`Error::UnexpectedEof`].
    ///
    /// ```
    /// use gpumap::mapped::DeviceMappedFile;
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("table.bin");
    /// # std::fs::write(&path, (0..1024u32).flat_map(|i| [i as u8; 16]).collect::<Vec<u8>>())?;
    /// let table = DeviceMappedFile::open(&path)?;
    /// let mut rows = vec![0u8; 3 * 16];
    /// table.gather_rows(&[5i64, 0, 700], 16, rows.as_mut_slice())?;
    /// assert_eq!(rows[0], 5);
    /// assert_eq!(rows[32], (700 % 256) as u8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gather_rows<'i, 'd>(
        &self,
        indices: impl Into<RowIndices<'i>>,
        row_size: u64,
        dst: impl Into<DeviceViewMut<'d>>,
    ) -> Result<()> {
        self.rows(indices.into(), row_size, dst.into(), None)
    }

    /// [`gather_rows`](Self::gather_rows) with its kernel queued on `stream`, after the work
    /// queued there before (the sampler that made the indices, say). It still returns only
    /// when the rows are in `dst`. On host memory the stream has nothing to order.
    pub fn gather_rows_on<'i, 'd>(
        &self,
        indices: impl Into<RowIndices<'i>>,
        row_size: u64,
        dst: impl Into<DeviceViewMut<'d>>,
        stream: StreamRef<'_>,
    ) -> Result<()> {
        self.rows(indices.into(), row_size, dst.into(), Some(stream))
    }

    fn rows(
        &self,
        indices: RowIndices<'_>,
        row_size: u64,
        dst: DeviceViewMut<'_>,
        stream: Option<StreamRef<'_>>,
    ) -> Result<()> {
        let _range = crate::profiling::Range::new(c"gpumap::cache::gather_rows");
        let in_place = match &self.inner.zero_copy {
            Some(zero_copy) if !self.inner.misses_in_place => {
                return zero_copy.rows(indices, row_size, dst, stream);
            }
            Some(zero_copy) => Some(zero_copy),
            None => None,
        };
        let stream = match (&stream, self.device()) {
            (Some(s), Device::Cuda(d)) => Some(s.on(d.ordinal())?),
            _ => None,
        };
        // Misses read in place are listed only when an admission can take them: listing costs
        // a copy down, and an offer made while one runs would be dropped anyway.
        let mut claim = None;
        let in_place = in_place.map(|zero_copy| {
            claim = AdmissionClaim::try_take(&self.engine().admissions);
            let (base, len) = (zero_copy.device_ptr().unwrap_or(0), zero_copy.len());
            MissesInPlace { base, len, list: claim.is_some() }
        });
        let entry = self.entry();
        let read_through = engine::gather_rows(
            self.engine(),
            entry,
            indices.source(),
            row_size,
            dst,
            stream,
            in_place,
        )?;
        if read_through.is_empty() {
            return Ok(());
        }
        // Every gather's misses reach the doorkeeper, whether or not an admission can run.
        let extents = engine::extents_of_rows(self.engine(), entry, &read_through, row_size);
        if !extents.is_empty() {
            let claim = claim.or_else(|| AdmissionClaim::try_take(&self.engine().admissions));
            if let Some(claim) = claim {
                self.admit_in_background(claim, extents);
            }
        }
        Ok(())
    }

    /// Makes `extents` (of rows a gather read past the cache) resident, on a thread of their
    /// own, under `claim` (the cache's one admission at a time; see `engine::admission`).
    fn admit_in_background(&self, claim: AdmissionClaim, extents: Vec<u64>) {
        let map = self.clone();
        let thread = std::thread::Builder::new().name("gpumap-admit".into());
        let spawned = crate::per_process::spawn_apart_from_fork(|| {
            thread.spawn(move || {
                let _claim = claim;
                if let Err(e) = engine::admit(map.engine(), map.entry(), &extents) {
                    tracing::debug!(
                        "admitting {} extents of {} skipped: {}",
                        extents.len(),
                        map.path().display(),
                        crate::error::Report(&e)
                    );
                }
            })
        });
        if let Err(e) = spawned {
            tracing::debug!("no thread to admit rows read past the cache: {e}");
        }
    }

    /// Waits until the cache's admission in the background (of rows that gathers read past the
    /// full cache) has finished: after it, those rows are resident, unless others have pushed
    /// them out since. See [`DeviceCache::wait_for_admissions`](super::DeviceCache::wait_for_admissions).
    pub fn wait_for_admissions(&self) {
        self.engine().admissions.wait_idle();
    }

    /// [`gather`](Self::gather) into the owned `dst` in the background; the future gives `dst`
    /// back.
    pub fn gather_async<B: OwnedDeviceMemory>(
        &self,
        ranges: Vec<(u64, u64)>,
        dst: B,
    ) -> IoFuture<B> {
        let map = self.clone();
        let (future, completer) = IoFuture::pending();
        // On a thread of its own, like `prefetch`: a gather may wait for memory.
        completer.complete_on_a_thread_of_its_own("gpumap-gather", move |_| {
            let mut dst = dst;
            map.gather(&ranges, dst.device_view_mut()).map(|()| dst)
        });
        future
    }

    /// Writes every dirty extent back and waits: when it returns `Ok`, the file (through the
    /// page cache, or the disk with O_DIRECT) holds everything written before the call. Not
    /// durable against a crash: see [`sync`](Self::sync). After a failed write-back it returns
    /// that error until a `sync` succeeds.
    pub fn flush(&self) -> Result<()> {
        self.flush_range(0, self.len())
    }

    /// Like [`flush`](Self::flush) for the extents overlapping `[offset, offset + len)`.
    pub fn flush_range(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.check(offset, len)?;
        let extents = self.engine().geometry.extents_covering(offset, len);
        engine::flush(self.engine(), self.entry(), extents)
    }

    /// [`flush`](Self::flush), then `fdatasync`: when it returns `Ok`, the data survive a crash.
    /// It retries what earlier failed write-backs left dirty; when every byte is written and
    /// `fdatasync` succeeds, the file's sticky error is cleared.
    pub fn sync(&self) -> Result<()> {
        engine::sync(self.engine(), self.entry())
    }

    /// Flushes and unmaps, returning the flush's error (dropping the map logs it instead).
    pub fn close(self) -> Result<()> {
        if self.is_writable() {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes back what is dirty, then gives up the memory of every frame and slot of the file
    /// no view pins; the next view of those ranges reads them again. Like `POSIX_FADV_DONTNEED`
    /// for the map.
    pub fn evict(&self) -> Result<()> {
        engine::evict(self.engine(), self.entry(), 0, self.len())
    }
}

/// Copies `parts` — ranges of files of `engine`'s cache — packed one after another into `dst`,
/// after checking them and `dst`'s length.
pub(crate) fn gather_parts(
    engine: &Arc<Engine>,
    parts: &[(&OpenFile, u64, u64)],
    dst: DeviceViewMut<'_>,
) -> Result<()> {
    let _range = crate::profiling::Range::new(c"gpumap::cache::gather");
    let total = handle::check_ranges(engine, parts)?;
    if (dst.len() as u64) < total {
        return Err(Error::BufferTooSmall { needed: total, available: dst.len() as u64 });
    }
    handle::gather(engine, parts, Some(dst))
}
