//! `gpumap pagecache`: see, warm, evict or lock files in the host page cache, or drop it all.
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::fs;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpumap::pagecache::{
    self, ByteRange, LockedRange, MethodChoice, Residency, ResidencyMap, ResidentRun, WarmMode,
};
use serde::Serialize;

use crate::error::{CliError, CliResult};
use crate::output;
use crate::schema::{ErrorObject, SCHEMA};
use crate::units::size_arg;

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
    gpumap pagecache --evict data.bin          drop it (POSIX_FADV_DONTNEED)\n  \
    gpumap pagecache --warm --wait data.bin    read it into the cache\n  \
    gpumap pagecache --range 1G:512M --json f  one range, for scripts\n  \
    gpumap pagecache -r --summary dataset/     one total line for a big tree\n  \
    gpumap pagecache -o +EVICTED,-DIRTY f      columns, as with fincore -o\n  \
    sudo gpumap pagecache --drop-all           drop the whole system's clean page cache\n\n\
Columns (-o, case-insensitive; +LIST adds to the default, -NAME removes): RESIDENT (RES), \
PERCENT, PAGES, SIZE, DIRTY, WRITEBACK, EVICTED, RECENTLY_EVICTED, FILE. \
Default: RESIDENT,PERCENT,PAGES,SIZE,DIRTY,WRITEBACK,FILE.")]
pub struct PagecacheArgs {
    /// Files to look at (directories too, with --recursive).
    #[arg(value_name = "PATH", required_unless_present = "drop_all")]
    pub paths: Vec<PathBuf>,

    /// Descend into directories (symbolic links inside them are not followed).
    #[arg(short, long)]
    pub recursive: bool,

    /// Evict the range: POSIX_FADV_DONTNEED, after fdatasync where pages may be dirty (best
    /// effort: shows what stays).
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
    /// sizes as everywhere in gpumap (dd suffixes: 4K = 4KiB = 4096, 4KB = 4000).
    #[arg(long, value_name = "OFF:LEN", value_parser = parse_range)]
    pub range: Option<ByteRange>,

    /// Print one JSON document (files, errors, total) instead of a table (see
    /// docs/cli-json.md).
    #[arg(long)]
    pub json: bool,

    /// Print only the total (and errors): for trees of many files.
    #[arg(long, conflicts_with = "map")]
    pub summary: bool,

    /// Columns of the table, comma-separated (see below).
    #[arg(short = 'o', long = "output", value_name = "LIST", value_parser = parse_columns,
          allow_hyphen_values = true)]
    pub columns: Option<Columns>,

    /// Leave out the header line.
    #[arg(long)]
    pub no_headings: bool,

    /// Draw a residency bar per file, like `vmtouch -v` ('O' all pages of a cell resident,
    /// 'o' some, ' ' none, '?' unknown); with --json, list the resident byte runs.
    #[arg(long)]
    pub map: bool,

    /// Width of the --map bar in cells, 1 to 4096.
    #[arg(long, value_name = "CELLS", default_value_t = 60, requires = "map",
          value_parser = clap::value_parser!(u16).range(1..=MAX_MAP_WIDTH))]
    pub map_width: u16,

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

/// The widest `--map` bar: wider than any terminal, and bounded before anything is allocated.
const MAX_MAP_WIDTH: i64 = 4096;

/// Parse `OFF:LEN`, `OFF:` or `:LEN` (sizes as [`size_arg`] reads them).
fn parse_range(text: &str) -> Result<ByteRange, String> {
    let (offset, len) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not OFFSET:LENGTH (e.g. 0:1G, 4096:, :64M)"))?;
    let offset = if offset.is_empty() { 0 } else { size_arg(offset)? };
    let len = if len.is_empty() { None } else { Some(size_arg(len)?) };
    // Refused here, as a bad command line, rather than later against whichever file.
    if offset.checked_add(len.unwrap_or(0)).is_none() {
        let end = u128::from(offset) + u128::from(len.unwrap_or(0));
        return Err(format!("{text:?} ends at byte {end}, past 2^64 - 1"));
    }
    Ok(ByteRange { offset, len })
}

