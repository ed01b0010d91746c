//! `gpumap read` and `gpumap write`, and the options every transfer shares.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use indicatif::ProgressBar;
use serde::Serialize;

use gpumap::config::{check_nthreads, parse_size, CompatMode, Config, DirectRead, MAX_THREADS};
use gpumap::io::{FileHandle, IoPool};
use gpumap::memory::{Device, DeviceBuffer, HostBuffer};
use gpumap::{Error, Result};

use crate::error::{CliError, CliResult};
use crate::progress::{in_pieces, progress_bar};
use crate::schema::{DirectIo, Memory, TransferPath, SCHEMA};
use crate::units::{human, rate_text, size_arg};
use crate::{output, pattern};

/// A size above zero (`--task-size`: a task moves at least one byte).
fn nonzero_size_arg(text: &str) -> std::result::Result<u64, String> {
    match parse_size(text)? {
        0 => Err("expected a size above zero".into()),
        n => Ok(n),
    }
}

/// A thread count from 1 to [`MAX_THREADS`]: decimal digits only (no sign, no suffix), as
/// `GPUMAP_NTHREADS` takes it.
pub(crate) fn threads_arg(text: &str) -> std::result::Result<usize, String> {
    let digits = text.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("expected a whole number from 1 to {MAX_THREADS}"));
    }
    let n = digits.parse().unwrap_or(usize::MAX); // too many digits: check_nthreads refuses
    check_nthreads(n).map(|_| n)
}

/// Options every transfer command shares.
#[derive(Args, Debug)]
pub struct TransferOptions {
    /// Worker threads, 1 to 1024 (default: GPUMAP_NTHREADS, or the CPU count up to 16).
    #[arg(long, short = 't', value_parser = threads_arg)]
    threads: Option<usize>,
    /// Largest piece one task moves, e.g. 4MiB (default: GPUMAP_TASK_SIZE or 4 MiB).
    #[arg(long, value_parser = nonzero_size_arg)]
    task_size: Option<u64>,
    /// cuFile or POSIX: on (POSIX), off (cuFile), auto.
    #[arg(long)]
    compat_mode: Option<CompatMode>,
    /// Move the page-aligned middle with O_DIRECT (bypassing the page cache): on, off, or
    /// uncached (reads: only ranges the page cache does not hold, for data read once).
    #[arg(long)]
    direct: Option<DirectRead>,
    #[command(flatten)]
    pub(crate) placement: MemoryArgs,
    /// Print one JSON object instead of text (errors too; see docs/cli-json.md).
    #[arg(long)]
    pub(crate) json: bool,
}

/// Where a command's bytes live: `--device N` or `--host` (`gpumap read`, `write`, `map`).
#[derive(Args, Debug)]
pub struct MemoryArgs {
    /// Use this GPU's memory (default: GPU 0 when there is one, else host memory).
    #[arg(long, conflicts_with = "host")]
    device: Option<usize>,
    /// Use host memory even where there is a GPU.
    #[arg(long)]
    host: bool,
}

impl MemoryArgs {
    /// The memory asked for: `--host`, `--device N`, or GPU 0 where there is one.
    pub(crate) fn device(&self) -> Result<Device> {
        match (self.host, self.device) {
            (true, _) => Ok(Device::Host),
            (false, Some(ordinal)) => Device::cuda(ordinal),
            (false, None) => Ok(Device::auto()),
        }
    }

    /// The memory asked for and its description; where host memory stands in for a GPU
    /// nobody named, says why once (a note on standard error) and records it.
    pub(crate) fn memory(&self) -> Result<(Device, Memory)> {
        let device = self.device()?;
        let fallback = (device.is_host() && !self.host).then(|| {
            let caps = gpumap::Capabilities::probe();
            format!("no GPU: {}", caps.cuda_reason().unwrap_or("none found"))
        });
        if let Some(reason) = &fallback {
            output::note(format!(
                "{reason}: host memory stands in (--host asks for it and skips this note)"
            ));
        }
        let memory = Memory::new(&device, fallback);
        Ok((device, memory))
    }
}

