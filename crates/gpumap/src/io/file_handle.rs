//! [`FileHandle`]: explicit, parallel reads and writes of one file, into host or device
//! memory; and [`HandleOptions`], how one is opened.
//!
//! Every method here is a thin call into the module that does the work, over the state the
//! handle's clones share (`handle_state`): `host_io` (host memory), `device_io` (device
//! memory, one region at a time), `batch` (many small reads at once), `small_reads`
//! (`pread_device` futures, coalesced) and `stream` (stream-ordered transfers).
#![forbid(unsafe_code)]

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use crate::align::checked_end;
use crate::config::{CompatMode, Config, DirectRead};
use crate::error::{Error, Result};
use crate::io::batch::{self, BatchPiece, DeviceRead};
use crate::io::compat::CompatDecision;
use crate::io::device_io;
use crate::io::gds::RegisteredBuffer;
use crate::io::handle_state::{HandleSettings, HandleState};
use crate::io::host_io;
use crate::io::pool::{IoFuture, IoPool};
use crate::io::small_reads;
use crate::io::stream::{self, StreamTransfer};
use crate::memory::cuda::{CudaView, CudaViewMut, RawRegion, Stream};
use crate::memory::{DeviceView, DeviceViewMut, OwnedDeviceMemory, OwnedDeviceSource};
use crate::sys::posix;

pub use crate::io::flags::OpenFlags;

/// Options of a [`FileHandle`], defaulting to the process [`Config`] (builder: set what
/// differs, then [`open`](Self::open)).
///
/// A setting neither set here nor given by the environment may be chosen for the file's file
/// system when it opens ([`crate::tuning`]): a file on a network file system gets larger tasks.
/// A setter's value always stands.
///
/// ```no_run
/// use gpumap::config::DirectRead;
/// use gpumap::io::FileHandle;
/// let fh = FileHandle::options()?
///     .task_size(1 << 20)
///     .direct_read(DirectRead::Uncached)
///     .open("data.bin", "r")?;
/// # Ok::<(), gpumap::Error>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct HandleOptions {
    settings: HandleSettings,
    /// Permission bits of a file the open creates (before the umask).
    mode: u32,
    /// The pool that runs the handle's tasks; `None` = the process-wide pool.
    pool: Option<Arc<IoPool>>,
}

impl std::fmt::Debug for HandleOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.settings;
        f.debug_struct("HandleOptions")
            .field("compat_mode", &s.compat_mode)
            .field("task_size", &s.task_size)
            .field("direct_io_read", &s.direct_io_read)
            .field("direct_io_write", &s.direct_io_write)
            .field("gds_threshold", &s.gds_threshold)
            .field("bounce_buffer_size", &s.bounce_buffer_size)
            .field("mode", &self.mode)
            .field("pool", &self.pool)
            .finish()
    }
}

impl HandleOptions {
    /// The options `config` gives ([`Config::global`]'s for [`FileHandle::options`]); the
    /// settings its sources mark as given (environment, program) are never tuned.
    pub fn from_config(config: &Config) -> HandleOptions {
        HandleOptions { settings: HandleSettings::from_config(config), mode: 0o644, pool: None }
    }

    /// Sets the compat mode: cuFile or POSIX (see [`CompatMode`]).
    pub fn compat_mode(&mut self, mode: CompatMode) -> &mut Self {
        self.settings.compat_mode = mode;
        self.settings.mark_explicit("compat_mode");
        self
    }

    /// Sets the task size: the largest piece a task moves.
    pub fn task_size(&mut self, bytes: u64) -> &mut Self {
        self.settings.task_size = bytes;
        self.settings.mark_explicit("task_size");
        self
    }

    /// Turns `O_DIRECT` on or off for reads and writes.
    pub fn direct_io(&mut self, read: bool, write: bool) -> &mut Self {
        self.settings.direct_io_read = if read { DirectRead::On } else { DirectRead::Off };
        self.settings.direct_io_write = write;
        self.settings.mark_explicit("direct_io_read");
        self.settings.mark_explicit("direct_io_write");
        self
    }

