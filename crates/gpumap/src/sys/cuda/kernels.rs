//! Kernels of gpumap's own, built to PTX and loaded through the driver: the batched copy and
//! the row gathers.
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::c_void;

use cudarc::driver::sys as cu;

use super::device::device_attribute;
use super::driver::{api, check};
use super::memory::PinnedHost;
use super::stream::{RawStream, StreamHandle};
use crate::error::{Error, Result};

/// The batched-copy kernel of `kernels/copy_batch.cu`, as PTX built by `scripts/build-ptx.py`.
const COPY_BATCH_PTX: &str = concat!(include_str!("../../../kernels/copy_batch.ptx"), "\0");

/// Threads per block of the copy kernel: 256 threads move a 4 KiB copy 16 bytes each.
const COPY_BLOCK: u32 = 256;
/// Most blocks one launch uses; blocks stride over the copies beyond it.
const COPY_GRID_MAX: u32 = 8192;

/// The batched-copy kernel loaded into one context (`cuModuleLoadData` + `cuModuleGetFunction`).
/// The module stays loaded for the life of the process (one per device), so the function
/// handle never dangles.
pub(crate) struct CopyKernel {
    function: cu::CUfunction,
}

// SAFETY: a CUfunction handle may be used from any thread; the driver API is thread-safe.
unsafe impl Send for CopyKernel {}
// SAFETY: as above; nothing mutates the handle.
unsafe impl Sync for CopyKernel {}

impl CopyKernel {
    /// Loads the kernel into the current context (the caller binds the device's). Fails when the
    /// driver cannot JIT the PTX (too old a driver), or when the device has no unified
    /// addressing (the kernel reads pinned host memory through its host address).
    pub(crate) fn load(ordinal: usize) -> Result<CopyKernel> {
        let unified = device_attribute(
            ordinal,
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
        )?;
        if unified == 0 {
            return Err(Error::Unavailable {
                what: "copy kernel",
                reason: format!("GPU {ordinal} has no unified addressing"),
            });
        }
        let api = api()?;
        let mut module: cu::CUmodule = std::ptr::null_mut();
        // SAFETY: `module` is a valid out-pointer; the image is a NUL-terminated PTX string
        // that lives for the whole program.
        check("cuModuleLoadData", unsafe {
            (api.cuModuleLoadData)(&mut module, COPY_BATCH_PTX.as_ptr().cast())
        })?;
        let mut function: cu::CUfunction = std::ptr::null_mut();
        let name = c"gpumap_copy_batch";
        // SAFETY: `function` is a valid out-pointer, `module` was just loaded, `name` is a
        // NUL-terminated string. The module is never unloaded (see the type's docs).
        check("cuModuleGetFunction", unsafe {
            (api.cuModuleGetFunction)(&mut function, module, name.as_ptr())
        })?;
        Ok(CopyKernel { function })
    }

    /// Runs `count` copies described in `descriptors` — `count` source addresses (u64), then
    /// `count` destination addresses (u64), then `count` lengths (u32), packed from its first
    /// byte — on `stream`, and waits for them.
    ///
    /// The crate's contract (it is `pub(crate)`): every source and destination range is memory
    /// the device can reach (device memory, or pinned host memory as a source) that stays valid
    /// and is not otherwise accessed until this returns, and destinations do not overlap.
    pub(crate) fn run(
        &self,
        stream: &RawStream,
        descriptors: &PinnedHost,
        count: usize,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let needed = count.checked_mul(20).ok_or_else(|| {
            Error::InvalidArgument(format!("{count} copy descriptors do not fit in memory"))
        })?;
        if needed > descriptors.len() {
            return Err(Error::BufferTooSmall {
                needed: needed as u64,
                available: descriptors.len() as u64,
            });
        }
        let count32 = u32::try_from(count)
            .map_err(|_| Error::InvalidArgument(format!("{count} copies in one launch")))?;
        let base = descriptors.addr() as u64;
        let mut src = base;
        let mut dst = base + 8 * count as u64;
        let mut len = base + 16 * count as u64;
        let mut n = count32;
        let mut params: [*mut c_void; 4] = [
            (&mut src as *mut u64).cast(),
            (&mut dst as *mut u64).cast(),
            (&mut len as *mut u64).cast(),
            (&mut n as *mut u32).cast(),
        ];
        let grid = count32.min(COPY_GRID_MAX);
        // SAFETY: the four parameters match the kernel's signature (three pointers, one
        // unsigned int) and live until the call returns (the driver copies them at launch).
        // The descriptor arrays lie inside `descriptors` (checked above), which stays borrowed
        // until the stream is synchronized below; the copies' own ranges are the caller's
        // contract.
        check("cuLaunchKernel", unsafe {
            (api()?.cuLaunchKernel)(
                self.function,
                grid,
                1,
                1,
                COPY_BLOCK,
                1,
                1,
                0,
                stream.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })?;
        stream.synchronize()
    }
}

/// The row kernels of `kernels/rows.cu`, as PTX built by `scripts/build-ptx.py`.
const ROWS_PTX: &str = concat!(include_str!("../../../kernels/rows.ptx"), "\0");

/// Threads per block of the row kernels: eight warps, a row each at a time.
const ROW_BLOCK: u32 = 256;
/// Warps per block.
const ROW_WARPS: u64 = ROW_BLOCK as u64 / 32;
/// Most blocks one launch uses; warps stride over the rows beyond them.
const ROW_GRID_MAX: u64 = 1 << 16;

/// A cache's directory as the row kernel takes it: `gpumap_table` of
/// `kernels/gpumap_table.h`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TableParams {
    pub(crate) owners: u64,
    pub(crate) buckets: u64,
    pub(crate) arena: u64,
    pub(crate) used: u64,
    pub(crate) slots: u64,
    pub(crate) bucket_mask: u64,
    pub(crate) bucket_bits: u32,
    pub(crate) max_probes: u32,
    pub(crate) extent_shift: u32,
    pub(crate) reserved: u32,
}

