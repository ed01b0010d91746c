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
//! # Concepts, with numbers
//!
//! **Buffered vs direct I/O.** A buffered `pread` copies from the kernel's page cache: about
//! 11 GB/s per core on the test machines, so a warm file needs several threads to fill a PCIe
//! Gen5 link (55 GB/s for pinned host-to-device copies). A cold file is limited by the disk
//! (about 2 GB/s on the test machine's virtual disk); `O_DIRECT` skips the page cache, which
//! saves a copy and avoids evicting other data, but needs page-aligned offsets, lengths and
//! buffers. gpumap splits every transfer into an unaligned head and tail (buffered) and an
//! aligned middle (direct where enabled and the file system allows it). Reads are buffered by
//! default, so a file read twice comes from memory the second time; the `uncached` policy
//! ([`config::DirectRead`]) asks the kernel what a transfer has in the cache (`cachestat`) and
//! goes around the cache only where nothing is there — for data loaded once.
//!
//! **Tasks and threads.** A transfer is split into tasks ([`align::split_tasks`]); all but the
//! first start page-aligned. Tasks run on a persistent [`io::IoPool`] — threads are created once,
//! never per call — and a `p*` call returns an [`io::IoFuture`].
//!
//! **The way to the GPU.** Device memory cannot be the target of `pread`. Without GPUDirect
//! Storage, bytes go file → pinned *bounce buffer* → device. Pinning is slow (about 5 ms for
//! 16 MiB), so bounce buffers are allocated once per process and recycled
//! ([`memory::bounce::BouncePool`]). Each worker pipelines: while chunk *k* is copied to the GPU
//! on its own stream, chunk *k + 1* is read from the file. With 4 MiB chunks in 64 MiB tasks
//! this reaches 49–51 GB/s from a warm page cache into an H100 or H200 at 16 threads, 89–93 %
//! of the pinned copy rate and 97 % of what the page cache itself delivers to 16 threads (see
//! `docs/benchmarks.md`). Small copies are expensive — a 4 KiB
//! host-to-device copy costs about 8 µs, and 16 threads issuing one each are serialised in the
//! driver at about 12 µs a copy — so small reads are batched: pieces in flight together
//! ([`io::FileHandle::pread_device`] futures, or one [`io::FileHandle::read_device_batch`])
//! are packed into one pinned buffer, uploaded in one copy and placed by one kernel launch per
//! group (one copy per run where the destinations are adjacent). That takes random 4 KiB reads
//! from a warm cache from 78 thousand a second to 1.1–3.3 million through futures and about
//! 3 million through one batch call (H100 and H200, `docs/benchmarks.md`).
//!
//! **cuFile (GPUDirect Storage).** Where nvidia-fs is loaded, cuFile DMAs between the disk and
//! GPU memory with no bounce (`Auto` checks for nvidia-fs only; NVMe P2P DMA without it is
//! not recognised). Where cuFile's library opens but no DMA path
//! exists, it falls back to its own unpipelined POSIX path (about 2 GB/s warm on the test
//! machine). The [`config::CompatMode`] decides — `On`: POSIX; `Off`: cuFile or an error; `Auto`:
//! cuFile where it is real GDS, POSIX otherwise — and every decision carries its reason
//! ([`io::CompatDecision`]).
//!
//! **Durability.** A write returns when the kernel has the data (page cache, or the device for
//! `O_DIRECT`). [`io::FileHandle::sync_data`] (`fdatasync`) returns when it would survive a
//! crash. Linux reports a write-back error once: an error from a sync is final, and a retry that
//! succeeds does not mean the data are safe.
//!
//! **Extents, frames and slots.** A [`mapped::DeviceCache`] holds memory in *frames* — a
//! multiple of the GPUs' 2 MiB allocation granularity, by default a thirty-second of the budget
//! from 8 to 64 MiB, since mapping, setting access to and unmapping one costs about 45 µs
//! whatever its size and the driver serialises the calls — and tracks validity and I/O per
//! *extent* (a power of two from 4 KiB, 64 KiB by default). A frame is either mapped at its place in one file's
//! reserved address range, so that a view of any range is contiguous (`base + offset`), or cut
//! into *slots* of one extent each, holding extents of any file wherever they fall: with 4 KiB
//! extents, random 4 KiB reads of a file a thousand times larger than the budget then cost
//! 4 KiB of memory each, not a frame. Memory is evicted least recently used first across files, never while pinned by a
//! view, and after its dirty extents were written back. Missing extents of a gather are read
//! into pinned buffers and placed by one kernel launch per group (one `cuMemcpyHtoDAsync` per
//! piece measured 0.38 M pieces/s; a packed copy and a kernel 10.8–12.7 M/s). A walk through
//! a file reads 512 MiB ahead in 16 MiB pieces, each read by one pool thread: 47.8–48.7 GB/s
//! on the H100 in repeated passes under a quarter of a 4 GiB file's size, 94.5–96.7 % of a
//! plain whole-file read in the same runs.
//!
//! **Residency.** The page cache holds file pages in 4 KiB units; [`pagecache::residency`]
//! reports how many of a range are cached (and, via `cachestat(2)` on Linux ≥ 6.5, how many are
//! dirty or under write-back). Cold benchmarks evict first; warm ones read once first.
//!
//! # Configuration
//!
//! Defaults come from `GPUMAP_*` environment variables, with KvikIO's `KVIKIO_*` names accepted
//! as aliases; see [`config`].
//!
//! # Safety
//!
//! All `unsafe` code lives in the private `sys` module (CUDA driver, cuFile, page-cache system
//! calls), each block with a `// SAFETY:` comment; every other module is
//! `#![forbid(unsafe_code)]`. Views of memory borrow what they point to, as cudarc's
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
pub mod profiling;
mod sys;

pub use capabilities::Capabilities;
pub use config::Config;
pub use error::{Error, Result};

/// The README's Rust snippets, compiled and run as doctests (on host memory without a GPU).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
