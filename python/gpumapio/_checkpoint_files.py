"""Which files make a checkpoint, and which tensor lives where: a single safetensors file, a
directory, or a ``model.safetensors.index.json``, local or at a URL — every header and the index
checked before anything is allocated or read."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from typing import Any

from gpumapio._native import RemotePrefix, plain_headers, plain_index, plain_index_files
from gpumapio._sources import is_bucket_url, is_url, join, open_source, read_bytes, shown, url_path
from gpumapio.safetensors import (
    Stamp,
    TensorInfo,
    _all_of_type,
    _brief,
    _Columns,
    _object,
    _open_regular,
    _parse_columns,
    _read_header_stamped,
)

__all__ = [
    "Catalogue",
    "CheckpointError",
    "Listing",
    "Shard",
    "guess_shards",
    "list_shards",
    "open_catalogue",
    "read_catalogue",
]

# An index maps names to file names; one past this size is not an index (safetensors' own
# header limit, used again).
_MAX_INDEX = 100_000_000
_INDEX_SUFFIX = ".safetensors.index.json"
# The shards of an index ``P.safetensors.index.json`` as transformers and diffusers name them:
# ``P-00001-of-00004.safetensors`` and on (groups: the prefix, the number, the count).
_SHARD_NAME = re.compile(r"(.+)-(\d{5})-of-(\d{5})\.safetensors")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is: a malformed index or header, a shard
    missing, a tensor in two shards or not where the index says; the message names the file
    and the values at fault."""


@dataclasses.dataclass(frozen=True)
class Shard:
    """One safetensors file of a checkpoint and its tensors (file offsets absolute), as
    columns in file order; ``tensors`` gives them as :class:`TensorInfo` by name, made on first
    use (a whole load of thousands of tensors needs only the columns). ``stamp``: the file's as
    its header was read (None at a URL), for the loaders to check that the file they read is
    that one still."""

    path: str
    columns: _Columns
    stamp: Stamp | None = dataclasses.field(default=None, compare=False, repr=False)

    @functools.cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        return self.columns.infos()

    def data_span(self) -> tuple[int, int] | None:
        """Where its data section is — from its first tensor's start to its last one's end,
        as its tensors tile it — or None with no tensor to say so."""
        c = self.columns
        return (c.starts[0], c.ends[-1]) if c.names else None


@dataclasses.dataclass(frozen=True)
class Catalogue:
    """A checkpoint's shards and, for each tensor, the index of the shard holding it
    (``where``, made on first use: a whole load needs only the shards)."""

    shards: list[Shard]
    metadata: dict[str, Any] | None

    @functools.cached_property
    def where(self) -> dict[str, int]:
        # Every name is in one shard only: read_catalogue checks so before making one.
        where: dict[str, int] = {}
        for i, shard in enumerate(self.shards):
            where.update(dict.fromkeys(shard.columns.names, i))
        return where

    def info(self, name: str) -> TensorInfo:
        return self.shards[self.where[name]].tensors[name]


@dataclasses.dataclass(frozen=True)
class Listing:
    """Which files make a checkpoint, before their headers are read: the shards' paths, and
    the index they come from (its path and bytes), if any. The index's ``weight_map`` and
    ``metadata`` are read from its bytes, and checked, on first use: a whole load starts
    reading the shards before (:class:`CheckpointError` then, for an index found faulty)."""

    paths: list[str]
    index_path: str | None = None
    index_bytes: bytes | None = dataclasses.field(default=None, repr=False)
    # The file names the index gives its shards, each once (None where not found so).
    index_files: list[str] | None = dataclasses.field(default=None, repr=False)

    @functools.cached_property
    def _index(self) -> tuple[dict[str, str] | None, Any]:
        if self.index_path is None or self.index_bytes is None:
            return None, None
        weight_map, metadata, paths = _parse_index(self.index_path, self.index_bytes)
        if paths != self.paths:
            # The quick scan of the index and its full reading disagree: a reader's bug.
            raise CheckpointError(f"{shown(self.index_path)}: the index names shards {paths}, first read as {self.paths}")
        return weight_map, metadata

    @property
    def weight_map(self) -> dict[str, str] | None:
        return self._index[0]

    @property
    def metadata(self) -> Any:
        return self._index[1]


def open_catalogue(source: str | os.PathLike[str]) -> Catalogue:
    """The catalogue of ``source``: :func:`read_catalogue` of :func:`list_shards`."""
    return read_catalogue(list_shards(source))


