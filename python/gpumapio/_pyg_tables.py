"""The registry of feature tables behind :mod:`gpumapio.pyg`: one file each, rows of a fixed type
and shape, and every rule about keys, indices, sizes, types and errors (see that module's
docs). NumPy only; torch and CuPy where the caller's arrays are theirs."""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import sys
import time
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpumapio import maps
from gpumapio._device import Output
from gpumapio._arguments import first_outside
from gpumapio._native import DeviceCache, MappedFile

__all__ = ["DTYPES", "FeatureTables", "Key", "Table", "dtype_name"]

#: The element types a table can hold, by name, with their sizes in bytes. ``bfloat16`` has no
#: NumPy type: such tables are gathered as torch tensors (:class:`MappedFeatureStore`).
DTYPES: dict[str, int] = {
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
}

#: A table's key: ``(group_name, attr_name)`` — a node type (str), an edge type (tuple of str)
#: or None for homogeneous graphs, and the attribute's name.
Key = tuple[Any, str]


def _framework(obj: Any) -> str:
    """``"torch"``, ``"cupy"``, ``"numpy"`` or ``""``: which array library ``obj`` is from, told
    by its type's module (so that neither torch nor CuPy is imported to ask)."""
    module = type(obj).__module__
    for name in ("torch", "cupy", "numpy"):
        if module == name or module.startswith(name + "."):
            return name
    return ""


def dtype_name(dtype: Any) -> str:
    """The name (a key of :data:`DTYPES`) of ``dtype``: a name (``"float32"``, ``"f4"``,
    ``"bfloat16"``), a NumPy dtype or type, or a torch dtype. ``TypeError`` for other types
    (bool, complex, strings, objects) and for byte orders other than the machine's."""
    if _framework(dtype) == "torch":  # torch.float32 prints as "torch.float32"
        name = str(dtype).removeprefix("torch.")
    elif isinstance(dtype, str) and dtype in DTYPES:
        name = dtype
    elif dtype is None:  # NumPy reads None as float64
        raise TypeError("dtype None: a table's dtype must be given")
    else:
        try:
            parsed = np.dtype(dtype)
        except (TypeError, ValueError) as e:  # ValueError: structured dtypes NumPy refuses
            raise TypeError(f"dtype {dtype!r}: {e}") from None
        if not parsed.isnative:
            raise TypeError(
                f"dtype {dtype!r} is not in this machine's byte order: tables hold "
                f"{sys.byteorder}-endian values"
            )
        name = parsed.name
    if name not in DTYPES:
        raise TypeError(f"dtype {dtype!r}: a table holds one of {', '.join(DTYPES)}")
    return name


def _row_shape(row_shape: int | Sequence[int], itemsize: int) -> tuple[int, ...]:
    """``row_shape`` checked, its row of ``itemsize``-byte values no larger than a NumPy array
    can be (else every gather would fail making one)."""
    dims = (row_shape,) if isinstance(row_shape, (int, np.integer)) else tuple(row_shape)
    for d in dims:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"row_shape {row_shape!r}: dimensions must be ints, got {d!r}")
        if d <= 0:
            raise ValueError(f"row_shape {row_shape!r}: dimensions must be at least 1, got {d}")
    dims = tuple(int(d) for d in dims)
    if math.prod(dims) * itemsize > np.iinfo(np.intp).max:
        raise ValueError(
            f"row_shape {row_shape!r}: a row of {math.prod(dims) * itemsize} bytes is larger than an "
            f"array can be ({np.iinfo(np.intp).max} bytes)"
        )
    return dims


def _describe(key: Key) -> str:
    group, attr = key
    return f"table {attr!r}" if group is None else f"table ({group!r}, {attr!r})"


@dataclass
class Table:
    """One registered table: a map of its file and how its bytes read as rows."""

    key: Key
    mapped: MappedFile
    dtype: str
    row_shape: tuple[int, ...]
    #: Bytes per row: ``prod(row_shape) * itemsize``.
    row_size: int
    #: Whole rows in the file when it was registered.
    rows: int
    #: Whether the registry opened the map (and closes it on removal) or was handed it.
    owned: bool

    @property
    def shape(self) -> tuple[int, ...]:
        """``(rows, *row_shape)``."""
        return (self.rows, *self.row_shape)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def path(self) -> str:
        return os.fspath(self.mapped.path)

    def __str__(self) -> str:
        return _describe(self.key)


