"""load_checkpoint against checkpoints written by the safetensors package, sharded as
transformers shards them: whole loads, filters, tensor-parallel slices, casts, hostile indices
and headers. Host memory (NumPy) everywhere; torch where it imports; the GPU in the tests
marked so (skipped, with the reason, where there is none)."""

from __future__ import annotations

import errno
import gc
import json
import re
import os
import threading
import weakref

import numpy as np
import pytest

st_numpy = pytest.importorskip("safetensors.numpy")

import gpumapio  # noqa: E402
import gpumapio.checkpoint as checkpoint  # noqa: E402
from conftest import need_gpu, refused_not_waited_on  # noqa: E402
from gpumapio import CheckpointError, TensorParallel, load_checkpoint, load_safetensors  # noqa: E402
from gpumapio._checkpoint_files import guess_shards, list_shards  # noqa: E402


def _model(rng, layers=3, hidden=64, inter=96, vocab=50):
    """A Llama-shaped set of tensors: big matrices, small norms, an int buffer."""
    out = {"model.embed_tokens.weight": rng.standard_normal((vocab, hidden)).astype("<f4")}
    for i in range(layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = rng.standard_normal(hidden).astype("<f4")
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{name}.weight"] = rng.standard_normal((hidden, hidden)).astype("<f4")
        out[p + "mlp.gate_proj.weight"] = rng.standard_normal((inter, hidden)).astype("<f4")
        out[p + "mlp.up_proj.weight"] = rng.standard_normal((inter, hidden)).astype("<f4")
        out[p + "mlp.down_proj.weight"] = rng.standard_normal((hidden, inter)).astype("<f4")
    out["model.norm.weight"] = rng.standard_normal(hidden).astype("<f2")
    out["model.position_ids"] = np.arange(hidden, dtype="<i8")
    return out


def _save_sharded(tensors, directory, shards=3):
    """Shards as transformers writes them: files model-0000k-of-0000n.safetensors and an index."""
    os.makedirs(directory, exist_ok=True)
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[k * per : (k + 1) * per]}
        st_numpy.save_file(part, os.path.join(directory, file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    return directory


@pytest.fixture
def sharded(tmp_path, rng):
    tensors = _model(rng)
    return _save_sharded(tensors, str(tmp_path / "ckpt")), tensors


@pytest.fixture
def recorded(monkeypatch):
    """Every piece load_checkpoint reads: (file, offset, bytes of all its runs)."""
    seen: list[tuple[str, int, int]] = []

    def spy(original):
        def read(buf, files, pieces):
            seen.extend((files[f].__repr__(), off, n * count) for f, off, n, _, count, _ in pieces)
            return original(buf, files, pieces)

        return read

    # Reads waited for at once, and those started to run beside other work.
    monkeypatch.setattr(checkpoint, "read_files", spy(checkpoint.read_files))
    monkeypatch.setattr(checkpoint, "start_read_files", spy(checkpoint.start_read_files))
    return seen


def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def _watch_reads(monkeypatch, log):
    """Every read load_checkpoint starts to run beside its work, each cancel and wait of it
    noted in ``log`` as ``("cancel" or "wait", files it reads)``."""
    original = checkpoint.start_read_files

    class Watched:
        def __init__(self, pending, files):
            self.pending, self.files = pending, len(files)

        def cancel(self):
            log.append(("cancel", self.files))
            self.pending.cancel()

        def wait(self):
            log.append(("wait", self.files))
            return self.pending.wait()

    monkeypatch.setattr(checkpoint, "start_read_files", lambda buf, files, pieces: Watched(original(buf, files, pieces), files))


@pytest.mark.parametrize("form", ["directory", "index", "single file"])
def test_whole_checkpoint_byte_for_byte(sharded, tmp_path, form):
    directory, tensors = sharded
    if form == "index":
        source = os.path.join(directory, "model.safetensors.index.json")
    elif form == "directory":
        source = directory
    else:
        source = str(tmp_path / "one.safetensors")
        st_numpy.save_file(tensors, source)
    got = load_checkpoint(source, "cpu", framework="numpy")
    assert set(got) == set(tensors)
    for name, want in tensors.items():
        _same(got[name], want)


def test_one_allocation_one_read_per_shard(sharded, recorded):
    directory, tensors = sharded
    got = load_checkpoint(directory, "cpu", framework="numpy")
    roots = set()
    for a in got.values():
        while a.base is not None:
            a = a.base
        roots.add(id(a))
    assert len(roots) == 1, "every tensor is a view of one allocation"
    # The tensors of a shard tile its data section, so each shard is one read, all in one call.
    assert len(recorded) == 3
    assert sum(n for _, _, n in recorded) == sum(t.nbytes for t in tensors.values())


def test_directory_without_index_takes_every_file(sharded):
    directory, tensors = sharded
    os.remove(os.path.join(directory, "model.safetensors.index.json"))
    got = load_checkpoint(directory, "cpu", framework="numpy")
    assert set(got) == set(tensors)


@pytest.mark.parametrize("how", ["names", "predicate"])
def test_filter_reads_only_the_chosen_tensors(sharded, recorded, how):
    directory, tensors = sharded
    chosen = ["model.layers.1.mlp.up_proj.weight", "model.norm.weight", "model.layers.1.mlp.down_proj.weight"]
    selection = chosen if how == "names" else (lambda n: n in chosen)
    got = load_checkpoint(directory, "cpu", framework="numpy", tensors=selection)
    assert set(got) == set(chosen)
    for name in chosen:
        _same(got[name], tensors[name])
    assert sum(n for _, _, n in recorded) == sum(tensors[n].nbytes for n in chosen)


def test_filter_unknown_name(sharded):
    directory, _ = sharded
    with pytest.raises(KeyError, match="nope"):
        load_checkpoint(directory, "cpu", framework="numpy", tensors=["model.norm.weight", "nope"])
    assert load_checkpoint(directory, "cpu", framework="numpy", tensors=[]) == {}


RULES = {
    "*.q_proj.weight": "row",
    "*.k_proj.weight": 0,
    "*.v_proj.weight": 0,
    "*.gate_proj.weight": "row",
    "*.up_proj.weight": "row",
    "*.o_proj.weight": "column",
    "*.down_proj.weight": 1,
    "*.embed_tokens.weight": 0,
}


@pytest.mark.parametrize("world", [1, 2, 4])
def test_tensor_parallel_ranks_tile_every_tensor(sharded, recorded, world):
    directory, tensors = sharded
    if world == 4:
        # The vocabulary of 50 does not split 4 ways: the error names the tensor.
        with pytest.raises(ValueError, match="embed_tokens.*divide into 4"):
            load_checkpoint(directory, "cpu", framework="numpy", tp=TensorParallel(0, 4, RULES))
        rules = {k: v for k, v in RULES.items() if "embed" not in k}
    else:
        rules = RULES
    ranks = []
    for rank in range(world):
        recorded.clear()
        tp = TensorParallel(rank, world, rules)
        got = load_checkpoint(directory, "cpu", framework="numpy", tp=tp)
        assert sum(n for _, _, n in recorded) == sum(a.nbytes for a in got.values()), "only the rank's bytes are read"
        ranks.append(got)
    probe = TensorParallel(0, world, rules)
    for name, want in tensors.items():
        dim = probe.split_dim(name)
        if dim is None:
            for got in ranks:
                _same(got[name], want)
        else:
            parts = [got[name] for got in ranks]
            assert all(p.shape[dim] == want.shape[dim] // world for p in parts)
            _same(np.concatenate(parts, axis=dim), want)


def test_tensor_parallel_column_split_is_strided_and_coalesced(sharded, monkeypatch):
    directory, tensors = sharded
    name = "model.layers.0.mlp.down_proj.weight"  # (64, 96) f4: 64 rows of 192 bytes per rank of 2
    pieces = []
    original = checkpoint.start_read_files
    monkeypatch.setattr(checkpoint, "start_read_files", lambda buf, files, p: (pieces.extend(p), original(buf, files, p))[1])
    got = load_checkpoint(directory, "cpu", framework="numpy", tensors=[name], tp=TensorParallel(1, 2, {name: 1}))
    _same(got[name], np.ascontiguousarray(tensors[name][:, 48:]))
    # One strided piece: 64 runs of 192 bytes, a row (384 bytes) apart, from the second half.
    [(_, offset, size, _, count, stride)] = pieces
    assert (size, count, stride) == (192, 64, 384)


def _wide_checkpoint(tmp_path, rng):
    """Tensors whose column slices are more than a MiB of short rows: read in groups of runs,
    not a read per row; the last tensor's slices end the shard (the file's last bytes)."""
    tensors = {
        "a.weight": rng.standard_normal((1024, 2048)).astype("<f4"),  # 2 KiB runs, 2 MiB a rank
        "b.weight": rng.standard_normal((3000, 1000)).astype("<f2"),  # 500-byte runs, 1.5 MB
        "c.weight": rng.standard_normal((1500, 1400)).astype("<f4"),  # 1400-byte runs
    }
    path = str(tmp_path / "wide.safetensors")
    st_numpy.save_file(tensors, path)
    return path, tensors


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_large_column_splits(tmp_path, rng, world):
    path, tensors = _wide_checkpoint(tmp_path, rng)
    rules = {"*": 1}
    parts = [load_checkpoint(path, "cpu", framework="numpy", tp=TensorParallel(r, world, rules)) for r in range(world)]
    for name, want in tensors.items():
        _same(np.concatenate([p[name] for p in parts], axis=1), want)


def test_gpu_tensor_parallel_large_column_splits(tmp_path, rng):
    torch = need_gpu("torch")
    path, tensors = _wide_checkpoint(tmp_path, rng)
    for r in range(4):
        got = load_checkpoint(path, "cuda", tp=TensorParallel(r, 4, {"*": 1}))
        for name, want in tensors.items():
            cols = want.shape[1] // 4
            assert got[name].is_cuda
            assert torch.equal(got[name].cpu(), torch.from_numpy(np.ascontiguousarray(want[:, r * cols : (r + 1) * cols]))), name


class _Ranks:
    """``world`` ranks in threads of one process: what they send meets at a barrier."""

    def __init__(self, world):
        import threading

        self.world = world
        self.sent = [None] * world
        self.calls = [0] * world
        self.barrier = threading.Barrier(world, timeout=60)


class _ThreadExchange:
    """An exchange (``rank``, ``world_size``, ``all_to_all``) between the threads of ``_Ranks``."""

    def __init__(self, ranks, rank):
        self.ranks, self.rank, self.world_size = ranks, rank, ranks.world

    def all_to_all(self, dst, src):
        r = self.ranks
        assert len(src) == len(dst) and len(src) % self.world_size == 0
        r.sent[self.rank] = np.array(src, copy=True)
        r.barrier.wait()
        n = len(src) // self.world_size
        for p in range(self.world_size):
            dst[p * n : (p + 1) * n] = r.sent[p][self.rank * n : (self.rank + 1) * n]
        r.calls[self.rank] += 1
        r.barrier.wait()


def _load_ranks(world, load):
    """``load(rank, exchange)`` on every rank at once, in threads; their results in rank order."""
    from concurrent.futures import ThreadPoolExecutor

    ranks = _Ranks(world)
    with ThreadPoolExecutor(world) as pool:
        got = list(pool.map(lambda r: load(r, _ThreadExchange(ranks, r)), range(world)))
    return got, ranks


@pytest.mark.parametrize("world", [2, 4])
def test_exchange_swaps_column_splits_into_the_strided_slices(sharded, recorded, world):
    """With an exchange, each rank reads a block of rows of every column-split tensor (one
    contiguous piece, as many bytes as its slice) and the swaps give exactly the slices the
    strided reads give."""
    directory, tensors = sharded
    rules = {k: v for k, v in RULES.items() if "embed" not in k}
    want = [load_checkpoint(directory, "cpu", framework="numpy", tp=TensorParallel(r, world, rules)) for r in range(world)]
    recorded.clear()
    got, ranks = _load_ranks(
        world,
        lambda r, ex: load_checkpoint(directory, "cpu", framework="numpy", tp=TensorParallel(r, world, rules), exchange=ex),
    )
    columns = [n for n in tensors if TensorParallel(0, world, rules).split_dim(n) == 1]
    assert ranks.calls == [len(columns)] * world, "one swap per column-split tensor on every rank"
    for r in range(world):
        assert got[r].keys() == want[r].keys()
        for name in want[r]:
            _same(got[r][name], want[r][name])
    # Only the ranks' own bytes were read, the column splits as whole pieces.
    assert sum(n for _, _, n in recorded) == sum(a.nbytes for g in got for a in g.values())


def test_exchange_leaves_strided_what_cannot_swap(tmp_path, rng):
    """Rows that do not divide among the ranks, and tensors cast by dtype=, are read strided
    as without an exchange; a split of an inner dimension of a 3-D tensor swaps too."""
    tensors = {
        "odd_rows": rng.standard_normal((6, 8)).astype("<f4"),  # 6 rows: not 4 equal blocks
        "cube": rng.standard_normal((4, 3, 8)).astype("<f2"),  # split along its last dimension
        "ints": np.arange(8 * 12, dtype="<i4").reshape(8, 12),
    }
    directory = _save_sharded(tensors, str(tmp_path / "odd"), shards=2)
    rules = {"odd_rows": 1, "cube": 2, "ints": 1}
    for dtype in (None, "float64"):
        want = [
            load_checkpoint(directory, "cpu", framework="numpy", tp=TensorParallel(r, 4, rules), dtype=dtype)
            for r in range(4)
        ]
        got, ranks = _load_ranks(
            4,
            lambda r, ex: load_checkpoint(
                directory, "cpu", framework="numpy", tp=TensorParallel(r, 4, rules), exchange=ex, dtype=dtype
            ),
        )
        # Swapped: "ints" (never cast) and "cube" (unless cast); never "odd_rows".
        assert ranks.calls == [1 if dtype else 2] * 4, dtype
        for r in range(4):
            for name in tensors:
                _same(got[r][name], want[r][name])


_TORCH_RANK = """
import sys

import torch
import torch.distributed as dist

import gpumapio

rank, world, port, directory, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
rules = {k: v for k, v in eval(sys.argv[6]).items()}
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
tp = gpumapio.TensorParallel(rank, world, rules)
got = gpumapio.load_checkpoint(directory, "cpu", tp=tp, exchange=True)
torch.save({k: v.clone() for k, v in got.items()}, out)
dist.destroy_process_group()
"""


def test_exchange_over_torch_distributed(sharded, tmp_path):
    """``exchange=True``: the default ``torch.distributed`` group (gloo here, two processes;
    NCCL between GPUs in python/bench/multi_gpu.py) gives the strided reads' slices."""
    torch = pytest.importorskip("torch")
    import socket
    import subprocess
    import sys

    if not torch.distributed.is_available():
        pytest.skip("this torch has no torch.distributed")
    directory, _ = sharded
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "rank.py"
    script.write_text(_TORCH_RANK)
    outs = [tmp_path / f"rank{r}.pt" for r in range(2)]
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), "2", str(port), directory, str(outs[r]), repr(RULES)])
        for r in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    for r in range(2):
        got = torch.load(outs[r])
        want = load_checkpoint(directory, "cpu", framework="numpy", tp=TensorParallel(r, 2, RULES))
        assert got.keys() == want.keys()
        for name, w in want.items():
            _same(got[name].numpy(), w)


