//! The state one open file's handles share (a `FileHandle` and its clones hold it in an `Arc`):
//! the descriptors, the settings its transfers run by, its pool, the compat decision and the
//! queue of small device reads; opening, the access checks and the end-of-file errors.
//!
//! The transfers themselves are functions over this state in `host_io`, `device_io`,
//! `batch`, `small_reads` and `stream`; `direct` says when they go around the page cache.
#![forbid(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use crate::align::{align_up, PAGE_SIZE};
use crate::config::{CompatMode, Config, DirectRead, SettingValue, SETTINGS};
use crate::error::{Error, Result};
use crate::io::compat::{self, CompatDecision, IoPath};
use crate::io::flags::OpenFlags;
use crate::io::gds::CuFileHandle;
use crate::io::pool::IoPool;
use crate::io::small_read_queue::SmallReadQueue;
use crate::io::thread_descriptors::ThreadDescriptors;
use crate::io::writes_in_flight::WritesInFlight;
use crate::sys::posix;
use crate::tuning::{self, FileSystem};

/// How an open file's transfers run: what `HandleOptions` sets, kept by the open file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HandleSettings {
    /// cuFile or POSIX.
    pub(super) compat_mode: CompatMode,
    /// Largest piece a task moves.
    pub(super) task_size: u64,
    /// When the aligned middle of reads uses `O_DIRECT`.
    pub(super) direct_io_read: DirectRead,
    /// Whether the aligned middle of writes uses `O_DIRECT`.
    pub(super) direct_io_write: bool,
    /// Device transfers smaller than this take the POSIX path even where cuFile is chosen.
    pub(super) gds_threshold: u64,
    /// Size of each pinned bounce buffer (the POSIX path to device memory).
    pub(super) bounce_buffer_size: u64,
    /// The settings given explicitly (by the environment, the program or a setter), one bit
    /// per row of [`SETTINGS`]: automatic choices leave them alone.
    explicit: u16,
}

impl HandleSettings {
    /// The settings `config` gives.
    pub(super) fn from_config(config: &Config) -> HandleSettings {
        HandleSettings {
            compat_mode: config.compat_mode,
            task_size: config.task_size,
            direct_io_read: config.direct_io_read,
            direct_io_write: config.direct_io_write,
            gds_threshold: config.gds_threshold,
            bounce_buffer_size: config.bounce_buffer_size,
            explicit: SETTINGS
                .iter()
                .enumerate()
                .filter(|(_, spec)| config.is_explicit(spec.field))
                .fold(0, |bits, (i, _)| bits | (1 << i)),
        }
    }

    /// Marks `field` (a [`SETTINGS`] field) as given explicitly.
    pub(super) fn mark_explicit(&mut self, field: &str) {
        if let Some(i) = SETTINGS.iter().position(|spec| spec.field == field) {
            self.explicit |= 1 << i;
        }
    }

    /// Whether `field` was given explicitly.
    pub(super) fn is_explicit(&self, field: &str) -> bool {
        SETTINGS
            .iter()
            .position(|spec| spec.field == field)
            .is_some_and(|i| self.explicit & (1 << i) != 0)
    }

    /// Takes the automatic choices for a file on `file_system` where the setting was not given
    /// explicitly. Only the task size is taken here: `O_DIRECT` on a file system that refuses
    /// it is found out by the open itself, which then says so (`direct_io_status`).
    fn tune_for(&mut self, file_system: FileSystem) {
        for choice in tuning::for_file(Some(file_system)) {
            if !choice.tuned || self.is_explicit(choice.setting) {
                continue;
            }
            if let ("task_size", SettingValue::Size(bytes)) = (choice.setting, &choice.value) {
                tracing::debug!(task_size = bytes, "auto: {}", choice.reason);
                self.task_size = *bytes;
            }
        }
    }
}