/// A column of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    /// Resident bytes (before -> after, with --evict).
    Resident,
    /// Resident share of the pages.
    Percent,
    /// Cached/total pages.
    Pages,
    /// Bytes looked at (the file, or the range).
    Size,
    /// Dirty pages (cachestat).
    Dirty,
    /// Pages under writeback (cachestat).
    Writeback,
    /// Evicted pages the kernel still remembers (cachestat).
    Evicted,
    /// Evicted pages that would have stayed without memory pressure (cachestat).
    RecentlyEvicted,
    /// The path.
    File,
}

impl Column {
    const ALL: [(Column, &'static str); 9] = [
        (Column::Resident, "RESIDENT"),
        (Column::Percent, "PERCENT"),
        (Column::Pages, "PAGES"),
        (Column::Size, "SIZE"),
        (Column::Dirty, "DIRTY"),
        (Column::Writeback, "WRITEBACK"),
        (Column::Evicted, "EVICTED"),
        (Column::RecentlyEvicted, "RECENTLY_EVICTED"),
        (Column::File, "FILE"),
    ];
    const DEFAULT: [Column; 7] = [
        Column::Resident,
        Column::Percent,
        Column::Pages,
        Column::Size,
        Column::Dirty,
        Column::Writeback,
        Column::File,
    ];

    fn named(name: &str) -> Option<Column> {
        let upper = name.trim().to_ascii_uppercase();
        let upper = if upper == "RES" { "RESIDENT".to_owned() } else { upper };
        Column::ALL.iter().find(|(_, n)| *n == upper).map(|(c, _)| *c)
    }

    fn header(self, ranged: bool) -> &'static str {
        match self {
            Column::Percent => "%",
            Column::Size if ranged => "RANGE",
            other => Column::ALL.iter().find(|(c, _)| *c == other).map_or("?", |(_, n)| n),
        }
    }
}

/// The columns `-o` chose, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns(Vec<Column>);

impl Default for Columns {
    fn default() -> Self {
        Columns(Column::DEFAULT.to_vec())
    }
}

/// `-o LIST`: `RES,PAGES,FILE` (these columns), `+EVICTED` (the default and these), `-DIRTY`
/// (the default without these); the forms mix after a leading `+` or `-`.
fn parse_columns(text: &str) -> Result<Columns, String> {
    let names: Vec<&str> = text.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
    let relative = names.first().is_some_and(|n| n.starts_with(['+', '-']));
    let mut columns = if relative { Columns::default().0 } else { Vec::new() };
    for name in names {
        let (remove, bare) = match name.strip_prefix('-') {
            Some(bare) => (true, bare),
            None => (false, name.strip_prefix('+').unwrap_or(name)),
        };
        let column = Column::named(bare).ok_or_else(|| {
            let known: Vec<&str> = Column::ALL.iter().map(|(_, n)| *n).collect();
            format!("unknown column {bare:?}: expected {}", known.join(", "))
        })?;
        columns.retain(|c| *c != column);
        if !remove {
            columns.push(column);
        }
    }
    if columns.is_empty() {
        return Err("no columns left".into());
    }
    Ok(Columns(columns))
}

/// One file's line of the report.
#[derive(Serialize, Debug)]
struct FileReport {
    #[serde(serialize_with = "output::lossy_path")]
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
    #[serde(serialize_with = "output::lossy_path")]
    path: PathBuf,
    error: ErrorObject,
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
    evicted_pages: Option<u64>,
    recently_evicted_pages: Option<u64>,
    errors: u64,
    /// Non-regular entries and symbolic links met while descending (not followed).
    skipped: u64,
}

/// The `--json` document (schema 1); `files` is left out with `--summary`.
#[derive(Serialize, Debug)]
struct Report {
    schema: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    files: Option<Vec<FileReport>>,
    errors: Vec<ErrorReport>,
    total: Total,
}

