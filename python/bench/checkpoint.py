"""Sharded safetensors checkpoints onto the GPU: gpumapio.load_checkpoint against gpumap's own
whole-file read of the same bytes and against the loaders people use, in one run.

    python3 python/bench/checkpoint.py make DIR [--gb 4] [--shards 4]      # a Llama-like bf16 checkpoint
    python3 python/bench/checkpoint.py make-small DIR [--tensors 10000]    # 10,000 tensors of 64 KiB
    python3 python/bench/checkpoint.py run DIR [--small DIR] [--whole FILE] [--repeat 3]
        [--cold] [--json OUT.json] [--markdown OUT.md]
    python3 python/bench/checkpoint.py warm DIR SMALL [--label L] [--round N]  # one JSON line

``warm`` times, in one process, warm ``load_checkpoint`` calls of DIR (8 after 2) and of the
small-tensor checkpoint SMALL (20 after 3), and prints their best and median GB/s and the
small one's share of the large one's rate as one JSON line: for A/Bs of two builds, each run
in fresh processes by turns (``PYTHONPATH`` naming the build).

``make`` writes what transformers' save_pretrained writes for a Llama-like model in bf16:
``config.json``, ``model-0000k-of-0000n.safetensors`` (tensors in the model's order, shards
cut at whole tensors) and ``model.safetensors.index.json``; the values are random bf16 (a
64 MiB random block, tiled). ``run`` measures, each in GB/s of the bytes a call delivers:

- ``gpumap-whole-file``: ``CuFile.read`` of one file of the same bytes (``--whole``: the
  shards concatenated; the upper bound a loader can reach through gpumap);
- ``load_checkpoint``: ``gpumapio.load_checkpoint(DIR, "cuda")``, warm (best and median);
- ``load_checkpoint-first``: the same in a fresh process, the clock started before the first
  CUDA call (CUDA context, allocation, pinned buffers included);
- ``load_checkpoint-tp4``: rank 0 of 4 with vLLM's Llama splits, GB/s of bytes read;
- ``load_checkpoint-small``: the checkpoint of ``--small`` (10,000 tensors of 64 KiB);
- ``safetensors-load_file``: ``safetensors.torch.load_file(shard, device="cuda")`` per shard;
- ``transformers-from_pretrained``: ``LlamaForCausalLM.from_pretrained(DIR, dtype=bf16)`` to
  the GPU;
- ``instanttensor``, ``fastsafetensors``: where they import (else reported as not installed),
  each with the settings of ``PEER_CONFIGS``, in a process of its own, tensors copied out of
  their buffers as their documentation says (the copy is part of their time);
- ``load_checkpoint-first-after-context``: the same fresh load timed from the CUDA
  context's existence (what the first load pays beyond the context: pinned buffers);
- ``load_checkpoint-tp4-contiguous``, ``-tp4-strided``: the rank's tensors split along rows
  (and those loaded whole), and those split along columns, each loaded alone;
- with ``--no-peers``: transformers and the peers left out (a quick rerun of gpumap's rows);
- with ``--cold``: the whole-file read and load_checkpoint again, the page cache dropped
  before each (root).

Every loader's tensors are checked equal to safetensors' own, once. The results go to stdout
as a markdown table, and to ``--json`` / ``--markdown``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np

# vLLM's splits of a Llama model's tensors (column-parallel: dimension 0; row-parallel: 1).
LLAMA_TP = {
    "*.q_proj.weight": "row",
    "*.k_proj.weight": "row",
    "*.v_proj.weight": "row",
    "*.gate_proj.weight": "row",
    "*.up_proj.weight": "row",
    "*.o_proj.weight": "column",
    "*.down_proj.weight": "column",
    "model.embed_tokens.weight": "row",
    "lm_head.weight": "row",
}


def _write_safetensors(path: str, tensors: list[tuple[str, tuple[int, ...]]], block: np.ndarray) -> int:
    """A bf16 safetensors file of ``tensors`` (names and shapes), values tiled from ``block``."""
    header: dict = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, shape in tensors:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section 8-aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for _, shape in tensors:
            left = int(np.prod(shape)) * 2
            while left:
                take = min(left, block.nbytes)
                f.write(block[:take].tobytes())
                left -= take
    return at


def _shard_and_save(directory: str, tensors: list[tuple[str, tuple[int, ...]]], shards: int) -> None:
    os.makedirs(directory, exist_ok=True)
    block = (np.random.default_rng(20261124).standard_normal(32 << 20).astype(np.float32) * 0.02).view(np.uint16)[1::2].copy().view(np.uint8)
    total = sum(int(np.prod(s)) * 2 for _, s in tensors)
    per = total / shards
    groups: list[list] = [[]]
    size = 0
    for t in tensors:
        if size >= per * len(groups) and len(groups) < shards:
            groups.append([])
        groups[-1].append(t)
        size += int(np.prod(t[1])) * 2
    weight_map = {}
    for k, group in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        _write_safetensors(os.path.join(directory, file), group, block)
        weight_map.update({name: file for name, _ in group})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def make(directory: str, gb: float, shards: int) -> None:
    """A Llama-like model of about ``gb`` GB: hidden 3072, MLP 8192, vocabulary 32000; the
    number of layers chosen for the size."""
    hidden, inter, vocab = 3072, 8192, 32000
    per_layer = (4 * hidden * hidden + 3 * hidden * inter + 2 * hidden) * 2
    layers = max(1, math.ceil((gb * 1e9 - 2 * vocab * hidden * 2) / per_layer))
    tensors: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (hidden, hidden)),
            (p + "self_attn.k_proj.weight", (hidden, hidden)),
            (p + "self_attn.v_proj.weight", (hidden, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, hidden)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "mlp.gate_proj.weight", (inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
        ]
    tensors += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    _shard_and_save(directory, tensors, shards)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": 24,
        "num_key_value_heads": 24,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def make_small(directory: str, count: int, shards: int) -> None:
    _shard_and_save(directory, [(f"blocks.{i}.weight", (128, 256)) for i in range(count)], shards)


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


def _timed(fn, repeat: int) -> tuple[list[float], object]:
    times, out = [], None
    for _ in range(repeat):
        out = None
        _sync()
        start = time.perf_counter()
        out = fn()
        _sync()
        times.append(time.perf_counter() - start)
    return times, out


def _nbytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _check(name: str, got: dict, want: dict) -> None:
    import torch

    assert got.keys() == want.keys(), f"{name}: tensor names differ"
    for k, v in want.items():
        assert torch.equal(got[k].to(v.device), v), f"{name}: {k} differs"


def _drop() -> bool:
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            os.sync()
            f.write("3\n")
        return True
    except OSError:
        return False


def warm(directory: str, small: str, label: str, round_: int) -> None:
    """``warm``: one JSON line of the large and small checkpoints' warm load rates."""
    import gpumapio

    row: dict = {"build": label, "round": round_}
    for name, source, before, repeat in (("large", directory, 2, 8), ("small", small, 3, 20)):
        nbytes = _nbytes(gpumapio.load_checkpoint(source, "cuda"))
        _timed(lambda: gpumapio.load_checkpoint(source, "cuda"), before)
        times, _ = _timed(lambda: gpumapio.load_checkpoint(source, "cuda"), repeat)
        row[name] = {"best_gbs": nbytes / min(times) / 1e9, "median_gbs": nbytes / statistics.median(times) / 1e9, "times": times}
    for stat in ("best_gbs", "median_gbs"):
        row[f"small_share_{stat[:-4]}"] = row["small"][stat] / row["large"][stat]
    print(json.dumps(row), flush=True)


