//! For the CLI tests that send Ctrl-C (apart from `common`, which tests that forbid unsafe code
//! also include).

/// `cmd` set to start with `SIGINT` at its default action. A shell without job control starts
/// background commands with it ignored, and a test run so would otherwise send Ctrl-C to a
/// `gpumap` that, like any program, keeps the disposition it was given.
pub fn with_default_sigint(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal(2) is async-signal-safe, as a pre_exec hook must be, and takes no pointers.
    unsafe {
        cmd.pre_exec(|| {
            if libc::signal(libc::SIGINT, libc::SIG_DFL) == libc::SIG_ERR {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}
