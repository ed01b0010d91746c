//! Clocks around the measured work: best of several runs, work spread over threads, futures
//! waited for, shell baselines.

use std::process::Command;
use std::time::Instant;

use gpumap::error::{Error, Result};

use crate::files::io_error;

/// The fastest of `repeats` measurements: the slower ones mostly time whatever else the
/// machine was doing.
pub(crate) fn best_of(repeats: usize, mut measure: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        best = best.min(measure()?);
    }
    Ok(best)
}

/// Times all `futures` to completion after `start`.
pub(crate) fn wait_all<T>(start: Instant, futures: Vec<gpumap::io::IoFuture<T>>) -> Result<f64> {
    for f in futures {
        f.wait()?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Runs `work(thread, item)` on every item from `threads` threads (each taking the next item),
/// and returns the seconds until all are done.
pub(crate) fn in_threads<T: Sync>(
    threads: usize,
    items: Vec<T>,
    work: impl Fn(usize, &T) -> Result<()> + Sync,
) -> Result<f64> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let (next, items, work) = (&next, &items, &work);
                s.spawn(move || -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { return Ok(()) };
                        work(thread, item)?;
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| Error::InvalidArgument("a bench thread panicked".into()))??;
        }
        Ok(())
    })?;
    Ok(t.elapsed().as_secs_f64())
}

/// Runs a baseline command (`dd`, `cat`) through `sh` and times it; a failure is an error, not
/// a figure.
pub(crate) fn time_shell(cmd: &str) -> Result<f64> {
    let t = Instant::now();
    let status = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .status()
        .map_err(|e| io_error("run baseline command", None, e))?;
    if !status.success() {
        return Err(Error::InvalidArgument(format!("baseline `{cmd}` failed: {status}")));
    }
    Ok(t.elapsed().as_secs_f64())
}