/// The thread count auto-tuning chooses for `path`'s file system (its directory's where the
/// file does not exist yet): the default on local disks, more on network file systems. The
/// environment's count where it gave one; the default where the facts cannot be had.
fn tuned_threads(config: &Config, path: &Path) -> usize {
    if config.is_explicit("nthreads") {
        return config.nthreads;
    }
    let at = if path.exists() {
        path
    } else {
        path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
    };
    let Ok(facts) = gpumap::tuning_facts::gather(Some(at), None) else { return config.nthreads };
    let chosen = gpumap::tuning::tune(&facts).into_iter().find(|c| c.setting == "nthreads");
    match chosen {
        Some(c) if c.tuned => {
            tracing::info!("{} threads for {}: {}", c.value, path.display(), c.reason);
            match c.value {
                gpumap::config::SettingValue::Count(n) => {
                    usize::try_from(n).unwrap_or(config.nthreads)
                }
                _ => config.nthreads,
            }
        }
        _ => config.nthreads,
    }
}

/// Keeps `pool` until the process ends. Its threads would otherwise end as the command returns,
/// tearing down their CUDA streams and events while the process exits and the driver shuts
/// down beside them ("cuEventDestroy failed" at the end of `gpumap write` on the H100).
fn keep_until_exit(pool: &Arc<IoPool>) {
    static POOLS: std::sync::Mutex<Vec<Arc<IoPool>>> = std::sync::Mutex::new(Vec::new());
    if let Ok(mut pools) = POOLS.lock() {
        pools.push(Arc::clone(pool));
    }
}

impl TransferOptions {
    /// The first of these options given that only a local file takes, for refusing it with a
    /// URL.
    fn local_only_flag(&self) -> Option<&'static str> {
        [
            (self.direct.is_some(), "--direct"),
            (self.compat_mode.is_some(), "--compat-mode"),
            (self.task_size.is_some(), "--task-size"),
            (self.threads.is_some(), "--threads"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// The handle options these flags give on top of the environment's.
    /// The pool is sized for `path`'s file system where neither `--threads` nor the
    /// environment gave a count (see `tuned_threads`).
    fn handle_options(&self, path: &Path) -> Result<(gpumap::io::HandleOptions, Arc<IoPool>)> {
        let config = Config::global()?;
        let threads = self.threads.unwrap_or_else(|| tuned_threads(config, path));
        if let (Some(n), Ok(Some(warning))) = (self.threads, check_nthreads(threads)) {
            tracing::warn!("--threads {n}: {warning}");
        }
        let pool = Arc::new(IoPool::new(threads)?);
        keep_until_exit(&pool);
        let mut options = FileHandle::options()?;
        options.pool(pool.clone());
        if let Some(t) = self.task_size {
            options.task_size(t);
        }
        if let Some(m) = self.compat_mode {
            options.compat_mode(m);
        }
        match self.direct {
            Some(DirectRead::On) => options.direct_io(true, true),
            Some(DirectRead::Off) => options.direct_io(false, false),
            Some(DirectRead::Uncached) => options.direct_read(DirectRead::Uncached),
            None => &mut options,
        };
        Ok((options, pool))
    }

    fn open(&self, path: &Path, flags: &str) -> Result<(FileHandle, Arc<IoPool>)> {
        let (options, pool) = self.handle_options(path)?;
        Ok((options.open(path, flags)?, pool))
    }

    /// Whether writes were asked to use `O_DIRECT`.
    fn direct_writes(&self) -> Result<bool> {
        Ok(match self.direct {
            Some(DirectRead::On) => true,
            Some(DirectRead::Off) => false,
            Some(DirectRead::Uncached) | None => Config::global()?.direct_io_write,
        })
    }
}

/// Arguments of `gpumap read`.
#[derive(Args, Debug)]
pub struct ReadArgs {
    /// The file to read: a path, or an s3://bucket/key, gs://bucket/object,
    /// az://container/blob or http(s):// URL
    /// (credentials from the AWS or Google environment; see docs/remote.md).
    pub(crate) file: PathBuf,
    /// Where to start, in bytes (suffixes such as 4KiB allowed); past the end is an error.
    #[arg(long, default_value = "0", value_parser = size_arg)]
    pub(crate) offset: u64,
    /// How many bytes (default: to the end of the file).
    #[arg(long, value_parser = size_arg)]
    pub(crate) len: Option<u64>,
    #[command(flatten)]
    pub(crate) options: TransferOptions,
    #[command(flatten)]
    pub(crate) remote: crate::remote_args::RemoteArgs,
    /// Check the bytes read against the pattern `gpumap write` generates (exit status 3 when
    /// they differ).
    #[arg(long)]
    pub(crate) verify_pattern: bool,
    /// Check the bytes read against a plain host read of the same range (exit status 3 when
    /// they differ).
    #[arg(long)]
    verify: bool,
    /// Read the range this many times and report the fastest (the first pays for warming
    /// caches and allocating pinned buffers).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) repeat: u32,
    /// Drop the range from the page cache before each read (fdatasync where needed, then
    /// POSIX_FADV_DONTNEED), so every read comes from the disk.
    #[arg(long)]
    cold: bool,
}

impl ReadArgs {
    /// The first option given that only a local file takes, for refusing it with a URL.
    pub(crate) fn local_only_flag(&self) -> Option<&'static str> {
        [(self.cold, "--cold"), (self.verify, "--verify")]
            .into_iter()
            .find_map(|(given, flag)| given.then_some(flag))
            .or_else(|| self.options.local_only_flag())
    }
}

/// Arguments of `gpumap write`.
#[derive(Args, Debug)]
pub struct WriteArgs {
    /// The file to write (created if missing; never truncated: use --truncate), or an
    /// s3://bucket/key, gs://bucket/object or az://container/blob URL: a new object, written
    /// whole as a multipart upload (docs/remote.md).
    pub(crate) file: PathBuf,
    /// How many bytes to write, e.g. 1GiB (generated and written piece by piece: memory does
    /// not grow with the size).
    #[arg(long, value_parser = size_arg)]
    pub(crate) size: u64,
    /// Where to start, in bytes.
    #[arg(long, default_value = "0", value_parser = size_arg)]
    pub(crate) offset: u64,
    /// Cut the file to zero length first.
    #[arg(long)]
    pub(crate) truncate: bool,
    /// fdatasync before reporting, so the rate includes making the data durable.
    #[arg(long)]
    pub(crate) sync: bool,
    #[command(flatten)]
    pub(crate) options: TransferOptions,
    #[command(flatten)]
    pub(crate) remote: crate::remote_args::RemoteWriteArgs,
}

impl WriteArgs {
    /// The first option given that only a local file takes, for refusing it with a URL.
    pub(crate) fn local_only_flag(&self) -> Option<&'static str> {
        [(self.truncate, "--truncate"), (self.sync, "--sync")]
            .into_iter()
            .find_map(|(given, flag)| given.then_some(flag))
            .or_else(|| self.options.local_only_flag())
    }
}

