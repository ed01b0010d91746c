//! `plain_header` and `plain_index`: the common case of a safetensors header — the JSON
//! safetensors' writers produce — read and checked in one pass over its bytes, for
//! `gpumapio.safetensors`; and likewise a checkpoint's `model.safetensors.index.json`.
//!
//! Checkpoints hold thousands of small tensors, and Python's `json` with the hooks that make it
//! read as safetensors does costs microseconds per tensor. This pass accepts a strict subset of
//! JSON (strings without escapes or control characters, sizes written as plain digits, every
//! entry exactly `dtype`, `shape` and `data_offsets`, `__metadata__` a map of strings) and
//! answers `None` for anything else, well formed or not: the Python checker then reads the
//! header and names what is wrong. Where it answers, the answer is the Python checker's, which
//! the tests hold it to.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

/// safetensors' dtypes and their bits per element (its `Dtype` enum).
const DTYPES: [(&str, u64); 22] = [
    ("BOOL", 8),
    ("F4", 4),
    ("F6_E2M3", 6),
    ("F6_E3M2", 6),
    ("U8", 8),
    ("I8", 8),
    ("F8_E5M2", 8),
    ("F8_E4M3", 8),
    ("F8_E8M0", 8),
    ("F8_E4M3FNUZ", 8),
    ("F8_E5M2FNUZ", 8),
    ("I16", 16),
    ("U16", 16),
    ("F16", 16),
    ("BF16", 16),
    ("I32", 32),
    ("U32", 32),
    ("F32", 32),
    ("C64", 64),
    ("F64", 64),
    ("I64", 64),
    ("U64", 64),
];

/// One tensor's entry, checked on its own; offsets relative to the data section.
struct Entry<'a> {
    name: &'a str,
    /// Its dtype's place in [`DTYPES`].
    dtype: usize,
    shape: Vec<u64>,
    begin: u64,
    end: u64,
}

/// What the pass found: the tensors in header order and `__metadata__`, if any.
struct Plain<'a> {
    entries: Vec<Entry<'a>>,
    metadata: Option<Vec<(&'a str, &'a str)>>,
}

/// A cursor over the header's bytes; every method answers `None` where the text leaves the
/// subset this pass reads.
struct Scanner<'a> {
    /// The whole text, checked UTF-8 once (as JSON must be): its strings are then slices of
    /// it between ASCII quotes, with no check of their own.
    source: &'a str,
    text: &'a [u8],
    at: usize,
    /// The last entry's dtype (its place in [`DTYPES`]), tried first: a checkpoint's tensors
    /// are mostly of one dtype.
    last_dtype: usize,
}

impl<'a> Scanner<'a> {
    /// A scanner at the start of `raw`; `None` if `raw` is not UTF-8.
    fn new(raw: &'a [u8]) -> Option<Self> {
        let source = std::str::from_utf8(raw).ok()?;
        Some(Scanner { source, text: raw, at: 0, last_dtype: 0 })
    }

