//! Standard output that survives a closed pipe (`gpumap info --json | head -1`).

use std::io::Write;

/// Prints `text` and a newline. When the reader has gone (`EPIPE`), exits at once with the
/// status a SIGPIPE death would give (141), as `cat` and `grep` do, instead of panicking the
/// way `println!` does.
pub fn line(text: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{text}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        eprintln!("gpumap: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}
