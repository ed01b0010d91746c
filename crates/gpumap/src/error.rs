//! The crate's one error type.
//!
//! Every fallible call returns [`Error`]. Variants carry the values that made the call fail
//! (offsets, lengths, the environment variable and its value, the CUDA status code), so that a
//! message is enough to act on without a debugger. Operating-system errors keep their
//! [`std::io::Error`] intact: [`Error::raw_os_error`] answers the errno.
//!
//! An error displays its own message and returns its cause from
//! [`source`](std::error::Error::source), never both (the convention `anyhow`'s `{:#}`,
//! `eyre` and every chain printer rely on, so that an OS error is not printed twice). To show
//! the whole chain in one line, use [`Report`]: `Report(&e).to_string()` gives
//! `"open failed on data.bin: No such file or directory (os error 2)"`.
#![forbid(unsafe_code)]

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in gpumap.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed. `source` is the untouched OS error, returned by
    /// [`source`](std::error::Error::source) (the message does not repeat it; see [`Report`]).
    #[error("{op} failed{}", Context { path: path.as_deref(), offset: *offset })]
    Io {
        /// What was being done (`"open"`, `"pread"`, `"fdatasync"`, ...).
        op: &'static str,
        /// The file it was done to, where known.
        path: Option<PathBuf>,
        /// The file offset, where the operation had one.
        offset: Option<u64>,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// A range does not lie inside the file (or buffer) it names.
    #[error("{}", out_of_range(*offset, *len, *file_len))]
    OutOfRange {
        /// Start of the requested range.
        offset: u64,
        /// Length of the requested range.
        len: u64,
        /// Length of the file (or mapping) at the time of the call.
        file_len: u64,
    },

    /// A range does not lie inside the view it is relative to (a `View` of a mapped file).
    #[error("range {offset}..{} is outside the view of {view_len} bytes (file bytes {view_offset}..{})", offset.saturating_add(*len), view_offset.saturating_add(*view_len))]
    OutOfView {
        /// Start of the requested range, relative to the view.
        offset: u64,
        /// Length of the requested range.
        len: u64,
        /// Where the view starts in its file.
        view_offset: u64,
        /// Length of the view.
        view_len: u64,
    },

    /// `offset + len` passes the largest file offset (`off_t`'s, `i64::MAX`) or 64 bits.
    #[error(
        "offset {offset} + length {len} is past the largest offset a file may have (2**63 - 1)"
    )]
    Overflow {
        /// Start of the requested range.
        offset: u64,
        /// Length of the requested range.
        len: u64,
    },

    /// A value that must be a multiple of some alignment is not.
    #[error("{what} {value} is not a multiple of {alignment}")]
    Unaligned {
        /// Which argument (`"extent size"`, `"offset"`, ...).
        what: &'static str,
        /// The offending value.
        value: u64,
        /// The alignment it must respect.
        alignment: u64,
    },

    /// The file ended before a read that needed the whole range was complete: the range lies
    /// (partly) past the end, or another process cut the file under a map.
    #[error("{} is {file_len} bytes long; bytes {offset}..{} were asked for", Named(path.as_deref()), offset.saturating_add(*wanted))]
    UnexpectedEof {
        /// The file, where known.
        path: Option<PathBuf>,
        /// Where the read started.
        offset: u64,
        /// How many bytes were asked for.
        wanted: u64,
        /// The file's length when the read came up short (its `fstat`; where that failed, the
        /// end of what the read got).
        file_len: u64,
    },

    /// A row index of a row gather is negative or past the last row of the file.
    #[error("row index {index} at position {position} is outside the file's {rows} rows")]
    RowIndex {
        /// Where in the index array the bad index is.
        position: u64,
        /// The index.
        index: i64,
        /// Rows the file has (its length over the row size, rounded down).
        rows: u64,
    },

    /// A buffer is too small for the transfer asked of it.
    #[error("buffer of {available} bytes is too small for {needed} bytes")]
    BufferTooSmall {
        /// Bytes the transfer needs.
        needed: u64,
        /// Bytes the buffer has.
        available: u64,
    },

    /// Open flags that are not one of `r`, `w`, `a`, `r+`, `w+`, `a+` (with optional `b`/`e`).
    #[error("invalid open flags {0:?}: expected one of r, w, a, r+, w+, a+")]
    InvalidFlags(String),

    /// The handle was not opened for this kind of access.
    #[error("{path} was opened {mode:?}, which does not allow {op}")]
    AccessMode {
        /// The file.
        path: PathBuf,
        /// The open flags it was opened with.
        mode: String,
        /// What was attempted (`"reading"`, `"writing"`, `"positional writes"`).
        op: &'static str,
    },

    /// An environment variable holds a value gpumap cannot use.
    #[error("environment variable {var}={value:?}: {reason}")]
    InvalidConfig {
        /// The variable's name as set (`GPUMAP_...` or its `KVIKIO_...` alias).
        var: String,
        /// Its value.
        value: String,
        /// What is wrong with it and what is accepted.
        reason: String,
    },

    /// A function argument is out of its domain (the message names it and its value).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A capability the call needs is missing on this machine (CUDA, cuFile, a device).
    #[error("{what} is not available: {reason}")]
    Unavailable {
        /// The missing thing (`"CUDA driver"`, `"cuFile"`, `"GPU 3"`).
        what: &'static str,
        /// Why, as found by probing.
        reason: String,
    },

    /// A CUDA driver call returned an error status.
    #[error("CUDA {op} failed: {name} ({code})")]
    Cuda {
        /// The driver function.
        op: &'static str,
        /// The `CUresult` value.
        code: i32,
        /// Its symbolic name (`CUDA_ERROR_OUT_OF_MEMORY`), or `"unknown"`.
        name: String,
    },

    /// A cuFile call returned an error status.
    #[error("cuFile {op} failed{}: {name} ({code})", Context { path: path.as_deref(), offset: *offset })]
    CuFile {
        /// The cuFile function.
        op: &'static str,
        /// The cuFile status (`CU_FILE_*`, 5000 and up), or the CUDA status it wraps.
        code: i64,
        /// Its symbolic name, or `"unknown"` (unknown codes are never mapped onto an enum).
        name: String,
        /// The file, where known.
        path: Option<PathBuf>,
        /// The file offset, where the call had one.
        offset: Option<u64>,
    },

    /// Device memory for a mapping or cache would exceed its budget: the request alone is larger
    /// than the budget, or the rest of the budget is pinned (by views, or by other requests
    /// for longer than the cache waits).
    #[error("{}", BudgetMessage { requested: *requested, budget: *budget, in_use: *in_use })]
    OutOfBudget {
        /// Bytes asked for.
        requested: u64,
        /// The budget.
        budget: u64,
        /// Bytes held at the time (pinned or otherwise unevictable).
        in_use: u64,
    },

    /// Writing a mapped file's dirty bytes back failed: they stay dirty, and the error sticks
    /// to the file (every flush returns it) until a `sync` writes every byte.
    #[error("write-back of {path} failed; {dirty_bytes} bytes stay dirty")]
    WriteBack {
        /// The mapped file.
        path: PathBuf,
        /// Bytes still dirty after the attempt.
        dirty_bytes: u64,
        /// What failed.
        #[source]
        source: Box<Error>,
    },

    /// A mapped file is shorter than when it was mapped (another process cut it): dirty bytes
    /// past its new end are not written (a map never changes a file's length) and stay dirty.
    #[error("{path} shrank to {len} bytes under its map of {mapped_len}; {dirty_bytes} dirty bytes past the end were not written")]
    FileShrank {
        /// The mapped file.
        path: PathBuf,
        /// Its length now.
        len: u64,
        /// Its length when it was mapped.
        mapped_len: u64,
        /// Dirty bytes past the new end.
        dirty_bytes: u64,
    },

    /// A worker task panicked; the panic message is kept. This is a bug in gpumap.
    #[error("an I/O task panicked: {0}")]
    TaskPanicked(String),

    /// The path names something other than a regular file: a FIFO (whose `open` would block
    /// until a writer came), a device such as `/dev/zero` (no end), a socket, or a file of a
    /// pseudo file system such as `/proc` (whose size says nothing about its content).
    #[error("{} is {what}, not a regular file", Named(path.as_deref()))]
    NotRegularFile {
        /// The path, where the file was given by one.
        path: Option<PathBuf>,
        /// What it is instead (`"a FIFO"`, `"a character device"`, ...).
        what: &'static str,
    },

    /// A request exceeds a resource limit of the process or the machine, checked before
    /// anything was done.
    #[error("{requested} bytes exceed {resource} ({available} bytes available): {hint}")]
    ResourceLimit {
        /// The limit (`"RLIMIT_MEMLOCK"`, `"the memory available (MemAvailable)"`).
        resource: &'static str,
        /// Bytes the call needed.
        requested: u64,
        /// Bytes the limit leaves.
        available: u64,
        /// What to do about it.
        hint: &'static str,
    },

    /// A remote object (`s3://`, `http(s)://`) could not be opened or read. The URL is shown
    /// without credentials: no user or password, and a query string (a presigned URL's
    /// signature) only as `?…`.
    #[error("{op} {url} failed{}{}: {reason}; {}", StatusText(*status), Attempts(*attempts), kind.hint_for(op))]
    Remote {
        /// The URL, credentials removed.
        url: String,
        /// What was being done (`"open"`, `"HEAD"`, `"GET bytes 0-4194303 of"`).
        op: String,
        /// What kind of failure it was, and so what to do about it.
        kind: RemoteErrorKind,
        /// The HTTP status the server answered, where it answered with one.
        status: Option<u16>,
        /// Requests made before giving up (1 where the failure was not retried).
        attempts: u32,
        /// What went wrong, in words (never credentials).
        reason: String,
    },
}

