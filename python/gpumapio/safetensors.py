"""safetensors files into GPU tensors: one parallel read into one device allocation, and
zero-copy tensor views into it (the approach of fastsafetensors).

The format: an 8-byte little-endian header length ``n``, ``n`` bytes of JSON naming each
tensor's ``dtype``, ``shape`` and ``data_offsets`` (relative to the end of the header), and the
tensors' bytes. The header is parsed here, checked entry by entry, and the data section (or,
with ``tensors=``, just the named tensors) is read straight into device memory.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import itertools
import math
import operator
import os
import re
import stat
import struct
from typing import Any, Iterable

from gpumapio._native import CuFile, plain_header
from gpumapio._sources import is_url, open_source, read_bytes, shown
from gpumapio._torch_tensors import contiguous_strides, own_tensor

__all__ = ["TensorInfo", "load_safetensors", "read_header"]

# safetensors dtype -> (bits per element, torch dtype name, NumPy dtype or None): the list of
# safetensors' Dtype enum. F4 and F6 pack elements below a byte: headers with them parse (their
# byte counts follow safetensors' rule), but loading one is refused, as no torch or NumPy dtype
# holds them element by element.
_DTYPES: dict[str, tuple[int, str | None, str | None]] = {
    "BOOL": (8, "bool", "?"),
    "F4": (4, None, None),
    "F6_E2M3": (6, None, None),
    "F6_E3M2": (6, None, None),
    "U8": (8, "uint8", "u1"),
    "I8": (8, "int8", "i1"),
    "F8_E5M2": (8, "float8_e5m2", None),
    "F8_E4M3": (8, "float8_e4m3fn", None),
    "F8_E8M0": (8, "float8_e8m0fnu", None),
    "F8_E4M3FNUZ": (8, "float8_e4m3fnuz", None),
    "F8_E5M2FNUZ": (8, "float8_e5m2fnuz", None),
    "I16": (16, "int16", "<i2"),
    "U16": (16, "uint16", "<u2"),
    "F16": (16, "float16", "<f2"),
    "BF16": (16, "bfloat16", None),
    "I32": (32, "int32", "<i4"),
    "U32": (32, "uint32", "<u4"),
    "F32": (32, "float32", "<f4"),
    "C64": (64, "complex64", "<c8"),
    "F64": (64, "float64", "<f8"),
    "I64": (64, "int64", "<i8"),
    "U64": (64, "uint64", "<u8"),
}

# safetensors' own limit on the header (100 MB).
_MAX_HEADER = 100_000_000
# Sizes and offsets are usize in safetensors (64-bit on the machines gpumap runs on).
_U64_MAX = 2**64 - 1
# The deepest nesting safetensors' JSON parser (serde_json) takes, the top object counted.
_MAX_DEPTH = 127
# Where each tensor starts in the device allocation when only some are loaded.
_ALIGN = 256


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file; ``start`` / ``end`` are absolute file offsets."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class _Malformed(ValueError):
    """Raised by the JSON hooks; read_header adds the file's name."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Python's json keeps the last of repeated keys silently; two readers of one file could then
    # see different tensors, so a repeated key is an error.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Malformed(f"key {_brief(key)} appears more than once in one object")
            seen.add(key)
    return obj


def _int(text: str) -> int | float:
    # serde_json (safetensors' parser) reads -0 and integers past 64 bits as floats, refused where
    # a size is due, and refuses those past the float range outright.
    if text == "-0":
        return -0.0
    if len(text) > 20:
        return _float(text)
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Malformed(f"number {text[:24]}{'...' if len(text) > 24 else ''} is out of range")
    return value


def _constant(text: str) -> Any:
    raise _Malformed(f"{text} is not JSON")


