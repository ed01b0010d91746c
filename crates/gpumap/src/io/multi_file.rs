//! Reads from many files in one call ([`read_files`], [`pread_files`]): every file's reads are
//! cut into tasks that run together on one pool, so that a load of many files (the shards of a
//! checkpoint) keeps every thread busy from the first byte to the last, where one call per file
//! pays each file's pipeline start and drain in turn.
//!
//! Large reads into GPU memory go through the pipelined bounce path (or cuFile) in tasks sized
//! for the whole load; reads no larger than [`SMALL_READ`] are packed in batches per file (see
//! `batch`); reads into host memory are read straight to their place. A strided piece of more
//! than [`SMALL_READ`] bytes in small runs (a tensor's column slice) is cut into groups of whole
//! runs, a batch each, on the pool's threads: made a read per run before the pipeline starts,
//! its runs (one per row of the tensor) would be set up one by one while the threads wait
//! (decision 0026).
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::align::{checked_end, split_tasks, Task};
use crate::error::{Error, Result};
use crate::io::batch;
use crate::io::device_io;
use crate::io::direct::{self, ReadPlan};
use crate::io::file_handle::FileHandle;
use crate::io::handle_state::HandleState;
use crate::io::host_io;
use crate::io::pool::{delivered_prefix, prefix_of, IoFuture};
use crate::memory::cuda::RawRegion;
use crate::memory::{DeviceViewMut, OwnedDeviceMemory};

/// Reads into GPU memory up to this size are packed in batches (one pinned buffer and one
/// copy kernel launch per group); larger ones are pipelined on their own.
pub const SMALL_READ: usize = 1 << 20;

/// One read of [`read_files`]: `dst.len()` bytes of `file` at `offset` into `dst`.
#[derive(Debug)]
pub struct FileRead<'a> {
    /// The file, open for reading.
    pub file: &'a FileHandle,
    /// Where the bytes come from in the file.
    pub offset: u64,
    /// Where they go; its length is the read's length.
    pub dst: DeviceViewMut<'a>,
}

/// One piece of [`pread_files`]: `count` runs of `len` bytes of `files[file]`, the `k`-th at
/// `offset + k * stride` in the file, landing back to back in the buffer from `dst_offset`
/// (`count` 1 for one plain range). A strided piece is what a slice of a tensor along an inner
/// dimension reads: one run per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilePiece {
    /// Index of the file in the list of files.
    pub file: usize,
    /// Where the first run comes from in the file.
    pub offset: u64,
    /// Where the first run goes in the buffer; the others follow it.
    pub dst_offset: usize,
    /// Bytes in each run.
    pub len: usize,
    /// Runs (at least 1 for any bytes to be read).
    pub count: usize,
    /// From one run's start to the next's, in the file.
    pub stride: u64,
}

impl FilePiece {
    /// One plain range: `len` bytes at `offset` to `dst_offset`.
    pub fn range(file: usize, offset: u64, dst_offset: usize, len: usize) -> FilePiece {
        FilePiece { file, offset, dst_offset, len, count: 1, stride: 0 }
    }

    /// Bytes the piece fills in the buffer.
    fn total(&self) -> Result<usize> {
        self.len.checked_mul(self.count).ok_or_else(|| self.invalid("its size overflows"))
    }

    /// The file offset of run `k`.
    fn run_offset(&self, k: usize) -> Result<u64> {
        (k as u64)
            .checked_mul(self.stride)
            .and_then(|d| d.checked_add(self.offset))
            .ok_or_else(|| self.invalid("its runs pass the largest file offset"))
    }

    fn invalid(&self, why: &str) -> Error {
        Error::InvalidArgument(format!("pread_files: piece {self:?}: {why}"))
    }
}

