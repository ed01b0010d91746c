//! `gpumap pagecache`: see, warm, evict or lock files in the host page cache, or drop it all.
#![forbid(unsafe_code)]

use std::fs;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use gpumap::pagecache::{
    self, ByteRange, LockedRange, MethodChoice, Residency, ResidencyMap, ResidentRun, WarmMode,
};
use serde::Serialize;

/// Show how much of each file is in the host page cache, and change it.
///
/// One row per file (resident bytes and share, cached/total pages, size, and dirty and
/// writeback pages where the kernel reports them) and a total. Residency comes from
/// cachestat(2) on Linux 6.5+, else mmap + mincore(2). For files the caller neither owns nor
/// may write, Linux 5.2+ will not tell: those show "?" instead of a false 100%.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    gpumap pagecache data.bin                  how much is cached\n  \
    gpumap pagecache --map -r dataset/         per-file residency bars\n  \
    gpumap pagecache --evict data.bin          drop it (fdatasync + POSIX_FADV_DONTNEED)\n  \
    gpumap pagecache --warm --wait data.bin    read it into the cache\n  \
    gpumap pagecache --range 1G:512M --json f  one range, for scripts\n  \
    sudo gpumap pagecache --drop-all           drop the whole system's clean page cache")]
pub struct PagecacheArgs {
    /// Files to look at (directories too, with --recursive).
    #[arg(value_name = "PATH", required_unless_present = "drop_all")]
    pub paths: Vec<PathBuf>,

    /// Descend into directories (symbolic links inside them are not followed).
    #[arg(short, long)]
    pub recursive: bool,

    /// Evict the range: fdatasync, then POSIX_FADV_DONTNEED (best effort: shows what stays).
    #[arg(long, group = "action")]
    pub evict: bool,

    /// Warm the range: POSIX_FADV_WILLNEED (asynchronous), or read it with --wait.
    #[arg(long, group = "action")]
    pub warm: bool,

    /// With --warm: read the data and return once it is cached.
    #[arg(long, requires = "warm")]
    pub wait: bool,

    /// Lock the range in memory (mmap + mlock) and hold it until interrupted (Ctrl-C).
    #[arg(long, group = "action")]
    pub lock: bool,

    /// Only this byte range of each file: OFFSET:LENGTH, OFFSET: (to the end) or :LENGTH;
    /// sizes take K, M, G, T suffixes (powers of 1024).
    #[arg(long, value_name = "OFF:LEN", value_parser = parse_range)]
    pub range: Option<ByteRange>,

    /// Print one JSON document (files, errors, total) instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Draw a residency bar per file, like `vmtouch -v` ('O' all pages of a cell resident,
    /// 'o' some, ' ' none, '?' unknown); with --json, list the resident byte runs.
    #[arg(long)]
    pub map: bool,

    /// Width of the --map bar in cells.
    #[arg(long, value_name = "CELLS", default_value_t = 60, requires = "map")]
    pub map_width: usize,

    /// Print sizes in bytes instead of KiB/MiB/GiB.
    #[arg(long)]
    pub bytes: bool,

    /// How to ask the kernel: cachestat where available, else mincore (auto), or one of them.
    #[arg(long, value_enum, default_value_t = MethodArg::Auto)]
    pub method: MethodArg,

    /// Drop the whole system's clean page cache (sync, then /proc/sys/vm/drop_caches; root).
    #[arg(long, conflicts_with_all = ["paths", "action", "range", "map", "recursive"])]
    pub drop_all: bool,

    /// With --drop-all: also drop the dentry and inode caches.
    #[arg(long, requires = "drop_all")]
    pub dentries: bool,
}

/// `--method` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodArg {
    /// cachestat(2) where the kernel has it, else mmap + mincore(2).
    Auto,
    /// cachestat(2) only (Linux 6.5+).
    Cachestat,
    /// mmap + mincore(2) only.
    Mincore,
}

impl From<MethodArg> for MethodChoice {
    fn from(m: MethodArg) -> Self {
        match m {
            MethodArg::Auto => MethodChoice::Auto,
            MethodArg::Cachestat => MethodChoice::Cachestat,
            MethodArg::Mincore => MethodChoice::Mincore,
        }
    }
}