    fn skip_space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.text.get(self.at) {
            self.at += 1;
        }
    }

    /// Takes `byte`, after any whitespace.
    fn take(&mut self, byte: u8) -> Option<()> {
        self.skip_space();
        (self.text.get(self.at) == Some(&byte)).then(|| self.at += 1)
    }

    /// Whether `byte` comes next (after whitespace), taking it if so.
    fn next_is(&mut self, byte: u8) -> bool {
        self.take(byte).is_some()
    }

    /// A string with no escape and no control character, as UTF-8 text.
    fn string(&mut self) -> Option<&'a str> {
        self.take(b'"')?;
        self.string_rest()
    }

    /// A size written as JSON writes a whole number from 0 to 2^64 - 1: no sign, no leading
    /// zero, no fraction or exponent.
    fn size(&mut self) -> Option<u64> {
        self.skip_space();
        self.digits()
    }

    /// [`Scanner::size`] with no whitespace before it.
    fn digits(&mut self) -> Option<u64> {
        let start = self.at;
        let mut value: u64 = 0;
        while let Some(&b) = self.text.get(self.at).filter(|b| b.is_ascii_digit()) {
            value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
            self.at += 1;
        }
        let digits = self.at - start;
        if digits == 0 || (digits > 1 && self.text[start] == b'0') {
            return None;
        }
        // A fraction or an exponent would make it a float.
        match self.text.get(self.at) {
            Some(b'.' | b'e' | b'E') => None,
            _ => Some(value),
        }
    }

    /// `[size, ...]`.
    fn sizes(&mut self) -> Option<Vec<u64>> {
        self.take(b'[')?;
        let mut out = Vec::new();
        if self.next_is(b']') {
            return Some(out);
        }
        loop {
            out.push(self.size()?);
            if self.next_is(b']') {
                return Some(out);
            }
            self.take(b',')?;
        }
    }

    /// `[a, b]`: two sizes, without a vector for them (every entry's offsets are so).
    fn pair(&mut self) -> Option<[u64; 2]> {
        self.take(b'[')?;
        let first = self.size()?;
        self.take(b',')?;
        let second = self.size()?;
        self.take(b']')?;
        Some([first, second])
    }

    /// The members of an object, `each` called after each key's colon to read its value.
    fn object(&mut self, mut each: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.take(b'{')?;
        if self.next_is(b'}') {
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.take(b':')?;
            each(self, key)?;
            if self.next_is(b'}') {
                return Some(());
            }
            self.take(b',')?;
        }
    }

    /// The place in [`DTYPES`] of the dtype named `text`.
    fn dtype_named(&mut self, text: &str) -> Option<usize> {
        if DTYPES[self.last_dtype].0 != text {
            self.last_dtype = DTYPES.iter().position(|(d, _)| *d == text)?;
        }
        Some(self.last_dtype)
    }

    /// Takes `literal` if the text goes on with exactly it (no whitespace skipped).
    fn literal(&mut self, literal: &[u8]) -> Option<()> {
        let end = self.at + literal.len();
        (self.text.get(self.at..end) == Some(literal)).then(|| self.at = end)
    }

    /// A string's text up to its closing quote, which it takes (the opening one taken).
    fn string_rest(&mut self) -> Option<&'a str> {
        let start = self.at;
        let len = first_special(&self.text[start..])?;
        if self.text[start + len] != b'"' {
            return None;
        }
        self.at = start + len + 1;
        self.source.get(start..start + len)
    }

    /// An entry as safetensors writes one, `{"dtype":"..","shape":[..],"data_offsets":[a,b]}`
    /// with no whitespace: read without a key's match or a closure per member (two thirds of
    /// a checkpoint's header text is such entries). `None`, with nothing taken, for any
    /// other text, which [`Scanner::entry`] then reads.
    fn compact_entry(&mut self, name: &'a str) -> Option<Entry<'a>> {
        let start = self.at;
        let entry = (|| {
            self.literal(b"{\"dtype\":\"")?;
            let text = self.string_rest()?;
            let dtype = self.dtype_named(text)?;
            self.literal(b",\"shape\":[")?;
            let mut shape = Vec::new();
            if self.literal(b"]").is_none() {
                loop {
                    shape.push(self.digits()?);
                    if self.literal(b"]").is_some() {
                        break;
                    }
                    self.literal(b",")?;
                }
            }
            self.literal(b",\"data_offsets\":[")?;
            let begin = self.digits()?;
            self.literal(b",")?;
            let end = self.digits()?;
            self.literal(b"]}")?;
            Some(Entry { name, dtype, shape, begin, end })
        })();
        if entry.is_none() {
            self.at = start;
        }
        entry
    }

    /// One tensor's entry: exactly `dtype`, `shape` and `data_offsets`, each once.
    fn entry(&mut self, name: &'a str) -> Option<Entry<'a>> {
        self.skip_space();
        if let Some(entry) = self.compact_entry(name) {
            return Some(entry);
        }
        let (mut dtype, mut shape, mut offsets) = (None, None, None);
        self.object(|s, key| {
            match key {
                "dtype" if dtype.is_none() => {
                    let text = s.string()?;
                    dtype = Some(s.dtype_named(text)?);
                }
                "shape" if shape.is_none() => shape = Some(s.sizes()?),
                "data_offsets" if offsets.is_none() => offsets = Some(s.pair()?),
                _ => return None,
            }
            Some(())
        })?;
        let [begin, end] = offsets?;
        Some(Entry { name, dtype: dtype?, shape: shape?, begin, end })
    }

    /// `{"key": "value", ...}` with no key twice.
    fn metadata(&mut self) -> Option<Vec<(&'a str, &'a str)>> {
        let mut out = Vec::new();
        self.object(|s, key| {
            out.push((key, s.string()?));
            Some(())
        })?;
        let keys: HashSet<&str> = out.iter().map(|(k, _)| *k).collect();
        (keys.len() == out.len()).then_some(out)
    }

    /// The whole header, with nothing after it but whitespace.
    fn header(&mut self) -> Option<Plain<'a>> {
        let mut entries = Vec::new();
        let mut metadata = None;
        self.object(|s, key| {
            if key == "__metadata__" {
                if metadata.is_some() {
                    return None;
                }
                metadata = Some(s.metadata()?);
            } else {
                entries.push(s.entry(key)?);
            }
            Some(())
        })?;
        self.skip_space();
        (self.at == self.text.len()).then_some(Plain { entries, metadata })
    }
}

