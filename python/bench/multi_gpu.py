"""Several GPUs of one host at once, one process per GPU (``torch.distributed`` with NCCL), each
rank reading into its own GPU; the rates of all ranks together, in the shared JSON-lines format.

    python3 -m torch.distributed.run --standalone --nproc-per-node N python/bench/multi_gpu.py \\
        MODE PATH --jsonl OUT.jsonl [--repeat 5] [--row-size 512] [--batch 100000] [--batches 20]

Modes:

- ``tp DIR``: every rank loads its tensor-parallel slice of the checkpoint in ``DIR``
  (``gpumapio.load_checkpoint(DIR, "cuda:RANK", tp=TensorParallel(rank, N, vLLM's Llama
  splits))``), all ranks at once, the page cache warm; ``N = 1`` is the whole checkpoint on one
  GPU. ``--parts`` adds the load with ``exchange=True`` (column splits read as blocks of rows
  and swapped over NCCL; checked equal to the strided reads), and the tensors split along rows
  or along columns alone. Each rank's slice is checked against safetensors' own tensors (a sample of them, byte for
  byte), and the slices of two split tensors are summed across the ranks with an NCCL
  all-reduce and compared with the whole tensor's sum.
- ``whole FILE``: every rank reads the whole of ``FILE`` into its own GPU (``CuFile.read``) at
  once: concurrent readers of one file.
- ``rows FILE``: one ``DeviceCache`` per GPU: every rank maps the same table file on its own
  GPU (``gpumapio.map(FILE, device=RANK, budget=...)``, a budget of a quarter of the file each)
  and gathers its own random 512 B rows (``gather_rows``, batches of 100,000 int64 indices on
  its GPU), as data-parallel ranks of a GNN do; the cache's own path and the misses read in
  place (``zero_copy="misses"``), uniform and skewed rows, a first pass over a fresh cache and a
  pass after it; beside them the CuPy kernel over a host-registered mmap (``uva``), whose
  rate on every GPU at once is what the host gives rows read in place.

Timing: every rank waits at a barrier, then runs the case; each rank's start and end
(``time.monotonic``, one clock for the whole host) go to rank 0, which reports, per case:

- ``bytes`` / ``rows``: all ranks' together;
- ``seconds``: from the first rank's start to the last rank's end (the rate all ranks together
  deliver, ``gbps`` / ``rows_per_s``);
- ``sum_of_rank_rates``: each rank's bytes (rows) over its own time, added up;
- ``rank_rates``: each rank's own rate.

``tp`` and ``whole`` take the best of ``--repeat`` rounds (by ``seconds``) and give the median
too; ``rows`` reports the median batch's rate of each pass, as ``rows.py`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class Ranks:
    """This process's place among the ranks, and the collective steps the cases need."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(self.local)
        self.device = torch.device("cuda", self.local)
        dist.init_process_group("nccl", device_id=self.device)
        self.dist = dist
        self.torch = torch

    def barrier(self) -> None:
        self.dist.barrier()
        self.torch.cuda.synchronize()

    def gather(self, value):
        """``value`` of every rank, in rank order (on every rank)."""
        out = [None] * self.world
        self.dist.all_gather_object(out, value)
        return out

    def close(self) -> None:
        self.dist.destroy_process_group()


