"""The slicing and coalescing arithmetic of partial tensor reads (gpumapio._pieces): tables of
known cases, then generated ones checked against NumPy's own slicing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumapio._pieces import coalesce, split_shape, tensor_slice


@pytest.mark.parametrize(
    "pieces, want",
    [
        ([], []),
        ([(0, 0, 0)], []),
        ([(0, 4, 0), (4, 4, 4)], [(0, 8, 0)]),
        ([(4, 4, 4), (0, 4, 0)], [(0, 8, 0)]),  # any order in
        ([(0, 4, 0), (4, 4, 8)], [(0, 4, 0), (4, 4, 8)]),  # touching in the file only
        ([(0, 4, 0), (8, 4, 4)], [(0, 4, 0), (8, 4, 4)]),  # touching in memory only
        ([(0, 4, 0), (4, 0, 4), (4, 4, 4)], [(0, 8, 0)]),  # an empty piece between
        ([(0, 2, 10), (2, 2, 12), (4, 2, 14), (10, 2, 16)], [(0, 6, 10), (10, 2, 16)]),
    ],
)
def test_coalesce_table(pieces, want):
    assert coalesce(pieces) == want


@pytest.mark.parametrize(
    "shape, itemsize, dim, rank, world, want",
    [
        ((8, 4), 2, 0, 1, 2, [(32, 32, 0)]),  # a row split: one range
        ((8, 4), 2, 0, 0, 1, [(0, 64, 0)]),  # one rank: everything
        ((2, 4), 2, 1, 1, 2, [(4, 4, 0), (12, 4, 4)]),  # a column split: strided
        ((1, 6), 4, 1, 2, 3, [(16, 8, 0)]),  # one row: contiguous after all
        ((2, 3, 4), 1, 1, 0, 3, [(0, 4, 0), (12, 4, 4)]),  # the middle dimension
        ((4, 0), 4, 0, 1, 2, []),  # empty
        ((6,), 8, 0, 2, 3, [(32, 16, 0)]),  # a bias
    ],
)
def test_tensor_slice_table(shape, itemsize, dim, rank, world, want):
    assert tensor_slice(shape, itemsize, dim, rank, world) == want


def test_split_shape_refusals():
    assert split_shape("w", (8, 6), -1, 3) == (1, (8, 2))
    with pytest.raises(ValueError, match="'w'.*does not divide into 4"):
        split_shape("w", (8, 6), 1, 4)
    with pytest.raises(ValueError, match="no dimension 2"):
        split_shape("w", (8, 6), 2, 2)
    with pytest.raises(ValueError, match="world_size 0"):
        split_shape("w", (8, 6), 0, 0)
    with pytest.raises(ValueError, match="rank 3"):
        tensor_slice((8,), 1, 0, 3, 2)


@st.composite
def splits(draw):
    world = draw(st.integers(1, 5))
    ndim = draw(st.integers(1, 4))
    dim = draw(st.integers(0, ndim - 1))
    shape = [draw(st.integers(0, 5)) for _ in range(ndim)]
    shape[dim] = world * draw(st.integers(0, 4))
    itemsize = draw(st.sampled_from([1, 2, 4, 8]))
    return tuple(shape), itemsize, dim, world


@settings(max_examples=300, deadline=None)
@given(splits())
def test_slices_are_numpys_split_and_tile_the_tensor(case):
    shape, itemsize, dim, world = case
    data = np.arange(int(np.prod(shape)) * itemsize, dtype=np.uint8) % 251
    tensor = data.view(f"V{itemsize}").reshape(shape) if itemsize > 1 else data.reshape(shape)
    covered = np.zeros(data.size, dtype=int)
    for rank in range(world):
        pieces = tensor_slice(shape, itemsize, dim, rank, world)
        assert pieces == coalesce(pieces), "already coalesced"
        out_dim, out_shape = split_shape("t", shape, dim, world)
        size = int(np.prod(out_shape)) * itemsize
        out = np.zeros(size, dtype=np.uint8)
        for src, n, dst in pieces:
            assert n > 0 and 0 <= dst and dst + n <= size and src + n <= data.size
            out[dst : dst + n] = data[src : src + n]
            covered[src : src + n] += 1
        want = np.split(tensor, world, axis=out_dim)[rank]
        assert out.tobytes() == np.ascontiguousarray(want).tobytes()
        assert sum(n for _, n, _ in pieces) == size, "only the rank's bytes"
    assert (covered == 1).all(), "the ranks together read every byte once"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 64), st.integers(0, 8), st.integers(0, 64)), max_size=20))
def test_coalesce_moves_the_same_bytes_to_the_same_places(raw):
    # Pieces as a loader makes them: disjoint sources, disjoint destinations.
    pieces, used_src, used_dst = [], set(), set()
    for src, n, dst in raw:
        s, d = set(range(src, src + n)), set(range(dst, dst + n))
        if not (s & used_src or d & used_dst):
            pieces.append((src, n, dst))
            used_src |= s
            used_dst |= d
    merged = coalesce(pieces)
    mapping = {src + i: dst + i for src, n, dst in pieces for i in range(n)}
    assert {src + i: dst + i for src, n, dst in merged for i in range(n)} == mapping
    assert len(merged) <= len(pieces)
    assert merged == sorted(merged)
    for (s0, n0, d0), (s1, _, d1) in zip(merged, merged[1:]):
        assert not (s0 + n0 == s1 and d0 + n0 == d1), "nothing left to merge"
