"""torch_geometric's ``NeighborSampler`` sampling without pyg-lib or torch-sparse.

Imports torch and torch_geometric: reached only through ``gpumapio.pyg.PlainTorchNeighborSampler``
and ``gpumapio.pyg.neighbor_sampler`` (never by ``import gpumapio``). The sampling itself is
:func:`gpumapio._pyg_neighbors.sample_neighbors`, in NumPy.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
import torch_geometric.typing as pyg_typing
from torch_geometric.sampler import NeighborSampler, SamplerOutput
from torch_geometric.sampler.base import SubgraphType

from gpumapio._pyg_neighbors import sample_neighbors

__all__ = ["PlainTorchNeighborSampler", "neighbor_sampler"]


class PlainTorchNeighborSampler(NeighborSampler):
    """torch_geometric's ``NeighborSampler`` whose sampling needs neither pyg-lib nor
    torch-sparse: for ``NeighborLoader(data, num_neighbors=..., neighbor_sampler=this)`` where
    those compiled extensions are not installed (torch_geometric's own sampler then raises
    ``ImportError`` on the first batch). :func:`gpumapio.pyg.neighbor_sampler` picks this one
    only where neither imports.

    It takes ``NeighborSampler``'s arguments and reads the graph as it does (the CSC of a
    ``Data`` or of a ``(FeatureStore, GraphStore)`` pair); each hop samples, for every node
    reached at the hop before, up to ``num_neighbors[hop]`` in-neighbours uniformly (all for
    -1), without replacement unless ``replace=True``, on the CPU, giving what pyg-lib gives:
    the seeds first in ``n_id``, then each hop's new nodes in the order they were reached;
    ``edge_index`` in local indices, neighbour to seed; edge ids; the counts per hop.

    Homogeneous graphs only, and directional subgraphs (``subgraph_type`` ``"directional"`` or
    ``"bidirectional"``): heterogeneous graphs, temporal (``time_attr``), weighted
    (``weight_attr``), ``disjoint`` and ``"induced"`` sampling are ``NotImplementedError``.
    Random numbers come from torch's generator, so ``torch.manual_seed`` makes it repeatable.
    """

    def __init__(self, data: Any, num_neighbors: Any, **kwargs: Any) -> None:
        # Refused before torch_geometric's __init__, which raises ImportError (for want of
        # pyg-lib) for some of them: the option is what this sampler lacks.
        name = type(self).__name__
        if kwargs.get("time_attr") is not None:
            raise NotImplementedError(f"{name} does not do temporal sampling (time_attr)")
        if kwargs.get("weight_attr") is not None:
            raise NotImplementedError(f"{name} does not do weighted sampling (weight_attr)")
        if kwargs.get("disjoint"):
            raise NotImplementedError(f"{name} does not do disjoint sampling")
        _check_edges(data)
        subgraph_type = SubgraphType(kwargs.get("subgraph_type", "directional"))
        if subgraph_type == SubgraphType.induced or kwargs.get("directed") is False:
            raise NotImplementedError(f"{name} does not do subgraph_type='induced' (nor directed=False)")
        with warnings.catch_warnings():
            # torch_geometric warns that sampling without pyg-lib is deprecated: it means its own.
            warnings.filterwarnings("ignore", message=".*without a 'pyg-lib' installation.*")
            super().__init__(data, num_neighbors, **kwargs)
        if self.is_hetero:
            raise NotImplementedError(f"{type(self).__name__} samples homogeneous graphs only")
        self._csc: tuple[np.ndarray, np.ndarray] | None = None

    def _csc_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(colptr, row)`` as int64 NumPy arrays: views of CPU int64 tensors, else a copy
        made once (a graph store may hold them on the GPU or as int32)."""
        if self._csc is not None:
            return self._csc
        colptr, row = self.colptr, self.row
        views = all(t.device.type == "cpu" and t.dtype == torch.int64 for t in (colptr, row))
        arrays = (colptr.detach().cpu().long().numpy(), row.detach().cpu().long().numpy())
        if not views:
            self._csc = arrays
        return arrays

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_csc"] = None  # rebuilt from colptr / row where needed
        return state

    def _sample(self, seed: Any, seed_time: Any = None, **kwargs: Any) -> SamplerOutput:
        if isinstance(seed, dict):
            raise NotImplementedError(f"{type(self).__name__} samples homogeneous graphs only")
        if seed_time is not None or self.is_temporal:
            raise NotImplementedError(f"{type(self).__name__} does not do temporal sampling")
        colptr, row = self._csc_arrays()
        # A NumPy generator seeded from torch's, so torch.manual_seed governs the samples.
        rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
        out = sample_neighbors(
            colptr,
            row,
            seed.detach().cpu().long().numpy(),
            self.num_neighbors.get_mapped_values(),
            replace=self.replace,
            rng=rng,
        )
        sampled_row, sampled_col = torch.from_numpy(out.row), torch.from_numpy(out.col)
        if self.sample_direction == "backward":  # as torch_geometric does for pyg-lib's output
            sampled_row, sampled_col = sampled_col, sampled_row
        return SamplerOutput(
            node=torch.from_numpy(out.node),
            row=sampled_row,
            col=sampled_col,
            edge=torch.from_numpy(out.edge),
            batch=None,
            num_sampled_nodes=out.num_sampled_nodes,
            num_sampled_edges=out.num_sampled_edges,
        )


def neighbor_sampler(data: Any, num_neighbors: Any, **kwargs: Any) -> NeighborSampler:
    """A sampler for ``NeighborLoader(data, num_neighbors, neighbor_sampler=...)``:
    torch_geometric's own ``NeighborSampler`` where pyg-lib or torch-sparse imports,
    :class:`PlainTorchNeighborSampler` otherwise. ``kwargs``: ``NeighborSampler``'s
    (``replace``, ``subgraph_type``, ``disjoint``, ``time_attr``, ...)."""
    if pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE:
        _check_edges(data)
        return NeighborSampler(data, num_neighbors, **kwargs)
    return PlainTorchNeighborSampler(data, num_neighbors, **kwargs)


def _check_edges(data: Any) -> None:
    """Refuses a ``Data`` whose ``edge_index`` names a node outside the graph, naming the edge:
    torch_geometric's ``to_csc``, which every ``NeighborSampler`` runs first, writes past its
    arrays for such an edge (the process then aborts on a corrupted heap)."""
    from torch_geometric.data import Data

    edge_index = getattr(data, "edge_index", None) if isinstance(data, Data) else None
    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.numel() == 0:
        return
    num_nodes = data.num_nodes
    bad = (edge_index < 0) | (edge_index >= num_nodes)
    if bool(bad.any()):
        side, position = (int(i) for i in bad.nonzero()[0])
        end = "source" if side == 0 else "destination"
        raise ValueError(
            f"edge {position}'s {end}, node {int(edge_index[side, position])}, is outside the graph of {num_nodes} nodes"
        )
