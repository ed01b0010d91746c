#!/usr/bin/env python3
"""A transformers Llama-like model loaded two ways — gpumapio.load_into_model and transformers'
own from_pretrained — in the same run, with one forward pass checked equal.

    python python/examples/load_llama.py                   # a small model, in shards of 8 MB
    python python/examples/load_llama.py --layers 8 --hidden 1024 --shard-size 200MB

No network: the model is built from a config with random weights (seeded) and written with
save_pretrained into a temporary directory, as a sharded checkpoint with its
model.safetensors.index.json. On the GPU where there is one (host memory otherwise). Needs
torch, transformers and gpumapio.
"""

from __future__ import annotations

import argparse
import inspect
import tempfile
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

import gpumapio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--shard-size", default="8MB", help="save_pretrained's max_shard_size")
    parser.add_argument("--dir", default=None, help="where the temporary checkpoint goes")
    args = parser.parse_args()

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    config = LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3 // 8 * 8,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=args.vocab,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        attn_implementation="eager",  # the same kernels on both sides
    )
    torch.manual_seed(20261124)
    source = LlamaForCausalLM(config).to(torch.bfloat16)
    # transformers renamed from_pretrained's torch_dtype to dtype; pass what this one takes.
    dtype_arg = "dtype" if "dtype" in inspect.signature(LlamaForCausalLM.from_pretrained).parameters else "torch_dtype"
    with tempfile.TemporaryDirectory(prefix="gpumap-llama-", dir=args.dir) as tmp:
        source.save_pretrained(tmp, max_shard_size=args.shard_size)
        del source

        started = time.perf_counter()
        reference = LlamaForCausalLM.from_pretrained(tmp, attn_implementation="eager", **{dtype_arg: torch.bfloat16})
        reference = reference.to(device).eval()
        took_reference = time.perf_counter() - started

        started = time.perf_counter()
        # Built under bf16 as the default dtype, as from_pretrained builds it, so that the
        # buffers the checkpoint does not hold are made alike.
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with gpumapio.empty_weights():
                model = LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(default)
        gpumapio.load_into_model(model, tmp, device)
        model = model.to(device).eval()  # the buffers computed at build time (rotary inv_freq)
        if device.type == "cuda":
            torch.cuda.synchronize()
        took_gpumap = time.perf_counter() - started

    theirs, ours = reference.state_dict(), model.state_dict()
    assert theirs.keys() == ours.keys(), sorted(set(theirs) ^ set(ours))
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name
    # Buffers no checkpoint holds (rotary inv_freq) are computed by each model as it is built;
    # told apart here, so that a difference there is not taken for one in loading.
    built = dict(model.named_buffers())
    for name, tensor in reference.named_buffers():
        assert name in built and torch.equal(built[name], tensor), f"buffer {name} was built differently"
    ids = torch.randint(0, args.vocab, (2, 64), device=device, generator=torch.Generator(device).manual_seed(1))
    with torch.no_grad():
        want = reference(ids).logits
        got = model(ids).logits
    assert torch.equal(got, want), f"logits differ by up to {(got.float() - want.float()).abs().max().item()}"
    size = sum(t.numel() * t.element_size() for t in ours.values())
    print(
        f"transformers {transformers.__version__}, {device}: {len(ours)} tensors, {size / 1e6:.1f} MB; "
        f"from_pretrained {took_reference:.2f} s, gpumapio.load_into_model {took_gpumap:.2f} s; "
        f"one forward pass equal ({tuple(got.shape)} logits)"
    )


if __name__ == "__main__":
    main()