def test_exchange_refuses_what_does_not_fit(sharded):
    directory, _ = sharded
    ranks = _Ranks(2)
    with pytest.raises(ValueError, match="needs tp="):
        load_checkpoint(directory, "cpu", framework="numpy", exchange=_ThreadExchange(ranks, 0))
    with pytest.raises(ValueError, match="rank 1 of 2 is not tp's rank 0 of 2"):
        load_checkpoint(directory, "cpu", framework="numpy", tp=TensorParallel(0, 2, RULES), exchange=_ThreadExchange(ranks, 1))
    with pytest.raises(TypeError, match="framework='numpy'"):
        load_checkpoint(directory, "cpu", framework="numpy", tp=TensorParallel(0, 2, RULES), exchange=True)


def test_tensor_parallel_refuses_bad_specs():
    with pytest.raises(ValueError, match="rank 2"):
        TensorParallel(2, 2)
    with pytest.raises(ValueError, match="world_size 0"):
        TensorParallel(0, 0)
    with pytest.raises(ValueError, match="'diagonal'"):
        TensorParallel(0, 2, {"*": "diagonal"})
    tp = TensorParallel(0, 2, {"a.*": 1, "*": 0})
    assert (tp.split_dim("a.x"), tp.split_dim("b"), TensorParallel(0, 1).split_dim("b")) == (1, 0, None)


