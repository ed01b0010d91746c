"""Uniform neighbour sampling over a CSC graph in NumPy: the arithmetic of
:class:`gpumapio.pyg.PlainTorchNeighborSampler`, kept free of torch so that it runs (and is
tested) where only NumPy is installed.

:func:`sample_neighbors` returns what pyg-lib's ``neighbor_sample`` returns for a homogeneous
graph with ``csc=True``, ``disjoint=False`` and a directed subgraph, in the same layout:

- ``node``: global ids, the seeds first (as given, repeats included), then each hop's new
  nodes in the order they were first reached;
- ``row`` / ``col``: one entry per sampled edge, local indices into ``node``: ``row`` the
  sampled neighbour (the edge's source in CSC), ``col`` the node it was sampled for (its
  destination); edges grouped by hop, and within a hop by the frontier's order;
- ``edge``: each edge's position in the CSC ``row`` array (torch_geometric maps it through
  the graph store's permutation to an edge id);
- ``num_sampled_nodes``: the seeds, then the new nodes of each hop; ``num_sampled_edges``:
  the edges of each hop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["NeighborSample", "sample_neighbors"]


@dataclass
class NeighborSample:
    """One sampled subgraph (see the module's docstring for each field's meaning)."""

    node: np.ndarray
    row: np.ndarray
    col: np.ndarray
    edge: np.ndarray
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]


def sample_neighbors(
    colptr: np.ndarray,
    row: np.ndarray,
    seeds: np.ndarray,
    num_neighbors: Sequence[int],
    *,
    replace: bool = False,
    rng: np.random.Generator | None = None,
) -> NeighborSample:
    """Samples up to ``num_neighbors[h]`` in-neighbours of every node reached at hop ``h``
    (all of them for a negative count), uniformly, without replacement unless ``replace``,
    from the CSC graph ``(colptr, row)``: the in-neighbours of node ``v`` are
    ``row[colptr[v]:colptr[v + 1]]``. Work grows with the number of sampled edges, never with
    the graph's size or a node's degree. ``IndexError`` for a seed outside the graph;
    ``ValueError`` for a graph whose offsets or edges the sample reaches point outside it (only
    what is reached is checked, so that a sample's cost stays that of its edges)."""
    rng = rng if rng is not None else np.random.default_rng()
    colptr = np.asarray(colptr, dtype=np.int64)
    row = np.asarray(row, dtype=np.int64)
    seeds = np.asarray(seeds, dtype=np.int64).reshape(-1)
    if colptr.ndim != 1 or colptr.shape[0] == 0 or row.ndim != 1:
        raise ValueError(
            f"a CSC graph is colptr (num_nodes + 1 offsets) and row (one source an edge), "
            f"got arrays of shapes {colptr.shape} and {row.shape}"
        )
    num_nodes = colptr.shape[0] - 1
    outside = (seeds < 0) | (seeds >= num_nodes)
    if outside.any():
        position = int(np.flatnonzero(outside)[0])
        raise IndexError(
            f"seed {int(seeds[position])} at position {position} is outside the graph of {num_nodes} nodes"
        )

    # Nodes reached so far, sorted by global id, with their local index, for the lookups of
    # each hop; a seed given twice keeps the local index of its first position.
    known, first = np.unique(seeds, return_index=True)
    known_local = first.astype(np.int64)

    nodes, rows, cols, edges = [seeds], [], [], []
    num_sampled_nodes, num_sampled_edges = [int(seeds.shape[0])], []
    begin, end = 0, int(seeds.shape[0])
    frontier = seeds
    for count in num_neighbors:
        edge, frontier_position = _sample_edges(colptr, row.shape[0], frontier, int(count), replace, rng)
        src = row[edge]
        outside = (src < 0) | (src >= num_nodes)
        if outside.any():
            at_edge = int(edge[np.flatnonzero(outside)[0]])
            raise ValueError(f"row[{at_edge}], the source {int(row[at_edge])}, is outside the graph of {num_nodes} nodes")

        # Local indices of the sampled neighbours: those reached before keep theirs, the new
        # ones are numbered after every node so far, in the order they first appear here.
        at = np.searchsorted(known, src)
        found = at < known.shape[0]
        found[found] = known[at[found]] == src[found]
        src_local = np.empty(src.shape[0], dtype=np.int64)
        src_local[found] = known_local[at[found]]
        unseen = src[~found]
        new_ids, first_seen, inverse = np.unique(unseen, return_index=True, return_inverse=True)
        discovery = np.argsort(first_seen, kind="stable")
        new = new_ids[discovery]
        new_local = np.empty(new_ids.shape[0], dtype=np.int64)
        new_local[discovery] = end + np.arange(new_ids.shape[0], dtype=np.int64)
        src_local[~found] = new_local[inverse.reshape(-1)]

        nodes.append(new)
        rows.append(src_local)
        cols.append(begin + frontier_position)
        edges.append(edge)
        num_sampled_nodes.append(int(new.shape[0]))
        num_sampled_edges.append(int(edge.shape[0]))

        merged = np.concatenate([known, new_ids])
        order = np.argsort(merged, kind="stable")
        known = merged[order]
        known_local = np.concatenate([known_local, new_local])[order]
        begin, end = end, end + int(new.shape[0])
        frontier = new

    empty = np.zeros(0, dtype=np.int64)
    return NeighborSample(
        node=np.concatenate(nodes),
        row=np.concatenate(rows) if rows else empty,
        col=np.concatenate(cols) if cols else empty,
        edge=np.concatenate(edges) if edges else empty,
        num_sampled_nodes=num_sampled_nodes,
        num_sampled_edges=num_sampled_edges,
    )


def _sample_edges(
    colptr: np.ndarray, num_edges: int, frontier: np.ndarray, count: int, replace: bool, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The CSC positions of the edges sampled for each node of ``frontier`` (up to ``count``
    each; all for a negative count), grouped by node in the frontier's order, and for each
    edge the position in ``frontier`` of the node it was sampled for. ``ValueError`` where a
    node's offsets are not an ascending span of the ``num_edges`` edges."""
    start = colptr[frontier]
    stop = colptr[frontier + 1]
    bad = (start < 0) | (stop < start) | (stop > num_edges)
    if bad.any():
        node = int(frontier[np.flatnonzero(bad)[0]])
        raise ValueError(
            f"node {node}'s edges, colptr[{node}]..colptr[{node + 1}] = {int(colptr[node])}..{int(colptr[node + 1])}, "
            f"are not a span of the graph's {num_edges} edges"
        )
    degree = stop - start
    if count < 0:
        taken = degree
    elif replace:
        taken = np.where(degree > 0, count, 0)
    else:
        taken = np.minimum(degree, count)
    total = int(taken.sum())
    owner = np.repeat(np.arange(frontier.shape[0], dtype=np.int64), taken)
    # Each edge's rank among its node's sampled edges: 0, 1, ..., taken - 1.
    slot_start = np.cumsum(taken) - taken
    rank = np.arange(total, dtype=np.int64) - slot_start[owner]

    if count < 0 or not replace:
        offset = rank.copy()  # a node with no more than `count` neighbours gives all of them
        partial = np.flatnonzero(taken < degree)
        if partial.shape[0]:
            picks = _floyd(degree[partial], count, rng)
            slots = (slot_start[partial][:, None] + np.arange(count, dtype=np.int64)).reshape(-1)
            offset[slots] = picks.reshape(-1)
    else:
        offset = rng.integers(0, degree[owner]) if total else np.zeros(0, dtype=np.int64)
    return start[owner] + offset, owner


def _floyd(population: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct offsets in ``[0, population[i])`` for each row ``i``, uniformly
    (every ``population[i] > count``): Robert Floyd's algorithm, pyg-lib's too, run for all
    rows at once, one step per offset drawn, so the cost is ``count`` squared per row whatever
    the degree."""
    picks = np.empty((population.shape[0], count), dtype=np.int64)
    for step in range(count):
        # Step j of Floyd's: draw t in [0, j]; take j instead if t is taken already.
        j = population - count + step
        t = rng.integers(0, j + 1)
        taken = (picks[:, :step] == t[:, None]).any(axis=1)
        picks[:, step] = np.where(taken, j, t)
    return picks