/// What one pool item does.
enum Work<'r> {
    /// One task of a large read into GPU memory: `len` bytes at `file_offset` into `dst` at
    /// `at`, through cuFile where the file takes that path.
    Cuda {
        state: &'r HandleState,
        dst: RawRegion,
        at: usize,
        len: usize,
        file_offset: u64,
        plan: ReadPlan,
    },
    /// One task of a read into host memory.
    Host { state: &'r HandleState, buf: &'r mut [u8], file_offset: u64, plan: ReadPlan },
    /// The small reads of one file into GPU memory, as one batch; counts land in `counts`.
    Batch { state: &'r HandleState, reads: Vec<(RawRegion, u64)>, counts: &'r mut Vec<usize> },
    /// Whole runs of a strided read into GPU memory, read as one batch: packed in one pinned
    /// buffer, and up in one copy (they land back to back). `dst.len` is a multiple of `run`.
    CudaRuns { state: &'r HandleState, dst: RawRegion, file_offset: u64, run: usize, stride: u64 },
    /// Whole runs of a strided read into host memory, each read to its place in turn.
    HostRuns {
        state: &'r HandleState,
        buf: &'r mut [u8],
        file_offset: u64,
        run: usize,
        stride: u64,
    },
}

/// A strided read kept whole on its way into the pipeline: `dst.len() / run` runs of `run`
/// bytes of `file`, the `k`-th at `offset + k * stride`, landing back to back in `dst`. The
/// pipeline cuts it into groups of whole runs, so that what is done once per run (making its
/// destination, finding its place) is done on the pool's threads in parallel, not by the
/// caller for every run before the first read starts.
struct RunsRead<'a> {
    file: &'a FileHandle,
    offset: u64,
    run: usize,
    stride: u64,
    dst: DeviceViewMut<'a>,
}

/// Reads every one of `reads` — each from its own file, all into one device or all into host
/// memory — in one pipeline on the first file's pool; each read's count, in order (short only
/// where its file ends first: the bytes it delivered from its start).
///
/// Destinations may not overlap (they are mutable views, so they cannot). The first error in
/// task order wins; reads already done keep their bytes.
pub fn read_files<'a>(reads: &mut [FileRead<'a>]) -> Result<Vec<usize>> {
    read_pipeline(reads, Vec::new()).map(|(counts, _)| counts)
}

