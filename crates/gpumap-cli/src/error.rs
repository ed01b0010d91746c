//! What can make a `gpumap` command fail, and the exit status each failure gives.

use std::fmt;

use gpumap::error::Report;

/// Exit status of a command whose data check (`--verify`, `--verify-pattern`) found a
/// difference: the transfer ran, the bytes are wrong.
pub const EXIT_DATA_DIFFER: u8 = 3;
/// Exit status of a command line the parser or a command refused (clap's own status).
pub const EXIT_USAGE: u8 = 2;
/// Exit status when standard output was closed by its reader (`| head`): what a death by
/// `SIGPIPE` gives in a shell, as for `cat` or `grep`.
pub const EXIT_CLOSED_PIPE: u8 = 141;

/// A failed command.
#[derive(Debug)]
pub enum CliError {
    /// The library failed (I/O, a bad setting, a missing GPU, ...).
    Gpumap(gpumap::Error),
    /// A data check found bytes other than expected.
    DataDiffer {
        /// File offset of the first differing byte.
        offset: u64,
        /// Where the bytes were checked (`"host memory"`, `"GPU 0"`).
        memory: String,
        /// What they were checked against.
        reference: &'static str,
    },
    /// Arguments that are valid one by one but not together, or a value out of its range.
    Usage(String),
    /// Some paths of a multi-path command failed; each was reported where it failed.
    PathsFailed {
        /// How many.
        failed: u64,
    },
    /// Standard output was closed by its reader.
    ClosedPipe,
    /// The library failed, and the command knows what the person can do about it.
    Hinted {
        /// What failed.
        error: gpumap::Error,
        /// What to do instead.
        hint: String,
    },
}

pub type CliResult<T = ()> = Result<T, CliError>;

impl CliError {
    /// The process exit status.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Gpumap(_) | CliError::Hinted { .. } | CliError::PathsFailed { .. } => 1,
            CliError::Usage(_) => EXIT_USAGE,
            CliError::DataDiffer { .. } => EXIT_DATA_DIFFER,
            CliError::ClosedPipe => EXIT_CLOSED_PIPE,
        }
    }

    /// The stable name scripts see as `error.kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            CliError::Gpumap(e) | CliError::Hinted { error: e, .. } => e.code(),
            CliError::DataDiffer { .. } => "data_differ",
            CliError::Usage(_) => "usage",
            CliError::PathsFailed { .. } => "paths_failed",
            CliError::ClosedPipe => "closed_pipe",
        }
    }

    /// The OS error number, where the failure was a system call's.
    pub fn errno(&self) -> Option<i32> {
        match self {
            CliError::Gpumap(e) | CliError::Hinted { error: e, .. } => e.raw_os_error(),
            CliError::ClosedPipe => Some(libc::EPIPE),
            _ => None,
        }
    }

    /// Whether the failure was already reported where it happened (nothing more to print).
    pub fn is_reported(&self) -> bool {
        matches!(self, CliError::PathsFailed { .. } | CliError::ClosedPipe)
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Gpumap(e) => write!(f, "{}", Report(e)),
            CliError::Hinted { error, hint } => write!(f, "{}; {hint}", Report(error)),
            CliError::DataDiffer { offset, memory, reference } => {
                write!(f, "data differ at offset {offset}: {memory} against {reference}")
            }
            CliError::Usage(message) => f.write_str(message),
            CliError::PathsFailed { failed } => write!(f, "{failed} path(s) failed"),
            CliError::ClosedPipe => f.write_str("standard output was closed"),
        }
    }
}

impl From<gpumap::Error> for CliError {
    fn from(e: gpumap::Error) -> Self {
        CliError::Gpumap(e)
    }
}
