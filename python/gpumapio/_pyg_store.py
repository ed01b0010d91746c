"""The ``torch_geometric.data.FeatureStore`` over :class:`gpumapio.pyg.FeatureTables`.

Imports torch and torch_geometric: reached only through ``gpumapio.pyg.MappedFeatureStore``
(never by ``import gpumapio``). Every rule about tables, indices and errors is
:class:`~gpumapio.pyg.FeatureTables`'s; this class translates ``TensorAttr`` to it and asks for
torch tensors on the GPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch_geometric.data import FeatureStore, TensorAttr

from gpumapio._device import gpu_count
from gpumapio._native import DeviceCache, MappedFile
from gpumapio._pyg_tables import FeatureTables, Key, Table

__all__ = ["MappedFeatureStore"]


class _TorchTables(FeatureTables):
    """:class:`FeatureTables` whose gathers are torch tensors: on the GPU, gathered there on
    torch's current stream; on host memory, NumPy's bytes seen as a CPU tensor."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_gpu = self.device != "host" and gpu_count() > 0 and torch.cuda.is_available()

    def torch_device(self) -> torch.device:
        return torch.device("cuda", self._out_device()) if self.on_gpu else torch.device("cpu")

    def _gather_bytes(self, table: Table, rows: Any, output: Any, stream: Any) -> Any:
        if not self.on_gpu:
            return torch.from_numpy(super()._gather_bytes(table, rows, "numpy", None))
        if stream is None:
            # The rows are written on the stream torch will read them on, after what is queued
            # there (the output's memory may have been freed by work still running on it).
            stream = torch.cuda.current_stream(self.torch_device())
        return super()._gather_bytes(table, rows, "torch", stream)


#: torch_geometric's marker of a field not given (``TensorAttr``'s defaults).
_UNSET = TensorAttr().index


def _unset(attr: TensorAttr, name: str) -> bool:
    return getattr(attr, name) is _UNSET


class _TensorAttr(TensorAttr):
    """``TensorAttr`` whose ``is_set`` takes NumPy arrays: torch_geometric's compares the
    field with ``!=``, which NumPy answers element by element (and ``all()`` then refuses an
    array of more than one), so ``store[group, attr, numpy_array]`` would fail there."""

    def is_set(self, key: str) -> bool:
        assert key in self.__dataclass_fields__
        return getattr(self, key) is not _UNSET