def test_split_dim_is_the_first_matching_pattern_as_fnmatch_sees_it():
    # Against fnmatch itself, pattern by pattern in order, on generated rules and names built
    # from the same few parts (so that patterns overlap), regex metacharacters among them.
    import fnmatch
    import random

    rng = random.Random(24)
    parts = ["model", "layers", "0", "1", "q_proj", "o_proj", "weight", "bias", "a+b", "(x)", "n.m", "$"]
    globs = ["*", "?", "[0-1]", "[!0]", "*.*"]
    for _ in range(300):
        rules = {}
        for _ in range(rng.randint(0, 6)):
            pattern = ".".join(rng.choice(parts + globs) for _ in range(rng.randint(1, 4)))
            rules[pattern] = rng.choice([0, 1, -1, "row", "column"])
        tp = TensorParallel(0, 2, rules)
        for _ in range(20):
            name = ".".join(rng.choice(parts) for _ in range(rng.randint(1, 5)))
            want = next((d for p, d in rules.items() if fnmatch.fnmatchcase(name, p)), None)
            want = {"row": 0, "column": 1}.get(want, want) if isinstance(want, str) else want
            assert tp.split_dim(name) == want, (rules, name)


@pytest.mark.parametrize("staging", [1 << 16, 256 << 20])
def test_cast_on_the_fly(sharded, staging):
    directory, tensors = sharded
    got = load_checkpoint(directory, "cpu", framework="numpy", dtype="f2", staging_bytes=staging)
    for name, want in tensors.items():
        if want.dtype.kind == "f":
            _same(got[name], want.astype("<f2"))
        else:
            _same(got[name], want)  # integers are left as they are


def test_cast_with_tensor_parallel_slices(sharded):
    directory, tensors = sharded
    tp = TensorParallel(1, 2, {"*.down_proj.weight": 1, "*.q_proj.weight": 0})
    got = load_checkpoint(directory, "cpu", framework="numpy", dtype="f8", tp=tp, staging_bytes=1 << 16)
    _same(got["model.layers.2.mlp.down_proj.weight"], tensors["model.layers.2.mlp.down_proj.weight"][:, 48:].astype("<f8"))
    _same(got["model.layers.0.self_attn.q_proj.weight"], tensors["model.layers.0.self_attn.q_proj.weight"][32:].astype("<f8"))


# Hostile checkpoints: every one refused before anything is read, naming the culprit.


def _index(directory):
    path = os.path.join(directory, "model.safetensors.index.json")
    with open(path) as f:
        return path, json.load(f)


def _rewrite(path, index):
    with open(path, "w") as f:
        json.dump(index, f)


def test_missing_shard(sharded):
    directory, _ = sharded
    os.remove(os.path.join(directory, "model-00002-of-00003.safetensors"))
    with pytest.raises(CheckpointError, match=r"shard 'model-00002-of-00003.safetensors' \(holding \d+ tensors"):
        load_checkpoint(directory, "cpu", framework="numpy")


