//! [`DeviceCache`]: one memory budget on one GPU (or host memory standing in), shared by every
//! file opened through it — a page cache for device memory, with no kernel module and no FUSE.
#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Arc;

use super::engine::{self, Engine, EngineConfig};
use super::file::{gather_parts, DeviceMappedFile, MapRange};
use super::handle::{self, OpenFile};
use super::lookups::LookupScope;
use super::map_options::MapOptions;
use super::stats::CacheStats;
use super::view::View;
use crate::error::Result;
use crate::memory::{Device, DeviceViewMut, StreamRef};

/// One budget of device memory on one GPU (or host memory standing in), shared by every file
/// opened through it: least-recently-used eviction across files, write-back before eviction,
/// single-flight faults, stats per file and in total. A cache serves one device; cheap to clone.
/// Built by [`CacheOptions::build`](super::CacheOptions::build).
///
/// ```
/// use gpumap::mapped::CacheOptions;
/// # let dir = tempfile::tempdir()?;
/// # let (a, b) = (dir.path().join("a"), dir.path().join("b"));
/// # std::fs::write(&a, vec![1u8; 1 << 20])?;
/// # std::fs::write(&b, vec![2u8; 1 << 20])?;
/// let cache = CacheOptions::new().budget(64 << 20).extent_size(4096).build()?;
/// let first = cache.open(&a)?;
/// let second = cache.open(&b)?;
/// let mut rows = gpumap::memory::DeviceBuffer::zeroed(&cache.device(), 2 * 4096)?;
/// cache.gather(&[first.range(0, 4096), second.range(65536, 4096)], rows.view_mut())?;
/// assert_eq!(rows.to_vec()?[4096], 2);
/// println!("{:?}", cache.stats());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct DeviceCache {
    engine: Arc<Engine>,
}

impl std::fmt::Debug for DeviceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stats = self.stats();
        f.debug_struct("DeviceCache")
            .field("memory", &self.engine.store.describe())
            .field("budget", &stats.budget)
            .field("used_bytes", &stats.used_bytes)
            .field("files", &stats.files)
            .finish()
    }
}

impl DeviceCache {
    /// A cache of the sizes `config` gives (checked by `CacheOptions`).
    pub(crate) fn from_config(config: &EngineConfig) -> Result<DeviceCache> {
        Ok(DeviceCache { engine: Arc::new(Engine::new(config)?) })
    }

    /// Hands the cache's directory to kernels of one's own queued on `stream` (see
    /// [`LookupScope`]): what the cache made resident before this call is in the table they
    /// read, and no slot they can find is reused until the scope ends. A cache in host memory
    /// has no directory on a device: `Unavailable`.
    pub fn lookup_scope<'s>(&self, stream: StreamRef<'s>) -> Result<LookupScope<'s>> {
        LookupScope::begin(&self.engine, stream)
    }

    /// Opens `path` read-only in this cache with the default [`MapOptions`].
    pub fn open(&self, path: impl AsRef<Path>) -> Result<DeviceMappedFile> {
        self.open_with(path, &MapOptions::new())
    }

    /// Opens `path` in this cache with `options`.
    pub fn open_with(
        &self,
        path: impl AsRef<Path>,
        options: &MapOptions,
    ) -> Result<DeviceMappedFile> {
        let open = OpenFile::open(Arc::clone(&self.engine), path.as_ref(), options)?;
        Ok(DeviceMappedFile::from_open(open))
    }

    /// Maps the remote object `file` (an S3 object or an HTTP(S) URL; the `remote` feature)
    /// in this cache, read-only: missing extents are read with ranged GETs (adjacent ones in
    /// one request) and stay resident, evicted as any file's. `options` that make the map
    /// writable or zero-copy are refused.
    #[cfg(feature = "remote")]
    pub fn open_remote(
        &self,
        file: crate::remote::RemoteFile,
        options: &MapOptions,
    ) -> Result<DeviceMappedFile> {
        let open = OpenFile::open_remote(Arc::clone(&self.engine), file, options)?;
        Ok(DeviceMappedFile::from_open(open))
    }

    /// Where the cache's memory is.
    pub fn device(&self) -> Device {
        self.engine.device()
    }

    /// What the cache holds and has done, over the files open now.
    pub fn stats(&self) -> CacheStats {
        CacheStats::new(&self.engine)
    }

    /// How many independent parts the cache's books are in
    /// ([`CacheOptions::shards`](super::CacheOptions::shards)).
    pub fn shards(&self) -> usize {
        self.engine.shards.len()
    }

    /// Writes back every dirty extent of every file (see [`DeviceMappedFile::flush`]); the
    /// first error is returned after every file was tried.
    pub fn flush(&self) -> Result<()> {
        let g = self.engine.geometry;
        self.each_file(|entry| engine::flush(&self.engine, entry, 0..g.extents(entry.len)))
    }

    /// Writes back every dirty extent of every file, then `fdatasync` of each written file (see
    /// [`DeviceMappedFile::sync`]).
    pub fn sync(&self) -> Result<()> {
        self.each_file(|entry| engine::sync(&self.engine, entry))
    }

    /// Waits until the admission in the background has finished. Once the budget is full, row
    /// gathers ([`DeviceMappedFile::gather_rows`]) of read-only files read their misses past
    /// the cache and offer their extents to it; one thread at a time makes an offer resident,
    /// and offers made meanwhile are dropped (the rows asked for most are offered again soon).
    /// After this returns, what was offered last is resident unless others pushed it out since:
    /// for tests and benchmarks that want a settled cache.
    pub fn wait_for_admissions(&self) {
        self.engine.admissions.wait_idle();
    }

    /// Runs `f` on every open file; the first error is returned after all ran.
    fn each_file(&self, f: impl Fn(&engine::FileEntry) -> Result<()>) -> Result<()> {
        let mut first = None;
        for entry in self.engine.entries() {
            if let Err(e) = f(&entry) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Copies `ranges` — of any files open in this cache — packed one after another into
    /// `dst` (device memory on the cache's GPU for the fast path; any memory works).
    ///
    /// Resident extents are copied from wherever they are; missing ones are read in groups
    /// through pinned buffers on the pool (adjacent pieces of a file in one read) and placed
    /// — into cache slots and into `dst` — by one kernel launch per group, in rounds that each
    /// pin at most a quarter of the budget. When every range is of a file opened with
    /// [`MapOptions::zero_copy`], the rows are read in place from the host's page cache
    /// instead (one kernel launch, no cache memory; not counted in the stats). `dst` shorter
    /// than the ranges together is `BufferTooSmall`; a range past its file's end (as mapped,
    /// or as the file is now) is `OutOfRange` (or `UnexpectedEof`); a range of a file of
    /// another cache is `InvalidArgument`.
    pub fn gather<'a>(
        &self,
        ranges: &[MapRange<'_>],
        dst: impl Into<DeviceViewMut<'a>>,
    ) -> Result<()> {
        let parts: Vec<(&OpenFile, u64, u64)> = ranges.iter().map(MapRange::parts).collect();
        gather_parts(&self.engine, &parts, dst.into())
    }

    /// Views of many ranges of files in this cache: the missing extents of all of them are
    /// read together first (as [`gather`](Self::gather) does), then each view is taken.
    pub fn views(&self, ranges: &[MapRange<'_>]) -> Result<Vec<View>> {
        let parts: Vec<(&OpenFile, u64, u64)> = ranges.iter().map(MapRange::parts).collect();
        handle::check_ranges(&self.engine, &parts)?;
        handle::gather(&self.engine, &parts, None)?;
        ranges.iter().map(|r| r.view()).collect()
    }
}