def _check_tree(root: Any) -> None:
    """Refuses what Python's json accepts and safetensors' parser does not: nesting deeper
    than it goes, and strings with lone surrogates (from ``\\ud800``-style escapes)."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > _MAX_DEPTH:
                raise _Malformed(f"nested more than {_MAX_DEPTH} levels deep")
            if isinstance(node, dict):
                for key, value in node.items():
                    stack.append((key, depth))
                    stack.append((value, depth + 1))
            else:
                stack.extend((value, depth + 1) for value in node)
        elif isinstance(node, str) and not node.isascii():
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise _Malformed(f"string {_brief(node)} holds a lone surrogate (not Unicode text)") from None


# Where a header's text has none of these, the slow hooks and the tree walk cannot find
# anything: a lone surrogate comes only from an escape of U+D800 to U+DFFF (UTF-8 text cannot
# hold one), and the integers _int reads as floats are -0 and those of more than 20
# characters (so 20 digits at least).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_NEGATIVE_ZERO = re.compile(r"-0(?![0-9.eE])")
# Every ASCII digit to "0" and every other byte to " ": a run of 20 digits is then a plain
# substring search, where a regular expression would try a match at every character.
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))


def _odd_integers(raw: bytes, text: str) -> bool:
    """Whether ``text`` (``raw`` decoded) could hold an integer that _int reads as a float."""
    return _NEGATIVE_ZERO.search(text) is not None or b"0" * 20 in raw.translate(_DIGITS_AS_ZEROS)
# What JSON parses to, containers aside.
_SCALARS = {int, float, str, bool, type(None)}


def _shallow(header: Any) -> bool:
    """Whether ``header`` is an object of objects or lists whose members hold no containers:
    nested at most three levels, far from the limit, so that no walk is needed for depth."""
    if not isinstance(header, dict):
        return False
    for value in header.values():
        members = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        for member in members:
            if isinstance(member, dict):
                return False
            # map() keeps the per-element test in C: shapes of thousands of tensors pass here.
            if isinstance(member, list) and not all(map(_SCALARS.__contains__, map(type, member))):
                return False
    return True


def _brief(value: Any) -> str:
    """``repr(value)``, cut short: a hostile header can hold megabytes in one value."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _is_size(value: Any) -> bool:
    # type() rather than isinstance(): bool is a subclass of int, and true is no size.
    return type(value) is int and 0 <= value <= _U64_MAX


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, TensorInfo], dict[str, str] | None]:
    """The tensors of a safetensors file, in file order, and its ``__metadata__``.

    Accepts what ``safetensors.safe_open`` accepts, with one exception: a key repeated in any
    JSON object of the header is refused here (safetensors keeps the last of repeated tensor
    names and metadata keys). Anything else malformed is a ``ValueError`` naming the problem,
    the tensor and the values: tensors that overlap, leave bytes between them or after the
    last, or reach past the end of the file; unknown dtypes; shapes whose byte count is not
    the tensor's, or overflows 64 bits; sizes that are not whole numbers from 0 to 2^64 - 1
    (``true`` included); a ``__metadata__`` that is not a map of strings to strings; a header
    length past the file or past 100 MB (checked before anything is read).

    ``path`` may also be an ``s3://bucket/key`` or ``http(s)://`` URL: the header is read with
    ranged GETs (:class:`gpumapio.RemoteFile`).
    """
    return _parse_header(*_read_header_bytes(path))


def _read_header_bytes(path: str | os.PathLike[str]) -> tuple[str, int, int, bytes]:
    """The file's name, size, header length and header bytes."""
    return _read_header_stamped(path)[0]


# What says a local file is still the one whose header was read: (device, inode, size, mtime,
# ctime) of the open file. Another inode is a file replaced (renamed over); another size or
# time, one rewritten in place by a write that began after the first look (the kernel sets
# the times as a write begins, so one already under way changes nothing seen).
Stamp = tuple[int, int, int, int, int]


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _stamp_of(file: Any) -> Stamp:
    """The stamp of an open reader of a local file (a ``CuFile``)."""
    return _stamp(os.fstat(file.fileno()))


def _open_regular(path: str) -> tuple[int, os.stat_result]:
    """A descriptor of ``path`` opened for reading, and its status, taken from the open file
    (the name may be another file by then); anything but a regular file is refused, named.
    O_NONBLOCK: opening a FIFO would otherwise wait for a writer, for ever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or socket); only regular files are read", path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_header_stamped(path: str | os.PathLike[str]) -> tuple[tuple[str, int, int, bytes], Stamp | None]:
    """:func:`_read_header_bytes`, and the file's stamp taken before its header was read
    (None for a URL): a loader compares it with its own open file's after its reads, so that
    a file replaced or rewritten in between is not read as one header over another's bytes."""
    real = os.fspath(path)
    name = shown(real)
    if is_url(real):
        with open_source(real) as f:
            file_size = f.nbytes()
            n, raw = _header_bytes(name, file_size, lambda offset, size: read_bytes(f, offset, size))
        return (name, file_size, n, raw), None
    fd, st = _open_regular(real)
    try:
        file_size = st.st_size
        n, raw = _header_bytes(name, file_size, lambda offset, size: _pread(fd, size, offset))
    finally:
        os.close(fd)
    return (name, file_size, n, raw), _stamp(st)