/// Where the first `"`, `\\` or control character of `bytes` is: a JSON string's end, or
/// what this pass declines in one. Eight bytes are judged at a time, as the names and file
/// names of a checkpoint of many tensors are most of its text (twice the rate of a byte at a
/// time).
fn first_special(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // High bit set in each byte of `v` that is zero, or below `n` (`n` <= 0x80). Borrows can
    // also mark bytes above a marked one, never below: the lowest mark is exact.
    let below = |v: u64, n: u8| v.wrapping_sub(ONES * u64::from(n)) & !v & HIGH;
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for word in &mut words {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(word);
        let x = u64::from_le_bytes(eight);
        let marks = below(x ^ (ONES * u64::from(b'"')), 1)
            | below(x ^ (ONES * u64::from(b'\\')), 1)
            | below(x, 0x20);
        if marks != 0 {
            return Some(at + (marks.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    words.remainder().iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20).map(|p| at + p)
}

/// A metadata value of an index: a string or a size.
enum Value<'a> {
    Text(&'a str),
    Size(u64),
}

/// What the pass found in an index: its `weight_map` and `metadata`, each in file order.
struct Index<'a> {
    weight_map: Vec<(&'a str, &'a str)>,
    metadata: Option<Vec<(&'a str, Value<'a>)>>,
    /// Whether `metadata` comes first in the text (json keeps the text's order).
    metadata_first: bool,
}

impl<'a> Scanner<'a> {
    /// An index as transformers writes one: `{"metadata": {...}, "weight_map": {...}}`, each
    /// at most once, metadata values strings or sizes, no key twice in any object.
    fn index(&mut self) -> Option<Index<'a>> {
        let (mut weight_map, mut metadata, mut metadata_first) = (None, None, false);
        self.object(|s, key| {
            match key {
                "weight_map" if weight_map.is_none() => {
                    let mut pairs = Vec::new();
                    s.object(|s, name| {
                        pairs.push((name, s.string()?));
                        Some(())
                    })?;
                    weight_map = Some(pairs);
                }
                "metadata" if metadata.is_none() => {
                    metadata_first = weight_map.is_none();
                    let mut pairs = Vec::new();
                    s.object(|s, name| {
                        s.skip_space();
                        let value = match s.text.get(s.at) {
                            Some(b'"') => Value::Text(s.string()?),
                            _ => Value::Size(s.size()?),
                        };
                        pairs.push((name, value));
                        Some(())
                    })?;
                    metadata = Some(pairs);
                }
                _ => return None,
            }
            Some(())
        })?;
        self.skip_space();
        if self.at != self.text.len() {
            return None;
        }
        let weight_map = weight_map?;
        // The weight map's names are checked unique by the dict `plain_index` builds of them.
        if let Some(m) = &metadata {
            if m.iter().map(|(k, _)| *k).collect::<HashSet<_>>().len() != m.len() {
                return None;
            }
        }
        Some(Index { weight_map, metadata, metadata_first })
    }
}

/// A checkpoint index's bytes, as `json.loads` reads them — `{"weight_map": {...},
/// "metadata": {...}}` as dicts — for the common case: a `weight_map` of names to file names
/// and an optional `metadata` of strings and sizes, strings without escapes, nothing else;
/// `None` for anything else, which Python's `json` then reads.
#[pyfunction]
pub fn plain_index<'py>(py: Python<'py>, raw: &[u8]) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(index) = Scanner::new(raw).and_then(|mut s| s.index()) else { return Ok(None) };
    let out = PyDict::new(py);
    let metadata = metadata_dict(py, index.metadata)?;
    if let (Some(m), true) = (&metadata, index.metadata_first) {
        out.set_item("metadata", m)?;
    }
    let weight_map = PyDict::new(py);
    // Thousands of names map to a few files, mostly one file's names after another: one
    // Python string per file, the last one tried first.
    let mut files: HashMap<&str, Bound<'py, PyString>> = HashMap::new();
    let mut previous: Option<(&str, Bound<'py, PyString>)> = None;
    let pairs = index.weight_map.len();
    for (name, file) in index.weight_map {
        let value = match &previous {
            Some((last, value)) if *last == file => value.clone(),
            _ => files.entry(file).or_insert_with(|| PyString::new(py, file)).clone(),
        };
        weight_map.set_item(name, &value)?;
        previous = Some((file, value));
    }
    // A name given twice (the dict keeps one of them): the Python reader names it.
    if weight_map.len() != pairs {
        return Ok(None);
    }
    out.set_item("weight_map", weight_map)?;
    if let (Some(m), false) = (&metadata, index.metadata_first) {
        out.set_item("metadata", m)?;
    }
    Ok(Some(out))
}

