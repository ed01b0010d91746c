//! [`FileHandle`]: explicit, parallel reads and writes of one file.
#![forbid(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::align::{self, checked_end, direct_split, split_tasks, PAGE_SIZE};
use crate::config::{CompatMode, Config, DirectRead};
use crate::error::{Error, Result};
use crate::io::compat::{self, CompatDecision, IoPath};
use crate::io::gds::CuFileHandle;
use crate::io::pool::{IoFuture, IoPool};
use crate::sys::posix;

/// How a file is opened: the `fopen`-style flags KvikIO takes, parsed.
///
/// | flags | reads | writes | creates | truncates | writes go |
/// |---|---|---|---|---|---|
/// | `r`  | yes | no  | no  | no  | – |
/// | `r+` | yes | yes | no  | no  | at the offset given |
/// | `w`  | no  | yes | yes | yes | at the offset given |
/// | `w+` | yes | yes | yes | yes | at the offset given |
/// | `a`  | no  | yes | yes | no  | to the end ([`FileHandle::append`]) |
/// | `a+` | yes | yes | yes | no  | to the end ([`FileHandle::append`]) |
///
/// A `b` anywhere is accepted and ignored (there is no text mode), and so is `e` (close-on-exec
/// is always set). KvikIO rejects `a`; gpumap supports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFlags {
    /// Reads allowed.
    pub read: bool,
    /// Writes allowed.
    pub write: bool,
    /// Create the file if missing.
    pub create: bool,
    /// Cut the file to zero length on open.
    pub truncate: bool,
    /// Writes go to the end of the file (`O_APPEND`).
    pub append: bool,
}

impl std::str::FromStr for OpenFlags {
    type Err = Error;
    fn from_str(flags: &str) -> Result<OpenFlags> {
        let core: String = flags.chars().filter(|c| !matches!(c, 'b' | 'e')).collect();
        let (read, write, create, truncate, append) = match core.as_str() {
            "r" => (true, false, false, false, false),
            "r+" => (true, true, false, false, false),
            "w" => (false, true, true, true, false),
            "w+" => (true, true, true, true, false),
            "a" => (false, true, true, false, true),
            "a+" => (true, true, true, false, true),
            _ => return Err(Error::InvalidFlags(flags.to_string())),
        };
        Ok(OpenFlags { read, write, create, truncate, append })
    }
}

/// Options of a [`FileHandle`], defaulting to the process [`Config`].
#[derive(Debug, Clone)]
pub struct HandleOptions {
    /// cuFile or POSIX (see [`CompatMode`]).
    pub compat_mode: CompatMode,
    /// Largest piece a task moves.
    pub task_size: u64,
    /// When to use `O_DIRECT` for the aligned middle of reads.
    pub direct_io_read: DirectRead,
    /// Use `O_DIRECT` for the aligned middle of writes.
    pub direct_io_write: bool,
    /// Device transfers smaller than this use the POSIX path even where cuFile is chosen.
    pub gds_threshold: u64,
    /// Size of each pinned bounce buffer (the POSIX path to device memory).
    pub bounce_buffer_size: u64,
    /// Permission bits of a file the open creates (before the umask).
    pub mode: u32,
    /// The pool that runs this handle's tasks; `None` = the process-wide pool.
    pub pool: Option<Arc<IoPool>>,
}

impl HandleOptions {
    /// The options [`Config::global`] gives.
    pub fn from_config(config: &Config) -> HandleOptions {
        HandleOptions {
            compat_mode: config.compat_mode,
            task_size: config.task_size,
            direct_io_read: config.direct_io_read,
            direct_io_write: config.direct_io_write,
            gds_threshold: config.gds_threshold,
            bounce_buffer_size: config.bounce_buffer_size,
            mode: 0o644,
            pool: None,
        }
    }

    /// Sets the compat mode.
    pub fn compat_mode(&mut self, mode: CompatMode) -> &mut Self {
        self.compat_mode = mode;
        self
    }

    /// Sets the task size.
    pub fn task_size(&mut self, bytes: u64) -> &mut Self {
        self.task_size = bytes;
        self
    }