@dataclass(frozen=True)
class _Index:
    """A normalised index: int64 NumPy array on the host, or a contiguous one-dimensional int32
    / int64 CuPy or torch array on the GPU (checked by the gather itself); ``scalar``: an int
    was given, and the result loses its leading dimension."""

    rows: Any
    scalar: bool

    @property
    def n(self) -> int:
        return _count(self.rows)


def _count(rows: Any) -> int:
    numel = getattr(rows, "numel", None)
    return int(numel()) if callable(numel) else int(rows.size)


class FeatureTables:
    """Tables of rows in files, each mapped through gpumap, keyed by ``(group_name,
    attr_name)``; gathers by index, writes by index, new tables written to files.

    ``directory``: where :meth:`put` writes new tables (without it, :meth:`put` is a
    ``NotImplementedError``; tables are registered from existing files with :meth:`add_table`).
    ``budget``: bytes of one :class:`~gpumapio.DeviceCache` shared by the tables this registry
    maps (unless a table gets its own ``budget`` or ``cache``); ``cache``: such a cache, given.
    Without either, each table gets gpumap's default (its file's size, up to 4 GiB).
    ``extent_size``: gpumap's unit of I/O and residency (4096 suits rows of a few hundred bytes);
    ``frame_size``: the cache's unit of allocation (see :class:`~gpumapio.DeviceCache`).
    ``device``: a GPU ordinal, ``"host"``, or None (GPU 0 where there is one).
    ``writable``: the default of :meth:`add_table`'s ``writable``.

    The registry keeps counts of what it gathered in :attr:`stats` (``calls``, ``rows``,
    ``bytes``, ``seconds`` spent in gathers, which return once the rows are there).
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
    ) -> None:
        if budget is not None and cache is not None:
            raise ValueError("give budget (a cache of that size) or cache, not both")
        self.directory = None if directory is None else os.fspath(directory)
        if self.directory is not None and not os.path.isdir(self.directory):
            raise NotADirectoryError(f"directory {self.directory!r} is not a directory")
        self.extent_size = extent_size
        self.device = device
        self.writable = writable
        self.cache = cache if cache is not None else (
            None
            if budget is None
            else DeviceCache(budget, extent_size=extent_size, frame_size=frame_size, device=device)
        )
        self._tables: dict[Key, Table] = {}
        self.stats: dict[str, float] = {"calls": 0, "rows": 0, "bytes": 0, "seconds": 0.0}

    # Registry ##################################################################################

    @staticmethod
    def key(group_name: Any, attr_name: Any) -> Key:
        """``(group_name, attr_name)`` checked: a str attribute name; a group that is None, a
        str, or a tuple of str (an edge type)."""
        if not isinstance(attr_name, str):
            raise TypeError(f"attr_name must be a str, got {attr_name!r}")
        ok = group_name is None or isinstance(group_name, str) or (
            isinstance(group_name, tuple) and all(isinstance(g, str) for g in group_name)
        )
        if not ok:
            raise TypeError(
                f"group_name must be None, a str or a tuple of str (an edge type), got {group_name!r}"
            )
        return (group_name, attr_name)

    def add_table(
        self,
        source: str | os.PathLike[str] | MappedFile,
        *,
        group_name: Hashable | None = None,
        attr_name: str = "x",
        dtype: Any = "float32",
        row_shape: int | Sequence[int] = (128,),
        budget: int | None = None,
        cache: DeviceCache | None = None,
        writable: bool | None = None,
    ) -> Table:
        """Registers the table in ``source`` (a path, mapped here, or a :class:`MappedFile`
        mapped by the caller, who keeps closing it) under ``(group_name, attr_name)``: rows of
        ``row_shape`` values of ``dtype`` from byte 0. A path is mapped in ``cache``, else a
        cache of its own of ``budget`` bytes, else the registry's cache; ``writable`` (default:
        the registry's) lets :meth:`write_rows` change it. Returns the :class:`Table`."""
        key = self.key(group_name, attr_name)
        if key in self._tables:
            raise ValueError(f"{_describe(key)} is already registered; remove it first")
        name = dtype_name(dtype)
        shape = _row_shape(row_shape, DTYPES[name])
        row_size = math.prod(shape) * DTYPES[name]
        if isinstance(source, MappedFile):
            if budget is not None or cache is not None or writable is not None:
                raise ValueError(
                    "budget, cache and writable are the map's: give them to gpumapio.map, "
                    "not with a MappedFile"
                )
            mapped, owned = source, False
        else:
            if budget is not None and cache is not None:
                raise ValueError("give budget (a cache of that size) or cache, not both")
            writable = self.writable if writable is None else writable
            if cache is None and budget is None:
                cache = self.cache
            mapped = maps.map(
                source,
                budget=budget,
                cache=cache,
                writable=writable,
                extent_size=self.extent_size,
                device=self.device,
            )
            owned = True
        table = Table(key, mapped, name, shape, row_size, mapped.nbytes // row_size, owned)
        self._tables[key] = table
        return table

    def table(self, group_name: Any, attr_name: Any) -> Table:
        """The table registered under ``(group_name, attr_name)``; ``KeyError`` naming the
        registered ones otherwise."""
        key = self.key(group_name, attr_name)
        try:
            return self._tables[key]
        except KeyError:
            known = ", ".join(str(k) for k in self._tables) or "none"
            raise KeyError(f"no {_describe(key)} (registered: {known})") from None

    def __contains__(self, key: object) -> bool:
        return key in self._tables

    def __len__(self) -> int:
        return len(self._tables)

    def __iter__(self) -> Iterator[Key]:
        return iter(list(self._tables))

    def keys(self) -> list[Key]:
        """The registered ``(group_name, attr_name)`` keys, in registration order."""
        return list(self._tables)

    def size(self, group_name: Any, attr_name: Any) -> tuple[int, ...]:
        """``(rows, *row_shape)`` of a table."""
        return self.table(group_name, attr_name).shape

    def remove(self, group_name: Any, attr_name: Any) -> bool:
        """Unregisters a table (its file stays); closes its map if this registry opened it
        (writing a writable one back). Returns whether it was registered. A close that fails
        (the write-back's error is raised) leaves the table registered and its map open, so
        that nothing written is dropped: call it again, or ``close()``, once the cause is gone."""
        key = self.key(group_name, attr_name)
        table = self._tables.get(key)
        if table is None:
            return False
        if table.owned:
            table.mapped.close()
        self._tables.pop(key, None)
        return True

    def flush(self) -> None:
        """Writes the rows written to writable tables back to their files. After a failed
        write-back a table's flush (and close) raises that error until a :meth:`sync`
        succeeds, as :meth:`MappedFile.flush` does."""
        for table in list(self._tables.values()):
            if table.mapped.writable:
                table.mapped.flush()

    def sync(self) -> None:
        """:meth:`flush`, then each writable table's file made durable (``fdatasync``); it
        retries what failed write-backs left dirty and, once all is written, clears their
        error (:meth:`MappedFile.sync`)."""
        for table in list(self._tables.values()):
            if table.mapped.writable:
                table.mapped.sync()

    def close(self) -> None:
        """Unregisters every table, closing the maps this registry opened; a table whose close
        fails stays registered (see :meth:`remove`), and the first such error is raised."""
        errors = []
        for key in list(self._tables):
            try:
                self.remove(*key)
            except Exception as e:  # close the others all the same, then raise the first
                errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> FeatureTables:
        return self

    def __copy__(self) -> FeatureTables:
        # A shallow copy would share the registry: closing it would close this one's maps.
        raise TypeError(
            "FeatureTables cannot be copied (a copy would share its tables and their maps); "
            "make another FeatureTables over the same files"
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> FeatureTables:
        return self.__copy__()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Indices ###################################################################################

    def index(self, table: Table, index: Any) -> _Index:
        """``index`` (see the module's docstring) as the rows of ``table`` to gather."""
        if index is None:
            return _Index(np.arange(table.rows, dtype=np.int64), False)
        if isinstance(index, slice):
            start, stop, step = index.indices(table.rows)  # ValueError for a step of 0
            return _Index(np.arange(start, stop, step, dtype=np.int64), False)
        if isinstance(index, (bool, np.bool_)):
            raise TypeError(f"{table}: a bool ({index}) is not a row index")
        if isinstance(index, (int, np.integer)):
            _check_python_ints(table, [int(index)])
            return _Index(np.array([int(index)], dtype=np.int64), True)
        framework = _framework(index)
        if framework == "torch":
            return self._torch_index(table, index)
        if hasattr(index, "__cuda_array_interface__"):
            return self._device_index(table, index)
        if isinstance(index, (list, tuple, range)):
            index = _sequence(table, index)
        return self._array_index(table, np.asarray(index))

    def _array_index(self, table: Table, arr: np.ndarray) -> _Index:
        if arr.ndim == 1 and arr.size == 0 and arr.dtype.kind in "iuf":
            return _Index(np.zeros(0, dtype=np.int64), False)  # torch.tensor([]) is float32
        if arr.dtype.kind == "b":
            if arr.ndim != 1 or arr.shape[0] != table.rows:
                raise IndexError(
                    f"{table}: a boolean mask needs one entry per row ({table.rows}), got shape {arr.shape}"
                )
            return _Index(np.flatnonzero(arr).astype(np.int64, copy=False), False)
        if arr.dtype.kind not in "iu":
            first = arr.flat[0] if arr.size else None
            sample = f" such as {getattr(first, 'item', lambda: first)()!r}" if arr.size else ""
            raise TypeError(
                f"{table}: row indices must be integers (or one bool per row), got {arr.dtype} values{sample}"
            )
        if arr.ndim > 1:
            raise ValueError(f"{table}: row indices must be one-dimensional, got shape {arr.shape}")
        if arr.size:
            bad = (arr < 0) | (arr >= table.rows)
            if bad.any():
                at = int(np.argmax(bad))
                raise IndexError(_outside(table, int(arr.reshape(-1)[at]), at))
        return _Index(np.ascontiguousarray(arr.reshape(-1), dtype=np.int64), arr.ndim == 0)

    def _torch_index(self, table: Table, index: Any) -> _Index:
        """A torch tensor: on the host, checked here as NumPy; on the GPU, left there — int32
        and int64 go to the gather as they are (which checks them against the table, naming
        the first outside it), other integers are widened, booleans are a mask."""
        import torch

        index = index.detach()
        if index.dim() == 1 and index.numel() == 0 and index.dtype != torch.bool:  # torch.tensor([]) is float32
            return _Index(np.zeros(0, dtype=np.int64) if not index.is_cuda else index.long(), False)
        if index.is_floating_point() or index.is_complex():
            sample = f" such as {index.reshape(-1)[0].item()!r}" if index.numel() else ""
            raise TypeError(
                f"{table}: row indices must be integers (or one bool per row), got {index.dtype} values{sample}"
            )
        if not index.is_cuda:
            return self._array_index(table, index.numpy())
        if index.dtype == torch.bool:
            if index.dim() != 1 or index.shape[0] != table.rows:
                raise IndexError(
                    f"{table}: a boolean mask needs one entry per row ({table.rows}), got shape {tuple(index.shape)}"
                )
            return _Index(index.nonzero().reshape(-1), False)
        if index.dim() > 1:
            raise ValueError(f"{table}: row indices must be one-dimensional, got shape {tuple(index.shape)}")
        rows = index.reshape(-1)
        if rows.dtype not in (torch.int32, torch.int64):
            rows = rows.long()
        return _Index(rows.contiguous(), index.dim() == 0)

    def _device_index(self, table: Table, index: Any) -> _Index:
        """A CuPy (or other ``__cuda_array_interface__``) array on the GPU, left there, as
        :meth:`_torch_index` does with torch's."""
        import cupy

        interface = index.__cuda_array_interface__
        typestr, shape = interface["typestr"], tuple(interface["shape"])
        kind, size = typestr[1], int(typestr[2:])
        index = cupy.asarray(index)
        if kind == "b":
            if len(shape) != 1 or shape[0] != table.rows:
                raise IndexError(
                    f"{table}: a boolean mask needs one entry per row ({table.rows}), got shape {shape}"
                )
            return _Index(cupy.flatnonzero(index), False)
        if kind not in "iu":
            raise TypeError(
                f"{table}: row indices must be integers (or one bool per row), got {index.dtype} values"
            )
        if len(shape) > 1:
            raise ValueError(f"{table}: row indices must be one-dimensional, got shape {shape}")
        rows = index.reshape(-1)
        if kind != "i" or size not in (4, 8):
            rows = rows.astype(cupy.int64)
        return _Index(cupy.ascontiguousarray(rows), len(shape) == 0)

    # Gathers ###################################################################################

    def gather(
        self,
        group_name: Any,
        attr_name: Any,
        index: Any = None,
        *,
        output: Output = "auto",
        stream: Any = None,
    ) -> Any:
        """Rows ``index`` of a table, typed and shaped ``(n, *row_shape)`` (``row_shape`` for
        an int index): a NumPy array from host memory, else a CuPy array (torch tensor with
        ``output="torch"``) on the GPU. ``stream``: as :func:`gpumapio.gather_rows`'s."""
        table = self.table(group_name, attr_name)
        return self._finish(table, self._gather(table, self.index(table, index), output, stream))

    def gather_many(
        self,
        requests: Iterable[tuple[Any, Any, Any]],
        *,
        output: Output = "auto",
        stream: Any = None,
    ) -> list[Any]:
        """:meth:`gather` of each ``(group_name, attr_name, index)``, in order, with one gather
        per table: the indices asked of one table are joined (when all are on the host, or all
        torch / all CuPy on the GPU; otherwise each is gathered alone)."""
        requests = list(requests)
        plans: dict[Key, list[tuple[int, _Index]]] = {}
        for position, (group_name, attr_name, index) in enumerate(requests):
            table = self.table(group_name, attr_name)
            plans.setdefault(table.key, []).append((position, self.index(table, index)))
        results: list[Any] = [None] * len(requests)
        for key, plan in plans.items():
            table = self._tables[key]
            joined = _join([ix.rows for _, ix in plan]) if len(plan) > 1 else plan[0][1].rows
            if joined is None:  # mixed kinds: one gather each
                for position, ix in plan:
                    results[position] = self._finish(table, self._gather(table, ix, output, stream))
                continue
            raw = self._gather(table, _Index(joined, False), output, stream)
            start = 0
            for position, ix in plan:
                piece = raw.rows[start : start + ix.n]
                start += ix.n
                results[position] = self._finish(table, _Raw(piece, ix.scalar))
        return results

    def _gather(self, table: Table, index: _Index, output: Output, stream: Any) -> _Raw:
        """The rows' bytes, ``(n, row_size)`` ``uint8``."""
        began = time.perf_counter()
        try:
            raw = self._gather_bytes(table, index.rows, output, stream)
        except IndexError as e:  # from GPU indices: the gather names the index and position
            raise IndexError(f"{table}: {e}") from None
        self.stats["calls"] += 1
        self.stats["rows"] += index.n
        self.stats["bytes"] += index.n * table.row_size
        self.stats["seconds"] += time.perf_counter() - began
        return _Raw(raw, index.scalar)

    def _out_device(self) -> int:
        return self.device if isinstance(self.device, int) else 0

    def _gather_bytes(self, table: Table, rows: Any, output: Output, stream: Any) -> Any:
        """Hook: ``(len(rows), row_size)`` ``uint8`` rows of ``table``."""
        return maps.gather_rows(
            table.mapped, rows, table.row_size, output=output, stream=stream, device=self._out_device()
        )

    def _finish(self, table: Table, raw: _Raw) -> Any:
        """``(n, row_size)`` bytes as ``(n, *row_shape)`` values of the table's type (NumPy,
        CuPy and torch alike: a view, no copy); without the leading dimension for an int."""
        rows = raw.rows
        n = int(rows.shape[0])
        if _framework(rows) == "torch":
            import torch

            typed = rows.view(getattr(torch, table.dtype))
        else:
            if table.dtype == "bfloat16":
                raise TypeError(
                    f"{table} holds bfloat16, which NumPy and CuPy lack: gather it as torch "
                    "tensors (output='torch', or MappedFeatureStore)"
                )
            typed = rows.view(table.dtype)
        typed = typed.reshape(n, *table.row_shape)
        return typed[0, ...] if raw.scalar else typed  # an array (0-d for scalar rows), never a number

    # Writes ####################################################################################

    def write_rows(self, group_name: Any, attr_name: Any, index: Any, values: Any) -> None:
        """Writes ``values`` (``(n, *row_shape)`` of the table's type, or ``row_shape`` for an
        int index; NumPy, torch, CuPy, or a list) as rows ``index`` of a writable table,
        through its map: the next gather sees them, and :meth:`flush` (or removal) writes them
        to the file. A repeated index takes the last of its rows. Nothing is converted: another
        type or shape is an error (a list is read as the table's type)."""
        table = self.table(group_name, attr_name)
        if not table.mapped.writable:
            raise io.UnsupportedOperation(
                f"{table} is mapped read-only: register it with add_table(..., writable=True) "
                "to write rows"
            )
        if _framework(index) == "torch":
            index = index.detach().cpu()
        elif hasattr(index, "__cuda_array_interface__"):
            index = index.get()  # CuPy
        ix = self.index(table, index)
        rows = ix.rows
        expected = table.row_shape if ix.scalar else (ix.n, *table.row_shape)
        data = _host_bytes(str(table), table.dtype, values, expected)
        if ix.n == 0:
            return
        # Runs of consecutive rows, in the order given, each one write.
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        starts = [0, *breaks.tolist()]
        ends = [*breaks.tolist(), len(rows)]
        for a, b in zip(starts, ends):
            table.mapped.write(int(rows[a]) * table.row_size, data[a * table.row_size : b * table.row_size])

    def put(self, group_name: Any, attr_name: Any, values: Any, *, writable: bool | None = None) -> Table:
        """Writes ``values`` (NumPy, torch or CuPy, at least one-dimensional: rows along the
        first dimension) to a new file in :attr:`directory` and registers it as a table of
        their type and ``row_shape = values.shape[1:]``. The file is named after the key and
        never replaces one (a suffix ``-1``, ``-2``, ... is added). ``NotImplementedError``
        without a directory."""
        key = self.key(group_name, attr_name)
        if self.directory is None:
            raise NotImplementedError(
                f"cannot put {_describe(key)}: this store writes new tables only into a "
                "directory given at construction (directory=...); register an existing file "
                "with add_table() instead"
            )
        if key in self._tables:
            raise ValueError(
                f"{_describe(key)} is already registered: update it with update_tensor / "
                "write_rows, or remove it first"
            )
        stem = _file_stem(key)
        if len(stem) > _STEM_MAX:
            raise ValueError(
                f"cannot put {_describe(key)}: its file name would be {len(stem)} bytes before the "
                f"suffix; file names take {_STEM_MAX} (shorten the group or attribute name)"
            )
        if not _framework(values):
            values = np.asarray(values)
        name = dtype_name(values.dtype)
        shape = tuple(int(d) for d in values.shape)
        if len(shape) == 0 or math.prod(shape) == 0:
            raise ValueError(f"cannot put {_describe(key)}: a table needs rows of at least one value, got shape {shape}")
        data = _host_bytes(_describe(key), name, values, shape)
        path = self._new_file(stem, data)
        return self.add_table(
            path, group_name=group_name, attr_name=attr_name, dtype=name, row_shape=shape[1:], writable=writable
        )

    def _new_file(self, stem: str, data: np.ndarray) -> str:
        assert self.directory is not None
        for n in range(_SUFFIXES):
            path = os.path.join(self.directory, f"{stem}{'' if n == 0 else f'-{n}'}.bin")
            try:
                f = open(path, "xb")
            except FileExistsError:
                continue
            try:
                with f:
                    f.write(data.data)
            except BaseException as e:
                # A cut table would be found and registered by name later: none is left.
                with contextlib.suppress(OSError):
                    os.unlink(path)
                if isinstance(e, OSError) and e.errno is not None and e.filename is None:
                    raise OSError(e.errno, f"{e.strerror} (a new table's file; removed)", path) from e
                raise
            return path
        raise FileExistsError(f"no free name for {stem}.bin in {self.directory}")


# Files put() tries for one key: "<stem>.bin", then "<stem>-1.bin" ... "<stem>-9999.bin"; the
# longest suffix leaves a stem this many bytes of the 255 a file name takes.
_SUFFIXES = 10_000
_STEM_MAX = 255 - len(f"-{_SUFFIXES - 1}.bin")


def _file_stem(key: Key) -> str:
    """``"<group>.<attr>"``, an edge type's parts joined by ``"__"``; only ``[A-Za-z0-9._-]`` kept
    (one ASCII byte each)."""
    group, attr = key
    groups = [] if group is None else [group] if isinstance(group, str) else list(group)
    name = (f"{'__'.join(groups)}." if groups else "") + attr
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "table"


@dataclass(frozen=True)
class _Raw:
    rows: Any
    scalar: bool


def _outside(table: Table, value: int, position: int) -> str:
    return f"row index {value} at position {position} is outside {table} of {table.rows} rows"


def _check_python_ints(table: Table, values: Sequence[int]) -> None:
    for position, value in enumerate(values):
        if not 0 <= value < table.rows:
            raise IndexError(_outside(table, value, position))


def _sequence(table: Table, seq: list[Any] | tuple[Any, ...] | range) -> np.ndarray:
    """A list, tuple or range of indices as a NumPy array, refusing what NumPy would quietly
    turn into floats or strings (``[1, 2.5]``, ``[1, "2"]``)."""
    if isinstance(seq, range):
        outside = first_outside(seq, table.rows)
        if outside is not None:
            raise IndexError(_outside(table, outside[1], outside[0]))
        return np.arange(seq.start, seq.stop, seq.step, dtype=np.int64)
    if len(seq) == 0:
        return np.zeros(0, dtype=np.int64)  # NumPy would make it float64
    if all(isinstance(v, (bool, np.bool_)) for v in seq):
        return np.array(seq, dtype=bool)
    for position, value in enumerate(seq):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(
                f"{table}: row indices must be integers (or one bool per row), got "
                f"{value!r} ({type(value).__name__}) at position {position}"
            )
    try:
        return np.array(seq, dtype=np.int64)
    except OverflowError:  # beyond int64: outside any table
        _check_python_ints(table, [int(v) for v in seq])
        raise


def _join(parts: list[Any]) -> Any:
    """Index arrays joined into one of the same kind, or None when they are of several kinds."""
    kinds = {_framework(p) for p in parts}
    if kinds == {"numpy"}:
        return np.concatenate(parts)
    if kinds == {"torch"} and len({p.device for p in parts}) == 1:
        import torch

        return torch.cat([p.long() for p in parts])
    if kinds == {"cupy"} and len({p.device.id for p in parts}) == 1:
        import cupy

        return cupy.concatenate([p.astype("int64") for p in parts])
    return None


def _host_bytes(where: str, dtype: str, values: Any, expected: tuple[int, ...]) -> np.ndarray:
    """``values`` — of type ``dtype`` and shape ``expected`` — as their bytes, a flat ``uint8``
    NumPy array in host memory. A list is read as ``dtype``; an array of another type is a
    ``TypeError``, of another shape a ``ValueError``."""
    framework = _framework(values)
    if not framework:
        if dtype == "bfloat16":
            raise TypeError(f"{where} holds bfloat16: give the values as a torch tensor")
        values = np.asarray(values, dtype=dtype)
        framework = "numpy"
    else:
        got = dtype_name(values.dtype)
        if got != dtype:
            raise TypeError(f"{where} holds {dtype}; got {got} values")
    if tuple(values.shape) != expected:
        raise ValueError(f"{where}: expected values of shape {expected}, got {tuple(values.shape)}")
    if framework == "torch":
        import torch

        return values.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy()
    if framework == "cupy":
        values = values.get()
    return np.ascontiguousarray(values).reshape(-1).view(np.uint8)


#: The names :func:`__getattr__` imports on first use, each with the module that holds it.