/// What kind of failure an [`Error::Remote`] is.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteErrorKind {
    /// The URL is malformed, of an unsupported scheme, or carries credentials inline.
    InvalidUrl,
    /// The server says the object does not exist (HTTP 404).
    NotFound,
    /// The server refused the credentials or the request (HTTP 401, 403).
    AccessDenied,
    /// Any other HTTP status that is not success (retried first when configured as retryable).
    Status,
    /// A request took longer than the configured timeout.
    Timeout,
    /// The connection could not be made, or broke before the response was complete.
    Connection,
    /// The server's answer is not what was asked for: a wrong range, a short or long body.
    BadResponse,
    /// A listing holds a key this client cannot name: one with an empty segment (`a//b`), a
    /// segment `.` or `..`, or a control character. S3 takes such keys; object_store's paths,
    /// which every request here goes through, do not.
    UnsupportedKey,
}

/// The hint of a refusal: which credentials to check, and that they may do `$what`. A macro,
/// so that each hint stays one `&'static str`.
macro_rules! check_credentials {
    ($what:literal) => {
        concat!(
            "check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; \
             GOOGLE_APPLICATION_CREDENTIALS for gs://; AZURE_STORAGE_ACCOUNT_KEY, \
             AZURE_STORAGE_SAS_TOKEN for az://), the region, and that they may ",
            $what
        )
    };
}