/// An index's `metadata` as a dict (`None` without one).
fn metadata_dict<'py>(
    py: Python<'py>,
    metadata: Option<Vec<(&str, Value<'_>)>>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(pairs) = metadata else { return Ok(None) };
    let dict = PyDict::new(py);
    for (k, v) in pairs {
        match v {
            Value::Text(t) => dict.set_item(k, t)?,
            Value::Size(n) => dict.set_item(k, n)?,
        }
    }
    Ok(Some(dict))
}

/// An index (one [`plain_index`] reads) with each name's shard number, and its metadata.
struct MappedIndex<'a> {
    /// Each name's shard, and whether a header has been found to hold it.
    shard_of_name: HashMap<&'a str, (usize, bool)>,
    metadata: Option<Vec<(&'a str, Value<'a>)>>,
}

/// The index `raw` mapped through `shard_of` (each file name it uses to its shard's number);
/// `None` outside the common case, or where it names another file or a name twice. Made on a
/// thread of its own while the headers are parsed, as the index is the largest text of a
/// checkpoint of many tensors.
fn map_index<'a>(raw: &'a [u8], shard_of: &HashMap<String, usize>) -> Option<MappedIndex<'a>> {
    let index = Scanner::new(raw)?.index()?;
    let mut shard_of_name = HashMap::with_capacity(index.weight_map.len());
    // Names come a file's at a time: the last file's number is tried first.
    let mut last: Option<(&str, usize)> = None;
    for (name, file) in index.weight_map {
        let shard = match last {
            Some((last_file, shard)) if last_file == file => shard,
            _ => *shard_of.get(file)?,
        };
        last = Some((file, shard));
        if shard_of_name.insert(name, (shard, false)).is_some() {
            return None; // a name given twice
        }
    }
    Some(MappedIndex { shard_of_name, metadata: index.metadata })
}

