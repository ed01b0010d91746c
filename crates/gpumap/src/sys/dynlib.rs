//! Shared libraries loaded at run time (`dlopen`), for the optional toolkits gpumap uses when
//! they are there (cuFile, NVTX).

use libloading::Library;

/// Opens the first of `candidates` that loads, kept for the life of the process (fn pointers
/// into it are cached in statics). Otherwise, one line per candidate: its name and why `dlopen`
/// refused it (libloading's own message says only "dlopen failed"; the reason is its source).
///
/// # Safety
/// Loading a library runs its initialisers: every candidate must be a library whose
/// initialisers only set up its own state.
pub(crate) unsafe fn open_first<S: AsRef<str>>(
    candidates: &[S],
) -> Result<(String, &'static Library), Vec<String>> {
    let mut errors = Vec::new();
    for name in candidates {
        let name = name.as_ref();
        // SAFETY: the caller vouches for the candidates' initialisers.
        match unsafe { Library::new(name) } {
            Ok(lib) => return Ok((name.to_owned(), Box::leak(Box::new(lib)))),
            Err(e) => errors.push(match std::error::Error::source(&e) {
                Some(detail) => format!("{name}: {detail}"),
                None => format!("{name}: {e}"),
            }),
        }
    }
    Err(errors)
}

/// Resolves `symbol` from `lib` (named `library` in the error) as a fn pointer of type `F`.
///
/// # Safety
/// `F` must be the exact C signature of `symbol`.
pub(crate) unsafe fn symbol<F: Copy>(
    lib: &'static Library,
    library: &str,
    symbol: &str,
) -> Result<F, String> {
    // SAFETY: the caller guarantees the signature; `lib` lives for the process, so the pointer
    // never dangles.
    unsafe { lib.get::<F>(symbol.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("{library} lacks {symbol}: {e}"))
}