/// [`read_files`] of `reads` and of the strided reads `runs`, all in one pipeline; the counts
/// of each, in order (a strided read's: its runs' bytes up to and including the first that
/// came up short).
fn read_pipeline<'a>(
    reads: &mut [FileRead<'a>],
    runs: Vec<RunsRead<'a>>,
) -> Result<(Vec<usize>, Vec<usize>)> {
    let _range = crate::profiling::Range::new(c"gpumap::read_files");
    let (file, device) = match (reads.first(), runs.first()) {
        (Some(r), _) => (r.file, r.dst.device_ordinal()),
        (None, Some(r)) => (r.file, r.dst.device_ordinal()),
        (None, None) => return Ok((Vec::new(), Vec::new())),
    };
    let pool = Arc::clone(&file.state().pool);
    let same_device = |ordinal: Option<usize>| {
        if ordinal == device {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "read_files reads into one device; it mixes {} and {}",
            describe(device),
            describe(ordinal)
        )))
    };
    for r in reads.iter() {
        r.file.state().check_read()?;
        checked_end(r.offset, r.dst.len() as u64)?;
        same_device(r.dst.device_ordinal())?;
    }
    for r in &runs {
        r.file.state().check_read()?;
        same_device(r.dst.device_ordinal())?;
    }
    let batches = small_reads_by_file(reads);
    let mut batch_counts: Vec<Vec<usize>> = vec![Vec::new(); batches.len()];
    // Batches go first: each is one item that fans out on the pool itself.
    let mut items: Vec<Work<'_>> = batches
        .iter()
        .zip(batch_counts.iter_mut())
        .map(|((state, list), counts)| Work::Batch {
            state,
            reads: list.iter().map(|&(_, dst, offset)| (dst, offset)).collect(),
            counts,
        })
        .collect();
    let large: u64 =
        reads.iter().map(|r| r.dst.len() as u64).filter(|&n| n > SMALL_READ as u64).sum();
    // Task lists of each read (empty for batched and empty reads), to count what it delivered.
    let mut tasks_of: Vec<Vec<Task>> = vec![Vec::new(); reads.len()];
    for (r, tasks_out) in reads.iter_mut().zip(tasks_of.iter_mut()) {
        let file: &'a FileHandle = r.file;
        let state = file.state();
        let len = r.dst.len();
        if len == 0 {
            continue;
        }
        let plan = direct::read_plan(state, r.offset, len as u64);
        match &mut r.dst {
            DeviceViewMut::Cuda(_) if len <= SMALL_READ => continue,
            DeviceViewMut::Cuda(view) => {
                let dst = view.raw;
                let span = match state.cufile_for(len) {
                    Some(_) => state.settings.task_size,
                    None => device_io::span_size(state, large as usize),
                };
                let tasks = split_tasks(r.offset, len as u64, span);
                items.extend(tasks.iter().map(|t| Work::Cuda {
                    state,
                    dst,
                    at: t.buf_offset as usize,
                    len: t.len as usize,
                    file_offset: t.offset,
                    plan,
                }));
                *tasks_out = tasks;
            }
            DeviceViewMut::Host(bytes) => {
                let tasks = split_tasks(r.offset, len as u64, state.settings.task_size);
                let mut rest: &mut [u8] = bytes;
                for t in &tasks {
                    let (piece, tail) = std::mem::take(&mut rest).split_at_mut(t.len as usize);
                    rest = tail;
                    items.push(Work::Host { state, buf: piece, file_offset: t.offset, plan });
                }
                *tasks_out = tasks;
            }
        }
    }
    // Strided reads in groups of whole runs: a bounce buffer's worth into GPU memory (one
    // batch group), a task's worth into host memory.
    let mut groups_of: Vec<Vec<Task>> = Vec::with_capacity(runs.len());
    for r in runs {
        let state = r.file.state();
        let group_bytes = match r.dst {
            DeviceViewMut::Cuda(_) => state.settings.bounce_buffer_size,
            DeviceViewMut::Host(_) => state.settings.task_size,
        };
        let group_len = (group_bytes as usize / r.run).max(1) * r.run;
        let total = r.dst.len();
        let mut tasks = Vec::with_capacity(total.div_ceil(group_len));
        for (g, group) in r.dst.chunks_mut(group_len)?.into_iter().enumerate() {
            let first_run = (g * group_len / r.run) as u64;
            let file_offset = first_run
                .checked_mul(r.stride)
                .and_then(|d| d.checked_add(r.offset))
                .ok_or(Error::Overflow { offset: r.offset, len: total as u64 })?;
            let len = group.len();
            tasks.push(Task {
                offset: file_offset,
                len: len as u64,
                buf_offset: (g * group_len) as u64,
            });
            items.push(match group {
                DeviceViewMut::Cuda(view) => Work::CudaRuns {
                    state,
                    dst: view.raw,
                    file_offset,
                    run: r.run,
                    stride: r.stride,
                },
                DeviceViewMut::Host(buf) => {
                    Work::HostRuns { state, buf, file_offset, run: r.run, stride: r.stride }
                }
            });
        }
        groups_of.push(tasks);
    }
    let results = pool.run_each(items, run)?;
    let mut counts = vec![0usize; reads.len()];
    for ((_, list), got) in batches.iter().zip(&batch_counts) {
        for (&(i, _, _), &n) in list.iter().zip(got) {
            counts[i] = n;
        }
    }
    let mut at = batches.len();
    for (count, tasks) in counts.iter_mut().zip(&tasks_of) {
        if !tasks.is_empty() {
            *count = delivered_prefix(tasks, &results[at..at + tasks.len()]);
            at += tasks.len();
        }
    }
    let mut runs_counts = Vec::with_capacity(groups_of.len());
    for tasks in &groups_of {
        runs_counts.push(delivered_prefix(tasks, &results[at..at + tasks.len()]));
        at += tasks.len();
    }
    Ok((counts, runs_counts))
}

/// A read of [`read_files`] small enough for a batch: its index, destination and file offset.
type SmallRead = (usize, RawRegion, u64);