/// Whether a mapped index gives every tensor the shard whose header holds it, once, and no
/// other name: `Some(metadata)` where it does; `None` where it does not or cannot tell (a
/// header declined), and the Python reader then reads the index and names what is wrong.
/// Where it does, no header names a tensor twice: the one lookup per tensor proves it.
fn index_agrees<'a>(
    mut index: MappedIndex<'a>,
    headers: &[Option<Plain<'_>>],
) -> Option<Option<Vec<(&'a str, Value<'a>)>>> {
    let mut found = 0usize;
    for (shard, header) in headers.iter().enumerate() {
        for entry in &header.as_ref()?.entries {
            match index.shard_of_name.get_mut(entry.name) {
                Some((s, seen)) if *s == shard && !*seen => *seen = true,
                _ => return None,
            }
            found += 1;
        }
    }
    (found == index.shard_of_name.len()).then_some(index.metadata)
}

/// The shard files an index names, each once, in the order of their first tensor — for an
/// index [`plain_index`] reads, or declines only for a name given twice (`None` for any
/// other) — without an object per tensor: a whole load starts reading the shards with these,
/// and reads and checks the weight map meanwhile (which refuses the repeated name).
#[pyfunction]
pub fn plain_index_files<'py>(py: Python<'py>, raw: &[u8]) -> PyResult<Option<Bound<'py, PyList>>> {
    let Some(index) = Scanner::new(raw).and_then(|mut s| s.index()) else { return Ok(None) };
    let mut files: Vec<&str> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut previous = None;
    for (_, file) in index.weight_map {
        if previous != Some(file) && seen.insert(file) {
            files.push(file);
        }
        previous = Some(file);
    }
    Ok(Some(PyList::new(py, files)?))
}

/// Bits per element of a known dtype.
fn bits_of(dtype: usize) -> u64 {
    DTYPES[dtype].1
}

/// The checks of the Python checker on entries that parsed: each tensor's bytes are those of
/// its shape (counted in order, each step within 64 bits), and the tensors tile the data
/// section from its first byte to the end of the file. The entries come back in file order
/// (by start, then end, ties in header order).
fn checked(mut entries: Vec<Entry<'_>>, data_start: u64, file_size: u64) -> Option<Vec<Entry<'_>>> {
    for e in &entries {
        let count = e.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))?;
        let bits = count.checked_mul(bits_of(e.dtype))?;
        let bytes = e.end.checked_sub(e.begin)?;
        if bytes.checked_mul(8)? != bits {
            return None;
        }
    }
    entries.sort_by_key(|e| (e.begin, e.end));
    let mut at = 0u64;
    for e in &entries {
        if e.begin != at {
            return None;
        }
        at = e.end;
    }
    (data_start.checked_add(at)? == file_size).then_some(entries)
}

/// `plain_header`'s answer: the tensors' names, dtypes, shapes, starts and ends (file
/// offsets, absolute), in file order, and the metadata if the header has it.
type Columns<'py> = (
    Bound<'py, PyList>,
    Bound<'py, PyList>,
    Bound<'py, PyList>,
    Bound<'py, PyList>,
    Bound<'py, PyList>,
    Option<Bound<'py, PyDict>>,
);

/// A header read and checked, its entries in file order; `None` outside the common case.
/// Whether a name is given twice is not checked here (see [`names_unique`]).
fn parse(raw: &[u8], data_start: u64, file_size: u64) -> Option<Plain<'_>> {
    let plain = Scanner::new(raw)?.header()?;
    let entries = checked(plain.entries, data_start, file_size)?;
    Some(Plain { entries, metadata: plain.metadata })
}