/// Parse `OFF:LEN`, `OFF:` or `:LEN` (sizes with optional K/M/G/T binary suffixes).
fn parse_range(text: &str) -> Result<ByteRange, String> {
    let (offset, len) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not OFFSET:LENGTH (e.g. 0:1G, 4096:, :64M)"))?;
    let offset = if offset.is_empty() { 0 } else { parse_size(offset)? };
    let len = if len.is_empty() { None } else { Some(parse_size(len)?) };
    Ok(ByteRange { offset, len })
}

fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(digits_end);
    let number: u64 = number.parse().map_err(|_| format!("{text:?} is not a size"))?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("{text:?}: unknown size suffix {suffix:?} (use K, M, G or T)")),
    };
    number.checked_mul(1 << shift).ok_or_else(|| format!("{text:?} does not fit in 64 bits"))
}

/// One file's line of the report.
#[derive(Serialize, Debug)]
struct FileReport {
    path: PathBuf,
    residency: Residency,
    /// Residency before `--evict`.
    #[serde(skip_serializing_if = "Option::is_none")]
    before_evict: Option<Residency>,
    /// Bytes held by `--lock`.
    #[serde(skip_serializing_if = "Option::is_none")]
    locked_bytes: Option<u64>,
    /// Resident runs, with `--map`.
    #[serde(skip_serializing_if = "Option::is_none")]
    resident_runs: Option<Vec<ResidentRun>>,
    #[serde(skip)]
    map: Option<ResidencyMap>,
}

#[derive(Serialize, Debug)]
struct ErrorReport {
    path: PathBuf,
    error: String,
}

#[derive(Serialize, Debug, Default)]
struct Total {
    files: u64,
    /// Bytes looked at: file sizes, or range lengths with `--range`.
    bytes: u64,
    total_pages: u64,
    /// Sum over the files whose residency is known.
    cached_pages: u64,
    cached_bytes: u64,
    /// Files whose residency the kernel would not report.
    unknown_files: u64,
    /// Sums over the files that report them (cachestat); `None` when none does.
    dirty_pages: Option<u64>,
    writeback_pages: Option<u64>,
    errors: u64,
    /// Non-regular entries and symbolic links met while descending (not followed).
    skipped: u64,
}

#[derive(Serialize, Debug)]
struct Report {
    files: Vec<FileReport>,
    errors: Vec<ErrorReport>,
    total: Total,
}

