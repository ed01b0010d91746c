//! GPUDirect Storage through cuFile: file <-> device memory without a host bounce.
//!
//! [`CuFileDriver::get`] says whether cuFile can be used at all (library found, driver opened)
//! and why not. [`CuFileHandle`] registers one open file; its reads and writes block, so callers
//! run many of them in parallel on the I/O pool, each task calling
//! [`CudaDevice::bind_to_thread`](crate::memory::cuda::CudaDevice::bind_to_thread) first (the
//! handle also binds the region's device itself, which is cheap when already bound).
//!
//! Registration can fail where the driver opens fine — e.g. without a udev database under
//! `/run/udev` cuFile cannot identify the block device. The returned [`Error::CuFile`] carries
//! the cuFile code and name; callers treat it as the reason to fall back to the POSIX path.
#![forbid(unsafe_code)]

use std::fmt;
use std::fs::File;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::io::flags::OpenFlags;
use crate::memory::cuda::{CudaDevice, CudaView, CudaViewMut, RawRegion, Stream};
use crate::sys::cufile as sys;

/// The opened cuFile driver (process-wide; opened on first use, never closed).
#[derive(Debug)]
pub struct CuFileDriver {
    library: String,
    properties: Option<CuFileProperties>,
}

/// What `cuFileDriverGetProperties` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CuFileProperties {
    /// nvidia-fs kernel module version as (major, minor); (0, 0) when it is not loaded.
    pub nvfs_version: (u32, u32),
    /// Largest single direct I/O, bytes.
    pub max_direct_io_size: usize,
    /// Largest batch (`cuFileBatchIOSetUp`) in entries.
    pub max_batch_io_size: u32,
    /// Raw driver status flags (`CU_FILE_*_SUPPORTED` bits by `CUfileDriverStatusFlags`).
    pub status_flags: u32,
    /// Raw feature flags (`CUfileFeatureFlags` bits: dynamic routing, batch, streams, ...).
    pub feature_flags: u32,
    /// Whether cuFile polls for completion of small transfers (`CU_FILE_USE_POLL_MODE`).
    pub poll_mode: bool,
    /// Whether cuFile may fall back to its POSIX path (`CU_FILE_ALLOW_COMPAT_MODE`).
    pub allow_compat_mode: bool,
    /// Transfers up to this size poll in poll mode, KiB (as cuFile reports it).
    pub poll_thresh_size_kb: usize,
    /// Device memory cuFile keeps for its own bounce buffers, KiB.
    pub max_device_cache_size_kb: u32,
    /// Size of each of those buffers, KiB.
    pub per_buffer_cache_size_kb: u32,
    /// Device memory cuFile may pin, KiB.
    pub max_pinned_memory_size_kb: u32,
}

