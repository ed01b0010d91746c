//! Raw + result layer over cuFile (`libcufile`, GPUDirect Storage).
//!
//! cudarc's cuFile wrappers are not used: they search only `libcufile.so`, `.so.12`, `.so.1`...
//! and panic when none loads, while CUDA 13 runtime packages and the pip wheels ship
//! `libcufile.so.0`. So the library is loaded here with `libloading` (override:
//! `GPUMAP_CUFILE_LIBRARY=/path/to/libcufile.so.0`), every function is resolved into a typed fn
//! pointer table, and a missing library or symbol is [`Error::Unavailable`] naming it.
//!
//! Status values are read as integers — `CUfileError_t` is declared here as two `c_int`s, and
//! batch events' status likewise — because a library newer than the bindings can return codes
//! cudarc's enums do not list, and reading those as a Rust enum would be undefined behaviour.
//! cudarc's `cufile::sys` is used for the layouts of structs we fill in (`CUfileDescr_t`,
//! `CUfileIOParams_t`, `CUfileDrvProps`).

use std::ffi::{c_int, c_uint, c_void};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cudarc::cufile::sys as cf;
use cudarc::driver::sys as cu;

use crate::error::{Error, Result};
use crate::sys::cuda::{RawEvent, RawStream};
use crate::sys::dynlib;

mod batch;
mod stream;

pub(crate) use batch::{read_batch, BatchEntry};
pub(crate) use stream::PendingFileIo;

/// Environment variable naming the cuFile library to load instead of searching.
pub(crate) const LIBRARY_ENV: &str = "GPUMAP_CUFILE_LIBRARY";
/// Names tried, in order, when [`LIBRARY_ENV`] is unset.
pub(crate) const LIBRARY_CANDIDATES: &[&str] =
    &["libcufile.so.0", "libcufile.so", "libcufile.so.1", "libcufile.so.12"];

/// `CUfileError_t` with both members read as integers (`CUfileOpError`, `CUresult`).
#[repr(C)]
#[derive(Clone, Copy)]
struct FileStatus {
    err: c_int,
    cu_err: c_int,
}

/// `CUfileIOEvents_t` with `status` read as an integer.
#[repr(C)]
#[derive(Clone, Copy)]
struct IoEvent {
    cookie: *mut c_void,
    status: c_int,
    ret: usize,
}

const CU_FILE_SUCCESS: c_int = 0;
const CU_FILE_CUDA_DRIVER_ERROR: c_int = 5011;
const CUFILE_COMPLETE: c_int = 16;
const CUFILE_WAITING: c_int = 1;
const CUFILE_PENDING: c_int = 2;

