//! Automatic choices of settings, from facts about the machine and the file system, each with
//! its reason. [`tune`] is a pure function of [`Facts`] (gathered apart, by
//! the `tuning_facts` module), so that every rule is tested as a table of facts and choices.
//!
//! What a local disk gets is what it got before auto-tuning: the measured defaults of
//! [`crate::config`]. The facts change a choice only where they call for it:
//!
//! - a network file system (NFS, Lustre, GPFS, BeeGFS, CephFS, SMB, 9p, FUSE) serves each
//!   request after a round trip, so more requests in flight ([`NETWORK_THREADS`] threads) and
//!   larger ones ([`NETWORK_TASK_SIZE`]) hide the wait (measured on sshfs with added round
//!   trips: docs/decisions/0021-network-file-systems-64-threads-16mib.md);
//! - tmpfs holds files in memory and refuses `O_DIRECT`, so transfers there are buffered.
//!
//! An explicit setting — an environment variable, or `gpumapio.defaults.set` — always wins over
//! a choice made here; the consumers check [`crate::Config::is_explicit`] before applying one.
#![forbid(unsafe_code)]

use std::fmt;

use crate::config::{default_nthreads, SettingValue, DEFAULT_TASK_SIZE, MAX_THREADS};

/// Threads chosen for files on a network file system, where requests wait on round trips
/// rather than on the CPU (KvikIO's users found their remote reads bound by requests in flight:
/// cuDF #23633).
pub const NETWORK_THREADS: usize = 64;

// The network's count is within the pool's limit, so clamping to both never panics.
const _: () = assert!(NETWORK_THREADS <= MAX_THREADS);

/// Task size chosen for files on a network file system: one request carries more bytes for
/// each round trip.
pub const NETWORK_TASK_SIZE: u64 = 16 << 20;

/// The kind of file system a file lives on, from `statfs(2)`'s `f_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase", tag = "kind", content = "name"))]
pub enum FileSystem {
    /// A file system on a local block device (its name: `ext4`, `xfs`, ...).
    Local(&'static str),
    /// Memory (`tmpfs`, `ramfs`): no disk behind it, no `O_DIRECT`.
    Memory(&'static str),
    /// Served over a network or by a user-space daemon (its name: `nfs`, `lustre`, `fuse`, ...).
    Network(&'static str),
    /// A file system this table does not know (its magic number).
    Unknown(u32),
}

/// Magic numbers of `statfs(2)`'s `f_type` (Linux's `magic.h` and the file systems' own
/// headers), with the kind each one is.
const FILE_SYSTEMS: [(u32, FileSystem); 21] = [
    (0x0000_ef53, FileSystem::Local("ext4")), // ext2, ext3 and ext4 share it
    (0x5846_5342, FileSystem::Local("xfs")),
    (0x9123_683e, FileSystem::Local("btrfs")),
    (0xf2f5_2010, FileSystem::Local("f2fs")),
    (0x2fc1_2fc1, FileSystem::Local("zfs")),
    (0xca45_1a4e, FileSystem::Local("bcachefs")),
    (0x794c_7630, FileSystem::Local("overlay")),
    (0x4d44, FileSystem::Local("vfat")),
    (0x5346_544e, FileSystem::Local("ntfs")),
    (0x0102_1994, FileSystem::Memory("tmpfs")),
    (0x8584_58f6, FileSystem::Memory("ramfs")),
    (0x0000_6969, FileSystem::Network("nfs")),
    (0x0bd0_0bd0, FileSystem::Network("lustre")),
    (0x4750_4653, FileSystem::Network("gpfs")),
    (0x1983_0326, FileSystem::Network("beegfs")),
    (0x00c3_6400, FileSystem::Network("ceph")),
    (0xff53_4d42, FileSystem::Network("cifs")),
    (0xfe53_4d42, FileSystem::Network("smb2")),
    (0x0102_1997, FileSystem::Network("9p")),
    (0x6573_5546, FileSystem::Network("fuse")),
    (0x0000_564c, FileSystem::Network("ncp")),
];

impl FileSystem {
    /// The file system whose `f_type` is `magic`.
    pub fn from_magic(magic: u32) -> FileSystem {
        FILE_SYSTEMS
            .iter()
            .find(|(m, _)| *m == magic)
            .map_or(FileSystem::Unknown(magic), |(_, fs)| *fs)
    }

    /// Whether requests to it cross a network (or a user-space daemon).
    pub fn is_network(self) -> bool {
        matches!(self, FileSystem::Network(_))
    }
}

impl fmt::Display for FileSystem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileSystem::Local(name) => write!(f, "{name} (local)"),
            FileSystem::Memory(name) => write!(f, "{name} (memory)"),
            FileSystem::Network(name) => write!(f, "{name} (network)"),
            FileSystem::Unknown(magic) => write!(f, "unknown (f_type {magic:#x})"),
        }
    }
}