/// One open file, as its handles share it.
pub(super) struct HandleState {
    pub(super) path: PathBuf,
    /// The flags as given, for messages.
    pub(super) flags_text: String,
    pub(super) flags: OpenFlags,
    /// The buffered descriptor. The descriptors are shared with the handles of other task
    /// sizes (`with_transfer_sizes`), which so cost no descriptor of their own.
    pub(super) file: Arc<File>,
    /// The buffered descriptors of the pool threads that read small pieces (see
    /// `thread_descriptors`).
    pub(super) thread_files: Arc<ThreadDescriptors>,
    /// The `O_DIRECT` descriptor, where a direct policy is on and the file system allows it.
    pub(super) direct: Option<Arc<File>>,
    /// Whether the file system refused the `O_DIRECT` descriptor.
    pub(super) direct_refused: bool,
    pub(super) settings: HandleSettings,
    pub(super) pool: Arc<IoPool>,
    /// The compat decision, made at open for `Off` (so the open fails with the reason) and at
    /// the first device transfer otherwise (so host-only users never load cuFile).
    decision: OnceLock<(CompatDecision, Option<CuFileHandle>)>,
    /// Small device reads waiting to be coalesced (see `small_reads`).
    pub(super) small_reads: crate::sync::Mutex<SmallReadQueue>,
    /// Whether a lone small read, read as it was submitted, runs (see `lone_reads`).
    pub(super) lone_read_running: AtomicBool,
    /// The writes its futures run, shared with its other task sizes' handles (see
    /// `writes_in_flight`).
    pub(super) writes: Arc<WritesInFlight>,
}

