"""torch tensors over the bytes of one allocation, each a tensor of its own: its bytes are in the
allocation, but autograd sees no view relation to it or to any other tensor of the load. An
in-place change recorded by autograd on one of them then touches no other, as with tensors
loaded one allocation each; with plain views of one base it would make every other view
require grad. Made in bulk, thousands at a time: a run of tensors alike is cut from one view of
it by one ``unsafe_split_with_sizes`` (decision 0040)."""

from __future__ import annotations

import itertools
import math
from typing import Any

# torch's strides are signed 64-bit.
STRIDE_MAX = 2**63 - 1

# A shape's kind, for grouping tensors that can be cut from one view: the shape past its first
# extent (tensors of one dtype, back to back, sharing it, are rows of one view), or one of these.
_SCALAR = "scalar"  # no extent: one element, cut from a 1-D view and reshaped
_EMPTY = "empty"  # no element: no bytes to lie over


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """C-order strides of ``shape``; all 1 for a shape of no element whose strides would pass
    torch's (a shape of ``[0, 2**62, 4]`` is valid, and any strides reach its no element)."""
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    if step == 0 and strides and max(strides) > STRIDE_MAX:
        return (1,) * len(shape)
    return tuple(reversed(strides))


def own_tensor(typed: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Any:
    """The C-ordered tensor of ``shape`` (``strides`` its own) at element ``offset`` of the
    storage of the 1-D tensor ``typed`` (absolute, as ``as_strided`` takes it), a tensor of its
    own."""
    if not shape:
        return typed.as_strided((1,), (1,), offset).unsafe_split(1)[0].view(())
    if 0 in shape:
        return typed.new_empty(0).as_strided(shape, strides)
    return typed.as_strided(shape, strides, offset).unsafe_split(shape[0])[0]


def own_tensors(
    typed: dict[str, tuple[Any, int]], dtypes: list[str], shapes: list[tuple[int, ...]], starts: list[int], shift: int
) -> tuple[list[Any], list[int]]:
    """The tensors of a safetensors shard whose tensors tile its data section, in file order
    (``dtypes``, ``shapes`` and file offsets ``starts``), each a tensor of its own at its offset
    plus ``shift`` in the allocation, typed per dtype as ``typed[dtype] = (1-D tensor at the
    start of its storage, itemsize)``. Also the indices of those misaligned for their dtype,
    which cannot lie there (None in their place)."""
    if len(typed) == 1 and shapes and shapes.count(shapes[0]) == len(shapes):
        # The common case of a checkpoint of many small tensors: all alike, one cut.
        [(whole, size)] = typed.values()
        shape, at = shapes[0], starts[0] + shift
        if not at % size and _kind_of(shape) not in (_SCALAR, _EMPTY):
            run = whole.as_strided((len(shapes) * shape[0], *shape[1:]), contiguous_strides(shape), at // size)
            return list(run.unsafe_split_with_sizes([shape[0]] * len(shapes))), []
    kinds = {shape: _kind_of(shape) for shape in set(shapes)}
    kind_list = list(map(kinds.__getitem__, shapes))
    if len(typed) == 1:
        [dtype] = typed
        groups = ((dtype, kind, len(list(run))) for kind, run in itertools.groupby(kind_list))
    else:
        groups = ((d, kind, len(list(run))) for (d, kind), run in itertools.groupby(zip(dtypes, kind_list)))
    numels = {shape: math.prod(shape) for shape in kinds}
    strides = {shape: contiguous_strides(shape) for shape in kinds}
    tensors: list[Any] = []
    misaligned: list[int] = []
    # A span [mixed, k) of tensors of one dtype, each with elements, each alone of its kind
    # among its neighbours or a scalar: cut from one 1-D view of them and each reshaped.
    mixed: int | None = None
    mixed_dtype = None

    def flush(end: int) -> None:
        nonlocal mixed
        if mixed is None:
            return
        whole, size = typed[mixed_dtype]
        if end - mixed == 1:
            shape = shapes[mixed]
            tensors.append(own_tensor(whole, shape, strides[shape], (starts[mixed] + shift) // size))
            mixed = None
            return
        span = shapes[mixed:end]
        sizes = list(map(numels.__getitem__, span))
        pieces = whole.as_strided((sum(sizes),), (1,), (starts[mixed] + shift) // size).unsafe_split_with_sizes(sizes)
        if any(len(shape) != 1 for shape in set(span)):
            pieces = list(map(type(whole).as_strided, pieces, span, map(strides.__getitem__, span)))
        tensors.extend(pieces)
        mixed = None

    k = 0
    for dtype, kind, count in groups:
        whole, size = typed[dtype]
        at = starts[k] + shift
        if kind is not _EMPTY and mixed is not None and dtype == mixed_dtype and not at % size:
            if kind is _SCALAR or count == 1:
                k += count
                continue
        flush(k)
        if at % size:
            # Misaligned for its dtype (safetensors' writers never do this), and so is every
            # tensor after it in the group, each a whole number of elements.
            misaligned.extend(range(k, k + count))
            tensors.extend([None] * count)
        elif kind is _EMPTY:
            tensors.extend([own_tensor(whole, shape, strides[shape], 0) for shape in shapes[k : k + count]])
        elif kind is _SCALAR or count == 1:
            mixed, mixed_dtype = k, dtype
        else:
            firsts = [shape[0] for shape in shapes[k : k + count]]
            run = whole.as_strided((sum(firsts), *kind), contiguous_strides((1, *kind)), at // size)
            tensors.extend(run.unsafe_split_with_sizes(firsts))
        k += count
    flush(k)
    return tensors, misaligned


def _kind_of(shape: tuple[int, ...]) -> Any:
    if not shape:
        return _SCALAR
    if 0 in shape:
        return _EMPTY
    return shape[1:]
