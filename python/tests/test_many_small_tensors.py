"""The fast paths for checkpoints of thousands of small tensors, against the reference code
they stand in for: the native one-pass header reader (``plain_header``) and the bulk header
check (``_plain_infos``) against the entry-by-entry one (``_checked_infos``) on generated good
and bad headers, spelled many ways and mutated byte by byte, and load_checkpoint's merged
reads and views against the bytes in the files."""

from __future__ import annotations

import copy
import json
import os
import random
import re

import numpy as np
import pytest

import gpumapio.checkpoint as checkpoint
import gpumapio.safetensors as gst
from gpumapio import load_checkpoint
from gpumapio._checkpoint_files import open_catalogue
from gpumapio._native import plain_header, plain_headers, plain_index, plain_index_files
from gpumapio._pieces import Run, coalesce
from gpumapio.safetensors import _DTYPES, _checked_infos, _parse_header, _plain_infos

_U64_MAX = 2**64 - 1


def _good_header(r: random.Random, count: int) -> tuple[dict, int]:
    """A header safetensors could write (dtypes, sub-byte ones included, scalars, empty
    tensors, entries in any order) and the size of its data section."""
    entries, at = [], 0
    for i in range(count):
        dtype = r.choice(list(_DTYPES))
        shape = [r.choice([0, 1, 2, 3, 4, 8]) for _ in range(r.randrange(4))]
        bits = _DTYPES[dtype][0] * int(np.prod(shape, dtype=object))
        if bits % 8:
            shape.append(8)  # whole bytes, so that the header is good
            bits *= 8
        entries.append((f"t{i}", {"dtype": dtype, "shape": shape, "data_offsets": [at, at + bits // 8]}))
        at += bits // 8
    r.shuffle(entries)
    header: dict = {}
    if r.random() < 0.5:
        header["__metadata__"] = r.choice([None, {}, {"format": "pt"}])
    header.update(entries)
    return header, at


def _break(r: random.Random, header: dict, size: int) -> tuple[dict, int]:
    """``header`` (and the data's size) with one thing made wrong, or left alone."""
    names = [n for n in header if n != "__metadata__"]
    if not names:
        return header, size + r.choice([0, 1])
    entry = header[r.choice(names)]
    kind = r.randrange(22)
    if kind == 0:
        entry["data_offsets"] = [entry["data_offsets"][0] + 1, entry["data_offsets"][1] + 1]
    elif kind == 1:
        entry["data_offsets"][1] += r.choice([-1, 1, 8])
    elif kind == 2:
        entry["shape"] = entry["shape"] + [True]
    elif kind == 3:
        entry["shape"] = entry["shape"] + [1.0]
    elif kind == 4:
        entry["shape"] = entry["shape"] + [-1]
    elif kind == 5:
        entry["shape"] = [2**64] + entry["shape"]
    elif kind == 6:
        entry["shape"] = [2**40, 2**40, 0]  # passes 64 bits before the 0
        entry["data_offsets"][1] = entry["data_offsets"][0]
    elif kind == 7:
        entry["extra"] = 1
    elif kind == 8:
        del entry[r.choice(["dtype", "shape", "data_offsets"])]
    elif kind == 9:
        header[names[0]] = r.choice([[], "x", 3, None])
    elif kind == 10:
        entry["dtype"] = r.choice(["F12", ["F16"], 16, "f16"])
    elif kind == 11:
        header["__metadata__"] = r.choice([{"a": 1}, {"a": None}, [], "x", {"a": ["b"]}])
    elif kind == 12:
        entry["data_offsets"] = entry["data_offsets"] + [0]
    elif kind == 13:
        entry["shape"] = [entry["shape"]]
    elif kind == 14:
        entry["data_offsets"] = [entry["data_offsets"][1], entry["data_offsets"][0]]
    elif kind == 15:
        entry["data_offsets"] = [-1, entry["data_offsets"][1]]
    elif kind == 16:
        entry["data_offsets"] = [entry["data_offsets"][0], 2**64]
    elif kind == 17:
        size += r.choice([-1, 1])
    elif kind == 18:
        entry["shape"] = {"a": 1}
    elif kind == 19:
        other = header[r.choice(names)]
        entry["data_offsets"] = list(other["data_offsets"])  # a second tensor on the same bytes
    elif kind == 20:
        entry["dtype"] = "F4"
        entry["shape"] = [3]
    # 21: left alone
    return header, size


def _verdict(fn, *args):
    try:
        return fn(*args)
    except ValueError as e:
        return ("error", str(e))


@pytest.mark.parametrize("seed", range(40))
def test_bulk_header_check_agrees_with_the_reference(seed):
    r = random.Random(seed)
    for _ in range(25):
        header, size = _good_header(r, r.randrange(0, 12))
        header, size = _break(r, header, size)
        data_start = 8 + 64
        want = _verdict(_checked_infos, "f", copy.deepcopy(header), data_start, data_start + size)
        kept = copy.deepcopy(header)
        got = _plain_infos(header, data_start, data_start + size)
        assert header == kept, "the bulk check leaves the header as it was"
        if isinstance(want, tuple) and want[0] == "error":
            assert got is None, want[1]
        elif got is not None:
            assert got == want and list(got[0]) == list(want[0])
            assert [type(t) for t in got[0].values()] == [type(t) for t in want[0].values()]
            assert all(hash(a) == hash(b) and repr(a) == repr(b) for a, b in zip(got[0].values(), want[0].values()))
        else:
            # Only a header with something beyond the three fields goes the slow way.
            assert any(isinstance(e, dict) and len(e) != 3 for e in header.values())


def test_good_headers_take_the_bulk_path():
    r = random.Random(7)
    for _ in range(200):
        header, size = _good_header(r, r.randrange(0, 30))
        assert _plain_infos(header, 100, 100 + size) is not None


@pytest.mark.parametrize("seed", range(10))
def test_parse_header_messages_unchanged(seed):
    """_parse_header (either path) says what the reference says, error or result."""
    r = random.Random(1000 + seed)
    for _ in range(25):
        header, size = _break(r, *_good_header(r, r.randrange(1, 8)))
        raw = json.dumps(header).encode()
        want = _verdict(_checked_infos, "f", copy.deepcopy(header), 8 + len(raw), 8 + len(raw) + size)
        assert _verdict(_parse_header, "f", 8 + len(raw) + size, len(raw), raw) == want


def _python_parse(raw: bytes, size: int):
    """What the Python reader (json and the checks) makes of ``raw``, with ``size`` bytes of
    data after it."""
    saved = gst.plain_header
    gst.plain_header = lambda *args: None
    try:
        return _verdict(_parse_header, "f", 8 + len(raw) + size, len(raw), raw)
    finally:
        gst.plain_header = saved


def _native_parse(raw: bytes, size: int):
    """``plain_header``'s answer as ``_parse_header`` gives it, or None."""
    found = plain_header(raw, 8 + len(raw), 8 + len(raw) + size)
    if found is None:
        return None
    names, dtypes, shapes, starts, ends, metadata = found
    rows = zip(names, dtypes, shapes, starts, ends)
    return {row[0]: gst.TensorInfo(*row) for row in rows}, metadata


def _spellings(r: random.Random, header: dict) -> list[bytes]:
    """``header`` as JSON text written several ways, as writers (and hand edits) do."""
    spaced = json.dumps(header)
    return [
        json.dumps(header, separators=(",", ":")).encode(),
        spaced.encode(),
        json.dumps(header, indent=r.choice([1, 2, "\t"])).encode(),
        json.dumps(header, ensure_ascii=False).encode(),
        (" \n" + spaced + "\r\n  ").encode(),
    ]


@pytest.mark.parametrize("seed", range(40))
def test_native_header_agrees_with_the_reference(seed):
    """Where plain_header answers, its answer is the Python reader's; where the Python reader
    refuses a header, plain_header does not answer; headers as safetensors writes them (plain
    names, compact or spaced) it always answers."""
    r = random.Random(5000 + seed)
    for _ in range(20):
        header, size = _good_header(r, r.randrange(0, 12))
        if r.random() < 0.2:
            header[f"n\u00e9{r.randrange(9)}\u4e2d"] = {"dtype": "U8", "shape": [2], "data_offsets": [size, size + 2]}
            size += 2
        header, size = _break(r, header, size) if r.random() < 0.7 else (header, size)
        for raw in _spellings(r, header):
            want = _python_parse(raw, size)
            got = _native_parse(raw, size)
            if got is not None:
                assert got == want and list(got[0]) == list(want[0])
            elif not isinstance(want, tuple) or want[0] != "error":
                # Read by Python but not answered natively: only a header outside the common
                # case, here an escape in a string, a null __metadata__ or a field beyond the
                # three (which safetensors ignores).
                extra = any(
                    isinstance(e, dict) and set(e) - {"dtype", "shape", "data_offsets"}
                    for n, e in header.items()
                    if n != "__metadata__"
                )
                assert b"\\" in raw or re.search(rb'"__metadata__":\s*null', raw) or extra, raw


_MUTANTS = [
    b"01", b"1e3", b"1.0", b"-0", b"-1", b"true", b"null", b"\\u0041", b"\\", b"\x01", b"\xff", b"\xef\xbb\xbf",
    b'"', b",", b":", b"{", b"}", b"[", b"]", b" ", b"18446744073709551616", b"18446744073709551615", b"0",
]


@pytest.mark.parametrize("seed", range(30))
def test_native_header_mutated_byte_by_byte(seed):
    """Headers with bytes inserted, replaced or removed at random: plain_header answers only
    what the Python reader reads the same."""
    r = random.Random(7000 + seed)
    for _ in range(40):
        header, size = _good_header(r, r.randrange(1, 6))
        raw = bytearray(r.choice(_spellings(r, header)))
        for _ in range(r.randrange(1, 4)):
            at = r.randrange(len(raw) + 1)
            kind = r.randrange(3)
            if kind == 0:
                raw[at:at] = r.choice(_MUTANTS)
            elif kind == 1 and at < len(raw):
                raw[at : at + 1] = r.choice(_MUTANTS)
            elif at < len(raw):
                del raw[at : at + r.randrange(1, 4)]
        raw = bytes(raw)
        for data in (size, size + 1, max(size - 1, 0)):
            got = _native_parse(raw, data)
            if got is not None:
                want = _python_parse(raw, data)
                assert got == want and list(got[0]) == list(want[0]), raw


@pytest.mark.parametrize(
    "text, answered",
    [
        (b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', True),
        (b'{"__metadata__":{"format":"pt"},"a":{"shape":[2],"data_offsets":[0,2],"dtype":"U8"}}', True),
        (b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', False),
        (b'{"a":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}}', False),
        (b'{"__metadata__":{"k":"x","k":"y"},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', False),
        (b'{"__metadata__":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', False),
        (b'{"\\u0061":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', False),
        (b'{"a":{"dtype":"U8","shape":[02],"data_offsets":[0,2]}}', False),
        (b'{"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}}', False),
        (b'{"a":{"dtype":"U8","shape":[2e0],"data_offsets":[0,2]}}', False),
        (b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2,4]}}', False),
        (b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}} x', False),
        (b'\xef\xbb\xbf{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', False),
        (b'{"a\x01":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', False),
        (b'{"a\xff":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', False),
        (b'{"a":{"dtype":"U9","shape":[2],"data_offsets":[0,2]}}', False),
        (b'{"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,2]}}', False),
        (b'{"a":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}', False),
        (b'{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,2]}}', False),
        (b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}', False),
        (b'{}', False),  # no data is expected, and 2 bytes follow
    ],
)
def test_native_header_cases(text, answered):
    got = _native_parse(text, 2)
    assert (got is not None) == answered
    if got is not None:
        assert got == _python_parse(text, 2)


def test_native_header_strings_end_anywhere():
    """Names of every length to 40 after every indent to 8 (so that a string's end, or a byte
    the native pass declines in one, falls at every place of the words it scans eight bytes at
    a time), plain and with a quote, a backslash, a control character, DEL, a high byte or a
    non-ASCII letter put in at each place: where the native pass answers, its answer is the
    Python reader's, and it answers exactly where the text has no escape, no control
    character and is UTF-8."""
    entry = b'{"dtype":"U8","shape":[2],"data_offsets":[0,2]}'
    for length in range(41):
        name = bytes(b"abcdefghij"[k % 10] for k in range(length))
        puts = (b'\\"', b"\\\\", b"\\n", b"\x01", b"\x1f", b"\x7f", b"\xff", "\u00e9".encode())
        texts = [name] + [name[:k] + put + name[k:] for k in range(length + 1) for put in puts]
        for indent in range(9):
            for text in texts:
                raw = b"{" + b" " * indent + b'"' + text + b'":' + entry + b"}"
                got = _native_parse(raw, 2)
                plain = b"\\" not in text and not any(b < 0x20 for b in text) and _is_utf8(text)
                assert (got is not None) == plain, (indent, text)
                if got is not None:
                    assert got == _python_parse(raw, 2), (indent, text)


def _is_utf8(text: bytes) -> bool:
    try:
        text.decode()
    except UnicodeDecodeError:
        return False
    return True


def test_native_header_empty_file_data():
    assert _native_parse(b"{}", 0) == ({}, None)
    assert _native_parse(b'{"__metadata__":{}}', 0) == ({}, {})


def _json_index(raw: bytes):
    """The index as the Python reader (json, a key twice refused) reads it, or "error"."""
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=gst._object)
    except ValueError:
        return "error"


def _index(r: random.Random) -> dict:
    files = [f"model-{k:05d}-of-00003.safetensors" for k in range(1, 4)]
    index: dict = {}
    if r.random() < 0.8:
        index["metadata"] = r.choice([{}, {"total_size": r.randrange(2**40)}, {"total_size": 7, "format": "pt"}])
    index["weight_map"] = {f"model.layers.{i}.w{'é' if r.random() < 0.1 else ''}": r.choice(files) for i in range(r.randrange(0, 40))}
    if r.random() < 0.5:
        index = dict(reversed(list(index.items())))
    return index


@pytest.mark.parametrize("seed", range(20))
def test_native_index_agrees_with_json(seed):
    """plain_index answers every index as transformers writes one (spelled any way, escapes
    aside), with what json reads, in the same order; and after random byte mutations it
    answers only what json reads the same."""
    r = random.Random(9000 + seed)
    for _ in range(20):
        index = _index(r)
        for raw in _spellings(r, index):
            got = plain_index(raw)
            if b"\\" not in raw:
                assert got is not None, raw
            if got is not None:
                assert got == _json_index(raw) and list(got) == list(index)
                assert list(got["weight_map"]) == list(index["weight_map"])
                assert plain_index_files(raw) == list(dict.fromkeys(index["weight_map"].values()))
        raw = bytearray(r.choice(_spellings(r, index)))
        for _ in range(r.randrange(1, 4)):
            at = r.randrange(len(raw) + 1)
            raw[at : at + r.randrange(0, 3)] = r.choice(_MUTANTS + [b'"metadata"', b'"weight_map"', b'"x"'])
        got = plain_index(bytes(raw))
        if got is not None:
            assert got == _json_index(bytes(raw)), bytes(raw)
        # The quick scan answers where plain_index does, and else only for a name given twice.
        files = plain_index_files(bytes(raw))
        if got is not None:
            assert files == list(dict.fromkeys(got["weight_map"].values()))
        elif files is not None:
            assert _json_index(bytes(raw)) == "error", bytes(raw)


@pytest.mark.parametrize(
    "text",
    [
        b'{"weight_map": {"a": "f", "a": "g"}}',
        b'{"weight_map": {"a": "f"}, "weight_map": {"a": "f"}}',
        b'{"metadata": {"total_size": 1.5}, "weight_map": {"a": "f"}}',
        b'{"metadata": {"k": 1, "k": 2}, "weight_map": {"a": "f"}}',
        b'{"metadata": {"total_size": 1}}',
        b'{"weight_map": {"a": "f"}, "other": 1}',
        b'{"weight_map": {"a": 1}}',
        b'{"weight_map": {"\\u0061": "f"}}',
        b'{"weight_map": {"a": "f"}} x',
    ],
)
def test_native_index_declines_the_uncommon(text):
    assert plain_index(text) is None
    # The quick scan of an index's files declines the same, but for a name given twice (the
    # weight map, read later, refuses it).
    if text != b'{"weight_map": {"a": "f", "a": "g"}}':
        assert plain_index_files(text) is None


def test_native_index_files_in_order_of_first_tensor():
    raw = b'{"weight_map": {"a": "2.st", "b": "1.st", "c": "2.st", "d": "3.st", "e": "1.st"}}'
    assert plain_index_files(raw) == ["2.st", "1.st", "3.st"]
    assert plain_index_files(b'{"weight_map": {}}') == []


def _shard_headers(shards: list[list[str]]) -> list[tuple[bytes, int, int]]:
    """A plain header per shard holding ``shards[k]``'s names (a byte each), as
    ``plain_headers`` takes them."""
    out = []
    for names in shards:
        raw = json.dumps({n: {"dtype": "U8", "shape": [1], "data_offsets": [k, k + 1]} for k, n in enumerate(names)}).encode()
        out.append((raw, 8 + len(raw), 8 + len(raw) + len(names)))
    return out


def _agrees(raw: bytes, shard_of: dict[str, int], shards: list[list[str]]):
    return plain_headers(_shard_headers(shards), (raw, shard_of))[1]


@pytest.mark.parametrize("seed", range(10))
def test_native_index_check_agrees_with_the_mapping(seed):
    """plain_headers' index check answers exactly where the index maps every header's names to
    that header's shard and names nothing else; any one change of the mapping is caught."""
    r = random.Random(500 + seed)
    files = ["a.st", "b.st", "./a.st", "c.st"]  # "./a.st" is a second spelling of shard 0
    shard_of = {"a.st": 0, "b.st": 1, "./a.st": 0, "c.st": 2}
    names = [f"t{i}" for i in range(r.randrange(1, 60))]
    weight_map = {n: r.choice(files) for n in names}
    r.shuffle(names)
    headers: list[list[str]] = [[], [], []]
    for n in names:
        headers[shard_of[weight_map[n]]].append(n)
    index = {"metadata": {"total_size": 7}, "weight_map": weight_map}
    raw = json.dumps(index).encode()
    assert _agrees(raw, shard_of, headers) == ({"total_size": 7},)
    assert _agrees(json.dumps({"weight_map": weight_map}).encode(), shard_of, headers) == (None,)
    assert plain_headers(_shard_headers(headers))[1] is None  # no index, nothing to agree
    victim = r.choice(names)
    home = shard_of[weight_map[victim]]
    moved = [list(h) for h in headers]
    moved[home].remove(victim)
    moved[(home + 1) % 3].append(victim)
    twice = [list(h) for h in headers]
    twice[(home + 1) % 3].append(victim)
    wrong = [
        moved,  # in another shard than the index says
        twice,  # in two shards
        [h + (["extra"] if k == home else []) for k, h in enumerate(headers)],  # not in the index
        [[n for n in h if n != victim] for h in headers],  # the index names a tensor of no shard
    ]
    for changed in wrong:
        assert _agrees(raw, shard_of, changed) is None
    # A file the catalogue does not know, a name given twice, an index the quick reader declines.
    assert _agrees(raw, {f: k for f, k in shard_of.items() if f != weight_map[victim]}, headers) is None
    assert _agrees(raw.replace(b'"weight_map": {', b'"weight_map": {"%s": "b.st", ' % victim.encode(), 1), shard_of, headers) is None
    assert _agrees(raw.replace(b"total_size", b"total\\u005fsize"), shard_of, headers) is None
    # A header the quick reader declines (an escape in a name): no verdict on the index either.
    declined = _shard_headers(headers)
    declined[home] = (declined[home][0].replace(b'"%s"' % victim.encode(), b'"\\u0074%s"' % victim[1:].encode()),) + declined[home][1:]
    found, agreed = plain_headers(declined, (raw, shard_of))
    assert found[home] is None and agreed is None


def test_native_index_check_refuses_a_name_twice_in_one_header():
    """A header that names a tensor twice (json would keep the last) is declined, with an index
    or without, even where the index's names and the header's tensors are as many and the
    index puts that tensor in that shard: the index check, which then stands for the header's
    own check of its names, counts each name once."""

    def entry(k: int) -> str:
        return '{"dtype":"U8","shape":[1],"data_offsets":[%d,%d]}' % (k, k + 1)

    for names, index_names in ((["a", "a"], ["a", "b"]), (["a", "b", "a"], ["a", "b"]), (["b", "a", "a"], ["a", "b", "c"])):
        raw = ("{" + ",".join(f'"{n}":{entry(k)}' for k, n in enumerate(names)) + "}").encode()
        header = (raw, 8 + len(raw), 8 + len(raw) + len(names))
        assert plain_header(*header) is None
        index = json.dumps({"weight_map": dict.fromkeys(index_names, "s.st")}).encode()
        for with_index in (None, (index, {"s.st": 0})):
            assert plain_headers([header], with_index) == ([None], None), (names, with_index)
    # The same names once each: answered, and the index agrees.
    raw = ("{" + ",".join(f'"{n}":{entry(k)}' for k, n in enumerate("ab")) + "}").encode()
    found, agreed = plain_headers([(raw, 8 + len(raw), 8 + len(raw) + 2)], (json.dumps({"weight_map": {"a": "s.st", "b": "s.st"}}).encode(), {"s.st": 0}))
    assert found[0] is not None and list(found[0][0]) == ["a", "b"] and agreed == (None,)


@pytest.mark.parametrize("shards", [1, 3, 9])
def test_native_headers_read_together_are_each_header(shards):
    """plain_headers answers for each header what plain_header does alone, declined ones
    included, whether it reads them on one thread or several (past 256 KiB of headers)."""
    r = random.Random(shards)
    for per in (3, 3000):
        names = [[f"s{k}.layer.{i}.weight" for i in range(per)] for k in range(shards)]
        headers = _shard_headers(names)
        if shards > 1:
            raw, start, size = headers[1]
            headers[1] = (raw.replace(b'"U8"', b'"U 8"', 1), start, size)  # declined
        r.shuffle(headers)
        found, agreed = plain_headers(headers)
        assert found == [plain_header(*h) for h in headers] and agreed is None
        for threads in (1, 2, 100):  # this thread alone, two, at most the limit
            assert plain_headers(headers, None, threads) == (found, agreed)
        assert sum(f is None for f in found) == (shards > 1)


def test_columns_are_the_header():
    """The columns a checkpoint's catalogue keeps give back read_header's tensors, by the
    native pass and by the Python reader alike."""
    r = random.Random(3)
    for _ in range(50):
        header, size = _good_header(r, r.randrange(0, 10))
        # Plain, and with a name holding a backslash (escaped in JSON: the Python reader's).
        escaped = {"x\\y": {"dtype": "U8", "shape": [0], "data_offsets": [size, size]}, **header}
        for raw in (json.dumps(header).encode(), json.dumps(escaped).encode()):
            columns, metadata = gst._parse_columns("f", 8 + len(raw) + size, len(raw), raw)
            infos, want_metadata = _python_parse(raw, size)
            assert columns.infos() == infos and list(columns.infos()) == list(infos)
            assert metadata == want_metadata


def _write(path: str, tensors: list[tuple[str, np.ndarray]], pad: int = 8) -> None:
    header = {}
    at = 0
    for name, array in tensors:
        dtype = {"<f2": "F16", "<f4": "F32", "|u1": "U8", "<i8": "I64", "|b1": "BOOL"}[array.dtype.str]
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [at, at + array.nbytes]}
        at += array.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % pad)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for _, array in tensors:
            f.write(array.tobytes())