/// The small reads into GPU memory, grouped by file (in the order files first appear), each
/// group ordered by destination so that adjacent ones go up in one copy.
fn small_reads_by_file<'a>(reads: &[FileRead<'a>]) -> Vec<(&'a HandleState, Vec<SmallRead>)> {
    let mut by_file: Vec<(&'a HandleState, Vec<SmallRead>)> = Vec::new();
    for (i, r) in reads.iter().enumerate() {
        let DeviceViewMut::Cuda(view) = &r.dst else { continue };
        if r.dst.is_empty() || r.dst.len() > SMALL_READ {
            continue;
        }
        let state: &'a HandleState = r.file.state();
        let entry = (i, view.raw, r.offset);
        match by_file.iter_mut().find(|(s, _)| std::ptr::eq(*s, state)) {
            Some((_, list)) => list.push(entry),
            None => by_file.push((state, vec![entry])),
        }
    }
    for (_, list) in by_file.iter_mut() {
        list.sort_by_key(|(_, dst, _)| dst.ptr);
    }
    by_file
}

/// One pool item.
fn run(work: Work<'_>) -> Result<usize> {
    match work {
        Work::Cuda { state, dst, at, len, file_offset, plan } => match state.cufile_for(dst.len) {
            Some(gds) => gds.read_raw(dst, at, len, file_offset),
            None => device_io::read_span(state, dst, at, len, file_offset, plan),
        },
        Work::Host { state, buf, file_offset, plan } => {
            host_io::read_piece(state, buf, file_offset, plan)
        }
        Work::Batch { state, reads, counts } => {
            *counts = batch::read_cuda_batch(state, &reads)?;
            Ok(counts.iter().sum())
        }
        Work::CudaRuns { state, dst, file_offset, run, stride } => {
            // In range: the pipeline checked the offset of the group's first run, and the
            // caller that of the read's last.
            let reads: Vec<(RawRegion, u64)> = (0..dst.len / run)
                .map(|k| {
                    let at = RawRegion { ptr: dst.ptr + (k * run) as u64, len: run, ..dst };
                    (at, file_offset + k as u64 * stride)
                })
                .collect();
            let counts = batch::read_cuda_batch(state, &reads)?;
            Ok(prefix_of(counts.iter().map(|&got| (run as u64, got))))
        }
        Work::HostRuns { state, buf, file_offset, run, stride } => {
            let mut counts = Vec::with_capacity(buf.len() / run);
            for (k, piece) in buf.chunks_mut(run).enumerate() {
                let offset = file_offset + k as u64 * stride;
                let plan = direct::read_plan(state, offset, run as u64);
                let got = host_io::read_piece(state, piece, offset, plan)?;
                counts.push(got);
                if got < run {
                    break;
                }
            }
            Ok(prefix_of(counts.iter().map(|&got| (run as u64, got))))
        }
    }
}

/// Starts [`read_files`] into the owned `dst` on the pool of `files[0]`: each piece's runs of
/// `files[piece.file]` go to `dst` from its `dst_offset` (pieces may not overlap in `dst`).
/// The future gives back `dst` and each piece's count (all its bytes, unless its file ended
/// first).
pub fn pread_files<B: OwnedDeviceMemory>(
    files: Vec<FileHandle>,
    dst: B,
    pieces: Vec<FilePiece>,
) -> IoFuture<(B, Vec<usize>)> {
    let (future, completer) = IoFuture::pending();
    let Some(first) = files.first() else {
        let outcome = if pieces.is_empty() {
            Ok((dst, Vec::new()))
        } else {
            Err(Error::InvalidArgument("pread_files: pieces but no files".into()))
        };
        completer.complete(outcome);
        return future;
    };
    let pool = Arc::clone(&first.state().pool);
    pool.spawn(move || {
        let mut dst = dst;
        if let Some(p) = pieces.iter().find(|p| p.file >= files.len()) {
            return Err(Error::InvalidArgument(format!(
                "pread_files: a piece names file {} of {}",
                p.file,
                files.len()
            )));
        }
        let ranges =
            pieces.iter().map(|p| Ok((p.dst_offset, p.total()?))).collect::<Result<Vec<_>>>()?;
        let views = dst.device_view_mut().carve(&ranges)?;
        // A strided piece of many small runs goes whole to the pipeline, which reads it in
        // groups of runs; any other as one read per run, noted as (piece, runs).
        let mut reads: Vec<FileRead<'_>> = Vec::with_capacity(pieces.len());
        let mut expanded: Vec<(usize, usize)> = Vec::with_capacity(pieces.len());
        let mut strided: Vec<RunsRead<'_>> = Vec::new();
        let mut strided_owner: Vec<usize> = Vec::new();
        for (i, (view, p)) in views.into_iter().zip(&pieces).enumerate() {
            if p.len == 0 || p.count == 0 {
                continue;
            }
            if p.count > 1 && p.len <= SMALL_READ && view.len() > SMALL_READ {
                let last = p.run_offset(p.count - 1)?;
                checked_end(last, p.len as u64)?;
                let file = &files[p.file];
                strided.push(RunsRead {
                    file,
                    offset: p.offset,
                    run: p.len,
                    stride: p.stride,
                    dst: view,
                });
                strided_owner.push(i);
                continue;
            }
            let runs = if p.count == 1 { vec![view] } else { view.chunks_mut(p.len)? };
            expanded.push((i, runs.len()));
            for (k, run) in runs.into_iter().enumerate() {
                reads.push(FileRead { file: &files[p.file], offset: p.run_offset(k)?, dst: run });
            }
        }
        let (counts, strided_counts) = read_pipeline(&mut reads, strided)?;
        drop(reads);
        // A piece's count: the bytes of its runs up to and including the first that came up
        // short (the file ended there).
        let mut totals = vec![0usize; pieces.len()];
        let mut at = 0;
        for &(i, runs) in &expanded {
            let asked = pieces[i].len as u64;
            totals[i] = prefix_of(counts[at..at + runs].iter().map(|&n| (asked, n)));
            at += runs;
        }
        for (&i, n) in strided_owner.iter().zip(strided_counts) {
            totals[i] = n;
        }
        Ok((dst, totals))
    })
}

fn describe(ordinal: Option<usize>) -> String {
    match ordinal {
        Some(o) => format!("GPU {o}"),
        None => "host memory".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{Device, DeviceBuffer};

    // How pieces land, on every backend: tests/conformance.rs (many_files_read_in_one_pipeline).

    struct Files {
        dir: std::path::PathBuf,
        handles: Vec<FileHandle>,
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn files(tag: &str, sizes: &[usize]) -> Files {
        let dir = std::env::temp_dir().join(format!("gpumap-multi-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut handles = Vec::new();
        for (k, &n) in sizes.iter().enumerate() {
            let bytes: Vec<u8> = (0..n).map(|i| ((i * 31 + k * 7) % 251) as u8).collect();
            let path = dir.join(format!("f{k}"));
            std::fs::write(&path, &bytes).unwrap();
            handles.push(FileHandle::open(&path, "r").unwrap());
        }
        Files { dir, handles }
    }

    /// One strided piece: `(offset, run length, runs, stride)`.
    type Strided = (u64, usize, usize, u64);

    /// What `pread_files` must give for `pieces` laid back to back from `dst` offset 0 over a
    /// file of `data`: each piece's count (its runs up to and including the first short one)
    /// and those bytes.
    fn model(data: &[u8], pieces: &[Strided]) -> Vec<(usize, Vec<u8>)> {
        pieces
            .iter()
            .map(|&(offset, len, count, stride)| {
                let mut bytes = Vec::new();
                for k in 0..count {
                    let at = (offset + k as u64 * stride) as usize;
                    let got = data.len().saturating_sub(at).min(len);
                    bytes.extend_from_slice(&data[at.min(data.len())..at.min(data.len()) + got]);
                    if got < len {
                        break;
                    }
                }
                (bytes.len(), bytes)
            })
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Strided pieces into host memory, small ones a read per run and large ones in groups
        /// of runs (task sizes from a page up, so groups end anywhere), some past the file's
        /// end, against the reference model: counts, bytes delivered, and nothing written
        /// outside the pieces.
        #[test]
        fn strided_pieces_match_the_model(
            file_len in 1usize..(3 << 20),
            task in 4096u64..(512 << 10),
            pieces in proptest::collection::vec(
                (0u64..(3 << 20), 1usize..70_000, 1usize..48, 0u64..120_000), 1..5),
        ) {
            let dir = std::env::temp_dir().join(format!("gpumap-multi-model-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("f");
            let data: Vec<u8> = (0..file_len).map(|i| (i * 131 % 251) as u8).collect();
            std::fs::write(&path, &data).unwrap();
            let mut o = FileHandle::options().unwrap();
            o.task_size(task);
            let file = o.open(&path, "r").unwrap();
            let total: usize = pieces.iter().map(|&(_, len, count, _)| len * count).sum();
            let mut buf = DeviceBuffer::alloc(&Device::Host, total + 64).unwrap();
            buf.fill(0xEE).unwrap();
            let mut at = 0;
            let file_pieces: Vec<FilePiece> = pieces
                .iter()
                .map(|&(offset, len, count, stride)| {
                    let p = FilePiece { file: 0, offset, dst_offset: at, len, count, stride };
                    at += len * count;
                    p
                })
                .collect();
            let (buf, counts) = pread_files(vec![file], buf, file_pieces).wait().unwrap();
            let host = buf.to_vec().unwrap();
            let mut at = 0;
            for ((&(_, len, count, _), (n, bytes)), got) in pieces.iter().zip(model(&data, &pieces)).zip(counts) {
                proptest::prop_assert_eq!(got, n);
                proptest::prop_assert!(host[at..at + n] == bytes[..]);
                at += len * count;
            }
            proptest::prop_assert!(host[total..].iter().all(|&b| b == 0xEE));
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn refuses_bad_pieces() {
        let f = files("bad", &[1000]);
        let buf = DeviceBuffer::alloc(&Device::Host, 100).unwrap();
        let past = vec![FilePiece::range(0, 0, 50, 51)];
        assert!(pread_files(f.handles.clone(), buf, past).wait().is_err());
        let buf = DeviceBuffer::alloc(&Device::Host, 100).unwrap();
        let no_file = vec![FilePiece::range(3, 0, 0, 1)];
        let err = pread_files(f.handles.clone(), buf, no_file).wait().unwrap_err();
        assert!(err.to_string().contains("file 3 of 1"), "{err}");
        let buf = DeviceBuffer::alloc(&Device::Host, 100).unwrap();
        let overlap = vec![FilePiece::range(0, 0, 0, 10), FilePiece::range(0, 0, 5, 10)];
        assert!(pread_files(f.handles.clone(), buf, overlap).wait().is_err());
        let buf = DeviceBuffer::alloc(&Device::Host, 100).unwrap();
        let huge = vec![FilePiece {
            file: 0,
            offset: 0,
            dst_offset: 0,
            len: 1 << 40,
            count: 1 << 40,
            stride: 0,
        }];
        let err = pread_files(f.handles.clone(), buf, huge).wait().unwrap_err();
        assert!(err.to_string().contains("overflows"), "{err}");
        let buf = DeviceBuffer::alloc(&Device::Host, 100).unwrap();
        let far = vec![FilePiece {
            file: 0,
            offset: 0,
            dst_offset: 0,
            len: 1,
            count: 3,
            stride: u64::MAX / 2 + 1,
        }];
        let err = pread_files(f.handles.clone(), buf, far).wait().unwrap_err();
        assert!(err.to_string().contains("largest file offset"), "{err}");
        let buf = DeviceBuffer::alloc(&Device::Host, 1).unwrap();
        let (_, counts) = pread_files(Vec::new(), buf, Vec::new()).wait().unwrap();
        assert!(counts.is_empty());
    }
}
