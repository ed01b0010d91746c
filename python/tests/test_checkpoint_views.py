"""The torch tensors ``load_checkpoint`` (whole, or tensor by tensor) and ``load_safetensors``
hand out, against the files' bytes: runs of tensors alike (a whole load cuts them from one view
of the run) and lone ones, of several dtypes, empty and 0-d ones among them, aligned or not. Each must hold its own bytes, be its own tensor (a write
to one leaves every other as it was), and take an in-place change that autograd records, as
any tensor a loader hands out does."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("hypothesis")
torch = pytest.importorskip("torch")

from conftest import need_gpu  # noqa: E402
from fuzzing import examples  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gpumapio import load_checkpoint, load_safetensors  # noqa: E402

# safetensors' dtype names and their torch dtypes (itemsize from torch).
_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64, "U8": torch.uint8, "BOOL": torch.bool}
_SHAPES = [(), (0,), (0, 3), (3,), (2, 3), (1, 1, 2), (5, 4)]

# A shard: runs of (dtype, shape, how many); the header padded to an odd length or not.
_runs = st.lists(st.tuples(st.sampled_from(sorted(_DTYPES)), st.sampled_from(_SHAPES), st.integers(1, 9)), min_size=1, max_size=6)
_shard = st.tuples(_runs, st.booleans())


def _write(path: str, runs: list[tuple[str, tuple[int, ...], int]], odd: bool, rng: np.random.Generator, first: int) -> list[str]:
    """A safetensors file of ``runs`` in this order, random bytes (bools 0 or 1); its names."""
    header, blobs, at = {}, [], 0
    names = []
    for dtype, shape, count in runs:
        nbytes = int(np.prod(shape)) * torch.empty((), dtype=_DTYPES[dtype]).element_size()
        for _ in range(count):
            name = f"t{first + len(names):05d}"  # file order is name order, as writers sort
            names.append(name)
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + nbytes]}
            blob = rng.integers(0, 2 if dtype == "BOOL" else 256, nbytes, dtype=np.uint8).tobytes()
            blobs.append(blob)
            at += nbytes
    text = json.dumps(header).encode()
    # Padded to 8 (the data aligned as writers align it) or to an odd length (every tensor of
    # more than a byte per element misaligned in the file, so in the allocation too).
    text += b" " * ((-len(text)) % 8 + (1 if odd else 0))
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))
    return names


def _bytes_of(t) -> bytes:
    return t.reshape(-1).view(torch.uint8).cpu().numpy().tobytes()


def _whole(directory: str, device: str) -> dict:
    return load_checkpoint(directory, device)


def _chosen(directory: str, device: str) -> dict:
    """Every tensor chosen by a predicate: placed one by one rather than cut by shard."""
    return load_checkpoint(directory, device, tensors=lambda name: True)


def _per_file(directory: str, device: str) -> dict:
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    return {k: v for f in files for k, v in load_safetensors(os.path.join(directory, f), device).items()}


LOADERS = [_whole, _chosen, _per_file]


def _check_load(directory: str, device: str, load=_whole) -> None:
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    want: dict[str, tuple[bytes, tuple[int, ...], object]] = {}
    for file in files:
        with open(os.path.join(directory, file), "rb") as f:
            raw = f.read()
        n = int.from_bytes(raw[:8], "little")
        for name, entry in json.loads(raw[8 : 8 + n]).items():
            start, end = entry["data_offsets"]
            want[name] = (raw[8 + n + start : 8 + n + end], tuple(entry["shape"]), _DTYPES[entry["dtype"]])
    got = load(directory, device)
    assert sorted(got) == sorted(want)
    for name, (data, shape, dtype) in want.items():
        t = got[name]
        assert (t.dtype, tuple(t.shape), t.device.type) == (dtype, shape, device.split(":")[0]), name
        assert t.is_contiguous() and _bytes_of(t) == data, name
    # Each its own tensor: a different byte written over every one, then each read back.
    fills = {}
    for k, (name, t) in enumerate(sorted(got.items())):
        if t.numel():
            fills[name] = 1 if t.dtype == torch.bool else k % 250 + 1
            t.reshape(-1).view(torch.uint8).fill_(fills[name])
    for name, fill in fills.items():
        assert set(_bytes_of(got[name])) == {fill}, name
    # An in-place change autograd records, as on any tensor a loader hands out.
    for name, t in got.items():
        if t.is_floating_point():
            grad = torch.ones(t.shape, dtype=t.dtype, device=t.device, requires_grad=True)
            t.mul_(0).add_(grad)
            t.sum().backward()
            assert grad.grad is not None and bool((grad.grad == 1).all()), name


@pytest.mark.parametrize("load", LOADERS)
@given(shards=st.lists(_shard, min_size=1, max_size=3), seed=st.integers(0, 2**32 - 1))
@examples(40)
def test_torch_loads_of_runs_and_lone_tensors(tmp_path_factory, load, shards, seed):
    directory = str(tmp_path_factory.mktemp("ckpt"))
    rng = np.random.default_rng(seed)
    count = 0
    for k, (runs, odd) in enumerate(shards):
        count += len(_write(os.path.join(directory, f"s{k}.safetensors"), runs, odd, rng, count))
    _check_load(directory, "cpu", load)


def test_tensors_alike_are_cut_from_one_view_and_the_rest_from_one_flat_one(tmp_path, monkeypatch):
    """Tensors of one dtype in a row that share their shape past the first extent are cut
    from one view of them; lone ones and scalars in a row from one 1-D view; empty ones lie
    over nothing. What they hold is checked as above."""
    cuts = []
    original = torch.Tensor.unsafe_split_with_sizes

    def counted(self, sizes, *args, **kwargs):
        cuts.append((tuple(self.shape), list(sizes)))
        return original(self, sizes, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "unsafe_split_with_sizes", counted)
    runs = [
        ("BF16", (5, 4), 4),
        ("BF16", (3,), 3),
        ("F16", (2, 2), 1),
        ("F16", (3,), 1),
        ("F16", (1, 4), 1),
        ("F32", (2, 3), 7),
        ("F32", (0, 3), 5),
        ("F32", (), 6),
    ]
    _write(str(tmp_path / "a.safetensors"), runs, False, np.random.default_rng(0), 0)
    _check_load(str(tmp_path), "cpu")
    assert cuts == [((20, 4), [5] * 4), ((9,), [3] * 3), ((11,), [4, 3, 4]), ((14, 3), [2] * 7), ((6,), [1] * 6)]


@pytest.mark.parametrize("load", LOADERS)
def test_gpu_loads_of_runs_and_lone_tensors(tmp_path, load):
    need_gpu("torch")
    rng = np.random.default_rng(7)
    runs = [("BF16", (5, 4), 9), ("F16", (3,), 2), ("I64", (2, 3), 5), ("F32", (0, 3), 4), ("BOOL", (1, 1, 2), 6), ("F32", (), 5)]
    _write(str(tmp_path / "a.safetensors"), runs, False, rng, 0)
    _write(str(tmp_path / "b.safetensors"), runs[::-1], True, rng, 100)
    _check_load(str(tmp_path), "cuda", load)