impl CuFileDriver {
    /// The driver, or `Unavailable` with the reason: `"libcufile not found (searched: ...)"`,
    /// `"libcufile lacks cuFileRead: ..."`, `"cuFileDriverOpen: CU_FILE_... (code)"`.
    /// `GPUMAP_CUFILE_LIBRARY=/path` loads that file instead of searching.
    #[doc(alias = "cuFileDriverOpen")]
    pub fn get() -> Result<&'static CuFileDriver> {
        static DRIVER: std::sync::OnceLock<CuFileDriver> = std::sync::OnceLock::new();
        let driver = sys::driver()?;
        Ok(DRIVER.get_or_init(|| CuFileDriver {
            library: driver.library.name.clone(),
            properties: driver.props.map(|p| CuFileProperties {
                nvfs_version: (p.nvfs_major, p.nvfs_minor),
                max_direct_io_size: p.max_direct_io_size,
                max_batch_io_size: p.max_batch_io_size,
                status_flags: p.status_flags,
                feature_flags: p.feature_flags,
                // CUfileDriverControlFlags: bit 0 poll mode, bit 1 compat mode allowed.
                poll_mode: p.control_flags & 1 != 0,
                allow_compat_mode: p.control_flags & 2 != 0,
                poll_thresh_size_kb: p.poll_thresh_size_kb,
                max_device_cache_size_kb: p.max_device_cache_size_kb,
                per_buffer_cache_size_kb: p.per_buffer_cache_size_kb,
                max_pinned_memory_size_kb: p.max_device_pinned_mem_size_kb,
            }),
        }))
    }

    /// The cuFile library's version as (major, minor), without opening the driver; `None`
    /// where the library is older than `cuFileGetVersion` (1.8); `Unavailable` without one.
    #[doc(alias = "cuFileGetVersion")]
    pub fn library_version() -> Result<Option<(u32, u32)>> {
        Ok(sys::library()?.version())
    }

    /// The library name (or override path) that was loaded, without opening the driver;
    /// `Unavailable` with the search list when none loads.
    pub fn library_name() -> Result<&'static str> {
        Ok(&sys::library()?.name)
    }

    /// The library name (or override path) the driver was opened through.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// Driver properties, when the library reports them: as the driver was opened, before any
    /// of the setters below.
    pub fn properties(&self) -> Option<&CuFileProperties> {
        self.properties.as_ref()
    }

    /// Whether cuFile polls for the completion of reads and writes up to `threshold_kb` KiB
    /// (`cuFileDriverSetPollMode`). What cuFile makes of a change once its driver is open is
    /// up to it. `Unavailable` where the library lacks the call; `CuFile` where it refuses.
    #[doc(alias = "cuFileDriverSetPollMode")]
    pub fn set_poll_mode(&self, poll: bool, threshold_kb: usize) -> Result<()> {
        sys::driver_set_poll_mode(poll, threshold_kb)
    }

    /// The largest direct I/O cuFile issues, KiB (`cuFileDriverSetMaxDirectIOSize`); errors as
    /// for [`CuFileDriver::set_poll_mode`].
    #[doc(alias = "cuFileDriverSetMaxDirectIOSize")]
    pub fn set_max_direct_io_size_kb(&self, kb: usize) -> Result<()> {
        sys::driver_set_max_direct_io_size(kb)
    }

    /// Device memory cuFile keeps for its own bounce buffers, KiB
    /// (`cuFileDriverSetMaxCacheSize`); errors as for [`CuFileDriver::set_poll_mode`].
    #[doc(alias = "cuFileDriverSetMaxCacheSize")]
    pub fn set_max_cache_size_kb(&self, kb: usize) -> Result<()> {
        sys::driver_set_max_cache_size(kb)
    }

    /// Device memory cuFile may pin, KiB (`cuFileDriverSetMaxPinnedMemSize`); errors as for
    /// [`CuFileDriver::set_poll_mode`].
    #[doc(alias = "cuFileDriverSetMaxPinnedMemSize")]
    pub fn set_max_pinned_mem_size_kb(&self, kb: usize) -> Result<()> {
        sys::driver_set_max_pinned_mem_size(kb)
    }
}

/// A file registered with cuFile (`cuFileHandleRegister`); deregistered on drop. Holds its own
/// duplicate of the file descriptor, so it does not borrow the `File`. Open the file with
/// `O_DIRECT` for true GDS; without it cuFile uses its compatibility path (or refuses,
/// depending on its configuration).
#[derive(Clone)]
pub struct CuFileHandle {
    registration: Arc<sys::FileRegistration>,
}

impl fmt::Debug for CuFileHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CuFileHandle").field("path", &self.registration.path()).finish()
    }
}

/// One entry of [`CuFileHandle::read_batch`]: `len` bytes at `file_offset` into `dst` at
/// `dst_offset`.
#[derive(Debug)]
pub struct BatchRead<'a> {
    /// Destination device memory.
    pub dst: CudaViewMut<'a>,
    /// Offset into `dst`.
    pub dst_offset: usize,
    /// Bytes to read.
    pub len: usize,
    /// Where in the file.
    pub file_offset: u64,
}

/// A batch entry as the crate passes it internally (see [`RawRegion`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawBatchRead {
    pub(crate) dst: RawRegion,
    pub(crate) len: usize,
    pub(crate) file_offset: u64,
}