impl RemoteErrorKind {
    /// What a person can do about this kind of failure.
    pub fn hint(self) -> &'static str {
        match self {
            RemoteErrorKind::InvalidUrl => {
                "use s3://bucket/key, gs://bucket/object, az://container/blob or \
                 http(s)://host/path, with credentials and settings in the environment \
                 (AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_ACCOUNT_NAME, \
                 ...) rather than in the URL"
            }
            RemoteErrorKind::NotFound => "check the bucket, key or path",
            RemoteErrorKind::AccessDenied => {
                check_credentials!("read this object; a presigned URL may have expired")
            }
            RemoteErrorKind::Status => {
                "the server refused the request; if the status is transient, list it among the \
                 retried status codes or raise the attempts"
            }
            RemoteErrorKind::Timeout => "raise the timeout, or check the server and the network",
            RemoteErrorKind::Connection => {
                "check that the server is up and reachable (endpoint, proxy, DNS)"
            }
            RemoteErrorKind::BadResponse => {
                "the answer is not the bytes asked for; check that the server supports HTTP \
                 Range requests, and open the object again if it was replaced"
            }
            RemoteErrorKind::UnsupportedKey => {
                "rename that object (with another tool), or list a prefix that does not hold it"
            }
        }
    }

    /// [`hint`](Self::hint) for a failure of `op` (`"GET bytes 0-99 of"`, `"PUT part 2 of"`):
    /// a bad answer to anything but a ranged read is not about ranges, and a refusal of a write,
    /// a deletion or a listing is not about reading.
    pub fn hint_for(self, op: &str) -> &'static str {
        let changes = ["PUT", "create", "complete", "abort"].iter().any(|w| op.starts_with(w));
        match self {
            RemoteErrorKind::BadResponse if !op.starts_with("GET") => {
                "the server's answer is not one the request expects; check that the endpoint is \
                 the store it should be"
            }
            RemoteErrorKind::AccessDenied if changes => {
                check_credentials!("write this object (s3:PutObject, s3:AbortMultipartUpload)")
            }
            RemoteErrorKind::AccessDenied if op.starts_with("DELETE") => {
                check_credentials!("delete these objects (s3:DeleteObject)")
            }
            RemoteErrorKind::AccessDenied if op.starts_with("LIST") => {
                check_credentials!("list this bucket (s3:ListBucket)")
            }
            _ => self.hint(),
        }
    }

    /// A stable `snake_case` name (`"not_found"`, `"timeout"`, ...).
    pub fn code(self) -> &'static str {
        match self {
            RemoteErrorKind::InvalidUrl => "invalid_url",
            RemoteErrorKind::NotFound => "not_found",
            RemoteErrorKind::AccessDenied => "access_denied",
            RemoteErrorKind::Status => "status",
            RemoteErrorKind::Timeout => "timeout",
            RemoteErrorKind::Connection => "connection",
            RemoteErrorKind::BadResponse => "bad_response",
            RemoteErrorKind::UnsupportedKey => "unsupported_key",
        }
    }
}