/// Run `gpumap pagecache`; failure when any path failed (the others are still processed).
pub fn run(args: &PagecacheArgs) -> ExitCode {
    if args.drop_all {
        return drop_all(args);
    }
    let progress = Progress::new(args.recursive);
    let mut report = Report { files: Vec::new(), errors: Vec::new(), total: Total::default() };
    let mut locks: Vec<LockedRange> = Vec::new();
    for path in &args.paths {
        visit(path, args, true, &mut report, &mut locks, &progress);
    }
    progress.finish();
    report.total.files = report.files.len() as u64;
    report.total.errors = report.errors.len() as u64;

    let printed = if args.json { print_json(&report) } else { print_table(&report, args) };
    if let Err(e) = printed {
        // A closed pipe (`| head`) is not worth a message; anything else is.
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("gpumap pagecache: writing the report: {e}");
        }
        return ExitCode::FAILURE;
    }
    if !locks.is_empty() {
        hold(&locks);
    }
    if report.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn drop_all(args: &PagecacheArgs) -> ExitCode {
    match pagecache::drop_system(args.dentries) {
        Ok(()) => {
            let what = if args.dentries { "page cache, dentries and inodes" } else { "page cache" };
            if args.json {
                crate::output::line(serde_json::json!({ "dropped": what }));
            } else {
                crate::output::line(format!("dropped the system's clean {what}"));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpumap pagecache --drop-all: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Keep the locks until the process is interrupted; the kernel unlocks on exit.
fn hold(locks: &[LockedRange]) -> ! {
    let bytes: u64 = locks.iter().map(LockedRange::locked_bytes).sum();
    eprintln!(
        "gpumap pagecache: holding {} locked in {} file(s); interrupt (Ctrl-C) to release",
        format_size(bytes, false),
        locks.len()
    );
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn visit(
    path: &Path,
    args: &PagecacheArgs,
    named_on_command_line: bool,
    report: &mut Report,
    locks: &mut Vec<LockedRange>,
    progress: &Progress,
) {
    // Command-line symlinks are followed (the user named them); links met while descending
    // are not, so a tree with a link cycle still terminates.
    let metadata =
        if named_on_command_line { fs::metadata(path) } else { fs::symlink_metadata(path) };
    let metadata = match metadata {
        Ok(m) => m,
        Err(e) => return fail(report, progress, path, e.to_string()),
    };
    let kind = metadata.file_type();
    if kind.is_dir() {
        if !args.recursive {
            return fail(report, progress, path, "is a directory (use --recursive)".to_owned());
        }
        let mut entries: Vec<PathBuf> = match fs::read_dir(path) {
            Ok(dir) => dir.filter_map(|entry| entry.ok().map(|e| e.path())).collect(),
            Err(e) => return fail(report, progress, path, e.to_string()),
        };
        entries.sort();
        for entry in entries {
            visit(&entry, args, false, report, locks, progress);
        }
        return;
    }
    if !named_on_command_line && !kind.is_file() {
        // Links, sockets, FIFOs and devices inside trees: not what a tree walk means.
        report.total.skipped += 1;
        return;
    }
    match process_file(path, args, locks) {
        Ok(file) => {
            progress.tick(&file);
            add_to_total(&mut report.total, &file.residency);
            report.files.push(file);
        }
        Err(e) => fail(report, progress, path, e.to_string()),
    }
}

fn fail(report: &mut Report, progress: &Progress, path: &Path, error: String) {
    progress.suspend(|| eprintln!("gpumap pagecache: {}: {error}", path.display()));
    report.errors.push(ErrorReport { path: path.to_path_buf(), error });
}

fn process_file(
    path: &Path,
    args: &PagecacheArgs,
    locks: &mut Vec<LockedRange>,
) -> gpumap::Result<FileReport> {
    let range = args.range.unwrap_or(ByteRange::ALL);
    let mut before_evict = None;
    let mut locked_bytes = None;
    if args.evict {
        before_evict = Some(pagecache::evict(path, range)?.before);
    } else if args.warm {
        let mode = if args.wait { WarmMode::Read } else { WarmMode::Advise };
        pagecache::warm(path, range, mode)?;
    } else if args.lock {
        let locked = pagecache::lock(path, range)?;
        locked_bytes = Some(locked.locked_bytes());
        locks.push(locked);
    }
    let (residency, map) = if args.map {
        let map = pagecache::residency_map(path, range)?;
        (map.residency.clone(), Some(map))
    } else {
        (pagecache::residency_with(path, range, args.method.into())?, None)
    };
    let resident_runs = map.as_ref().map(|m| m.resident_runs.clone());
    Ok(FileReport {
        path: path.to_path_buf(),
        residency,
        before_evict,
        locked_bytes,
        resident_runs,
        map,
    })
}

fn add_to_total(total: &mut Total, r: &Residency) {
    total.bytes += r.len;
    total.total_pages += r.total_pages;
    match r.cached_pages {
        Some(pages) => {
            total.cached_pages += pages;
            total.cached_bytes += pages * r.page_size;
        }
        None => total.unknown_files += 1,
    }
    if let Some(d) = r.dirty_pages {
        *total.dirty_pages.get_or_insert(0) += d;
    }
    if let Some(w) = r.writeback_pages {
        *total.writeback_pages.get_or_insert(0) += w;
    }
}

fn print_json(report: &Report) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, report)?;
    writeln!(out)?;
    out.flush()
}

fn print_table(report: &Report, args: &PagecacheArgs) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    let raw = args.bytes;
    let size_label = if args.range.is_some() { "RANGE" } else { "SIZE" };
    let header = ["RESIDENT", "%", "PAGES", size_label, "DIRTY", "WRITEBACK", "FILE"];
    let mut rows: Vec<[String; 7]> = Vec::new();
    for file in &report.files {
        let r = &file.residency;
        let mut resident = r.cached_bytes().map_or("?".to_owned(), |b| format_size(b, raw));
        if let Some(before) = file.before_evict.as_ref().and_then(Residency::cached_bytes) {
            resident = format!("{} -> {resident}", format_size(before, raw));
        }
        rows.push([
            resident,
            if r.total_pages == 0 {
                "-".to_owned()
            } else {
                r.fraction().map_or("?".to_owned(), |f| format!("{:.1}%", f * 100.0))
            },
            format!(
                "{}/{}",
                r.cached_pages.map_or("?".to_owned(), |c| c.to_string()),
                r.total_pages
            ),
            format_size(r.len, raw),
            r.dirty_pages.map_or("-".to_owned(), |d| d.to_string()),
            r.writeback_pages.map_or("-".to_owned(), |w| w.to_string()),
            file.path.display().to_string(),
        ]);
    }
    let t = &report.total;
    let total_fraction = if t.total_pages == 0 {
        "-".to_owned()
    } else {
        format!("{:.1}%", t.cached_pages as f64 * 100.0 / t.total_pages as f64)
    };
    let mut total_label = format!("total ({} files", t.files);
    if t.unknown_files > 0 {
        total_label += &format!(", {} unknown", t.unknown_files);
    }
    if t.errors > 0 {
        total_label += &format!(", {} errors", t.errors);
    }
    if t.skipped > 0 {
        total_label += &format!(", {} skipped", t.skipped);
    }
    total_label += ")";
    let total_row = [
        format_size(t.cached_bytes, raw),
        total_fraction,
        format!("{}/{}", t.cached_pages, t.total_pages),
        format_size(t.bytes, raw),
        t.dirty_pages.map_or("-".to_owned(), |d| d.to_string()),
        t.writeback_pages.map_or("-".to_owned(), |w| w.to_string()),
        total_label,
    ];

    let mut widths = header.map(str::len);
    for row in rows.iter().chain(std::iter::once(&total_row)) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                text += cell; // the path, left-aligned and unpadded
            } else {
                text += &format!("{cell:>width$}  ");
            }
        }
        text
    };
    writeln!(out, "{}", line(&header.map(str::to_owned)))?;
    for (row, file) in rows.iter().zip(&report.files) {
        writeln!(out, "{}", line(row))?;
        if let Some(map) = &file.map {
            writeln!(out, "{:indent$}{}", "", bar(map, args.map_width), indent = 2)?;
        }
        if let Some(reason) = &file.residency.unknown_reason {
            writeln!(out, "  (unknown: {reason})")?;
        }
    }
    writeln!(out, "{}", line(&total_row))?;
    out.flush()
}