def list_shards(source: str | os.PathLike[str]) -> Listing:
    """The files of ``source``: a ``.safetensors`` file, an index JSON, or a directory (its
    ``model.safetensors.index.json``, else its one ``*.safetensors.index.json``, else every
    ``*.safetensors`` file in it). A URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``) names a
    file or an index; an ``s3://``, ``gs://`` or ``az://`` URL ending in ``/`` is a prefix, listed and read as a
    directory is; an
    ``http(s)://`` URL ending in ``/`` is read as its ``model.safetensors.index.json`` or else
    its ``model.safetensors`` (a web server's listing is not read). An index is read and
    checked here; the shards' headers are not."""
    path = os.fspath(source)
    if is_url(path):
        return _from_url(path)
    if os.path.isdir(path):
        return _from_directory(path, os.listdir(path), lambda name: os.path.join(path, name))
    if path.endswith(".json"):
        return _from_index(path)
    return Listing([path])


def _indices(names: list[str]) -> list[str]:
    """The index files among a directory's ``names`` (sorted) that could be its checkpoint's:
    ``model.safetensors.index.json`` alone where it is there, else every ``*.safetensors.index.json``."""
    indices = [n for n in names if n.endswith(_INDEX_SUFFIX)]
    return ["model.safetensors.index.json"] if "model.safetensors.index.json" in indices else indices


def _from_directory(where: str, names: list[str], path_of: Any) -> Listing:
    """The catalogue of a directory (or a bucket's prefix) ``where`` holding the files ``names``:
    its ``model.safetensors.index.json``, else its one index, else every ``*.safetensors``."""
    names = sorted(names)
    indices = _indices(names)
    if len(indices) > 1:
        raise CheckpointError(f"{shown(where)}: {len(indices)} index files ({', '.join(indices)}); name the one to load")
    if indices:
        return _from_index(path_of(indices[0]))
    files = [path_of(n) for n in names if n.endswith(".safetensors")]
    if not files:
        raise CheckpointError(f"{shown(where)}: no *.safetensors file and no *{_INDEX_SUFFIX} in this directory")
    return Listing(files)


def guess_shards(source: str | os.PathLike[str]) -> list[str] | None:
    """The shards :func:`list_shards` most likely finds for a local index (``source``, or the
    one of the directory ``source``), from the file names beside it alone, before the index is
    read: ``P-00001-of-0000N.safetensors`` to ``N`` for an index ``P.safetensors.index.json``,
    all there and of one ``N`` (as transformers and diffusers write them); paths spelled as the
    listing spells them, in number order. None where there is no such index or no such set of
    files. A guess only: a whole load starts its reads from it, and checks it against the
    listing, made meanwhile."""
    path = os.fspath(source)
    if is_url(path):
        return None
    try:
        if path.endswith(_INDEX_SUFFIX):
            index_path, names = path, os.listdir(os.path.dirname(path) or ".")
        elif os.path.isdir(path):
            names = sorted(os.listdir(path))
            indices = _indices(names)
            if len(indices) != 1:
                return None
            index_path = os.path.join(path, indices[0])
        else:
            return None
    except OSError:
        return None  # the listing names what is wrong
    prefix = os.path.basename(index_path)[: -len(_INDEX_SUFFIX)]
    numbers: dict[str, set[int]] = {}
    for name in names:
        match = _SHARD_NAME.fullmatch(name)
        if match and match[1] == prefix:
            numbers.setdefault(match[3], set()).add(int(match[2]))
    if len(numbers) != 1:
        return None
    [(count, found)] = numbers.items()
    if found != set(range(1, int(count) + 1)):
        return None
    return [shard_path(index_path, f"{prefix}-{k:05d}-of-{count}.safetensors") for k in range(1, int(count) + 1)]


def _from_url(url: str) -> Listing:
    if not url_path(url).endswith("/"):
        return _from_index(url) if url_path(url).endswith(".json") else Listing([url])
    if is_bucket_url(url):
        prefix = RemotePrefix(url)
        objects, _ = prefix.list_dir("")
        return _from_directory(prefix.url, [name for name, _ in objects], lambda name: prefix.url + name)
    tried = []
    for name in ("model.safetensors.index.json", "model.safetensors"):
        candidate = join(url, name)
        try:
            with open_source(candidate):
                pass
        except FileNotFoundError:
            tried.append(name)
            continue
        return _from_url(candidate)
    raise CheckpointError(f"{shown(url)}: neither {' nor '.join(tried)} is there; name the file or index to load")


