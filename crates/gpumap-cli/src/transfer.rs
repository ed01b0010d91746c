//! `gpumap info`, `gpumap read`, `gpumap write`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use gpumap::config::{parse_size, CompatMode, Config, DirectRead};
use gpumap::io::{FileHandle, IoPool};
use gpumap::memory::{Device, DeviceBuffer, HostBuffer};
use gpumap::{Error, Result};

use crate::{output, pattern};

pub(crate) fn size_arg(text: &str) -> std::result::Result<u64, String> {
    parse_size(text)
}

/// Options every transfer command shares.
#[derive(Args, Debug)]
pub struct TransferOptions {
    /// Worker threads (default: GPUMAP_NTHREADS, or the CPU count up to 16).
    #[arg(long, short = 't')]
    threads: Option<usize>,
    /// Largest piece one task moves, e.g. 4MiB (default: GPUMAP_TASK_SIZE or 4 MiB).
    #[arg(long, value_parser = size_arg)]
    task_size: Option<u64>,
    /// cuFile or POSIX: on (POSIX), off (cuFile), auto.
    #[arg(long)]
    compat_mode: Option<CompatMode>,
    /// Move the page-aligned middle with O_DIRECT (bypassing the page cache): on, off, or
    /// uncached (reads: only ranges the page cache does not hold, for data read once).
    #[arg(long)]
    direct: Option<DirectRead>,
    #[command(flatten)]
    placement: MemoryArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
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
}

impl TransferOptions {
    fn open(&self, path: &PathBuf, flags: &str) -> Result<(FileHandle, Arc<IoPool>)> {
        let config = Config::global()?;
        let threads = self.threads.unwrap_or(config.nthreads);
        let pool = Arc::new(IoPool::new(threads)?);
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
        Ok((options.open(path, flags)?, pool))
    }
}

/// Arguments of `gpumap info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Arguments of `gpumap read`.
#[derive(Args, Debug)]
pub struct ReadArgs {
    /// The file to read.
    file: PathBuf,
    /// Where to start, in bytes (suffixes such as 4KiB allowed).
    #[arg(long, default_value = "0", value_parser = size_arg)]
    offset: u64,
    /// How many bytes (default: to the end of the file).
    #[arg(long, value_parser = size_arg)]
    len: Option<u64>,
    #[command(flatten)]
    options: TransferOptions,
    /// Check the bytes read against the pattern `gpumap write` generates.
    #[arg(long)]
    verify_pattern: bool,
    /// Check the bytes read into GPU memory against a plain host read of the same range.
    #[arg(long)]
    verify: bool,
    /// Read the range this many times and report the fastest (the first pays for warming
    /// caches and allocating pinned buffers).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Drop the range from the page cache before each read (fdatasync, then
    /// POSIX_FADV_DONTNEED), so every read comes from the disk.
    #[arg(long)]
    cold: bool,
}

/// Arguments of `gpumap write`.
#[derive(Args, Debug)]
pub struct WriteArgs {
    /// The file to write (created if missing; never truncated: use --truncate).
    file: PathBuf,
    /// How many bytes to write, e.g. 1GiB.
    #[arg(long, value_parser = size_arg)]
    size: u64,
    /// Where to start, in bytes.
    #[arg(long, default_value = "0", value_parser = size_arg)]
    offset: u64,
    /// Cut the file to zero length first.
    #[arg(long)]
    truncate: bool,
    /// fdatasync before reporting, so the rate includes making the data durable.
    #[arg(long)]
    sync: bool,
    #[command(flatten)]
    options: TransferOptions,
}

/// What one transfer did, for the text line and `--json`.
#[derive(Serialize, Debug)]
struct Report {
    op: &'static str,
    file: PathBuf,
    offset: u64,
    bytes: u64,
    seconds: f64,
    gbps: f64,
    /// Every repetition's rate, in order (`--repeat`); `gbps` is the fastest.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    runs_gbps: Vec<f64>,
    /// Whether each read was made cold first (`--cold`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    cold: bool,
    threads: usize,
    task_size: u64,
    memory: String,
    direct_io: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    verified: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    durable: Option<bool>,
}

impl Report {
    fn print(&self, json: bool) -> Result<()> {
        if json {
            let text = serde_json::to_string(self)
                .map_err(|e| Error::InvalidArgument(format!("cannot print JSON: {e}")))?;
            output::line(text);
            return Ok(());
        }
        output::line(format!(
            "{}{} {} bytes {} {} at offset {} in {:.3} s: {:.2} GB/s{} ({} threads, task size {}, {}, O_DIRECT: {}){}",
            if self.cold { "cold: " } else { "" },
            if self.op == "read" { "read" } else { "wrote" },
            self.bytes,
            if self.op == "read" { "from" } else { "to" },
            self.file.display(),
            self.offset,
            self.seconds,
            self.gbps,
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
            self.memory,
            self.direct_io,
            match (self.verified, self.durable) {
                (Some(true), _) => ", pattern verified",
                (_, Some(true)) => ", durable (fdatasync)",
                _ => "",
            }
        ));
        Ok(())
    }
}

