"""Issue 24: where a warm whole ``load_checkpoint`` spends its time, step by step, and how fast
its reads run alone. For each checkpoint: 3 loads, then ``--loads`` timed ones with
``gpumapio.checkpoint``'s steps wrapped (each step's mean per load; steps nest, so they do not
add up: ``own_tensors`` is inside ``_whole_views_of``, the reads' ``wait`` is after the Python
work); then the reads alone — the shards' data sections read into one allocation as the load
reads them, with no header parsed and no tensor made — as GB/s, best and median. Each load's
tensors are freed before the next is timed.

    python3 python/bench/checkpoint_phases.py DIR [DIR ...] [--loads 20] [--device cuda]

The tables of docs/benchmarks.md ("where a load of many small tensors goes") come from this,
on the checkpoints ``checkpoint.sh`` makes.
"""

from __future__ import annotations

import argparse
import collections
import functools
import statistics
import time
from typing import Any, Callable

import torch

import gpumapio
import gpumapio.checkpoint as ck
from gpumapio._checkpoint_files import list_shards
from gpumapio._sources import open_source

# The steps timed, by their name in gpumapio.checkpoint.
STEPS = ("list_shards", "read_catalogue", "_whole_views_of", "own_tensors", "_made_while_reading", "start_read_files")


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def _wrapped(spent: dict[str, float]) -> None:
    """Every step of STEPS in gpumapio.checkpoint timed into ``spent``; the reads' wait too."""

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start

        return run

    for name in STEPS:
        setattr(ck, name, timed(name, getattr(ck, name)))
    started = ck.start_read_files

    class Waited:
        def __init__(self, pending: Any) -> None:
            self.pending = pending

        def cancel(self) -> None:
            self.pending.cancel()

        def wait(self) -> Any:
            start = time.perf_counter()
            try:
                return self.pending.wait()
            finally:
                spent["wait (after the Python work)"] += time.perf_counter() - start

    ck.start_read_files = lambda *args: Waited(started(*args))


def _reads_alone(directory: str, device: str) -> Callable[[], None]:
    """The load's reads of ``directory`` (its shards' data sections into one allocation)."""
    paths = list_shards(directory).paths
    framework = ck._Framework("pt", device, None)

    def read() -> None:
        files = [open_source(p) for p in paths]
        try:
            _, reads, size = ck._whole_layout([ck._data_span(f) for f in files])
            flat = framework.empty(size)
            ck._read(flat, ck._Open(files, paths, [None] * len(files)), reads)
        finally:
            for f in files:
                f.close()

    return read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--loads", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    spent: dict[str, float] = collections.defaultdict(float)
    _wrapped(spent)
    for directory in args.dirs:
        load = functools.partial(gpumapio.load_checkpoint, directory, args.device)
        nbytes = sum(t.numel() * t.element_size() for t in load().values())
        for _ in range(3):
            load()
        spent.clear()
        times = []
        for _ in range(args.loads):
            _sync(args.device)
            start = time.perf_counter()
            out = load()
            _sync(args.device)
            times.append(time.perf_counter() - start)
            del out
        best, median = min(times), statistics.median(times)
        print(f"{directory}: {nbytes / 1e6:.0f} MB, best {best * 1e3:.1f} ms median {median * 1e3:.1f} ms "
              f"({nbytes / best / 1e9:.1f} / {nbytes / median / 1e9:.1f} GB/s)")
        for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
            print(f"   {name:30s} {seconds / args.loads * 1e3:7.2f} ms")
        read = _reads_alone(directory, args.device)
        for _ in range(2):
            read()
        alone = []
        for _ in range(args.loads):
            _sync(args.device)
            start = time.perf_counter()
            read()
            _sync(args.device)
            alone.append(time.perf_counter() - start)
        print(f"   reads alone: {nbytes / min(alone) / 1e9:.1f} / {nbytes / statistics.median(alone) / 1e9:.1f} GB/s",
              flush=True)


if __name__ == "__main__":
    main()