/// Opens `path` as `flags` say (`"r"`, `"w+"`, ... as [`OpenFlags`] parses them) for
/// [`CuFileHandle::register`]: with `O_DIRECT` where the file system allows it, as true GDS
/// needs, and buffered where it refuses (`EINVAL`), which cuFile serves through its
/// compatibility path. Bad flags are [`Error::InvalidFlags`], a failed open an `Io` error.
#[doc(alias = "O_DIRECT")]
pub fn open_for_cufile(path: &Path, flags: &str) -> Result<File> {
    let flags: OpenFlags = flags.parse()?;
    crate::sys::posix::open_direct_or_buffered(path, &mut flags.open_options())
}

fn bind_for(region: &RawRegion) -> Result<()> {
    CudaDevice::new(region.ordinal)?.bind_to_thread()
}

impl CuFileHandle {
    /// Registers `file` (whose path is used for error messages). Fails with `Unavailable` when
    /// the driver is unusable and with [`Error::CuFile`] (code and name) when cuFile refuses the
    /// file — e.g. `CU_FILE_HANDLE_NOT_REGISTERED`-like codes without a udev database.
    #[doc(alias = "cuFileHandleRegister")]
    pub fn register(file: &File, path: &Path) -> Result<Self> {
        CuFileDriver::get()?;
        Ok(Self { registration: Arc::new(sys::FileRegistration::new(file, path)?) })
    }

    /// The path given at registration.
    pub fn path(&self) -> &Path {
        self.registration.path()
    }

