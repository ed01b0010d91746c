"""PyTorch Geometric feature stores backed by gpumap maps: feature tables that live in files and
reach the GPU row by row through gpumap's page cache, under a budget far smaller than the files.

Two layers:

- :class:`FeatureTables`: the registry of tables — one file each, rows of a fixed type and
  shape — and all the rules about keys, indices, sizes, types and errors. It needs only NumPy
  and works on host memory (``device="host"``) as on the GPU: gathers return NumPy arrays on
  the host, CuPy arrays (or torch tensors with ``output="torch"``) on the GPU.
- :class:`MappedFeatureStore`: a ``torch_geometric.data.FeatureStore`` over it, whose gathers
  are torch tensors on the GPU, for ``NeighborLoader((feature_store, graph_store), ...)``.

``NeighborLoader`` samples with pyg-lib or torch-sparse; where neither is installed,
``neighbor_sampler=gpumapio.pyg.neighbor_sampler(data, num_neighbors)`` gives it
:class:`PlainTorchNeighborSampler`, which samples in NumPy on the CPU.

torch and torch_geometric are optional dependencies of gpumapio: ``import gpumapio`` never
imports them, and this module imports them only when :class:`MappedFeatureStore` is first
looked up, like :class:`PlainTorchNeighborSampler` and :func:`neighbor_sampler` (an
``ImportError`` saying what is missing where they do not import).

>>> from gpumapio.pyg import MappedFeatureStore                          # doctest: +SKIP
>>> store = MappedFeatureStore(budget=1 << 30)                           # doctest: +SKIP
>>> store.add_table("x.bin", attr_name="x", dtype="float32", row_shape=(128,))  # doctest: +SKIP
>>> store[None, "x", torch.tensor([0, 5, 7])].shape                      # doctest: +SKIP
torch.Size([3, 128])

A table is a file of rows, row ``i`` at bytes ``[i * row_size, (i + 1) * row_size)`` with
``row_size = prod(row_shape) * itemsize``, in the machine's (little-endian) byte order, rows
starting at byte 0; a partial last row is not a row. ``np.ndarray.tofile`` and
``torch.Tensor.numpy().tofile`` write such files.

Indices (the ``index`` of a ``TensorAttr``): ``None`` (all rows), a slice (Python's rules,
negative bounds included), an int (one row, returned without the leading dimension), or a
one-dimensional array of integers — a list, ``range``, NumPy array, or torch / CuPy tensor on
the host or the GPU — or of booleans, one per row (a mask). There is no wrap-around: a negative
index, like one past the last row, is an ``IndexError`` naming it, its position and the table.
Floats are a ``TypeError``, never truncated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpumapio._pyg_tables import DTYPES, FeatureTables, Key, Table, dtype_name

if TYPE_CHECKING:  # built on first use (they subclass torch_geometric's classes)
    from gpumapio._pyg_sampler import PlainTorchNeighborSampler, neighbor_sampler
    from gpumapio._pyg_store import MappedFeatureStore

__all__ = [
    "FeatureTables",
    "MappedFeatureStore",
    "PlainTorchNeighborSampler",
    "Table",
    "dtype_name",
    "neighbor_sampler",
    "DTYPES",
]

_LAZY = {
    "MappedFeatureStore": "_pyg_store",
    "PlainTorchNeighborSampler": "_pyg_sampler",
    "neighbor_sampler": "_pyg_sampler",
}


def __getattr__(name: str) -> Any:
    # MappedFeatureStore and the sampler subclass torch_geometric's classes: built (torch and
    # torch_geometric imported) on first use only.
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    try:
        module = importlib.import_module(f"gpumapio.{module_name}")
    except ImportError as e:
        raise ImportError(
            f"gpumapio.pyg.{name} needs torch and torch_geometric "
            f"(pip install torch torch_geometric): {e}"
        ) from e
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
