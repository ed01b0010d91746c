"""The arithmetic of partial tensor reads, with no I/O: which bytes of a tensor a
tensor-parallel rank holds, the coalescing of byte pieces into as few reads as possible, and
their cutting into staging windows for casts on the device.

A piece is a :class:`Run`: ``repeat`` runs of ``length`` bytes, the ``k``-th at
``src + k * stride`` of the source (a tensor or a file), landing back to back from ``dst`` in
the destination. A slice along an inner dimension is one strided piece, not one piece per row,
so that planning a load costs the same whatever the tensors' shapes. Kept apart from the code
that executes the reads so that it can be tested on tables and generated cases alone.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, NamedTuple, Sequence

__all__ = ["Cast", "Run", "coalesce", "fit_window", "merge_casts", "split_shape", "tensor_slice"]

# A cast of staged bytes into the output: (staging offset, bytes, output offset, output bytes,
# source element type).
Cast = tuple[int, int, int, int, Any]


class Run(NamedTuple):
    """``repeat`` runs of ``length`` bytes from ``src`` every ``stride`` bytes, to ``dst`` and
    on, back to back."""

    src: int
    length: int
    dst: int
    repeat: int = 1
    stride: int = 0

    @property
    def nbytes(self) -> int:
        return self.length * self.repeat


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


def tensor_slice(shape: Sequence[int], itemsize: int, dim: int, rank: int, world_size: int) -> list[Run]:
    """The pieces of rank ``rank``'s slice of a C-ordered tensor split into ``world_size``
    equal parts along ``dim`` (already checked by :func:`split_shape`): offsets in the tensor's
    bytes, and in the slice's own C-ordered bytes. Coalesced; empty for an empty slice.

    A split of the first dimension (or of any dimension with only ones before it) is one
    contiguous piece; a split further in is one strided piece, a run per index of the
    dimensions before it, a whole row apart (the strided reads of a column split).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of 0..{world_size - 1}")
    outer = math.prod(shape[:dim])
    length = shape[dim] // world_size * math.prod(shape[dim + 1 :]) * itemsize
    if length == 0 or outer == 0:
        return []
    # One piece: coalescing it is putting it in its canonical form.
    return [_normal(Run(rank * length, length, 0, outer, length * world_size))]


def _normal(piece: Run) -> Run:
    """The piece in its one canonical form: runs that touch as one run, a single run with no
    stride."""
    src, length, dst, repeat, stride = piece
    if repeat == 1 or stride == length:
        return Run(src, length * repeat, dst)
    return Run(src, length, dst, repeat, stride)


def coalesce(pieces: Iterable[Run | tuple[int, ...]]) -> list[Run]:
    """``pieces`` ordered by source, each run of single pieces that follow one another both in
    the source and in the destination merged into one; strided pieces whose runs touch become
    single ones; empty pieces dropped. The bytes moved, and where each lands, are those of
    ``pieces``.
    """
    out: list[Run] = []
    runs = (Run(*p) for p in pieces)
    for piece in sorted(_normal(r) for r in runs if r.nbytes > 0):
        if out and out[-1].repeat == 1 and piece.repeat == 1:
            last = out[-1]
            if last.src + last.length == piece.src and last.dst + last.length == piece.dst:
                out[-1] = Run(last.src, last.length + piece.length, last.dst)
                continue
        out.append(piece)
    return out


def fit_window(piece: Run, window: int) -> list[Run]:
    """``piece`` cut into pieces of at most ``window`` bytes (a multiple of every itemsize),
    ``dst`` kept as the offset in the tensor's slice: whole runs together where a run fits,
    else each run in window-sized parts; none for a piece of no bytes."""
    if piece.nbytes == 0:
        return []
    if piece.repeat == 1:
        return [Run(piece.src + at, min(window, piece.length - at), piece.dst + at) for at in range(0, piece.length, window)]
    if piece.length <= window:
        per = window // piece.length
        return [
            Run(piece.src + k * piece.stride, piece.length, piece.dst + k * piece.length, min(per, piece.repeat - k), piece.stride)
            for k in range(0, piece.repeat, per)
        ]
    return [
        part
        for k in range(piece.repeat)
        for part in fit_window(Run(piece.src + k * piece.stride, piece.length, piece.dst + k * piece.length), window)
    ]


def merge_casts(casts: list[Cast]) -> list[Cast]:
    """Casts that follow one another in staging and in the output, of one source dtype, as one
    (the strided pieces of a column split land back to back in both)."""
    merged: list[Cast] = []
    for src, n, dst, out_n, element in casts:
        if merged:
            ps, pn, pd, pon, pe = merged[-1]
            if pe == element and ps + pn == src and pd + pon == dst:
                merged[-1] = (ps, pn + n, pd, pon + out_n, pe)
                continue
        merged.append((src, n, dst, out_n, element))
    return merged