/// Run `gpumap pagecache`; failure when any path failed (the others are still processed).
pub fn run(args: &PagecacheArgs) -> CliResult {
    if args.drop_all {
        return drop_all(args);
    }
    // clap lets `--dentries` through beside paths (its `requires` yields to the conflict).
    if args.dentries {
        return Err(CliError::Usage("--dentries applies to --drop-all only".into()));
    }
    let progress = Progress::new(args.recursive);
    let files = (!args.summary).then(Vec::new);
    let mut report = Report { schema: SCHEMA, files, errors: Vec::new(), total: Total::default() };
    let mut locks: Vec<LockedRange> = Vec::new();
    for path in &args.paths {
        visit(path, args, true, &mut report, &mut locks, &progress);
    }
    progress.finish();
    report.total.errors = report.errors.len() as u64;

    if args.json {
        output::json(&report)?;
    } else {
        output::print_with(|out| print_table(out, &report, args))?;
    }
    if !locks.is_empty() {
        hold(&locks);
    }
    match report.total.errors {
        0 => Ok(()),
        failed => Err(CliError::PathsFailed { failed }),
    }
}

fn drop_all(args: &PagecacheArgs) -> CliResult {
    pagecache::drop_system(args.dentries)?;
    let what = if args.dentries { "page cache, dentries and inodes" } else { "page cache" };
    if args.json {
        output::json(&serde_json::json!({ "schema": SCHEMA, "dropped": what }))
    } else {
        output::try_line(format!("dropped the system's clean {what}"))
    }
}

/// Keep the locks until the process is interrupted; the kernel unlocks on exit.
fn hold(locks: &[LockedRange]) -> ! {
    let bytes: u64 = locks.iter().map(LockedRange::locked_bytes).sum();
    output::note(format!(
        "holding {} locked in {} file(s); interrupt (Ctrl-C) to release",
        format_size(bytes, false),
        locks.len()
    ));
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
        Err(e) => return fail(report, progress, path, io_error("stat", path, e)),
    };
    let kind = metadata.file_type();
    if kind.is_dir() {
        if !args.recursive {
            let error = ErrorObject {
                kind: "is_a_directory",
                message: "is a directory (use --recursive)".into(),
                errno: Some(libc::EISDIR),
            };
            return fail(report, progress, path, error);
        }
        let mut entries: Vec<PathBuf> = match fs::read_dir(path) {
            Ok(dir) => dir.filter_map(|entry| entry.ok().map(|e| e.path())).collect(),
            Err(e) => return fail(report, progress, path, io_error("read directory", path, e)),
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
            if let Some(files) = &mut report.files {
                files.push(file);
            }
        }
        Err(e) => fail(report, progress, path, ErrorObject::new(&CliError::Gpumap(e))),
    }
}

fn io_error(op: &'static str, path: &Path, e: std::io::Error) -> ErrorObject {
    ErrorObject::new(&CliError::Gpumap(gpumap::Error::Io {
        op,
        path: Some(path.to_path_buf()),
        offset: None,
        source: e,
    }))
}

fn fail(report: &mut Report, progress: &Progress, path: &Path, error: ErrorObject) {
    let shown = path.display().to_string();
    // Most messages name the path already; the others get it in front.
    let line = if error.message.contains(&shown) {
        format!("gpumap pagecache: {}", error.message)
    } else {
        format!("gpumap pagecache: {shown}: {}", error.message)
    };
    progress.suspend(|| tracing::error!(target: crate::logging::REPORT, "{line}"));
    report.errors.push(ErrorReport { path: path.to_path_buf(), error });
}