/// What one transfer did, for the text line and `--json` (schema 1).
#[derive(Serialize, Debug)]
struct Report {
    schema: u32,
    /// `"read"` or `"write"`.
    op: &'static str,
    #[serde(serialize_with = "output::lossy_path")]
    pub(crate) file: PathBuf,
    offset: u64,
    bytes: u64,
    /// Seconds of the fastest run (reads) or of the writes and the sync (writes).
    seconds: f64,
    gbps: f64,
    /// Every run's rate, in order (one entry without `--repeat`).
    runs_gbps: Vec<f64>,
    /// Whether each read was made cold first (`--cold`); `false` for writes.
    cold: bool,
    threads: usize,
    task_size: u64,
    memory: Memory,
    transfer_path: TransferPath,
    direct_io: DirectIo,
    /// `true` when `--verify`/`--verify-pattern` checked every byte; `null` when not asked.
    verified: Option<bool>,
    /// Writes: whether the data was made durable (`--sync`); `null` for reads.
    durable: Option<bool>,
}

impl Report {
    fn print(&self, json: bool) -> CliResult {
        if json {
            return output::json(self);
        }
        output::try_line(format!(
            "{}{} {} bytes {} {} at offset {} in {:.3} s: {}{} ({} threads, task size {}, {}, {}, {}){}",
            if self.cold { "cold: " } else { "" },
            if self.op == "read" { "read" } else { "wrote" },
            self.bytes,
            if self.op == "read" { "from" } else { "to" },
            output::shown(&self.file),
            self.offset,
            self.seconds,
            rate_text(self.gbps * 1e9),
            match self.runs_gbps.as_slice() {
                [] | [_] => String::new(),
                runs => format!(
                    ", the fastest of {} (each: {})",
                    runs.len(),
                    runs.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ")
                ),
            },
            self.threads,
            human(self.task_size),
            self.memory.describe(),
            self.transfer_path.describe(),
            self.direct_io.describe(),
            match (self.verified, self.durable) {
                (Some(true), _) => ", verified",
                (_, Some(true)) => ", durable (fdatasync)",
                _ => "",
            }
        ))
    }
}