def _read_index(index_path: str) -> bytes:
    """The index's bytes, at most one past the limit."""
    if is_url(index_path):
        with open_source(index_path) as f:
            return read_bytes(f, 0, min(f.nbytes(), _MAX_INDEX + 1))
    # As a shard is: a FIFO, device or directory refused, named, rather than waited on.
    fd, st = _open_regular(index_path)
    with open(fd, "rb") as f:
        # As many bytes as it has, and one more to see it grow: a read of the limit maps and
        # unmaps that much memory, and an unmap stops every thread of the process (0042).
        raw = f.read(min(st.st_size, _MAX_INDEX) + 1)
        if st.st_size < len(raw) <= _MAX_INDEX:
            raw += f.read(_MAX_INDEX + 1 - len(raw))
        return raw


def _exists(path: str) -> bool:
    if not is_url(path):
        return os.path.isfile(path)
    try:
        with open_source(path):
            return True
    except FileNotFoundError:
        return False


def _inside(shard: str) -> bool:
    """Whether ``shard`` names a file in the index's directory (or below it)."""
    parts = shard.replace("\\", "/").split("/")
    return bool(shard) and not (os.path.isabs(shard) or ".." in parts or "://" in shard)


def _check_shard_names(index_path: str, weight_map: dict[str, Any]) -> None:
    """Raises for the first tensor of ``weight_map`` whose shard is not a file name inside the
    index's directory."""
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise CheckpointError(f"{shown(index_path)}: tensor {name!r} maps to {_brief(shard)}, not a shard file name")
        if not _inside(shard):
            raise CheckpointError(
                f"{shown(index_path)}: tensor {name!r} maps to {shard!r}, outside the index's directory "
                f"(shards are named relative to it, with no '..')"
            )


def _from_index(index_path: str) -> Listing:
    raw = _read_index(index_path)
    if len(raw) > _MAX_INDEX:
        raise CheckpointError(f"{shown(index_path)}: more than {_MAX_INDEX} bytes; not a checkpoint index")
    # The shards of an index as transformers writes one, found without an object per tensor;
    # the weight map is read when first asked for. Anything else is read and checked here.
    files = plain_index_files(raw)
    if files is not None and all(map(_inside, files)):
        paths = list(dict.fromkeys(shard_path(index_path, f) for f in files))
        if all(map(_exists, paths)):
            return Listing(paths, index_path, raw, files)
    weight_map, metadata, paths = _parse_index(index_path, raw)
    listing = Listing(paths, index_path, raw)
    listing.__dict__["_index"] = (weight_map, metadata)  # read once: kept
    return listing


def _parse_index(index_path: str, raw: bytes) -> tuple[dict[str, str], Any, list[str]]:
    """The index's weight map, metadata and shard paths, checked: malformed JSON, a shard
    named outside the index's directory, or one that is not there is a :class:`CheckpointError`."""
    # An index as transformers writes one in one native pass; any other through json.
    index = plain_index(raw)
    if index is None:
        try:
            index = json.loads(raw.decode("utf-8"), object_pairs_hook=_object)
        except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
            raise CheckpointError(f"{shown(index_path)}: not a JSON index: {e}") from None
        except RecursionError:
            raise CheckpointError(f"{shown(index_path)}: not a JSON index: nested too deep for Python's JSON parser") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{shown(index_path)}: no \"weight_map\" object mapping tensor names to shard files")
    # Thousands of tensors name a few shards: each shard name checked once, the tensors
    # gone through one by one only to name the first at fault.
    if not (_all_of_type(weight_map.values(), str) and all(map(_inside, set(weight_map.values())))):
        _check_shard_names(index_path, weight_map)
    # One file under two spellings ("a.safetensors", "./a.safetensors") is one shard.
    path_of = {shard: shard_path(index_path, shard) for shard in set(weight_map.values())}
    paths = list(dict.fromkeys(map(path_of.__getitem__, weight_map.values())))
    missing = [p for p in paths if not _exists(p)]
    if missing:
        named = [n for n, s in weight_map.items() if path_of[s] == missing[0]]
        base = join(index_path, "") if is_url(index_path) else os.path.dirname(index_path)
        raise CheckpointError(
            f"{shown(index_path)}: shard {weight_map[named[0]]!r} (holding {len(named)} tensors, {named[0]!r} "
            f"first) is not a file in {shown(base) or '.'}"
            + (f"; {len(missing) - 1} more missing" if len(missing) > 1 else "")
        )
    return weight_map, index.get("metadata"), paths