    /// Sets when reads use `O_DIRECT` for their aligned middle (see [`DirectRead`]).
    pub fn direct_read(&mut self, policy: DirectRead) -> &mut Self {
        self.settings.direct_io_read = policy;
        self.settings.mark_explicit("direct_io_read");
        self
    }

    /// Sets whether writes use `O_DIRECT` for their aligned middle.
    pub fn direct_write(&mut self, on: bool) -> &mut Self {
        self.settings.direct_io_write = on;
        self.settings.mark_explicit("direct_io_write");
        self
    }

    /// Sets the size below which device transfers take the POSIX path even where cuFile is
    /// chosen.
    pub fn gds_threshold(&mut self, bytes: u64) -> &mut Self {
        self.settings.gds_threshold = bytes;
        self.settings.mark_explicit("gds_threshold");
        self
    }

    /// Sets the size of each pinned bounce buffer (the POSIX path to device memory): any size
    /// above zero, rounded up to whole pages at open (`O_DIRECT` reads fill them).
    pub fn bounce_buffer_size(&mut self, bytes: u64) -> &mut Self {
        self.settings.bounce_buffer_size = bytes;
        self.settings.mark_explicit("bounce_buffer_size");
        self
    }

    /// Sets the permission bits of a created file (before the umask; default `0o644`).
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }

    /// Uses `pool` for this handle's tasks.
    pub fn pool(&mut self, pool: Arc<IoPool>) -> &mut Self {
        self.pool = Some(pool);
        self
    }

    /// The compat mode set (named as `std::process::Command`'s getters are: the plain name is
    /// the setter's).
    pub fn get_compat_mode(&self) -> CompatMode {
        self.settings.compat_mode
    }

    /// The task size set.
    pub fn get_task_size(&self) -> u64 {
        self.settings.task_size
    }

    /// Opens `path` with these options (see [`FileHandle::open`]).
    pub fn open(&self, path: impl AsRef<Path>, flags: &str) -> Result<FileHandle> {
        let state =
            HandleState::open(path.as_ref(), flags, self.settings, self.mode, self.pool.as_ref())?;
        Ok(FileHandle { state: Arc::new(state) })
    }
}

/// One open file, read and written in parallel on an [`IoPool`].
///
/// Blocking calls ([`read`](Self::read), [`write`](Self::write)) split the transfer into tasks
/// of `task_size` bytes and wait for all of them; `p*` calls ([`pread`](Self::pread),
/// [`pwrite`](Self::pwrite)) take an owned buffer and return an [`IoFuture`] that gives it back.
/// `*_at` calls run on the calling thread alone. A handle is cheap to clone (the clones share
/// the descriptors) and is `Send + Sync`.
///
/// Opportunistic `O_DIRECT`: where enabled and the file system allows it, the page-aligned
/// middle of each task goes through a second descriptor opened with `O_DIRECT` (the page cache
/// is bypassed), the unaligned head and tail through the buffered one. A host buffer whose
/// address is not page-aligned at that point is moved buffered.
///
/// Device transfers take one of two paths, chosen per file by [`crate::io::compat`]: cuFile
/// (tasks of `task_size`, each a `cuFileRead`/`cuFileWrite`, in parallel), or POSIX through
/// pinned bounce buffers, pipelined (while one chunk is copied to the GPU, the next is read).
/// Calls that return before the transfer is done take owned memory ([`OwnedDeviceMemory`]) or
/// borrow it in their guard ([`StreamTransfer`]), so memory cannot be freed under a transfer.
#[derive(Clone)]
pub struct FileHandle {
    state: Arc<HandleState>,
}

impl std::fmt::Debug for FileHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileHandle")
            .field("path", &self.state.path)
            .field("flags", &self.state.flags_text)
            .field("direct", &self.state.direct.is_some())
            .finish()
    }
}