class Out:
    def __init__(self, path: str, ranks: Ranks, machine: dict) -> None:
        self.path = path
        self.ranks = ranks
        self.machine = machine

    def emit(self, record: dict) -> None:
        if self.ranks.rank != 0:
            return
        record = {**record, "ranks": self.ranks.world, **self.machine}
        line = json.dumps(record)
        print(line, flush=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")


def together(spans: list[tuple[float, float, int]]) -> dict:
    """All ranks' ``(start, end, amount)`` of one round: the amount over the time from the first
    start to the last end, and each rank's own rate."""
    start = min(s for s, _, _ in spans)
    end = max(e for _, e, _ in spans)
    amount = sum(a for _, _, a in spans)
    rates = [a / max(e - s, 1e-9) for s, e, a in spans]
    return {"amount": amount, "seconds": end - start, "rate": amount / max(end - start, 1e-9),
            "sum_of_rank_rates": sum(rates), "rank_rates": rates}


def rounds(ranks: Ranks, repeat: int, once) -> list[dict]:
    """``repeat`` rounds of ``once()`` (which returns the bytes it delivered) on every rank at
    once; each round as :func:`together` makes it."""
    out = []
    for _ in range(repeat):
        ranks.barrier()
        start = time.monotonic()
        amount = once()
        ranks.torch.cuda.synchronize()
        end = time.monotonic()
        out.append(together(ranks.gather((start, end, amount))))
    return out


def emit_rounds(out: Out, impl: str, workload: str, done: list[dict], **extra) -> None:
    best = min(done, key=lambda r: r["seconds"])
    out.emit({
        "impl": impl,
        "workload": workload,
        "bytes": best["amount"],
        "seconds": round(best["seconds"], 6),
        "gbps": round(best["rate"] / 1e9, 3),
        "median_gbps": round(statistics.median(r["rate"] for r in done) / 1e9, 3),
        "sum_of_rank_rates_gbps": round(best["sum_of_rank_rates"] / 1e9, 3),
        "rank_rates_gbps": [round(r / 1e9, 3) for r in best["rank_rates"]],
        "rounds": len(done),
        **extra,
    })


def tp(ranks: Ranks, out: Out, directory: str, repeat: int, part: str) -> None:
    import torch
    from safetensors import safe_open

    import gpumapio
    from checkpoint import LLAMA_TP

    plan = gpumapio.TensorParallel(ranks.rank, ranks.world, LLAMA_TP)
    device = f"cuda:{ranks.local}"
    nbytes = lambda tensors: sum(t.numel() * t.element_size() for t in tensors.values())  # noqa: E731

    # Checked once: a sample of this rank's slices against safetensors' own tensors.
    got = gpumapio.load_checkpoint(directory, device, tp=plan)
    index = json.load(open(os.path.join(directory, "model.safetensors.index.json")))
    names = [n for n in index["weight_map"] if n.startswith(("model.layers.0.", "model.layers.1."))]
    names += ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    for name in names:
        with safe_open(os.path.join(directory, index["weight_map"][name]), "pt", device="cpu") as f:
            whole = f.get_tensor(name)
        dim = plan.split_dim(name)
        want = whole if dim is None else whole.chunk(ranks.world, dim)[ranks.rank]
        if not torch.equal(got[name].cpu(), want):
            sys.exit(f"rank {ranks.rank}: {name} differs from safetensors' slice")
    # The slices tile the tensors: their sums, reduced across the ranks over NCCL, are the
    # whole tensors' sums.
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight"):
        summed = got[name].double().sum().reshape(1)
        ranks.dist.all_reduce(summed)
        with safe_open(os.path.join(directory, index["weight_map"][name]), "pt", device="cpu") as f:
            full = f.get_tensor(name).double().sum().item()
        if abs(summed.item() - full) > 1e-6 * max(1.0, abs(full)):
            sys.exit(f"{name}: the ranks' slices sum to {summed.item()}, the tensor to {full}")
    del got
    torch.cuda.empty_cache()

    # The rank's tensors split along their columns (a strided run per row) or not.
    strided = lambda n: plan.split_dim(n) not in (None, 0)  # noqa: E731
    if part == "exchange" and ranks.world == 1:
        return  # one rank has no one to swap with: its load is the "all" row
    keep = {"all": None, "exchange": None, "contiguous": lambda n: not strided(n), "strided": strided}[part]
    # "exchange": the column splits read as blocks of rows and swapped over NCCL.
    exchange = part == "exchange" and ranks.world > 1

    def once() -> int:
        loaded = gpumapio.load_checkpoint(directory, device, tp=plan, tensors=keep, exchange=exchange)
        return nbytes(loaded)

    if exchange:
        # Checked once: the swapped slices equal the strided reads' on every rank.
        swapped, strided_reads = once_loaded(gpumapio, directory, device, plan)
        for name, want in strided_reads.items():
            if not torch.equal(swapped[name], want):
                sys.exit(f"rank {ranks.rank}: {name} swapped differs from its strided read")
        del swapped, strided_reads

    done = rounds(ranks, repeat, once)
    suffix = "" if part == "all" else f"_{part}"
    emit_rounds(out, "gpumap-load_checkpoint-tp", f"tp{ranks.world}_warm{suffix}", done,
                note=f"each rank its slice (vLLM's Llama splits) of {directory}, all at once"
                + {"all": "", "exchange": "; column splits read as blocks of rows, swapped over NCCL"}.get(
                    part, f"; only the tensors read {part}"))


def once_loaded(gpumapio, directory: str, device: str, plan) -> tuple[dict, dict]:
    """The rank's slices loaded with the exchange and without it."""
    return (gpumapio.load_checkpoint(directory, device, tp=plan, exchange=True),
            gpumapio.load_checkpoint(directory, device, tp=plan))


def whole(ranks: Ranks, out: Out, path: str, repeat: int) -> None:
    import torch

    import gpumapio

    size = os.path.getsize(path)
    buf = torch.empty(size, dtype=torch.uint8, device=ranks.device)
    with gpumapio.CuFile(path, "r") as f:
        f.read(buf)  # the first read pays for the pool and its pinned buffers

        def once() -> int:
            return f.read(buf)

        done = rounds(ranks, repeat, once)
    # A sample of the bytes checked against the file.
    with open(path, "rb") as f:
        for at in range(0, size - 4096, max(size // 64, 4096)):
            f.seek(at)
            if f.read(4096) != bytes(buf[at:at + 4096].cpu().numpy()):
                sys.exit(f"rank {ranks.rank}: bytes at {at} differ from the file")
    emit_rounds(out, "gpumap-filehandle", "seq_read_warm_concurrent", done,
                note="each rank the whole file into its own GPU, all at once")


class UvaPeer:
    """The 20-line kernel people write (``rows.py``'s ``cupy-uva-kernel``): the file mapped,
    ``cudaHostRegister``-ed read-only, one warp per row reading host memory over PCIe. On
    every GPU at once it measures what the host gives random rows read in place: the bound of
    the misses read in place."""

    def __init__(self, cp, path: str, row_size: int) -> None:
        import mmap

        import numpy as np

        from rows import UVA_KERNEL

        self.cp, self.np = cp, np
        self.size = os.path.getsize(path)
        self.rows = self.size // row_size
        self.words = row_size // 8
        self.fd = os.open(path, os.O_RDONLY)
        self.region = mmap.mmap(self.fd, self.size, prot=mmap.PROT_READ)
        self.ptr = np.frombuffer(self.region, dtype=np.uint8).ctypes.data
        # cudaHostRegisterMapped | cudaHostRegisterReadOnly; the kernel uses the host address
        # itself (cudaDevAttrCanUseHostPointerForRegisteredMem on every current GPU on Linux).
        cp.cuda.runtime.hostRegister(self.ptr, self.size, 2 | 8)
        if not cp.cuda.runtime.deviceGetAttribute(91, cp.cuda.Device().id):
            sys.exit("cupy-uva-kernel: this GPU cannot use the host address of registered memory")
        self.kernel = cp.RawKernel(UVA_KERNEL, "gather")
        self.bad = cp.zeros(1, dtype=cp.int32)

    def gather(self, idx, dst, stream) -> None:
        count = idx.shape[0]
        threads = 256
        blocks = (count * 32 + threads - 1) // threads
        with stream:
            self.kernel((blocks,), (threads,),
                        (self.ptr, self.rows, idx, count, dst, self.np.int32(self.words), self.bad))

    def close(self) -> None:
        self.cp.cuda.runtime.hostUnregister(self.ptr)
        self.region.close()
        os.close(self.fd)


def rows(ranks: Ranks, out: Out, path: str, args: argparse.Namespace) -> None:
    import cupy as cp
    import numpy as np

    import gpumapio
    from rows import check, index_batches

    cp.cuda.Device(ranks.local).use()
    size = os.path.getsize(path)
    count = size // args.row_size
    budget = max(size // 4 // (64 << 20), 1) * (64 << 20)
    cases = {"gpumap": ("gpumap-rows", False), "in-place": ("gpumap-rows-misses-in-place", "misses"),
             "uva": ("cupy-uva-kernel", None)}
    for which in args.only.split(","):
        impl, mode = cases[which]
        peer = UvaPeer(cp, path, args.row_size) if which == "uva" else None
        for k, workload in enumerate(("uniform", "skewed")):
            # Each rank its own indices, as data-parallel ranks draw their own mini-batches.
            host = index_batches(count, args.batch, args.batches, workload == "skewed", seed=1000 * k + ranks.rank)
            batches = [cp.asarray(b) for b in host]
            dst = cp.empty((args.batch, args.row_size), dtype=cp.uint8)
            stream = cp.cuda.Stream(non_blocking=True)
            if peer is None:
                m = gpumapio.map(path, budget=budget, extent_size=4096, zero_copy=mode, device=ranks.local)
                gather = lambda b: m.gather_rows(b, args.row_size, dst, stream=stream)  # noqa: E731
            else:
                gather = lambda b: peer.gather(b, dst, stream)  # noqa: E731
            for phase in ("first", "hot"):
                ranks.barrier()
                times = []
                start = time.monotonic()
                for b in batches:
                    t = time.monotonic()
                    gather(b)
                    stream.synchronize()
                    times.append(time.monotonic() - t)
                end = time.monotonic()
                check(path, args.row_size, host[-1], cp.asnumpy(dst))
                median = float(np.median(times))
                spans = ranks.gather((start, end, args.batch * len(batches), args.batch / median))
                if ranks.rank == 0:
                    t = together([(s, e, a) for s, e, a, _ in spans])
                    medians = [r for *_, r in spans]
                    out.emit({
                        "impl": impl,
                        "workload": f"{workload}_{phase}",
                        "rows": t["amount"],
                        "row_size": args.row_size,
                        "seconds": round(t["seconds"], 6),
                        "rows_per_s": round(t["rate"], 1),
                        "sum_of_rank_rates": round(t["sum_of_rank_rates"], 1),
                        "rank_rates": [round(r, 1) for r in t["rank_rates"]],
                        "sum_of_rank_median_batch_rates": round(sum(medians), 1),
                        "budget_per_rank": budget if peer is None else None,
                    })
            if peer is None:
                m.close()
            del batches, dst
        if peer is not None:
            peer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("tp", "whole", "rows"))
    ap.add_argument("path")
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--row-size", type=int, default=512)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--parts", default="all", help="tp: all, exchange, contiguous, strided (comma-separated)")
    ap.add_argument("--only", default="gpumap,in-place,uva", help="rows: gpumap, in-place, uva")
    args = ap.parse_args()
    ranks = Ranks()
    import torch

    machine = {"gpu": torch.cuda.get_device_name(ranks.local), "cpus": os.cpu_count()}
    out = Out(args.jsonl, ranks, machine)
    if args.mode == "tp":
        for part in args.parts.split(","):
            tp(ranks, out, args.path, args.repeat, part)
    elif args.mode == "whole":
        whole(ranks, out, args.path, args.repeat)
    else:
        rows(ranks, out, args.path, args)
    ranks.barrier()
    ranks.close()


if __name__ == "__main__":
    main()