impl TableParams {
    /// The struct's bytes as a kernel reads `gpumap_table` from memory: six `u64`s, then four
    /// `u32`s, native-endian, no padding.
    pub(crate) fn to_ne_bytes(self) -> [u8; 64] {
        let mut bytes = [0u8; 64];
        let words =
            [self.owners, self.buckets, self.arena, self.used, self.slots, self.bucket_mask];
        for (k, w) in words.iter().enumerate() {
            bytes[8 * k..8 * k + 8].copy_from_slice(&w.to_ne_bytes());
        }
        let halves = [self.bucket_bits, self.max_probes, self.extent_shift, self.reserved];
        for (k, h) in halves.iter().enumerate() {
            bytes[48 + 4 * k..52 + 4 * k].copy_from_slice(&h.to_ne_bytes());
        }
        bytes
    }
}

/// Rows to gather: `count` indices (`index_bytes` each, 4 or 8, signed) at `indices`, each
/// naming row `index` of `rows` rows of `row_size` bytes; into `dst`, packed in order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowJob {
    pub(crate) indices: u64,
    pub(crate) index_bytes: u32,
    pub(crate) count: u64,
    pub(crate) rows: u64,
    pub(crate) row_size: u64,
    pub(crate) dst: u64,
    /// Where the kernel puts the lowest position of an index out of range (a `u64` the caller
    /// set to `u64::MAX`).
    pub(crate) first_bad: u64,
}

/// The row kernels loaded into one context; the module stays loaded for the life of the
/// process (one per device), so the function handles never dangle.
pub(crate) struct RowKernels {
    gather: cu::CUfunction,
    direct: cu::CUfunction,
    write_words: cu::CUfunction,
}

// SAFETY: CUfunction handles may be used from any thread; the driver API is thread-safe.
unsafe impl Send for RowKernels {}
// SAFETY: as above; nothing mutates the handles.
unsafe impl Sync for RowKernels {}

/// One function of a loaded module.
fn function(module: cu::CUmodule, name: &std::ffi::CStr) -> Result<cu::CUfunction> {
    let mut function: cu::CUfunction = std::ptr::null_mut();
    // SAFETY: `function` is a valid out-pointer, `module` is loaded (and never unloaded), `name`
    // is a NUL-terminated string.
    check("cuModuleGetFunction", unsafe {
        (api()?.cuModuleGetFunction)(&mut function, module, name.as_ptr())
    })?;
    Ok(function)
}

