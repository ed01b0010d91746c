//! Cleanup when the process is told to stop (`SIGINT`, `SIGTERM`, `SIGHUP`): a handler that
//! only writes the signal's number to a pipe, and a thread that reads it, runs the cleanup and
//! then lets the signal end the process as it would have.
//!
//! The handler does nothing but `write(2)`, which is async-signal-safe; the cleanup (taking
//! locks, removing files) runs on an ordinary thread, where anything is allowed.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// The pipe's write end, for the handler (`-1` until installed).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

/// Set once a signal has woken the cleanup thread: the process is ending by it.
static ENDING: AtomicBool = AtomicBool::new(false);

/// Whether a signal taken by [`on_termination`] is ending the process (its cleanup running or
/// done): the cleanup thread then ends it by that signal within moments.
pub fn ending() -> bool {
    ENDING.load(Ordering::SeqCst)
}

extern "C" fn on_signal(signal: libc::c_int) {
    let fd = WAKE_FD.load(Ordering::Relaxed);
    let byte = signal as u8;
    // SAFETY: write(2) is async-signal-safe; `byte` lives on this frame for the call. The
    // write end is non-blocking, so a full pipe cannot stall the interrupted thread.
    unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
}

/// Runs `cleanup` on a thread of its own when one of `signals` arrives, then ends the process
/// with that signal's default action (so the parent sees "killed by SIGINT", as without
/// gpumap). Only signals whose disposition is the default are taken: a program that handles
/// or ignores one itself (`nohup` ignores `SIGHUP`) keeps it. Call once per process.
pub fn on_termination(signals: &[libc::c_int], cleanup: fn()) -> io::Result<()> {
    let mut fds = [-1 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [read_end, write_end] = fds;
    // SAFETY: F_SETFL takes an integer; `write_end` was just created and is open.
    if unsafe { libc::fcntl(write_end, libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `read_end` is a descriptor pipe2 just returned and nothing else owns.
    let mut wake = unsafe { File::from_raw_fd(read_end) };
    WAKE_FD.store(write_end, Ordering::Relaxed);
    let thread = std::thread::Builder::new().name("gpumap-signals".into());
    super::posix::spawn_apart_from_fork(|| {
        thread.spawn(move || {
            let mut byte = [0u8; 1];
            // Only a closed or broken pipe fails here (EINTR is retried): then there is nothing
            // to wait for.
            if wake.read_exact(&mut byte).is_err() {
                return;
            }
            ENDING.store(true, Ordering::SeqCst);
            cleanup();
            let signal = libc::c_int::from(byte[0]);
            // SAFETY: restoring the default disposition and raising the signal take no pointers
            // but the null old-action pointer, which sigaction allows.
            unsafe {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
                libc::raise(signal);
            }
            // Only reached where the signal is blocked in this thread: end as a shell would report.
            std::process::exit(128 + signal);
        })
    })?;
    for &signal in signals {
        // SAFETY: a zeroed sigaction is a valid value to read the current one into; the new
        // action points at `on_signal`, an `extern "C" fn(c_int)` that lives for the whole
        // program, with an empty mask.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0
                || current.sa_sigaction != libc::SIG_DFL
            {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Makes a write past the file size limit (`ulimit -f`, `RLIMIT_FSIZE`) fail with `EFBIG`,
/// which the write's error then names with its file and offset, instead of `SIGXFSZ` killing
/// the process (no report, and scratch files left behind). Only where the signal's disposition
/// is the default: a program that handles it keeps it. Returns whether it was changed.
pub fn file_size_limit_as_error() -> io::Result<bool> {
    // SAFETY: a zeroed sigaction is a valid value to read the current one into; the new action
    // is SIG_IGN with an empty mask, which takes no pointers.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGXFSZ, std::ptr::null(), &mut current) != 0 {
            return Err(io::Error::last_os_error());
        }
        if current.sa_sigaction != libc::SIG_DFL {
            return Ok(false);
        }
        let mut ignore: libc::sigaction = std::mem::zeroed();
        ignore.sa_sigaction = libc::SIG_IGN;
        libc::sigemptyset(&mut ignore.sa_mask);
        if libc::sigaction(libc::SIGXFSZ, &ignore, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(true)
}
