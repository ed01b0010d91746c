"""Whole checkpoints in one call: every shard of a safetensors checkpoint read by one pipeline
into one allocation, each tensor a tensor of its own there; a filter, tensor-parallel slices and a
dtype cast on the device. (Loading into a model: :mod:`gpumapio.models`.)

Memory, stated: the device holds the tensors loaded (each placed at most 255 bytes past the
one before it) and, with ``dtype=`` casting, two staging windows of ``staging_bytes / 2``
each; with ``exchange=``, one tensor's slice more while it is swapped; the host holds the
headers, the plan, and gpumap's pinned bounce buffers (at most two of ``bounce_buffer_size``
per I/O thread), never a copy of the checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import operator
import os
import resource
import threading
from typing import Any, Callable, Iterable, Iterator, Union

from gpumapio._checkpoint_files import Catalogue, CheckpointError, Listing, guess_shards, list_shards, read_catalogue
from gpumapio._checkpoint_framework import _Framework
from gpumapio._exchange import block_shape, exchange_for
from gpumapio._native import CuFile, read_files, start_read_files
from gpumapio._sources import is_url, open_source, read_bytes, read_pieces, shown
from gpumapio._pieces import Cast, Run, coalesce, fit_window, merge_casts, split_shape, tensor_slice
from gpumapio._torch_tensors import own_tensors
from gpumapio.safetensors import (
    _ATTEMPTS,
    _DTYPES,
    TensorInfo,
    _Changed,
    _check_unchanged,
    _Columns,
    _stamp_of,
    _numpy_shape_refused,
)
from gpumapio.tensor_parallel import TensorParallel

__all__ = ["CheckpointError", "load_checkpoint"]

Source = Union[str, "os.PathLike[str]"]
Selection = Union[Iterable[str], Callable[[str], bool], None]

# Where a run of tensors starts in the allocation, modulo this, is where it starts in its
# file: the tensors keep the alignment they have in the file (safetensors aligns them).
_ALIGN = 256
# The default staging for casts: two windows of half this.
_STAGING = 256 << 20


@dataclasses.dataclass(slots=True)
class _Placed:
    """One tensor of the load: its source, its shape once sliced, where its bytes go, and the
    pieces that put them there (offsets in the tensor's bytes and in its slice's bytes; None
    for the whole tensor, the common case, spared a piece of its own)."""

    info: TensorInfo
    shard: int
    shape: tuple[int, ...]
    pieces: list[Run] | None
    nbytes: int  # of the slice, in the source dtype
    cast: bool = False
    at: int = 0  # in the allocation, in output bytes
    split: int | None = None  # the dimension a tensor-parallel slice cuts
    swapped: bool = False  # read as the rank's block of rows, its slice swapped for after

    def all_pieces(self) -> list[Run]:
        if self.pieces is None:
            return [Run(0, self.nbytes, 0)] if self.nbytes else []
        return self.pieces


def _select(catalogue: Catalogue, tensors: Selection) -> list[str]:
    # The catalogue lists shard by shard, each in file order: already the order wanted.
    if tensors is None:
        return list(catalogue.where)
    if callable(tensors):
        return [n for n in catalogue.where if tensors(n)]
    names = [tensors] if isinstance(tensors, str) else list(dict.fromkeys(tensors))
    missing = [n for n in names if n not in catalogue.where]
    if missing:
        raise KeyError(f"the checkpoint has no tensor {missing[0]!r}" + (f" ({len(missing)} missing)" if len(missing) > 1 else ""))
    # Shard by shard, in file order: neighbours in a file are neighbours in memory.
    names.sort(key=lambda n: (catalogue.where[n], catalogue.info(n).start))
    return names


def _check_dtypes(fw: "_Framework", path: str, names: list[str], dtypes: list[str]) -> None:
    """Raises ``ValueError`` naming the file and its first tensor (of ``names``, with
    ``dtypes``) that ``fw`` cannot hold: one packed below a byte, or of a dtype the framework
    lacks (NumPy's BF16)."""
    refused = {}
    for d in dict.fromkeys(dtypes):
        if _DTYPES[d][0] % 8:
            refused[d] = "packed below a byte; torch and NumPy have no such dtype (leave it out with tensors=)"
            continue
        try:
            fw.element(d)
        except ValueError as e:
            refused[d] = str(e)
    if refused:
        name, dtype = next((n, d) for n, d in zip(names, dtypes) if d in refused)
        raise ValueError(f"{shown(path)}: tensor {name!r} is {dtype}, {refused[dtype]}")


def _check_numpy_shape(fw: "_Framework", path: str, name: str, shape: tuple[int, ...], element: Any) -> None:
    """Raises :func:`_numpy_shape_refused`'s error where NumPy cannot hold a tensor with no
    elements as its shape says, before anything is read."""
    try:
        fw.numpy.ndarray(shape, element, buffer=b"")
    except ValueError as e:
        raise _numpy_shape_refused(path, name, shape, e) from None


def _plan(catalogue: Catalogue, names: list[str], tp: TensorParallel | None) -> list[_Placed]:
    placed = []
    shards, where = catalogue.shards, catalogue.where
    # A slice depends on the tensor's shape, dtype and split alone, and a model repeats a few
    # shapes layer after layer: each worked out once (its pieces shared, never changed in place).
    slices: dict[tuple[tuple[int, ...], str, int], tuple[int, tuple[int, ...], list[Run], int]] = {}
    for name in names:
        shard = where[name]
        info = shards[shard].tensors[name]
        dim = tp.split_dim(name) if tp is not None else None
        if dim is None:
            placed.append(_Placed(info, shard, info.shape, None, info.end - info.start))
            continue
        assert tp is not None
        key = (info.shape, info.dtype, dim)
        cut = slices.get(key)
        if cut is None:
            split, shape = split_shape(name, info.shape, dim, tp.world_size)
            pieces = tensor_slice(info.shape, _DTYPES[info.dtype][0] // 8, split, tp.rank, tp.world_size)
            cut = slices[key] = (split, shape, pieces, sum(p.nbytes for p in pieces))
        split, shape, pieces, nbytes = cut
        placed.append(_Placed(info, shard, shape, pieces, nbytes, split=split))
    return placed


def _plan_swaps(placed: list[_Placed], tp: TensorParallel) -> None:
    """With an exchange: the uncast tensors whose slice is strided (split past the first
    dimension) and whose rows divide among the ranks are read as the rank's block of rows
    instead, one contiguous piece of as many bytes, and swapped after the reads
    (:mod:`gpumapio._exchange`). Every rank decides the same from the shapes alone, so the
    ranks' swaps pair up."""
    world = tp.world_size
    for p in placed:
        if p.split is None or p.cast or not p.pieces or p.pieces[0].repeat == 1:
            continue
        if p.info.shape[0] % world:
            continue
        block = (p.info.end - p.info.start) // world
        p.pieces = [Run(tp.rank * block, block, 0)]
        p.swapped = True


def _swap(fw: "_Framework", flat: Any, placed: list[_Placed], exchange: Any) -> None:
    """Each swapped tensor's block of rows traded for the rank's slice: the block cut along
    the split dimension into a part per rank, those parts sent, and the parts of the slice
    received from every rank in rank order, which is the slice's own layout."""
    world = exchange.world_size
    for p in placed:
        if not p.swapped or p.split is None:
            continue
        region = flat[p.at : p.at + p.nbytes]
        shape = block_shape(p.info.shape, _DTYPES[p.info.dtype][0] // 8, world)
        exchange.all_to_all(region, fw.parts_in_rank_order(region, shape, p.split, world))


def _lay_out(placed: list[_Placed], out_itemsize: Callable[[_Placed], int]) -> int:
    """Places every tensor in one allocation; returns its size. A whole, uncast tensor that
    follows the one before it in its file follows it in memory too, so their reads merge."""
    at, before = 0, None
    for p in placed:
        info = p.info
        whole = not p.cast and p.nbytes == info.end - info.start
        if whole and before is not None and before.shard == p.shard and before.info.end == info.start:
            p.at = at
            at += p.nbytes  # uncast: as many bytes out as in
        else:
            if whole:
                p.at = -(-at // _ALIGN) * _ALIGN + info.start % _ALIGN
            else:
                p.at = -(-at // _ALIGN) * _ALIGN
            at = p.at + p.nbytes // (_DTYPES[info.dtype][0] // 8) * out_itemsize(p)
        before = p if whole else None
    return at


# A read of the native call: (file slot, file offset, bytes per run, buffer offset, runs, stride).
_Read = tuple[int, int, int, int, int, int]


@dataclasses.dataclass(frozen=True)
class _Open:
    """Shards held open for reading: the readers, their paths, and the stamps of the files
    whose headers were read (None at a URL)."""

    files: list[Any]
    paths: list[str]
    stamps: list[Any]

    def check_unchanged(self) -> None:
        _check_unchanged(self.files, self.stamps, self.paths)


def _open_at_once() -> int:
    """Shards held open at once: a quarter of the soft ``RLIMIT_NOFILE`` (gpumap's I/O threads
    may take another quarter for descriptors of their own), 16 to 256."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 256
    return max(16, min(256, soft // 4))


def _groups(count: int) -> list[range]:
    """``range(count)`` cut into groups of shards that may be open at once."""
    step = _open_at_once()
    return [range(k, min(k + step, count)) for k in range(0, count, step)]


def _read(flat: Any, shards: _Open, pieces: list[_Read]) -> None:
    # Local shards in one native pipeline; objects at URLs as parallel ranged reads each.
    files = shards.files
    local = all(isinstance(f, CuFile) for f in files)
    _check_counts(read_files(flat, files, pieces) if local else read_pieces(flat, files, pieces), pieces, shards)


def _check_counts(counts: list[int], pieces: list[_Read], shards: _Open) -> None:
    for (shard, offset, size, _, count, _), got in zip(pieces, counts):
        if got != size * count:
            # A file rewritten meanwhile is loaded again, as any other change is.
            shards.check_unchanged()
            raise EOFError(
                f"{shown(shards.paths[shard])}: read {got} of {size * count} bytes at {offset} (the file was cut while loading)"
            )


def load_checkpoint(
    source: Source,
    device: Any = "cuda",
    *,
    tensors: Selection = None,
    dtype: Any = None,
    tp: TensorParallel | None = None,
    exchange: Any = None,
    framework: str = "pt",
    staging_bytes: int = _STAGING,
) -> dict[str, Any]:
    """Loads a safetensors checkpoint: ``{name: tensor}``.

    ``source`` is a ``.safetensors`` file, a ``model.safetensors.index.json`` (or any
    ``*.safetensors.index.json``), or a directory holding either; or an ``s3://``, ``gs://``,
    ``az://`` or ``http(s)://`` URL of a file or an index (its shards named relative to it), or
    of a directory ending in ``/`` (an ``s3://``, ``gs://`` or ``az://`` prefix is listed and read as a local
    directory is;
    an ``http(s)://`` one means its ``model.safetensors.index.json``, else its
    ``model.safetensors``). Objects are read with parallel ranged GETs
    (:class:`gpumapio.RemoteFile`, credentials from the AWS environment). Every header and the index
    are checked before any tensor is returned (:class:`CheckpointError` names the file and the
    values: a shard missing, a tensor in two shards or not where the index says, offsets that
    overlap or pass the end of a file); the bytes of every shard are read by one pipeline, all
    shards in flight together, into one allocation, and each tensor lies in it, a tensor of
    its own (no view of it, nor of another tensor: an in-place change autograd records on one
    leaves the others as they were; decision 0040). Loading
    every tensor of local shards as it is (no ``tensors``, ``tp`` or ``dtype``), the reads
    start first, each shard's data section found from its first 8 bytes, and the headers are
    read and checked, and the tensors made, while they run; otherwise the reads follow the
    checks.

    - ``device``, ``framework``: as :func:`gpumapio.load_safetensors` — torch tensors on
      ``device`` (``"cuda"``, ``"cuda:1"``, ``1``, ``"cpu"``), or NumPy arrays in host memory
      with ``framework="numpy"``.
    - ``tensors``: names to load (``KeyError`` for one the checkpoint lacks; a string is one
      name) or a predicate on names; other tensors' bytes are not read.
    - ``dtype``: floating-point tensors are cast to it (a torch dtype, or a NumPy one for
      ``framework="numpy"``) on the device, read once through ``staging_bytes`` of staging;
      integer and bool tensors are left as they are.
    - ``tp``: a :class:`~gpumapio.tensor_parallel.TensorParallel`: tensors its rules match
      are loaded as this rank's slice only, and only the slice's bytes are read.
    - ``exchange``: with ``tp``, when every rank of a group loads at once (one process per
      GPU): ``True`` (the default ``torch.distributed`` group), a process group, or an object
      with ``rank``, ``world_size`` and ``all_to_all(dst, src)``. Tensors split past their
      first dimension (row-parallel layers' column splits), whose slices are a short read per
      row, are then read as a contiguous block of rows per rank — as many bytes — and the
      ranks swap the parts one all-to-all per tensor (NCCL over NVLink between GPUs). Every
      rank must call with the same checkpoint, ``tensors`` and ``dtype``; tensors cast by
      ``dtype`` and those whose rows do not divide among the ranks are read strided as
      without it. Holds one tensor's slice more on the device while it is swapped.

    A local shard replaced (renamed over) or rewritten in place while it is loaded is noticed
    (each open file's inode, size and times, against those when its header was read) and the
    checkpoint loaded again, a few times at most (once only with ``exchange``), then refused
    (:class:`CheckpointError`): no tensor is returned with one version's header over another
    version's bytes. A write already under way when the load looked at a shard, and still
    copying while it reads, changes none of these (the kernel stamps a write as it begins), so
    its bytes may be mixed with the old ones: replace shards by renaming finished files over
    them (``os.replace``) to load one version for certain.
    """
    # Thousands of tensors are thousands of objects made at once: the cyclic collector, run
    # by their number, would walk every object of the process (torch's many) again and again.
    with _collector_paused():
        # A shard replaced or rewritten while it was read: loaded again, a few times at most.
        # Not with an exchange: the other ranks would not swap again.
        attempts = _ATTEMPTS if exchange is None or exchange is False else 1
        for attempt in range(attempts):
            try:
                return _load(source, device, tensors, dtype, tp, exchange, framework, staging_bytes)
            except _Changed as e:
                if attempt + 1 == attempts:
                    raise CheckpointError(_Changed.message(e.path, attempts)) from None
    raise AssertionError("unreachable")


def _load(
    source: Source,
    device: Any,
    tensors: Selection,
    dtype: Any,
    tp: TensorParallel | None,
    exchange: Any,
    framework: str,
    staging_bytes: int,
) -> dict[str, Any]:
    """One attempt of :func:`load_checkpoint`: :class:`_Changed` where a shard changed."""
    fw = _Framework(framework, device, dtype)
    swaps = exchange_for(exchange, tp, fw.name)
    whole = tensors is None and tp is None
    listing = None
    if whole and fw.dtype is None:
        # The shards an index most likely names, read while the index is (decision 0042).
        guess = guess_shards(source)
        if guess is not None and len(guess) <= _open_at_once():
            try:
                return _load_whole_reading_first(fw, guess, None, source)
            except _Misguessed as e:
                listing = e.listing
    if listing is None:
        listing = list_shards(source)
    if whole and fw.dtype is None and not any(map(is_url, listing.paths)):
        return _load_whole(fw, listing, None)
    catalogue = read_catalogue(listing)
    if whole and not _any_cast(fw, catalogue):
        return _load_whole(fw, listing, catalogue)
    names = _select(catalogue, tensors)
    by_shard: dict[int, list[str]] = {}
    for n in names:
        by_shard.setdefault(catalogue.where[n], []).append(n)
    for s, chosen in by_shard.items():
        _check_dtypes(fw, catalogue.shards[s].path, chosen, [catalogue.info(n).dtype for n in chosen])
    placed = _plan(catalogue, names, tp)
    if fw.dtype is not None:
        casts_dtype = {d: fw.casts(d) for d in dict.fromkeys(p.info.dtype for p in placed)}
        for p in placed:
            p.cast = casts_dtype[p.info.dtype]
    if swaps is not None:
        assert tp is not None
        _plan_swaps(placed, tp)
    if fw.name == "numpy":
        for p in placed:
            if not p.nbytes and 0 in p.shape:
                element = fw.dtype if p.cast else fw.element(p.info.dtype)
                _check_numpy_shape(fw, catalogue.shards[p.shard].path, p.info.name, p.shape, element)
    out_dtype_size = fw.itemsize(fw.dtype) if fw.dtype is not None else 0
    total = _lay_out(placed, lambda p: out_dtype_size if p.cast else _DTYPES[p.info.dtype][0] // 8)
    flat = fw.empty(-(-total // 16) * 16)  # whole elements of every dtype
    used = sorted({p.shard for p in placed})
    direct_pieces = _direct_pieces(placed)
    later = _Copies()
    views: list[Any] | None = None
    out: dict[str, Any] = {}
    # Shards are held open a group at a time: all of them, unless they are very many.
    groups = _groups(len(used))
    for k, group in enumerate(groups):
        with _opened(catalogue, used[group.start : group.stop]) as shards:
            slot = {s: i for i, s in enumerate(used[group.start : group.stop])}
            direct: list[_Read] = []
            for shard in slot:
                pieces = direct_pieces.get(shard, [])
                direct.extend((slot[shard], r.src, r.length, r.dst, r.repeat, r.stride) for r in coalesce(pieces))
            with _reading(flat, shards, direct):
                if views is None:
                    # Made while the first reads run: they need only the allocation.
                    views = _views(fw, flat, placed, later)
                    out = _made_while_reading(names, views)
            if swaps is not None and k == len(groups) - 1:
                _swap(fw, flat, placed, swaps)
            casts = [p for p in placed if p.cast and p.shard in slot]
            if casts:
                _cast_through_staging(fw, flat, casts, shards, slot, staging_bytes)
            shards.check_unchanged()
    if views is None:  # no tensor chosen
        views = _views(fw, flat, placed, later)
        out = dict(zip(names, views))
    later.make(fw, flat, names, out)
    return out


@contextlib.contextmanager
def _opened(catalogue: Catalogue, chosen: list[int]) -> Iterator[_Open]:
    """The shards ``chosen`` (by number) opened for the block, and closed after it."""
    files: list[Any] = []
    shards = [catalogue.shards[s] for s in chosen]
    try:
        # A shard's data ends with it (read_header checks so): its last tensor's end is its size.
        for shard in shards:
            files.append(open_source(shard.path, _data_end(shard)))
        yield _Open(files, [s.path for s in shards], [s.stamp for s in shards])
    finally:
        for f in files:
            f.close()


# Whether the collector was on when this thread's load began (then _made_while_reading runs it).
_collector = threading.local()


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, if it was on."""
    was_on = gc.isenabled()
    gc.disable()
    _collector.was_on = was_on
    try:
        yield
    finally:
        _collector.was_on = False
        if was_on:
            gc.enable()


def _made_while_reading(names: list[str], views: list[Any]) -> dict[str, Any]:
    """The load's dict, made while its reads run; and the collector's youngest generation run
    then (if it was on when the load began). The thousands of objects just made are all in
    it, and its first run after the load, once the reads end, would walk them all on the
    caller's time (decision 0042)."""
    out = dict(zip(names, views))
    if getattr(_collector, "was_on", False):
        gc.collect(0)
    return out


@contextlib.contextmanager
def _reading(flat: Any, shards: _Open, reads: list[_Read]) -> Iterator[None]:
    """The block runs while ``reads`` fill ``flat``; on leaving it, every read is done (or, if
    the block raised, stopped) and checked. Local shards are read by one native pipeline that
    runs beside the block; objects at URLs by parallel ranged reads before it."""
    files = shards.files
    if not reads:
        yield
        return
    if not all(isinstance(f, CuFile) for f in files):
        _check_counts(read_pieces(flat, files, reads), reads, shards)
        yield
        return
    pending = start_read_files(flat, files, reads)
    try:
        yield
    except BaseException:
        # The files are closed after this: nothing may still read them.
        pending.cancel()
        try:
            pending.wait()
        except BaseException:
            pass
        raise
    _check_counts(pending.wait(), reads, shards)


def _any_cast(fw: "_Framework", catalogue: Catalogue) -> bool:
    """Whether a tensor of the checkpoint would be cast to the ``dtype`` asked for, or is of a
    dtype the framework lacks (the per-tensor load names the file and the tensor)."""
    if fw.dtype is None:
        return False
    dtypes = {d for shard in catalogue.shards for d in set(shard.columns.dtypes)}

    def casts(d: str) -> bool:
        try:
            return fw.casts(d)
        except ValueError:
            return True

    return any(casts(d) for d in dtypes if _DTYPES[d][0] % 8 == 0)


def _load_whole(fw: "_Framework", listing: Listing, catalogue: Catalogue | None) -> dict[str, Any]:
    """Every tensor, whole and uncast: each shard's data section, which its tensors tile (the
    header is checked so), is one read into its own place in the allocation, 256-aligned as
    its file is; a tensor's place is its offset in the file plus its shard's shift. This is
    what :func:`_lay_out` makes of whole tensors in file order, planned per shard rather than
    per tensor, which matters for checkpoints of thousands of small tensors.

    Without a ``catalogue``, the data sections are found from each file's first 8 bytes (the
    header's length) and its size, and read while the headers are read and checked, and the
    views made; nothing is returned unless the checked headers place the data where it was
    read and were read from the files read, as they were when opened (a file changed in
    between is loaded again from its checked header). Either way, a file found changed after
    its header was read is :class:`_Changed`. Shards too many to hold open at once are read
    a group at a time, after their headers."""
    if catalogue is None and len(listing.paths) > _open_at_once():
        catalogue = read_catalogue(listing)
    if catalogue is not None:
        return _load_whole_checked(fw, catalogue)
    return _load_whole_reading_first(fw, listing.paths, listing)


class _Misguessed(Exception):
    """The files a whole load started reading are not the checkpoint's: its reads stopped, it
    begins again from ``listing`` (None: from a listing not made yet)."""

    def __init__(self, listing: Listing | None) -> None:
        super().__init__()
        self.listing = listing


def _load_whole_reading_first(
    fw: "_Framework", paths: list[str], listing: Listing | None, source: Source | None = None
) -> dict[str, Any]:
    """:func:`_load_whole` without a catalogue: the data sections of the files ``paths`` read
    while their headers are read. ``paths`` are ``listing``'s, or without one a guess of the
    files of ``source`` (:func:`guess_shards`), listed while the reads run. A guess that is not
    the listing's files (in any order) stops the reads and raises :class:`_Misguessed`, as
    does a guessed file that cannot be opened or sized: the load begins again from the
    listing, which names the fault."""
    guessed = listing is None
    files: list[Any] = []
    changed = False  # a file changed between its opening and its header's reading
    try:
        try:
            for path in paths:
                files.append(open_source(path))
            # Taken before anything is read: a change after it shows in the header's stamp.
            opened = [_stamp_of(f) for f in files]
            spans = [_data_span(f) for f in files]
        except (OSError, ValueError):
            if guessed:
                raise _Misguessed(None) from None
            raise
        shifts, reads, size = _whole_layout(spans)
        flat = fw.empty(size)
        names: list[str] = []
        views: list[Any] = []
        out: dict[str, Any] = {}
        later = _Copies()
        with _reading(flat, _Open(files, paths, opened), reads):
            if listing is None:
                assert source is not None
                listing = list_shards(source)
            if listing.paths != paths:
                if sorted(listing.paths) != sorted(paths):
                    raise _Misguessed(listing)
                # The files of the guess in the listing's order, which the load keeps.
                at = {path: k for k, path in enumerate(paths)}
                order = [at[path] for path in listing.paths]
                files = [files[k] for k in order]
                opened = [opened[k] for k in order]
                spans = [spans[k] for k in order]
                shifts = [shifts[k] for k in order]
            # Parsed on this thread alone: the reads keep every core busy, and parse threads
            # started now would wait for one while this thread waits for them (decision 0041).
            catalogue = read_catalogue(listing, parse_threads=1)
            changed = opened != [s.stamp for s in catalogue.shards] or any(
                s.data_span() not in (None, span) for s, span in zip(catalogue.shards, spans)
            )
            if not changed:
                _whole_views_of(fw, flat, catalogue, shifts, later, names, views)
                out = _made_while_reading(names, views)
        if not changed:
            _check_unchanged(files, [s.stamp for s in catalogue.shards], listing.paths)
            later.make(fw, flat, names, out)
    finally:
        for f in files:
            f.close()
    if changed:
        return _load_whole_checked(fw, catalogue)
    return out


def _load_whole_checked(fw: "_Framework", catalogue: Catalogue) -> dict[str, Any]:
    """:func:`_load_whole` after the headers are read: the shards read a group at a time, the
    views made while the first group's reads run."""
    shards = catalogue.shards
    shifts, reads, size = _whole_layout([s.data_span() or (0, 0) for s in shards])
    flat = fw.empty(size)
    names: list[str] = []
    views: list[Any] = []
    out: dict[str, Any] = {}
    later = _Copies()
    for k, group in enumerate(_groups(len(shards))):
        with _opened(catalogue, list(group)) as opened:
            ours = [(shard - group.start, at, n, to, runs, stride) for shard, at, n, to, runs, stride in reads if shard in group]
            with _reading(flat, opened, ours):
                if k == 0:
                    _whole_views_of(fw, flat, catalogue, shifts, later, names, views)
                    out = _made_while_reading(names, views)
            opened.check_unchanged()
    later.make(fw, flat, names, out)
    return out


def _whole_layout(spans: list[tuple[int, int]]) -> tuple[list[int], list[_Read], int]:
    """Where each shard's data section (``spans``: its first and end byte) goes in the
    allocation: per shard, the shift from file offset to allocation offset; the reads; and the
    allocation's size (whole elements of every dtype)."""
    at = 0
    shifts: list[int] = []
    reads: list[_Read] = []
    for k, (first, end) in enumerate(spans):
        base = -(-at // _ALIGN) * _ALIGN + first % _ALIGN
        shifts.append(base - first)
        if end > first:
            reads.append((k, first, end - first, base, 1, 0))
            at = base + end - first
    return shifts, reads, -(-at // 16) * 16


def _whole_views_of(
    fw: "_Framework", flat: Any, catalogue: Catalogue, shifts: list[int], later: _Copies, names: list[str], views: list[Any]
) -> None:
    """Every shard's tensors checked for the framework and placed at their shard's shift,
    appended to ``names`` and ``views``."""
    for shard, shift in zip(catalogue.shards, shifts):
        columns = shard.columns
        _check_dtypes(fw, shard.path, columns.names, columns.dtypes)
        if fw.name == "numpy" and any(map(operator.eq, columns.starts, columns.ends)):
            for name, d, shape in zip(columns.names, columns.dtypes, columns.shapes):
                if 0 in shape:
                    _check_numpy_shape(fw, shard.path, name, shape, fw.element(d))
        names.extend(columns.names)
        views.extend(_whole_views(fw, flat, columns, shift, later, len(views)))


class _Copies:
    """The tensors that cannot be views (torch refuses a view misaligned for its dtype) and
    are copied out of the allocation instead: noted while the views are made, which may be
    before the reads end, and copied once the bytes are in place."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, tuple[Any, ...]]] = []

    def note(self, index: int, *view_args: Any) -> None:
        """View ``index`` of the load's list is ``fw.view(flat, *view_args)``, copied."""
        self.pending.append((index, view_args))

    def make(self, fw: "_Framework", flat: Any, names: list[str], out: dict[str, Any]) -> None:
        """The copies, once the reads are done, in the load's dict ``out`` of ``names``."""
        for index, view_args in self.pending:
            out[names[index]] = fw.view(flat, *view_args)


def _data_span(file: Any) -> tuple[int, int]:
    """Where a safetensors file's data section is, from its first 8 bytes and its size: the
    bytes after the header (none where the length is not one a header could have)."""
    size = file.nbytes()
    prefix = read_bytes(file, 0, 8)
    start = 8 + int.from_bytes(prefix, "little") if len(prefix) == 8 else size
    return (start, size) if start <= size else (size, size)


def _whole_views(fw: "_Framework", flat: Any, columns: _Columns, shift: int, later: _Copies, first: int) -> list[Any]:
    """Each tensor of ``columns`` at its file offset plus ``shift`` in ``flat`` (one torch cannot
    place there, misaligned, noted in ``later`` as tensor ``first + k`` of the load): for
    torch, tensors of their own cut in bulk (:func:`own_tensors`), with what depends on the
    dtype worked out once."""
    if fw.name != "pt":
        elements = {d: fw.element(d) for d in set(columns.dtypes)}
        return [
            fw.view(flat, start + shift, end - start, elements[d], shape)
            for start, end, d, shape in zip(columns.starts, columns.ends, columns.dtypes, columns.shapes)
        ]
    typed = {}
    for d in set(columns.dtypes):
        element = fw.element(d)
        typed[d] = (flat.view(element), element.itemsize)
    views, misaligned = own_tensors(typed, columns.dtypes, columns.shapes, columns.starts, shift)
    for k in misaligned:
        start, d = columns.starts[k], columns.dtypes[k]
        later.note(first + k, start + shift, columns.ends[k] - start, fw.element(d), columns.shapes[k])
    return views


def _data_end(shard: Any) -> int | None:
    """Where the last tensor of a shard ends (the end of its data section): the file's size."""
    span = shard.data_span()
    return span[1] if span else None


def _direct_pieces(placed: list[_Placed]) -> dict[int, list[Run]]:
    """The pieces of the uncast tensors, shard by shard, in the file and the allocation. The
    whole tensors that :func:`_lay_out` put back to back as in their file are one piece
    already, rather than a piece each for :func:`coalesce` to merge."""
    by_shard: dict[int, list[list[int]]] = {}
    # [file offset, length, allocation offset] of the last whole tensor's piece, still growing.
    last: list[int] = [-1, 0, -1]
    for p in placed:
        if p.cast:
            continue
        pieces = by_shard.setdefault(p.shard, [])
        if p.pieces is not None:
            start = p.info.start
            pieces.extend([start + r.src, r.length, p.at + r.dst, r.repeat, r.stride] for r in p.pieces)
        elif p.nbytes:
            if pieces and pieces[-1] is last and last[0] + last[1] == p.info.start and last[2] + last[1] == p.at:
                last[1] += p.nbytes
            else:
                last = [p.info.start, p.nbytes, p.at]
                pieces.append(last)
    return {shard: [Run(*r) for r in pieces] for shard, pieces in by_shard.items()}


def _views(fw: _Framework, flat: Any, placed: list[_Placed], later: _Copies) -> list[Any]:
    """Each tensor as a view of ``flat``, in the order of ``placed`` (those torch cannot view,
    noted in ``later``); what depends only on the dtype looked up once per dtype."""
    elements: dict[tuple[str, bool], tuple[Any, int, int]] = {}
    views: list[Any] = []
    for p in placed:
        kind = (p.info.dtype, p.cast)
        found = elements.get(kind)
        if found is None:
            element = fw.dtype if p.cast else fw.element(p.info.dtype)
            found = elements[kind] = (element, _DTYPES[p.info.dtype][0] // 8, fw.itemsize(element))
        element, in_size, out_size = found
        if fw.copies(p.at, element):
            later.note(len(views), p.at, p.nbytes // in_size * out_size, element, p.shape)
            views.append(None)
        else:
            views.append(fw.view(flat, p.at, p.nbytes // in_size * out_size, element, p.shape))
    return views


def _cast_through_staging(
    fw: _Framework,
    flat: Any,
    casts: list[_Placed],
    shards: _Open,
    slot: dict[int, int],
    staging_bytes: int,
) -> None:
    """Reads the tensors to cast window by window into two staging buffers in turn and casts
    each window into place, the reads of one window overlapping the casts of the other."""
    out_size = fw.itemsize(fw.dtype)
    window = max(staging_bytes // 2, 1 << 16)
    window -= window % 64  # whole elements of every dtype
    buffers = [fw.empty(window), fw.empty(window)]
    fences: list[Any] = [None, None]
    # (file slot, piece in the file, out at, element): each piece fits one window.
    chunks: list[tuple[int, Run, int, Any]] = []
    for p in casts:
        size = _DTYPES[p.info.dtype][0] // 8
        element = fw.element(p.info.dtype)
        for r in coalesce(p.all_pieces()):
            for piece in fit_window(Run(p.info.start + r.src, r.length, r.dst, r.repeat, r.stride), window):
                chunks.append((slot[p.shard], piece, p.at + piece.dst // size * out_size, element))
    turn, used = 0, 0
    reads: list[_Read] = []
    copies: list[Cast] = []

    def flush() -> None:
        nonlocal turn, used, reads, copies
        if not reads:
            return
        if fences[turn] is not None:
            fences[turn].synchronize()
        _read(buffers[turn], shards, reads)
        fw.cast_into(flat, buffers[turn], merge_casts(copies))
        fences[turn] = fw.fence()
        turn, used, reads, copies = 1 - turn, 0, [], []

    for file_slot, piece, out_at, element in chunks:
        # Every chunk starts 16-aligned in staging, so that torch can view it as any dtype.
        start = -(-used // 16) * 16
        if start + piece.nbytes > window:
            flush()
            start = 0
        reads.append((file_slot, piece.src, piece.length, start, piece.repeat, piece.stride))
        copies.append((start, piece.nbytes, out_at, piece.nbytes // element.itemsize * out_size, element))
        used = start + piece.nbytes
    flush()
    for fence in fences:
        if fence is not None:
            fence.synchronize()
