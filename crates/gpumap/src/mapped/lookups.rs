//! Lookups by kernels of one's own ([`DeviceCache::lookup_scope`](super::DeviceCache::lookup_scope)): the cache's directory handed to the caller's kernels, which
//! find resident rows themselves (`kernels/gpumap_table.h`, `gpumap_lookup`) as gpumap's own row
//! gathers do — the BaM idea on stock Linux: the GPU asks where a row is, and only the rows it
//! misses ever need the host.
//!
//! A slot the directory names may be reused for another extent once no kernel can still read
//! it. [`LookupScope`] is that promise for the caller's kernels: while it lives, no slot a lookup
//! could find is reused, and dropping it first waits for the work queued on its stream (the
//! kernels that did lookups), so a kernel never reads a slot refilled under it. A cache fault
//! that needs such a slot meanwhile waits, up to the cache's pin wait, then fails with
//! `OutOfBudget`: keep scopes short, around the launches that look rows up.
#![forbid(unsafe_code)]

use std::sync::Arc;

use super::engine::Engine;
use super::file::DeviceMappedFile;
use crate::error::{Error, Result};
use crate::memory::{Device, StreamRef};

/// A hold on a cache's directory for kernels of one's own on one stream (see the module docs).
///
/// ```no_run
/// use gpumap::mapped::{CacheOptions, DeviceCache};
/// use gpumap::memory::cuda::{CudaDevice, Stream};
/// use gpumap::memory::{Device, StreamRef};
/// let device = CudaDevice::new(0)?;
/// let cache: DeviceCache = CacheOptions::new().memory(Device::Cuda(device.clone())).build()?;
/// let table = cache.open("table.bin")?;
/// let stream = Stream::new(&device)?;
/// let scope = cache.lookup_scope(StreamRef::of(&stream))?;
/// let (directory, file) = (scope.table_ptr(), scope.file_number(&table)?);
/// // ... launch a kernel taking `const gpumap_table* directory` and `file` on `stream` ...
/// drop(scope); // waits for `stream`, then slots may be reused again
/// # Ok::<(), gpumap::Error>(())
/// ```
pub struct LookupScope<'s> {
    engine: Arc<Engine>,
    ticket: Option<u64>,
    table: u64,
    stream: StreamRef<'s>,
}

impl std::fmt::Debug for LookupScope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LookupScope")
            .field("table", &format_args!("{:#x}", self.table))
            .field("stream", &self.stream)
            .finish()
    }
}

impl<'s> LookupScope<'s> {
    /// Begins a scope on `engine`'s directory (see
    /// [`DeviceCache::lookup_scope`](super::DeviceCache::lookup_scope)).
    pub(crate) fn begin(engine: &Arc<Engine>, stream: StreamRef<'s>) -> Result<LookupScope<'s>> {
        let Device::Cuda(device) = engine.device() else {
            return Err(Error::Unavailable {
                what: "lookup scope",
                reason: "the cache is in host memory; kernels look rows up in a GPU cache".into(),
            });
        };
        stream.on(device.ordinal())?;
        device.bind_to_thread()?;
        let table = engine.directory.params_ptr().ok_or_else(|| Error::Unavailable {
            what: "lookup scope",
            reason: "the cache has no directory on its GPU".into(),
        })?;
        let ticket = engine.directory.begin()?.into_ticket();
        Ok(LookupScope { engine: Arc::clone(engine), ticket: Some(ticket), table, stream })
    }

    /// The device address of the cache's `gpumap_table` (`kernels/gpumap_table.h`): pass it to
    /// a kernel as `const gpumap_table*`.
    pub fn table_ptr(&self) -> u64 {
        self.table
    }

    /// The stream the scope waits for when it ends.
    pub fn stream(&self) -> &StreamRef<'s> {
        &self.stream
    }

    /// The number `map`'s extents are keyed by in the table (`gpumap_key(file, extent)`).
    /// `InvalidArgument` for a map of another cache, or one whose keys do not fit (a file of
    /// more than 2^40 extents, or past the 2^24th file the cache opened): its lookups would
    /// always miss.
    pub fn file_number(&self, map: &DeviceMappedFile) -> Result<u64> {
        if !Arc::ptr_eq(map.engine(), &self.engine) {
            return Err(Error::InvalidArgument(format!(
                "{} is mapped in another cache than this lookup scope's",
                map.path().display()
            )));
        }
        self.engine.directory_file(map.entry()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{}: its extents have no keys in the cache's table (file number {})",
                map.path().display(),
                map.entry().id
            ))
        })
    }

    /// Ends the scope: waits for the work queued on its stream so far, then lets the cache
    /// reuse slots again. Dropping the scope does the same but can only log a failed wait.
    pub fn end(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        let Some(ticket) = self.ticket.take() else { return Ok(()) };
        let waited = self.stream.synchronize();
        // Even after a failed wait: a stream that cannot be waited for has failed for good (a
        // sticky context error), so nothing of it will read the slots.
        self.engine.directory.end(ticket);
        waited
    }
}

impl Drop for LookupScope<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::warn!("ending a lookup scope: {}", crate::error::Report(&e));
        }
    }
}