impl Error {
    /// A stable `snake_case` name of the variant (`"io"`, `"out_of_range"`, ...), for tools
    /// that report errors to scripts (the `gpumap` command's JSON `error.kind`).
    pub fn code(&self) -> &'static str {
        match self {
            Error::Io { .. } => "io",
            Error::OutOfRange { .. } => "out_of_range",
            Error::OutOfView { .. } => "out_of_view",
            Error::Overflow { .. } => "overflow",
            Error::Unaligned { .. } => "unaligned",
            Error::UnexpectedEof { .. } => "unexpected_eof",
            Error::RowIndex { .. } => "row_index",
            Error::BufferTooSmall { .. } => "buffer_too_small",
            Error::InvalidFlags(_) => "invalid_flags",
            Error::AccessMode { .. } => "access_mode",
            Error::InvalidConfig { .. } => "invalid_config",
            Error::InvalidArgument(_) => "invalid_argument",
            Error::Unavailable { .. } => "unavailable",
            Error::Cuda { .. } => "cuda",
            Error::CuFile { .. } => "cufile",
            Error::OutOfBudget { .. } => "out_of_budget",
            Error::TaskPanicked(_) => "task_panicked",
            Error::NotRegularFile { .. } => "not_regular_file",
            Error::ResourceLimit { .. } => "resource_limit",
            Error::WriteBack { .. } => "write_back",
            Error::FileShrank { .. } => "file_shrank",
            Error::Remote { .. } => "remote",
        }
    }

    /// The `errno` of an operating-system error, if this is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            Error::WriteBack { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The [`io::ErrorKind`] this error corresponds to, for callers that speak `std::io`.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            Error::Io { source, .. } => source.kind(),
            Error::UnexpectedEof { .. } => io::ErrorKind::UnexpectedEof,
            Error::OutOfRange { .. }
            | Error::OutOfView { .. }
            | Error::Overflow { .. }
            | Error::Unaligned { .. }
            | Error::BufferTooSmall { .. }
            | Error::RowIndex { .. }
            | Error::InvalidFlags(_)
            | Error::InvalidConfig { .. }
            | Error::InvalidArgument(_) => io::ErrorKind::InvalidInput,
            Error::AccessMode { .. } => io::ErrorKind::PermissionDenied,
            Error::NotRegularFile { .. } => io::ErrorKind::InvalidInput,
            Error::ResourceLimit { .. } => io::ErrorKind::OutOfMemory,
            Error::Unavailable { .. } => io::ErrorKind::Unsupported,
            Error::OutOfBudget { .. } => io::ErrorKind::OutOfMemory,
            Error::WriteBack { source, .. } => source.kind(),
            Error::FileShrank { .. } => io::ErrorKind::UnexpectedEof,
            Error::Remote { kind, .. } => match kind {
                RemoteErrorKind::InvalidUrl => io::ErrorKind::InvalidInput,
                RemoteErrorKind::NotFound => io::ErrorKind::NotFound,
                RemoteErrorKind::AccessDenied => io::ErrorKind::PermissionDenied,
                RemoteErrorKind::Timeout => io::ErrorKind::TimedOut,
                RemoteErrorKind::Connection => io::ErrorKind::ConnectionAborted,
                RemoteErrorKind::BadResponse | RemoteErrorKind::UnsupportedKey => {
                    io::ErrorKind::InvalidData
                }
                RemoteErrorKind::Status => io::ErrorKind::Other,
            },
            _ => io::ErrorKind::Other,
        }
    }

    /// The same error again, for reporting it once more (a map's sticky write-back error):
    /// the same variant and values; an OS error keeps its errno, any other I/O error its kind
    /// and message.
    pub(crate) fn duplicate(&self) -> Error {
        fn io_again(e: &io::Error) -> io::Error {
            match e.raw_os_error() {
                Some(errno) => io::Error::from_raw_os_error(errno),
                None => io::Error::new(e.kind(), e.to_string()),
            }
        }
        match self {
            Error::Io { op, path, offset, source } => {
                Error::Io { op, path: path.clone(), offset: *offset, source: io_again(source) }
            }
            Error::OutOfRange { offset, len, file_len } => {
                Error::OutOfRange { offset: *offset, len: *len, file_len: *file_len }
            }
            Error::OutOfView { offset, len, view_offset, view_len } => Error::OutOfView {
                offset: *offset,
                len: *len,
                view_offset: *view_offset,
                view_len: *view_len,
            },
            Error::Overflow { offset, len } => Error::Overflow { offset: *offset, len: *len },
            Error::Unaligned { what, value, alignment } => {
                Error::Unaligned { what, value: *value, alignment: *alignment }
            }
            Error::UnexpectedEof { path, offset, wanted, file_len } => Error::UnexpectedEof {
                path: path.clone(),
                offset: *offset,
                wanted: *wanted,
                file_len: *file_len,
            },
            Error::BufferTooSmall { needed, available } => {
                Error::BufferTooSmall { needed: *needed, available: *available }
            }
            Error::RowIndex { position, index, rows } => {
                Error::RowIndex { position: *position, index: *index, rows: *rows }
            }
            Error::InvalidFlags(flags) => Error::InvalidFlags(flags.clone()),
            Error::AccessMode { path, mode, op } => {
                Error::AccessMode { path: path.clone(), mode: mode.clone(), op }
            }
            Error::InvalidConfig { var, value, reason } => Error::InvalidConfig {
                var: var.clone(),
                value: value.clone(),
                reason: reason.clone(),
            },
            Error::InvalidArgument(what) => Error::InvalidArgument(what.clone()),
            Error::Unavailable { what, reason } => {
                Error::Unavailable { what, reason: reason.clone() }
            }
            Error::Cuda { op, code, name } => Error::Cuda { op, code: *code, name: name.clone() },
            Error::CuFile { op, code, name, path, offset } => Error::CuFile {
                op,
                code: *code,
                name: name.clone(),
                path: path.clone(),
                offset: *offset,
            },
            Error::OutOfBudget { requested, budget, in_use } => {
                Error::OutOfBudget { requested: *requested, budget: *budget, in_use: *in_use }
            }
            Error::WriteBack { path, dirty_bytes, source } => Error::WriteBack {
                path: path.clone(),
                dirty_bytes: *dirty_bytes,
                source: Box::new(source.duplicate()),
            },
            Error::FileShrank { path, len, mapped_len, dirty_bytes } => Error::FileShrank {
                path: path.clone(),
                len: *len,
                mapped_len: *mapped_len,
                dirty_bytes: *dirty_bytes,
            },
            Error::TaskPanicked(message) => Error::TaskPanicked(message.clone()),
            Error::NotRegularFile { path, what } => {
                Error::NotRegularFile { path: path.clone(), what }
            }
            Error::ResourceLimit { resource, requested, available, hint } => Error::ResourceLimit {
                resource,
                requested: *requested,
                available: *available,
                hint,
            },
            Error::Remote { url, op, kind, status, attempts, reason } => Error::Remote {
                url: url.clone(),
                op: op.clone(),
                kind: *kind,
                status: *status,
                attempts: *attempts,
                reason: reason.clone(),
            },
        }
    }

    /// An [`Error::Io`] from an OS error, with its context.
    pub(crate) fn io(
        op: &'static str,
        path: &Path,
        offset: Option<u64>,
        source: io::Error,
    ) -> Self {
        Error::Io { op, path: Some(path.to_path_buf()), offset, source }
    }

    /// An [`Error::Io`] with no file attached (a system-wide operation).
    pub(crate) fn io_nopath(op: &'static str, source: io::Error) -> Self {
        Error::Io { op, path: None, offset: None, source }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Io { source, .. } => source,
            other => io::Error::new(other.kind(), other),
        }
    }
}

