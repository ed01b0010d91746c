//! File paths taken from Python as Python's own file functions take them: `str`, `bytes`, or
//! an `os.PathLike` of either (KvikIO runs `os.fsencode` on its paths). PyO3's `PathBuf`
//! takes `str` and `PathLike[str]` only, and refused `bytes` naming `str`.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// `ob` as a path, through `os.fspath`: a `TypeError` naming what it is where it is none.
pub(crate) fn path(ob: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    let fspath = ob.py().import("os")?.getattr("fspath")?.call1((ob,))?;
    match fspath.cast::<PyBytes>() {
        Ok(bytes) => Ok(PathBuf::from(OsString::from_vec(bytes.as_bytes().to_vec()))),
        Err(_) => fspath.extract::<PathBuf>(),
    }
}
