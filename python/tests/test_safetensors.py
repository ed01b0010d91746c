"""load_safetensors against files written by the safetensors package, read back byte for
byte. NumPy everywhere; torch (CPU here, CUDA in test_gpu.py) where it imports."""

from __future__ import annotations

import errno
import json
import os
import re
import struct

import numpy as np
import pytest

st_numpy = pytest.importorskip("safetensors.numpy")

from conftest import refused_not_waited_on  # noqa: E402
from gpumapio import load_safetensors  # noqa: E402
from gpumapio.safetensors import read_header  # noqa: E402
from safetensors import safe_open  # noqa: E402


def _tensors(rng):
    return {
        "embed.weight": rng.standard_normal((257, 33)).astype("<f4"),
        "odd": rng.standard_normal((3, 5, 7)).astype("<f2"),
        "scalar": np.array(3.25, dtype="<f8"),
        "empty": np.zeros((0, 4), dtype="<f4"),
        "ints": rng.integers(-(2**62), 2**62, size=1001, dtype="<i8"),
        "small": rng.integers(0, 255, size=13, dtype="u1"),
        "mask": rng.integers(0, 2, size=(9, 9)).astype(bool),
        "i16": rng.integers(-1000, 1000, size=(17,), dtype="<i2"),
        "u32": rng.integers(0, 2**32, size=(5, 3), dtype="<u4"),
    }


@pytest.fixture
def st_file(tmp_path, rng):
    tensors = _tensors(rng)
    path = tmp_path / "model.safetensors"
    st_numpy.save_file(tensors, str(path), metadata={"format": "np"})
    return path, tensors


def test_numpy_byte_for_byte(st_file):
    path, tensors = st_file
    got = load_safetensors(path, "cpu", framework="numpy")
    ref = st_numpy.load_file(str(path))
    assert got.keys() == ref.keys() == tensors.keys()
    for name, want in ref.items():
        assert got[name].dtype == want.dtype, name
        assert got[name].shape == want.shape, name
        assert got[name].tobytes() == want.tobytes(), name


def test_one_allocation_zero_copy_views(st_file):
    path, _ = st_file
    got = load_safetensors(path, "cpu", framework="numpy")
    bases = {id(a.base if a.base is not None else a) for a in got.values() if a.size}
    roots = set()
    for a in got.values():
        while a.base is not None:
            a = a.base
        roots.add(id(a))
    assert len(roots) == 1, "every tensor is a view of one buffer"
    assert bases


def test_only_named_tensors(st_file):
    path, tensors = st_file
    got = load_safetensors(path, "cpu", tensors=["u32", "scalar", "u32", "odd"], framework="numpy")
    assert set(got) == {"u32", "scalar", "odd"}
    for name in got:
        assert got[name].tobytes() == tensors[name].tobytes()
        assert got[name].shape == tensors[name].shape
    with pytest.raises(KeyError, match="nope"):
        load_safetensors(path, "cpu", tensors=["nope"], framework="numpy")
    assert load_safetensors(path, "cpu", tensors=[], framework="numpy") == {}


def test_header(st_file):
    path, tensors = st_file
    infos, metadata = read_header(path)
    assert metadata == {"format": "np"}
    assert set(infos) == set(tensors)
    starts = [t.start for t in infos.values()]
    assert starts == sorted(starts)
    assert infos["embed.weight"].nbytes == tensors["embed.weight"].nbytes


def _write_raw(path, header: bytes, data: bytes = b""):
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


@pytest.mark.parametrize(
    "header, data, message",
    [
        (b"not json", b"", "not JSON"),
        (b"[]", b"", "not a JSON object"),
        (json.dumps({"t": {"dtype": "F32", "shape": [2]}}).encode(), b"", "data_offsets"),
        (json.dumps({"t": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}).encode(), b"x", "dtype"),
        (json.dumps({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}).encode(), b"xxxx", "bytes for a F32"),
        (json.dumps({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode(), b"xxxx", "past the end"),
        (json.dumps({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}).encode(), b"xxxx", "shape"),
    ],
)
def test_malformed_files_are_value_errors(tmp_path, header, data, message):
    path = tmp_path / "bad.safetensors"
    _write_raw(path, header, data)
    with pytest.raises(ValueError, match=message):
        load_safetensors(path, "cpu", framework="numpy")


def test_truncated_and_lying_lengths(tmp_path):
    path = tmp_path / "t.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="too short"):
        load_safetensors(path, "cpu", framework="numpy")
    path.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(ValueError, match="header length"):
        load_safetensors(path, "cpu", framework="numpy")


def _entry(dtype="U8", shape=(4,), offsets=(0, 4), **extra):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets), **extra}