    /// Turns `O_DIRECT` on or off for reads and writes.
    pub fn direct_io(&mut self, read: bool, write: bool) -> &mut Self {
        self.direct_io_read = if read { DirectRead::On } else { DirectRead::Off };
        self.direct_io_write = write;
        self
    }

    /// Sets when reads use `O_DIRECT` (see [`DirectRead`]).
    pub fn direct_read(&mut self, policy: DirectRead) -> &mut Self {
        self.direct_io_read = policy;
        self
    }

    /// Sets the permission bits of a created file.
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }

    /// Uses `pool` for this handle's tasks.
    pub fn pool(&mut self, pool: Arc<IoPool>) -> &mut Self {
        self.pool = Some(pool);
        self
    }

    /// Opens `path` with these options (see [`FileHandle::open`]).
    pub fn open(&self, path: impl AsRef<Path>, flags: &str) -> Result<FileHandle> {
        FileHandle::open_with(path.as_ref(), flags, self)
    }
}

/// One open file, read and written in parallel on an [`IoPool`].
///
/// Blocking calls ([`read`](Self::read), [`write`](Self::write)) split the transfer into tasks
/// of `task_size` bytes and wait for all of them; `p*` calls ([`pread`](Self::pread),
/// [`pwrite`](Self::pwrite)) take an owned buffer and return an [`IoFuture`] that gives it back.
/// `*_at` calls run on the calling thread alone. A handle is cheap to clone (the clones share
/// the descriptors) and is `Send + Sync`.
///
/// Opportunistic `O_DIRECT`: where enabled and the file system allows it, the page-aligned
/// middle of each task goes through a second descriptor opened with `O_DIRECT` (the page cache
/// is bypassed), the unaligned head and tail through the buffered one. A host buffer whose
/// address is not page-aligned at that point is moved buffered.
#[derive(Clone)]
pub struct FileHandle {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) path: PathBuf,
    flags_text: String,
    pub(super) flags: OpenFlags,
    pub(super) file: File,
    direct: Option<File>,
    direct_refused: bool,
    pub(super) task_size: u64,
    direct_io_read: DirectRead,
    direct_io_write: bool,
    pub(super) compat_mode: CompatMode,
    pub(super) gds_threshold: u64,
    pub(super) bounce_buffer_size: u64,
    pub(super) pool: Arc<IoPool>,
    /// The compat decision, made at open for `Off` (so the open fails with the reason) and at
    /// the first device transfer otherwise (so host-only users never load cuFile).
    pub(super) decision: OnceLock<(CompatDecision, Option<CuFileHandle>)>,
    /// Small device reads waiting to be coalesced (see `FileHandle::pread_device`).
    pub(super) small_reads: parking_lot::Mutex<crate::io::device_io::SmallReads>,
}

impl std::fmt::Debug for FileHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileHandle")
            .field("path", &self.inner.path)
            .field("flags", &self.inner.flags_text)
            .field("direct", &self.inner.direct.is_some())
            .finish()
    }
}

impl FileHandle {
    /// Opens `path` with `fopen`-style `flags` (see [`OpenFlags`]) and the process defaults.
    ///
    /// ```no_run
    /// let fh = gpumap::io::FileHandle::open("data.bin", "r")?;
    /// let mut buf = vec![0u8; fh.len()? as usize];
    /// let n = fh.read(&mut buf, 0)?;
    /// # Ok::<(), gpumap::Error>(())
    /// ```
    pub fn open(path: impl AsRef<Path>, flags: &str) -> Result<FileHandle> {
        FileHandle::open_with(path.as_ref(), flags, &HandleOptions::from_config(Config::global()?))
    }

    /// Options to open with, starting from the process defaults.
    pub fn options() -> Result<HandleOptions> {
        Ok(HandleOptions::from_config(Config::global()?))
    }

