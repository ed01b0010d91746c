#!/usr/bin/env python3
"""GraphSAGE trained on a graph whose node features live in a file larger than the GPU memory
given to them: gpumapio.pyg.MappedFeatureStore serves each mini-batch's rows out of gpumap's
GPU page cache, faulting in from the file what is not there, to torch_geometric's loader.

    python python/examples/pyg_train.py --quick       # 256 MiB of features, 20 steps (< 1 min)
    python python/examples/pyg_train.py               # 2 GiB of 512-byte rows, cache of 512 MiB
    python python/examples/pyg_train.py --size 16GiB --budget 2GiB --steps 200 --dir /nvme/tmp

It writes a synthetic graph's features (float32 rows, labels from them) and labels to files in
a temporary directory (``--dir``; removed at the end unless ``--keep``), builds a random graph
with torch in an in-memory GraphStore, and trains for ``--steps`` mini-batches, printing how
fast the store fetched rows. Needs torch, torch_geometric and gpumapio; no network. Without a
GPU it runs on host memory (slowly). torch_geometric's NeighborLoader draws the mini-batches,
sampling with pyg-lib or torch-sparse where one is installed and with
gpumapio.pyg.PlainTorchNeighborSampler otherwise (``--sampler`` chooses; it prints which).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
import torch_geometric.typing as pyg_typing
from torch_geometric.data import EdgeAttr, GraphStore
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn import GraphSAGE
from torch_geometric.sampler import NeighborSampler

import gpumapio
from gpumapio.pyg import MappedFeatureStore, PlainTorchNeighborSampler, neighbor_sampler

GIB = 1 << 30
MIB = 1 << 20


def parse_size(text: str) -> int:
    """``"2GiB"``, ``"256MiB"``, ``"64KiB"`` or a number of bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2GiB, 256MiB, 1048576)")
    unit = (m.group(2) or "").upper()[:1]
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": MIB, "G": GIB, "T": 1 << 40}[unit])


class InMemoryGraphStore(GraphStore):
    """Edge indices held in memory, keyed by their EdgeAttr (torch_geometric converts layouts)."""

    def __init__(self) -> None:
        super().__init__()
        self.edges: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    @staticmethod
    def key(attr: EdgeAttr) -> tuple:
        return (attr.edge_type, attr.layout.value, attr.is_sorted, attr.size)

    def _put_edge_index(self, edge_index, edge_attr: EdgeAttr) -> bool:
        self.edges[self.key(edge_attr)] = edge_index
        return True

    def _get_edge_index(self, edge_attr: EdgeAttr):
        return self.edges.get(self.key(edge_attr))

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        return self.edges.pop(self.key(edge_attr), None) is not None

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        return [EdgeAttr(*key) for key in self.edges]


