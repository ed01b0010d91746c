//! [`OpenFlags`]: the `fopen`-style flags a [`FileHandle`](super::FileHandle) is opened with,
//! parsed.
#![forbid(unsafe_code)]

use std::fs::OpenOptions;

use crate::error::{Error, Result};

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
///
/// [`FileHandle::append`]: super::FileHandle::append
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

impl OpenFlags {
    /// The [`OpenOptions`] these flags ask for (an appending file is opened for appending, not
    /// for positional writes), for callers to add their own mode and custom flags to.
    pub fn open_options(&self) -> OpenOptions {
        let mut options = OpenOptions::new();
        options
            .read(self.read)
            .write(self.write && !self.append)
            .append(self.append)
            .create(self.create)
            .truncate(self.truncate);
        options
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
    fn open_options_create_truncate_and_append_as_the_flags_say() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let flags: OpenFlags = "r".parse().unwrap();
        assert!(flags.open_options().open(&path).is_err(), "\"r\" created a missing file");
        let flags: OpenFlags = "w".parse().unwrap();
        std::io::Write::write_all(&mut flags.open_options().open(&path).unwrap(), b"abc").unwrap();
        let flags: OpenFlags = "a".parse().unwrap();
        std::io::Write::write_all(&mut flags.open_options().open(&path).unwrap(), b"de").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"abcde");
        let flags: OpenFlags = "w+".parse().unwrap();
        drop(flags.open_options().open(&path).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"");
    }
}
