//! Memory the driver allocates or registers: device allocations, pinned host memory, host
//! ranges registered for the device, pointer attributes, and the synchronous copies.
#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::{c_uint, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::sys as cu;

use super::device::{ensure_some_context, PrimaryContext};
use super::driver::{api, check, release_failed, CUDA_SUCCESS};
use crate::error::{Error, Result};

/// An owned device allocation (`cuMemAlloc`), freed (`cuMemFree`) on drop.
pub(crate) struct DeviceAlloc {
    ptr: cu::CUdeviceptr,
    len: usize,
    ctx: cu::CUcontext,
}

// SAFETY: holds a device address and a context handle; the driver API is thread-safe.
unsafe impl Send for DeviceAlloc {}
// SAFETY: as above; no method mutates the struct.
unsafe impl Sync for DeviceAlloc {}

impl DeviceAlloc {
    /// `cuMemAlloc` of `len` bytes in `ctx`, which the caller has made current. A zero length
    /// allocates nothing (the driver rejects it) and yields a null address.
    pub(crate) fn new(ctx: &PrimaryContext, len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Self { ptr: 0, len: 0, ctx: ctx.ctx });
        }
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        check("cuMemAlloc", unsafe { (api()?.cuMemAlloc_v2)(&mut ptr, len) })?;
        Ok(Self { ptr, len, ctx: ctx.ctx })
    }

    /// The device address.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes allocated.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        if let Ok(api) = api() {
            ensure_some_context(api, self.ctx);
            // Work still queued on the memory (a copy whose guard was leaked, say) must finish
            // before the driver can hand the addresses to another allocation.
            // SAFETY: takes no arguments; a context is current (bound above).
            let rc = unsafe { (api.cuCtxSynchronize)() };
            if rc != CUDA_SUCCESS {
                release_failed(api, "cuCtxSynchronize before cuMemFree", rc);
            }
            // SAFETY: `ptr` came from cuMemAlloc and is freed exactly once, here.
            let rc = unsafe { (api.cuMemFree_v2)(self.ptr) };
            if rc != CUDA_SUCCESS {
                release_failed(api, &format!("cuMemFree({:#x})", self.ptr), rc);
            }
        }
    }
}

/// `cuMemcpyHtoD`: copy of `src` to device address `dst`, on the device when it returns.
pub(crate) fn memcpy_htod(dst: u64, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: `src` is readable for its length; the call returns after the source was consumed.
    check("cuMemcpyHtoD", unsafe {
        (api()?.cuMemcpyHtoD_v2)(dst, src.as_ptr().cast(), src.len())
    })?;
    // From pageable memory the call may return once the bytes are staged, before they reach
    // the device; gpumap's own streams are non-blocking and would not wait for them.
    legacy_stream_synchronize()
}

/// `cuStreamSynchronize` on the legacy default stream, where the synchronous copy and memset
/// calls run: after it, their effects are visible to work on any stream.
fn legacy_stream_synchronize() -> Result<()> {
    // SAFETY: the null handle names the legacy default stream of the current context.
    check("cuStreamSynchronize", unsafe { (api()?.cuStreamSynchronize)(std::ptr::null_mut()) })
}

/// `cuMemcpyDtoH`: synchronous copy from device address `src` into `dst`.
pub(crate) fn memcpy_dtoh(dst: &mut [u8], src: u64) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    // SAFETY: `dst` is writable for its length and exclusively borrowed; the call returns after
    // the copy completed.
    check("cuMemcpyDtoH", unsafe {
        (api()?.cuMemcpyDtoH_v2)(dst.as_mut_ptr().cast(), src, dst.len())
    })
}

/// `cuMemsetD8`: sets `len` bytes at device address `dst` to `value`; done when it returns.
pub(crate) fn memset_d8(dst: u64, value: u8, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: no host memory is involved; the driver validates the device range.
    check("cuMemsetD8", unsafe { (api()?.cuMemsetD8_v2)(dst, value, len) })?;
    // cuMemsetD8 is asynchronous to the host; make it done before anything else touches the
    // memory from a non-blocking stream.
    legacy_stream_synchronize()
}