impl FileHandle {
    /// Opens `path` with `fopen`-style `flags` (see [`OpenFlags`]) and the process defaults.
    ///
    /// ```no_run
    /// let fh = gpumap::io::FileHandle::open("data.bin", "r")?;
    /// let mut buf = vec![0u8; fh.len()? as usize];
    /// let n = fh.read(&mut buf, 0)?;
    /// # Ok::<(), gpumap::Error>(())
    /// ```
    pub fn open(path: impl AsRef<Path>, flags: &str) -> Result<FileHandle> {
        FileHandle::options()?.open(path, flags)
    }

    /// The state this handle's clones share, for the transfers of other `io` modules.
    pub(super) fn state(&self) -> &HandleState {
        &self.state
    }

    /// Options to open with, starting from the process defaults.
    pub fn options() -> Result<HandleOptions> {
        Ok(HandleOptions::from_config(Config::global()?))
    }

    /// The path the handle was opened with.
    pub fn path(&self) -> &Path {
        &self.state.path
    }

    /// The flags the handle was opened with.
    pub fn flags(&self) -> OpenFlags {
        self.state.flags
    }

    /// The compat mode the handle was opened with.
    pub fn compat_mode(&self) -> CompatMode {
        self.state.settings.compat_mode
    }

    /// Which path device transfers take (cuFile or POSIX) and why. Made at the first device
    /// transfer (or here, if none happened yet); in `Auto` mode this loads cuFile.
    pub fn compat_decision(&self) -> &CompatDecision {
        &self.state.decision().0
    }

    /// When reads use `O_DIRECT` (as asked; [`direct_io_status`](Self::direct_io_status) says
    /// whether the file system allows it).
    pub fn direct_read_policy(&self) -> DirectRead {
        self.state.settings.direct_io_read
    }