/// `plain` if it names no tensor twice (which json would read as one).
fn names_unique(plain: Plain<'_>) -> Option<Plain<'_>> {
    let mut names = HashSet::with_capacity(plain.entries.len());
    plain.entries.iter().all(|e| names.insert(e.name)).then_some(plain)
}

/// The tensors of the header `raw` (the JSON after the 8-byte length) of a file of
/// `file_size` bytes whose data section starts at `data_start`, as columns — names, dtypes,
/// shapes (tuples), starts and ends (file offsets, absolute), in file order — and its metadata
/// (a dict of strings, or `None` without one); `None` for a header outside the common case,
/// which the Python checker then reads. Columns, not an object per tensor: a checkpoint's
/// loader needs only these lists, and thousands of objects cost more than the parse.
#[pyfunction]
pub fn plain_header<'py>(
    py: Python<'py>,
    raw: &[u8],
    data_start: u64,
    file_size: u64,
) -> PyResult<Option<Columns<'py>>> {
    parse(raw, data_start, file_size)
        .and_then(names_unique)
        .map(|plain| columns(py, plain, data_start))
        .transpose()
}

/// A checkpoint's headers as [`plain_header`] reads each (`(raw, data_start, file_size)`
/// each), read at once on several threads without the GIL; with `index` (its bytes, and
/// `shard_of`: each file name it uses to its shard's number, the shards numbered as
/// `headers`), whether the index maps every tensor to the shard whose header holds it and
/// names no other: `(metadata,)` where it does; `None` where it does not or cannot tell (a
/// header or the index outside the common case), and the Python reader then names what is
/// wrong. A whole load of thousands of tensors reads its headers and checks its index here,
/// while its reads run.
///
/// `threads`: at most this many threads parse (1: this one alone), by default up to
/// `PARSE_THREADS`. A loader whose reads keep every core busy asks for 1: threads started
/// then wait for a core while this one waits for them.
#[pyfunction]
#[pyo3(signature = (headers, index=None, threads=None))]
pub fn plain_headers<'py>(
    py: Python<'py>,
    headers: Vec<(PyBackedBytes, u64, u64)>,
    index: Option<(PyBackedBytes, HashMap<String, usize>)>,
    threads: Option<usize>,
) -> PyResult<(Vec<Option<Columns<'py>>>, Option<Agreed<'py>>)> {
    let threads = threads.unwrap_or(PARSE_THREADS).clamp(1, PARSE_THREADS);
    let (parsed, agreed) = py.detach(|| {
        let index = index.as_ref().map(|(raw, shard_of)| (&raw[..], shard_of));
        let (parsed, mapped) = parse_all(&headers, index, threads);
        let agreed = mapped.and_then(|mapped| index_agrees(mapped, &parsed));
        // An index that agrees proved every name once; else each header is checked alone.
        let parsed = if agreed.is_some() {
            parsed
        } else {
            parsed.into_iter().map(|plain| plain.and_then(names_unique)).collect()
        };
        (parsed, agreed)
    });
    let mut out = Vec::with_capacity(parsed.len());
    for (plain, (_, data_start, _)) in parsed.into_iter().zip(&headers) {
        out.push(plain.map(|p| columns(py, p, *data_start)).transpose()?);
    }
    let agreed = match agreed {
        Some(metadata) => Some((metadata_dict(py, metadata)?,)),
        None => None,
    };
    Ok((out, agreed))
}