/// What the choices are made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Facts {
    /// CPUs this process may run on.
    pub cpus: usize,
    /// GPUs the driver reports, where it was asked.
    pub gpus: Option<usize>,
    /// The file system of the path asked about; `None` without a path.
    pub file_system: Option<FileSystem>,
    /// Whether the block device behind that file system spins; `None` where unknown.
    pub rotational: Option<bool>,
}

/// One setting's chosen value and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The [`crate::config::SETTINGS`] field it sets.
    pub setting: &'static str,
    /// The value chosen.
    pub value: SettingValue,
    /// Why, in a sentence.
    pub reason: String,
    /// Whether the facts moved it off the built-in default.
    pub tuned: bool,
}

/// The choices the facts call for, for the settings tuning has a rule for: the thread count,
/// the task size and `O_DIRECT` for reads and writes. The other settings keep their defaults
/// whatever the facts.
pub fn tune(facts: &Facts) -> Vec<Choice> {
    let mut choices = vec![threads(facts)];
    choices.extend(for_file(facts.file_system));
    choices
}

/// The choices of settings a file handle holds for itself (task size, `O_DIRECT`), for a file
/// on `file_system` (`None`: not known).
pub fn for_file(file_system: Option<FileSystem>) -> Vec<Choice> {
    vec![task_size(file_system), direct_read(file_system), direct_write(file_system)]
}

fn threads(facts: &Facts) -> Choice {
    let default = default_nthreads(facts.cpus);
    let (value, reason) = match facts.file_system {
        Some(fs @ FileSystem::Network(_)) => (
            default.clamp(NETWORK_THREADS, MAX_THREADS),
            format!(
                "{fs}: each request waits a round trip, so many in flight hide the wait \
                 ({NETWORK_THREADS} threads)"
            ),
        ),
        _ => {
            let spinning = if facts.rotational == Some(true) {
                "; the disk spins, and the default is kept for it too"
            } else {
                ""
            };
            (default, format!("{} CPUs: one thread each, at most 16{spinning}", facts.cpus))
        }
    };
    Choice {
        setting: "nthreads",
        value: SettingValue::Count(value as u64),
        reason,
        tuned: value != default,
    }
}

fn task_size(file_system: Option<FileSystem>) -> Choice {
    let (value, reason) = match file_system {
        Some(fs @ FileSystem::Network(_)) => (
            NETWORK_TASK_SIZE,
            format!("{fs}: a larger request spreads each round trip over more bytes"),
        ),
        _ => (DEFAULT_TASK_SIZE, "the default (docs/decisions/0005-bounce-buffers-4mib.md)".into()),
    };
    Choice {
        setting: "task_size",
        value: SettingValue::Size(value),
        reason,
        tuned: value != DEFAULT_TASK_SIZE,
    }
}

fn direct_read(file_system: Option<FileSystem>) -> Choice {
    let reason = match file_system {
        Some(fs @ FileSystem::Memory(_)) => format!("{fs} refuses O_DIRECT: reads are buffered"),
        _ => "the default: a file read twice comes from the page cache the second time".into(),
    };
    Choice { setting: "direct_io_read", value: word("off"), reason, tuned: false }
}

fn direct_write(file_system: Option<FileSystem>) -> Choice {
    match file_system {
        Some(fs @ FileSystem::Memory(_)) => Choice {
            setting: "direct_io_write",
            value: word("off"),
            reason: format!("{fs} refuses O_DIRECT: writes are buffered"),
            tuned: true,
        },
        _ => Choice {
            setting: "direct_io_write",
            value: word("on"),
            reason: "the default: the aligned middle of writes bypasses the page cache".into(),
            tuned: false,
        },
    }
}

