//! The host page cache as a tool: how much of a file is cached, warm it, evict it.
//!
//! Whether a file's bytes are in the page cache decides whether loading it onto a GPU runs at
//! memory speed or at disk speed, so benchmarks and loaders want to see and set it, as
//! `fincore` and `vmtouch` do. `gpumap::pagecache` answers with `cachestat(2)` (Linux 6.5+,
//! dirty pages too) or `mincore(2)`, and says "unknown" rather than a false 100% where the
//! kernel will not tell (files you may not write). This needs no GPU.
//!
//! Eviction is best effort: a file system such as tmpfs keeps every page (they are the file),
//! and the example says so instead of failing.
//!
//! Usage: cargo run --release -p gpumap --example pagecache [FILE]
//! (without FILE: 32 MiB of generated data in a temporary directory, $TMPDIR or /tmp)

use std::path::Path;
use std::process::ExitCode;

use gpumap::pagecache::{self, ByteRange, ResidencyMap, WarmMode};

mod common;
use common::{input, Result};

fn run() -> Result<()> {
    let (dir, path) = input("pagecache.bin", 32 << 20)?;
    let first = pagecache::residency(&path, ByteRange::ALL)?;
    println!(
        "{}: {} bytes, {} pages of {} bytes (residency by {:?})",
        path.display(),
        first.file_size,
        first.total_pages,
        first.page_size,
        first.method
    );
    show(if dir.is_some() { "just written" } else { "as found" }, &path)?;

    // Evict: fdatasync first where pages may be dirty (a just-written file's are), then
    // POSIX_FADV_DONTNEED. The report says what stayed.
    let report = pagecache::evict(&path, ByteRange::ALL)?;
    let evicted = show("evicted", &path)?;
    let evictable = report.after.cached_pages.is_some_and(|c| c == 0);
    if !evictable {
        if let Some(stayed) = report.after.cached_pages {
            println!(
                "note: {stayed} pages stayed cached: this file system (tmpfs, for one) or a \
                 container keeps them, or another process maps them; eviction is best effort"
            );
        }
    }
    if report.after.cached_pages != evicted {
        return Err(format!(
            "evict reported {:?} pages left, a fresh look {evicted:?}",
            report.after.cached_pages
        )
        .into());
    }

    // Warm the second half by reading it. (Warming the first half would cache more than that:
    // the kernel reads ahead, up to its readahead window, and windows are larger for reads
    // advised sequential, as warm's are. It never reads behind.)
    let half = first.file_size / 2;
    pagecache::warm(&path, ByteRange::from_offset(half), WarmMode::Read)?;
    show("second half warmed", &path)?;

    // Warm all of it (WarmMode::Advise would only queue readahead and return at once). The
    // kernel may reclaim a few pages just after the warm read them (seen on a CI machine: 5 of
    // 8192, with memory to spare; pages the first eviction caught under write-back are a
    // likely cause): warm up to three times.
    for attempt in 1..=3 {
        pagecache::warm(&path, ByteRange::ALL, WarmMode::Read)?;
        let Some(cached) = show("all warmed", &path)? else { break };
        if cached == first.total_pages {
            break;
        }
        if attempt == 3 {
            return Err(format!("{cached} of {} pages cached after warm", first.total_pages).into());
        }
        println!("note: {cached} of {} pages cached; warming again", first.total_pages);
    }

    pagecache::evict(&path, ByteRange::ALL)?;
    let left = show("evicted again", &path)?;
    if evictable && left != Some(0) {
        println!("note: {left:?} pages stayed this time (pages read a moment ago can linger)");
    }
    Ok(())
}

/// Prints one line: a bar of the file (`O` a cell all cached, `o` partly, blank none) and the
/// counts; returns the cached page count (`None` when the kernel will not tell).
fn show(label: &str, path: &Path) -> Result<Option<u64>> {
    let map = pagecache::residency_map(path, ByteRange::ALL)?;
    let r = &map.residency;
    let Some(cached) = r.cached_pages else {
        println!("{label:<18} unknown: {}", r.unknown_reason.as_deref().unwrap_or("?"));
        return Ok(None);
    };
    let dirty = match r.dirty_pages {
        Some(d) if d > 0 => format!(", {d} dirty"),
        _ => String::new(),
    };
    println!(
        "{label:<18} [{}] {cached:>6} of {} pages cached ({:.0}%){dirty}",
        bar(&map, 32),
        r.total_pages,
        r.fraction().unwrap_or(0.0) * 100.0
    );
    Ok(Some(cached))
}

/// The file's pages in `cells` cells.
fn bar(map: &ResidencyMap, cells: u64) -> String {
    let per_cell = map.pages().div_ceil(cells).max(1);
    (0..map.pages().div_ceil(per_cell))
        .map(|cell| {
            let pages = cell * per_cell..((cell + 1) * per_cell).min(map.pages());
            match map.resident_pages_in(pages.clone()) {
                0 => ' ',
                n if n == pages.end - pages.start => 'O',
                _ => 'o',
            }
        })
        .collect()
}

fn main() -> ExitCode {
    common::main("pagecache", run)
}