def _pread(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes at ``offset`` (fewer where the file ends first)."""
    parts, got = [], 0
    while got < size:
        part = os.pread(fd, size - got, offset + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


class _Changed(ValueError):
    """A local file found changed (replaced, or rewritten in place) between the reading of its
    header and the end of the reads of its data: what was read may mix two versions."""

    def __init__(self, path: str) -> None:
        super().__init__(self.message(path, 1))
        self.path = path

    @staticmethod
    def message(path: str, times: int) -> str:
        again = f", {times} times in a row" if times > 1 else ""
        return f"{shown(path)}: the file changed while it was loaded (replaced, or rewritten in place){again}; load again"




def _check_unchanged(files: list[Any], stamps: list[Stamp | None], paths: list[str]) -> None:
    """Raises :class:`_Changed` for the first local file (of ``files``, their reads done) that
    is not the file whose header was read as it was then (``stamps``; None at a URL): one
    fstat a file."""
    for f, stamp, path in zip(files, stamps, paths):
        if stamp is not None and isinstance(f, CuFile) and _stamp_of(f) != stamp:
            raise _Changed(path)

# Loads of a file found changed while loading start over, at most this many times in all.
_ATTEMPTS = 3


@dataclasses.dataclass(frozen=True)
class _Columns:
    """A checked header's tensors as lists, in file order (offsets absolute): what a loader of
    thousands of tensors needs, without an object per tensor."""

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    starts: list[int]
    ends: list[int]

    def infos(self) -> dict[str, TensorInfo]:
        fields = ("name", "dtype", "shape", "start", "end")
        rows = [dict(zip(fields, row)) for row in zip(self.names, self.dtypes, self.shapes, self.starts, self.ends)]
        return dict(zip(self.names, _tensor_infos(rows)))

    @staticmethod
    def of(infos: dict[str, TensorInfo]) -> "_Columns":
        values = infos.values()
        return _Columns(
            list(infos), [t.dtype for t in values], [t.shape for t in values], [t.start for t in values], [t.end for t in values]
        )


def _parse_columns(name: str, file_size: int, n: int, raw: bytes) -> tuple[_Columns, dict[str, str] | None]:
    plain = plain_header(raw, 8 + n, file_size)
    if plain is not None:
        *columns, metadata = plain
        return _Columns(*columns), metadata
    infos, metadata = _parse_header_in_python(name, file_size, n, raw)
    return _Columns.of(infos), metadata


def _header_bytes(name: str, file_size: int, read: Any) -> tuple[int, bytes]:
    """The header's length and bytes, by ``read(offset, size)`` (called at offsets 0 then 8):
    the length checked against the file and the limit before the header is read."""
    # A remote object's reads are whole or an error: a short one is refused before it asks.
    prefix = read(0, 8) if file_size >= 8 else b""
    if len(prefix) < 8:
        raise ValueError(f"{name}: {file_size} bytes is too short for a safetensors file")
    (n,) = struct.unpack("<Q", prefix)
    if n > _MAX_HEADER or 8 + n > file_size:
        raise ValueError(
            f"{name}: header length {n} does not fit the file of {file_size} bytes "
            f"(or passes the {_MAX_HEADER}-byte limit)"
        )
    raw = read(8, n)
    if len(raw) != n:
        raise ValueError(f"{name}: read {len(raw)} of the header's {n} bytes (the file shrank)")
    return n, raw


def _parse_header(name: str, file_size: int, n: int, raw: bytes) -> tuple[dict[str, TensorInfo], dict[str, str] | None]:
    # The header a safetensors writer produces, read and checked in one native pass; anything
    # else is read by json and checked, which names what is wrong.
    plain = plain_header(raw, 8 + n, file_size)
    if plain is not None:
        *columns, metadata = plain
        return _Columns(*columns).infos(), metadata
    return _parse_header_in_python(name, file_size, n, raw)


def _parse_header_in_python(
    name: str, file_size: int, n: int, raw: bytes
) -> tuple[dict[str, TensorInfo], dict[str, str] | None]:
    try:
        text = raw.decode("utf-8")
        header = json.loads(
            text,
            object_pairs_hook=_object,
            parse_int=_int if _odd_integers(raw, text) else int,
            parse_float=_float,
            parse_constant=_constant,
        )
        escapes = _SURROGATE_ESCAPE.search(text) is not None
        if escapes:
            _check_tree(header)
        else:
            # The common case, a header safetensors writes, checked in bulk; anything the bulk
            # check does not pass is checked again below, entry by entry, for its message.
            plain = _plain_infos(header, 8 + n, file_size)
            if plain is not None:
                return plain
            # A checkpoint of many tensors is thousands of entries: walked only where the
            # text could hold what the walk looks for.
            if not _shallow(header):
                _check_tree(header)
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: the header is not UTF-8: {e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}: the header is not JSON: {e}") from None
    except _Malformed as e:
        raise ValueError(f"{name}: the header is not JSON as safetensors reads it: {e}") from None
    except RecursionError:
        raise ValueError(f"{name}: the header is nested more than {_MAX_DEPTH} levels deep") from None
    return _checked_infos(name, header, 8 + n, file_size)


def _checked_infos(
    name: str, header: Any, data_start: int, file_size: int
) -> tuple[dict[str, TensorInfo], dict[str, str] | None]:
    """The tensors and metadata of a parsed header, checked entry by entry: the reference
    check, and the one that names what is wrong."""
    if not isinstance(header, dict):
        raise ValueError(f"{name}: the header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise ValueError(f"{name}: __metadata__ is {_brief(metadata)}, not a map of strings to strings")
        for key, value in metadata.items():
            if not isinstance(value, str):
                raise ValueError(f"{name}: __metadata__[{key!r}] is {_brief(value)}, not a string")
    infos = []
    for key, entry in header.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{name}: tensor {key!r} is {_brief(entry)}, not an object with dtype, shape and data_offsets")
        missing = [f for f in ("dtype", "shape", "data_offsets") if f not in entry]
        if missing:
            raise ValueError(f"{name}: tensor {key!r}: needs dtype, shape and data_offsets (no {', '.join(missing)})")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise ValueError(
                f"{name}: tensor {key!r}: dtype {_brief(dtype)} is not supported (safetensors defines "
                f"{', '.join(_DTYPES)})"
            )
        if not isinstance(shape, list) or not all(_is_size(d) for d in shape):
            raise ValueError(
                f"{name}: tensor {key!r}: shape {_brief(shape)} is not a list of sizes (whole numbers "
                f"from 0 to 2^64 - 1)"
            )
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_size(o) for o in offsets)):
            raise ValueError(
                f"{name}: tensor {key!r}: data_offsets {_brief(offsets)} are not two offsets (whole "
                f"numbers from 0 to 2^64 - 1)"
            )
        begin, end = offsets
        if end < begin:
            raise ValueError(f"{name}: tensor {key!r}: data_offsets {offsets} end before they begin")
        # The element count as safetensors computes it: multiplied in order, each step
        # checked against 64 bits (so a 0 after an overflow does not save the shape).
        count = 1
        for d in shape:
            count *= d
            if count > _U64_MAX:
                raise ValueError(f"{name}: tensor {key!r}: shape {_brief(shape)} has more than 2^64 - 1 elements")
        bits = count * _DTYPES[dtype][0]
        if bits > _U64_MAX or bits % 8:
            raise ValueError(
                f"{name}: tensor {key!r}: {count} elements of {dtype} are {bits} bits, "
                f"{'past 2^64 - 1' if bits > _U64_MAX else 'not a whole number of bytes'}"
            )
        expected = bits // 8
        if end - begin != expected:
            raise ValueError(
                f"{name}: tensor {key!r}: {end - begin} bytes for a {dtype} tensor of shape "
                f"{_brief(shape)} ({expected} bytes)"
            )
        if data_start + end > file_size:
            raise ValueError(
                f"{name}: tensor {key!r}: bytes {data_start + begin}..{data_start + end} are past "
                f"the end of the file ({file_size} bytes)"
            )
        infos.append(TensorInfo(key, dtype, tuple(shape), data_start + begin, data_start + end))
    infos.sort(key=lambda t: (t.start, t.end))
    # safetensors' layout: the tensors tile the data section from its first byte to the end
    # of the file, each starting where the one before ends (zero-byte tensors anywhere).
    at, before = data_start, None
    for t in infos:
        if t.start < at:
            assert before is not None
            raise ValueError(
                f"{name}: tensor {t.name!r}: data_offsets {[t.start - data_start, t.end - data_start]} "
                f"overlap tensor {before.name!r} {[before.start - data_start, before.end - data_start]}"
            )
        if t.start > at:
            after = "the start of the data" if before is None else f"tensor {before.name!r}"
            raise ValueError(
                f"{name}: tensor {t.name!r}: data_offsets {[t.start - data_start, t.end - data_start]} "
                f"leave {t.start - at} bytes after {after} that no tensor holds (safetensors "
                f"allows no gaps)"
            )
        at, before = t.end, t
    if at != file_size:
        raise ValueError(
            f"{name}: {file_size - at} bytes after the last tensor (the tensors end at byte {at}, "
            f"the file at {file_size}; safetensors requires the data to end with the file)"
        )
    return {t.name: t for t in infos}, metadata


# The three fields of a tensor's entry, in one C call per entry.
_FIELDS = operator.itemgetter("dtype", "shape", "data_offsets")
_BITS = {dtype: bits for dtype, (bits, _, _) in _DTYPES.items()}


def _all_of_type(values: Iterable[Any], kind: type) -> bool:
    # type() rather than isinstance(), as in _is_size: bool is no int here.
    return set(map(type, values)) <= {kind}


def _sizes(values: list[Any]) -> bool:
    """Whether every value is a size (as :func:`_is_size`), tested in C."""
    return _all_of_type(values, int) and (not values or (min(values) >= 0 and max(values) <= _U64_MAX))


def _plain_infos(header: Any, data_start: int, file_size: int) -> tuple[dict[str, TensorInfo], dict[str, str] | None] | None:
    """What :func:`_checked_infos` returns for ``header``, where each of its checks passes and
    every entry holds the three fields and no others (so that no walk is needed for depth,
    either); else None, ``header`` left as it was. The checks run over all entries at once,
    each in C, rather than entry by entry: a checkpoint holds thousands of small tensors."""
    if type(header) is not dict:
        return None
    names, entries = list(header), list(header.values())
    metadata = None
    if "__metadata__" in header:
        at = names.index("__metadata__")
        del names[at]
        metadata = entries.pop(at)
        if metadata is not None and (type(metadata) is not dict or not _all_of_type(metadata.values(), str)):
            return None
    if not _all_of_type(entries, dict) or not set(map(len, entries)) <= {3}:
        return None
    try:
        fields = list(map(_FIELDS, entries))
    except KeyError:
        return None
    dtypes, shapes, offsets = zip(*fields) if fields else ((), (), ())
    if not _all_of_type(dtypes, str) or not _BITS.keys() >= set(dtypes):
        return None
    if not _all_of_type(shapes, list) or not _sizes(list(itertools.chain.from_iterable(shapes))):
        return None
    if not _all_of_type(offsets, list) or not set(map(len, offsets)) <= {2}:
        return None
    begins, ends = [o[0] for o in offsets], [o[1] for o in offsets]
    if not _sizes(begins) or not _sizes(ends):
        return None
    counts = list(map(math.prod, shapes))
    # A product past 64 bits that a later 0 brings back: safetensors refuses it.
    if any(_overflows(shape) for shape, count in zip(shapes, counts) if count == 0):
        return None
    bits = list(map(operator.mul, counts, map(_BITS.__getitem__, dtypes)))
    if bits and max(bits) > _U64_MAX:
        return None
    # Each tensor's bytes are those of its shape (so whole bytes, and end >= begin).
    if list(map((8).__mul__, map(operator.sub, ends, begins))) != bits:
        return None
    # The tensors tile the data section, from its first byte to the end of the file.
    order = sorted(range(len(offsets)), key=offsets.__getitem__)
    starts_sorted = [begins[i] for i in order]
    ends_sorted = [ends[i] for i in order]
    if starts_sorted[1:] != ends_sorted[:-1] or (starts_sorted[:1] or [0]) != [0]:
        return None
    if data_start + (ends_sorted[-1] if ends_sorted else 0) != file_size:
        return None
    rows = [
        {"name": names[i], "dtype": dtypes[i], "shape": tuple(shapes[i]), "start": data_start + begins[i], "end": data_start + ends[i]}
        for i in order
    ]
    return {row["name"]: info for row, info in zip(rows, _tensor_infos(rows))}, metadata


def _overflows(shape: list[int]) -> bool:
    """Whether the element count, multiplied in order, passes 64 bits at some step."""
    count = 1
    for d in shape:
        count *= d
        if count > _U64_MAX:
            return True
    return False


def _tensor_infos(rows: list[dict[str, Any]]) -> list[TensorInfo]:
    """``TensorInfo(**row)`` for each row, built without the frozen dataclass's ``__init__``
    (a guarded setattr per field), which dominates for thousands of tensors: each instance
    gets its row as its attributes, as ``__init__`` would have set them."""
    infos = list(map(object.__new__, itertools.repeat(TensorInfo, len(rows))))
    list(map(object.__setattr__, infos, itertools.repeat("__dict__"), rows))
    return infos


def _torch_device(device: Any):
    import torch

    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if isinstance(device, int):
        return torch.device("cuda", device)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def load_safetensors(
    path: str | os.PathLike[str],
    device: Any = "cuda",
    *,
    tensors: Iterable[str] | None = None,
    framework: str = "pt",
) -> dict[str, Any]:
    """Loads a safetensors file: ``{name: tensor}``.

    ``framework="pt"`` (default) gives ``torch.Tensor`` on ``device`` (``"cuda"``,
    ``"cuda:1"``, ``1``, a ``torch.device``, or ``"cpu"``); ``framework="numpy"`` gives NumPy
    arrays in host memory (no bfloat16 or float8 there). All tensors lie in one allocation,
    filled by one parallel read of the file's data section; each torch tensor is a tensor of
    its own there, not a view of the allocation (an in-place change autograd records on one
    leaves the others as they were); loading only
    ``tensors`` (names; ``KeyError`` for one the file lacks) reads just their bytes, each into
    its own aligned place of one allocation. A tensor whose offset in the file is not a
    multiple of its element size (which safetensors' own writers never produce) is copied.
    The header is checked first (:func:`read_header`); tensors of the sub-byte dtypes (F4,
    F6_E2M3, F6_E3M2) are refused, as torch and NumPy have no dtype for them.

    ``path`` may also be an ``s3://bucket/key`` or ``http(s)://`` URL, read with parallel
    ranged GETs (:class:`gpumapio.RemoteFile`, credentials from the AWS environment).

    A local file replaced (renamed over) or rewritten in place while it is loaded is loaded
    again, a few times at most, then refused (``ValueError``). What is noticed is a change of
    the file's inode, size or times between the header's read and the end of the reads; the
    kernel stamps a write as it begins, so a write already under way when the load began, and
    still copying while it reads, changes nothing seen, and its bytes may be mixed with the
    old ones. To load one version for certain, replace files by renaming a finished one over
    them (``os.replace``).
    """
    for attempt in range(_ATTEMPTS):
        try:
            return _load_safetensors_once(path, device, tensors, framework)
        except _Changed as e:
            if attempt + 1 == _ATTEMPTS:
                raise ValueError(_Changed.message(e.path, _ATTEMPTS)) from None
    raise AssertionError("unreachable")


def _load_safetensors_once(
    path: str | os.PathLike[str], device: Any, tensors: Iterable[str] | None, framework: str
) -> dict[str, Any]:
    """One attempt of :func:`load_safetensors`: :class:`_Changed` where the file changed."""
    header, stamp = _read_header_stamped(path)
    infos, _ = _parse_header(*header)
    if tensors is not None:
        wanted = [tensors] if isinstance(tensors, str) else list(dict.fromkeys(tensors))
        missing = [t for t in wanted if t not in infos]
        if missing:
            raise KeyError(f"{shown(path)} has no tensor {missing[0]!r}")
        chosen = sorted((infos[t] for t in wanted), key=lambda t: t.start)
    else:
        chosen = list(infos.values())
    packed = next((t for t in chosen if _DTYPES[t.dtype][0] % 8), None)
    if packed is not None:
        raise ValueError(
            f"{shown(path)}: tensor {packed.name!r} is {packed.dtype}, packed below a byte; "
            f"torch and NumPy have no such dtype (load the others with tensors=)"
        )

    # Where each tensor lands in the allocation, and the reads that put it there.
    if tensors is None:
        base = chosen[0].start if chosen else 0
        total = (chosen[-1].end - base) if chosen else 0
        places = {t.name: t.start - base for t in chosen}
        reads = [(0, total, base)] if total else []
    else:
        places, reads, total = {}, [], 0
        for t in chosen:
            total = -(-total // _ALIGN) * _ALIGN
            places[t.name] = total
            if t.nbytes:
                reads.append((total, t.nbytes, t.start))
            total += t.nbytes

    flat: Any  # one uint8 array: a torch tensor or a NumPy array
    if framework == "pt":
        import torch

        where = _torch_device(device)
        flat = torch.empty(total, dtype=torch.uint8, device=where)
    elif framework in ("np", "numpy"):
        import numpy

        if device not in (None, "cpu"):
            raise ValueError(f"framework='numpy' loads into host memory; device={device!r} is not 'cpu'")
        lacking = next((t for t in chosen if _DTYPES[t.dtype][2] is None), None)
        if lacking is not None:
            raise ValueError(
                f"{shown(path)}: tensor {lacking.name!r} is {lacking.dtype}, NumPy has no "
                f"{lacking.dtype}; use framework='pt'"
            )
        flat = numpy.empty(total, dtype=numpy.uint8)
    else:
        raise ValueError(f"framework {framework!r}: expected 'pt' or 'numpy'")

    # The data ends with the file (read_header checks so): the last tensor's end is its size.
    with open_source(path, max((t.end for t in infos.values()), default=None)) as f:
        if len(reads) == 1:
            at, size, offset = reads[0]
            counts = [(f.read(flat[at : at + size], size, offset), size, offset)]
        else:
            futures = [(f.pread(flat[at : at + size], size, offset), size, offset) for at, size, offset in reads]
            counts = [(future.get(), size, offset) for future, size, offset in futures]
        # The file read is the one whose header was read, as it was then (a short read of one
        # rewritten meanwhile included: it is loaded again).
        _check_unchanged([f], [stamp], [os.fspath(path)])
        for got, size, offset in counts:
            if got != size:
                raise EOFError(f"{shown(path)}: read {got} of {size} bytes at {offset}")

    out: dict[str, Any] = {}
    for t in chosen:
        bits, torch_name, numpy_name = _DTYPES[t.dtype]
        itemsize = bits // 8
        at = places[t.name]
        piece = flat[at : at + t.nbytes]
        if framework == "pt":
            dtype = getattr(torch, torch_name or "", None)
            if dtype is None:
                raise ValueError(f"tensor {t.name!r}: this torch has no {torch_name}")
            if at % itemsize:
                piece = piece.clone()  # a view would be misaligned
            # Its own tensor, not a view of the allocation shared with the others (decision 0040).
            typed = piece.view(dtype)
            out[t.name] = own_tensor(typed, t.shape, contiguous_strides(t.shape), typed.storage_offset())
        else:
            if numpy_name is None:
                raise ValueError(f"tensor {t.name!r}: NumPy has no {t.dtype}; use framework='pt'")
            try:
                out[t.name] = piece.view(numpy_name).reshape(t.shape)
            except ValueError as e:  # [0, 2**62]: no elements, but past NumPy's largest shape
                raise _numpy_shape_refused(path, t.name, t.shape, e) from None
    return out


def _numpy_shape_refused(path: Any, name: str, shape: Iterable[int], why: Exception) -> ValueError:
    """The error for a tensor NumPy cannot shape as its header says: safetensors allows a
    tensor of no elements whose other extents, times the itemsize, pass 2^63
    (``[0, 2**62, 4]``), and torch holds it."""
    return ValueError(
        f"{shown(path)}: tensor {name!r} of shape {list(shape)}: NumPy cannot hold that shape ({why}); use framework='pt'"
    )
