//! `gpumap map`: map files into GPU memory (host memory without a GPU) in one cache, under one
//! budget, and read them through it — walking each file in windows, or at random from many
//! threads, view by view or in batches — then report what the cache did per file.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::{Args, ValueEnum};
use serde::Serialize;

use gpumap::mapped::{
    Advice, CacheOptions, CacheStats, DeviceCache, DeviceMappedFile, FileStats, MapOptions,
    ZeroCopy,
};
use gpumap::memory::DeviceBuffer;

use crate::error::{CliError, CliResult};
use crate::schema::{Memory, SCHEMA};
use crate::transfer::MemoryArgs;
use crate::units::size_arg;
use crate::{output, pattern};

/// Most views one run may ask for: enough for any benchmark, and a bound on what a typo costs.
const MAX_VIEWS: u64 = 1 << 40;

/// Arguments of `gpumap map`.
#[derive(Args, Debug)]
pub struct MapArgs {
    /// The files to map (all in one cache, sharing --budget).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Memory the cache may use, e.g. 512MiB: whole frames, at least one.
    #[arg(long, default_value = "1GiB", value_parser = size_arg)]
    budget: u64,
    /// Unit of validity, I/O and random-access residency: a power of two from 4KiB to the
    /// frame size. Random reads of small records want 4KiB.
    #[arg(long, default_value = "64KiB", value_parser = size_arg)]
    extent: u64,
    /// Unit of memory (mapped, evicted, budgeted): a multiple of 2MiB up to 1GiB [default: a
    /// thirty-second of the budget as a power of two, 8MiB to 64MiB]
    #[arg(long, value_parser = size_arg)]
    frame: Option<u64>,
    /// Independent parts of the budget, each with its own lock and LRU list: a power of two
    /// dividing the budget's frames, two frames or more each [default: 1 under 8 frames, else
    /// up to 16]
    #[arg(long)]
    shards: Option<usize>,
    /// Bytes per view when walking the files in order (at most half the budget).
    #[arg(long, default_value = "64MiB", value_parser = size_arg)]
    window: u64,
    /// How far ahead of a walk to read (0: no read-ahead); up to 16 windows, as the budget
    /// allows [default: 512MiB, gpumap::mapped::DEFAULT_READ_AHEAD]
    #[arg(long, value_parser = size_arg)]
    read_ahead: Option<u64>,
    /// Instead of walking in order, read this many ranges at random aligned offsets, spread
    /// over the files by size.
    #[arg(long)]
    random: Option<u64>,
    /// Bytes per random range.
    #[arg(long, default_value = "4KiB", value_parser = size_arg)]
    block: u64,
    /// Instead of walking in order, gather this many random rows by index (the files as
    /// tables of --row-size byte rows; DeviceMappedFile::gather_rows), --batch rows per call.
    #[arg(long, conflicts_with = "random")]
    rows: Option<u64>,
    /// Bytes per row for --rows: any size from 1 byte to the file's.
    #[arg(long, default_value = "512", value_parser = size_arg)]
    row_size: u64,
    /// Threads issuing the random reads at once.
    #[arg(long, default_value_t = 1, value_parser = crate::transfer::threads_arg)]
    threads: usize,
    /// Random ranges (or rows, with --rows) per call: 1 takes a view of each range; more gathers
    /// them into one buffer per call (DeviceCache::gather, or gather_rows with --rows).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    batch: u32,
    /// How the files will be read, as madvise says it.
    #[arg(long, value_enum, default_value_t = AdviceArg::Normal)]
    advise: AdviceArg,
    /// Register the (read-only) files for the GPU to read in place (MapOptions::zero_copy):
    /// `on`, everything read in place and no cache; `misses`, row gathers look in the cache
    /// first and read only their misses in place. Pins each file whole in host memory.
    #[arg(long, value_enum, default_value_t = ZeroCopyArg::Off)]
    zero_copy: ZeroCopyArg,
    /// Check every byte seen against the pattern `gpumap write` generates.
    #[arg(long)]
    verify_pattern: bool,
    #[command(flatten)]
    placement: MemoryArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AdviceArg {
    Normal,
    Sequential,
    Random,
    Willneed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ZeroCopyArg {
    Off,
    On,
    Misses,
}

impl ZeroCopyArg {
    fn mode(self) -> ZeroCopy {
        match self {
            ZeroCopyArg::Off => ZeroCopy::Off,
            ZeroCopyArg::On => ZeroCopy::On,
            ZeroCopyArg::Misses => ZeroCopy::Misses,
        }
    }
}

impl AdviceArg {
    fn advice(self) -> Advice {
        match self {
            AdviceArg::Normal => Advice::Normal,
            AdviceArg::Sequential => Advice::Sequential,
            AdviceArg::Random => Advice::Random,
            AdviceArg::Willneed => Advice::WillNeed,
        }
    }
}

#[derive(Serialize)]
struct FileReport {
    #[serde(serialize_with = "output::lossy_path")]
    file: PathBuf,
    stats: FileStats,
}

#[derive(Serialize)]
struct Report {
    schema: u32,
    memory: Memory,
    access: &'static str,
    threads: usize,
    batch: u32,
    views: u64,
    bytes_viewed: u64,
    seconds: f64,
    gbps: f64,
    views_per_second: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    verified: Option<bool>,
    files: Vec<FileReport>,
    cache: CacheStats,
}

/// `gpumap map`.
pub fn map(args: &MapArgs) -> CliResult {
    let (device, memory) = args.placement.memory()?;
    let mut options = CacheOptions::new();
    options.memory(device).budget(args.budget).extent_size(args.extent);
    if let Some(shards) = args.shards {
        options.shards(shards);
    }
    if let Some(frame) = args.frame {
        options.frame_size(frame);
    }
    let cache = options.build()?;
    let mut map_options = MapOptions::new();
    map_options.zero_copy(args.zero_copy.mode());
    if let Some(bytes) = args.read_ahead {
        map_options.read_ahead(bytes);
    }
    let maps = args
        .files
        .iter()
        .map(|f| cache.open_with(f, &map_options))
        .collect::<gpumap::Result<Vec<_>>>()?;
    for m in &maps {
        m.advise(0, m.len(), args.advise.advice())?;
    }
    let start = Instant::now();
    let (views, bytes) = match (args.random, args.rows) {
        (Some(count), _) => random(args, &cache, &maps, count)?,
        (None, Some(count)) => rows(args, &cache, &maps, count)?,
        (None, None) => walk(args, &maps)?,
    };
    let seconds = start.elapsed().as_secs_f64();
    let report = Report {
        schema: SCHEMA,
        memory,
        access: match (args.random, args.rows) {
            (Some(_), _) => "random",
            (None, Some(_)) => "rows",
            (None, None) => "sequential",
        },
        threads: args.threads,
        batch: args.batch,
        views,
        bytes_viewed: bytes,
        seconds,
        gbps: bytes as f64 / seconds.max(1e-9) / 1e9,
        views_per_second: views as f64 / seconds.max(1e-9),
        verified: args.verify_pattern.then_some(true),
        files: maps
            .iter()
            .map(|m| FileReport { file: m.path().to_path_buf(), stats: m.stats() })
            .collect(),
        cache: cache.stats(),
    };
    print(&report, args.json)
}

/// Walks every file in windows, one view after another (read-ahead overlaps the next window).
fn walk(args: &MapArgs, maps: &[DeviceMappedFile]) -> CliResult<(u64, u64)> {
    let Some(first) = maps.first() else { return Ok((0, 0)) };
    let frame = first.frame_size();
    let budget_frames = (first.cache_stats().budget / frame).max(1);
    // Whole frames, at most half the budget, so read-ahead has room beside the current window.
    let window = (args.window / frame).clamp(1, (budget_frames / 2).max(1)) * frame;
    let (mut views, mut bytes) = (0u64, 0u64);
    let mut seen = Vec::new();
    for m in maps {
        let mut offset = 0;
        while offset < m.len() {
            let view = m.view(offset, window.min(m.len() - offset))?;
            if args.verify_pattern {
                seen.resize(view.len() as usize, 0);
                view.copy_to_host(0, &mut seen)?;
                check(&seen, view.offset(), m)?;
            }
            offset += view.len();
            bytes += view.len();
            views += 1;
        }
    }
    Ok((views, bytes))
}

/// `count` random ranges of `--block` bytes over the files, from `--threads` threads, `--batch`
/// per call.
fn random(
    args: &MapArgs,
    cache: &DeviceCache,
    maps: &[DeviceMappedFile],
    count: u64,
) -> CliResult<(u64, u64)> {
    let block = args.block;
    let (batch, gather_bytes) = check_units(args, maps, count, "--random", "--block", block)?;
    // A file is chosen in proportion to its blocks.
    let blocks: Vec<u64> = maps.iter().map(|m| m.len() / block).collect();
    let next = AtomicU64::new(0);
    let device = cache.device();
    in_threads(args.threads, |t| {
        let mut picker = Picker::for_thread(t, &blocks);
        let mut rows = if batch > 1 {
            Some(DeviceBuffer::zeroed(&device, gather_bytes as usize)?)
        } else {
            None
        };
        let mut seen = vec![0u8; gather_bytes as usize];
        loop {
            let taken = next.fetch_add(batch, Ordering::Relaxed);
            if taken >= count {
                return Ok(());
            }
            let n = batch.min(count - taken);
            let picks: Vec<(usize, u64)> = (0..n)
                .map(|_| {
                    let (file, b) = picker.pick();
                    (file, b * block)
                })
                .collect();
            match rows.as_mut() {
                None => {
                    let (file, offset) = picks[0];
                    let view = maps[file].view(offset, block)?;
                    if args.verify_pattern {
                        view.copy_to_host(0, &mut seen[..block as usize])?;
                        check(&seen[..block as usize], offset, &maps[file])?;
                    }
                }
                Some(rows) => {
                    let ranges: Vec<_> =
                        picks.iter().map(|&(f, o)| maps[f].range(o, block)).collect();
                    cache.gather(&ranges, rows.view_mut())?;
                    if args.verify_pattern {
                        let got = &mut seen[..(n * block) as usize];
                        rows.copy_to_host(0, got)?;
                        for (i, &(f, o)) in picks.iter().enumerate() {
                            check(&got[i * block as usize..][..block as usize], o, &maps[f])?;
                        }
                    }
                }
            }
        }
    })?;
    Ok((count, count * block))
}

/// `count` random rows of `--row-size` bytes gathered by index from `--threads` threads,
/// `--batch` per call, each call's rows from one file (files chosen in proportion to their
/// rows).
fn rows(
    args: &MapArgs,
    cache: &DeviceCache,
    maps: &[DeviceMappedFile],
    count: u64,
) -> CliResult<(u64, u64)> {
    let row_size = args.row_size;
    let (batch, gather_bytes) = check_units(args, maps, count, "--rows", "--row-size", row_size)?;
    let table_rows: Vec<u64> = maps.iter().map(|m| m.len() / row_size).collect();
    let next = AtomicU64::new(0);
    let device = cache.device();
    in_threads(args.threads, |t| {
        let mut picker = Picker::for_thread(t, &table_rows);
        let mut dst = DeviceBuffer::zeroed(&device, gather_bytes as usize)?;
        let mut seen = vec![0u8; gather_bytes as usize];
        let mut indices = Vec::with_capacity(batch as usize);
        loop {
            let taken = next.fetch_add(batch, Ordering::Relaxed);
            if taken >= count {
                return Ok(());
            }
            let n = batch.min(count - taken);
            let (file, _) = picker.pick();
            indices.clear();
            indices.extend((0..n).map(|_| (picker.next() % table_rows[file]) as i64));
            maps[file].gather_rows(indices.as_slice(), row_size, dst.view_mut())?;
            if args.verify_pattern {
                let got = &mut seen[..(n * row_size) as usize];
                dst.copy_to_host(0, got)?;
                for (k, &i) in indices.iter().enumerate() {
                    let row = &got[k * row_size as usize..][..row_size as usize];
                    check(row, i as u64 * row_size, &maps[file])?;
                }
            }
        }
    })?;
    Ok((count, count * row_size))
}

/// The checks of a random run (`--random` or `--rows`) of `count` units of `size` bytes: the
/// count bounded, the unit in every file, `--batch` units per call within 4 GiB. Returns the
/// batch and its bytes.
fn check_units(
    args: &MapArgs,
    maps: &[DeviceMappedFile],
    count: u64,
    count_option: &str,
    size_option: &str,
    size: u64,
) -> CliResult<(u64, u64)> {
    if count > MAX_VIEWS {
        return Err(CliError::Usage(format!("{count_option} {count}: at most {MAX_VIEWS}")));
    }
    if size == 0 {
        return Err(CliError::Usage(format!("{size_option} 0: must be at least 1 byte")));
    }
    if maps.iter().any(|m| size > m.len()) {
        return Err(CliError::Usage(format!(
            "{size_option} {size} does not fit in every file (the smallest has {} bytes)",
            maps.iter().map(|m| m.len()).min().unwrap_or(0)
        )));
    }
    let batch = u64::from(args.batch);
    let bytes = batch.checked_mul(size).filter(|&b| b <= 4 << 30).ok_or_else(|| {
        CliError::Usage(format!(
            "--batch {batch} x {size_option} {size} is more than 4 GiB per call"
        ))
    })?;
    Ok((batch, bytes))
}

/// Runs `work(thread)` on `threads` threads at once; the first error, or a panic as one.
fn in_threads(threads: usize, work: impl Fn(usize) -> CliResult + Sync) -> CliResult {
    let work = &work;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads).map(|t| s.spawn(move || work(t))).collect();
        for w in workers {
            w.join().map_err(|_| CliError::Usage("a worker thread panicked".into()))??;
        }
        Ok(())
    })
}