/// An error and its causes in one line, `"outer: inner: innermost"` (what `anyhow` prints for
/// `{:#}`): the way to show a gpumap error to a person, since each error's own message leaves
/// its cause to [`source`](std::error::Error::source).
///
/// ```
/// use gpumap::error::Report;
/// let e = gpumap::io::FileHandle::open("/no/such/file", "r").unwrap_err();
/// let line = Report(&e).to_string();
/// assert!(line.starts_with("open failed on /no/such/file: "), "{line}");
/// assert_eq!(line.matches("os error 2").count(), 1);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Report<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

/// A path, or "the file" where none is known (a caller handed over a descriptor).
struct Named<'a>(Option<&'a Path>);

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(p) => write!(f, "{}", p.display()),
            None => f.write_str("the file"),
        }
    }
}

/// The message of [`Error::OutOfBudget`]: a request larger than the whole budget says so, since
/// no eviction could ever make room for it.
struct BudgetMessage {
    requested: u64,
    budget: u64,
    in_use: u64,
}

impl fmt::Display for BudgetMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let BudgetMessage { requested, budget, in_use } = *self;
        if requested > budget {
            write!(
                f,
                "{requested} bytes of device memory requested: the request alone exceeds the \
                 {budget}-byte budget"
            )
        } else {
            write!(
                f,
                "{requested} bytes of device memory requested, {in_use} of the {budget}-byte \
                 budget in use and none can be evicted"
            )
        }
    }
}

