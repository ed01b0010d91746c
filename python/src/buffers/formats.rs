//! The element formats of memory handed over from Python (buffer-protocol format strings,
//! array-interface typestrs and descrs): which are plain data gpumap may move bytes into, and
//! which are native signed integers of 4 or 8 bytes.

use pyo3::ffi;
use pyo3::prelude::*;

/// `Some(4 | 8)` for a buffer-protocol format of one signed integer of 4 or 8 bytes
/// (`itemsize`) in the machine's byte order: `i`, `l`, `q`, `n` (and `b`, `h` never are).
pub(super) fn format_signed_int(format: &str, itemsize: ffi::Py_ssize_t) -> Option<u32> {
    let code = match format.as_bytes() {
        [c] | [b'@' | b'=', c] => *c,
        [b'<', c] if cfg!(target_endian = "little") => *c,
        [b'>' | b'!', c] if cfg!(target_endian = "big") => *c,
        _ => return None,
    };
    (matches!(code, b'i' | b'l' | b'q' | b'n') && (itemsize == 4 || itemsize == 8))
        .then_some(itemsize as u32)
}

/// `Some(4 | 8)` for an array-interface typestr of a signed integer of 4 or 8 bytes in the
/// machine's byte order (`<i4`, `=i8`, ...).
pub(super) fn typestr_signed_int(typestr: &str) -> Option<u32> {
    let native = if cfg!(target_endian = "little") { '<' } else { '>' };
    let mut chars = typestr.chars();
    let order = chars.next()?;
    if (order != native && order != '=') || chars.next()? != 'i' {
        return None;
    }
    chars.as_str().parse().ok().filter(|&n| n == 4 || n == 8)
}

/// What the refusals of non-plain data go on to say.
pub(super) const PLAIN_DATA: &str = "gpumap moves raw bytes, so it takes only plain data \
                                     (integers, floats, complex numbers, bools, bytes, \
                                     and records of them)";

/// Checks a buffer-protocol format string (the `struct` module's syntax, with PEP 3118's
/// additions) for items that are not plain data: Python objects (`O`) are references whose
/// counts break when bytes land on them, and pointers (`P`, `z`, `&`, function pointers) point
/// at memory the bytes of a file know nothing of. Anything not known to be plain is refused.
pub(super) fn check_format(format: &str) -> Result<(), String> {
    let mut chars = format.chars().peekable();
    let mut depth = 0usize;
    while let Some(c) = chars.next() {
        match c {
            // Byte order and alignment, repeat counts, spacing.
            '@' | '=' | '<' | '>' | '!' | '^' | ' ' | '0'..='9' => {}
            // Numbers, bools, characters, byte and character strings, padding.
            'b' | 'B' | 'h' | 'H' | 'i' | 'I' | 'l' | 'L' | 'q' | 'Q' | 'n' | 'N' | 'e' | 'f'
            | 'd' | 'g' | '?' | 'c' | 's' | 'p' | 'x' | 'u' | 'w' => {}
            // Complex numbers: Z and the float type of the parts.
            'Z' => match chars.next() {
                Some('e' | 'f' | 'd' | 'g') => {}
                other => {
                    return Err(format!(
                        "whose complex type Z{} gpumap does not know",
                        other.map(String::from).unwrap_or_default()
                    ))
                }
            },
            // Records: `T{...}`, with field names `:name:` and sub-array shapes `(2,3)`.
            'T' if chars.peek() == Some(&'{') => {
                chars.next();
                depth += 1;
            }
            '}' if depth > 0 => depth -= 1,
            ':' => {
                if !chars.by_ref().any(|c| c == ':') {
                    return Err("with a field name that does not end".into());
                }
            }
            '(' => {
                if !chars.by_ref().any(|c| c == ')') {
                    return Err("with a shape that does not end".into());
                }
            }
            'O' => return Err("which are Python objects".into()),
            'P' | 'z' | '&' | 'X' => return Err(format!("which hold pointers ({c:?})")),
            other => return Err(format!("whose item type {other:?} is not known plain data")),
        }
    }
    Ok(())
}

/// Checks a `__cuda_array_interface__` typestr (`<f4`, `|u1`, `|V16`, ...): the kinds NumPy's
/// array interface defines for plain data pass; objects (`O`), bit fields and unknown kinds are
/// refused.
pub(super) fn check_typestr(typestr: &str) -> Result<(), String> {
    let mut chars = typestr.chars();
    let order = chars.next();
    let kind = chars.next();
    if !matches!(order, Some('<' | '>' | '|' | '=')) {
        return Err(format!("typestr {typestr:?} does not start with a byte order"));
    }
    match kind {
        Some('b' | 'i' | 'u' | 'f' | 'c' | 'm' | 'M' | 'S' | 'U' | 'V') => Ok(()),
        Some('O') => Err(format!("typestr {typestr:?} is of Python objects")),
        _ => Err(format!("typestr {typestr:?} is not a kind of plain data gpumap knows")),
    }
}

/// Checks the `descr` of a `__cuda_array_interface__` record (a list of `(name, typestr)` or
/// `(name, typestr, shape)`, or of `(name, descr)` for nested records) field by field.
pub(super) fn check_descr(descr: &Bound<'_, PyAny>) -> PyResult<Result<(), String>> {
    let Ok(fields) = descr.try_iter() else {
        return Ok(Err("its descr is not a list of fields".into()));
    };
    for field in fields {
        let field = field?;
        let Ok(kind) = field.get_item(1) else {
            return Ok(Err(format!("descr field {field} is not (name, type)")));
        };
        let found = match kind.extract::<String>() {
            Ok(typestr) => check_typestr(&typestr),
            Err(_) => check_descr(&kind)?,
        };
        if let Err(why) = found {
            return Ok(Err(format!("descr field {field}: {why}")));
        }
    }
    Ok(Ok(()))
}