@pytest.fixture
def many_small(tmp_path):
    """Three shards of many small tensors of mixed dtypes, empty and scalar ones among them,
    at odd offsets (so that some start unaligned for their dtype)."""
    rng = np.random.default_rng(24)
    directory = tmp_path / "small"
    directory.mkdir()
    want = {}
    for k, pad in enumerate([8, 1, 3]):
        tensors = []
        for i in range(300):
            dtype = ["<f2", "<f4", "|u1", "<i8", "|b1"][int(rng.integers(5))]
            shape = [(), (0,), (3,), (5, 7), (2, 3, 4)][int(rng.integers(5))]
            array = (rng.standard_normal(shape) * 9).astype(dtype)
            tensors.append((f"s{k}.t{i}", array))
            want[f"s{k}.t{i}"] = array
        _write(str(directory / f"part{k}.safetensors"), tensors, pad)
    return str(directory), want


def test_many_small_tensors_byte_for_byte(many_small):
    directory, want = many_small
    got = load_checkpoint(directory, "cpu", framework="numpy")
    assert list(got) == list(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name


def test_many_small_tensors_as_torch_views(tmp_path):
    """torch views of many small tensors, runs of one dtype and shape among them, one shard
    at odd offsets (its misaligned tensors copied once read): every byte, shape and dtype
    right, and each view as free to use as any tensor — modified in place, even from a tensor
    that requires grad with autograd on (which views of a multi-output op refuse)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    tensors, want = [], {}
    kinds = [("<f4", (3, 4)), ("<f4", (3, 4)), ("<f4", (3, 4)), ("<f2", (5,)), ("<f2", (5,)), ("|u1", ()), ("<i8", (0, 2)), ("<i8", (0, 2)), ("<f4", (3, 4))]
    for i in range(300):
        dtype, shape = kinds[int(rng.integers(len(kinds)))] if i % 7 else kinds[i % len(kinds)]
        array = (rng.standard_normal(shape) * 9).astype(dtype)
        tensors.append((f"t{i}", array))
        want[f"t{i}"] = array
    directory = tmp_path / "runs"
    directory.mkdir()
    _write(str(directory / "a.safetensors"), tensors[:150])
    _write(str(directory / "b.safetensors"), tensors[150:], pad=3)  # misaligned for some dtypes
    got = load_checkpoint(str(directory), "cpu")
    assert list(got) == list(want)
    for name, array in want.items():
        t = got[name]
        assert tuple(t.shape) == array.shape and t.is_contiguous(), name
        assert t.numpy().tobytes() == array.tobytes(), name
    # Planned tensor by tensor (a selection): the misaligned ones copied once read, too.
    some = list(want)[::3]
    chosen = load_checkpoint(str(directory), "cpu", tensors=some)
    for name in some:
        assert chosen[name].numpy().tobytes() == want[name].tobytes(), name
    # One alone and one of a run of one dtype and shape (torch's multi-output views, as
    # unbind makes of a run, would refuse this), each in a load of its own.
    names = list(want)
    alone = next(n for n in names if want[n].dtype == np.float32)
    in_run = next(a for a, b in zip(names[:150], names[1:150]) if want[a].dtype == want[b].dtype == np.float32)
    for name in (alone, in_run):
        one = load_checkpoint(str(directory), "cpu")[name]
        grad = torch.ones_like(one, requires_grad=True)
        one.copy_(grad * 2)  # autograd records it: the view must allow it
        assert torch.equal(one.detach(), torch.full_like(one, 2.0))


@pytest.mark.parametrize("seed", range(5))
def test_many_small_tensors_selected(many_small, seed):
    directory, want = many_small
    r = random.Random(seed)
    names = r.sample(list(want), 200)
    got = load_checkpoint(directory, "cpu", framework="numpy", tensors=names)
    assert sorted(got) == sorted(names)
    for name in names:
        assert got[name].tobytes() == want[name].tobytes() and got[name].shape == want[name].shape, name


@pytest.mark.parametrize("seed", range(5))
def test_merged_reads_are_the_coalesced_pieces(many_small, seed):
    """The reads planned with whole tensors merged as laid out are those coalesce makes of a
    piece per tensor (the plan before the merging)."""
    directory, want = many_small
    catalogue = open_catalogue(directory)
    r = random.Random(seed)
    names = checkpoint._select(catalogue, r.sample(list(want), 250) if seed else None)
    placed = checkpoint._plan(catalogue, names, None)
    checkpoint._lay_out(placed, lambda p: _DTYPES[p.info.dtype][0] // 8)
    by_shard: dict[int, list[Run]] = {}
    for p in placed:
        by_shard.setdefault(p.shard, []).extend(
            Run(p.info.start + q.src, q.length, p.at + q.dst, q.repeat, q.stride) for q in p.all_pieces()
        )
    merged = checkpoint._direct_pieces(placed)
    assert {s: coalesce(v) for s, v in merged.items() if coalesce(v)} == {
        s: coalesce(v) for s, v in by_shard.items() if coalesce(v)
    }
    assert all(coalesce(v) == v for v in merged.values()), "merged already"
