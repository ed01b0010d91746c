//! gpumap moves file data into and out of NVIDIA GPU memory as fast as the hardware allows,
//! and runs — with host memory standing in for the GPU — on any Linux machine.
//!
//! # The pieces
//!
//! - [`io::FileHandle`]: explicit, parallel reads and writes of one file into host memory
//!   ([`read`](io::FileHandle::read), [`pread`](io::FileHandle::pread), ...) or device memory
//!   ([`read_device`](io::FileHandle::read_device), ...). KvikIO's `FileHandle`/`CuFile` surface.
//! - [`mapped::DeviceCache`] and [`mapped::DeviceMappedFile`]: a GPU page cache with mmap
//!   semantics — files as device address ranges, faulted in by [views](mapped::View) and
//!   [gathers](mapped::DeviceCache::gather) under one memory budget shared by many files,
//!   written back by [`flush`](mapped::DeviceMappedFile::flush).
//! - [`pagecache`]: the host page cache as a tool — residency, warm, evict, lock, drop — as
//!   `fincore` and `vmtouch` users expect.
//! - [`Capabilities`]: what the machine offers (CUDA, cuFile, udev, WSL), every "no" with its
//!   reason. Probing never panics, with or without CUDA installed.
//!
//! # Concepts
//!
//! Why each size and path below was chosen over the others is recorded, with the measurements,
//! in `docs/decisions/`; what the library reaches beside its peers is in `docs/benchmarks.md`.
//!
//! **Buffered vs direct I/O.** A buffered `pread` copies from the kernel's page cache, and one
//! core copies far less per second than a PCIe link carries, so a warm file needs several
//! threads to fill the link. A cold file is limited by the disk; `O_DIRECT` skips the page
//! cache, which saves a copy and avoids evicting other data, but needs page-aligned offsets,
//! lengths and buffers. gpumap splits every transfer into an unaligned head and tail (buffered)
//! and an aligned middle (direct where enabled and the file system allows it). Reads are
//! buffered by default, so a file read twice comes from memory the second time; the `uncached`
//! policy ([`config::DirectRead`]) asks the kernel what a transfer has in the cache
//! (`cachestat`) and goes around the cache only where nothing is there — for data loaded once
//! (docs/decisions/0011-reads-buffered-by-default.md).
//!
//! **Tasks and threads.** A transfer is split into tasks ([`align::split_tasks`]); all but the
//! first start page-aligned. Tasks run on a persistent [`io::IoPool`] — threads are created once,
//! never per call — and a `p*` call returns an [`io::IoFuture`].
//!
//! **The way to the GPU.** Device memory cannot be the target of `pread`. Without GPUDirect
//! Storage, bytes go file → pinned *bounce buffer* → device. Pinning memory costs far more than
//! moving the same bytes over PCIe, so bounce buffers are allocated once per process and
//! recycled ([`memory::bounce::BouncePool`]). Each worker pipelines: while chunk *k* is copied
//! to the GPU on its own stream, chunk *k + 1* is read from the file, in 4 MiB chunks and tasks
//! of 16 of them (docs/decisions/0005-bounce-buffers-4mib.md). Small copies are expensive —
//! each host-to-device copy has a fixed cost, and the driver serialises copies issued from many
//! threads — so small reads are batched: pieces in flight together
//! ([`io::FileHandle::pread_device`] futures, or one [`io::FileHandle::read_device_batch`])
//! are packed into one pinned buffer, uploaded in one copy and placed by one kernel launch per
//! group (one copy per run where the destinations are adjacent)
//! (docs/decisions/0007-small-reads-packed.md).
//!
//! **cuFile (GPUDirect Storage).** Where nvidia-fs is loaded, cuFile DMAs between the disk and
//! GPU memory with no bounce (`Auto` checks for nvidia-fs only; NVMe P2P DMA without it is
//! not recognised). Where cuFile's library opens but no DMA path exists, it falls back to its
//! own unpipelined POSIX path, far slower than gpumap's pipelined one
//! (docs/decisions/0006-compat-auto-needs-nvidia-fs.md). The [`config::CompatMode`] decides —
//! `On`: POSIX; `Off`: cuFile or an error; `Auto`: cuFile where it is real GDS, POSIX
//! otherwise — and every decision carries its reason ([`io::CompatDecision`]).
//!
//! **Durability.** A write returns when the kernel has the data (page cache, or the device for
//! `O_DIRECT`). [`io::FileHandle::sync_data`] (`fdatasync`) returns when it would survive a
//! crash. Linux reports a write-back error once: an error from a sync is final, and a retry that
//! succeeds does not mean the data are safe.
//!
//! **Extents, frames and slots.** A [`mapped::DeviceCache`] holds memory in *frames* — a
//! multiple of the GPUs' 2 MiB allocation granularity, by default a thirty-second of the budget
//! from 8 to 64 MiB, since the driver calls that map, give access to and unmap a frame cost the
//! same whatever its size and the driver serialises them (docs/decisions/0001-frames-by-budget.md)
//! — and tracks validity and I/O per *extent* (a power of two from 4 KiB, 64 KiB by default). A
//! frame is either mapped at its place in one file's reserved address range, so that a view of
//! any range is contiguous (`base + offset`), or cut into *slots* of one extent each, holding
//! extents of any file wherever they fall: with 4 KiB extents, random 4 KiB reads of a file a
//! thousand times larger than the budget then cost 4 KiB of memory each, not a frame. Memory is
//! evicted least recently used first across files, never while pinned by a view, and after its
//! dirty extents were written back. Missing extents of a gather are read into pinned buffers
//! and placed by one kernel launch per group (docs/decisions/0008-gather-groups-4mib.md). A walk
//! through a file reads 512 MiB ahead in 16 MiB pieces, each read whole by one pool thread, so
//! that many independent reads are in flight (docs/decisions/0002-read-ahead-in-pieces.md).
//!
//! **Residency.** The page cache holds file pages in 4 KiB units; [`pagecache::residency`]
//! reports how many of a range are cached (and, via `cachestat(2)` on Linux ≥ 6.5, how many are
//! dirty or under write-back). Cold benchmarks evict first; warm ones read once first.
//!
//! # Configuration
//!
//! Defaults come from `GPUMAP_*` environment variables, with KvikIO's `KVIKIO_*` names accepted
//! as aliases; see [`config`], whose [`config::SETTINGS`] is the one table of them. Where a
//! setting is not given, [`tuning`] chooses some per file system, each choice with its reason.
//!
//! # Safety
//!
//! All `unsafe` code lives in the private `sys` module (CUDA driver, cuFile, page-cache system
//! calls), each block with a `// SAFETY:` comment; every other module is
//! `#![forbid(unsafe_code)]` — but for the three public `unsafe` constructors that take another
//! CUDA stack's memory or stream on the caller's promise (`CudaView::from_raw`,
//! `CudaViewMut::from_raw`, `StreamRef::from_raw`), which live with their types (`deny`, allowed
//! on them alone; the stream's holds one `unsafe` block, a call into `sys`). Views of memory borrow what they point to, as cudarc's
//! `CudaView<'a>` does: a [`memory::DeviceView`] or [`memory::cuda::CudaViewMut`] cannot
//! outlive its buffer, and calls that return before a transfer is done take owned memory
//! ([`memory::OwnedDeviceMemory`]) or borrow it in their guard. Raw device addresses from other
//! stacks enter only through the `unsafe` [`memory::cuda::CudaView::from_raw`], whose contract
//! is documented; the driver still checks what it can.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod align;
pub mod capabilities;
pub mod config;
pub mod error;
#[cfg_attr(not(feature = "fault-injection"), doc(hidden))]
pub mod fault;
pub mod io;
pub mod mapped;
pub mod memory;
pub mod pagecache;
pub mod per_process;
pub mod profiling;
#[cfg(feature = "remote")]
pub mod remote;
pub mod sync;
mod sys;
pub mod tuning;
pub mod tuning_facts;

pub use capabilities::Capabilities;
pub use config::Config;
pub use error::{Error, Result};

/// The README's Rust snippets, compiled and run as doctests (on host memory without a GPU).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