    fn open_with(path: &Path, flags_text: &str, options: &HandleOptions) -> Result<FileHandle> {
        let flags: OpenFlags = flags_text.parse()?;
        // What can be checked without the file is checked first, so that a bad option never
        // leaves a created or truncated file behind.
        if options.task_size == 0 {
            return Err(Error::InvalidArgument("task size 0: a task moves at least 1 byte".into()));
        }
        if options.bounce_buffer_size == 0 || !options.bounce_buffer_size.is_multiple_of(PAGE_SIZE)
        {
            return Err(Error::Unaligned {
                what: "bounce buffer size",
                value: options.bounce_buffer_size,
                alignment: PAGE_SIZE,
            });
        }
        let pool = match &options.pool {
            Some(p) => p.clone(),
            None => IoPool::global()?,
        };
        // A FIFO would block the open until a writer came, and "w" would truncate whatever the
        // path names: refuse anything but a regular file before opening it, and again on the
        // descriptor (the path may have changed in between). Non-blocking, the open itself
        // cannot hang.
        if let Ok(metadata) = std::fs::metadata(path) {
            check_regular(path, &metadata.file_type())?;
        }
        let file = OpenOptions::new()
            .read(flags.read)
            .write(flags.write && !flags.append)
            .append(flags.append)
            .create(flags.create)
            .truncate(flags.truncate)
            .mode(options.mode)
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| Error::io("open", path, None, e))?;
        let metadata = file.metadata().map_err(|e| Error::io("fstat", path, None, e))?;
        check_regular(path, &metadata.file_type())?;
        if let Some(what) = posix::pseudo_file_system(&file, path)? {
            return Err(Error::NotRegularFile { path: Some(path.to_path_buf()), what });
        }
        posix::clear_nonblocking(&file, path)?;
        // The direct descriptor serves positional transfers only; appends stay buffered.
        let wants_direct = !flags.append
            && ((options.direct_io_read != DirectRead::Off && flags.read)
                || (options.direct_io_write && flags.write));
        let (direct, direct_refused) = if wants_direct {
            match posix::open_direct(path, flags.read, flags.write) {
                Ok(Some(f)) => (Some(f), false),
                Ok(None) => (None, true),
                // Permission quirks on a second open are not worth failing the first for.
                Err(_) => (None, true),
            }
        } else {
            (None, false)
        };
        let decision = OnceLock::new();
        if options.compat_mode == CompatMode::Off {
            let _ = decision.set(compat::decide(CompatMode::Off, path, flags.read, flags.write)?);
        }
        Ok(FileHandle {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                flags_text: flags_text.to_string(),
                flags,
                file,
                direct,
                direct_refused,
                task_size: options.task_size,
                direct_io_read: options.direct_io_read,
                direct_io_write: options.direct_io_write,
                compat_mode: options.compat_mode,
                gds_threshold: options.gds_threshold,
                bounce_buffer_size: options.bounce_buffer_size,
                pool,
                decision,
                small_reads: Default::default(),
            }),
        })
    }

    /// The path the handle was opened with.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The flags the handle was opened with.
    pub fn flags(&self) -> OpenFlags {
        self.inner.flags
    }

    /// The compat mode the handle was opened with.
    pub fn compat_mode(&self) -> CompatMode {
        self.inner.compat_mode
    }

    /// Which path device transfers take (cuFile or POSIX) and why. Made at the first device
    /// transfer (or here, if none happened yet); in `Auto` mode this loads cuFile.
    pub fn compat_decision(&self) -> &CompatDecision {
        &self.inner.decision().0
    }

    /// When reads use `O_DIRECT` (as asked; [`direct_io_status`](Self::direct_io_status) says
    /// whether the file system allows it).
    pub fn direct_read_policy(&self) -> DirectRead {
        self.inner.direct_io_read
    }

    /// Whether the aligned middle of transfers can go through `O_DIRECT`, and if not, why.
    pub fn direct_io_status(&self) -> std::result::Result<(), &'static str> {
        let inner = &self.inner;
        match (&inner.direct, inner.direct_refused) {
            (Some(_), _) => Ok(()),
            (None, true) => Err("the file system refused O_DIRECT"),
            (None, false) if inner.flags.append => {
                Err("append handles write through the page cache")
            }
            (None, false) => Err("O_DIRECT is switched off (GPUMAP_AUTO_DIRECT_IO_READ/WRITE)"),
        }
    }

    /// The underlying (buffered) file.
    pub fn file(&self) -> &File {
        &self.inner.file
    }

    /// Size of the file in bytes (`fstat`).
    pub fn len(&self) -> Result<u64> {
        posix::file_len(&self.inner.file, &self.inner.path)
    }

    /// `Ok` when a read of `wanted` bytes at `offset` got them all, else
    /// [`Error::UnexpectedEof`] naming the range and the file's length now: where the file
    /// really ends, which a short count alone does not say (a read past the end gets 0).
    pub(crate) fn expect_len(&self, offset: u64, wanted: u64, got: u64) -> Result<()> {
        if got >= wanted {
            return Ok(());
        }
        Err(self.eof_error(offset, wanted, got))
    }

    /// [`Error::UnexpectedEof`] for a read of `wanted` bytes at `offset` that got `got`, with
    /// the file's length now (where `fstat` fails, the end of what the read got).
    pub(crate) fn eof_error(&self, offset: u64, wanted: u64, got: u64) -> Error {
        let file_len = self.len().unwrap_or(offset.saturating_add(got));
        Error::UnexpectedEof { path: Some(self.inner.path.clone()), offset, wanted, file_len }
    }

    /// `Ok` when every `(offset, len)` of `ranges` lies within the file as long as it is now
    /// (one `fstat`), else [`Error::UnexpectedEof`] for the first that does not: the check a
    /// map makes before serving bytes it holds, so that a file cut under it reads as cut
    /// whatever the map still holds.
    pub(crate) fn expect_ranges(&self, ranges: impl IntoIterator<Item = (u64, u64)>) -> Result<()> {
        let len = self.len()?;
        for (offset, wanted) in ranges {
            if offset.saturating_add(wanted) > len {
                let path = Some(self.inner.path.clone());
                return Err(Error::UnexpectedEof { path, offset, wanted, file_len: len });
            }
        }
        Ok(())
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Sets the file's length (`ftruncate`): cuts it, or extends it with a hole of zeros.
    pub fn set_len(&self, len: u64) -> Result<()> {
        self.inner.check_write("set_len")?;
        checked_end(len, 0)?;
        posix::set_len(&self.inner.file, &self.inner.path, len)
    }

    /// Makes written data durable (`fdatasync`): when it returns `Ok`, the data survive a crash.
    /// Linux reports a write-back error once; a second call may return `Ok` for lost data, so
    /// treat an error here as final.
    pub fn sync_data(&self) -> Result<()> {
        posix::fdatasync(&self.inner.file, &self.inner.path)
    }

    /// Makes written data and metadata durable (`fsync`).
    pub fn sync_all(&self) -> Result<()> {
        posix::fsync(&self.inner.file, &self.inner.path)
    }

    /// Reads into `buf` from `offset`, in parallel; returns the count read, which is less than
    /// `buf.len()` only where the file ends first (a read entirely past the end returns 0).
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let inner = &self.inner;
        inner.check_read()?;
        checked_end(offset, buf.len() as u64)?;
        let tasks = split_tasks(offset, buf.len() as u64, inner.task_size);
        let plan = inner.read_plan(offset, buf.len() as u64);
        inner.pool.run_split(&tasks, buf, |task, piece| inner.read_piece(piece, task.offset, plan))
    }

    /// Reads exactly `buf.len()` bytes from `offset`, in parallel, or fails with
    /// [`Error::UnexpectedEof`] saying how many the file had.
    pub fn read_exact(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let got = self.read(buf, offset)?;
        self.expect_len(offset, buf.len() as u64, got as u64)
    }

    /// Writes all of `buf` at `offset`, in parallel; returns `buf.len()`.
    pub fn write(&self, buf: &[u8], offset: u64) -> Result<usize> {
        let inner = &self.inner;
        inner.check_positional_write()?;
        checked_end(offset, buf.len() as u64)?;
        let tasks = split_tasks(offset, buf.len() as u64, inner.task_size);
        inner.pool.run_split_ref(&tasks, buf, |task, piece| inner.write_piece(piece, task.offset))
    }

    /// Appends all of `buf` to the end of the file (handles opened `a` or `a+`); each call lands
    /// in one piece even with other appenders (`O_APPEND`).
    pub fn append(&self, buf: &[u8]) -> Result<usize> {
        let inner = &self.inner;
        if !inner.flags.append {
            return Err(inner.access_error("append (open with \"a\" or \"a+\")"));
        }
        posix::append_all(&inner.file, &inner.path, buf)
    }

    /// Reads into `buf` from `offset` on the calling thread only; returns the count read.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.inner.check_read()?;
        checked_end(offset, buf.len() as u64)?;
        let plan = self.inner.read_plan(offset, buf.len() as u64);
        self.inner.read_piece(buf, offset, plan)
    }

    /// Writes all of `buf` at `offset` on the calling thread only.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<usize> {
        self.inner.check_positional_write()?;
        checked_end(offset, buf.len() as u64)?;
        self.inner.write_piece(buf, offset)
    }

    /// Starts a parallel read into the owned `buf` from `offset`; the future gives back the
    /// buffer and the count read (see [`read`](Self::read)).
    pub fn pread<B>(&self, mut buf: B, offset: u64) -> IoFuture<(B, usize)>
    where
        B: AsMut<[u8]> + Send + 'static,
    {
        let handle = self.clone();
        self.inner.pool.spawn(move || {
            let n = handle.read(buf.as_mut(), offset)?;
            Ok((buf, n))
        })
    }

    /// Starts a parallel write of the owned `buf` at `offset`; the future gives back the buffer
    /// and the count written.
    pub fn pwrite<B>(&self, buf: B, offset: u64) -> IoFuture<(B, usize)>
    where
        B: AsRef<[u8]> + Send + 'static,
    {
        let handle = self.clone();
        self.inner.pool.spawn(move || {
            let n = handle.write(buf.as_ref(), offset)?;
            Ok((buf, n))
        })
    }

    /// A handle on the same open file whose transfers use `task_size` and `gds_threshold`
    /// instead of this handle's: the descriptors are duplicated (`dup`), everything else —
    /// flags, pool, compat decision and cuFile registration — is shared. For callers whose
    /// task size is a per-call argument (KvikIO's `pread(..., task_size=)`); returns a clone
    /// when nothing changes. A zero `task_size` is an error.
    pub fn with_transfer_sizes(&self, task_size: u64, gds_threshold: u64) -> Result<FileHandle> {
        let inner = &self.inner;
        if task_size == 0 {
            return Err(Error::InvalidArgument("task size 0: expected at least 1 byte".into()));
        }
        if task_size == inner.task_size && gds_threshold == inner.gds_threshold {
            return Ok(self.clone());
        }
        let dup = |f: &File| f.try_clone().map_err(|e| Error::io("dup", &inner.path, None, e));
        Ok(FileHandle {
            inner: Arc::new(Inner {
                path: inner.path.clone(),
                flags_text: inner.flags_text.clone(),
                flags: inner.flags,
                file: dup(&inner.file)?,
                direct: inner.direct.as_ref().map(dup).transpose()?,
                direct_refused: inner.direct_refused,
                task_size,
                direct_io_read: inner.direct_io_read,
                direct_io_write: inner.direct_io_write,
                compat_mode: inner.compat_mode,
                gds_threshold,
                bounce_buffer_size: inner.bounce_buffer_size,
                pool: inner.pool.clone(),
                decision: inner.decision.clone(),
                small_reads: Default::default(),
            }),
        })
    }

    /// Device transfers smaller than this take the POSIX path even where cuFile is chosen.
    pub fn gds_threshold(&self) -> u64 {
        self.inner.gds_threshold
    }

    /// The pool this handle's tasks run on.
    pub fn pool(&self) -> &Arc<IoPool> {
        &self.inner.pool
    }

    /// The largest piece one task moves.
    pub fn task_size(&self) -> u64 {
        self.inner.task_size
    }
}

