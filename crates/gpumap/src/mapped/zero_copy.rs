//! The zero-copy tier: a warm, read-only file served to the GPU straight from the host's page
//! cache, with no copy into device memory and no budget of device memory at all.
//!
//! The file is mapped read-only and registered with the driver (`cuMemHostRegister`, read-only
//! flag): its pages are pinned, and kernels read them over PCIe. A gather of rows into a device
//! buffer is then one kernel launch reading the rows where they lie; a kernel of the caller's can
//! read the file at [`ZeroCopyFile::device_ptr`] too. For warm data that fits in host memory this
//! is faster than the cache's gathers and than `FileHandle`'s batch reads, since no byte is
//! staged on the way. The price: registration reads and pins the whole file in host memory, so
//! it is for files that fit in RAM beside everything else, under the limit
//! [`ZeroCopyOptions::max_pinned`] sets across the process, and only on request
//! (docs/decisions/0010-zero-copy-on-request.md).
//!
//! On host memory ([`Device::Host`]) the same API reads with `pread`: the stand-in keeps the
//! semantics (and the tests) without pinning anything.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::io::FileHandle;
use crate::memory::cuda::{BatchCopier, CudaDevice, DeviceCopy, RawRegion};
use crate::memory::registered::{self, RegisteredFile};
use crate::memory::{Device, DeviceViewMut, StreamRef};

use super::engine;
use super::row_indices::RowIndices;

/// Bytes registered by every [`ZeroCopyFile`] of the process, against
/// [`ZeroCopyOptions::max_pinned`].
static PINNED: AtomicU64 = AtomicU64::new(0);

/// Longest piece one copy descriptor carries; longer rows are split.
const PIECE: u64 = 1 << 30;

/// Options of [`ZeroCopyFile::open_with`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ZeroCopyOptions {
    device: Device,
    max_pinned: Option<u64>,
}

impl Default for ZeroCopyOptions {
    fn default() -> Self {
        Self { device: Device::auto(), max_pinned: None }
    }
}

impl ZeroCopyOptions {
    /// GPU 0 where there is one, else host memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// The GPU that reads the file (or [`Device::Host`]).
    pub fn device(&mut self, device: Device) -> &mut Self {
        self.device = device;
        self
    }

    /// The most host memory all zero-copy files of the process may pin together (default: half
    /// of physical memory). Opening a file that would pass it is `OutOfBudget`.
    pub fn max_pinned(&mut self, bytes: u64) -> &mut Self {
        self.max_pinned = Some(bytes);
        self
    }

    /// Opens `path` (see [`ZeroCopyFile::open_with`]).
    pub fn open(&self, path: impl AsRef<Path>) -> Result<ZeroCopyFile> {
        ZeroCopyFile::open_with(path, self)
    }
}

/// A read-only file the GPU reads in place from the host's page cache (see the module docs).
///
/// ```no_run
/// use gpumap::mapped::ZeroCopyFile;
/// use gpumap::memory::{Device, DeviceBuffer};
/// # fn main() -> gpumap::Result<()> {
/// let file = ZeroCopyFile::open("embeddings.bin")?;
/// let mut rows = DeviceBuffer::zeroed(&Device::auto(), 3 * 4096)?;
/// file.gather(&[(0, 4096), (1 << 20, 4096), (7 << 20, 4096)], rows.view_mut())?;
/// # Ok(()) }
/// ```
pub struct ZeroCopyFile {
    path: PathBuf,
    len: u64,
    /// For rows gathered into host memory.
    file: FileHandle,
    /// On a GPU: the registered file, its device and the copy kernel.
    gpu: Option<Registered>,
}

struct Registered {
    file: RegisteredFile,
    device: CudaDevice,
    copier: Arc<BatchCopier>,
}

impl std::fmt::Debug for ZeroCopyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZeroCopyFile")
            .field("path", &self.path)
            .field("len", &self.len)
            .field("device_ptr", &self.device_ptr())
            .finish()
    }
}

impl ZeroCopyFile {
    /// Opens `path` with default options: GPU 0 where there is one.
    pub fn open(path: impl AsRef<Path>) -> Result<ZeroCopyFile> {
        Self::open_with(path, &ZeroCopyOptions::default())
    }

    /// Opens `path`, registering the whole file for the GPU: this reads every page into the
    /// page cache and pins it, in time proportional to its length. `Unavailable` where the device
    /// cannot read host memory registered read-only; `OutOfBudget` past the pinned limit.
    pub fn open_with(path: impl AsRef<Path>, options: &ZeroCopyOptions) -> Result<ZeroCopyFile> {
        Self::with_handle(FileHandle::open(path, "r")?, options)
    }

