//! `gpumapio._native`: the Rust side of the Python package `gpumapio` (see `python/gpumapio/`).
//!
//! Thin by design, one module per concern, over the `gpumap` crate:
//!
//! - [`errors`]: gpumap's errors as Python exceptions (one mapping), and the GIL-releasing,
//!   panic-catching call wrapper every blocking call goes through;
//! - [`buffers`]: Python objects (`__cuda_array_interface__`, buffer protocol, DLPack) as
//!   memory, kept alive for as long as a transfer uses it;
//! - [`future`]: `IOFuture` and `IOFutureStream`;
//! - [`defaults`]: `gpumapio.defaults` (KvikIO's settings);
//! - [`file`]: the `CuFile` class;
//! - [`mmap`]: the `Mmap` class (KvikIO's host-mmap reader, over gpumap's page-cache path);
//! - [`cufile`]: low-level cuFile (driver, handles, batches, stream-ordered I/O, buffer
//!   registration), streams, and what the machine offers;
//! - [`multi_read`]: pieces of many files into one buffer in one pipeline (checkpoints);
//! - [`safetensors_header`]: the common case of a safetensors header or index, read in one pass;
//! - [`dlpack`]: DLPack's C ABI, once, for reading producers' capsules and exporting views;
//! - [`remote`], [`remote_writer`], [`remote_prefix`]: `RemoteFile` (S3, GCS, Azure and
//!   HTTP(S) reads), `RemoteWriter` (S3, GCS and Azure writes as multipart uploads) and
//!   `RemotePrefix` (a prefix of one of those stores as a directory: listed, opened, written,
//!   deleted);
//! - [`pagecache`]: residency, warm, evict, drop, lock;
//! - [`maps`]: files in GPU memory through gpumap's `DeviceCache` (`DeviceCache`,
//!   `MappedFile`, `View` exported through `__cuda_array_interface__` and `__dlpack__`).

/// What the Python thread allocates and gpumap's threads free goes back without glibc's arena
/// locks, which the interpreter's own allocations would wait on; jemalloc's fork handlers keep
/// a forked child's allocator usable (docs/decisions/0045).
#[cfg(all(feature = "jemalloc", target_os = "linux"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod buffers;
mod counts;
mod cufile;
mod defaults;
mod dlpack;
mod errors;
mod file;
mod future;
mod interpreter;
mod maps;
mod mmap;
mod multi_read;
mod pagecache;
mod paths;
mod remote;
mod remote_prefix;
mod remote_writer;
mod rows;
mod safetensors_header;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<file::CuFile>()?;
    m.add_class::<mmap::Mmap>()?;
    m.add_class::<future::IOFuture>()?;
    m.add_class::<future::IOFutureStream>()?;
    m.add_class::<remote::RemoteFile>()?;
    m.add_class::<remote_prefix::RemotePrefix>()?;
    m.add_class::<remote_prefix::RemoteObjects>()?;
    m.add_class::<remote_writer::RemoteWriter>()?;
    m.add_function(wrap_pyfunction!(remote::infer_endpoint_kind, m)?)?;
    m.add_function(wrap_pyfunction!(defaults::defaults_get, m)?)?;
    m.add_function(wrap_pyfunction!(defaults::defaults_set, m)?)?;
    m.add_function(wrap_pyfunction!(defaults::defaults_saved, m)?)?;
    m.add_function(wrap_pyfunction!(defaults::defaults_put_back, m)?)?;
    m.add_function(wrap_pyfunction!(defaults::is_compat_mode_preferred, m)?)?;
    m.add_function(wrap_pyfunction!(defaults::settings_table, m)?)?;
    m.add_class::<cufile::Stream>()?;
    m.add_class::<cufile::Handle>()?;
    m.add_class::<cufile::BufferRegistration>()?;
    m.add_function(wrap_pyfunction!(cufile::driver_open, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::driver_properties, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::library_version, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::driver_set_poll_mode, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::driver_set_max_direct_io_size, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::driver_set_max_cache_size, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::driver_set_max_pinned_mem_size, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::buf_register, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::capabilities, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::gpu_count, m)?)?;
    m.add_function(wrap_pyfunction!(file::wait_for_all_writes, m)?)?;
    m.add_function(wrap_pyfunction!(maps::flush_writable_maps, m)?)?;
    m.add_function(wrap_pyfunction!(interpreter::stop_attaching, m)?)?;
    m.add_function(wrap_pyfunction!(multi_read::read_files, m)?)?;
    m.add_function(wrap_pyfunction!(multi_read::start_read_files, m)?)?;
    m.add_class::<multi_read::FilesRead>()?;
    m.add_function(wrap_pyfunction!(safetensors_header::plain_header, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors_header::plain_index, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors_header::plain_index_files, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors_header::plain_headers, m)?)?;
    m.add_class::<pagecache::LockedRange>()?;
    m.add_function(wrap_pyfunction!(pagecache::residency, m)?)?;
    m.add_function(wrap_pyfunction!(pagecache::warm, m)?)?;
    m.add_function(wrap_pyfunction!(pagecache::evict, m)?)?;
    m.add_function(wrap_pyfunction!(pagecache::drop_all, m)?)?;
    m.add_function(wrap_pyfunction!(pagecache::lock, m)?)?;
    m.add_function(wrap_pyfunction!(pagecache::page_size, m)?)?;
    m.add_class::<maps::DeviceCache>()?;
    m.add_class::<maps::MappedFile>()?;
    m.add_class::<maps::View>()?;
    m.add_class::<maps::LookupScope>()?;
    // Set as attributes, not added (which would also list them in `__all__`): private names
    // the type stubs do not have, in test builds only.
    #[cfg(feature = "fault-injection")]
    {
        m.setattr("_arm_write_fault", wrap_pyfunction!(arm_write_fault, m)?)?;
        m.setattr("_disarm_write_fault", wrap_pyfunction!(disarm_write_fault, m)?)?;
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// Test-only (feature `fault-injection`): from now on, writes gpumap issues to paths containing
/// `path_contains` fail with `errno` once `after_bytes` bytes went through, until disarmed or
/// `times` failures (0: no limit) — `gpumap::fault::arm_write_fault`. Private (no stub).
#[cfg(feature = "fault-injection")]
#[pyfunction(name = "_arm_write_fault")]
#[pyo3(signature = (path_contains, errno, after_bytes = 0, times = 0))]
fn arm_write_fault(path_contains: String, errno: i32, after_bytes: u64, times: u32) {
    gpumap::fault::arm_write_fault(gpumap::fault::WriteFault {
        path_contains,
        errno,
        after_bytes,
        times,
    });
}

/// Test-only (feature `fault-injection`): disarms the injected write fault.
#[cfg(feature = "fault-injection")]
#[pyfunction(name = "_disarm_write_fault")]
fn disarm_write_fault() {
    gpumap::fault::disarm();
}