/// `Ok` for a regular file; `EISDIR` for a directory; [`Error::NotRegularFile`] for the rest.
fn check_regular(path: &Path, kind: &std::fs::FileType) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_dir() {
        let e = std::io::Error::from_raw_os_error(libc::EISDIR);
        return Err(Error::io("open", path, None, e));
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    };
    Err(Error::NotRegularFile { path: Some(path.to_path_buf()), what })
}

/// How the pieces of one read choose between the page cache and `O_DIRECT`
/// (see `Inner::read_plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadPlan {
    /// Every piece through the page cache.
    Buffered,
    /// The aligned middle of every piece with `O_DIRECT`.
    Direct,
    /// Each piece of 1 MiB or more asks the page cache what it holds.
    PerPiece,
}

/// Reads shorter than this never ask the page cache what it holds (see [`DirectRead::Uncached`]).
const UNCACHED_CHECK_MIN: u64 = 1 << 20;

impl Inner {
    pub(super) fn decision(&self) -> &(CompatDecision, Option<CuFileHandle>) {
        self.decision.get_or_init(|| {
            compat::decide(self.compat_mode, &self.path, self.flags.read, self.flags.write)
                .unwrap_or_else(|e| {
                    let reason = crate::error::Report(&e).to_string();
                    (
                        CompatDecision { requested: self.compat_mode, path: IoPath::Posix, reason },
                        None,
                    )
                })
        })
    }