    /// [`open_with`](Self::open_with) for a file already open (a map's own handle): mapped
    /// from that open file, and read through it where rows go to host memory.
    pub(crate) fn with_handle(file: FileHandle, options: &ZeroCopyOptions) -> Result<ZeroCopyFile> {
        let path = file.path().to_path_buf();
        let len = file.len()?;
        let gpu = match &options.device {
            Device::Host => None,
            Device::Cuda(device) => {
                if !registered::reads_read_only_host_memory(device)? {
                    return Err(Error::Unavailable {
                        what: "zero-copy reads",
                        reason: format!(
                            "{} cannot read host memory registered read-only \
                             (CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED is 0)",
                            Device::Cuda(device.clone()).describe()
                        ),
                    });
                }
                let limit = options
                    .max_pinned
                    .unwrap_or_else(|| crate::memory::host::physical_memory() / 2);
                let pinned = Pinned::take(len, limit)?;
                let len_usize =
                    usize::try_from(len).map_err(|_| Error::Overflow { offset: 0, len })?;
                device.bind_to_thread()?;
                let registered = RegisteredFile::new(file.file(), &path, len_usize)?;
                pinned.keep();
                let copier = BatchCopier::for_device(device)?;
                Some(Registered { file: registered, device: device.clone(), copier })
            }
        };
        Ok(ZeroCopyFile { path, len, file, gpu })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's length when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where a kernel on the device reads the file's first byte (`None` on host memory or for an
    /// empty file). The bytes are the page cache's, read over the bus on every access: read
    /// each once per kernel, or gather what is used more often into device memory.
    pub fn device_ptr(&self) -> Option<u64> {
        self.gpu.as_ref().filter(|g| g.file.len() > 0).map(|g| g.file.device_ptr())
    }

    /// Copies `rows` (`(offset, len)` pairs) packed one after another into `dst`; returns the
    /// bytes copied. On the GPU, rows are read in place from the registered file by one kernel
    /// launch (rows of 256 KiB or more by the copy engines) into device memory of the file's
    /// GPU; into host memory, or on the host tier, they are read with `pread`. A row past the
    /// end of the file is `OutOfRange`, a `dst` shorter than the rows `BufferTooSmall`.
    pub fn gather<'a>(
        &self,
        rows: &[(u64, u64)],
        dst: impl Into<DeviceViewMut<'a>>,
    ) -> Result<u64> {
        let dst = dst.into();
        let mut total = 0u64;
        for &(offset, len) in rows {
            crate::align::check_range(offset, len, self.len)?;
            total = total.checked_add(len).ok_or(Error::Overflow { offset: total, len })?;
        }
        if (dst.len() as u64) < total {
            return Err(Error::BufferTooSmall { needed: total, available: dst.len() as u64 });
        }
        // The registered pages outlive a cut of the file (they stay pinned): a file cut under
        // the map reads as cut, as on every tier, not as the bytes it had. One `fstat`.
        self.file.expect_ranges(rows.iter().copied())?;
        let rows: Vec<(&ZeroCopyFile, u64, u64)> =
            rows.iter().map(|&(o, n)| (self, o, n)).collect();
        copy_rows(&rows, dst)?;
        Ok(total)
    }

    /// Copies rows `indices` of the file (row `i`: bytes `i * row_size .. (i + 1) *
    /// row_size`) in order into `dst`; the rules are
    /// [`DeviceMappedFile::gather_rows`](super::DeviceMappedFile::gather_rows)'s. On the GPU,
    /// one kernel launch reads them in place; into host memory, `pread`s do.
    pub fn gather_rows<'i, 'd>(
        &self,
        indices: impl Into<RowIndices<'i>>,
        row_size: u64,
        dst: impl Into<DeviceViewMut<'d>>,
    ) -> Result<()> {
        self.rows(indices.into(), row_size, dst.into(), None)
    }

    /// [`gather_rows`](Self::gather_rows) with its kernel queued on `stream`.
    pub fn gather_rows_on<'i, 'd>(
        &self,
        indices: impl Into<RowIndices<'i>>,
        row_size: u64,
        dst: impl Into<DeviceViewMut<'d>>,
        stream: StreamRef<'_>,
    ) -> Result<()> {
        self.rows(indices.into(), row_size, dst.into(), Some(stream))
    }
}

impl ZeroCopyFile {
    pub(crate) fn rows(
        &self,
        indices: RowIndices<'_>,
        row_size: u64,
        dst: DeviceViewMut<'_>,
        stream: Option<StreamRef<'_>>,
    ) -> Result<()> {
        let rows_mapped = self.len.checked_div(row_size).unwrap_or(0);
        match dst {
            DeviceViewMut::Host(bytes) => {
                let read = |offset: u64, row: &mut [u8]| self.file.read_exact(row, offset);
                engine::read_rows(indices.source(), row_size, rows_mapped, bytes, &read)
            }
            DeviceViewMut::Cuda(mut view) => {
                let Some(gpu) = &self.gpu else {
                    return Err(Error::InvalidArgument(format!(
                        "{} is a zero-copy file on host memory: it gathers into host memory",
                        self.path.display()
                    )));
                };
                let stream = stream.map(|s| s.on(gpu.device.ordinal())).transpose()?;
                // The registered pages outlive a cut of the file: rows past its end now are
                // refused by the kernel, as on every tier, not read as the bytes they had.
                let rows = rows_mapped.min(self.file.len()?.checked_div(row_size).unwrap_or(0));
                let eof = |offset: u64| self.file.eof_error(offset, row_size, 0);
                engine::gather_rows_direct(
                    &gpu.device,
                    gpu.file.device_ptr(),
                    rows,
                    rows_mapped,
                    indices.source(),
                    row_size,
                    &mut view,
                    stream,
                    &eof,
                )
            }
        }
    }