impl HandleState {
    /// Opens `path` with `fopen`-style `flags_text`, creating it with permission bits `mode`;
    /// transfers run by `settings` on `pool` (`None`: the process-wide pool).
    pub(super) fn open(
        path: &Path,
        flags_text: &str,
        settings: HandleSettings,
        mode: u32,
        pool: Option<&Arc<IoPool>>,
    ) -> Result<HandleState> {
        let flags: OpenFlags = flags_text.parse()?;
        // What can be checked without the file is checked first, so that a bad option never
        // leaves a created or truncated file behind.
        if settings.task_size == 0 {
            return Err(Error::InvalidArgument("task size 0: a task moves at least 1 byte".into()));
        }
        // Any positive size is taken (as KvikIO takes it); the buffers are made a whole number
        // of pages, since the `O_DIRECT` reads that fill them need page-aligned lengths.
        let mut settings = settings;
        settings.bounce_buffer_size = match settings.bounce_buffer_size {
            0 => {
                return Err(Error::InvalidArgument(
                    "bounce buffer size 0: a bounce buffer holds at least 1 byte".into(),
                ))
            }
            n => align_up(n, PAGE_SIZE).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "bounce buffer size {n}: too large to round up to whole pages of {PAGE_SIZE} bytes"
                ))
            })?,
        };
        let pool = match pool {
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
        let file = flags
            .open_options()
            .mode(mode)
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| Error::io("open", path, None, e))?;
        let metadata = file.metadata().map_err(|e| Error::io("fstat", path, None, e))?;
        check_regular(path, &metadata.file_type())?;
        let magic = posix::file_system_magic(&file, path)?;
        if let Some(what) = posix::pseudo_file_system(magic) {
            return Err(Error::NotRegularFile { path: Some(path.to_path_buf()), what });
        }
        settings.tune_for(FileSystem::from_magic(magic));
        posix::clear_nonblocking(&file, path)?;
        // The direct descriptor serves positional transfers only; appends stay buffered.
        let wants_direct = !flags.append
            && ((settings.direct_io_read != DirectRead::Off && flags.read)
                || (settings.direct_io_write && flags.write));
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
        if settings.compat_mode == CompatMode::Off {
            let _ = decision.set(compat::decide(CompatMode::Off, path, flags.read, flags.write)?);
        }
        Ok(HandleState {
            path: path.to_path_buf(),
            flags_text: flags_text.to_string(),
            flags,
            file: Arc::new(file),
            thread_files: Arc::new(ThreadDescriptors::new()),
            direct: direct.map(Arc::new),
            direct_refused,
            settings,
            pool,
            decision,
            small_reads: Default::default(),
            lone_read_running: AtomicBool::new(false),
            writes: Arc::default(),
        })
    }

    /// The same open file with `task_size` and `gds_threshold` in place of its own: the
    /// descriptors, flags, pool, compat decision and cuFile registration shared, so that it
    /// needs no descriptor (a program at its open-files limit still reads). A zero
    /// `task_size` is an error.
    pub(super) fn with_transfer_sizes(
        &self,
        task_size: u64,
        gds_threshold: u64,
    ) -> Result<HandleState> {
        if task_size == 0 {
            return Err(Error::InvalidArgument("task size 0: expected at least 1 byte".into()));
        }
        Ok(HandleState {
            path: self.path.clone(),
            flags_text: self.flags_text.clone(),
            flags: self.flags,
            file: self.file.clone(),
            thread_files: self.thread_files.clone(),
            direct: self.direct.clone(),
            direct_refused: self.direct_refused,
            settings: HandleSettings { task_size, gds_threshold, ..self.settings },
            pool: self.pool.clone(),
            decision: self.decision.clone(),
            small_reads: Default::default(),
            lone_read_running: AtomicBool::new(false),
            writes: self.writes.clone(),
        })
    }

    /// The compat decision (made now if no device transfer made it yet) and, for the cuFile
    /// path, the registered file.
    pub(super) fn decision(&self) -> &(CompatDecision, Option<CuFileHandle>) {
        self.decision.get_or_init(|| {
            let mode = self.settings.compat_mode;
            compat::decide(mode, &self.path, self.flags.read, self.flags.write).unwrap_or_else(
                |e| {
                    let reason = crate::error::Report(&e).to_string();
                    (CompatDecision { requested: mode, path: IoPath::Posix, reason }, None)
                },
            )
        })
    }

    /// The cuFile handle when a device transfer of `len` bytes takes the cuFile path (cuFile
    /// chosen for the file and `len` at least `gds_threshold`); `None` for the POSIX path.
    pub(super) fn cufile_for(&self, len: usize) -> Option<&CuFileHandle> {
        let (decision, gds) = self.decision();
        gds.as_ref().filter(|_| {
            decision.path == IoPath::CuFile && len as u64 >= self.settings.gds_threshold
        })
    }

    /// Whether the aligned middle of transfers can go through `O_DIRECT`, and if not, why.
    pub(super) fn direct_io_status(&self) -> std::result::Result<(), &'static str> {
        match (&self.direct, self.direct_refused) {
            (Some(_), _) => Ok(()),
            (None, true) => Err("the file system refused O_DIRECT"),
            (None, false) if self.flags.append => {
                Err("append handles write through the page cache")
            }
            (None, false) => Err("O_DIRECT is switched off (GPUMAP_AUTO_DIRECT_IO_READ/WRITE)"),
        }
    }

    pub(super) fn access_error(&self, op: &'static str) -> Error {
        Error::AccessMode { path: self.path.clone(), mode: self.flags_text.clone(), op }
    }

    /// `Ok` when the file was opened for reading.
    pub(super) fn check_read(&self) -> Result<()> {
        if self.flags.read {
            Ok(())
        } else {
            Err(self.access_error("reading"))
        }
    }

    /// `Ok` when the file was opened for writing; the error names `op`.
    pub(super) fn check_write(&self, op: &'static str) -> Result<()> {
        if self.flags.write {
            Ok(())
        } else {
            Err(self.access_error(op))
        }
    }

    /// `Ok` when writes at an offset are allowed: opened for writing, and not to append.
    pub(super) fn check_positional_write(&self) -> Result<()> {
        self.check_write("writing")?;
        if self.flags.append {
            // Linux's pwrite ignores the offset on O_APPEND descriptors; refuse rather than
            // write somewhere the caller did not ask for.
            return Err(self.access_error("writes at an offset (use append)"));
        }
        Ok(())
    }

    /// Size of the file in bytes (`fstat`).
    pub(super) fn len(&self) -> Result<u64> {
        posix::file_len(&self.file, &self.path)
    }

    /// [`Error::UnexpectedEof`] for a read of `wanted` bytes at `offset` that got `got`, with
    /// the file's length now; where `fstat` fails, or says the file now holds the whole range
    /// (it grew back since the read ended short), the end of what the read got, so that the
    /// error never contradicts itself.
    pub(super) fn eof_error(&self, offset: u64, wanted: u64, got: u64) -> Error {
        let read_end = offset.saturating_add(got);
        let file_len = match self.len() {
            Ok(len) if len < offset.saturating_add(wanted) => len,
            _ => read_end,
        };
        Error::UnexpectedEof { path: Some(self.path.clone()), offset, wanted, file_len }
    }

    /// `Ok` when a read of `wanted` bytes at `offset` got them all, else
    /// [`Error::UnexpectedEof`] (see [`eof_error`](Self::eof_error)).
    pub(super) fn expect_len(&self, offset: u64, wanted: u64, got: u64) -> Result<()> {
        if got >= wanted {
            return Ok(());
        }
        Err(self.eof_error(offset, wanted, got))
    }

    /// `Ok` when every `(offset, len)` of `ranges` lies within the file as long as it is now
    /// (one `fstat`), else [`Error::UnexpectedEof`] for the first that does not.
    pub(super) fn expect_ranges(&self, ranges: impl IntoIterator<Item = (u64, u64)>) -> Result<()> {
        let len = self.len()?;
        for (offset, wanted) in ranges {
            if offset.saturating_add(wanted) > len {
                let path = Some(self.path.clone());
                return Err(Error::UnexpectedEof { path, offset, wanted, file_len: len });
            }
        }
        Ok(())
    }
}