    /// Reads up to `len` bytes at `file_offset` into `dst` at `dst_offset` (`cuFileRead`);
    /// blocks; returns the bytes read (short at end of file).
    #[doc(alias = "cuFileRead")]
    pub fn read(
        &self,
        dst: CudaViewMut<'_>,
        dst_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<usize> {
        self.read_raw(dst.raw, dst_offset, len, file_offset)
    }

    pub(crate) fn read_raw(
        &self,
        dst: RawRegion,
        dst_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<usize> {
        dst.sub(dst_offset, len)?;
        bind_for(&dst)?;
        sys::read(&self.registration, dst.ptr, dst_offset, len, file_offset)
    }

    /// Writes `len` bytes of `src` at `src_offset` to the file at `file_offset`
    /// (`cuFileWrite`); blocks; returns the bytes written.
    #[doc(alias = "cuFileWrite")]
    pub fn write(
        &self,
        src: CudaView<'_>,
        src_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<usize> {
        self.write_raw(src.raw, src_offset, len, file_offset)
    }

    pub(crate) fn write_raw(
        &self,
        src: RawRegion,
        src_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<usize> {
        src.sub(src_offset, len)?;
        bind_for(&src)?;
        sys::write(&self.registration, src.ptr, src_offset, len, file_offset)
    }

    /// Reads every entry with the batch API (`cuFileBatchIOSetUp` / `Submit` / `GetStatus` /
    /// `Destroy`, at most the driver's batch size per submission) and blocks until all
    /// completed. The outer error is a failure of the batch machinery; the inner results are
    /// per entry, in order. All destinations must be on one device.
    #[doc(alias = "cuFileBatchIOSubmit")]
    pub fn read_batch(&self, ios: &mut [BatchRead<'_>]) -> Result<Vec<Result<usize>>> {
        let mut raw = Vec::with_capacity(ios.len());
        for io in ios.iter() {
            raw.push(RawBatchRead {
                dst: io.dst.raw.sub(io.dst_offset, io.len)?,
                len: io.len,
                file_offset: io.file_offset,
            });
        }
        self.read_batch_raw(&raw)
    }

    pub(crate) fn read_batch_raw(&self, ios: &[RawBatchRead]) -> Result<Vec<Result<usize>>> {
        let Some(first) = ios.first() else { return Ok(Vec::new()) };
        let mut entries = Vec::with_capacity(ios.len());
        for io in ios {
            io.dst.sub(0, io.len)?;
            if io.dst.ordinal != first.dst.ordinal {
                return Err(Error::InvalidArgument(format!(
                    "batch mixes devices {} and {}",
                    first.dst.ordinal, io.dst.ordinal
                )));
            }
            entries.push(sys::BatchEntry {
                base: io.dst.ptr,
                base_offset: 0,
                len: io.len,
                file_offset: io.file_offset,
            });
        }
        bind_for(&first.dst)?;
        sys::read_batch(&self.registration, &entries)
    }

    /// Registers `region` with cuFile (`cuFileBufRegister`) so I/O into it skips cuFile's
    /// internal bounce buffers; deregistered when the returned guard drops (which borrows the
    /// memory until then).
    #[doc(alias = "cuFileBufRegister")]
    pub fn register_buffer(region: CudaView<'_>) -> Result<RegisteredBuffer<'_>> {
        CuFileDriver::get()?;
        bind_for(&region.raw)?;
        Ok(RegisteredBuffer {
            _registration: sys::BufferRegistration::new(region.ptr(), region.len())?,
            region,
        })
    }

    pub(crate) fn start_async(
        &self,
        stream: &Stream,
        write: bool,
        region: RawRegion,
        offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<AsyncIo<'static>> {
        region.sub(offset, len)?;
        if region.ordinal != stream.device().ordinal() {
            return Err(Error::InvalidArgument(format!(
                "memory is on device {} but the stream on device {}",
                region.ordinal,
                stream.device().ordinal()
            )));
        }
        stream.device().bind_to_thread()?;
        let pending = sys::PendingFileIo::start(
            &self.registration,
            stream.raw(),
            write,
            region.ptr,
            offset,
            len,
            file_offset,
        )?;
        Ok(AsyncIo { pending, _memory: PhantomData })
    }

    /// Enqueues a stream-ordered read (`cuFileReadAsync`) of `len` bytes at `file_offset`
    /// into `dst` at `dst_offset`; it runs when `stream` reaches it. The parameters cuFile
    /// reads through pointers live in the returned guard, which borrows `dst`, until the
    /// operation completed.
    #[doc(alias = "cuFileReadAsync")]
    pub fn read_async<'a>(
        &self,
        stream: &Stream,
        dst: CudaViewMut<'a>,
        dst_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<AsyncIo<'a>> {
        let io = self.start_async(stream, false, dst.raw, dst_offset, len, file_offset)?;
        Ok(AsyncIo { pending: io.pending, _memory: PhantomData })
    }

    /// Enqueues a stream-ordered write (`cuFileWriteAsync`); see [`CuFileHandle::read_async`].
    #[doc(alias = "cuFileWriteAsync")]
    pub fn write_async<'a>(
        &self,
        stream: &Stream,
        src: CudaView<'a>,
        src_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<AsyncIo<'a>> {
        let io = self.start_async(stream, true, src.raw, src_offset, len, file_offset)?;
        Ok(AsyncIo { pending: io.pending, _memory: PhantomData })
    }
}

/// A stream-ordered cuFile operation in flight, borrowing its device memory; dropping it waits
/// for it.
pub struct AsyncIo<'a> {
    pending: sys::PendingFileIo,
    _memory: PhantomData<&'a mut [u8]>,
}

impl fmt::Debug for AsyncIo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncIo").finish_non_exhaustive()
    }
}

impl AsyncIo<'_> {
    /// Blocks until the operation completed; returns the bytes transferred.
    pub fn wait(self) -> Result<usize> {
        self.pending.wait()
    }
}

/// Device memory registered with cuFile; deregistered (`cuFileBufDeregister`) on drop.
pub struct RegisteredBuffer<'a> {
    region: CudaView<'a>,
    _registration: sys::BufferRegistration,
}

impl fmt::Debug for RegisteredBuffer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredBuffer").field("region", &self.region).finish()
    }
}

impl<'a> RegisteredBuffer<'a> {
    /// The registered memory.
    pub fn region(&self) -> CudaView<'a> {
        self.region
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_open_for_cufile_as_their_flags_say_without_a_driver() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        // Written and read through std: an O_DIRECT descriptor takes aligned buffers only.
        drop(open_for_cufile(&path, "w+").unwrap());
        std::fs::write(&path, [1u8; 4096]).unwrap();
        let file = open_for_cufile(&path, "rb").unwrap();
        assert_eq!(file.metadata().unwrap().len(), 4096);
        drop(open_for_cufile(&path, "w").unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "\"w\" did not truncate");
        assert!(matches!(open_for_cufile(&path, "rw"), Err(Error::InvalidFlags(f)) if f == "rw"));
        let missing = dir.path().join("missing");
        assert!(matches!(open_for_cufile(&missing, "r"), Err(Error::Io { op: "open", .. })));
    }
}