class MappedFeatureStore(FeatureStore):
    """A ``torch_geometric.data.FeatureStore`` whose tensors are tables in files, mapped into
    GPU memory by gpumap under a budget (a table may be far larger than the GPU): each get is a
    gather of rows by index, returned as a torch tensor on the GPU, shaped
    ``(n, *row_shape)`` and of the table's type.

    ``directory``: where :meth:`put_tensor` writes new tables (each a new file; without a
    directory, ``put_tensor`` of a table not registered is a ``NotImplementedError``: register
    files with :meth:`add_table`). ``budget`` / ``cache``: one :class:`~gpumapio.DeviceCache`
    shared by the tables, with ``extent_size`` and ``frame_size`` (see
    :class:`~gpumapio.pyg.FeatureTables`). ``device``: a GPU ordinal, None (GPU 0), or
    ``"host"`` (maps in host memory, CPU tensors). ``writable``: the default of
    :meth:`add_table`'s. ``tensor_attr_cls``: torch_geometric's (default: a ``TensorAttr``
    that also takes NumPy arrays as indices).

    Keys are ``(group_name, attr_name)`` as in torch_geometric — ``group_name`` None for a
    homogeneous graph, a node type for a heterogeneous one; indices are those of
    :mod:`gpumapio.pyg` (``None``, slices, ints, integer or boolean arrays and tensors, on the
    host or the GPU). :meth:`update_tensor` with an index writes those rows in place, through
    the map, to a table registered ``writable=True``.

    Use it with a ``GraphStore`` in ``NeighborLoader((feature_store, graph_store), ...)`` with
    ``num_workers=0``: the maps live in the GPU, and CUDA does not survive the fork of a worker.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        budget: int | None = None,
        cache: DeviceCache | None = None,
        extent_size: int = 4096,
        frame_size: int | None = None,
        device: int | str | None = None,
        writable: bool = False,
        tensor_attr_cls: Any = None,
    ) -> None:
        super().__init__(tensor_attr_cls=tensor_attr_cls or _TensorAttr)
        self.tables: FeatureTables = _TorchTables(
            directory,
            budget=budget,
            cache=cache,
            extent_size=extent_size,
            frame_size=frame_size,
            device=device,
            writable=writable,
        )

    # Registration (gpumapio's) #################################################################

    def add_table(
        self,
        source: str | os.PathLike[str] | MappedFile,
        *,
        group_name: Any = None,
        attr_name: str = "x",
        dtype: Any = "float32",
        row_shape: int | Sequence[int] = (128,),
        budget: int | None = None,
        cache: DeviceCache | None = None,
        writable: bool | None = None,
    ) -> Table:
        """Registers the table in the file ``source`` (or a :class:`~gpumapio.MappedFile`):
        rows of ``row_shape`` values of ``dtype`` (a name, NumPy or torch dtype) from byte 0.
        See :meth:`gpumapio.pyg.FeatureTables.add_table`."""
        return self.tables.add_table(
            source,
            group_name=group_name,
            attr_name=attr_name,
            dtype=dtype,
            row_shape=row_shape,
            budget=budget,
            cache=cache,
            writable=writable,
        )

    @property
    def stats(self) -> dict[str, float]:
        """What was gathered: ``calls``, ``rows``, ``bytes`` and ``seconds`` spent in gathers."""
        return self.tables.stats

    def flush(self) -> None:
        """Writes rows written by :meth:`update_tensor` back to their files."""
        self.tables.flush()

    def sync(self) -> None:
        """:meth:`flush`, then the files made durable; clears the error of a failed write-back
        once everything is written (:meth:`FeatureTables.sync`)."""
        self.tables.sync()

    def close(self) -> None:
        """Unregisters every table, closing the maps the store opened (a table whose close
        fails stays, with its rows: :meth:`sync`, then close again)."""
        self.tables.close()

    def __enter__(self) -> MappedFeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # FeatureStore ##############################################################################

    @staticmethod
    def _key(attr: TensorAttr) -> Key:
        group = None if _unset(attr, "group_name") else attr.group_name
        return FeatureTables.key(group, attr.attr_name)

    @staticmethod
    def _index(attr: TensorAttr) -> Any:
        return None if _unset(attr, "index") else attr.index

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        key = self._key(attr)
        index = self._index(attr)
        if index is None:
            self.tables.put(*key, tensor)
        elif key in self.tables:
            self.tables.write_rows(*key, index, tensor)
        else:
            raise NotImplementedError(
                f"cannot put rows {index!r} of {key}, which is not registered: put the whole "
                "tensor (index=None) into a store with a directory, or add_table() its file"
            )
        return True

    def update_tensor(self, tensor: Any, *args: Any, **kwargs: Any) -> bool:
        """Writes ``tensor`` as the rows ``index`` of a registered, writable table (all rows,
        in place, when the index is None or not given), through its map; the next get sees
        them and :meth:`flush` writes them to the file. (torch_geometric's default removes
        and puts the whole tensor again.)"""
        attr = self._tensor_attr_cls.cast(*args, **kwargs)
        if _unset(attr, "attr_name"):
            raise ValueError(f"update_tensor needs an attr_name: {attr}")
        self.tables.write_rows(*self._key(attr), self._index(attr), tensor)
        return True

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        return self.tables.gather(*self._key(attr), self._index(attr))

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[torch.Tensor]:
        return self.tables.gather_many([(*self._key(attr), self._index(attr)) for attr in attrs])

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        return self.tables.remove(*self._key(attr))

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        key = self._key(attr)
        return self.tables.size(*key) if key in self.tables else None

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        # New objects each call: loaders set their index.
        return [self._tensor_attr_cls(group_name=g, attr_name=a) for g, a in self.tables.keys()]

    def __repr__(self) -> str:
        where = self.tables.torch_device() if isinstance(self.tables, _TorchTables) else "?"
        return f"{type(self).__name__}({len(self.tables)} tables, {where})"