/// Pieces a transfer is moved in, one after another, when a progress bar shows them (each
/// piece still split into tasks across every thread); without a bar, one piece.
fn progress_piece(handle: &FileHandle, threads: usize, bar: &ProgressBar, total: usize) -> usize {
    if bar.is_hidden() {
        return total.max(1);
    }
    transfer_piece(handle.task_size(), threads)
}

/// `human` for sizes of whole binary units, else bytes in decimal units (`68.7 GB`).
fn human_or_bytes(bytes: u64) -> String {
    let text = human(bytes);
    if text.ends_with(" B") && bytes >= 1_000_000 {
        format!("{:.1} GB", bytes as f64 / 1e9)
    } else {
        text
    }
}

/// Sixteen tasks a thread, at least 256 MiB: large enough that threads do not wait on each
/// other at the end of a piece.
fn transfer_piece(task_size: u64, threads: usize) -> usize {
    let bytes = task_size.saturating_mul(threads as u64).saturating_mul(16).max(256 << 20);
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// The length `gpumap read` reads: `len`, or to the end of the file. An offset past the end
/// is an error either way; an offset at the end reads 0 bytes.
pub(crate) fn read_len(offset: u64, len: Option<u64>, file_len: u64) -> Result<u64> {
    let len = len.unwrap_or(file_len.saturating_sub(offset));
    match offset.checked_add(len) {
        Some(end) if end <= file_len => Ok(len),
        Some(_) => Err(Error::OutOfRange { offset, len, file_len }),
        None => Err(Error::Overflow { offset, len }),
    }
}

/// `gpumap read`.
pub fn read(args: &ReadArgs) -> CliResult {
    let (device, memory) = args.options.placement.memory()?;
    let (handle, pool) = args.options.open(&args.file, "r")?;
    let len = read_len(args.offset, args.len, handle.len()?)?;
    let size = usize::try_from(len)
        .map_err(|_| Error::InvalidArgument(format!("--len {len} does not fit in memory")))?;
    let bar = progress_bar(len, args.options.json, "read");
    let piece = progress_piece(&handle, pool.nthreads(), &bar, size);
    let mut runs = Vec::with_capacity(args.repeat as usize);
    let mut buf = DeviceBuffer::alloc(&device, size).map_err(|error| CliError::Hinted {
        hint: format!(
            "reading {} whole needs {} of {} at once: read part of it with --offset and --len \
             (or in several such pieces)",
            args.file.display(),
            human_or_bytes(len),
            memory.describe()
        ),
        error,
    })?;
    // Decided (and cuFile opened, in auto mode) before the clock starts: opening is not part
    // of the transfer.
    let transfer_path = TransferPath::of(&handle, &device);
    tracing::info!("{}: {}", transfer_path.describe(), transfer_path.reason);
    for _ in 0..args.repeat {
        cool(args, len)?;
        let start = Instant::now();
        in_pieces(size, piece, &bar, |at, n| {
            let dst = buf.view_mut().into_slice(at..at + n)?;
            Ok(handle.read_device_exact(dst, args.offset + at as u64)?)
        })?;
        runs.push(start.elapsed().as_secs_f64());
    }
    bar.finish_and_clear();
    let verified = if args.verify || args.verify_pattern {
        verify(args, &handle, &buf, &memory, piece.min(size))?;
        Some(true)
    } else {
        None
    };
    let seconds = runs.iter().copied().fold(f64::INFINITY, f64::min);
    let rate = |seconds: f64| len as f64 / seconds.max(1e-9) / 1e9;
    Report {
        schema: SCHEMA,
        op: "read",
        file: args.file.clone(),
        offset: args.offset,
        bytes: len,
        seconds,
        gbps: rate(seconds),
        runs_gbps: runs.iter().map(|&s| rate(s)).collect(),
        cold: args.cold,
        threads: pool.nthreads(),
        task_size: handle.task_size(),
        memory,
        transfer_path,
        direct_io: DirectIo::for_reads(&handle),
        verified,
        durable: None,
    }
    .print(args.options.json)
}

/// Checks what was read into `buf` against a plain host read (`--verify`) and the pattern
/// (`--verify-pattern`), `piece` bytes at a time.
fn verify(
    args: &ReadArgs,
    handle: &FileHandle,
    buf: &DeviceBuffer,
    memory: &Memory,
    piece: usize,
) -> CliResult {
    let size = buf.len();
    let mut staged = vec![0u8; piece];
    let mut expected = vec![0u8; piece];
    let mut done = 0usize;
    while done < size {
        let n = piece.min(size - done);
        buf.copy_to_host(done, &mut staged[..n])?;
        let at = args.offset + done as u64;
        if args.verify {
            handle.read_exact(&mut expected[..n], at)?;
            if let Some(p) = staged[..n].iter().zip(&expected[..n]).position(|(a, b)| a != b) {
                return Err(CliError::DataDiffer {
                    offset: at + p as u64,
                    memory: memory.describe(),
                    reference: "a plain read of the file",
                });
            }
        }
        if args.verify_pattern {
            if let Some(offset) = pattern::first_mismatch(&staged[..n], at) {
                return Err(CliError::DataDiffer {
                    offset,
                    memory: memory.describe(),
                    reference: "the pattern gpumap write generates",
                });
            }
        }
        done += n;
    }
    Ok(())
}

/// With `--cold`, drops the range about to be read from the page cache.
fn cool(args: &ReadArgs, len: u64) -> Result<()> {
    if args.cold {
        let range = gpumap::pagecache::ByteRange::new(args.offset, len);
        gpumap::pagecache::evict(args.file.as_path(), range)?;
    }
    Ok(())
}

/// Bytes generated and written at a time by `gpumap write`: four tasks a thread, from 64 to
/// 256 MiB, so that memory stays the same whatever `--size` says.
pub(crate) fn write_piece(task_size: u64, threads: usize, size: u64) -> usize {
    let piece = task_size.saturating_mul(threads as u64).saturating_mul(4);
    let piece = piece.clamp(64 << 20, 256 << 20).min(size).max(1);
    usize::try_from(piece).unwrap_or(usize::MAX)
}

/// `gpumap write`: everything it needs (arguments, memory, buffers, the path being a regular
/// file or nothing) is checked before the file is created or truncated; a file it created is
/// removed again when the write fails.
pub fn write(args: &WriteArgs) -> CliResult {
    if let Some(flag) = args.remote.given_flag() {
        let file = args.file.display();
        return Err(Error::InvalidArgument(format!(
            "{flag} applies to s3://, gs:// and az:// URLs, not to {file}"
        ))
        .into());
    }
    if args.offset.checked_add(args.size).is_none_or(|end| i64::try_from(end).is_err()) {
        return Err(Error::Overflow { offset: args.offset, len: args.size }.into());
    }
    let (device, memory) = args.options.placement.memory()?;
    let (handle_options, pool) = args.options.handle_options(&args.file)?;
    if handle_options.get_compat_mode() == CompatMode::Off && !device.is_host() {
        if let Err(reason) = gpumap::Capabilities::probe().cufile_usable() {
            return Err(Error::Unavailable { what: "cuFile", reason }.into());
        }
    }
    let piece = write_piece(handle_options.get_task_size(), pool.nthreads(), args.size);
    let mut staged = DeviceBuffer::alloc(&device, piece)?;
    let mut pattern_buf = if device.is_host() { None } else { Some(HostBuffer::new(piece)?) };
    let direct_writes = args.options.direct_writes()?;

    gpumap::io::check_regular_file(&args.file)?;
    let existing = std::fs::symlink_metadata(&args.file).ok();
    check_space(args, existing.as_ref())?;
    // A file this command creates (O_EXCL, so never one another process made since the look
    // above) is removed unless the write completes: on an error, and on Ctrl-C (or SIGTERM,
    // SIGHUP), which would otherwise leave it half-written.
    let created = match existing {
        Some(_) => None,
        None => gpumap::io::ScratchFile::create_new(&args.file)?,
    };
    // A file just created is empty: nothing to cut.
    let flags = if args.truncate && created.is_none() { "w" } else { "r+" };
    let handle = handle_options.open(&args.file, flags)?;
    let seconds = write_pattern(args, &handle, &device, &mut staged, pattern_buf.as_mut(), piece)?;
    if let Some(created) = created {
        created.keep();
    }
    let transfer_path = TransferPath::of(&handle, &device);
    Report {
        schema: SCHEMA,
        op: "write",
        file: args.file.clone(),
        offset: args.offset,
        bytes: args.size,
        seconds,
        gbps: args.size as f64 / seconds.max(1e-9) / 1e9,
        runs_gbps: vec![args.size as f64 / seconds.max(1e-9) / 1e9],
        cold: false,
        threads: pool.nthreads(),
        task_size: handle.task_size(),
        memory,
        transfer_path,
        direct_io: DirectIo::for_writes(&handle, direct_writes),
        verified: None,
        durable: Some(args.sync),
    }
    .print(args.options.json)
}

/// Refuses a write the file system has no room for, before anything is created or cut: the
/// bytes it would add (`--size` for a new or truncated file; what extends past the end of an
/// existing one) against `statvfs`'s space available to unprivileged users, plus what cutting
/// the file first frees (`--truncate`: the blocks it holds).
fn check_space(args: &WriteArgs, existing: Option<&std::fs::Metadata>) -> CliResult {
    let end = args.offset + args.size;
    let (needed, freed, on) = match existing {
        Some(m) if !args.truncate => {
            (end.saturating_sub(m.len()).min(args.size), 0, args.file.clone())
        }
        Some(m) => (args.size, allocated_bytes(m), args.file.clone()),
        None => {
            let dir = match args.file.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            (args.size, 0, dir)
        }
    };
    let available = gpumap::io::available_space(&on)?.saturating_add(freed);
    if needed > available {
        return Err(Error::ResourceLimit {
            resource: "the free space of the file system",
            requested: needed,
            available,
            hint: "write less (--size), or free space first",
        }
        .into());
    }
    Ok(())
}

/// The bytes a file holds on its file system (`st_blocks`, in 512-byte units whatever the
/// block size), which cutting it to nothing frees.
fn allocated_bytes(file: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    file.blocks().saturating_mul(512)
}

/// Generates and writes `args.size` bytes of the pattern, `piece` at a time through `staged`
/// (device memory; `pattern_buf` is the host side where that is a GPU). Returns the seconds
/// spent writing (and syncing): generating and staging the pattern is not timed.
fn write_pattern(
    args: &WriteArgs,
    handle: &FileHandle,
    device: &Device,
    staged: &mut DeviceBuffer,
    mut pattern_buf: Option<&mut HostBuffer>,
    piece: usize,
) -> CliResult<f64> {
    let size = usize::try_from(args.size).map_err(|_| {
        Error::InvalidArgument(format!("--size {} does not fit in memory", args.size))
    })?;
    if !device.is_host() {
        let path = TransferPath::of(handle, device);
        tracing::info!("{}: {}", path.describe(), path.reason);
    }
    let bar = progress_bar(args.size, args.options.json, "write");
    let mut seconds = 0.0;
    in_pieces(size, piece, &bar, |at, n| {
        let offset = args.offset + at as u64;
        stage_pattern(staged, pattern_buf.as_deref_mut(), offset, n)?;
        let src = staged.view().slice(0..n)?;
        let start = Instant::now();
        handle.write_device(src, offset)?;
        seconds += start.elapsed().as_secs_f64();
        Ok(())
    })?;
    if args.sync {
        let start = Instant::now();
        handle.sync_data()?;
        seconds += start.elapsed().as_secs_f64();
    }
    bar.finish_and_clear();
    Ok(seconds)
}

/// Puts the pattern's bytes of `[offset, offset + n)` at the start of `staged` (device memory;
/// `pattern_buf` is the host side where that is a GPU).
pub(crate) fn stage_pattern(
    staged: &mut DeviceBuffer,
    pattern_buf: Option<&mut HostBuffer>,
    offset: u64,
    n: usize,
) -> CliResult {
    match (pattern_buf, staged) {
        (Some(host), staged) => {
            pattern::fill(&mut host[..n], offset);
            staged.copy_from_host(0, &host[..n])?;
        }
        (None, DeviceBuffer::Host(host)) => pattern::fill(&mut host[..n], offset),
        (None, staged) => {
            let mut host = vec![0u8; n];
            pattern::fill(&mut host, offset);
            staged.copy_from_host(0, &host)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn offsets_past_the_end_fail_with_and_without_len() {
        assert!(matches!(read_len(2000, None, 1000), Err(Error::OutOfRange { offset: 2000, .. })));
        assert!(matches!(read_len(2000, Some(0), 1000), Err(Error::OutOfRange { .. })));
        assert_eq!(read_len(1000, None, 1000).unwrap(), 0);
        assert_eq!(read_len(1000, Some(0), 1000).unwrap(), 0);
        assert_eq!(read_len(10, None, 1000).unwrap(), 990);
        assert!(matches!(read_len(u64::MAX, Some(2), 10), Err(Error::Overflow { .. })));
    }

    #[test]
    fn truncating_a_file_frees_the_blocks_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("held");
        std::fs::write(&path, vec![3u8; 1 << 20]).unwrap();
        let held = allocated_bytes(&std::fs::metadata(&path).unwrap());
        // At least its bytes where the file system stores them (tmpfs and ext4 both do).
        assert!(held >= 1 << 20, "{held}");
        let sparse = dir.path().join("sparse");
        std::fs::File::create(&sparse).unwrap().set_len(1 << 30).unwrap();
        assert!(allocated_bytes(&std::fs::metadata(&sparse).unwrap()) < 1 << 20);
    }

    #[test]
    fn threads_take_what_gpumap_nthreads_takes() {
        for text in ["+8", "8b", "1K", " 8 x", ""] {
            assert!(threads_arg(text).is_err(), "{text:?} accepted");
        }
        assert_eq!(threads_arg(" 16 "), Ok(16));
    }

    proptest! {
        /// `--threads` and `GPUMAP_NTHREADS` accept the same text as the same count.
        #[test]
        fn threads_agree_with_the_environment_variable(text in prop_oneof![
            any::<String>(),
            "[ +-]{0,2}[0-9]{1,5}[ kKbB]{0,2}",
        ]) {
            let env = Config::from_lookup(|k| (k == "GPUMAP_NTHREADS").then(|| text.clone()));
            prop_assert_eq!(threads_arg(&text).ok(), env.ok().map(|c| c.nthreads));
        }

        /// Any offset and length against any file: the length read, or an error; never an
        /// end past the file or past 2^64.
        #[test]
        fn read_lengths_stay_inside_the_file(
            offset in prop_oneof![any::<u64>(), 0u64..5000],
            len in prop::option::of(prop_oneof![any::<u64>(), 0u64..5000]),
            file_len in prop_oneof![any::<u64>(), 0u64..5000],
        ) {
            let fits = |n: u64| offset.checked_add(n).is_some_and(|end| end <= file_len);
            match read_len(offset, len, file_len) {
                Ok(n) => {
                    prop_assert!(fits(n));
                    prop_assert_eq!(n, len.unwrap_or(file_len - offset));
                }
                Err(_) => prop_assert!(!fits(len.unwrap_or(file_len.saturating_sub(offset)))
                    || (len.is_none() && offset > file_len)),
            }
        }
    }

    #[test]
    fn writes_go_in_bounded_pieces() {
        assert_eq!(write_piece(4 << 20, 16, 1 << 40), 256 << 20);
        assert_eq!(write_piece(4 << 20, 2, 1 << 40), 64 << 20);
        assert_eq!(write_piece(64 << 10, 1, 1 << 40), 64 << 20);
        assert_eq!(write_piece(4 << 20, 16, 1000), 1000);
        assert_eq!(write_piece(4 << 20, 16, 0), 1);
    }
}