    /// `[offset, offset + len)` of the registered file as device memory (the caller checked
    /// the bounds); `None` on host memory.
    pub(crate) fn region(&self, offset: u64, len: usize) -> Option<RawRegion> {
        let gpu = self.gpu.as_ref()?;
        (len > 0).then(|| RawRegion {
            ptr: gpu.file.device_ptr() + offset,
            len,
            ordinal: gpu.device.ordinal(),
        })
    }

    /// Reads `dst.len()` bytes at `offset` with `pread` (the CPU never reads the mapping).
    pub(crate) fn read_at(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.file.read_exact(dst, offset)
    }
}

/// Copies rows of zero-copy files (`(file, offset, len)`) packed into `dst` (see
/// [`ZeroCopyFile::gather`]); on the GPU, every row of every file in one launch. The caller
/// checked that each row lies within its file (as long as it is now) and that `dst` holds them
/// all.
pub(crate) fn copy_rows(
    rows: &[(&ZeroCopyFile, u64, u64)],
    mut dst: DeviceViewMut<'_>,
) -> Result<()> {
    let _range = crate::profiling::Range::new(c"gpumap::zero_copy::gather");
    match &mut dst {
        DeviceViewMut::Cuda(view) => {
            let mut copies = Vec::with_capacity(rows.len());
            let mut copier = None;
            let mut at = view.ptr();
            for &(file, offset, len) in rows {
                let Some(gpu) = &file.gpu else {
                    return Err(Error::InvalidArgument(format!(
                        "{} is a zero-copy file on host memory: it gathers into host memory",
                        file.path.display()
                    )));
                };
                if view.device_ordinal() != gpu.device.ordinal() {
                    return Err(Error::InvalidArgument(format!(
                        "the destination is on GPU {}, {} is registered for GPU {}",
                        view.device_ordinal(),
                        file.path.display(),
                        gpu.device.ordinal()
                    )));
                }
                copier.get_or_insert(&gpu.copier);
                let base = gpu.file.device_ptr();
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(PIECE);
                    copies.push(DeviceCopy {
                        src: base + offset + done,
                        dst: at + done,
                        len: n as u32,
                    });
                    done += n;
                }
                at += len;
            }
            if let Some(copier) = copier {
                copier.copy(&copies)?;
            }
        }
        DeviceViewMut::Host(bytes) => {
            let mut at = 0usize;
            for &(file, offset, len) in rows {
                file.file.read_exact(&mut bytes[at..at + len as usize], offset)?;
                at += len as usize;
            }
        }
    }
    Ok(())
}

impl Drop for ZeroCopyFile {
    fn drop(&mut self) {
        if let Some(gpu) = &self.gpu {
            PINNED.fetch_sub(gpu.file.len() as u64, Ordering::Relaxed);
        }
    }
}

/// A claim on [`PINNED`], given back on drop unless kept.
struct Pinned(u64);

impl Pinned {
    fn take(bytes: u64, limit: u64) -> Result<Pinned> {
        let mut in_use = PINNED.load(Ordering::Relaxed);
        loop {
            let after = in_use.saturating_add(bytes);
            if after > limit {
                return Err(Error::OutOfBudget { requested: bytes, budget: limit, in_use });
            }
            match PINNED.compare_exchange(in_use, after, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(Pinned(bytes)),
                Err(now) => in_use = now,
            }
        }
    }

    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        PINNED.fetch_sub(self.0, Ordering::Relaxed);
    }
}
