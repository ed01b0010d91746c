//! The engine of the GPU page cache: state, faults, eviction and write-back. Nothing here knows
//! the public types; `DeviceCache`, `DeviceMappedFile` and the views are faces on it.
//!
//! - `state`: the engine (shards of books under their locks, the memory store, the budget) and
//!   what it keeps of each open file;
//! - `backing`: where an open file's bytes come from (a local file, or a remote object);
//! - `books`: a shard's residency books — states, pins, LRU, slots — a pure state machine;
//! - `geometry`: extent and frame arithmetic;
//! - `store`: GPU or host memory — mapping frames and moving bytes;
//! - `room`: eviction, in a shard and across shards;
//! - `pins`: faults of views (contiguous and single-extent);
//! - `plan` and `gather`: batched gathers, planned from a snapshot, then carried out;
//! - `directory` and `rows`: the table of resident extents a GPU kernel reads, and row gathers
//!   by index through it;
//! - `read_through`, `admission` and `doorkeeper`: row gathers' misses read past a full cache,
//!   and their extents made resident in the background once they miss again;
//! - `writeback` and `sticky`: dirty extents out, and the errors that stick.
#![forbid(unsafe_code)]

mod admission;
mod admission_gate;
mod backing;
mod books;
mod directory;
mod doorkeeper;
mod gather;
mod geometry;
mod pins;
mod plan;
mod read_through;
mod room;
mod rows;
mod state;
mod sticky;
mod store;
mod writeback;

pub(crate) use admission::{admit, extents_of_rows};
pub(crate) use admission_gate::AdmissionClaim;
pub(crate) use backing::Backing;
pub(crate) use gather::{gather, GatherRange};
pub(crate) use geometry::Geometry;
pub(crate) use pins::{pin_extent, pin_frames, unpin_view, PinFor, Pins};
pub(crate) use room::evict;
pub(crate) use rows::{gather_rows, gather_rows_direct, read_rows, IndexSource, MissesInPlace};
pub(crate) use state::{CacheNumbers, Engine, EngineConfig, FileEntry, FileNumbers};
pub(crate) use store::Home;
pub(crate) use writeback::{flush, sync, write_back};