/// Page-locked host memory (page-aligned, usable from every context), zero-initialised,
/// released on drop: anonymous memory backed by transparent huge pages and registered with the
/// driver where the kernel offers them, else `cuMemHostAlloc`'s.
///
/// Pinning 2 MiB pages costs the driver far less than pinning 4 KiB ones, and threads can fault
/// in their own buffers' pages side by side; `cuMemHostAlloc` made a process's first transfer
/// wait tens of milliseconds for its bounce buffers (docs/decisions/0029-pinned-huge-pages.md).
/// Buffers wanted together are carved out of one registration, because each registration
/// costs the driver about as much as pinning megabytes, one registration at a time
/// (docs/decisions/0037-pinned-buffers-registered-together.md).
pub(crate) struct PinnedHost {
    /// Page-aligned start of the `len` usable bytes.
    pub(super) ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

/// Where a [`PinnedHost`]'s memory came from, which says how it is given back.
enum Backing {
    /// Nothing (the zero-length placeholder).
    None,
    /// `cuMemHostAlloc`'s, freed with `cuMemFreeHost(base)`.
    Driver { base: NonNull<u8> },
    /// A part of a registered anonymous mapping, which ends with the last of its parts.
    Registered { _mapping: Arc<RegisteredMapping> },
}

/// An anonymous mapping registered with `cuMemHostRegister`: unregistered, then unmapped (the
/// fields drop in that order).
struct RegisteredMapping {
    _registration: HostRegistration,
    _map: memmap2::MmapMut,
}

// SAFETY: owns its allocation exclusively (like a Box<[u8]>); a registered mapping's other
// parts are disjoint from this one's bytes.
unsafe impl Send for PinnedHost {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for PinnedHost {}

/// A transparent huge page on x86-64 and most arm64 kernels; a registered buffer starts on one.
const HUGE_PAGE: usize = 2 << 20;

/// Bytes of a new mapping one thread faults in: a larger mapping is faulted in a part per
/// thread, since the kernel zeroes every page it hands out at a few GB/s per thread.
const POPULATE_PART: usize = 8 << 20;

impl PinnedHost {
    /// `len` bytes of pinned memory; needs a current context (the caller binds one).
    pub(crate) fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Self::empty());
        }
        Self::new_many(len, 1)?.pop().ok_or_else(|| Error::Unavailable {
            what: "pinned memory",
            reason: format!("no buffer of {len} bytes was made"),
        })
    }

    /// `count` buffers of `len` bytes each, page-aligned and disjoint, pinned together: one
    /// mapping and one registration where the kernel offers huge pages, else one
    /// `cuMemHostAlloc` each. Needs a current context (the caller binds one).
    pub(crate) fn new_many(len: usize, count: usize) -> Result<Vec<Self>> {
        if len == 0 || count == 0 {
            return Ok((0..count).map(|_| Self::empty()).collect());
        }
        if huge_pages_on_request() {
            match Self::registered(len, count) {
                Ok(pinned) => return Ok(pinned),
                Err(e) => tracing::debug!(
                    "gpumap: pinning {count} x {len} bytes of huge pages failed ({e}); \
                     cuMemHostAlloc instead"
                ),
            }
        }
        (0..count).map(|_| Self::from_driver(len)).collect()
    }

    /// An anonymous mapping advised onto huge pages (its usable part starting on one), faulted
    /// in, then registered (`cuMemHostRegister`, portable) and cut into `count` buffers of
    /// `len` bytes, each starting on a page. The kernel hands out anonymous pages zeroed, so
    /// every byte is initialised.
    fn registered(len: usize, count: usize) -> Result<Vec<Self>> {
        let too_large = || {
            Error::InvalidArgument(format!("{count} pinned buffers of {len} bytes are too large"))
        };
        let stride =
            len.checked_next_multiple_of(crate::align::PAGE_SIZE as usize).ok_or_else(too_large)?;
        let usable = stride.checked_mul(count).ok_or_else(too_large)?;
        let map_len = usable.checked_add(HUGE_PAGE).ok_or_else(too_large)?;
        let map = memmap2::MmapMut::map_anon(map_len).map_err(|e| Error::io_nopath("mmap", e))?;
        let skew = (HUGE_PAGE - map.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
        // Without huge pages the registration still works, at the cost of 4 KiB pages.
        if let Err(e) = map.advise_range(memmap2::Advice::HugePage, skew, usable) {
            tracing::debug!("gpumap: madvise(MADV_HUGEPAGE) refused: {e}");
        }
        // A forked child gets none of it: where a kernel shares pinned pages copy-on-write
        // across a fork, this process's next write would otherwise land on a copy the GPU
        // never reads.
        if let Err(e) = map.advise(memmap2::Advice::DontFork) {
            tracing::debug!("gpumap: madvise(MADV_DONTFORK) refused: {e}");
        }
        populate(&map, skew, usable);
        // SAFETY: `skew < HUGE_PAGE` and `skew + usable <= map_len`: inside the mapping.
        let ptr = unsafe { NonNull::new_unchecked(map.as_ptr().cast_mut().add(skew)) };
        // SAFETY: `ptr..ptr + usable` is mapped read-write and stays mapped while registered:
        // the registration is dropped before the mapping (`RegisteredMapping`).
        let registration = unsafe { HostRegistration::writable(ptr, usable) }?;
        // The copy kernel reads staging memory at its host address, as it does
        // `cuMemHostAlloc`'s under unified addressing; a device that maps registered memory
        // elsewhere gets the driver's allocation instead (dropping the registration ends it).
        if registration.device_ptr() != ptr.as_ptr() as u64 {
            return Err(Error::Unavailable {
                what: "registered pinned memory",
                reason: "the device maps it at another address".to_owned(),
            });
        }
        let shared = Arc::new(RegisteredMapping { _registration: registration, _map: map });
        Ok((0..count)
            .map(|k| Self {
                // SAFETY: `k * stride + len <= usable`: inside the registered range.
                ptr: unsafe { ptr.add(k * stride) },
                len,
                backing: Backing::Registered { _mapping: Arc::clone(&shared) },
            })
            .collect())
    }

    /// `cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE)`, zeroed.
    fn from_driver(len: usize) -> Result<Self> {
        // The driver does not promise page alignment (small pinned allocations may be carved
        // out of larger ones), and O_DIRECT needs it: ask for a page more and start at the
        // first page boundary.
        let page = crate::align::PAGE_SIZE as usize;
        let padded = len.checked_add(page - 1).ok_or_else(|| {
            Error::InvalidArgument(format!("a pinned buffer of {len} bytes is too large"))
        })?;
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("cuMemHostAlloc", unsafe {
            (api()?.cuMemHostAlloc)(&mut raw, padded, cu::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        let base = NonNull::new(raw.cast::<u8>()).ok_or(Error::Cuda {
            op: "cuMemHostAlloc",
            code: 0,
            name: "returned a null pointer".to_owned(),
        })?;
        let skew = (page - base.as_ptr() as usize % page) % page;
        // SAFETY: `skew < page`, so `base + skew` and the `len` bytes after it lie inside the
        // `len + page - 1` bytes allocated.
        let ptr = unsafe { base.add(skew) };
        // SAFETY: the `len` bytes at `ptr` are allocated and writable; zeroing makes every byte
        // initialised before a `&[u8]` to them can exist.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Ok(Self { ptr, len, backing: Backing::Driver { base } })
    }

    /// A zero-length placeholder; allocates nothing and never calls the driver.
    pub(crate) fn empty() -> Self {
        Self { ptr: NonNull::dangling(), len: 0, backing: Backing::None }
    }

    /// Bytes allocated.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The host address (page-aligned).
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The memory as a slice.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes for the life of `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The memory as a mutable slice.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // A registered mapping's last part unregisters it, then unmaps it; nothing else to give
        // back.
        let Backing::Driver { base } = &self.backing else { return };
        match api() {
            Ok(api) => {
                // SAFETY: `base` came from cuMemHostAlloc and is freed exactly once, here.
                let rc = unsafe { (api.cuMemFreeHost)(base.as_ptr().cast()) };
                if rc != CUDA_SUCCESS {
                    release_failed(api, "cuMemFreeHost", rc);
                }
            }
            Err(e) => tracing::warn!("gpumap: pinned memory not released: {e}"),
        }
    }
}

/// Faults in `len` bytes of `map` from `offset` (`MADV_POPULATE_WRITE`), a part of
/// [`POPULATE_PART`] bytes or more per thread, so that the kernel zeroes the pages side by side
/// rather than inside the registration that follows, which pins them one registration at a
/// time. Where the kernel cannot (before Linux 5.14), the registration faults them in instead.
fn populate(map: &memmap2::MmapMut, offset: usize, len: usize) {
    let fault_in = |from: usize, bytes: usize| {
        if let Err(e) = map.advise_range(memmap2::Advice::PopulateWrite, from, bytes) {
            tracing::debug!("gpumap: madvise(MADV_POPULATE_WRITE) refused: {e}");
        }
    };
    let parts = len.div_ceil(POPULATE_PART).min(MAX_POPULATE_THREADS);
    if parts <= 1 {
        fault_in(offset, len);
        return;
    }
    let part = len.div_ceil(parts).next_multiple_of(HUGE_PAGE);
    std::thread::scope(|scope| {
        for first in (part..len).step_by(part) {
            let bytes = part.min(len - first);
            let thread = std::thread::Builder::new().name("gpumap-pin".to_owned());
            let spawned = crate::per_process::spawn_apart_from_fork(|| {
                thread.spawn_scoped(scope, move || fault_in(offset + first, bytes))
            });
            if spawned.is_err() {
                fault_in(offset + first, bytes);
            }
        }
        fault_in(offset, part.min(len));
    });
}

/// Threads that fault in one new mapping at most.
const MAX_POPULATE_THREADS: usize = 16;

/// Whether the kernel gives transparent huge pages to memory that asks for them; read once.
fn huge_pages_on_request() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|mode| huge_pages_given(&mode))
    })
}

/// Whether `mode`, the text of `/sys/kernel/mm/transparent_hugepage/enabled` (the choice in
/// brackets), gives huge pages to memory advised `MADV_HUGEPAGE`.
fn huge_pages_given(mode: &str) -> bool {
    mode.split_whitespace().any(|word| word == "[always]" || word == "[madvise]")
}

#[cfg(test)]
mod tests {
    use super::huge_pages_given;

    #[test]
    fn reads_the_kernels_huge_page_mode() {
        for (mode, given) in [
            ("always [madvise] never\n", true),
            ("[always] madvise never\n", true),
            ("always madvise [never]\n", false),
            ("always [never]\n", false),
            ("", false),
            ("[madvise]", true),
            ("always madvise never", false),
        ] {
            assert_eq!(huge_pages_given(mode), given, "{mode:?}");
        }
    }
}

/// What `cuPointerGetAttributes` says about an address.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PointerAttributes {
    /// `CU_MEMORYTYPE_*`, or 0 when the address is not known to CUDA.
    pub(crate) memory_type: u32,
    /// Whether the allocation is managed (unified) memory.
    pub(crate) is_managed: bool,
    /// The device the memory lives on (or was allocated for).
    pub(crate) device_ordinal: i32,
    /// The owning context, 0 when none.
    pub(crate) context: usize,
    /// Start of the allocation containing the address (0 when unknown).
    pub(crate) range_start: u64,
    /// Size of that allocation (0 when unknown).
    pub(crate) range_size: u64,
}

/// `cuPointerGetAttributes`: unlike `cuPointerGetAttribute`, it does not fail for addresses CUDA
/// does not know (freed, pageable host) but reports memory type 0, which is what lets
/// classification tell them apart without an error path.
pub(crate) fn pointer_attributes(addr: u64) -> Result<PointerAttributes> {
    let api = api()?;
    let attrs: [c_uint; 6] = [
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as c_uint,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED as c_uint,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as c_uint,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT as c_uint,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR as c_uint,
        cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE as c_uint,
    ];
    // Each result gets a zeroed 8-byte slot: the driver writes 4 bytes for the int-typed
    // attributes and up to 8 for the others, so zero-extension reads every one correctly
    // (little-endian). The device ordinal is pre-set to -1 for "none".
    let mut slots: [u64; 6] = [0, 0, u32::MAX as u64, 0, 0, 0];
    let mut data: [*mut c_void; 6] = [std::ptr::null_mut(); 6];
    for (d, s) in data.iter_mut().zip(slots.iter_mut()) {
        *d = (s as *mut u64).cast();
    }
    let mut attr_copy = attrs;
    // SAFETY: `attr_copy` and `data` have 6 entries each, every data pointer points at an
    // 8-byte slot that outlives the call; `addr` is only inspected, never dereferenced.
    check("cuPointerGetAttributes", unsafe {
        (api.cuPointerGetAttributes)(6, attr_copy.as_mut_ptr(), data.as_mut_ptr(), addr)
    })?;
    Ok(PointerAttributes {
        memory_type: slots[0] as u32,
        is_managed: slots[1] != 0,
        device_ordinal: slots[2] as u32 as i32,
        context: slots[3] as usize,
        range_start: slots[4],
        range_size: slots[5],
    })
}

/// `cuMemGetAddressRange`: base and size of the allocation containing `addr` (binds `context`,
/// the one the pointer attributes named, because the call is answered for the current context).
pub(crate) fn mem_get_address_range(addr: u64, context: usize) -> Result<(u64, usize)> {
    let api = api()?;
    if context != 0 {
        // SAFETY: `context` was reported by the driver as the owner of a live allocation.
        check("cuCtxSetCurrent", unsafe { (api.cuCtxSetCurrent)(context as cu::CUcontext) })?;
    }
    let mut base: cu::CUdeviceptr = 0;
    let mut size = 0usize;
    // SAFETY: both out-pointers are valid; `addr` is only looked up.
    check("cuMemGetAddressRange", unsafe {
        (api.cuMemGetAddressRange_v2)(&mut base, &mut size, addr)
    })?;
    Ok((base, size))
}

/// Host memory registered with the driver for the GPU to read (`cuMemHostRegister` with
/// `CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_READ_ONLY`): its pages are pinned, and
/// kernels read them over the bus at [`device_ptr`](Self::device_ptr). Unregistered on drop.
pub(crate) struct HostRegistration {
    ptr: NonNull<u8>,
    device_ptr: u64,
}

// SAFETY: holds an address and a registration, no data; the driver call that ends it may come
// from any thread.
unsafe impl Send for HostRegistration {}
// SAFETY: nothing is reached through a shared reference but the two addresses.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `len` bytes at `ptr` read-only. Pinning faults in and locks every page, so
    /// this takes time in proportion to `len` (docs/decisions/0010-zero-copy-on-request.md) and
    /// fails where the locked-memory limit or a page that cannot be read (the file shrank)
    /// stops it. Needs a current context (the caller binds one).
    ///
    /// # Safety
    /// `ptr..ptr + len` is mapped, readable, and stays mapped until the registration is
    /// dropped.
    pub(crate) unsafe fn read_only(ptr: NonNull<u8>, len: usize) -> Result<Self> {
        let flags = cu::CU_MEMHOSTREGISTER_DEVICEMAP | cu::CU_MEMHOSTREGISTER_READ_ONLY;
        // SAFETY: the caller's promise, passed on.
        unsafe { Self::with_flags(ptr, len, flags) }
    }

    /// Registers `len` bytes at `ptr` for copies both ways and for kernels, in every context
    /// (`CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP`).
    ///
    /// # Safety
    /// `ptr..ptr + len` is mapped read-write and stays mapped until the registration is
    /// dropped.
    pub(crate) unsafe fn writable(ptr: NonNull<u8>, len: usize) -> Result<Self> {
        let flags = cu::CU_MEMHOSTREGISTER_PORTABLE | cu::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the caller's promise, passed on.
        unsafe { Self::with_flags(ptr, len, flags) }
    }

    /// # Safety
    /// As [`read_only`](Self::read_only); `flags` include `CU_MEMHOSTREGISTER_DEVICEMAP`.
    unsafe fn with_flags(ptr: NonNull<u8>, len: usize, flags: c_uint) -> Result<Self> {
        let api = api()?;
        // SAFETY: the caller promises the range is mapped and stays so while registered.
        check("cuMemHostRegister", unsafe {
            (api.cuMemHostRegister_v2)(ptr.as_ptr().cast(), len, flags)
        })?;
        let mut device_ptr: cu::CUdeviceptr = 0;
        // SAFETY: `device_ptr` is a valid out-pointer; `ptr` was registered just above.
        let rc = check("cuMemHostGetDevicePointer", unsafe {
            (api.cuMemHostGetDevicePointer_v2)(&mut device_ptr, ptr.as_ptr().cast(), 0)
        });
        if let Err(e) = rc {
            // SAFETY: registered above, unregistered once, here.
            let _ = unsafe { (api.cuMemHostUnregister)(ptr.as_ptr().cast()) };
            return Err(e);
        }
        Ok(Self { ptr, device_ptr })
    }

    /// Where kernels on the device read the first byte.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.device_ptr
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        match api() {
            Ok(api) => {
                // SAFETY: registered in `with_flags`, unregistered exactly once, here.
                let rc = unsafe { (api.cuMemHostUnregister)(self.ptr.as_ptr().cast()) };
                if rc != CUDA_SUCCESS {
                    release_failed(api, "cuMemHostUnregister", rc);
                }
            }
            Err(e) => tracing::warn!("cuMemHostUnregister not called: {e}"),
        }
    }
}
