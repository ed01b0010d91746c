"""The slicing, coalescing and staging arithmetic of partial tensor reads (gpumapio._pieces):
tables of known cases, then generated ones checked against NumPy's own slicing and against
the bytes each piece moves."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumapio._pieces import Run, coalesce, fit_window, merge_casts, split_shape, tensor_slice


R = Run


@pytest.mark.parametrize(
    "pieces, want",
    [
        ([], []),
        ([(0, 0, 0)], []),
        ([(0, 4, 0, 0, 8)], []),  # no runs
        ([(0, 4, 0), (4, 4, 4)], [R(0, 8, 0)]),
        ([(4, 4, 4), (0, 4, 0)], [R(0, 8, 0)]),  # any order in
        ([(0, 4, 0), (4, 4, 8)], [R(0, 4, 0), R(4, 4, 8)]),  # touching in the file only
        ([(0, 4, 0), (8, 4, 4)], [R(0, 4, 0), R(8, 4, 4)]),  # touching in memory only
        ([(0, 4, 0), (4, 0, 4), (4, 4, 4)], [R(0, 8, 0)]),  # an empty piece between
        ([(0, 2, 10), (2, 2, 12), (4, 2, 14), (10, 2, 16)], [R(0, 6, 10), R(10, 2, 16)]),
        ([(0, 4, 0, 3, 4)], [R(0, 12, 0)]),  # strided runs that touch: one run
        ([(0, 4, 0, 1, 99)], [R(0, 4, 0)]),  # one run: no stride
        ([(8, 4, 0, 3, 16), (0, 8, 12)], [R(0, 8, 12), R(8, 4, 0, 3, 16)]),  # strided kept apart
    ],
)
def test_coalesce_table(pieces, want):
    assert coalesce(pieces) == want


@pytest.mark.parametrize(
    "shape, itemsize, dim, rank, world, want",
    [
        ((8, 4), 2, 0, 1, 2, [R(32, 32, 0)]),  # a row split: one range
        ((8, 4), 2, 0, 0, 1, [R(0, 64, 0)]),  # one rank: everything
        ((2, 4), 2, 1, 1, 2, [R(4, 4, 0, 2, 8)]),  # a column split: strided
        ((1, 6), 4, 1, 2, 3, [R(16, 8, 0)]),  # one row: contiguous after all
        ((2, 3, 4), 1, 1, 0, 3, [R(0, 4, 0, 2, 12)]),  # the middle dimension
        ((4, 0), 4, 0, 1, 2, []),  # empty
        ((6,), 8, 0, 2, 3, [R(32, 16, 0)]),  # a bias
        ((3, 4), 2, 1, 0, 1, [R(0, 24, 0)]),  # one rank, an inner dimension
    ],
)
def test_tensor_slice_table(shape, itemsize, dim, rank, world, want):
    assert tensor_slice(shape, itemsize, dim, rank, world) == want


def _bytes(pieces):
    """{source byte: destination byte} of pieces."""
    return {
        src + k * stride + i: dst + k * length + i
        for src, length, dst, repeat, stride in (Run(*p) for p in pieces)
        for k in range(repeat)
        for i in range(length)
    }


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
        assert len(pieces) <= 1, "one piece per tensor, strided or not"
        for src, dst in _bytes(pieces).items():
            out[dst] = data[src]
            covered[src] += 1
        want = np.split(tensor, world, axis=out_dim)[rank]
        assert out.tobytes() == np.ascontiguousarray(want).tobytes()
        assert sum(p.nbytes for p in pieces) == size, "only the rank's bytes"
    assert (covered == 1).all(), "the ranks together read every byte once"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 64), st.integers(0, 8), st.integers(0, 64), st.integers(0, 4), st.integers(0, 12)),
        max_size=20,
    )
)
def test_coalesce_moves_the_same_bytes_to_the_same_places(raw):
    # Pieces as a loader makes them: no source byte read twice, no destination byte written twice.
    pieces, used_src, used_dst = [], set(), set()
    for piece in raw:
        mapping = _bytes([piece])
        src, dst = set(mapping), set(mapping.values())
        runs_overlap = len(mapping) != Run(*piece).nbytes
        if not (runs_overlap or src & used_src or dst & used_dst):
            pieces.append(piece)
            used_src |= src
            used_dst |= dst
    merged = coalesce(pieces)
    assert _bytes(merged) == _bytes(pieces)
    assert len(merged) <= len(pieces)
    assert merged == sorted(merged)
    for p in merged:
        assert p.nbytes > 0 and (p.repeat == 1) == (p.stride == 0) and p.stride != p.length
    for p0, p1 in zip(merged, merged[1:]):
        singles = p0.repeat == 1 and p1.repeat == 1
        assert not (singles and p0.src + p0.length == p1.src and p0.dst + p0.length == p1.dst), "nothing left to merge"


@pytest.mark.parametrize(
    "piece, window, want",
    [
        (R(0, 10, 0), 4, [R(0, 4, 0), R(4, 4, 4), R(8, 2, 8)]),  # one run, cut
        (R(0, 4, 0), 4, [R(0, 4, 0)]),  # one run that fits
        (R(100, 2, 6, 5, 8), 4, [R(100, 2, 6, 2, 8), R(116, 2, 10, 2, 8), R(132, 2, 14, 1, 8)]),  # whole runs together
        (R(0, 6, 0, 2, 10), 4, [R(0, 4, 0), R(4, 2, 4), R(10, 4, 6), R(14, 2, 10)]),  # runs past the window
        (R(0, 0, 0), 4, []),
    ],
)
def test_fit_window_table(piece, window, want):
    assert fit_window(piece, window) == want


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 64),
    st.integers(0, 9),
    st.integers(0, 64),
    st.integers(1, 6),
    st.integers(0, 6),
    st.integers(1, 12),
)
def test_fit_window_moves_the_same_bytes_in_windows(src, length, dst, repeat, gap, window):
    piece = Run(src, length, dst, repeat, length + gap if repeat > 1 else 0)
    parts = fit_window(piece, window)
    assert all(0 < p.nbytes <= window for p in parts)
    assert _bytes(parts) == _bytes([piece])
    assert sum(p.nbytes for p in parts) == piece.nbytes, "each byte once"
    starts = [p.dst for p in parts]
    assert starts == sorted(starts), "in the piece's order"


def test_merge_casts_joins_what_follows_in_staging_and_output_of_one_element():
    f, g = "F16", "F32"
    casts = [
        (0, 8, 100, 16, f),
        (8, 8, 116, 16, f),  # follows in both: joined
        (16, 8, 140, 16, f),  # a gap in the output
        (24, 8, 156, 16, g),  # another element type
        (40, 8, 172, 16, g),  # a gap in staging
    ]
    assert merge_casts(casts) == [(0, 16, 100, 32, f), (16, 8, 140, 16, f), (24, 8, 156, 16, g), (40, 8, 172, 16, g)]
    assert merge_casts([]) == []