    /// Whether the aligned middle of transfers can go through `O_DIRECT`, and if not, why.
    pub fn direct_io_status(&self) -> std::result::Result<(), &'static str> {
        self.state.direct_io_status()
    }

    /// The underlying (buffered) file.
    pub fn file(&self) -> &File {
        &self.state.file
    }

    /// Size of the file in bytes (`fstat`).
    pub fn len(&self) -> Result<u64> {
        self.state.len()
    }

    /// `Ok` when a read of `wanted` bytes at `offset` got them all, else
    /// [`Error::UnexpectedEof`] naming the range and the file's length now: where the file
    /// really ends, which a short count alone does not say (a read past the end gets 0).
    pub(crate) fn expect_len(&self, offset: u64, wanted: u64, got: u64) -> Result<()> {
        self.state.expect_len(offset, wanted, got)
    }

    /// [`Error::UnexpectedEof`] for a read of `wanted` bytes at `offset` that got `got` (see
    /// the handle state's `eof_error` for the length it names).
    pub(crate) fn eof_error(&self, offset: u64, wanted: u64, got: u64) -> Error {
        self.state.eof_error(offset, wanted, got)
    }

    /// `Ok` when every `(offset, len)` of `ranges` lies within the file as long as it is now
    /// (one `fstat`), else [`Error::UnexpectedEof`] for the first that does not: the check a
    /// map makes before serving bytes it holds, so that a file cut under it reads as cut
    /// whatever the map still holds.
    pub(crate) fn expect_ranges(&self, ranges: impl IntoIterator<Item = (u64, u64)>) -> Result<()> {
        self.state.expect_ranges(ranges)
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Sets the file's length (`ftruncate`): cuts it, or extends it with a hole of zeros.
    pub fn set_len(&self, len: u64) -> Result<()> {
        self.state.check_write("set_len")?;
        checked_end(len, 0)?;
        posix::set_len(&self.state.file, &self.state.path, len)
    }

    /// Makes written data durable (`fdatasync`): when it returns `Ok`, the data survive a crash.
    /// Linux reports a write-back error once; a second call may return `Ok` for lost data, so
    /// treat an error here as final.
    pub fn sync_data(&self) -> Result<()> {
        posix::fdatasync(&self.state.file, &self.state.path)
    }

    /// Makes written data and metadata durable (`fsync`).
    pub fn sync_all(&self) -> Result<()> {
        posix::fsync(&self.state.file, &self.state.path)
    }

    /// Reads into `buf` from `offset`, in parallel; returns the count read, which is less than
    /// `buf.len()` only where the file ends first (a read entirely past the end returns 0).
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        host_io::read(&self.state, buf, offset)
    }

    /// Reads exactly `buf.len()` bytes from `offset`, in parallel, or fails with
    /// [`Error::UnexpectedEof`] saying how many the file had.
    pub fn read_exact(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let got = self.read(buf, offset)?;
        self.expect_len(offset, buf.len() as u64, got as u64)
    }

    /// Writes all of `buf` at `offset`, in parallel; returns `buf.len()`.
    pub fn write(&self, buf: &[u8], offset: u64) -> Result<usize> {
        host_io::write(&self.state, buf, offset)
    }

    /// Appends all of `buf` to the end of the file (handles opened `a` or `a+`); each call lands
    /// in one piece even with other appenders (`O_APPEND`).
    pub fn append(&self, buf: &[u8]) -> Result<usize> {
        host_io::append(&self.state, buf)
    }

    /// Blocks until every write started through this file's futures ([`pwrite`](Self::pwrite),
    /// [`pwrite_device`](Self::pwrite_device), on this handle or another task size's of it)
    /// before the call has ended, waited for or not. For closing a file whose futures were
    /// dropped: their writes run on, and would be cut short if the process ended. Writes
    /// other threads start during the wait are not waited for.
    pub fn wait_for_writes(&self) {
        self.state.writes.wait();
    }

    /// Reads into `buf` from `offset` on the calling thread only; returns the count read.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        host_io::read_at(&self.state, buf, offset)
    }

    /// Writes all of `buf` at `offset` on the calling thread only.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<usize> {
        host_io::write_at(&self.state, buf, offset)
    }

    /// Starts a parallel read into the owned `buf` from `offset`; the future gives back the
    /// buffer and the count read (see [`read`](Self::read)).
    pub fn pread<B>(&self, buf: B, offset: u64) -> IoFuture<(B, usize)>
    where
        B: AsMut<[u8]> + Send + 'static,
    {
        host_io::pread(&self.state, buf, offset)
    }

    /// Starts a parallel write of the owned `buf` at `offset`; the future gives back the buffer
    /// and the count written.
    pub fn pwrite<B>(&self, buf: B, offset: u64) -> IoFuture<(B, usize)>
    where
        B: AsRef<[u8]> + Send + 'static,
    {
        host_io::pwrite(&self.state, buf, offset)
    }

    /// A handle on the same open file whose transfers use `task_size` and `gds_threshold`
    /// instead of this handle's: the descriptors are duplicated (`dup`), everything else —
    /// flags, pool, compat decision and cuFile registration — is shared. For callers whose
    /// task size is a per-call argument (KvikIO's `pread(..., task_size=)`); returns a clone
    /// when nothing changes. A zero `task_size` is an error.
    pub fn with_transfer_sizes(&self, task_size: u64, gds_threshold: u64) -> Result<FileHandle> {
        let settings = &self.state.settings;
        if task_size != 0
            && task_size == settings.task_size
            && gds_threshold == settings.gds_threshold
        {
            return Ok(self.clone());
        }
        let state = self.state.with_transfer_sizes(task_size, gds_threshold)?;
        Ok(FileHandle { state: Arc::new(state) })
    }

    /// Device transfers smaller than this take the POSIX path even where cuFile is chosen.
    pub fn gds_threshold(&self) -> u64 {
        self.state.settings.gds_threshold
    }

    /// The pool this handle's tasks run on.
    pub fn pool(&self) -> &Arc<IoPool> {
        &self.state.pool
    }

    /// The largest piece one task moves.
    pub fn task_size(&self) -> u64 {
        self.state.settings.task_size
    }

    /// Reads into `dst` — device memory, or host memory standing in for it — from `offset`, in
    /// parallel; returns the count read, short only where the file ends first.
    ///
    /// `dst` is anything that becomes a [`DeviceViewMut`]: `&mut DeviceBuffer`,
    /// `buffer.view_mut()`, a [`CudaViewMut`], `&mut [u8]`.
    pub fn read_device<'a>(&self, dst: impl Into<DeviceViewMut<'a>>, offset: u64) -> Result<usize> {
        device_io::read_device(&self.state, dst.into(), offset)
    }

    /// Reads exactly `dst.len()` bytes into `dst`, or fails with
    /// [`crate::Error::UnexpectedEof`].
    pub fn read_device_exact<'a>(
        &self,
        dst: impl Into<DeviceViewMut<'a>>,
        offset: u64,
    ) -> Result<()> {
        let dst = dst.into();
        let wanted = dst.len() as u64;
        let got = self.read_device(dst, offset)?;
        self.expect_len(offset, wanted, got as u64)
    }

    /// Writes all of `src` — device memory, or host memory standing in for it — at `offset`,
    /// in parallel; returns `src.len()`.
    pub fn write_device<'a>(&self, src: impl Into<DeviceView<'a>>, offset: u64) -> Result<usize> {
        device_io::write_device(&self.state, src.into(), offset)
    }

    /// Starts [`read_device`](Self::read_device) into the owned `dst` on the pool; the future
    /// gives back `dst` and the count read.
    ///
    /// Small reads into GPU memory on the POSIX path (at most a quarter of a bounce buffer)
    /// that are in flight together are coalesced: they queue on the handle, and pool threads
    /// take them in groups that go through [`read_device_batch`](Self::read_device_batch)'s
    /// path — one pinned buffer and one host-to-device copy per run of adjacent destinations
    /// instead of one per read. A lone read of at most 64 KiB (nothing else queued on the
    /// handle) whose bytes the page cache holds is read before this returns, and its copy to
    /// the GPU started: the future then only waits for the copy. Waiting on a queued read runs
    /// it on the waiting thread if no pool thread has taken it yet.
    pub fn pread_device<B: OwnedDeviceMemory>(&self, dst: B, offset: u64) -> IoFuture<(B, usize)> {
        small_reads::pread_device(&self.state, dst, offset)
    }

    /// Starts [`write_device`](Self::write_device) of the owned `src` on the pool; the future
    /// gives back `src` and the count written.
    pub fn pwrite_device<B: OwnedDeviceSource>(&self, src: B, offset: u64) -> IoFuture<(B, usize)> {
        device_io::pwrite_device(&self.state, src, offset)
    }

    /// File -> GPU memory the crate keeps live for the call (a pinned map range), in tasks of
    /// at least `min_task` bytes on the POSIX path (0: as `read_device` splits it). A larger
    /// least task suits reads that run many at once (a cache's read-ahead): concurrency comes
    /// from the other reads, and each task's deeper pipeline is worth more than spreading one
    /// read over every thread.
    pub(crate) fn read_cuda_raw_in_tasks(
        &self,
        dst: RawRegion,
        offset: u64,
        min_task: u64,
    ) -> Result<usize> {
        device_io::read_cuda_in_tasks(&self.state, dst, offset, min_task)
    }

    /// GPU memory the crate keeps live for the call -> file.
    pub(crate) fn write_cuda_raw(&self, src: RawRegion, offset: u64) -> Result<usize> {
        device_io::write_cuda(&self.state, src, offset)
    }

    /// A read into GPU memory `dst` ordered on `stream`: it sees the work queued on `stream`
    /// before the call, and work queued after the call sees its data.
    ///
    /// On the cuFile path this is `cuFileReadAsync`: the call returns at once and the read
    /// runs when the stream reaches it. On the POSIX path (and below `gds_threshold`) there is
    /// no way to run `pread` inside a stream, so — like KvikIO's compatibility mode — the
    /// stream is synchronized, the read runs in parallel on the pool, and the call returns
    /// when it is done; [`StreamTransfer::wait`] then returns at once.
    pub fn read_async<'a>(
        &self,
        dst: CudaViewMut<'a>,
        offset: u64,
        stream: &Stream,
    ) -> Result<StreamTransfer<'a>> {
        stream::stream_ordered(&self.state, dst.raw, offset, stream, false)
    }

    /// A write of GPU memory `src` ordered on `stream` (see [`read_async`](Self::read_async)).
    pub fn write_async<'a>(
        &self,
        src: CudaView<'a>,
        offset: u64,
        stream: &Stream,
    ) -> Result<StreamTransfer<'a>> {
        stream::stream_ordered(&self.state, src.raw, offset, stream, true)
    }

    /// Registers `region` with cuFile (`cuFileBufRegister`) for the life of the returned guard,
    /// as KvikIO's `buffer_register`: worthwhile for a buffer that is the target of many
    /// transfers on the cuFile path. On the POSIX path there is nothing to register and this
    /// returns `Ok(None)`.
    #[doc(alias = "cuFileBufRegister")]
    pub fn buffer_register<'a>(
        &self,
        region: CudaView<'a>,
    ) -> Result<Option<RegisteredBuffer<'a>>> {
        device_io::register_buffer(&self.state, region)
    }

    /// Reads many (typically small, scattered) pieces into device memory — or host memory
    /// standing in for it — and returns each one's count, in order (short only where the file
    /// ends first). All destinations must be on one device.
    ///
    /// Where the file takes the cuFile path, the batch goes through cuFile's batch API
    /// (`cuFileBatchIOSubmit`; pieces clipped to the file's length). On the POSIX path:
    /// many small reads are limited by the cost of one host-to-device copy each (microseconds,
    /// serialised in the driver; docs/decisions/0007-small-reads-packed.md has the figures),
    /// not by the disk or the page cache. A batch pays it once per *run* instead: the pieces
    /// are read into a pinned buffer packed in list order, and pieces whose destinations
    /// follow one another in device memory (`dst` of one ending where the next begins) go up
    /// in a single copy. Order the list by destination to get the most out of it. Pieces
    /// larger than a bounce buffer take the ordinary path. Into host memory, each piece is
    /// read straight into its destination, in parallel.
    pub fn read_device_batch(&self, reads: &mut [DeviceRead<'_>]) -> Result<Vec<usize>> {
        batch::read_device_batch(&self.state, reads)
    }

    /// Starts [`read_device_batch`](Self::read_device_batch) into the owned `dst` on the pool:
    /// each piece's `len` bytes at its file `offset` go to `dst` at its `dst_offset` (pieces may
    /// not overlap in `dst`). The future gives back `dst` and each piece's count.
    pub fn pread_device_batch<B: OwnedDeviceMemory>(
        &self,
        dst: B,
        pieces: Vec<BatchPiece>,
    ) -> IoFuture<(B, Vec<usize>)> {
        batch::pread_device_batch(&self.state, dst, pieces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_sizes_variant_shares_the_file() {
        let dir = std::env::temp_dir().join(format!("gpumap-variant-{}", std::process::id()));
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&dir, &data).unwrap();
        let fh = FileHandle::open(&dir, "r").unwrap();
        assert!(fh.with_transfer_sizes(0, 0).is_err());
        let same = fh.with_transfer_sizes(fh.task_size(), fh.gds_threshold()).unwrap();
        assert!(Arc::ptr_eq(&same.state, &fh.state));
        let small = fh.with_transfer_sizes(4096, 0).unwrap();
        assert_eq!((small.task_size(), small.gds_threshold()), (4096, 0));
        assert_eq!(fh.task_size(), Config::global().unwrap().task_size);
        drop(fh);
        let mut back = vec![0u8; data.len() - 7];
        assert_eq!(small.read(&mut back, 7).unwrap(), back.len());
        assert_eq!(back, data[7..]);
        std::fs::remove_file(&dir).unwrap();
    }
}