def write_features(directory: str, nodes: int, dim: int, classes: int, seed: int) -> tuple[str, str]:
    """``x.bin``: ``nodes`` rows of ``dim`` float32 (standard normal); ``y.bin``: int64 labels,
    the argmax of each row's first ``classes`` values (learnable from the node alone)."""
    rng = np.random.default_rng(seed)
    x_path, y_path = os.path.join(directory, "x.bin"), os.path.join(directory, "y.bin")
    chunk = max(1, (64 * MIB) // (dim * 4))
    with open(x_path, "wb") as fx, open(y_path, "wb") as fy:
        for first in range(0, nodes, chunk):
            x = rng.standard_normal((min(chunk, nodes - first), dim), dtype=np.float32)
            fx.write(x.data)
            fy.write(x[:, :classes].argmax(axis=1).astype(np.int64).data)
    return x_path, y_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=2 * GIB, help="bytes of node features (default 2GiB)")
    parser.add_argument("--row-bytes", type=int, default=512, help="bytes per node: float32 features (default 512)")
    parser.add_argument("--budget", type=parse_size, help="GPU memory of the page cache (default: size/4)")
    parser.add_argument("--degree", type=int, default=10, help="average in-degree of the random graph")
    parser.add_argument("--fanout", default="10,5", help="neighbours sampled per hop (default 10,5)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--sampler", choices=["auto", "pyg", "plain"], default="auto",
                        help="NeighborLoader's sampler: pyg: torch_geometric's (needs pyg-lib or "
                             "torch-sparse); plain: gpumapio.pyg.PlainTorchNeighborSampler (needs "
                             "neither); auto: torch_geometric's where it can sample, else plain")
    parser.add_argument("--dir", help="where to write the feature files (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the files")
    parser.add_argument("--quick", action="store_true", help="256MiB of features, 20 steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.size, args.steps = 256 * MIB, 20
    if args.row_bytes % 4 or args.row_bytes < 4 * args.classes:
        parser.error(f"--row-bytes must be a multiple of 4 holding at least --classes ({args.classes}) floats")
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be at least 1")
    fanout = [int(k) for k in args.fanout.split(",")]
    dim = args.row_bytes // 4
    nodes = args.size // args.row_bytes
    budget = args.budget or max(64 * MIB, args.size // 4)
    on_gpu = torch.cuda.is_available() and gpumapio.gpu_count() > 0
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    torch.manual_seed(args.seed)
    print(f"gpumapio {gpumapio.__version__}, torch {torch.__version__}, "
          f"torch_geometric {__import__('torch_geometric').__version__}, device {device}")

    made_dir = args.dir is None
    directory = tempfile.mkdtemp(prefix="gpumap-pyg-") if made_dir else args.dir
    os.makedirs(directory, exist_ok=True)
    store = None
    try:
        began = time.perf_counter()
        x_path, y_path = write_features(directory, nodes, dim, args.classes, args.seed)
        took = time.perf_counter() - began
        print(f"features: {nodes:,} nodes x {dim} float32 = {nodes * args.row_bytes / GIB:.2f} GiB "
              f"in {x_path} (written in {took:.1f} s); page cache budget {budget / MIB:.0f} MiB")

        # A random graph, kept as CSC (destination-sorted): the layout samplers read.
        began = time.perf_counter()
        edges = nodes * args.degree
        row = torch.randint(0, nodes, (edges,))
        col = torch.randint(0, nodes, (edges,)).sort().values
        colptr = torch.zeros(nodes + 1, dtype=torch.long)
        colptr[1:] = torch.bincount(col, minlength=nodes).cumsum(0)
        del col
        graph_store = InMemoryGraphStore()
        graph_store.put_edge_index((row, colptr), edge_type=None, layout="csc", size=(nodes, nodes))
        print(f"graph: {edges:,} random edges (built in {time.perf_counter() - began:.1f} s)")

        # The feature store: both tables in one cache of `budget` bytes, 4 KiB extents.
        cache = gpumapio.DeviceCache(budget, extent_size=4096, device=0 if on_gpu else "host")
        store = MappedFeatureStore(cache=cache, device=0 if on_gpu else "host")
        store.add_table(x_path, attr_name="x", dtype="float32", row_shape=(dim,))
        store.add_table(y_path, attr_name="y", dtype="int64", row_shape=())

        seeds = torch.randperm(nodes)[: args.steps * args.batch_size]
        # NeighborLoader over the two stores; its sampler reads the graph store's CSC.
        data = (store, graph_store)
        if args.sampler == "pyg":
            sampler = NeighborSampler(data, num_neighbors=fanout)
        elif args.sampler == "plain":
            sampler = PlainTorchNeighborSampler(data, num_neighbors=fanout)
        else:
            sampler = neighbor_sampler(data, num_neighbors=fanout)
        loader = NeighborLoader(data, num_neighbors=fanout, input_nodes=seeds, batch_size=args.batch_size,
                                neighbor_sampler=sampler)
        if isinstance(sampler, PlainTorchNeighborSampler):
            how = "gpumapio.pyg.PlainTorchNeighborSampler (NumPy on the CPU"
            how += ")" if args.sampler == "plain" else "; neither pyg-lib nor torch-sparse imports)"
        else:
            how = f"torch_geometric's NeighborSampler ({'pyg-lib' if pyg_typing.WITH_PYG_LIB else 'torch-sparse'})"
        print(f"loader: NeighborLoader, fanout {fanout}, sampler: {how}")

        model = GraphSAGE(dim, hidden_channels=128, num_layers=len(fanout), out_channels=args.classes).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.005)
        began = time.perf_counter()
        nodes_seen = 0
        for step, batch in enumerate(loader, 1):
            size = batch.batch_size
            out = model(batch.x.to(device), batch.edge_index.to(device))[:size]
            y = batch.y[:size].to(device)
            loss = F.cross_entropy(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            nodes_seen += batch.num_nodes
            if step == 1 or step % max(1, args.steps // 10) == 0 or step == args.steps:
                accuracy = (out.argmax(1) == y).float().mean().item()
                print(f"step {step:4d}: loss {loss.item():.3f}, accuracy {accuracy:.2f}, {batch.num_nodes:,} nodes")
        if on_gpu:
            torch.cuda.synchronize()
        wall = time.perf_counter() - began

        s = store.stats
        totals = cache.stats()["totals"]
        print(f"training: {step} steps in {wall:.1f} s ({step / wall:.1f} steps/s, {nodes_seen:,} sampled nodes)")
        print(f"feature fetches: {int(s['rows']):,} rows in {int(s['calls'])} gathers, {s['seconds']:.2f} s: "
              f"{s['rows'] / s['seconds']:,.0f} rows/s, {s['bytes'] / s['seconds'] / 1e9:.2f} GB/s "
              f"({s['seconds'] / wall:.0%} of the training time)")
        print(f"page cache: {totals['hits']:,} hits, {totals['misses']:,} misses, "
              f"{totals['bytes_faulted'] / MIB:,.0f} MiB faulted in, {totals['evictions']:,} evictions, "
              f"{totals['resident_bytes'] / MIB:,.0f} MiB resident of {budget / MIB:.0f}")
    finally:
        if store is not None:
            store.close()
        if made_dir and not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
        elif args.keep:
            print(f"kept {directory}")


if __name__ == "__main__":
    main()
