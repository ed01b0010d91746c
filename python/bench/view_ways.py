"""Issue 24: what one torch tensor costs, made each of the ways a loader could make 10,000
tensors over one CUDA allocation: ``as_strided`` (what ``load_checkpoint`` called until
decision 0040), indexing a ``(N, *shape)`` view (single-output views, as ``as_strided``'s are),
``unbind`` and ``split_with_sizes`` (multi-output views, which torch refuses to modify in place
beside autograd: decision 0019), and what ``load_checkpoint`` calls now (0040): tensors of
their own cut by ``own_tensors`` from one view of a run of tensors alike, and from a 1-D view
where the shapes alternate. Best and median of 20 rounds, per tensor, two passes.

    python3 python/bench/view_ways.py [--device cuda]
"""

from __future__ import annotations

import argparse
import time

import torch

from gpumapio._torch_tensors import own_tensors

COUNT = 10_000
SHAPE = (128, 256)  # 64 KiB of bf16, as the bench's small-tensor checkpoint


def per_view(make, rounds: int = 20) -> str:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        make()
        times.append(time.perf_counter() - start)
    times.sort()
    return f"best {times[0] / COUNT * 1e6:.3f} median {times[rounds // 2] / COUNT * 1e6:.3f} us/tensor"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    device = parser.parse_args().device
    elements = SHAPE[0] * SHAPE[1]
    typed = torch.empty(COUNT * elements * 2, dtype=torch.uint8, device=device).view(torch.bfloat16)
    stacked = typed.view(COUNT, *SHAPE)
    shapes, strides = [SHAPE] * COUNT, [(SHAPE[1], 1)] * COUNT
    offsets = [i * elements for i in range(COUNT)]
    starts = [2 * at for at in offsets]
    alternating = [SHAPE if i % 2 else SHAPE[::-1] for i in range(COUNT)]
    one_dtype = {"BF16": (typed, 2)}
    ways = {
        "as_strided (map)": lambda: list(map(typed.as_strided, shapes, strides, offsets)),
        "getitem of a (N, *shape) view (map)": lambda: list(map(stacked.__getitem__, range(COUNT))),
        "unbind": lambda: stacked.unbind(0),
        "split_with_sizes": lambda: typed.split_with_sizes([elements] * COUNT),
        "own_tensors, one shape (load_checkpoint)": lambda: own_tensors(one_dtype, ["BF16"] * COUNT, shapes, starts, 0),
        "own_tensors, two shapes alternating": lambda: own_tensors(one_dtype, ["BF16"] * COUNT, alternating, starts, 0),
    }
    for _ in range(2):
        for name, make in ways.items():
            print(name, per_view(make), flush=True)


if __name__ == "__main__":
    main()