/// Every header parsed, and the index if given (its bytes, and each file name it uses to its
/// shard's number) [mapped](map_index): on up to `threads` scoped threads where there is
/// enough to share (each thread, this one too, taking the next header; the index on one of
/// its own), else on this one. A thread the system will not start leaves its share to the
/// others.
fn parse_all<'a>(
    headers: &'a [(PyBackedBytes, u64, u64)],
    index: Option<(&'a [u8], &'a HashMap<String, usize>)>,
    threads: usize,
) -> (Vec<Option<Plain<'a>>>, Option<MappedIndex<'a>>) {
    let parse_one = |(raw, start, size): &'a (PyBackedBytes, u64, u64)| parse(raw, *start, *size);
    let parse_index =
        |(raw, shard_of): (&'a [u8], &'a HashMap<String, usize>)| map_index(raw, shard_of);
    let bytes: usize = headers.iter().map(|(raw, _, _)| raw.len()).sum::<usize>()
        + index.map_or(0, |(raw, _)| raw.len());
    let threads = gpumap::tuning_facts::cpus().min(threads);
    if bytes < PARSE_SHARED_MIN || threads < 2 {
        return (headers.iter().map(parse_one).collect(), index.and_then(parse_index));
    }
    let next = AtomicUsize::new(0);
    let take = || {
        let mut mine = Vec::new();
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            let Some(header) = headers.get(k) else { return mine };
            mine.push((k, parse_one(header)));
        }
    };
    std::thread::scope(|scope| {
        let indexing = index.map(|index| {
            (
                index,
                gpumap::per_process::spawn_apart_from_fork(|| {
                    std::thread::Builder::new().spawn_scoped(scope, move || parse_index(index))
                })
                .ok(),
            )
        });
        let workers: Vec<_> = (1..threads.min(headers.len()))
            .filter_map(|_| {
                gpumap::per_process::spawn_apart_from_fork(|| {
                    std::thread::Builder::new().spawn_scoped(scope, take)
                })
                .ok()
            })
            .collect();
        let mut done = take();
        for worker in workers {
            // A worker that panicked leaves its headers unparsed: the Python reader reads them.
            done.extend(worker.join().unwrap_or_default());
        }
        let mut parsed: Vec<Option<Plain<'a>>> = Vec::with_capacity(headers.len());
        parsed.resize_with(headers.len(), || None);
        for (k, plain) in done {
            parsed[k] = plain;
        }
        let index = indexing.and_then(|(index, thread)| match thread {
            Some(thread) => thread.join().ok().flatten(),
            None => parse_index(index),
        });
        (parsed, index)
    })
}

/// Threads that parse a checkpoint's headers at most, and the bytes of headers below which
/// one thread parses them all (a thread costs tens of microseconds to start).
const PARSE_THREADS: usize = 8;
const PARSE_SHARED_MIN: usize = 256 << 10;

/// An index found to agree with the headers: its metadata (`None` without one).
type Agreed<'py> = (Option<Bound<'py, PyDict>>,);

/// A parsed header's Python columns.
fn columns<'py>(py: Python<'py>, plain: Plain<'_>, data_start: u64) -> PyResult<Columns<'py>> {
    let entries = plain.entries;
    let names = PyList::new(py, entries.iter().map(|e| e.name))?;
    // One interned string per dtype, and one tuple per distinct shape (checkpoints repeat a
    // few shapes thousands of times, mostly one after another).
    let mut interned: [Option<Bound<'py, PyString>>; DTYPES.len()] = Default::default();
    let dtypes = PyList::new(
        py,
        entries.iter().map(|e| {
            interned[e.dtype].get_or_insert_with(|| PyString::intern(py, DTYPES[e.dtype].0)).clone()
        }),
    )?;
    let shapes = PyList::empty(py);
    let mut seen: HashMap<&[u64], Bound<'py, PyTuple>> = HashMap::new();
    let mut previous: Option<(&[u64], Bound<'py, PyTuple>)> = None;
    for e in &entries {
        let shape = match &previous {
            Some((last, tuple)) if *last == e.shape.as_slice() => tuple.clone(),
            _ => match seen.get(e.shape.as_slice()) {
                Some(t) => t.clone(),
                None => {
                    let t = PyTuple::new(py, &e.shape)?;
                    seen.insert(&e.shape, t.clone());
                    t
                }
            },
        };
        shapes.append(&shape)?;
        previous = Some((e.shape.as_slice(), shape));
    }
    let starts = PyList::new(py, entries.iter().map(|e| data_start + e.begin))?;
    let ends = PyList::new(py, entries.iter().map(|e| data_start + e.end))?;
    let metadata = match plain.metadata {
        None => None,
        Some(pairs) => {
            let dict = PyDict::new(py);
            for (k, v) in pairs {
                dict.set_item(k, v)?;
            }
            Some(dict)
        }
    };
    Ok((names, dtypes, shapes, starts, ends, metadata))
}