def test_truncated_shard(sharded):
    directory, _ = sharded
    shard = os.path.join(directory, "model-00003-of-00003.safetensors")
    os.truncate(shard, os.path.getsize(shard) - 10)
    with pytest.raises(CheckpointError, match="model-00003-of-00003.safetensors.*past the end of the file"):
        load_checkpoint(directory, "cpu", framework="numpy")


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not a JSON index"),
        ('{"weight_map": 3}', "no \"weight_map\""),
        ("[]", "no \"weight_map\""),
        ('{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}', "key 'a' appears more than once"),
        ('{"weight_map": {"a": 7}}', "tensor 'a' maps to 7"),
        ('{"weight_map": {"a": "../outside.safetensors"}}', "outside the index's directory"),
        ('{"weight_map": {"a": "/etc/passwd"}}', "outside the index's directory"),
        (b"\xff\xfe", "not a JSON index"),
    ],
)
def test_bad_index(sharded, text, message):
    directory, _ = sharded
    path = os.path.join(directory, "model.safetensors.index.json")
    with open(path, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(directory, "cpu", framework="numpy")


def test_index_naming_a_tensor_twice_is_refused_after_the_reads_start(sharded):
    """Its shards all there, an index is read in full while a whole load's reads run: a name
    given twice is still refused, and nothing is returned."""
    directory, tensors = sharded
    path, index = _index(directory)
    pairs = list(index["weight_map"].items())
    text = json.dumps({"weight_map": dict(pairs)})
    first = json.dumps(pairs[0][0]) + ": " + json.dumps(pairs[0][1])
    with open(path, "w") as f:
        f.write(text.replace(first, first + ", " + first, 1))
    twice = f"key {re.escape(repr(pairs[0][0]))} appears more than once"
    listing = list_shards(directory)  # the shards found by the quick scan
    assert len(listing.paths) == 3
    with pytest.raises(CheckpointError, match=twice):
        listing.weight_map
    with pytest.raises(CheckpointError, match=twice):
        load_checkpoint(directory, "cpu", framework="numpy")
    _rewrite(path, index)
    got = load_checkpoint(directory, "cpu", framework="numpy")
    assert got.keys() == tensors.keys()


def test_index_names_the_wrong_shard(sharded):
    directory, _ = sharded
    path, index = _index(directory)
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00003.safetensors"
    _rewrite(path, index)
    with pytest.raises(CheckpointError, match="'model.norm.weight' is mapped to 'model-00001-of-00003.safetensors' but is in .*00003"):
        load_checkpoint(path, "cpu", framework="numpy")
    index["weight_map"]["ghost"] = "model-00001-of-00003.safetensors"
    del index["weight_map"]["model.norm.weight"]
    _rewrite(path, index)
    with pytest.raises(CheckpointError, match="'ghost' .* is in no shard"):
        load_checkpoint(path, "cpu", framework="numpy")


def test_tensor_in_two_shards(tmp_path, rng):
    directory = tmp_path / "twice"
    directory.mkdir()
    st_numpy.save_file({"w": np.zeros(4, "<f4"), "x": np.ones(2, "<f4")}, str(directory / "a.safetensors"))
    st_numpy.save_file({"w": np.ones(4, "<f4")}, str(directory / "b.safetensors"))
    with pytest.raises(CheckpointError, match="tensor 'w' is in two shards: .*a.safetensors and .*b.safetensors"):
        load_checkpoint(directory, "cpu", framework="numpy")


def test_overlapping_offsets_in_a_shard(tmp_path):
    header = json.dumps({
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    }).encode()
    path = tmp_path / "overlap.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(24))
    with pytest.raises(CheckpointError, match=r"tensor 'b': data_offsets \[8, 24\] overlap tensor 'a'"):
        load_checkpoint(path, "cpu", framework="numpy")


@pytest.mark.parametrize("selection", ["named", "cast"])
def test_shard_cut_while_loading(sharded, monkeypatch, selection):
    """Loads that read after the headers are checked: a shard cut in between is a short read,
    of a file that changed, so it is loaded again, and its header is refused as passing its
    end."""
    directory, tensors = sharded
    shard = os.path.join(directory, "model-00002-of-00003.safetensors")
    original = checkpoint.read_catalogue

    def then_cut(listing, **options):
        catalogue = original(listing, **options)
        os.truncate(shard, os.path.getsize(shard) - 100)  # after the checks, before the read
        return catalogue

    monkeypatch.setattr(checkpoint, "read_catalogue", then_cut)
    options = {"tensors": list(tensors)} if selection == "named" else {"dtype": "float64"}
    with pytest.raises(CheckpointError, match=r"model-00002-of-00003.safetensors: tensor .* past the end of the file"):
        load_checkpoint(directory, "cpu", framework="numpy", **options)


def test_shard_rewritten_while_its_header_is_read(sharded, monkeypatch, rng, recorded):
    """The whole load reads each shard's data section, found from its first bytes, while the
    headers are read: a shard rewritten in between (its header now longer, its values new) is
    loaded again from its checked header, and the tensors are the new ones."""
    directory, tensors = sharded
    name = "model-00002-of-00003.safetensors"
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    part = {n: t for n, t in tensors.items() if weight_map[n] == name}
    new = {n: (t * 3 if t.dtype.kind == "f" else t + 1).astype(t.dtype) for n, t in part.items()}
    original = checkpoint.read_catalogue

    def then_rewrite(listing, **options):
        st_numpy.save_file(new, os.path.join(directory, name), metadata={"format": "pt", "note": "x" * 1000})
        return original(listing, **options)

    monkeypatch.setattr(checkpoint, "read_catalogue", then_rewrite)
    got = load_checkpoint(directory, "cpu", framework="numpy")
    want = {**tensors, **new}
    assert set(got) == set(tensors)
    for n, t in want.items():
        _same(got[n], t)
    # Three shards read, then all three again from their checked headers.
    assert len(recorded) == 6


def test_whole_load_overlaps_header_reading_with_the_read(sharded, monkeypatch, recorded):
    """The whole load starts its reads before any header is read (from each file's first
    bytes) and parses the headers on its own thread meanwhile, so a header found malformed
    then stops them and raises, and nothing is left reading the files."""
    directory, _ = sharded
    order = []
    original_start, original_read = checkpoint.start_read_files, checkpoint.read_catalogue
    monkeypatch.setattr(checkpoint, "start_read_files", lambda *a: (order.append("read"), original_start(*a))[1])
    monkeypatch.setattr(
        checkpoint, "read_catalogue", lambda listing, **options: (order.append(("headers", options)), original_read(listing, **options))[1]
    )
    load_checkpoint(directory, "cpu", framework="numpy")
    # The headers parsed on the calling thread alone while the reads keep the cores busy.
    assert order == ["read", ("headers", {"parse_threads": 1})]
    shard = os.path.join(directory, "model-00001-of-00003.safetensors")
    with open(shard, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        f.seek(8 + n - 1)
        f.write(b"!")  # past the JSON's closing brace: malformed
    with pytest.raises(CheckpointError, match="not JSON"):
        load_checkpoint(directory, "cpu", framework="numpy")


@pytest.mark.parametrize("seen", ["as it is", "grown since", "shrunk since", "past the limit"])
def test_index_read_as_sized_whatever_its_size_when_looked_at(sharded, monkeypatch, seen):
    """The index is read as large as the file says it is, plus one byte: all of it if it grew
    after it was looked at, and one past the limit if it is larger than an index may be."""
    import gpumapio._checkpoint_files as files

    directory, tensors = sharded
    path, _ = _index(directory)
    size = os.path.getsize(path)
    looked = {"as it is": size, "grown since": size - 100, "shrunk since": size + 100, "past the limit": size}[seen]
    original = files._open_regular

    def stale(p):
        fd, st = original(p)
        return fd, os.stat_result((*st[:6], looked, *st[7:]))

    monkeypatch.setattr(files, "_open_regular", stale)
    if seen == "past the limit":
        monkeypatch.setattr(files, "_MAX_INDEX", size - 1)
        assert files._read_index(path) == open(path, "rb").read()
        with pytest.raises(CheckpointError, match=f"more than {size - 1} bytes; not a checkpoint index"):
            load_checkpoint(directory, "cpu", framework="numpy")
        return
    assert files._read_index(path) == open(path, "rb").read()
    assert load_checkpoint(directory, "cpu", framework="numpy").keys() == tensors.keys()


def test_guess_shards_is_the_complete_set_beside_an_index(tmp_path):
    """The files of ``P-0000k-of-0000N.safetensors`` for the index ``P.safetensors.index.json``,
    all N of one N, in number order, spelled as the listing spells them; nothing otherwise."""
    d = tmp_path
    index = d / "model.safetensors.index.json"
    index.write_text("{}")
    names = [f"model-{k:05d}-of-00003.safetensors" for k in (1, 2, 3)]
    for n in reversed(names):
        (d / n).write_bytes(b"")
    want = [os.path.normpath(str(d / n)) for n in names]
    assert guess_shards(d) == want
    assert guess_shards(str(index)) == want
    assert guess_shards(str(d) + "/./") == [os.path.normpath(p) for p in want]
    # Other files beside them are not guessed: a consolidated file, another prefix, another count.
    for other in ("consolidated.safetensors", "other-00001-of-00001.safetensors", "model.safetensors"):
        (d / other).write_bytes(b"")
    assert guess_shards(d) == want
    (d / "model-00004-of-00004.safetensors").write_bytes(b"")
    assert guess_shards(d) is None, "two counts: no guess"
    os.remove(d / "model-00004-of-00004.safetensors")
    os.remove(d / names[1])
    assert guess_shards(d) is None, "one missing: no guess"
    (d / names[1]).write_bytes(b"")
    (d / "a.safetensors.index.json").write_text("{}")
    assert guess_shards(d) == want, "model.safetensors.index.json is the one a directory means"
    os.remove(index)
    assert guess_shards(d) is None, "the one index left names files of another prefix"
    for name in ("a-00001-of-00002.safetensors", "a-00002-of-00002.safetensors"):
        (d / name).write_bytes(b"")
    assert guess_shards(d) == [str(d / "a-00001-of-00002.safetensors"), str(d / "a-00002-of-00002.safetensors")]
    (d / "b.safetensors.index.json").write_text("{}")
    assert guess_shards(d) is None, "two indices: the listing refuses the directory"
    for source in (str(d / "a-00001-of-00002.safetensors"), str(d / "nothing"), "s3://bucket/model.safetensors.index.json"):
        assert guess_shards(source) is None


def test_shards_guessed_in_another_order_than_the_index_gives_them(sharded, recorded):
    """An index whose first tensors are in the last shard: the guessed reads (in number order)
    are kept, and the tensors come in the listing's order, as without the guess."""
    directory, tensors = sharded
    path, index = _index(directory)
    weight_map = index["weight_map"]
    last = [n for n, f in weight_map.items() if f.endswith("00003-of-00003.safetensors")]
    index["weight_map"] = {**{n: weight_map[n] for n in last}, **{n: f for n, f in weight_map.items() if n not in last}}
    _rewrite(path, index)
    listing = list_shards(directory)
    assert listing.paths != guess_shards(directory) and sorted(listing.paths) == guess_shards(directory)
    got = load_checkpoint(directory, "cpu", framework="numpy")
    assert len(recorded) == 3, "one read per shard, started once"
    order = [n for p in listing.paths for n in checkpoint.read_catalogue(listing).shards[listing.paths.index(p)].columns.names]
    assert list(got) == order
    for name, want in tensors.items():
        _same(got[name], want)


def test_a_wrong_guess_stops_its_reads_and_loads_what_the_index_names(sharded, monkeypatch):
    """Files beside the index that follow its shards' naming but that it does not name: their
    guessed reads are stopped before the files close, and the load reads the index's shards."""
    directory, tensors = sharded
    path, index = _index(directory)
    third = "model-00003-of-00003.safetensors"
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if f != third}
    _rewrite(path, index)
    calls = []
    _watch_reads(monkeypatch, calls)
    # The guess's allocation is gone before the listing's is made: memory never holds both.
    allocations = []
    original_empty = checkpoint._Framework.empty

    def empty(self, size):
        assert all(earlier() is None for earlier in allocations), "the guess's allocation outlived its reads"
        flat = original_empty(self, size)
        allocations.append(weakref.ref(flat))
        return flat

    monkeypatch.setattr(checkpoint._Framework, "empty", empty)
    got = load_checkpoint(directory, "cpu", framework="numpy")
    assert calls == [("cancel", 3), ("wait", 3), ("wait", 2)]
    assert len(allocations) == 2
    assert set(got) == set(index["weight_map"])
    for name in index["weight_map"]:
        _same(got[name], tensors[name])


def test_a_guessed_shard_that_cannot_be_opened_is_named_as_without_the_guess(sharded, monkeypatch):
    """A directory named as a shard: the guess gives way to the listing, whose error is the
    one a load without the guess gives."""
    directory, _ = sharded
    shard = os.path.join(directory, "model-00002-of-00003.safetensors")
    os.remove(shard)
    os.mkdir(shard)
    assert guess_shards(directory) is not None
    with pytest.raises(CheckpointError) as guessed:
        load_checkpoint(directory, "cpu", framework="numpy")
    monkeypatch.setattr(checkpoint, "guess_shards", lambda source: None)
    with pytest.raises(CheckpointError) as listed:
        load_checkpoint(directory, "cpu", framework="numpy")
    assert str(guessed.value) == str(listed.value)
    assert "model-00002-of-00003.safetensors" in str(guessed.value)


@pytest.mark.parametrize("collector", ["on", "off"])
@pytest.mark.parametrize("selection", [None, "filtered"])
def test_the_collector_runs_while_the_reads_do_and_not_after(sharded, monkeypatch, collector, selection):
    """With the cyclic collector on, its youngest generation (every tensor just made) runs
    while the reads are in flight, not at the first allocation after the load; with it off,
    not at all; either way the load leaves it as it was."""
    directory, tensors = sharded
    events = []
    _watch_reads(monkeypatch, events)

    def seen(phase, info):
        if phase == "stop":
            events.append(f"collected {info['generation']}")

    names = None if selection is None else list(tensors)[::2]
    was_on = gc.isenabled()
    (gc.enable if collector == "on" else gc.disable)()
    gc.callbacks.append(seen)
    try:
        got = load_checkpoint(directory, "cpu", framework="numpy", tensors=names)
        after = [[k] for k in range(100)]  # allocations the collector counts
        assert gc.isenabled() == (collector == "on")
    finally:
        gc.callbacks.remove(seen)
        (gc.enable if was_on else gc.disable)()
    assert events == (["collected 0"] if collector == "on" else []) + [("wait", 3)]
    assert len(after) == 100 and set(got) == set(names or tensors)


def test_interrupted_while_reading_stops_the_reads_before_closing(sharded, monkeypatch):
    """A KeyboardInterrupt (or any error) while the views are made, the reads in flight: the
    reads are cancelled and waited for before the files close, the error comes out, and the
    next load is whole."""
    directory, tensors = sharded
    calls = []
    _watch_reads(monkeypatch, calls)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "_whole_views", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_checkpoint(directory, "cpu", framework="numpy")
    assert calls == [("cancel", 3), ("wait", 3)]
    assert gc.isenabled(), "the collector is back on"
    monkeypatch.undo()
    got = load_checkpoint(directory, "cpu", framework="numpy")
    for name, want in tensors.items():
        _same(got[name], want)


def test_empty_and_ambiguous_directories(tmp_path):
    with pytest.raises(CheckpointError, match="no \\*.safetensors file"):
        load_checkpoint(tmp_path, "cpu", framework="numpy")
    for name in ("a.safetensors.index.json", "b.safetensors.index.json"):
        (tmp_path / name).write_text('{"weight_map": {}}')
    with pytest.raises(CheckpointError, match="2 index files"):
        load_checkpoint(tmp_path, "cpu", framework="numpy")


def test_native_read_files(tmp_path):
    from gpumapio._native import read_files

    data = bytes(range(256)) * 40
    (tmp_path / "a").write_bytes(data)
    (tmp_path / "b").write_bytes(data[::-1])
    out = np.zeros(64, dtype=np.uint8)
    with gpumapio.CuFile(tmp_path / "a") as a, gpumapio.CuFile(tmp_path / "b") as b:
        # A plain range of b, a strided piece of a (4 runs of 8 bytes every 100), one past a's end.
        counts = read_files(out, [a, b], [(1, 0, 16, 0, 1, 0), (0, 3, 8, 16, 4, 100), (0, len(data) - 4, 8, 48, 1, 0)])
        assert counts == [16, 32, 4]
        assert out[:16].tobytes() == data[::-1][:16]
        assert out[16:48].tobytes() == b"".join(data[3 + 100 * k : 11 + 100 * k] for k in range(4))
        assert out[48:52].tobytes() == data[-4:]
        with pytest.raises(ValueError, match="file 2 of 2"):
            read_files(out, [a, b], [(2, 0, 1, 0, 1, 0)])
        with pytest.raises(ValueError):
            read_files(out, [a, b], [(0, 0, 8, 60, 1, 0)])  # past the end of the buffer


def test_checkpoint_error_is_a_value_error():
    assert issubclass(CheckpointError, ValueError)
    assert gpumapio.CheckpointError is CheckpointError


# torch: CPU tensors here, CUDA where there is a GPU.


def test_torch_bf16_views_and_cast(sharded):
    torch = pytest.importorskip("torch")
    directory, tensors = sharded
    got = load_checkpoint(directory, "cpu", dtype=torch.bfloat16)
    for name, want in tensors.items():
        ref = torch.from_numpy(want.copy())
        if ref.is_floating_point():
            assert got[name].dtype == torch.bfloat16
            assert torch.equal(got[name], ref.to(torch.bfloat16)), name
        else:
            assert torch.equal(got[name], ref), name


def test_load_into_a_meta_module(sharded):
    torch = pytest.importorskip("torch")
    directory, tensors = sharded

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up_proj = torch.nn.Linear(64, 96, bias=False)
            self.register_buffer("scale", torch.full((3,), 2.0), persistent=False)

    with gpumapio.empty_weights():
        model = torch.nn.Module()
        model.mlp = Layer()
    assert model.mlp.up_proj.weight.device.type == "meta" and model.mlp.scale.device.type == "cpu"
    renamed = {"mlp.up_proj.weight": "model.layers.2.mlp.up_proj.weight"}
    st_numpy.save_file({k: tensors[v] for k, v in renamed.items()}, os.path.join(directory, "..", "small.safetensors"))
    gpumapio.load_into_model(model, os.path.join(directory, "..", "small.safetensors"), "cpu")
    assert torch.equal(model.mlp.up_proj.weight, torch.from_numpy(tensors["model.layers.2.mlp.up_proj.weight"]))
    assert isinstance(model.mlp.up_proj.weight, torch.nn.Parameter)
    with gpumapio.empty_weights():
        bigger = torch.nn.Module()
        bigger.mlp = Layer()
        bigger.extra = torch.nn.Linear(2, 2)
    with pytest.raises(KeyError, match="extra.weight"):
        gpumapio.load_into_model(bigger, os.path.join(directory, "..", "small.safetensors"), "cpu")


def test_gpu_sharded_tp_and_cast(sharded):
    torch = need_gpu("torch")
    directory, tensors = sharded
    got = load_checkpoint(directory, "cuda")
    for name, want in tensors.items():
        assert got[name].is_cuda
        assert torch.equal(got[name].cpu(), torch.from_numpy(want.copy())), name
    # Ranks on their own streams, as a process per GPU would have.
    rules = {k: v for k, v in RULES.items() if "embed" not in k}
    parts = []
    for rank in range(4):
        with torch.cuda.stream(torch.cuda.Stream()):
            parts.append(load_checkpoint(directory, "cuda", tp=TensorParallel(rank, 4, rules), dtype=torch.bfloat16, staging_bytes=1 << 17))
    torch.cuda.synchronize()
    for name in ("model.layers.1.mlp.down_proj.weight", "model.layers.1.self_attn.q_proj.weight"):
        dim = TensorParallel(0, 4, rules).split_dim(name)
        whole = torch.cat([p[name] for p in parts], dim=dim).cpu()
        assert torch.equal(whole, torch.from_numpy(tensors[name]).to(torch.bfloat16)), name


def test_one_shard_under_two_spellings_is_read_once_and_faults_are_named(sharded):
    directory, tensors = sharded
    path, index = _index(directory)
    first = "model-00001-of-00003.safetensors"
    spelled = {n: (f"./{first}" if k % 2 else first) for k, (n, s) in enumerate(index["weight_map"].items()) if s == first}
    index["weight_map"].update(spelled)
    _rewrite(path, index)
    got = load_checkpoint(path, "cpu", framework="numpy")
    assert set(got) == set(tensors)
    # A tensor no shard holds, named through the second spelling: that is the fault named.
    index["weight_map"]["ghost"] = f"./{first}"
    _rewrite(path, index)
    with pytest.raises(CheckpointError, match=r"'ghost' is mapped to './model-00001-of-00003.safetensors' but is in no shard"):
        load_checkpoint(path, "cpu", framework="numpy")


def test_a_string_selection_is_one_name_and_unholdable_dtypes_name_file_and_tensor(tmp_path, sharded):
    directory, tensors = sharded
    got = load_checkpoint(directory, "cpu", framework="numpy", tensors="model.norm.weight")
    assert list(got) == ["model.norm.weight"]
    _same(got["model.norm.weight"], tensors["model.norm.weight"])
    with pytest.raises(KeyError, match="no tensor 'lm_head.weightx'"):
        load_checkpoint(directory, "cpu", framework="numpy", tensors="lm_head.weightx")
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    bf = tmp_path / "bf"
    bf.mkdir()
    save_file({"a": torch.zeros(2), "b16": torch.zeros(2, dtype=torch.bfloat16)}, str(bf / "m.safetensors"))
    for selection in ({}, {"tensors": ["b16"]}):
        with pytest.raises(ValueError, match=r"m.safetensors: tensor 'b16' is BF16, NumPy has no BF16"):
            load_checkpoint(str(bf), "cpu", framework="numpy", **selection)
    with pytest.raises(ValueError, match=r"m.safetensors: tensor 'b16' is BF16, NumPy has no BF16"):
        load_safetensors(str(bf / "m.safetensors"), "cpu", framework="numpy")


@pytest.mark.parametrize("rank, world", [(True, 2), (0, True), (0, False), (1.0, 2)])
def test_tensor_parallel_refuses_bools_and_floats(rank, world):
    with pytest.raises(ValueError, match="rank|world_size"):
        TensorParallel(rank, world, {})


def _two_versions(tmp_path):
    """A shard's path holding version A, and version B beside it: as many bytes, other
    names and values, so that one's header over the other's bytes shows."""
    path = str(tmp_path / "model.safetensors")
    new = str(tmp_path / "new.tmp")
    st_numpy.save_file({"a": np.arange(1, 5, dtype="<i4")}, path)
    st_numpy.save_file({"b": np.array([7, 8, 9, 10], dtype="<i4")}, new)
    assert os.path.getsize(path) == os.path.getsize(new)
    return path, new


# How each loader is reached: the whole load (no catalogue: reads start before the headers),
# the whole load from a catalogue (a dtype= that casts no tensor), and the planned loads.
_MODES = {
    "whole": {},
    "whole from catalogue": {"dtype": "float64"},
    "named": {"tensors": lambda n: True},
    "tp": {"tp": TensorParallel(0, 1, {"*": 0})},
}


@pytest.mark.parametrize("mode", list(_MODES))
@pytest.mark.parametrize("when", ["before the headers", "after the headers"])
def test_shard_replaced_while_loading_is_never_mixed(tmp_path, monkeypatch, mode, when):
    """Each shard is opened twice, for its header and for its data: a shard renamed over in
    between (an atomic save) must not give one version's header over the other's bytes. It
    is loaded again, and the result is the new version whole."""
    path, new = _two_versions(tmp_path)
    original = checkpoint.read_catalogue

    def racing(listing, **options):
        if when == "before the headers" and os.path.exists(new):
            os.replace(new, path)
        catalogue = original(listing, **options)
        if when == "after the headers" and os.path.exists(new):
            os.replace(new, path)
        return catalogue

    monkeypatch.setattr(checkpoint, "read_catalogue", racing)
    got = load_checkpoint(path, "cpu", framework="numpy", **_MODES[mode])
    assert list(got) == ["b"]
    _same(got["b"], np.array([7, 8, 9, 10], dtype="<i4"))


def test_shard_rewritten_in_place_after_its_header_is_loaded_again(tmp_path, monkeypatch):
    """A shard rewritten in place (as many bytes, other values) after its header is read is
    seen by its times, and loaded again: never the old header over the new bytes."""
    path, new = _two_versions(tmp_path)
    os.utime(path, ns=(0, 0))  # its next write changes its mtime, however coarse the clock
    original = checkpoint.read_catalogue

    def rewrite(listing, **options):
        catalogue = original(listing, **options)
        if os.path.exists(new):
            with open(path, "r+b") as f:
                f.write(open(new, "rb").read())
            os.remove(new)
        return catalogue

    monkeypatch.setattr(checkpoint, "read_catalogue", rewrite)
    got = load_checkpoint(path, "cpu", framework="numpy", tensors=lambda n: True)
    assert list(got) == ["b"]
    _same(got["b"], np.array([7, 8, 9, 10], dtype="<i4"))


def test_shard_replaced_on_every_attempt_is_a_named_error(tmp_path, monkeypatch):
    """A shard that keeps changing is loaded again a few times only, then refused by name."""
    path, new = _two_versions(tmp_path)
    other = str(tmp_path / "other.tmp")
    original = checkpoint.read_catalogue
    calls = []

    def flip(listing, **options):
        catalogue = original(listing, **options)
        calls.append(1)
        os.rename(path, other)
        os.replace(new, path)
        os.rename(other, new)
        return catalogue

    monkeypatch.setattr(checkpoint, "read_catalogue", flip)
    with pytest.raises(CheckpointError, match=r"model.safetensors: the file changed while it was loaded .*3 times in a row; load again"):
        load_checkpoint(path, "cpu", framework="numpy", tensors=lambda n: True)
    assert len(calls) == 3


def test_fifo_index_is_refused_not_waited_on(tmp_path):
    """An index is opened as shards are: a FIFO is refused, named, rather than waited on."""
    fifo = str(tmp_path / "model.safetensors.index.json")
    os.mkfifo(fifo)
    raised = refused_not_waited_on(fifo, lambda: load_checkpoint(str(tmp_path), "cpu", framework="numpy"), "load_checkpoint")
    assert isinstance(raised, OSError) and "not a regular file" in str(raised), raised
    assert raised.filename == fifo and raised.errno == errno.EINVAL, raised


def test_index_with_an_empty_weight_map_is_an_empty_checkpoint(tmp_path):
    with open(tmp_path / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": {}}, f)
    for options in ({}, {"tensors": []}, {"dtype": "float32"}, {"tp": TensorParallel(0, 2, {"*": 0})}):
        assert load_checkpoint(str(tmp_path), "cpu", framework="numpy", **options) == {}


def test_deeply_nested_index_is_a_checkpoint_error(tmp_path):
    st_numpy.save_file({"a": np.ones(2, dtype="<f4")}, str(tmp_path / "s.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "s.safetensors"}, "x": ' + "[" * 100000 + "]" * 100000 + "}"
    )
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: not a JSON index: nested too deep"):
        load_checkpoint(str(tmp_path), "cpu", framework="numpy")


def test_directory_named_like_a_shard_is_named_in_the_error(tmp_path):
    (tmp_path / "b.safetensors").mkdir()
    st_numpy.save_file({"a": np.ones(2, dtype="<f4")}, str(tmp_path / "a.safetensors"))
    for options in ({}, {"tensors": ["a"]}):
        with pytest.raises(IsADirectoryError, match=re.escape(str(tmp_path / "b.safetensors"))):
            load_checkpoint(str(tmp_path), "cpu", framework="numpy", **options)


def _zero_sized(path, dtype, shape):
    """A file of one tensor with no elements (``shape`` holds a 0) and a small one after it."""
    header = json.dumps({
        "z": {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]},
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    }).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + np.array([1.5, 2.5], dtype="<f4").tobytes())
    return str(path)