/// The symbolic name of a `CUfileOpError` value, or `"unknown"`.
pub(crate) fn op_error_name(code: i64) -> &'static str {
    match code {
        0 => "CU_FILE_SUCCESS",
        5001 => "CU_FILE_DRIVER_NOT_INITIALIZED",
        5002 => "CU_FILE_DRIVER_INVALID_PROPS",
        5003 => "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
        5004 => "CU_FILE_DRIVER_VERSION_MISMATCH",
        5005 => "CU_FILE_DRIVER_VERSION_READ_ERROR",
        5006 => "CU_FILE_DRIVER_CLOSING",
        5007 => "CU_FILE_PLATFORM_NOT_SUPPORTED",
        5008 => "CU_FILE_IO_NOT_SUPPORTED",
        5009 => "CU_FILE_DEVICE_NOT_SUPPORTED",
        5010 => "CU_FILE_NVFS_DRIVER_ERROR",
        5011 => "CU_FILE_CUDA_DRIVER_ERROR",
        5012 => "CU_FILE_CUDA_POINTER_INVALID",
        5013 => "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
        5014 => "CU_FILE_CUDA_POINTER_RANGE_ERROR",
        5015 => "CU_FILE_CUDA_CONTEXT_MISMATCH",
        5016 => "CU_FILE_INVALID_MAPPING_SIZE",
        5017 => "CU_FILE_INVALID_MAPPING_RANGE",
        5018 => "CU_FILE_INVALID_FILE_TYPE",
        5019 => "CU_FILE_INVALID_FILE_OPEN_FLAG",
        5020 => "CU_FILE_DIO_NOT_SET",
        5022 => "CU_FILE_INVALID_VALUE",
        5023 => "CU_FILE_MEMORY_ALREADY_REGISTERED",
        5024 => "CU_FILE_MEMORY_NOT_REGISTERED",
        5025 => "CU_FILE_PERMISSION_DENIED",
        5026 => "CU_FILE_DRIVER_ALREADY_OPEN",
        5027 => "CU_FILE_HANDLE_NOT_REGISTERED",
        5028 => "CU_FILE_HANDLE_ALREADY_REGISTERED",
        5029 => "CU_FILE_DEVICE_NOT_FOUND",
        5030 => "CU_FILE_INTERNAL_ERROR",
        5031 => "CU_FILE_GETNEWFD_FAILED",
        5033 => "CU_FILE_NVFS_SETUP_ERROR",
        5034 => "CU_FILE_IO_DISABLED",
        5035 => "CU_FILE_BATCH_SUBMIT_FAILED",
        5036 => "CU_FILE_GPU_MEMORY_PINNING_FAILED",
        5037 => "CU_FILE_BATCH_FULL",
        5038 => "CU_FILE_ASYNC_NOT_SUPPORTED",
        5039 => "CU_FILE_INTERNAL_BATCH_SETUP_ERROR",
        5040 => "CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR",
        5041 => "CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR",
        5042 => "CU_FILE_INTERNAL_BATCH_CANCEL_ERROR",
        5043 => "CU_FILE_NOMEM_ERROR",
        5044 => "CU_FILE_IO_ERROR",
        5045 => "CU_FILE_INTERNAL_BUF_REGISTER_ERROR",
        5046 => "CU_FILE_HASH_OPR_ERROR",
        5047 => "CU_FILE_INVALID_CONTEXT_ERROR",
        5048 => "CU_FILE_NVFS_INTERNAL_DRIVER_ERROR",
        5049 => "CU_FILE_BATCH_NOCOMPAT_ERROR",
        5050 => "CU_FILE_IO_MAX_ERROR",
        _ => "unknown",
    }
}

type Handle = cf::CUfileHandle_t;
type BatchHandle = cf::CUfileBatchHandle_t;
type AsyncFn = unsafe extern "C" fn(
    Handle,
    *mut c_void,
    *mut usize,
    *mut libc::off_t,
    *mut libc::off_t,
    *mut isize,
    cu::CUstream,
) -> FileStatus;

/// The cuFile entry points. The core set is required to load the library at all; the batch and
/// stream functions are kept as `Result`s so that a library lacking them still does plain I/O
/// and only their callers see `Unavailable` naming the symbol.
#[allow(non_snake_case)]
struct Api {
    cuFileDriverOpen: unsafe extern "C" fn() -> FileStatus,
    cuFileDriverGetProperties:
        Result<unsafe extern "C" fn(*mut cf::CUfileDrvProps) -> FileStatus, String>,
    cuFileHandleRegister: unsafe extern "C" fn(*mut Handle, *mut cf::CUfileDescr_t) -> FileStatus,
    cuFileHandleDeregister: unsafe extern "C" fn(Handle),
    cuFileBufRegister: unsafe extern "C" fn(*const c_void, usize, c_int) -> FileStatus,
    cuFileBufDeregister: unsafe extern "C" fn(*const c_void) -> FileStatus,
    cuFileRead: unsafe extern "C" fn(Handle, *mut c_void, usize, libc::off_t, libc::off_t) -> isize,
    cuFileWrite:
        unsafe extern "C" fn(Handle, *const c_void, usize, libc::off_t, libc::off_t) -> isize,
    cuFileBatchIOSetUp:
        Result<unsafe extern "C" fn(*mut BatchHandle, c_uint) -> FileStatus, String>,
    cuFileBatchIOSubmit: Result<
        unsafe extern "C" fn(BatchHandle, c_uint, *mut cf::CUfileIOParams_t, c_uint) -> FileStatus,
        String,
    >,
    cuFileBatchIOGetStatus: Result<
        unsafe extern "C" fn(
            BatchHandle,
            c_uint,
            *mut c_uint,
            *mut IoEvent,
            *mut libc::timespec,
        ) -> FileStatus,
        String,
    >,
    cuFileBatchIOCancel: Result<unsafe extern "C" fn(BatchHandle) -> FileStatus, String>,
    cuFileBatchIODestroy: Result<unsafe extern "C" fn(BatchHandle), String>,
    cuFileReadAsync: Result<AsyncFn, String>,
    cuFileWriteAsync: Result<AsyncFn, String>,
    /// cuFile 1.8 and later.
    cuFileGetVersion: Result<unsafe extern "C" fn(*mut c_int) -> FileStatus, String>,
    cuFileDriverSetPollMode: Result<unsafe extern "C" fn(bool, usize) -> FileStatus, String>,
    cuFileDriverSetMaxDirectIOSize: Result<unsafe extern "C" fn(usize) -> FileStatus, String>,
    cuFileDriverSetMaxCacheSize: Result<unsafe extern "C" fn(usize) -> FileStatus, String>,
    cuFileDriverSetMaxPinnedMemSize: Result<unsafe extern "C" fn(usize) -> FileStatus, String>,
}

