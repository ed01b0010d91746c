"""The arithmetic of partial tensor reads, with no I/O: which bytes of a tensor a
tensor-parallel rank holds, and the coalescing of byte pieces into as few reads as possible.

A piece is ``(src, length, dst)``: ``length`` bytes at offset ``src`` of the source (a tensor
or a file) go to offset ``dst`` of the destination. Kept apart from the code that executes the
reads so that it can be tested on tables and generated cases alone.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

__all__ = ["Piece", "coalesce", "split_shape", "tensor_slice"]

Piece = tuple[int, int, int]


def split_shape(name: str, shape: Sequence[int], dim: int, world_size: int) -> tuple[int, tuple[int, ...]]:
    """The split dimension (negative ``dim`` counted from the end) and the shape of one rank's
    slice of a tensor of ``shape`` cut into ``world_size`` equal parts along ``dim``.

    Raises ``ValueError`` naming the tensor where ``dim`` is not one of its dimensions or its
    size there does not divide by ``world_size`` (as Megatron and vLLM require of the
    dimensions they split).
    """
    if world_size < 1:
        raise ValueError(f"world_size {world_size} is not a positive number of ranks")
    if not -len(shape) <= dim < len(shape):
        raise ValueError(f"tensor {name!r} of shape {tuple(shape)} has no dimension {dim} to split")
    dim %= len(shape)
    if shape[dim] % world_size:
        raise ValueError(
            f"tensor {name!r}: dimension {dim} of shape {tuple(shape)} ({shape[dim]}) does not "
            f"divide into {world_size} equal parts"
        )
    out = list(shape)
    out[dim] //= world_size
    return dim, tuple(out)


def tensor_slice(shape: Sequence[int], itemsize: int, dim: int, rank: int, world_size: int) -> list[Piece]:
    """The pieces of rank ``rank``'s slice of a C-ordered tensor split into ``world_size``
    equal parts along ``dim`` (already checked by :func:`split_shape`): offsets in the tensor's
    bytes, and in the slice's own C-ordered bytes. Coalesced; empty for an empty slice.

    A split of the first dimension (or of any dimension with only ones before it) is one
    contiguous piece; a split further in is one piece per index of the dimensions before it,
    at a stride of a whole row (the strided reads of a column split).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of 0..{world_size - 1}")
    outer = math.prod(shape[:dim])
    part = shape[dim] // world_size
    inner = math.prod(shape[dim + 1 :]) * itemsize
    length = part * inner
    if length == 0 or outer == 0:
        return []
    row = shape[dim] * inner
    first = rank * length
    if world_size == 1 or outer == 1:
        return [(first, length * outer, 0)] if world_size == 1 else [(first, length, 0)]
    return [(i * row + first, length, i * length) for i in range(outer)]


def coalesce(pieces: Iterable[Piece]) -> list[Piece]:
    """``pieces`` ordered by source, each run of pieces that follow one another both in the
    source and in the destination merged into one; empty pieces dropped. The bytes moved, and
    where each lands, are those of ``pieces``.
    """
    out: list[Piece] = []
    for src, length, dst in sorted(p for p in pieces if p[1] > 0):
        if out:
            last_src, last_len, last_dst = out[-1]
            if last_src + last_len == src and last_dst + last_len == dst:
                out[-1] = (last_src, last_len + length, last_dst)
                continue
        out.append((src, length, dst))
    return out
