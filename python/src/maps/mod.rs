//! Maps: files in GPU memory with mmap semantics, through gpumap's `DeviceCache` — the classes
//! `DeviceCache`, `MappedFile` and `View` of `gpumapio.maps`.
//!
//! A `View` pins its range of the cache until it is released (`release()`, leaving a `with`
//! block, or garbage collection) *and* every export of it is gone: an array made through
//! `__cuda_array_interface__` keeps the view object alive, and a DLPack capsule holds the pin
//! itself until its consumer calls the deleter. So the memory under a CuPy array or a torch
//! tensor made from a view is never evicted while the array lives.
//!
//! - `cache`: the classes `DeviceCache` and `MappedFile` (together: each hands out the other);
//! - `close_gate`: a `MappedFile`'s open state and the calls in flight that `close` waits for;
//! - `view`: the class `View`, its pin and its exports;
//! - `map_handle`: the binding's hold on a map, which flushes it when the last holder goes;
//! - `lookups`: the class `LookupScope`, a cache's directory for kernels of one's own;
//! - `options` and `stats`: Python arguments to the library's options, its stats to dicts;
//! - `host_bytes`: copies between maps and Python's `bytes` or device memory.

mod cache;
mod close_gate;
mod host_bytes;
mod lookups;
mod map_handle;
mod options;
mod stats;
mod view;

pub use cache::{DeviceCache, MappedFile};
pub use lookups::LookupScope;
pub use map_handle::flush_writable_maps;
pub use view::View;