fn process_file(
    path: &Path,
    args: &PagecacheArgs,
    locks: &mut Vec<LockedRange>,
) -> gpumap::Result<FileReport> {
    let range = args.range.unwrap_or(ByteRange::ALL);
    let mut before_evict = None;
    let mut after_evict = None;
    let mut locked_bytes = None;
    if args.evict {
        let report = pagecache::evict(path, range)?;
        before_evict = Some(report.before);
        after_evict = Some(report.after);
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
    } else if let (Some(after), MethodArg::Auto) = (after_evict, args.method) {
        // The eviction looked already: a second open and count per file would cost a tree of
        // small files a third more.
        (after, None)
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
    total.files += 1;
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
    if let Some(e) = r.evicted_pages {
        *total.evicted_pages.get_or_insert(0) += e;
    }
    if let Some(e) = r.recently_evicted_pages {
        *total.recently_evicted_pages.get_or_insert(0) += e;
    }
}

/// One row's cell for `column`.
fn cell(column: Column, r: &Residency, raw: bool) -> String {
    let pages = |count: Option<u64>| count.map_or("-".to_owned(), |n| n.to_string());
    match column {
        Column::Resident => r.cached_bytes().map_or("?".to_owned(), |b| format_size(b, raw)),
        Column::Percent if r.total_pages == 0 => "-".to_owned(),
        Column::Percent => r.fraction().map_or("?".to_owned(), |f| format!("{:.1}%", f * 100.0)),
        Column::Pages => format!(
            "{}/{}",
            r.cached_pages.map_or("?".to_owned(), |c| c.to_string()),
            r.total_pages
        ),
        Column::Size => format_size(r.len, raw),
        Column::Dirty => pages(r.dirty_pages),
        Column::Writeback => pages(r.writeback_pages),
        Column::Evicted => pages(r.evicted_pages),
        Column::RecentlyEvicted => pages(r.recently_evicted_pages),
        Column::File => String::new(),
    }
}

fn total_cell(column: Column, t: &Total, raw: bool) -> String {
    let pages = |count: Option<u64>| count.map_or("-".to_owned(), |n| n.to_string());
    match column {
        Column::Resident => format_size(t.cached_bytes, raw),
        Column::Percent if t.total_pages == 0 => "-".to_owned(),
        Column::Percent => {
            format!("{:.1}%", t.cached_pages as f64 * 100.0 / t.total_pages as f64)
        }
        Column::Pages => format!("{}/{}", t.cached_pages, t.total_pages),
        Column::Size => format_size(t.bytes, raw),
        Column::Dirty => pages(t.dirty_pages),
        Column::Writeback => pages(t.writeback_pages),
        Column::Evicted => pages(t.evicted_pages),
        Column::RecentlyEvicted => pages(t.recently_evicted_pages),
        Column::File => {
            let mut label = format!("total ({} files", t.files);
            for (count, what) in
                [(t.unknown_files, "unknown"), (t.errors, "errors"), (t.skipped, "skipped")]
            {
                if count > 0 {
                    label += &format!(", {count} {what}");
                }
            }
            label + ")"
        }
    }
}

fn print_table(out: &mut dyn Write, report: &Report, args: &PagecacheArgs) -> std::io::Result<()> {
    let raw = args.bytes;
    let columns = args.columns.clone().unwrap_or_default().0;
    let files = report.files.as_deref().unwrap_or_default();
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(files.len());
    for file in files {
        let row = columns
            .iter()
            .map(|&column| match column {
                Column::File => output::shown(&file.path),
                Column::Resident => {
                    let after = cell(column, &file.residency, raw);
                    match file.before_evict.as_ref().and_then(Residency::cached_bytes) {
                        Some(before) => format!("{} -> {after}", format_size(before, raw)),
                        None => after,
                    }
                }
                other => cell(other, &file.residency, raw),
            })
            .collect();
        rows.push(row);
    }
    let total_row: Vec<String> =
        columns.iter().map(|&column| total_cell(column, &report.total, raw)).collect();
    let header: Vec<String> =
        columns.iter().map(|c| c.header(args.range.is_some()).to_owned()).collect();

    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows.iter().chain(std::iter::once(&total_row)) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut text = String::new();
        for (i, ((cell, width), column)) in cells.iter().zip(&widths).zip(&columns).enumerate() {
            let last = i + 1 == cells.len();
            match (column, last) {
                (_, true) if *column == Column::File => text += cell,
                (Column::File, _) => text += &format!("{cell:<width$}  "),
                (_, true) => text += &format!("{cell:>width$}"),
                _ => text += &format!("{cell:>width$}  "),
            }
        }
        text
    };
    if !args.no_headings {
        writeln!(out, "{}", line(&header))?;
    }
    // A reason is printed the first time it comes up, not on every file it applies to.
    let mut reasons_shown: HashSet<&str> = HashSet::new();
    for (row, file) in rows.iter().zip(files) {
        writeln!(out, "{}", line(row))?;
        if let Some(map) = &file.map {
            writeln!(out, "{:indent$}{}", "", bar(map, usize::from(args.map_width)), indent = 2)?;
        }
        if let Some(reason) = &file.residency.unknown_reason {
            if reasons_shown.insert(reason) {
                writeln!(out, "  (unknown: {reason})")?;
            }
        }
    }
    writeln!(out, "{}", line(&total_row))
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
        let shown = recursive && !output::quiet() && std::io::stderr().is_terminal();
        let bar = shown.then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress { bar }
    }

    fn tick(&self, file: &FileReport) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
            bar.set_message(format!("{} files; {}", bar.position(), output::shown(&file.path)));
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
    use proptest::prelude::*;

    #[test]
    fn ranges_parse_sizes_as_everywhere_else() {
        assert_eq!(parse_range("0:1G"), Ok(ByteRange::new(0, 1 << 30)));
        assert_eq!(parse_range("4096:"), Ok(ByteRange::from_offset(4096)));
        assert_eq!(parse_range(":64MiB"), Ok(ByteRange::new(0, 64 << 20)));
        assert_eq!(parse_range("1k:2K"), Ok(ByteRange::new(1024, 2048)));
        // dd: B after the prefix means powers of 1000, as in `gpumap read --len`.
        assert_eq!(parse_range("0:4MB"), Ok(ByteRange::new(0, 4_000_000)));
        assert_eq!(parse_range("0:4mb"), Ok(ByteRange::new(0, 4_000_000)));
        assert_eq!(parse_range("4KB:"), size_arg("4KB").map(ByteRange::from_offset));
        assert!(parse_range("10").is_err());
        assert!(parse_range("x:1").is_err());
        assert!(parse_range("1Q:1").is_err());
        assert!(parse_range("99999999999T:1").is_err());
    }

    #[test]
    fn ranges_that_end_past_2_64_are_refused_naming_both_parts() {
        let err = parse_range("15E:1E").unwrap_err();
        assert!(err.contains("15E:1E") && err.contains("18446744073709551616"), "{err}");
        assert!(parse_range("18446744073709551615:1").is_err());
        assert_eq!(parse_range("18446744073709551614:1"), Ok(ByteRange::new(u64::MAX - 1, 1)));
        assert_eq!(parse_range("18446744073709551615:"), Ok(ByteRange::from_offset(u64::MAX)));
    }

    /// The rule of `--range`, written plainly: text up to the first colon is the offset (empty:
    /// 0), the rest the length (empty: to the end), each a size; the end must fit in 64 bits.
    fn model_range(text: &str) -> Option<ByteRange> {
        let colon = text.find(':')?;
        let (offset, len) = (&text[..colon], &text[colon + 1..]);
        let offset = if offset.is_empty() { 0 } else { size_arg(offset).ok()? };
        let len = if len.is_empty() { None } else { Some(size_arg(len).ok()?) };
        offset.checked_add(len.unwrap_or(0))?;
        Some(ByteRange { offset, len })
    }

    proptest! {
        #[test]
        fn ranges_agree_with_the_model(text in prop_oneof![
            any::<String>(),
            "[0-9]{0,21}[kKmMgGeEiIbB]{0,3}:{0,2}[0-9]{0,21}[kKmMgGeEiIbB ]{0,3}",
            (any::<u64>(), any::<u64>())
                .prop_map(|(o, l)| format!("{o}:{l}")),
        ]) {
            prop_assert_eq!(parse_range(&text).ok(), model_range(&text), "{:?}", text);
        }
    }

    #[test]
    fn columns_parse_like_fincore() {
        use Column::*;
        assert_eq!(parse_columns("res,pages,FILE"), Ok(Columns(vec![Resident, Pages, File])));
        let mut with_evicted = Columns::default().0;
        with_evicted.push(Evicted);
        assert_eq!(parse_columns("+EVICTED"), Ok(Columns(with_evicted)));
        assert_eq!(
            parse_columns("-DIRTY,-writeback"),
            Ok(Columns(vec![Resident, Percent, Pages, Size, File]))
        );
        assert!(parse_columns("RES,BOGUS").unwrap_err().contains("BOGUS"));
        assert!(parse_columns("-RES,-PERCENT,-PAGES,-SIZE,-DIRTY,-WRITEBACK,-FILE").is_err());
    }

    #[test]
    fn sizes_format() {
        assert_eq!(format_size(0, false), "0 B");
        assert_eq!(format_size(1536, false), "1.5 KiB");
        assert_eq!(format_size(3 << 30, false), "3.0 GiB");
        assert_eq!(format_size(1536, true), "1536");
    }
}