/// The loaded cuFile library.
pub(crate) struct Library {
    api: Api,
    /// The name (or override path) that loaded.
    pub(crate) name: String,
}

/// Resolves `name` from the cuFile library (see [`dynlib::symbol`]).
///
/// # Safety
/// `F` must be the exact C signature of `name`.
unsafe fn symbol<F: Copy>(lib: &'static libloading::Library, name: &str) -> Result<F, String> {
    // SAFETY: the caller guarantees the signature.
    unsafe { dynlib::symbol(lib, "libcufile", name) }
}

fn load_library() -> Result<Library, String> {
    let override_path = std::env::var_os(LIBRARY_ENV);
    let candidates: Vec<String> = match &override_path {
        Some(p) => vec![p.to_string_lossy().into_owned()],
        None => LIBRARY_CANDIDATES.iter().map(|s| (*s).to_owned()).collect(),
    };
    // SAFETY: loading libcufile runs its initialisers, which only set up its own state.
    let (name, lib) =
        unsafe { dynlib::open_first(&candidates) }.map_err(|errors| match override_path {
            Some(_) => format!("libcufile not found ({LIBRARY_ENV}: {})", errors.join("; ")),
            None => format!("libcufile not found (searched: {})", candidates.join(", ")),
        })?;
    // SAFETY (all blocks below): each target type is the C signature from cufile.h, with
    // `CUfileError_t` declared as `FileStatus` (two ints) and enums passed as unsigned int.
    let api = Api {
        cuFileDriverOpen: unsafe { symbol(lib, "cuFileDriverOpen")? },
        cuFileDriverGetProperties: unsafe { symbol(lib, "cuFileDriverGetProperties") },
        cuFileHandleRegister: unsafe { symbol(lib, "cuFileHandleRegister")? },
        cuFileHandleDeregister: unsafe { symbol(lib, "cuFileHandleDeregister")? },
        cuFileBufRegister: unsafe { symbol(lib, "cuFileBufRegister")? },
        cuFileBufDeregister: unsafe { symbol(lib, "cuFileBufDeregister")? },
        cuFileRead: unsafe { symbol(lib, "cuFileRead")? },
        cuFileWrite: unsafe { symbol(lib, "cuFileWrite")? },
        cuFileBatchIOSetUp: unsafe { symbol(lib, "cuFileBatchIOSetUp") },
        cuFileBatchIOSubmit: unsafe { symbol(lib, "cuFileBatchIOSubmit") },
        cuFileBatchIOGetStatus: unsafe { symbol(lib, "cuFileBatchIOGetStatus") },
        cuFileBatchIOCancel: unsafe { symbol(lib, "cuFileBatchIOCancel") },
        cuFileBatchIODestroy: unsafe { symbol(lib, "cuFileBatchIODestroy") },
        cuFileReadAsync: unsafe { symbol(lib, "cuFileReadAsync") },
        cuFileWriteAsync: unsafe { symbol(lib, "cuFileWriteAsync") },
        cuFileGetVersion: unsafe { symbol(lib, "cuFileGetVersion") },
        cuFileDriverSetPollMode: unsafe { symbol(lib, "cuFileDriverSetPollMode") },
        cuFileDriverSetMaxDirectIOSize: unsafe { symbol(lib, "cuFileDriverSetMaxDirectIOSize") },
        cuFileDriverSetMaxCacheSize: unsafe { symbol(lib, "cuFileDriverSetMaxCacheSize") },
        cuFileDriverSetMaxPinnedMemSize: unsafe { symbol(lib, "cuFileDriverSetMaxPinnedMemSize") },
    };
    Ok(Library { api, name })
}