fn human(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] =
        [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} B")
}

/// Where the data lives during a transfer, as the report says it.
fn host_memory_note() -> String {
    let caps = gpumap::Capabilities::probe();
    if caps.gpu_available() {
        "host memory".into()
    } else {
        format!("host memory (no GPU: {})", caps.cuda_reason().unwrap_or("not found"))
    }
}

/// With a visible progress bar, pieces of this size are moved one after another so that
/// progress can be shown (each piece still split into tasks across every thread); without
/// one, the whole transfer is one piece, with no pause between pieces.
fn progress_piece(handle: &FileHandle, threads: usize, bar: &ProgressBar, total: usize) -> usize {
    if bar.is_hidden() {
        return total.max(1);
    }
    (handle.task_size() as usize * threads * 16).max(256 << 20)
}

/// Calls `step(at, n)` for consecutive pieces `[at, at + n)` of `[0, total)`, each at most
/// `piece` bytes, moving the progress bar after each.
fn in_pieces(
    total: usize,
    piece: usize,
    bar: &ProgressBar,
    mut step: impl FnMut(usize, usize) -> Result<()>,
) -> Result<()> {
    let mut at = 0usize;
    while at < total {
        let n = piece.min(total - at);
        step(at, n)?;
        at += n;
        bar.set_position(at as u64);
    }
    Ok(())
}