# Headers safetensors.safe_open refuses, which read_header accepted before it checked the layout
# and the JSON the way safetensors does: each is (header, data, words the error must contain).
REFUSED = {
    "overlap": ({"a": _entry(), "b": _entry(offsets=(2, 6))}, b"x" * 6, ["'b'", "[2, 6]", "overlap", "'a'", "[0, 4]"]),
    "same bytes": ({"a": _entry(), "b": _entry()}, b"x" * 4, ["'b'", "overlap", "'a'"]),
    "hole": ({"a": _entry(), "b": _entry(offsets=(5, 9))}, b"x" * 9, ["'b'", "[5, 9]", "1 bytes", "'a'"]),
    "gap first": ({"t": _entry(offsets=(3, 7))}, b"x" * 7, ["'t'", "[3, 7]", "3 bytes", "start"]),
    "trailing bytes": ({"t": _entry()}, b"x" * 9, ["5 bytes after the last tensor", "end with the file"]),
    "bool shape": ({"t": _entry(shape=[True], offsets=(0, 1))}, b"x", ["'t'", "[True]"]),
    "bool offsets": ({"t": _entry(shape=[1], offsets=(False, True))}, b"x", ["'t'", "[False, True]"]),
    "float offset": ({"t": _entry(offsets=(0, 4.0))}, b"x" * 4, ["'t'", "[0, 4.0]"]),
    "three offsets": ({"t": _entry(offsets=(0, 4, 4))}, b"x" * 4, ["'t'", "[0, 4, 4]"]),
    "offset past 2^64": ({"t": _entry(shape=[0], offsets=(2**64, 2**64))}, b"", ["'t'", str(2**64)]),
    "elements past 2^64": ({"t": _entry(shape=[2**40, 2**40, 0], offsets=(0, 0))}, b"", ["'t'", "2^64 - 1 elements"]),
    "bits past 2^64": ({"t": _entry(dtype="F32", shape=[2**61], offsets=(0, 0))}, b"", ["'t'", "F32", "2^64 - 1"]),
    "half a byte": ({"t": _entry(dtype="F4", shape=[3], offsets=(0, 2))}, b"xx", ["'t'", "F4", "12 bits"]),
    "metadata number": ({"__metadata__": {"epoch": 3}}, b"", ["__metadata__['epoch']", "3"]),
    "metadata list": ({"__metadata__": ["a"]}, b"", ["__metadata__", "['a']"]),
    "entry not an object": ({"t": [0, 4]}, b"", ["'t'", "[0, 4]"]),
    "dtype not a string": ({"t": _entry(dtype=["U8"])}, b"x" * 4, ["'t'", "['U8']"]),
}