/// A thread's xorshift sequence, and picks of a unit (block or row) across the files in
/// proportion to their units: the same for every run of the command.
struct Picker<'a> {
    x: u64,
    units: &'a [u64],
    total: u64,
}

impl<'a> Picker<'a> {
    fn for_thread(thread: usize, units: &'a [u64]) -> Picker<'a> {
        let x = 0x2545_F491_4F6C_DD1Du64 ^ (thread as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Picker { x, units, total: units.iter().sum() }
    }

    fn next(&mut self) -> u64 {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        self.x
    }

    /// A file, and a unit of it.
    fn pick(&mut self) -> (usize, u64) {
        let mut unit = self.next() % self.total;
        let mut file = 0;
        while unit >= self.units[file] {
            unit -= self.units[file];
            file += 1;
        }
        (file, unit)
    }
}

fn check(seen: &[u8], offset: u64, map: &DeviceMappedFile) -> CliResult {
    match pattern::first_mismatch(seen, offset) {
        Some(at) => Err(CliError::DataDiffer {
            offset: at,
            memory: format!("{} through the map of {}", map.memory(), map.path().display()),
            reference: "the pattern gpumap write generates",
        }),
        None => Ok(()),
    }
}

fn print(report: &Report, json: bool) -> CliResult {
    if json {
        return output::json(report);
    }
    output::try_line(format!(
        "{} {} views of {} bytes over {} file(s) in {}: {:.3} s, {:.0} views/s, {:.2} GB/s{}",
        report.views,
        report.access,
        report.bytes_viewed.checked_div(report.views).unwrap_or(0),
        report.files.len(),
        report.memory.describe(),
        report.seconds,
        report.views_per_second,
        report.gbps,
        if report.verified == Some(true) { ", pattern verified" } else { "" }
    ))?;
    for f in &report.files {
        let s = &f.stats;
        output::try_line(format!(
            "  {}: {} hits, {} misses, {} bytes faulted in {} reads, {} evictions, {} resident ({} frames, {} slots)",
            output::shown(&f.file),
            s.hits,
            s.misses,
            s.bytes_faulted,
            s.fault_reads,
            s.evictions,
            s.resident_bytes,
            s.frames,
            s.slots
        ))?;
    }
    let c = &report.cache;
    output::try_line(format!(
        "  cache: {} of {} bytes in use ({} B frames, {} B extents, {} shards), {:.3} s mapping memory, {:.3} s faulting",
        c.used_bytes, c.budget, c.frame_size, c.extent_size, c.shards, c.map_seconds, c.fault_seconds
    ))
}