impl Library {
    /// `cuFileGetVersion` as (major, minor) — the number is `major * 1000 + minor * 10` —
    /// or `None` where the library predates it or fails to say. Needs no open driver.
    pub(crate) fn version(&self) -> Option<(u32, u32)> {
        let get = self.api.cuFileGetVersion.as_ref().ok()?;
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid out-pointer for the int the function writes.
        let st = unsafe { get(&mut version) };
        let version = u32::try_from(version).ok().filter(|_| st.err == CU_FILE_SUCCESS)?;
        Some((version / 1000, (version % 1000) / 10))
    }
}

/// The cuFile library, loaded once per process (no driver call is made).
pub(crate) fn library() -> Result<&'static Library> {
    static LIB: OnceLock<Result<Library, String>> = OnceLock::new();
    LIB.get_or_init(load_library)
        .as_ref()
        .map_err(|reason| Error::Unavailable { what: "cuFile", reason: reason.clone() })
}

/// Driver properties (`cuFileDriverGetProperties`) worth reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DriverProps {
    /// nvidia-fs major version (0 when the kernel module is absent).
    pub(crate) nvfs_major: u32,
    /// nvidia-fs minor version.
    pub(crate) nvfs_minor: u32,
    /// Largest single direct I/O in bytes.
    pub(crate) max_direct_io_size: usize,
    /// Largest number of entries in one batch.
    pub(crate) max_batch_io_size: u32,
    /// Driver status flags (`CU_FILE_*_SUPPORTED` bits).
    pub(crate) status_flags: u32,
    /// Feature flags (batch, streams, ...).
    pub(crate) feature_flags: u32,
    /// Driver control flags (`CU_FILE_USE_POLL_MODE`, `CU_FILE_ALLOW_COMPAT_MODE` bits).
    pub(crate) control_flags: u32,
    /// Reads and writes up to this size poll in poll mode, KiB.
    pub(crate) poll_thresh_size_kb: usize,
    /// Device memory cuFile keeps for its own bounce buffers, KiB.
    pub(crate) max_device_cache_size_kb: u32,
    /// Size of each of those buffers, KiB.
    pub(crate) per_buffer_cache_size_kb: u32,
    /// Device memory cuFile may pin, KiB.
    pub(crate) max_device_pinned_mem_size_kb: u32,
}

/// The opened cuFile driver.
pub(crate) struct Driver {
    /// The library it was opened through.
    pub(crate) library: &'static Library,
    /// Its properties, when the library can report them.
    pub(crate) props: Option<DriverProps>,
}

fn status_error(
    op: &'static str,
    st: FileStatus,
    path: Option<&Path>,
    offset: Option<u64>,
) -> Error {
    let code = i64::from(st.err);
    let name = if st.err == CU_FILE_CUDA_DRIVER_ERROR {
        format!(
            "{} ({} {})",
            op_error_name(code),
            crate::sys::cuda::error_name(st.cu_err),
            st.cu_err
        )
    } else {
        op_error_name(code).to_owned()
    };
    Error::CuFile { op, code, name, path: path.map(Path::to_path_buf), offset }
}

fn check(op: &'static str, st: FileStatus, path: Option<&Path>, offset: Option<u64>) -> Result<()> {
    if st.err == CU_FILE_SUCCESS {
        Ok(())
    } else {
        Err(status_error(op, st, path, offset))
    }
}

fn open_driver() -> Result<Driver, String> {
    let library = library().map_err(|e| match e {
        Error::Unavailable { reason, .. } => reason,
        other => other.to_string(),
    })?;
    // cuFile needs the CUDA driver and a device; without them some libcufile builds never return
    // from cuFileDriverOpen (the CUDA 13 pip wheel's, which torch loads, on a machine with no
    // driver), so it is not called.
    match crate::sys::cuda::driver() {
        Ok(cuda) if cuda.device_count > 0 => {}
        Ok(_) => return Err("cuFileDriverOpen not tried: no CUDA device".to_owned()),
        Err(_) => return Err("cuFileDriverOpen not tried: no CUDA driver".to_owned()),
    }
    let api = &library.api;
    // SAFETY: no arguments; opening twice is harmless (returns DRIVER_ALREADY_OPEN or success).
    let st = unsafe { (api.cuFileDriverOpen)() };
    if st.err != CU_FILE_SUCCESS && i64::from(st.err) != 5026 {
        let e = status_error("cuFileDriverOpen", st, None, None);
        return Err(match e {
            Error::CuFile { code, name, .. } => format!("cuFileDriverOpen: {name} ({code})"),
            other => other.to_string(),
        });
    }
    let props = api.cuFileDriverGetProperties.as_ref().ok().and_then(|get| {
        // SAFETY: CUfileDrvProps is plain integers, so all-zero is a valid value.
        let mut p: cf::CUfileDrvProps = unsafe { std::mem::zeroed() };
        // SAFETY: `p` is a valid out-pointer of the struct the function fills.
        let st = unsafe { get(&mut p) };
        (st.err == CU_FILE_SUCCESS).then_some(DriverProps {
            nvfs_major: p.nvfs.major_version,
            nvfs_minor: p.nvfs.minor_version,
            // Reported in KiB (cufile.json's `max_direct_io_size_kb`).
            max_direct_io_size: p.nvfs.max_direct_io_size.saturating_mul(1024),
            max_batch_io_size: p.max_batch_io_size,
            status_flags: p.nvfs.dstatusflags,
            feature_flags: p.fflags,
            control_flags: p.nvfs.dcontrolflags,
            poll_thresh_size_kb: p.nvfs.poll_thresh_size,
            max_device_cache_size_kb: p.max_device_cache_size,
            per_buffer_cache_size_kb: p.per_buffer_cache_size,
            max_device_pinned_mem_size_kb: p.max_device_pinned_mem_size,
        })
    });
    Ok(Driver { library, props })
}