fn word(text: &str) -> SettingValue {
    SettingValue::Word(text.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, SETTINGS};

    fn facts(cpus: usize, file_system: Option<FileSystem>, rotational: Option<bool>) -> Facts {
        Facts { cpus, gpus: Some(1), file_system, rotational }
    }

    /// (setting, value) of each choice, for compact tables.
    fn values(facts: &Facts) -> Vec<(&'static str, String, bool)> {
        tune(facts).into_iter().map(|c| (c.setting, c.value.to_string(), c.tuned)).collect()
    }

    /// Facts, and the (setting, value, tuned) of each choice they give.
    type Row = (Facts, [(&'static str, &'static str, bool); 4]);

    const MIB4: &str = "4194304";
    const MIB16: &str = "16777216";

    #[test]
    fn choices_by_facts() {
        let ext4 = Some(FileSystem::from_magic(0xef53));
        let nfs = Some(FileSystem::from_magic(0x6969));
        let tmpfs = Some(FileSystem::from_magic(0x0102_1994));
        let odd = Some(FileSystem::from_magic(0x1234_5678));
        #[rustfmt::skip]
        let table: Vec<Row> = vec![
            // No path: the measured defaults.
            (facts(8, None, None), [("nthreads", "8", false), ("task_size", MIB4, false),
                ("direct_io_read", "off", false), ("direct_io_write", "on", false)]),
            (facts(64, None, None), [("nthreads", "16", false), ("task_size", MIB4, false),
                ("direct_io_read", "off", false), ("direct_io_write", "on", false)]),
            // Local disks, spinning or not: the same.
            (facts(4, ext4, Some(false)), [("nthreads", "4", false), ("task_size", MIB4, false),
                ("direct_io_read", "off", false), ("direct_io_write", "on", false)]),
            (facts(4, ext4, Some(true)), [("nthreads", "4", false), ("task_size", MIB4, false),
                ("direct_io_read", "off", false), ("direct_io_write", "on", false)]),
            (facts(32, odd, None), [("nthreads", "16", false), ("task_size", MIB4, false),
                ("direct_io_read", "off", false), ("direct_io_write", "on", false)]),
            // Network: many requests in flight, larger ones.
            (facts(2, nfs, None), [("nthreads", "64", true), ("task_size", MIB16, true),
                ("direct_io_read", "off", false), ("direct_io_write", "on", false)]),
            (facts(1, nfs, None), [("nthreads", "64", true), ("task_size", MIB16, true),
                ("direct_io_read", "off", false), ("direct_io_write", "on", false)]),
            // Memory: no O_DIRECT.
            (facts(2, tmpfs, None), [("nthreads", "2", false), ("task_size", MIB4, false),
                ("direct_io_read", "off", false), ("direct_io_write", "off", true)]),
        ];
        for (facts, want) in table {
            let want: Vec<_> = want.iter().map(|(s, v, t)| (*s, v.to_string(), *t)).collect();
            assert_eq!(values(&facts), want, "{facts:?}");
        }
    }

    /// A network file system gets the network's thread count whatever the CPUs (the default
    /// is at most 16, below it), within the pool's limit.
    #[test]
    fn network_threads_are_bounded() {
        let nfs = Some(FileSystem::Network("nfs"));
        for (cpus, want) in [(1, 64), (16, 64), (100, 64), (5000, 64)] {
            assert_eq!(values(&facts(cpus, nfs, None))[0].1, want.to_string(), "{cpus}");
        }
    }

    /// Where the facts leave a setting alone, the choice is what `Config::default` holds: what
    /// local-disk users got before auto-tuning.
    #[test]
    fn untuned_choices_are_the_defaults() {
        let defaults = Config::default();
        let cpus = defaults.nthreads; // at most 16, so the default rule gives it back
        for fs in [None, Some(FileSystem::Local("xfs")), Some(FileSystem::Unknown(7))] {
            for choice in tune(&facts(cpus, fs, None)) {
                let spec = SETTINGS.iter().find(|s| s.field == choice.setting).unwrap();
                assert!(!choice.tuned, "{fs:?} {choice:?}");
                assert_eq!(choice.value, spec.value(&defaults), "{fs:?} {}", choice.setting);
            }
        }
    }

    /// Every choice names a row of the settings table, and its value reads back through that
    /// row's parser.
    #[test]
    fn choices_are_settings_of_the_table() {
        for fs in [None, Some(FileSystem::Network("lustre")), Some(FileSystem::Memory("tmpfs"))] {
            for choice in tune(&facts(8, fs, None)) {
                let spec = SETTINGS.iter().find(|s| s.field == choice.setting).unwrap();
                let mut c = Config::default();
                spec.parse_into(&mut c, &choice.value.to_string()).unwrap();
                assert_eq!(spec.value(&c), choice.value);
                assert!(!choice.reason.is_empty());
            }
        }
    }

    #[test]
    fn file_systems_by_magic() {
        for (magic, want) in [
            (0xef53, "ext4 (local)"),
            (0x5846_5342, "xfs (local)"),
            (0x0102_1994, "tmpfs (memory)"),
            (0x6969, "nfs (network)"),
            (0x6573_5546, "fuse (network)"),
            (0x0bd0_0bd0, "lustre (network)"),
            (0xdead, "unknown (f_type 0xdead)"),
        ] {
            assert_eq!(FileSystem::from_magic(magic).to_string(), want);
        }
        let magics: std::collections::HashSet<_> = FILE_SYSTEMS.iter().map(|(m, _)| m).collect();
        assert_eq!(magics.len(), FILE_SYSTEMS.len());
    }
}
