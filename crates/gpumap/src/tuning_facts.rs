//! Gathering the [`Facts`] auto-tuning chooses from: the CPUs, the file system of a path and
//! whether its disk spins. Each fact is one small function, cheap and never failing the caller
//! for a fact it cannot learn (that fact is then unknown). The GPU count comes from the
//! caller, which has probed CUDA already or chose not to.
#![forbid(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::Result;
use crate::sys::posix;
use crate::tuning::{Facts, FileSystem};

/// The facts for `path` (`None`: the machine alone), with `gpus` as the caller knows it. An
/// error only where `path` cannot be opened or its file system not asked.
pub fn gather(path: Option<&Path>, gpus: Option<usize>) -> Result<Facts> {
    let mut facts = Facts { cpus: cpus(), gpus, file_system: None, rotational: None };
    if let Some(path) = path {
        // Non-blocking, so that a FIFO cannot hang the open; nothing is read from it.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| crate::error::Error::io("open", path, None, e))?;
        facts.file_system = Some(file_system(&file, path)?);
        facts.rotational = file.metadata().ok().and_then(|m| rotational(m.dev()));
    }
    Ok(facts)
}

/// CPUs this process may run on (its affinity and cgroup quota when first asked), at least 1.
/// Learned once: the standard library reads the cgroup's files on every call, which cost a
/// small remote read more CPU than its request did when asked per read.
pub fn cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// The file system `file` (named `path` in errors) lives on.
pub fn file_system(file: &File, path: &Path) -> Result<FileSystem> {
    posix::file_system_magic(file, path).map(FileSystem::from_magic)
}

/// Whether the block device with number `dev` (a file's `st_dev`) spins, from sysfs's
/// `queue/rotational`; a partition's queue is its disk's, one directory up. `None` where sysfs
/// does not say (network and memory file systems have no block device).
pub fn rotational(dev: u64) -> Option<bool> {
    let (major, minor) = device_numbers(dev);
    let device = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    ["queue/rotational", "../queue/rotational"].iter().find_map(|name| {
        match std::fs::read_to_string(device.join(name)).ok()?.trim() {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        }
    })
}

/// The major and minor numbers of a device number, in the encoding glibc's `makedev` uses
/// (12 bits of major and 20 of minor, split across the 64 bits).
fn device_numbers(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xffff_f000);
    let minor = (dev & 0xff) | ((dev >> 12) & 0xffff_ff00);
    (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_split_as_glibc_does() {
        for (dev, want) in
            [(0x0801, (8, 1)), (0x10300, (259, 0)), (0x0010_0000_0000_0903, (0x100009, 3))]
        {
            assert_eq!(device_numbers(dev), want, "{dev:#x}");
        }
        let (major, minor) = (0x1234u64, 0x56789u64);
        let dev = ((major & 0xfff) << 8)
            | ((major & 0xffff_f000) << 32)
            | (minor & 0xff)
            | ((minor & 0xffff_ff00) << 12);
        assert_eq!(device_numbers(dev), (major, minor));
    }

    #[test]
    fn facts_of_a_file_and_of_the_machine() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let facts = gather(Some(&file), None).unwrap();
        assert!(facts.cpus >= 1);
        assert!(facts.file_system.is_some());
        let machine = gather(None, Some(2)).unwrap();
        assert_eq!((machine.file_system, machine.gpus), (None, Some(2)));
        assert!(gather(Some(&dir.path().join("missing")), None).is_err());
        // /proc is no block device, and the facts of a path do not fail for that.
        assert_eq!(gather(Some(Path::new("/proc/self/stat")), None).unwrap().rotational, None);
    }
}
