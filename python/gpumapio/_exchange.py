"""Tensor-parallel loads whose ranks swap bytes instead of reading strided runs.

A rank's slice of a tensor split along an inner dimension (a row-parallel layer's weight, split
along its columns) is a run per row in the file: small reads, one system call each. Every rank
of the group reads such tensors at once, and together they read each one whole; so each rank
reads a contiguous block of its rows instead — the same number of bytes — and the ranks then
swap the parts of their blocks that belong to one another in one all-to-all: over NVLink, a
small cost beside the reads it spares.

The exchange is anything with ``rank``, ``world_size`` and ``all_to_all(dst, src)``: ``src``
and ``dst`` are flat byte arrays of one size, cut into ``world_size`` equal chunks, chunk ``q``
of ``src`` going to rank ``q`` and chunk ``p`` of ``dst`` coming from rank ``p``.
:class:`TorchExchange` is that over a ``torch.distributed`` process group (NCCL between GPUs).
"""

from __future__ import annotations

from typing import Any

__all__ = ["TorchExchange", "block_shape", "exchange_for"]


class TorchExchange:
    """The all-to-all of a ``torch.distributed`` process group (``None``: the default group)."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("exchange=: torch.distributed is not initialized (init_process_group first)")
        self.dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def all_to_all(self, dst: Any, src: Any) -> None:
        self.dist.all_to_all_single(dst, src, group=self.group)


def exchange_for(exchange: Any, tp: Any, framework: str) -> Any:
    """The exchange ``load_checkpoint(exchange=...)`` names, checked against ``tp``: ``None``
    (or ``False``) for none; ``True`` for the default ``torch.distributed`` group; a process
    group; or an object with ``rank``, ``world_size`` and ``all_to_all``."""
    if exchange is None or exchange is False:
        return None
    if tp is None:
        raise ValueError("exchange= swaps the bytes of tensor-parallel slices; it needs tp=")
    if hasattr(exchange, "all_to_all") and hasattr(exchange, "rank") and hasattr(exchange, "world_size"):
        found = exchange
    elif framework != "pt":
        raise TypeError(
            f"exchange={exchange!r}: with framework={framework!r}, an object with rank, world_size "
            "and all_to_all(dst, src) is expected (a process group is for framework='pt')"
        )
    elif exchange is True:
        found = TorchExchange(None)
    else:
        found = TorchExchange(exchange)
    if (found.rank, found.world_size) != (tp.rank, tp.world_size):
        raise ValueError(
            f"exchange=: the group's rank {found.rank} of {found.world_size} is not tp's "
            f"rank {tp.rank} of {tp.world_size}"
        )
    return found


def block_shape(shape: tuple[int, ...], itemsize: int, world_size: int) -> tuple[int, ...]:
    """The shape, in bytes along the last dimension, of one rank's block of rows of a tensor of
    ``shape`` (its first dimension divides by ``world_size``)."""
    out = list(shape)
    out[0] //= world_size
    out[-1] *= itemsize
    return tuple(out)