def _shards_of(
    paths: list[str], read: list[tuple[str, int, int, bytes]], plain: list[Any], stamps: list[Stamp | None]
) -> tuple[list[Shard], Any]:
    """The shards from their headers' bytes and native columns (None: read by the Python
    reader, which names what is wrong: :class:`CheckpointError`), and the last one's metadata."""
    shards: list[Shard] = []
    file_metadata = None
    for path, (name, size, n, raw), columns, stamp in zip(paths, read, plain, stamps):
        if columns is None:
            try:
                parsed, file_metadata = _parse_columns(name, size, n, raw)
            except ValueError as e:
                raise CheckpointError(str(e)) from None
        else:
            *lists, file_metadata = columns
            parsed = _Columns(*lists)
        shards.append(Shard(path, parsed, stamp))
    return shards, file_metadata


def shard_path(index_path: str, shard: str) -> str:
    """The path (or URL) of the shard an index at ``index_path`` names ``shard``, spelled one
    way for every spelling of it."""
    path = join(index_path, shard)
    return path if is_url(path) else os.path.normpath(path)


def read_catalogue(listing: Listing, parse_threads: int | None = None) -> Catalogue:
    """Every shard's header read and checked, and checked against the index if there is one
    (:class:`CheckpointError` names the file and the values at fault); the headers parsed on
    at most ``parse_threads`` threads (1: the calling one alone; by default several)."""
    paths, index_path = listing.paths, listing.index_path
    read: list[tuple[str, int, int, bytes]] = []
    stamps: list[Stamp | None] = []
    for k, path in enumerate(paths):
        try:
            header, stamp = _read_header_stamped(path)
            read.append(header)
            stamps.append(stamp)
        except (ValueError, OSError) as e:
            # A fault of a shard before it comes first: those are read and checked first.
            _shards_of(paths[:k], read, [None] * k, stamps)
            if isinstance(e, ValueError):
                raise CheckpointError(str(e)) from None
            raise
    number = {path: i for i, path in enumerate(paths)}
    index = None
    if index_path is not None and listing.index_bytes is not None and listing.index_files is not None:
        # An index as transformers writes one (its files found by the quick scan) is checked
        # against the headers natively, with no object per tensor; any other, or one that
        # does not agree, as below (which names what is wrong).
        files = listing.index_files
        shard_of = {f: number[p] for f in files if (p := shard_path(index_path, f)) in number}
        index = (listing.index_bytes, shard_of)
    # Every header read in one native call, on several threads (or this one, as asked), the
    # index checked beside them.
    plain, agreed = plain_headers([(raw, 8 + n, size) for _, size, n, raw in read], index, parse_threads)
    shards, file_metadata = _shards_of(paths, read, plain, stamps)
    if agreed is not None:
        return Catalogue(shards, _metadata(agreed[0], file_metadata, len(paths)))
    where: dict[str, int] = {}
    for i, shard in enumerate(shards):
        names = shard.columns.names
        if not where.keys().isdisjoint(names):
            name = next(n for n in names if n in where)
            raise CheckpointError(f"tensor {name!r} is in two shards: {shown(shards[where[name]].path)} and {shown(shard.path)}")
        where.update(dict.fromkeys(names, i))
    weight_map = listing.weight_map
    if weight_map is not None:
        # Each shard name of the index once, as the index of the file it names.
        named = {file: number.get(shard_path(index_path or "", file)) for file in set(weight_map.values())}
        # Compared all at once; gone through one by one only to name the first at fault.
        if None not in named.values() and list(map(where.get, weight_map)) == list(map(named.__getitem__, weight_map.values())):
            return _catalogue(shards, where, _metadata(listing.metadata, file_metadata, len(paths)))
        for name, file in weight_map.items():
            got = where.get(name)
            if got is None or got != named[file]:
                found = "in no shard" if got is None else f"in {shown(shards[got].path)}"
                raise CheckpointError(f"{shown(index_path)}: tensor {name!r} is mapped to {file!r} but is {found}")
    return _catalogue(shards, where, _metadata(listing.metadata, file_metadata, len(paths)))


def _metadata(index_metadata: Any, file_metadata: Any, shards: int) -> dict[str, Any] | None:
    """A catalogue's metadata: its index's; a single file's own where its index has none."""
    metadata = file_metadata if index_metadata is None and shards == 1 else index_metadata
    return metadata if isinstance(metadata, dict) else None


def _catalogue(shards: list[Shard], where: dict[str, int], metadata: dict[str, Any] | None) -> Catalogue:
    catalogue = Catalogue(shards, metadata)
    catalogue.__dict__["where"] = where  # made already, while checking
    return catalogue