# The same, as raw JSON text Python's json accepts and safetensors' parser does not.
REFUSED_TEXT = {
    "NaN": (b'{"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":NaN}}', b"x" * 4, ["NaN"]),
    "1e400": (b'{"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":1e400}}', b"x" * 4, ["1e400", "out of range"]),
    "-0 offset": (b'{"t":{"dtype":"U8","shape":[4],"data_offsets":[-0,4]}}', b"x" * 4, ["'t'", "-0.0"]),
    "lone surrogate": (b'{"\\ud800":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}', b"x" * 4, ["surrogate"]),
    "nested 128 deep": (b'{"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":' + b"[" * 126 + b"]" * 126 + b"}}",
                        b"x" * 4, ["127 levels"]),
    "nested 100000 deep": (b"[" * 100_000 + b"]" * 100_000, b"", ["127 levels"]),
    "repeated tensor": (b'{"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
                        b"x" * 4, ["'t'", "more than once"]),
    "repeated metadata key": (b'{"__metadata__":{"a":"1","a":"2"}}', b"", ["'a'", "more than once"]),
    "not UTF-8": (b'{"\xff":1}', b"", ["UTF-8"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED) + sorted(REFUSED_TEXT))
def test_what_safetensors_refuses_is_a_value_error_naming_it(tmp_path, case):
    header, data, words = REFUSED[case] if case in REFUSED else REFUSED_TEXT[case]
    path = tmp_path / "bad.safetensors"
    _write_raw(path, header if isinstance(header, bytes) else json.dumps(header).encode(), data)
    with pytest.raises(ValueError) as refused:
        read_header(path)
    for word in words:
        assert word in str(refused.value), (word, str(refused.value))
    if case not in ("repeated tensor", "repeated metadata key"):  # safetensors keeps the last
        with pytest.raises(Exception):
            with safe_open(str(path), "numpy"):
                pass


def test_every_dtype_safetensors_defines_parses(tmp_path):
    # F8_E8M0 and the FNUZ float8 kinds were refused as unknown before.
    dtypes = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
              "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
              "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
    header, at = {}, 0
    for i, (dtype, bits) in enumerate(dtypes.items()):
        nbytes = 8 * bits // 8  # 8 elements: a whole number of bytes for every width
        header[f"t{i}"] = _entry(dtype, (2, 4), (at, at + nbytes))
        at += nbytes
    path = tmp_path / "all.safetensors"
    _write_raw(path, json.dumps(header).encode(), bytes(at))
    with safe_open(str(path), "numpy") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == set(dtypes)
    infos, _ = read_header(path)
    assert {t.dtype: t.nbytes for t in infos.values()} == {d: b for d, b in dtypes.items()}
    for name in ("C128", "u8", " U8", "F8_E4M3FN", "Q9"):
        _write_raw(path, json.dumps({"t": _entry(name, (1,), (0, 1))}).encode(), b"x")
        with pytest.raises(ValueError, match=f"dtype '{name}' is not supported.*F8_E8M0"):
            read_header(path)


def test_sub_byte_tensors_are_refused_on_load_naming_them(tmp_path):
    path = tmp_path / "f4.safetensors"
    header = {"packed": _entry("F4", (2, 3), (0, 3)), "plain": _entry("U8", (2,), (3, 5))}
    _write_raw(path, json.dumps(header).encode(), b"abcde")
    assert read_header(path)[0]["packed"].nbytes == 3
    with pytest.raises(ValueError, match="'packed' is F4"):
        load_safetensors(path, "cpu", framework="numpy")
    assert load_safetensors(path, "cpu", tensors=["plain"], framework="numpy")["plain"].tobytes() == b"de"


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    raised = refused_not_waited_on(fifo, lambda: read_header(fifo), "read_header")
    assert isinstance(raised, OSError) and "not a regular file" in str(raised), raised
    assert str(raised.filename) == str(fifo) and raised.errno == errno.EINVAL, raised


def test_numpy_refuses_bfloat16_and_gpu(tmp_path):
    path = tmp_path / "bf.safetensors"
    _write_raw(path, json.dumps({"t": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode(), b"abcd")
    with pytest.raises(ValueError, match="BF16"):
        load_safetensors(path, "cpu", framework="numpy")
    with pytest.raises(ValueError, match="host memory"):
        load_safetensors(path, "cuda", framework="numpy")


def test_torch_cpu_byte_for_byte(tmp_path, rng):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    tensors = {
        "w": torch.randn(129, 65, dtype=torch.float32),
        "bf": torch.randn(31, dtype=torch.bfloat16),
        "h": torch.randn(2, 3, 4, dtype=torch.float16),
        "i": torch.arange(-50, 50, dtype=torch.int64),
        "b": torch.rand(7) > 0.5,
        "s": torch.tensor(1.5),
    }
    path = tmp_path / "t.safetensors"
    st_torch.save_file(tensors, str(path))
    got = load_safetensors(path, "cpu")
    ref = st_torch.load_file(str(path), device="cpu")
    assert got.keys() == ref.keys()
    for name in ref:
        assert got[name].dtype == ref[name].dtype and got[name].shape == ref[name].shape
        as_bytes = lambda t: t.reshape(-1).view(torch.uint8).tolist()  # noqa: E731
        assert as_bytes(got[name]) == as_bytes(ref[name]), name
        assert torch.equal(got[name], ref[name]), name
    sub = load_safetensors(path, "cpu", tensors=["h", "b"])
    assert torch.equal(sub["h"], ref["h"]) and torch.equal(sub["b"], ref["b"])


@pytest.mark.parametrize("how", ["renamed over", "rewritten in place"])
@pytest.mark.parametrize("selection", [None, ["a"]])
def test_file_changed_after_its_header_is_loaded_again(tmp_path, monkeypatch, how, selection):
    """The header and the data are read through two opens of the path: a file renamed over
    (an atomic save) or rewritten in place in between is loaded again, never one version's
    header over the other's bytes."""
    import gpumapio.safetensors as safetensors

    path, new = str(tmp_path / "m.safetensors"), str(tmp_path / "new.tmp")
    st_numpy.save_file({"a": np.array([1.0, 2.0, 3.0, 4.0], dtype="<f4")}, path)
    st_numpy.save_file({"a": np.array([7, 8, 9, 10], dtype="<i4")}, new)  # a header as long
    os.utime(path, ns=(0, 0))  # its next write changes its mtime, however coarse the clock
    original = safetensors._parse_header

    def changing(*header):
        if os.path.exists(new):
            if how == "renamed over":
                os.replace(new, path)
            else:
                with open(path, "r+b") as f:
                    f.write(open(new, "rb").read())
                os.remove(new)
        return original(*header)

    monkeypatch.setattr(safetensors, "_parse_header", changing)
    got = load_safetensors(path, "cpu", framework="numpy", tensors=selection)
    assert got["a"].dtype == np.int32 and got["a"].tolist() == [7, 8, 9, 10]


def test_directory_is_named_in_the_error(tmp_path):
    where = tmp_path / "d.safetensors"
    where.mkdir()
    for read in (read_header, lambda p: load_safetensors(p, "cpu", framework="numpy", tensors=["a"])):
        with pytest.raises(IsADirectoryError, match=re.escape(str(where))):
            read(str(where))