fn progress_bar(total: u64, json: bool, what: &str) -> ProgressBar {
    if json || total < (256 << 20) {
        return ProgressBar::hidden();
    }
    // Drawn to stderr, and hidden by indicatif when stderr is not a terminal.
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// `gpumap info`.
pub fn info(args: &InfoArgs) -> Result<()> {
    let caps = gpumap::Capabilities::probe();
    let config = Config::from_env()?;
    if args.json {
        let value = serde_json::json!({ "capabilities": caps, "config": config });
        output::line(format!("{value:#}"));
        return Ok(());
    }
    output::line(caps);
    output::line("settings:");
    let rows: [(&str, String); 7] = [
        ("compat_mode", config.compat_mode.to_string()),
        ("nthreads", config.nthreads.to_string()),
        ("task_size", human(config.task_size)),
        ("gds_threshold", human(config.gds_threshold)),
        ("bounce_buffer_size", human(config.bounce_buffer_size)),
        ("direct_io_read", config.direct_io_read.to_string()),
        ("direct_io_write", config.direct_io_write.to_string()),
    ];
    for (name, value) in rows {
        let source = match config.source(name) {
            gpumap::config::Source::Default => "default".to_string(),
            gpumap::config::Source::Env(var) => format!("from {var}"),
        };
        output::line(format!("  {name:<20} {value:<10} ({source})"));
    }
    Ok(())
}

/// `gpumap read`.
pub fn read(args: &ReadArgs) -> Result<()> {
    let (handle, pool) = args.options.open(&args.file, "r")?;
    let file_len = handle.len()?;
    let len = match args.len {
        Some(len) => {
            if args.offset.checked_add(len).is_none_or(|end| end > file_len) {
                return Err(Error::OutOfRange { offset: args.offset, len, file_len });
            }
            len
        }
        None => file_len.saturating_sub(args.offset),
    };
    let size = usize::try_from(len)
        .map_err(|_| Error::InvalidArgument(format!("--len {len} does not fit in memory")))?;
    let device = args.options.placement.device()?;
    let bar = progress_bar(len, args.options.json, "read");
    let piece = progress_piece(&handle, pool.nthreads(), &bar, size);
    let mut runs = Vec::with_capacity(args.repeat as usize);
    let mut buf = DeviceBuffer::alloc(&device, size)?;
    // Decided (and cuFile opened, in auto mode) before the clock starts: opening is not part
    // of the transfer.
    if !device.is_host() {
        let _ = handle.compat_decision();
    }
    for _ in 0..args.repeat {
        cool(args, len)?;
        let start = Instant::now();
        in_pieces(size, piece, &bar, |at, n| {
            let dst = buf.view_mut().into_slice(at..at + n)?;
            handle.read_device_exact(dst, args.offset + at as u64)
        })?;
        runs.push(start.elapsed().as_secs_f64());
    }
    bar.finish_and_clear();
    let mut verified = None;
    if args.verify || args.verify_pattern {
        let mut staged = vec![0u8; piece.min(size)];
        let mut expected = vec![0u8; piece.min(size)];
        let mut done = 0usize;
        while done < size {
            let n = piece.min(size - done);
            buf.copy_to_host(done, &mut staged[..n])?;
            let at = args.offset + done as u64;
            if args.verify {
                handle.read_exact(&mut expected[..n], at)?;
                if let Some(p) = staged[..n].iter().zip(&expected[..n]).position(|(a, b)| a != b) {
                    return Err(Error::InvalidArgument(format!(
                        "--verify: {} differs from the file at offset {}",
                        if device.is_host() { "host memory" } else { "GPU memory" },
                        at + p as u64
                    )));
                }
            }
            verify_pattern(args.verify_pattern, &staged[..n], at)?;
            done += n;
        }
        verified = Some(true);
    }
    let memory_note = memory_note(&device, &handle);
    let seconds = runs.iter().copied().fold(f64::INFINITY, f64::min);
    let rate = |seconds: f64| len as f64 / seconds.max(1e-9) / 1e9;
    Report {
        op: "read",
        file: args.file.clone(),
        offset: args.offset,
        bytes: len,
        seconds,
        gbps: rate(seconds),
        runs_gbps: if runs.len() > 1 { runs.iter().map(|&s| rate(s)).collect() } else { vec![] },
        cold: args.cold,
        threads: pool.nthreads(),
        task_size: handle.task_size(),
        memory: memory_note,
        direct_io: direct_note(&handle),
        verified,
        durable: None,
    }
    .print(args.options.json)
}

/// With `--cold`, drops the range about to be read from the page cache.
fn cool(args: &ReadArgs, len: u64) -> Result<()> {
    if args.cold {
        let range = gpumap::pagecache::ByteRange::new(args.offset, len);
        gpumap::pagecache::evict(args.file.as_path(), range)?;
    }
    Ok(())
}

/// "GPU 0 (NVIDIA H200), POSIX path: (why)" or "host memory (no GPU: (why))", as the report
/// says it.
fn memory_note(device: &Device, handle: &FileHandle) -> String {
    match device {
        Device::Host => host_memory_note(),
        Device::Cuda(device) => {
            let decision = handle.compat_decision();
            let path = match decision.path {
                gpumap::io::IoPath::CuFile => "cuFile",
                gpumap::io::IoPath::Posix => "POSIX",
            };
            format!(
                "GPU {} ({}), {path} path: {}",
                device.ordinal(),
                device.name(),
                decision.reason
            )
        }
    }
}

fn verify_pattern(wanted: bool, data: &[u8], offset: u64) -> Result<Option<bool>> {
    if !wanted {
        return Ok(None);
    }
    match pattern::first_mismatch(data, offset) {
        Some(at) => Err(Error::InvalidArgument(format!(
            "--verify-pattern: byte at offset {at} differs from the pattern gpumap write generates"
        ))),
        None => Ok(Some(true)),
    }
}

fn direct_note(handle: &FileHandle) -> String {
    let uncached_reads = handle.flags().read && handle.direct_read_policy() == DirectRead::Uncached;
    match handle.direct_io_status() {
        Ok(()) if uncached_reads => "for ranges not in the page cache".into(),
        Ok(()) => "on".into(),
        Err(why) => format!("off, {why}"),
    }
}

/// `gpumap write`.
pub fn write(args: &WriteArgs) -> Result<()> {
    let (handle, pool) = args
        .options
        .open(&args.file, if args.truncate { "w" } else { "r+" })
        .or_else(|e| match e {
            // "r+" needs an existing file; create it like "w" would, without truncating.
            Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                args.options.open(&args.file, "w")
            }
            other => Err(other),
        })?;
    let size = usize::try_from(args.size).map_err(|_| {
        Error::InvalidArgument(format!("--size {} does not fit in memory", args.size))
    })?;
    let mut buf = HostBuffer::new(size)?;
    pattern::fill(&mut buf, args.offset);
    let bar = progress_bar(args.size, args.options.json, "write");
    let piece = progress_piece(&handle, pool.nthreads(), &bar, size);
    let device = args.options.placement.device()?;
    // The pattern is staged in device memory first (not timed): the write is device -> file.
    let mut staged = DeviceBuffer::alloc(&device, size)?;
    staged.copy_from_host(0, &buf)?;
    drop(buf);
    if !device.is_host() {
        let _ = handle.compat_decision(); // decided before the clock starts, as in read
    }
    let start = Instant::now();
    in_pieces(size, piece, &bar, |at, n| {
        let src = staged.view().slice(at..at + n)?;
        handle.write_device(src, args.offset + at as u64).map(|_| ())
    })?;
    let memory_note = memory_note(&device, &handle);
    if args.sync {
        handle.sync_data()?;
    }
    let seconds = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Report {
        op: "write",
        file: args.file.clone(),
        offset: args.offset,
        bytes: args.size,
        seconds,
        gbps: args.size as f64 / seconds.max(1e-9) / 1e9,
        runs_gbps: vec![],
        cold: false,
        threads: pool.nthreads(),
        task_size: handle.task_size(),
        memory: memory_note,
        direct_io: direct_note(&handle),
        verified: None,
        durable: args.sync.then_some(true),
    }
    .print(args.options.json)
}