    fn access_error(&self, op: &'static str) -> Error {
        Error::AccessMode { path: self.path.clone(), mode: self.flags_text.clone(), op }
    }

    pub(super) fn check_read(&self) -> Result<()> {
        if self.flags.read {
            Ok(())
        } else {
            Err(self.access_error("reading"))
        }
    }

    fn check_write(&self, op: &'static str) -> Result<()> {
        if self.flags.write {
            Ok(())
        } else {
            Err(self.access_error(op))
        }
    }

    pub(super) fn check_positional_write(&self) -> Result<()> {
        self.check_write("writing")?;
        if self.flags.append {
            // Linux's pwrite ignores the offset on O_APPEND descriptors; refuse rather than
            // write somewhere the caller did not ask for.
            return Err(self.access_error("writes at an offset (use append)"));
        }
        Ok(())
    }

    /// The part of `[offset, offset + len)` that may go through `O_DIRECT` for a buffer at
    /// address `addr`: `None` when direct I/O is off for this direction, or the aligned middle
    /// is empty, or the buffer is not page-aligned where the middle starts.
    fn direct_middle(
        &self,
        enabled: bool,
        addr: usize,
        offset: u64,
        len: u64,
    ) -> Option<(&File, u64, u64)> {
        let direct = self.direct.as_ref().filter(|_| enabled)?;
        let split = direct_split(offset, len, PAGE_SIZE);
        let middle_addr = addr as u64 + split.head.1;
        (split.middle.1 > 0 && align::is_aligned(middle_addr, PAGE_SIZE)).then_some((
            direct,
            split.middle.0,
            split.middle.1,
        ))
    }

