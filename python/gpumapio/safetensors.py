"""safetensors files into GPU tensors: one parallel read into one device allocation, and
zero-copy tensor views into it (the approach of fastsafetensors).

The format: an 8-byte little-endian header length ``n``, ``n`` bytes of JSON naming each
tensor's ``dtype``, ``shape`` and ``data_offsets`` (relative to the end of the header), and the
tensors' bytes. The header is parsed here, checked entry by entry, and the data section (or,
with ``tensors=``, just the named tensors) is read straight into device memory.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from typing import Any, Iterable

from gpumapio._native import CuFile

__all__ = ["TensorInfo", "load_safetensors", "read_header"]

# safetensors dtype -> (bytes per element, torch dtype name, NumPy dtype or None)
_DTYPES: dict[str, tuple[int, str, str | None]] = {
    "F64": (8, "float64", "<f8"),
    "F32": (4, "float32", "<f4"),
    "F16": (2, "float16", "<f2"),
    "BF16": (2, "bfloat16", None),
    "I64": (8, "int64", "<i8"),
    "I32": (4, "int32", "<i4"),
    "I16": (2, "int16", "<i2"),
    "I8": (1, "int8", "i1"),
    "U64": (8, "uint64", "<u8"),
    "U32": (4, "uint32", "<u4"),
    "U16": (2, "uint16", "<u2"),
    "U8": (1, "uint8", "u1"),
    "BOOL": (1, "bool", "?"),
    "F8_E4M3": (1, "float8_e4m3fn", None),
    "F8_E5M2": (1, "float8_e5m2", None),
    "C64": (8, "complex64", "<c8"),
}

# safetensors' own limit on the header (100 MB).
_MAX_HEADER = 100_000_000
# Where each tensor starts in the device allocation when only some are loaded.
_ALIGN = 256


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file; ``start`` / ``end`` are absolute file offsets."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, TensorInfo], dict[str, str] | None]:
    """The tensors of a safetensors file, in file order, and its ``__metadata__``. Raises
    ``ValueError`` naming the problem for a malformed file."""
    name = os.fspath(path)
    with open(path, "rb") as f:
        file_size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{name}: {file_size} bytes is too short for a safetensors file")
        (n,) = struct.unpack("<Q", prefix)
        if n > _MAX_HEADER or 8 + n > file_size:
            raise ValueError(f"{name}: header length {n} does not fit the file of {file_size} bytes")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{name}: the header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{name}: the header is not a JSON object")
    data_start = 8 + n
    metadata = header.pop("__metadata__", None)
    infos = []
    for key, entry in header.items():
        try:
            dtype = entry["dtype"]
            shape = tuple(entry["shape"])
            begin, end = entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{name}: tensor {key!r}: needs dtype, shape and data_offsets") from None
        if dtype not in _DTYPES:
            raise ValueError(f"{name}: tensor {key!r}: dtype {dtype!r} is not supported")
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"{name}: tensor {key!r}: shape {list(shape)} is not a list of sizes")
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
            raise ValueError(f"{name}: tensor {key!r}: data_offsets {[begin, end]} are not a range")
        expected = math.prod(shape) * _DTYPES[dtype][0]
        if end - begin != expected:
            raise ValueError(
                f"{name}: tensor {key!r}: {end - begin} bytes for a {dtype} tensor of shape "
                f"{list(shape)} ({expected} bytes)"
            )
        if data_start + end > file_size:
            raise ValueError(
                f"{name}: tensor {key!r}: bytes {data_start + begin}..{data_start + end} are past "
                f"the end of the file ({file_size} bytes)"
            )
        infos.append(TensorInfo(key, dtype, shape, data_start + begin, data_start + end))
    infos.sort(key=lambda t: (t.start, t.end))
    return {t.name: t for t in infos}, metadata


def _torch_device(device: Any):
    import torch

    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if isinstance(device, int):
        return torch.device("cuda", device)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def load_safetensors(
    path: str | os.PathLike[str],
    device: Any = "cuda",
    *,
    tensors: Iterable[str] | None = None,
    framework: str = "pt",
) -> dict[str, Any]:
    """Loads a safetensors file: ``{name: tensor}``.

    ``framework="pt"`` (default) gives ``torch.Tensor`` on ``device`` (``"cuda"``,
    ``"cuda:1"``, ``1``, a ``torch.device``, or ``"cpu"``); ``framework="numpy"`` gives NumPy
    arrays in host memory (no bfloat16 or float8 there). All tensors are views of one
    allocation, filled by one parallel read of the file's data section; loading only
    ``tensors`` (names; ``KeyError`` for one the file lacks) reads just their bytes, each into
    its own aligned place of one allocation. A tensor whose offset in the file is not a
    multiple of its element size (which safetensors' own writers never produce) is copied.
    """
    infos, _ = read_header(path)
    if tensors is not None:
        wanted = list(dict.fromkeys(tensors))
        missing = [t for t in wanted if t not in infos]
        if missing:
            raise KeyError(f"{os.fspath(path)} has no tensor {missing[0]!r}")
        chosen = sorted((infos[t] for t in wanted), key=lambda t: t.start)
    else:
        chosen = list(infos.values())

    # Where each tensor lands in the allocation, and the reads that put it there.
    if tensors is None:
        base = chosen[0].start if chosen else 0
        total = (chosen[-1].end - base) if chosen else 0
        places = {t.name: t.start - base for t in chosen}
        reads = [(0, total, base)] if total else []
    else:
        places, reads, total = {}, [], 0
        for t in chosen:
            total = -(-total // _ALIGN) * _ALIGN
            places[t.name] = total
            if t.nbytes:
                reads.append((total, t.nbytes, t.start))
            total += t.nbytes

    flat: Any  # one uint8 array: a torch tensor or a NumPy array
    if framework == "pt":
        import torch

        where = _torch_device(device)
        flat = torch.empty(total, dtype=torch.uint8, device=where)
    elif framework in ("np", "numpy"):
        import numpy

        if device not in (None, "cpu"):
            raise ValueError(f"framework='numpy' loads into host memory; device={device!r} is not 'cpu'")
        flat = numpy.empty(total, dtype=numpy.uint8)
    else:
        raise ValueError(f"framework {framework!r}: expected 'pt' or 'numpy'")

    with CuFile(path, "r") as f:
        if len(reads) == 1:
            at, size, offset = reads[0]
            got = f.read(flat[at : at + size], size, offset)
            if got != size:
                raise EOFError(f"{os.fspath(path)}: read {got} of {size} bytes at {offset}")
        else:
            futures = [(f.pread(flat[at : at + size], size, offset), size, offset) for at, size, offset in reads]
            for future, size, offset in futures:
                got = future.get()
                if got != size:
                    raise EOFError(f"{os.fspath(path)}: read {got} of {size} bytes at {offset}")

    out: dict[str, Any] = {}
    for t in chosen:
        itemsize, torch_name, numpy_name = _DTYPES[t.dtype]
        at = places[t.name]
        piece = flat[at : at + t.nbytes]
        if framework == "pt":
            dtype = getattr(torch, torch_name, None)
            if dtype is None:
                raise ValueError(f"tensor {t.name!r}: this torch has no {torch_name}")
            if at % itemsize:
                piece = piece.clone()  # a view would be misaligned
            out[t.name] = piece.view(dtype).reshape(t.shape)
        else:
            if numpy_name is None:
                raise ValueError(f"tensor {t.name!r}: NumPy has no {t.dtype}; use framework='pt'")
            out[t.name] = piece.view(numpy_name).reshape(t.shape)
    return out
