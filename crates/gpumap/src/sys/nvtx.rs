//! NVTX ranges for profilers (Nsight Systems, Nsight Compute), loaded at run time.
//!
//! NVTX 3 is a header-only C library; CUDA 13 ships its calls as real symbols in
//! `libnvtx3interop.so.1` for languages that cannot use the header (older toolkits:
//! `libnvToolsExt.so.1`). Without a profiler attached the calls do nothing. gpumap loads the
//! library only when ranges are asked for — `GPUMAP_NVTX=1`, or a profiler's injection
//! library named in `NVTX_INJECTION64_PATH` — so that a process that is not being profiled
//! never opens it.

use std::ffi::{c_char, c_int, CStr};
use std::sync::OnceLock;

use super::dynlib;

/// Library names tried in order.
const CANDIDATES: [&str; 4] =
    ["libnvtx3interop.so.1", "libnvtx3interop.so", "libnvToolsExt.so.1", "libnvToolsExt.so"];

struct Api {
    push: unsafe extern "C" fn(*const c_char) -> c_int,
    pop: unsafe extern "C" fn() -> c_int,
}

/// Whether ranges are wanted, and the library if so: `Ok(None)` when not wanted, `Err` with
/// the reason when wanted but not loadable.
fn api() -> &'static Result<Option<Api>, String> {
    static API: OnceLock<Result<Option<Api>, String>> = OnceLock::new();
    API.get_or_init(|| {
        let wanted = std::env::var("GPUMAP_NVTX").is_ok_and(|v| v == "1")
            || std::env::var_os("NVTX_INJECTION64_PATH").is_some_and(|p| !p.is_empty());
        if !wanted {
            return Ok(None);
        }
        let result = load();
        if let Err(reason) = &result {
            tracing::warn!("NVTX ranges asked for but not available: {reason}");
        }
        result.map(Some)
    })
}

fn load() -> Result<Api, String> {
    // SAFETY: loading the NVTX library runs its initialisers, which only set up its own state
    // (it loads a profiler's injection library, if one is named, on first use).
    let (name, lib) = unsafe { dynlib::open_first(&CANDIDATES) }
        .map_err(|errors| format!("no NVTX library ({})", errors.join("; ")))?;
    // SAFETY (both): the C signatures from nvToolsExt.h, `int nvtxRangePushA(const char*)` and
    // `int nvtxRangePop(void)`.
    let push = unsafe { dynlib::symbol(lib, &name, "nvtxRangePushA")? };
    let pop = unsafe { dynlib::symbol(lib, &name, "nvtxRangePop")? };
    Ok(Api { push, pop })
}

/// Whether ranges are being emitted; `Err` with the reason where they were asked for and the
/// library could not be loaded.
pub(crate) fn status() -> Result<bool, String> {
    api().as_ref().map(|api| api.is_some()).map_err(Clone::clone)
}

/// Opens a range named `name` on the calling thread, if ranges are on. Returns whether it did
/// (the caller pops exactly those).
pub(crate) fn push(name: &CStr) -> bool {
    match api() {
        Ok(Some(api)) => {
            // SAFETY: `name` is a NUL-terminated string that outlives the call; NVTX copies it.
            unsafe { (api.push)(name.as_ptr()) };
            true
        }
        _ => false,
    }
}

/// Closes the innermost range the calling thread opened.
pub(crate) fn pop() {
    if let Ok(Some(api)) = api() {
        // SAFETY: no arguments; a range pushed by this thread is open (see `push`).
        unsafe { (api.pop)() };
    }
}