    /// How the pieces of a read of `[offset, offset + len)` choose between the page cache and
    /// `O_DIRECT`, by the handle's [`DirectRead`] policy.
    ///
    /// Under `Uncached` the whole transfer is looked at first: when almost none of it is cached
    /// every piece goes around the cache. Deciding piece by piece there would go wrong: one
    /// buffered piece (an unaligned head, say) sets off the kernel's read-ahead, the next piece
    /// then finds itself cached and reads buffered, which reads ahead further, and so on to
    /// the end of the file.
    pub(super) fn read_plan(&self, offset: u64, len: u64) -> ReadPlan {
        match self.direct_io_read {
            DirectRead::Off => ReadPlan::Buffered,
            DirectRead::On => ReadPlan::Direct,
            // Small reads stay buffered: the check would cost about as much as the read, and
            // the kernel reads a lone small miss without read-ahead anyway.
            DirectRead::Uncached if len < UNCACHED_CHECK_MIN || self.direct.is_none() => {
                ReadPlan::Buffered
            }
            DirectRead::Uncached if self.mostly_uncached(offset, len) => ReadPlan::Direct,
            DirectRead::Uncached => ReadPlan::PerPiece,
        }
    }

    /// Whether less than an eighth of `[offset, offset + len)` is in the page cache; `false`
    /// when the kernel will not say (or the range runs past the end): buffered is never far
    /// wrong.
    fn mostly_uncached(&self, offset: u64, len: u64) -> bool {
        let range = crate::pagecache::ByteRange::new(offset, len);
        match crate::pagecache::residency(&self.file, range) {
            Ok(r) => r.cached_pages.is_some_and(|cached| cached * 8 < r.total_pages),
            Err(_) => false,
        }
    }