/// `Ok` where `path` is a regular file of a real file system, or names nothing (yet); the
/// error [`FileHandle::open`](crate::io::FileHandle::open) would give otherwise (`EISDIR`,
/// [`Error::NotRegularFile`] for a FIFO, a device or a `/proc` file). For tools that check a
/// path before they start work on it. Opens nothing that could block or act: the file system is
/// asked through an `O_PATH` descriptor.
pub fn check_regular_file(path: &Path) -> Result<()> {
    let Ok(metadata) = std::fs::metadata(path) else { return Ok(()) };
    check_regular(path, &metadata.file_type())?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io("open", path, None, e))?;
    match posix::pseudo_file_system(posix::file_system_magic(&file, path)?) {
        Some(what) => Err(Error::NotRegularFile { path: Some(path.to_path_buf()), what }),
        None => Ok(()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Scope;
    use std::collections::HashMap;

    fn config_with(var: &str, value: &str) -> Config {
        let env: HashMap<&str, &str> = [(var, value)].into();
        Config::from_lookup(|k| env.get(k).map(|v| v.to_string())).unwrap()
    }

    /// Every setting the table says is per handle reaches `HandleSettings` (and is marked as
    /// given); no other does: a handle setting added to the table but not here fails.
    #[test]
    fn handle_settings_take_the_tables_handle_rows() {
        let plain = HandleSettings::from_config(&Config::default());
        assert!(SETTINGS.len() <= 16, "one bit a setting in `explicit`");
        for spec in &SETTINGS {
            let mut got = HandleSettings::from_config(&config_with(spec.env, spec.example));
            assert!(got.is_explicit(spec.field), "{}", spec.field);
            got.explicit = plain.explicit;
            let reached = got != plain;
            assert_eq!(reached, spec.scope == Scope::Handle, "{}", spec.field);
        }
    }

    /// A read that ended short, of a file that grew back before the error was made, names
    /// where the read ended, not the file's new length (which would hold the whole range).
    #[test]
    fn an_eof_error_never_contradicts_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![1u8; 8192]).unwrap();
        let handle = crate::io::FileHandle::open(&path, "r").unwrap();
        let eof = |offset, wanted, got| match handle.eof_error(offset, wanted, got) {
            Error::UnexpectedEof { file_len, .. } => file_len,
            other => panic!("{other:?}"),
        };
        assert_eq!(eof(0, 8192, 4096), 4096, "grew back: where the read ended");
        assert_eq!(eof(4096, 8192, 100), 8192, "still short: the length now");
    }

    #[test]
    fn network_file_systems_get_larger_tasks_unless_given() {
        let mut settings = HandleSettings::from_config(&Config::default());
        settings.tune_for(FileSystem::Local("ext4"));
        assert_eq!(settings, HandleSettings::from_config(&Config::default()));
        settings.tune_for(FileSystem::Memory("tmpfs"));
        assert_eq!(settings, HandleSettings::from_config(&Config::default()));
        settings.tune_for(FileSystem::Network("nfs"));
        assert_eq!(settings.task_size, tuning::NETWORK_TASK_SIZE);
        let mut given = HandleSettings::from_config(&config_with("KVIKIO_TASK_SIZE", "1M"));
        given.tune_for(FileSystem::Network("nfs"));
        assert_eq!(given.task_size, 1 << 20);
        let mut set = HandleSettings::from_config(&Config::default());
        set.mark_explicit("task_size");
        set.tune_for(FileSystem::Network("lustre"));
        assert_eq!(set.task_size, crate::config::DEFAULT_TASK_SIZE);
    }
}