/// The cuFile driver, opened once per process (`cuFileDriverOpen`); never closed, since the
/// library tears itself down at exit. `Unavailable` carries the reason it could not be opened.
pub(crate) fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(open_driver)
        .as_ref()
        .map_err(|reason| Error::Unavailable { what: "cuFile", reason: reason.clone() })
}

fn api() -> Result<&'static Api> {
    driver().map(|d| &d.library.api)
}

/// `cuFileDriverSetPollMode`: whether reads and writes of up to `threshold_kb` KiB poll for
/// their completion. Opens the driver first; `Unavailable` where the library lacks the call.
pub(crate) fn driver_set_poll_mode(poll: bool, threshold_kb: usize) -> Result<()> {
    let set = optional(&api()?.cuFileDriverSetPollMode)?;
    // SAFETY: two plain values, as cufile.h declares them; the driver is open.
    let st = unsafe { set(poll, threshold_kb) };
    check("cuFileDriverSetPollMode", st, None, None)
}

/// `cuFileDriverSetMaxDirectIOSize`: the largest direct I/O cuFile issues, KiB.
pub(crate) fn driver_set_max_direct_io_size(kb: usize) -> Result<()> {
    let set = optional(&api()?.cuFileDriverSetMaxDirectIOSize)?;
    // SAFETY: one plain value, as cufile.h declares it; the driver is open.
    let st = unsafe { set(kb) };
    check("cuFileDriverSetMaxDirectIOSize", st, None, None)
}

/// `cuFileDriverSetMaxCacheSize`: device memory cuFile keeps for its own bounce buffers, KiB.
pub(crate) fn driver_set_max_cache_size(kb: usize) -> Result<()> {
    let set = optional(&api()?.cuFileDriverSetMaxCacheSize)?;
    // SAFETY: one plain value, as cufile.h declares it; the driver is open.
    let st = unsafe { set(kb) };
    check("cuFileDriverSetMaxCacheSize", st, None, None)
}

/// `cuFileDriverSetMaxPinnedMemSize`: device memory cuFile may pin, KiB.
pub(crate) fn driver_set_max_pinned_mem_size(kb: usize) -> Result<()> {
    let set = optional(&api()?.cuFileDriverSetMaxPinnedMemSize)?;
    // SAFETY: one plain value, as cufile.h declares it; the driver is open.
    let st = unsafe { set(kb) };
    check("cuFileDriverSetMaxPinnedMemSize", st, None, None)
}

fn optional<T: Copy>(f: &Result<T, String>) -> Result<T> {
    f.as_ref()
        .copied()
        .map_err(|reason| Error::Unavailable { what: "cuFile", reason: reason.clone() })
}

fn to_off(value: u64, len: u64) -> Result<libc::off_t> {
    libc::off_t::try_from(value)
        .ok()
        .filter(|v| v.checked_add(len as libc::off_t).is_some())
        .ok_or(Error::Overflow { offset: value, len })
}

/// A file registered with cuFile (`cuFileHandleRegister` on an `O_DIRECT`-or-not fd of our own
/// duplicate of the caller's file), deregistered on drop before its fd closes.
pub(crate) struct FileRegistration {
    handle: Handle,
    /// Our own fd, so the registration never outlives the descriptor it names.
    _file: File,
    path: PathBuf,
}