/// `[OOOoo   ]`: each cell covers an equal share of the pages.
fn bar(map: &ResidencyMap, width: usize) -> String {
    let pages = map.pages();
    let width = width.max(1);
    let mut cells = String::with_capacity(width + 2);
    cells.push('[');
    if !map.residency.is_known() {
        cells.push_str(&"?".repeat(width));
    } else if pages == 0 {
        cells.push_str(&" ".repeat(width));
    } else {
        // With fewer pages than cells, a page spans several cells.
        let cell_count = width as u64;
        for cell in 0..cell_count {
            let start = cell * pages / cell_count;
            let end = ((cell + 1) * pages / cell_count).max(start + 1);
            let resident = map.resident_pages_in(start..end);
            cells.push(if resident == end - start {
                'O'
            } else if resident > 0 {
                'o'
            } else {
                ' '
            });
        }
    }
    cells.push(']');
    let cached = map.residency.cached_pages.map_or("?".to_owned(), |c| c.to_string());
    format!("{cells} {cached}/{pages}")
}

fn format_size(bytes: u64, raw: bool) -> String {
    if raw || bytes < 1024 {
        return format!("{bytes}{}", if raw { "" } else { " B" });
    }
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A spinner on stderr while descending trees, only when stderr is a terminal.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    fn new(recursive: bool) -> Self {
        let bar = (recursive && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress { bar }
    }

    fn tick(&self, file: &FileReport) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
            bar.set_message(format!("{} files; {}", bar.position(), file.path.display()));
        }
    }

    fn suspend(&self, f: impl FnOnce()) {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_range("0:1G"), Ok(ByteRange::new(0, 1 << 30)));
        assert_eq!(parse_range("4096:"), Ok(ByteRange::from_offset(4096)));
        assert_eq!(parse_range(":64MiB"), Ok(ByteRange::new(0, 64 << 20)));
        assert_eq!(parse_range("1k:2K"), Ok(ByteRange::new(1024, 2048)));
        assert!(parse_range("10").is_err());
        assert!(parse_range("x:1").is_err());
        assert!(parse_range("1Q:1").is_err());
        assert!(parse_range("99999999999T:1").is_err());
    }

    #[test]
    fn sizes_format() {
        assert_eq!(format_size(0, false), "0 B");
        assert_eq!(format_size(1536, false), "1.5 KiB");
        assert_eq!(format_size(3 << 30, false), "3.0 GiB");
        assert_eq!(format_size(1536, true), "1536");
    }
}
