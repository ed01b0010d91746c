"""load_safetensors against files written by the safetensors package, read back byte for
byte. NumPy everywhere; torch (CPU here, CUDA in test_gpu.py) where it imports."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

st_numpy = pytest.importorskip("safetensors.numpy")

from gpumapio import load_safetensors  # noqa: E402
from gpumapio.safetensors import read_header  # noqa: E402


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