def first_load(directory: str) -> None:
    """The fresh process of ``load_checkpoint-first``: prints seconds and bytes as JSON."""
    import torch

    import gpumapio

    start = time.perf_counter()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    context = time.perf_counter()
    out = gpumapio.load_checkpoint(directory, "cuda")
    torch.cuda.synchronize()
    end = time.perf_counter()
    print(json.dumps({"seconds": end - start, "after_context": end - context, "bytes": _nbytes(out)}))


# The peers' settings tried, each in a process of its own (their environment variables are
# read at import). InstantTensor: its defaults, then larger GPU buffers, I/O sizes and
# concurrency (safe_open's buffer_size, chunk_size, concurrency), and its cuFile backend;
# fastsafetensors: GPUDirect Storage where it works, else its POSIX path (nogds).
PEER_CONFIGS: dict[str, list[dict]] = {
    "instanttensor": [
        {},
        {"kwargs": {"buffer_size": 1 << 30, "chunk_size": 16 << 20, "concurrency": 16}},
        {"kwargs": {"buffer_size": 4 << 30, "chunk_size": 64 << 20, "concurrency": 32}},
        {"env": {"INSTANTTENSOR_USE_CUFILE": "1"}},
    ],
    "fastsafetensors": [{"kwargs": {"nogds": False}}, {"kwargs": {"nogds": True}}],
}