def test_zero_element_tensor_with_huge_extents_loads_in_every_mode(tmp_path):
    """A shape of [0, 2**62, 4] is valid (safetensors loads it): its contiguous strides would
    pass 64 bits, and a tensor with no elements needs none of them."""
    torch = pytest.importorskip("torch")
    path = _zero_sized(tmp_path / "m.safetensors", "F32", [0, 2**62, 4])
    modes = [{}, {"tensors": ["z", "a"]}, {"dtype": torch.float16}, {"tp": TensorParallel(1, 2, {"z": 1})}, {"tp": TensorParallel(0, 2, {"z": -1}), "dtype": torch.float64}]
    for options in modes:
        got = load_checkpoint(path, "cpu", **options)
        split = options.get("tp").split_dim("z") if "tp" in options else None
        shape = [0, 2**62, 4] if split is None else [0, 2**61, 4] if split == 1 else [0, 2**62, 2]
        dtype = options.get("dtype", torch.float32)
        assert list(got["z"].shape) == shape and got["z"].dtype == dtype and got["z"].numel() == 0, options
        assert torch.equal(got["a"], torch.tensor([1.5, 2.5]).to(dtype)), options


def test_zero_element_tensor_with_huge_extents_in_numpy(tmp_path):
    """NumPy holds a shape with no elements while its other extents times the itemsize fit
    2^63; past that, the error names the file and the tensor."""
    fits = _zero_sized(tmp_path / "fits.safetensors", "U8", [0, 2**61, 2])
    for options in ({}, {"tensors": ["z", "a"]}, {"dtype": "f8"}, {"tp": TensorParallel(0, 2, {"z": 1})}):
        got = load_checkpoint(fits, "cpu", framework="numpy", **options)
        assert got["z"].shape[0] == 0 and got["z"].shape[2] == 2 and got["z"].dtype == np.uint8, options
    too_big = _zero_sized(tmp_path / "big.safetensors", "F32", [0, 2**62, 4])
    for options in ({}, {"tensors": ["z"]}, {"dtype": "f2"}):
        with pytest.raises(ValueError, match=r"big.safetensors: tensor 'z' of shape \[0, 4611686018427387904, 4\]: NumPy cannot hold"):
            load_checkpoint(too_big, "cpu", framework="numpy", **options)
    # load_safetensors said NumPy's bare "array is too big", naming no file or tensor.
    with pytest.raises(ValueError, match=r"big.safetensors: tensor 'z' of shape \[0, 4611686018427387904, 4\]: NumPy cannot hold"):
        gpumapio.load_safetensors(too_big, "cpu", framework="numpy")
    assert gpumapio.load_safetensors(fits, "cpu", framework="numpy")["z"].shape == (0, 2**61, 2)