/// Formats " with HTTP status N" where the server answered with one.
struct StatusText(Option<u16>);

impl fmt::Display for StatusText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(status) => write!(f, " with HTTP status {status}"),
            None => Ok(()),
        }
    }
}

/// Formats " after N attempts" where a request was retried.
struct Attempts(u32);

impl fmt::Display for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 > 1 {
            write!(f, " after {} attempts", self.0)?;
        }
        Ok(())
    }
}

/// Formats " on PATH at offset N" for whichever parts are known.
struct Context<'a> {
    path: Option<&'a Path>,
    offset: Option<u64>,
}

impl fmt::Display for Context<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = self.path {
            write!(f, " on {}", p.display())?;
        }
        if let Some(o) = self.offset {
            write!(f, " at offset {o}")?;
        }
        Ok(())
    }
}

/// [`Error::OutOfRange`]'s message: the range as `start..end`, or, where its end passes the
/// largest offset, its start and length.
fn out_of_range(offset: u64, len: u64, file_len: u64) -> String {
    match offset.checked_add(len) {
        Some(end) => format!("range {offset}..{end} is outside the file of {file_len} bytes"),
        None => format!(
            "range of {len} bytes at offset {offset} ends past the largest offset (2**64 - 1); \
             the file has {file_len} bytes"
        ),
    }
}

#[cfg(test)]
mod tests;
