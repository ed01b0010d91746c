//! The cache under many threads: views, writes, gathers, flushes and evictions at once, on
//! host memory and (where there is one) the GPU, checked against byte vectors; the budget is
//! checked from the stats at every step.
//!
//! `GPUMAP_STRESS_SECS` sets how long each randomized run lasts (default 2 s per pool size and
//! backend in CI; run it for minutes by hand).

#[macro_use]
mod common;

use std::fs;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{random_bytes, retry};
use gpumap::io::{FileHandle, IoPool};
use gpumap::mapped::{CacheOptions, DeviceCache, MapOptions};
use gpumap::memory::{Device, DeviceBuffer};
use gpumap::sync::Mutex;

const MIB: u64 = 1 << 20;
const FRAME: u64 = 2 * MIB;

on_host_and_gpu!(
    sixteen_threads_three_files_one_cache,
    sixteen_threads_three_files_four_shards,
    randomized_concurrent_views_writes_flushes_and_evictions,
);

fn scratch() -> tempfile::TempDir {
    let base =
        std::env::var("GPUMAP_BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

fn stress_time() -> Duration {
    let secs = std::env::var("GPUMAP_STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

/// xorshift64: each thread's own sequence of choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Sixteen threads over three files in one cache: random single-extent and wide views and
/// gathers of two read-only files, writes to each thread's own stripe of the third; the budget
/// is never exceeded, checked after every operation, and every byte read matches.
fn sixteen_threads_three_files_one_cache(memory: Device) {
    sixteen_threads_three_files(memory, 6, 1);
}

/// The same with the budget in four shards of two frames: views wider than an extent cross
/// shards, and each shard's share is crowded.
fn sixteen_threads_three_files_four_shards(memory: Device) {
    sixteen_threads_three_files(memory, 8, 4);
}

fn sixteen_threads_three_files(memory: Device, frames: u64, shards: usize) {
    let dir = scratch();
    let budget = frames * FRAME;
    let cache = CacheOptions::new()
        .memory(memory.clone())
        .frame_size(FRAME)
        .budget(budget)
        .extent_size(4096)
        .shards(shards)
        .build()
        .unwrap();
    assert_eq!(cache.shards(), shards);
    let lens = [24 * MIB + 5, 17 * MIB];
    let mut datas = Vec::new();
    let mut maps = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        let path = dir.path().join(format!("ro-{i}"));
        let data = random_bytes(len as usize, i as u64 + 1);
        fs::write(&path, &data).unwrap();
        datas.push(data);
        maps.push(cache.open(&path).unwrap());
    }
    let rw_path = dir.path().join("rw");
    let stripe = 256 << 10;
    fs::write(&rw_path, vec![0u8; 16 * stripe]).unwrap();
    let rw = cache.open_with(&rw_path, MapOptions::new().writable(true)).unwrap();
    let models: Vec<Mutex<Vec<u8>>> = (0..16).map(|_| Mutex::new(vec![0u8; stripe])).collect();
    let deadline = Instant::now() + stress_time();
    let memory = &memory;
    std::thread::scope(|s| {
        for t in 0..16u64 {
            let (cache, maps, datas, rw, models) = (&cache, &maps, &datas, &rw, &models);
            s.spawn(move || {
                let mut rng = Rng(0x9E37_79B9 ^ ((t + 1) * 0x5851_F42D));
                while Instant::now() < deadline {
                    let f = rng.below(2) as usize;
                    let len = lens[f];
                    match rng.below(4) {
                        0 => {
                            let n = 1 + rng.below(4096);
                            let o = rng.below(len - n);
                            // Within one extent it comes from a slot; across an extent
                            // border it is contiguous (frames), and may have to wait.
                            let view = retry(|| maps[f].view(o, n));
                            let mut got = vec![0u8; n as usize];
                            view.copy_to_host(0, &mut got).unwrap();
                            assert!(got[..] == datas[f][o as usize..][..n as usize]);
                        }
                        1 => {
                            let n = 1 + rng.below(FRAME);
                            let o = rng.below(len - n);
                            let view = retry(|| maps[f].view(o, n));
                            let mut got = [0u8; 64];
                            view.copy_to_host(n - 64.min(n), &mut got[..64.min(n) as usize])
                                .unwrap();
                        }
                        2 => {
                            // Now and then thousands of rows: on host memory, their copies
                            // are shared among the pool's threads.
                            let count = if rng.below(16) == 0 { 3_000 } else { 64 };
                            let rows: Vec<(u64, u64)> = (0..count)
                                .map(|_| (rng.below(len - 4096), 1 + rng.below(4096)))
                                .collect();
                            let total: u64 = rows.iter().map(|r| r.1).sum();
                            let mut dst =
                                DeviceBuffer::zeroed(&cache.device(), total as usize).unwrap();
                            retry(|| maps[f].gather(&rows, dst.view_mut()));
                            let got = dst.to_vec().unwrap();
                            let mut at = 0usize;
                            for &(o, n) in &rows {
                                assert!(
                                    got[at..at + n as usize]
                                        == datas[f][o as usize..][..n as usize]
                                );
                                at += n as usize;
                            }
                        }
                        _ => {
                            let o = rng.below(stripe as u64 - 100);
                            let bytes = random_bytes(100, rng.next());
                            let at = t * stripe as u64 + o;
                            retry(|| rw.write(at, &bytes));
                            models[t as usize].lock()[o as usize..][..100].copy_from_slice(&bytes);
                            if rng.below(8) == 0 {
                                rw.flush_range(t * stripe as u64, stripe as u64).unwrap();
                            }
                        }
                    }
                    let stats = cache.stats();
                    assert!(stats.used_bytes <= stats.budget, "{memory:?}: {stats:?}");
                }
            });
        }
    });
    rw.close().unwrap();
    let on_disk = fs::read(&rw_path).unwrap();
    for (t, model) in models.iter().enumerate() {
        assert!(on_disk[t * stripe..][..stripe] == model.lock()[..], "{memory:?}: stripe {t}");
    }
    let totals = cache.stats().totals;
    assert!(totals.hits + totals.misses > 0);
}

/// Workers write their own stripes of one file through writable views — sometimes keeping a
/// view alive while others flush — and read them back; a chaos thread flushes, flushes ranges,
/// evicts, calls `evict()` and reads everywhere; budgets of two and three frames force
/// evictions of dirty frames all the time. Pool sizes 1, 2, 3, 8 and 16; then pool sizes 3 and
/// 16 with the budget in two shards of two frames. The file must equal the model at the end,
/// and every read must match while running.
fn randomized_concurrent_views_writes_flushes_and_evictions(memory: Device) {
    let time = stress_time();
    for threads in [1usize, 2, 3, 8, 16] {
        run_randomized(memory.clone(), threads, 1, time);
    }
    for threads in [3usize, 16] {
        run_randomized(memory.clone(), threads, 2, time);
    }
}

/// Sets its flag when dropped, unwinding included.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What each thread of a randomized run is doing (workers 0-3, the chaos thread 4), how many
/// operations were done, and the cache's last stats: what a hung run reports.
#[derive(Default)]
struct Progress {
    phases: [AtomicU8; 5],
    ops: AtomicU64,
    stats: Mutex<String>,
}

const PHASES: [&str; 11] = [
    "between operations",
    "view_mut",
    "writing through a writable view",
    "keeping a writable view alive",
    "view",
    "reading through a view",
    "flush",
    "flush_range",
    "evict",
    "read",
    "done",
];

/// A randomized run on a thread of its own under a watchdog: a run that does not end within its
/// time plus 90 s fails with what every thread was doing, instead of hanging the test binary.
fn run_randomized(memory: Device, threads: usize, shards: usize, time: Duration) {
    let progress = Arc::new(Progress::default());
    let (done, finished) = std::sync::mpsc::channel();
    let name = format!("{memory:?} pool {threads}, {shards} shards");
    {
        let progress = Arc::clone(&progress);
        std::thread::spawn(move || {
            randomized_run(memory, threads, shards, time, &progress);
            let _ = done.send(());
        });
    }
    let limit = time + Duration::from_secs(90);
    match finished.recv_timeout(limit) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("{name}: the run panicked (its message is above)")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            let phases: Vec<String> = progress
                .phases
                .iter()
                .enumerate()
                .map(|(t, p)| {
                    let who = if t < 4 { format!("worker {t}") } else { "chaos".to_owned() };
                    format!("{who}: {}", PHASES[p.load(Ordering::Relaxed) as usize])
                })
                .collect();
            panic!(
                "{name}: no end after {limit:?} (hung): {} operations; {}; last stats {}",
                progress.ops.load(Ordering::Relaxed),
                phases.join(", "),
                progress.stats.lock()
            );
        }
    }
}

fn randomized_run(
    memory: Device,
    threads: usize,
    shards: usize,
    time: Duration,
    progress: &Progress,
) {
    let phase = |t: usize, p: u8| progress.phases[t].store(p, Ordering::Relaxed);
    let dir = scratch();
    let path = dir.path().join("chaos");
    let workers = 4usize;
    let stripe = (2 * MIB) as usize;
    let mut initial = random_bytes(workers * stripe, threads as u64);
    initial.truncate(workers * stripe);
    fs::write(&path, &initial).unwrap();
    let mut handle = FileHandle::options().unwrap();
    handle.pool(Arc::new(IoPool::new(threads).unwrap())).task_size(128 << 10);
    let cache: DeviceCache = CacheOptions::new()
        .memory(memory.clone())
        .frame_size(FRAME)
        .budget(if shards == 1 { 2 + threads as u64 % 2 } else { 2 * shards as u64 } * FRAME)
        .extent_size(4096)
        .shards(shards)
        .build()
        .unwrap();
    let map =
        cache.open_with(&path, MapOptions::new().writable(true).handle_options(handle)).unwrap();
    let models: Vec<Mutex<Vec<u8>>> =
        (0..workers).map(|w| Mutex::new(initial[w * stripe..(w + 1) * stripe].to_vec())).collect();
    let stop = AtomicBool::new(false);
    let ops = &progress.ops;
    let started = Instant::now();
    let deadline = started + time;
    let memory = &memory;
    std::thread::scope(|s| {
        for w in 0..workers {
            let (map, models, stop, phase) = (&map, &models, &stop, &phase);
            s.spawn(move || {
                let mut rng = Rng(0xD1B5_4A32_D192_ED03 ^ ((w as u64 + 7) * 0x2545_F491));
                let base = (w * stripe) as u64;
                while !stop.load(Ordering::Relaxed) {
                    let o = rng.below(stripe as u64 - 9000);
                    let n = 1 + rng.below(9000);
                    if rng.below(2) == 0 {
                        let bytes = random_bytes(n as usize, rng.next());
                        phase(w, 1);
                        let mut view = retry(|| map.view_mut(base + o, n));
                        phase(w, 2);
                        view.copy_from_host(0, &bytes).unwrap();
                        models[w].lock()[o as usize..][..n as usize].copy_from_slice(&bytes);
                        if rng.below(3) == 0 {
                            phase(w, 3);
                            // Keep it alive a little while the chaos thread flushes.
                            std::thread::sleep(Duration::from_micros(rng.below(300)));
                            let late = random_bytes(n as usize, rng.next());
                            view.copy_from_host(0, &late).unwrap();
                            models[w].lock()[o as usize..][..n as usize].copy_from_slice(&late);
                        }
                    } else {
                        phase(w, 4);
                        let view = retry(|| map.view(base + o, n));
                        phase(w, 5);
                        let mut got = vec![0u8; n as usize];
                        view.copy_to_host(0, &mut got).unwrap();
                        assert!(
                            got[..] == models[w].lock()[o as usize..][..n as usize],
                            "{memory:?} pool {threads}: worker {w} read {o}+{n}"
                        );
                    }
                    phase(w, 0);
                    ops.fetch_add(1, Ordering::Relaxed);
                }
                phase(w, 10);
            });
        }
        let (map, stop, cache, phase) = (&map, &stop, &cache, &phase);
        s.spawn(move || {
            // Stops the workers however this thread ends: a panic here must fail the test,
            // not leave the workers running forever.
            let _stop = StopOnDrop(stop);
            let mut rng = Rng(42 + threads as u64);
            while Instant::now() < deadline {
                match rng.below(5) {
                    0 => {
                        phase(4, 6);
                        map.flush().unwrap()
                    }
                    1 => {
                        phase(4, 7);
                        let o = rng.below(map.len() - 1);
                        map.flush_range(o, rng.below(map.len() - o)).unwrap();
                    }
                    2 => {
                        phase(4, 8);
                        map.evict().unwrap()
                    }
                    _ => {
                        phase(4, 9);
                        let o = rng.below(map.len() - 70_000);
                        let mut got = vec![0u8; 70_000];
                        retry(|| map.read(o, &mut got));
                    }
                }
                phase(4, 0);
                let stats = cache.stats();
                *progress.stats.lock() = format!("{stats:?}");
                assert!(stats.used_bytes <= stats.budget, "{stats:?}");
            }
            phase(4, 10);
        });
    });
    map.close().unwrap();
    let on_disk = fs::read(&path).unwrap();
    for (w, model) in models.iter().enumerate() {
        assert!(
            on_disk[w * stripe..][..stripe] == model.lock()[..],
            "{memory:?} pool {threads}: stripe {w} lost writes"
        );
    }
    eprintln!(
        "randomized {memory:?}, pool {threads}, {shards} shards: {} operations in {:.2?} (asked for {time:?})",
        ops.load(Ordering::Relaxed),
        started.elapsed()
    );
}