def peer(name: str, directory: str, config: dict, repeat: int) -> None:
    """One peer in this process: ``repeat`` loads of every shard (a first one not timed),
    their tensors checked against safetensors' once; prints the seconds and bytes as JSON."""
    try:
        __import__(name)
    except ImportError as e:
        print(json.dumps({"missing": str(e)}))
        return
    import torch
    from safetensors.torch import load_file

    index = json.load(open(os.path.join(directory, "model.safetensors.index.json")))
    shards = [os.path.join(directory, s) for s in dict.fromkeys(index["weight_map"].values())]
    kwargs = config.get("kwargs", {})
    if name == "instanttensor":
        from instanttensor import safe_open

        def load() -> dict:
            # Its tensors live in a reused buffer: copied out, as its documentation says to.
            with safe_open(shards, framework="pt", device=0, **kwargs) as f:
                return {k: t.clone() for k, t in f.tensors()}
    else:
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        def load() -> dict:
            loader = SafeTensorsFileLoader(SingleGroup(), torch.device("cuda", 0), **kwargs)
            loader.add_filenames({0: shards})
            buffer = loader.copy_files_to_device()
            out = {k: buffer.get_tensor(k).clone() for k in buffer.key_to_rank_lidx}
            buffer.close()
            loader.close()
            return out

    got = load()
    want = {k: v for s in shards for k, v in load_file(s, device="cuda").items()}
    _check(name, got, want)
    del got, want
    times, out = _timed(load, repeat)
    print(json.dumps({"seconds": times, "bytes": _nbytes(out)}))


