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
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::memory::cuda::{CudaDevice, DeviceRegion, Stream};
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
            }),
        }))
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

    /// Driver properties, when the library reports them.
    pub fn properties(&self) -> Option<&CuFileProperties> {
        self.properties.as_ref()
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
#[derive(Debug, Clone, Copy)]
pub struct BatchRead {
    /// Destination device memory.
    pub dst: DeviceRegion,
    /// Offset into `dst`.
    pub dst_offset: usize,
    /// Bytes to read.
    pub len: usize,
    /// Where in the file.
    pub file_offset: u64,
}

fn check_region(region: &DeviceRegion, offset: usize, len: usize) -> Result<()> {
    // Range-check through `sub`, which reports OutOfRange / Overflow with the values.
    region.sub(offset, len).map(|_| ())
}

fn bind_for(region: &DeviceRegion) -> Result<()> {
    CudaDevice::new(region.device_ordinal())?.bind_to_thread()
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
        dst: DeviceRegion,
        dst_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<usize> {
        check_region(&dst, dst_offset, len)?;
        bind_for(&dst)?;
        sys::read(&self.registration, dst.ptr(), dst_offset, len, file_offset)
    }

    /// Writes `len` bytes of `src` at `src_offset` to the file at `file_offset`
    /// (`cuFileWrite`); blocks; returns the bytes written.
    #[doc(alias = "cuFileWrite")]
    pub fn write(
        &self,
        src: DeviceRegion,
        src_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<usize> {
        check_region(&src, src_offset, len)?;
        bind_for(&src)?;
        sys::write(&self.registration, src.ptr(), src_offset, len, file_offset)
    }

    /// Reads every entry with the batch API (`cuFileBatchIOSetUp` / `Submit` / `GetStatus` /
    /// `Destroy`, at most the driver's batch size per submission) and blocks until all
    /// completed. The outer error is a failure of the batch machinery; the inner results are
    /// per entry, in order. All destinations must be on one device.
    #[doc(alias = "cuFileBatchIOSubmit")]
    pub fn read_batch(&self, ios: &[BatchRead]) -> Result<Vec<Result<usize>>> {
        let Some(first) = ios.first() else { return Ok(Vec::new()) };
        let mut entries = Vec::with_capacity(ios.len());
        for io in ios {
            check_region(&io.dst, io.dst_offset, io.len)?;
            if io.dst.device_ordinal() != first.dst.device_ordinal() {
                return Err(Error::InvalidArgument(format!(
                    "batch mixes devices {} and {}",
                    first.dst.device_ordinal(),
                    io.dst.device_ordinal()
                )));
            }
            entries.push(sys::BatchEntry {
                base: io.dst.ptr(),
                base_offset: io.dst_offset,
                len: io.len,
                file_offset: io.file_offset,
            });
        }
        bind_for(&first.dst)?;
        sys::read_batch(&self.registration, &entries)
    }

    /// Registers `region` with cuFile (`cuFileBufRegister`) so I/O into it skips cuFile's
    /// internal bounce buffers; deregistered when the returned guard drops.
    #[doc(alias = "cuFileBufRegister")]
    pub fn register_buffer(region: DeviceRegion) -> Result<RegisteredBuffer> {
        CuFileDriver::get()?;
        bind_for(&region)?;
        Ok(RegisteredBuffer {
            region,
            _registration: sys::BufferRegistration::new(region.ptr(), region.len())?,
        })
    }

    fn start_async(
        &self,
        stream: &Stream,
        write: bool,
        region: DeviceRegion,
        offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<AsyncIo> {
        check_region(&region, offset, len)?;
        if region.device_ordinal() != stream.device().ordinal() {
            return Err(Error::InvalidArgument(format!(
                "region is on device {} but the stream on device {}",
                region.device_ordinal(),
                stream.device().ordinal()
            )));
        }
        stream.device().bind_to_thread()?;
        let pending = sys::PendingFileIo::start(
            &self.registration,
            stream.raw(),
            write,
            region.ptr(),
            offset,
            len,
            file_offset,
        )?;
        Ok(AsyncIo { pending })
    }

    /// Enqueues a stream-ordered read (`cuFileReadAsync`) of `len` bytes at `file_offset`
    /// into `dst` at `dst_offset`; it runs when `stream` reaches it. The parameters cuFile
    /// reads through pointers live in the returned guard until the operation completed.
    #[doc(alias = "cuFileReadAsync")]
    pub fn read_async(
        &self,
        stream: &Stream,
        dst: DeviceRegion,
        dst_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<AsyncIo> {
        self.start_async(stream, false, dst, dst_offset, len, file_offset)
    }

    /// Enqueues a stream-ordered write (`cuFileWriteAsync`); see [`CuFileHandle::read_async`].
    #[doc(alias = "cuFileWriteAsync")]
    pub fn write_async(
        &self,
        stream: &Stream,
        src: DeviceRegion,
        src_offset: usize,
        len: usize,
        file_offset: u64,
    ) -> Result<AsyncIo> {
        self.start_async(stream, true, src, src_offset, len, file_offset)
    }
}

/// A stream-ordered cuFile operation in flight; dropping it waits for it.
pub struct AsyncIo {
    pending: sys::PendingFileIo,
}

impl fmt::Debug for AsyncIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncIo").finish_non_exhaustive()
    }
}

impl AsyncIo {
    /// Blocks until the operation completed; returns the bytes transferred.
    pub fn wait(self) -> Result<usize> {
        self.pending.wait()
    }
}

/// A device region registered with cuFile; deregistered (`cuFileBufDeregister`) on drop.
pub struct RegisteredBuffer {
    region: DeviceRegion,
    _registration: sys::BufferRegistration,
}

impl fmt::Debug for RegisteredBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredBuffer").field("region", &self.region).finish()
    }
}

impl RegisteredBuffer {
    /// The registered region.
    pub fn region(&self) -> DeviceRegion {
        self.region
    }
}