def test_load_into_model_ties_a_weight_saved_once(tmp_path):
    """A plain module whose two names share one Parameter, saved by safetensors' save_model
    (the shared tensor stored under one name): both names get the loaded Parameter, tied."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_model, save_model

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

    path = str(tmp_path / "m.safetensors")
    save_model(Tied(), path)
    reference = Tied()
    load_model(reference, path)
    for strict in (True, False):
        with gpumapio.empty_weights():
            model = Tied()
        gpumapio.load_into_model(model, path, "cpu", strict=strict)
        assert model.head.weight is model.emb.weight and isinstance(model.emb.weight, torch.nn.Parameter)
        assert torch.equal(model.emb.weight, reference.emb.weight)


def test_load_into_model_warns_of_what_stays_on_meta(tmp_path):
    torch = pytest.importorskip("torch")
    st_numpy.save_file({"weight": np.ones((2, 2), dtype="<f4")}, str(tmp_path / "m.safetensors"))
    with gpumapio.empty_weights():
        model = torch.nn.Linear(2, 2)
    with pytest.warns(UserWarning, match=r"no tensor for 'bias'; left on the meta device"):
        gpumapio.load_into_model(model, str(tmp_path / "m.safetensors"), "cpu", strict=False)
    assert model.weight.device.type == "cpu" and model.bias.device.type == "meta"


def test_load_into_model_is_strict_for_a_model_not_built_on_meta(tmp_path):
    """A model built as usual kept its own bias, with strict=True, where the checkpoint had
    none: only tensors left on meta were counted as missing."""
    torch = pytest.importorskip("torch")
    st_numpy.save_file({"weight": np.ones((3, 4), dtype="<f4")}, str(tmp_path / "w.safetensors"))
    with pytest.raises(KeyError, match=r"no tensor for 'bias'"):
        gpumapio.load_into_model(torch.nn.Linear(4, 3), str(tmp_path / "w.safetensors"), "cpu")
    model = torch.nn.Linear(4, 3)
    bias = model.bias.detach().clone()
    with pytest.warns(UserWarning, match=r"no tensor for 'bias'; left as the model had it"):
        gpumapio.load_into_model(model, str(tmp_path / "w.safetensors"), "cpu", strict=False)
    assert torch.equal(model.weight, torch.ones(3, 4)) and torch.equal(model.bias, bias)


def test_empty_weights_leaves_lazy_parameters_and_keeps_parameter_attributes():
    """A lazy module failed to build inside the block (UninitializedParameter takes no
    tensor); attributes set on a parameter (a subclass's sharding, say) were dropped."""
    torch = pytest.importorskip("torch")

    class Tagged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            weight = torch.nn.Parameter(torch.ones(2))
            weight.shard_dim = 0
            self.register_parameter("weight", weight)

    with gpumapio.empty_weights():
        lazy = torch.nn.LazyLinear(3)
        tagged = Tagged()
    assert isinstance(lazy.weight, torch.nn.parameter.UninitializedParameter)
    assert lazy(torch.ones(2, 5)).shape == (2, 3)  # materialised as usual on first use
    assert tagged.weight.device.type == "meta" and tagged.weight.shard_dim == 0


def test_empty_weights_blocks_overlapping_across_threads(tmp_path):
    """Blocks of two threads that end out of order: each holds for its own thread only, and
    once both end, modules are built as usual."""
    torch = pytest.importorskip("torch")
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with gpumapio.empty_weights():
            a_in.set()
            b_in.wait(10)
            seen["a inside"] = torch.nn.Linear(2, 2).weight.device.type
        a_out.set()

    def b():
        a_in.wait(10)
        with gpumapio.empty_weights():
            b_in.set()
            a_out.wait(10)  # a's block ends first
            seen["b inside, after a's"] = torch.nn.Linear(2, 2).weight.device.type
        seen["b after"] = torch.nn.Linear(2, 2).weight.device.type

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    a_in.wait(10)
    seen["main, beside a's block"] = torch.nn.Linear(2, 2).weight.device.type
    for t in threads:
        t.join(20)
    assert seen == {"a inside": "meta", "b inside, after a's": "meta", "b after": "cpu", "main, beside a's block": "cpu"}
    assert torch.nn.Linear(2, 2).weight.device.type == "cpu"
    with gpumapio.empty_weights():
        with gpumapio.empty_weights():
            pass
        assert torch.nn.Linear(2, 2).weight.device.type == "meta"  # the outer block still holds
    assert torch.nn.Linear(2, 2).weight.device.type == "cpu"


@pytest.mark.parametrize("selection", ["whole", "named"])
def test_shard_rewritten_shorter_after_its_reads_were_planned(tmp_path, monkeypatch, selection):
    """A shard rewritten in place with a shorter valid file after it was opened and before
    its reads: the short read is of a changed file, so the new version is loaded (as
    load_safetensors does), not refused as cut."""
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file({"a": np.arange(1 << 16, dtype="<f4")}, path)
    new = {"a": np.full(8, 7, dtype="<f4")}
    st_numpy.save_file(new, path + ".new")
    with open(path + ".new", "rb") as f:
        new_bytes = f.read()
    original = checkpoint.start_read_files
    fired = []

    def rewrite_then_read(*args):
        if not fired:
            fired.append(True)
            with open(path, "r+b") as f:
                f.truncate(0)
                f.write(new_bytes)
        return original(*args)

    monkeypatch.setattr(checkpoint, "start_read_files", rewrite_then_read)
    options = {"tensors": ["a"]} if selection == "named" else {}
    got = load_checkpoint(path, "cpu", framework="numpy", **options)
    assert fired
    _same(got["a"], new["a"])


def test_empty_tensors_misaligned_after_a_short_header(tmp_path):
    """A tensor of no element at an offset that is not a multiple of its itemsize (a header
    whose length is not padded), in a shard of no data bytes: an empty array, as safetensors
    gives, in every load path."""
    header = json.dumps({"t": {"dtype": "I32", "shape": [0, 3], "data_offsets": [0, 0]}}).encode()
    header += b" " * ((-len(header)) % 8 + 1)  # 8 + len(header) is odd
    path = str(tmp_path / "empty.safetensors")
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
    want = st_numpy.load_file(path)["t"]
    for options in ({}, {"tensors": ["t"]}, {"tensors": lambda name: True}):
        _same(load_checkpoint(path, "cpu", framework="numpy", **options)["t"], want)


@pytest.mark.parametrize("at_once", [2, 3])
def test_shards_more_than_may_be_open_at_once_load_in_groups(sharded, monkeypatch, at_once):
    """Shards beyond those that may be open at once are read a group at a time: every load
    path gives the same bytes, and no more files are open at once than the bound."""
    directory, tensors = sharded
    monkeypatch.setattr(checkpoint, "_open_at_once", lambda: at_once)
    original = checkpoint.start_read_files
    widest = []

    def counted(buf, files, pieces):
        widest.append(len(files))
        return original(buf, files, pieces)

    monkeypatch.setattr(checkpoint, "start_read_files", counted)
    for got in (
        load_checkpoint(directory, "cpu", framework="numpy"),
        load_checkpoint(directory, "cpu", framework="numpy", tensors=lambda name: "norm" not in name),
        load_checkpoint(directory, "cpu", framework="numpy", tensors=list(tensors)),
    ):
        for name, t in got.items():
            _same(t, tensors[name])
    assert widest and max(widest) <= at_once
    cast = load_checkpoint(directory, "cpu", framework="numpy", dtype="float64")
    for name, t in tensors.items():
        want = t.astype("float64") if t.dtype.kind == "f" else t
        _same(cast[name], want)
    tp = TensorParallel(rank=1, world_size=2, rules={"*proj.weight": 0})
    sliced = load_checkpoint(directory, "cpu", framework="numpy", tp=tp)
    name = "model.layers.1.mlp.up_proj.weight"
    _same(sliced[name], np.array_split(tensors[name], 2, axis=0)[1])


def test_more_shards_than_the_descriptor_limit_allows_at_once(tmp_path):
    """A checkpoint of more shards than the soft RLIMIT_NOFILE loads (in a process whose
    limit is 64), as safetensors loads it one file after another."""
    directory = str(tmp_path / "many")
    tensors = {f"t{k}": np.full(3, k, dtype="<f4") for k in range(100)}
    _save_sharded(tensors, directory, shards=100)
    code = f"""
import resource, numpy as np, gpumapio
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
got = gpumapio.load_checkpoint({directory!r}, "cpu", framework="numpy")
assert sorted(got) == sorted(f"t{{k}}" for k in range(100))
assert all((got[f"t{{k}}"] == k).all() for k in range(100))
got = gpumapio.load_checkpoint({directory!r}, "cpu", framework="numpy", tensors=["t99", "t0"])
assert (got["t99"] == 99).all() and (got["t0"] == 0).all()
print("loaded")
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr


def test_dtypes_that_are_not_numbers_are_refused_by_name(sharded):
    directory, _ = sharded
    for dtype in ("U4", "V4", "M8[s]", object):
        with pytest.raises(TypeError, match=r"is not a numeric NumPy dtype"):
            load_checkpoint(directory, "cpu", framework="numpy", dtype=dtype)
    with pytest.raises(TypeError, match=r"dtype 'not-a-dtype' is not a NumPy dtype"):
        load_checkpoint(directory, "cpu", framework="numpy", dtype="not-a-dtype")
    torch = pytest.importorskip("torch")
    del torch
    for dtype in ("fp16", "torch.float16", "Tensor"):
        with pytest.raises(TypeError, match=rf"dtype '{re.escape(dtype)}' is not a torch dtype"):
            load_checkpoint(directory, "cpu", dtype=dtype)


def test_a_dtype_numpy_lacks_is_named_with_its_file_and_tensor_whatever_the_cast(tmp_path):
    """NumPy has no BF16: with or without dtype=, the error names the file and the tensor
    (the dtypes were once walked in set order, which the hash seed decides)."""
    path = str(tmp_path / "mixed.safetensors")
    a = np.arange(4, dtype="<f4")
    header = json.dumps(
        {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]}}
    ).encode()
    header += b" " * ((-len(header)) % 8)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + a.tobytes() + bytes(8))
    for options in ({}, {"dtype": "float64"}, {"dtype": "float32"}):
        with pytest.raises(ValueError, match=r"mixed.safetensors: tensor 'b' is BF16, NumPy has no BF16"):
            load_checkpoint(path, "cpu", framework="numpy", **options)