def run(args: argparse.Namespace) -> None:
    import torch

    import gpumapio

    rows: list[dict] = []

    def record(impl: str, times: list[float], nbytes: int, note: str = "") -> None:
        best = min(times)
        row = {
            "impl": impl,
            "bytes": nbytes,
            "runs": len(times),
            "best_s": best,
            "median_s": statistics.median(times),
            "gb_per_s": nbytes / best / 1e9,
            "median_gb_per_s": nbytes / statistics.median(times) / 1e9,
            "note": note,
        }
        rows.append(row)
        print(f"{impl:32s} {row['gb_per_s']:7.2f} GB/s best, {row['median_gb_per_s']:7.2f} median  {note}", flush=True)

    index = json.load(open(os.path.join(args.dir, "model.safetensors.index.json")))
    shards = [os.path.join(args.dir, s) for s in dict.fromkeys(index["weight_map"].values())]
    # Warm: every shard in the page cache before any case runs.
    for s in shards:
        with open(s, "rb") as f:
            while f.read(64 << 20):
                pass

    # The reference, and safetensors' rate.
    from safetensors.torch import load_file

    times, ref = _timed(lambda: {k: v for s in shards for k, v in load_file(s, device="cuda").items()}, args.repeat)
    total = _nbytes(ref)
    record("safetensors-load_file", times, total, f"{len(shards)} shards, one call each")

    if args.whole:
        size = os.path.getsize(args.whole)
        buf = torch.empty(size, dtype=torch.uint8, device="cuda")
        with gpumapio.CuFile(args.whole, "r") as f:
            times, _ = _timed(lambda: f.read(buf), args.repeat)
        record("gpumap-whole-file", times, size, "CuFile.read of the shards concatenated")
        del buf

    times, out = _timed(lambda: gpumapio.load_checkpoint(args.dir, "cuda"), args.repeat)
    _check("load_checkpoint", out, ref)
    record("load_checkpoint", times, total, "warm")
    del out

    per_shard = lambda: {k: v for s in shards for k, v in gpumapio.load_safetensors(s, "cuda").items()}  # noqa: E731
    times, _ = _timed(per_shard, args.repeat)
    record("load_safetensors-per-shard", times, total, "the old way: one call per shard")

    child = subprocess.run([sys.executable, __file__, "first-load", args.dir], capture_output=True, text=True)
    if child.returncode == 0:
        first = json.loads(child.stdout.strip().splitlines()[-1])
        record("load_checkpoint-first", [first["seconds"]], first["bytes"], "fresh process, CUDA context included")
        record("load_checkpoint-first-after-context", [first["after_context"]], first["bytes"],
               "the same load, timed from the CUDA context's existence")
    else:
        print(f"first-load failed: {child.stderr[-2000:]}", file=sys.stderr)

    tp = gpumapio.TensorParallel(0, 4, LLAMA_TP)
    times, out = _timed(lambda: gpumapio.load_checkpoint(args.dir, "cuda", tp=tp), args.repeat)
    for name in ("model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.up_proj.weight"):
        dim = tp.split_dim(name)
        part = ref[name].shape[dim] // 4
        assert torch.equal(out[name], ref[name].narrow(dim, 0, part)), name
    record("load_checkpoint-tp4", times, _nbytes(out), "rank 0 of 4, vLLM's Llama splits; bytes read")
    del out
    # The rank's load in its two halves: the tensors split along their rows (contiguous reads,
    # and those not split) and those split along their columns (a strided run per row).
    strided = lambda n: tp.split_dim(n) not in (None, 0)  # noqa: E731
    for part, keep in (("contiguous", lambda n: not strided(n)), ("strided", strided)):
        times, out = _timed(lambda: gpumapio.load_checkpoint(args.dir, "cuda", tp=tp, tensors=keep), args.repeat)
        record(f"load_checkpoint-tp4-{part}", times, _nbytes(out), f"rank 0 of 4, only the tensors read {part}")
        del out

    if args.small:
        small_shards = [os.path.join(args.small, f) for f in sorted(os.listdir(args.small)) if f.endswith(".safetensors")]
        for s in small_shards:
            with open(s, "rb") as f:
                while f.read(64 << 20):
                    pass
        small_ref = {k: v for s in small_shards for k, v in load_file(s, device="cuda").items()}
        times, out = _timed(lambda: gpumapio.load_checkpoint(args.small, "cuda"), args.repeat)
        _check("load_checkpoint-small", out, small_ref)
        record("load_checkpoint-small", times, _nbytes(out), f"{len(out)} tensors of 64 KiB")
        del out, small_ref

    if args.no_peers:
        print("--no-peers: transformers and the peers not measured")
    try:
        if args.no_peers:
            raise ImportError("--no-peers")
        import transformers
        from transformers import LlamaForCausalLM

        # transformers renamed torch_dtype to dtype; an older one ignores the new name.
        params = inspect.signature(LlamaForCausalLM.from_pretrained).parameters
        dtype_arg = {"dtype" if "dtype" in params else "torch_dtype": torch.bfloat16}

        def from_pretrained():
            try:
                return LlamaForCausalLM.from_pretrained(args.dir, device_map="cuda", **dtype_arg)
            except (ValueError, ImportError):  # device_map needs accelerate in some versions
                return LlamaForCausalLM.from_pretrained(args.dir, **dtype_arg).to("cuda")

        times, model = _timed(from_pretrained, 1)
        _check("from_pretrained", dict(model.state_dict()), ref)
        record("transformers-from_pretrained", times, total, f"transformers {transformers.__version__}")
        del model
    except ImportError as e:
        print(f"transformers: not measured ({e})")

    # Each peer is imported only in its own process: a build for another torch may crash there.
    for peer, configs in ({} if args.no_peers else PEER_CONFIGS).items():
        for config in configs:
            env = dict(os.environ, **config.get("env", {}))
            command = [sys.executable, __file__, "peer", peer, args.dir, "--config", json.dumps(config),
                       "--repeat", str(args.repeat)]
            child = subprocess.run(command, capture_output=True, text=True, env=env)
            last = child.stdout.strip().splitlines()[-1:] if child.returncode == 0 else []
            got = json.loads(last[0]) if last else None
            if got is not None and "missing" in got:
                print(f"{peer}: not installed here ({got['missing']}); not measured")
                rows.append({"impl": peer, "note": f"not installed: {got['missing']}"})
                break
            if got is None:
                print(f"{peer} {config}: failed (exit {child.returncode}): {child.stderr[-1500:]}", file=sys.stderr)
                rows.append({"impl": peer, "note": f"{json.dumps(config)}: failed, exit {child.returncode}"})
                continue
            record(peer, got["seconds"], got["bytes"], json.dumps(config))

    if args.cold:
        if not _drop():
            print("--cold: cannot write /proc/sys/vm/drop_caches (not root); skipped")
        else:
            if args.whole:
                buf = torch.empty(os.path.getsize(args.whole), dtype=torch.uint8, device="cuda")
                cold = []
                for _ in range(args.repeat):
                    _drop()
                    with gpumapio.CuFile(args.whole, "r") as f:
                        cold += _timed(lambda: f.read(buf), 1)[0]
                record("gpumap-whole-file-cold", cold, buf.numel(), "page cache dropped before each")
                del buf
            cold = []
            for _ in range(args.repeat):
                _drop()
                cold += _timed(lambda: gpumapio.load_checkpoint(args.dir, "cuda"), 1)[0]
            record("load_checkpoint-cold", cold, total, "page cache dropped before each")

    result = {"checkpoint": args.dir, "shards": len(shards), "bytes": total, "tensors": len(ref), "rows": rows,
              "device": torch.cuda.get_device_name(0), "gpumapio": gpumapio.__version__}
    lines = ["| loader | GB/s (best) | GB/s (median) | note |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['impl']} | {r['gb_per_s']:.1f} | {r['median_gb_per_s']:.1f} | {r['note']} |" if "gb_per_s" in r
              else f"| {r['impl']} | – | – | {r['note']} |" for r in rows]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make")
    p.add_argument("dir")
    p.add_argument("--gb", type=float, default=4.0)
    p.add_argument("--shards", type=int, default=4)
    p = sub.add_parser("make-small")
    p.add_argument("dir")
    p.add_argument("--tensors", type=int, default=10_000)
    p.add_argument("--shards", type=int, default=4)
    p = sub.add_parser("warm")
    p.add_argument("dir")
    p.add_argument("small")
    p.add_argument("--label", default="")
    p.add_argument("--round", type=int, default=0)
    p = sub.add_parser("first-load")
    p.add_argument("dir")
    p = sub.add_parser("peer")
    p.add_argument("name", choices=sorted(PEER_CONFIGS))
    p.add_argument("dir")
    p.add_argument("--config", default="{}")
    p.add_argument("--repeat", type=int, default=3)
    p = sub.add_parser("run")
    p.add_argument("dir")
    p.add_argument("--small")
    p.add_argument("--whole")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cold", action="store_true")
    p.add_argument("--no-peers", action="store_true", help="gpumap's own rows and safetensors' only")
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = parser.parse_args()
    if args.command == "make":
        make(args.dir, args.gb, args.shards)
    elif args.command == "make-small":
        make_small(args.dir, args.tensors, args.shards)
    elif args.command == "warm":
        warm(args.dir, args.small, args.label, args.round)
    elif args.command == "first-load":
        first_load(args.dir)
    elif args.command == "peer":
        peer(args.name, args.dir, json.loads(args.config), args.repeat)
    else:
        run(args)


if __name__ == "__main__":
    main()