// SAFETY: a CUfileHandle_t may be used from any thread (cuFile I/O is thread-safe per handle).
unsafe impl Send for FileRegistration {}
// SAFETY: as above; no method mutates the struct.
unsafe impl Sync for FileRegistration {}

impl FileRegistration {
    /// Duplicates `file`'s descriptor and registers it (`CU_FILE_HANDLE_TYPE_OPAQUE_FD`).
    pub(crate) fn new(file: &File, path: &Path) -> Result<Self> {
        let api = api()?;
        let file = file.try_clone().map_err(|e| Error::io("dup", path, None, e))?;
        let mut descr = cf::CUfileDescr_t {
            type_: cf::CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
            handle: cf::CUfileDescr_t__bindgen_ty_1 { fd: file.as_raw_fd() },
            fs_ops: std::ptr::null(),
        };
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: both pointers are valid for the call; the fd stays open while registered.
        let st = unsafe { (api.cuFileHandleRegister)(&mut handle, &mut descr) };
        check("cuFileHandleRegister", st, Some(path), None)?;
        Ok(Self { handle, _file: file, path: path.to_path_buf() })
    }

    /// The registered file's path (for error context).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for FileRegistration {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: the handle was registered in `new` and is deregistered once, before `_file`
            // closes the descriptor.
            unsafe { (api.cuFileHandleDeregister)(self.handle) };
        }
    }
}

fn io_result(op: &'static str, ret: isize, path: &Path, offset: u64) -> Result<usize> {
    match ret {
        n if n >= 0 => Ok(n as usize),
        -1 => Err(Error::io(op, path, Some(offset), std::io::Error::last_os_error())),
        n => {
            let code = -(n as i64);
            Err(Error::CuFile {
                op,
                code,
                name: op_error_name(code).to_owned(),
                path: Some(path.to_path_buf()),
                offset: Some(offset),
            })
        }
    }
}

/// `cuFileRead`: up to `len` bytes at `file_offset` into device memory `base + base_offset`.
/// Blocks; the caller has bound the memory's context to this thread and range-checked it.
pub(crate) fn read(
    reg: &FileRegistration,
    base: u64,
    base_offset: usize,
    len: usize,
    file_offset: u64,
) -> Result<usize> {
    let api = api()?;
    let off = to_off(file_offset, len as u64)?;
    let dev_off = to_off(base_offset as u64, len as u64)?;
    // SAFETY: only device memory is written, which the driver validates; the handle is live.
    let ret = unsafe { (api.cuFileRead)(reg.handle, base as *mut c_void, len, off, dev_off) };
    io_result("cuFileRead", ret, &reg.path, file_offset)
}

/// `cuFileWrite`: up to `len` bytes from device memory `base + base_offset` at `file_offset`.
pub(crate) fn write(
    reg: &FileRegistration,
    base: u64,
    base_offset: usize,
    len: usize,
    file_offset: u64,
) -> Result<usize> {
    let api = api()?;
    let off = to_off(file_offset, len as u64)?;
    let dev_off = to_off(base_offset as u64, len as u64)?;
    // SAFETY: only device memory is read; the handle is live.
    let ret = unsafe { (api.cuFileWrite)(reg.handle, base as *const c_void, len, off, dev_off) };
    io_result("cuFileWrite", ret, &reg.path, file_offset)
}

/// A device buffer registered with cuFile (`cuFileBufRegister`), deregistered on drop.
pub(crate) struct BufferRegistration {
    base: u64,
}

impl BufferRegistration {
    /// `cuFileBufRegister(base, len, 0)`.
    pub(crate) fn new(base: u64, len: usize) -> Result<Self> {
        let api = api()?;
        // SAFETY: the address is device memory, only looked up and pinned by the driver.
        let st = unsafe { (api.cuFileBufRegister)(base as *const c_void, len, 0) };
        check("cuFileBufRegister", st, None, None)?;
        Ok(Self { base })
    }
}

impl Drop for BufferRegistration {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: deregisters the registration made in `new`, once.
            let st = unsafe { (api.cuFileBufDeregister)(self.base as *const c_void) };
            if st.err != CU_FILE_SUCCESS {
                tracing::warn!(
                    "cuFileBufDeregister({:#x}) failed: {}",
                    self.base,
                    op_error_name(i64::from(st.err))
                );
            }
        }
    }
}