    /// One task's read: buffered, or head buffered + middle direct + tail buffered, as `plan`
    /// says.
    pub(super) fn read_piece(&self, buf: &mut [u8], offset: u64, plan: ReadPlan) -> Result<usize> {
        let len = buf.len() as u64;
        let direct = match plan {
            ReadPlan::Buffered => false,
            ReadPlan::Direct => true,
            ReadPlan::PerPiece => len >= UNCACHED_CHECK_MIN && self.mostly_uncached(offset, len),
        };
        let Some((direct, mid_off, mid_len)) =
            self.direct_middle(direct, buf.as_ptr() as usize, offset, len)
        else {
            return posix::pread_full(&self.file, &self.path, buf, offset);
        };
        let head = (mid_off - offset) as usize;
        let mid_end = head + mid_len as usize;
        let got = posix::pread_full(&self.file, &self.path, &mut buf[..head], offset)?;
        if got < head {
            return Ok(got);
        }
        let got = posix::pread_full(direct, &self.path, &mut buf[head..mid_end], mid_off)?;
        if got < mid_len as usize {
            return Ok(head + got);
        }
        let tail =
            posix::pread_full(&self.file, &self.path, &mut buf[mid_end..], mid_off + mid_len)?;
        Ok(mid_end + tail)
    }

    /// One task's write: buffered, or head buffered + middle direct + tail buffered.
    pub(super) fn write_piece(&self, buf: &[u8], offset: u64) -> Result<usize> {
        let len = buf.len() as u64;
        let Some((direct, mid_off, mid_len)) =
            self.direct_middle(self.direct_io_write, buf.as_ptr() as usize, offset, len)
        else {
            return posix::pwrite_all(&self.file, &self.path, buf, offset);
        };
        let head = (mid_off - offset) as usize;
        let mid_end = head + mid_len as usize;
        posix::pwrite_all(&self.file, &self.path, &buf[..head], offset)?;
        posix::pwrite_all(direct, &self.path, &buf[head..mid_end], mid_off)?;
        posix::pwrite_all(&self.file, &self.path, &buf[mid_end..], mid_off + mid_len)?;
        Ok(buf.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_like_fopen() {
        let f: OpenFlags = "r".parse().unwrap();
        assert!(f.read && !f.write && !f.create);
        let f: OpenFlags = "w+b".parse().unwrap();
        assert!(f.read && f.write && f.create && f.truncate && !f.append);
        let f: OpenFlags = "a".parse().unwrap();
        assert!(!f.read && f.write && f.append && !f.truncate);
        for bad in ["", "x", "rw", "r++", "wa", "+"] {
            assert!(
                matches!(bad.parse::<OpenFlags>(), Err(Error::InvalidFlags(ref s)) if s == bad)
            );
        }
    }

    #[test]
    fn transfer_sizes_variant_shares_the_file() {
        let dir = std::env::temp_dir().join(format!("gpumap-variant-{}", std::process::id()));
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&dir, &data).unwrap();
        let fh = FileHandle::open(&dir, "r").unwrap();
        assert!(fh.with_transfer_sizes(0, 0).is_err());
        let same = fh.with_transfer_sizes(fh.task_size(), fh.gds_threshold()).unwrap();
        assert!(Arc::ptr_eq(&same.inner, &fh.inner));
        let small = fh.with_transfer_sizes(4096, 0).unwrap();
        assert_eq!((small.task_size(), small.gds_threshold()), (4096, 0));
        assert_eq!(fh.task_size(), Config::global().unwrap().task_size);
        drop(fh);
        let mut back = vec![0u8; data.len() - 7];
        assert_eq!(small.read(&mut back, 7).unwrap(), back.len());
        assert_eq!(back, data[7..]);
        std::fs::remove_file(&dir).unwrap();
    }
}