/// `cuLaunchKernel` of `function` on `stream` over `blocks` blocks of [`ROW_BLOCK`] threads.
///
/// # Safety
/// `params` matches the kernel's parameters in number, order and type, each pointing to a
/// value that lives until this returns (the driver copies them at launch).
unsafe fn launch(
    function: cu::CUfunction,
    blocks: u64,
    stream: StreamHandle,
    params: &mut [*mut c_void],
) -> Result<()> {
    let grid = u32::try_from(blocks.clamp(1, ROW_GRID_MAX)).unwrap_or(1);
    // SAFETY: the caller's contract covers `params`; the stream handle is live (its
    // constructors' contract), and the kernels check every index before they read.
    check("cuLaunchKernel", unsafe {
        (api()?.cuLaunchKernel)(
            function,
            grid,
            1,
            1,
            ROW_BLOCK,
            1,
            1,
            0,
            stream.raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

impl RowKernels {
    /// Loads the kernels into the current context (the caller binds the device's). Fails
    /// where the driver cannot JIT the PTX, or where the device has no unified addressing
    /// (results go to pinned host memory through its host address).
    pub(crate) fn load(ordinal: usize) -> Result<RowKernels> {
        let unified = device_attribute(
            ordinal,
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
        )?;
        if unified == 0 {
            return Err(Error::Unavailable {
                what: "row kernels",
                reason: format!("GPU {ordinal} has no unified addressing"),
            });
        }
        let mut module: cu::CUmodule = std::ptr::null_mut();
        // SAFETY: `module` is a valid out-pointer; the image is a NUL-terminated PTX string
        // that lives for the whole program.
        check("cuModuleLoadData", unsafe {
            (api()?.cuModuleLoadData)(&mut module, ROWS_PTX.as_ptr().cast())
        })?;
        Ok(RowKernels {
            gather: function(module, c"gpumap_gather_rows")?,
            direct: function(module, c"gpumap_gather_rows_direct")?,
            write_words: function(module, c"gpumap_write_words")?,
        })
    }

    /// Queues `gpumap_gather_rows` on `stream`: rows of file `file` found through `table` are
    /// copied; the others' positions go to `misses` (room for `job.count` `u32`s) and their
    /// number to `miss_count` (a `u32` the caller zeroed). With `in_place` (not 0: the file
    /// registered for the device), the kernel also copies the missing rows from there.
    ///
    /// The crate's contract: every address is memory the device can reach, of the sizes the job
    /// implies (`in_place` covering `job.rows * job.row_size` bytes), valid and otherwise
    /// untouched until `stream` has passed this launch; the table's arrays are the directory's,
    /// and no slot it names is reused meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gather_rows(
        &self,
        stream: StreamHandle,
        table: &TableParams,
        file: u64,
        job: &RowJob,
        in_place: u64,
        misses: u64,
        miss_count: u64,
    ) -> Result<()> {
        if job.count == 0 {
            return Ok(());
        }
        let mut table = *table;
        let (mut file, mut indices, mut index_bytes) = (file, job.indices, job.index_bytes);
        let (mut count, mut rows, mut row_size, mut dst) =
            (job.count, job.rows, job.row_size, job.dst);
        let mut in_place = in_place;
        let (mut misses, mut miss_count, mut first_bad) = (misses, miss_count, job.first_bad);
        let mut params: [*mut c_void; 12] = [
            (&mut table as *mut TableParams).cast(),
            (&mut file as *mut u64).cast(),
            (&mut indices as *mut u64).cast(),
            (&mut index_bytes as *mut u32).cast(),
            (&mut count as *mut u64).cast(),
            (&mut rows as *mut u64).cast(),
            (&mut row_size as *mut u64).cast(),
            (&mut dst as *mut u64).cast(),
            (&mut in_place as *mut u64).cast(),
            (&mut misses as *mut u64).cast(),
            (&mut miss_count as *mut u64).cast(),
            (&mut first_bad as *mut u64).cast(),
        ];
        // SAFETY: twelve parameters in the order and types of `gpumap_gather_rows` (the table
        // by value, then u64, pointer, u32, four u64, four pointers), living on this frame.
        unsafe { launch(self.gather, job.count.div_ceil(ROW_WARPS), stream, &mut params) }
    }

    /// Queues `gpumap_gather_rows_direct` on `stream`: rows read in place at `base` (a file
    /// registered for the device). The crate's contract is [`gather_rows`](Self::gather_rows)'s,
    /// `base` covering `job.rows * job.row_size` bytes.
    pub(crate) fn gather_rows_direct(
        &self,
        stream: StreamHandle,
        base: u64,
        job: &RowJob,
    ) -> Result<()> {
        if job.count == 0 {
            return Ok(());
        }
        let (mut base, mut indices, mut index_bytes) = (base, job.indices, job.index_bytes);
        let (mut count, mut rows, mut row_size, mut dst) =
            (job.count, job.rows, job.row_size, job.dst);
        let mut first_bad = job.first_bad;
        let mut params: [*mut c_void; 8] = [
            (&mut base as *mut u64).cast(),
            (&mut indices as *mut u64).cast(),
            (&mut index_bytes as *mut u32).cast(),
            (&mut count as *mut u64).cast(),
            (&mut rows as *mut u64).cast(),
            (&mut row_size as *mut u64).cast(),
            (&mut dst as *mut u64).cast(),
            (&mut first_bad as *mut u64).cast(),
        ];
        // SAFETY: eight parameters in the order and types of `gpumap_gather_rows_direct`
        // (pointer, pointer, u32, three u64, two pointers), living on this frame.
        unsafe { launch(self.direct, job.count.div_ceil(ROW_WARPS), stream, &mut params) }
    }

    /// Queues `gpumap_write_words` on `stream`: `words[positions[k]] = values[k]` for `count`
    /// pairs, each one 64-bit store. The crate's contract: `words` covers every position, the
    /// positions are distinct, and the arrays stay valid until `stream` has passed the launch.
    pub(crate) fn write_words(
        &self,
        stream: StreamHandle,
        words: u64,
        positions: u64,
        values: u64,
        count: u64,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let (mut words, mut positions, mut values, mut n) = (words, positions, values, count);
        let mut params: [*mut c_void; 4] = [
            (&mut words as *mut u64).cast(),
            (&mut positions as *mut u64).cast(),
            (&mut values as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
        ];
        // SAFETY: four parameters of `gpumap_write_words` (three pointers, one u64), living on
        // this frame.
        unsafe {
            launch(self.write_words, count.div_ceil(u64::from(ROW_BLOCK)), stream, &mut params)
        }
    }
}
