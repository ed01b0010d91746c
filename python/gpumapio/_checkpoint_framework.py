"""The array library a checkpoint's tensors come out in, torch or NumPy: the allocation, the
tensors' views of it, and the casts into it, for :func:`gpumapio.load_checkpoint`."""

from __future__ import annotations

from typing import Any

from gpumapio._torch_tensors import contiguous_strides, own_tensor
from gpumapio.safetensors import _DTYPES, _torch_device


class _Framework:
    """The array library the tensors come out in: allocation, views and casts."""

    def __init__(self, framework: str, device: Any, dtype: Any):
        self.name = "numpy" if framework == "np" else framework
        self.stream = None
        # The allocation last viewed, as each element type: a load that starts again (a shard
        # changed) views a new one.
        self.typed_flat: Any = None
        self.typed: dict[Any, Any] = {}
        if framework == "pt":
            import torch

            self.torch = torch
            self.device = _torch_device(device)
            # "bfloat16" is taken for torch.bfloat16, as transformers takes it.
            self.dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
            if dtype is not None and not isinstance(self.dtype, torch.dtype):
                raise TypeError(f"dtype {dtype!r} is not a torch dtype")
            if self.device.type == "cuda":
                self.stream = torch.cuda.current_stream(self.device)
        elif framework in ("np", "numpy"):
            import numpy

            if device not in (None, "cpu"):
                raise ValueError(f"framework='numpy' loads into host memory; device={device!r} is not 'cpu'")
            self.numpy = numpy
            self.dtype = None
            if dtype is not None:
                try:
                    self.dtype = numpy.dtype(dtype)
                except TypeError:
                    raise TypeError(f"dtype {dtype!r} is not a NumPy dtype") from None
                # Casts are between numbers: a string, a date or an object is not one.
                if self.dtype.kind not in "biufc":
                    raise TypeError(f"dtype {dtype!r} is not a numeric NumPy dtype (bool, integer, float or complex)")
        else:
            raise ValueError(f"framework {framework!r}: expected 'pt' or 'numpy'")

    def element(self, safetensors_dtype: str) -> Any:
        _, torch_name, numpy_name = _DTYPES[safetensors_dtype]
        if self.name == "pt":
            found = getattr(self.torch, torch_name or "", None)
            if found is None:
                raise ValueError(f"this torch has no {torch_name} ({safetensors_dtype})")
            return found
        if numpy_name is None:
            raise ValueError(f"NumPy has no {safetensors_dtype}; use framework='pt'")
        return self.numpy.dtype(numpy_name)

    def casts(self, safetensors_dtype: str) -> bool:
        """Whether a tensor of this dtype is cast: floating-point ones, when a dtype is asked."""
        if self.dtype is None:
            return False
        element = self.element(safetensors_dtype)
        if self.name == "pt":
            return element.is_floating_point and element != self.dtype
        return element.kind == "f" and element != self.dtype

    def itemsize(self, element: Any) -> int:
        return element.itemsize

    def empty(self, size: int) -> Any:
        if self.name == "pt":
            out = self.torch.empty(size, dtype=self.torch.uint8, device=self.device)
            if self.stream is not None:
                # torch may hand out memory that work queued on its stream still uses; gpumap
                # writes from its own streams, so that work must be done first.
                self.stream.synchronize()
            return out
        return self.numpy.empty(size, dtype=self.numpy.uint8)

    def copies(self, at: int, element: Any) -> bool:
        """Whether :meth:`view` copies a tensor at byte ``at`` (torch's views must be aligned
        for their dtype; NumPy's need not be): such a tensor is made only once its bytes are
        in place."""
        return self.name == "pt" and at % element.itemsize != 0

    def view(self, flat: Any, at: int, nbytes: int, element: Any, shape: tuple[int, ...]) -> Any:
        """The tensor of ``shape`` at byte ``at`` of ``flat`` (whose length is a multiple of 16),
        a view; one call per tensor, as checkpoints hold thousands."""
        size = element.itemsize
        if self.name == "numpy":
            if not nbytes:
                # No element: its place may lie past the allocation's end (a shard of empty
                # tensors takes no room), and it reads nothing.
                return self.numpy.ndarray(shape, element, buffer=flat, offset=0)
            if at % size:
                return self.numpy.ndarray(shape, element, buffer=flat, offset=at)
            # A slice of the allocation viewed as the element type: cheaper than a new array
            # on the allocation's buffer.
            return self._typed(flat, element)[at // size : (at + nbytes) // size].reshape(shape)
        if at % size and nbytes:
            return flat[at : at + nbytes].clone().view(element).reshape(shape)  # a view would be misaligned
        typed = self._typed(flat, element)
        # Its own tensor, not a view of the allocation shared with the others (decision 0040).
        return own_tensor(typed, shape, contiguous_strides(shape), at // size)

    def _typed(self, flat: Any, element: Any) -> Any:
        """``flat`` viewed as ``element``, made once per allocation and element type."""
        if self.typed_flat is not flat:
            self.typed_flat, self.typed = flat, {}
        typed = self.typed.get(element)
        if typed is None:
            typed = self.typed[element] = flat.view(element)
        return typed

    def cast_into(self, out: Any, staging: Any, copies: list[tuple[int, int, int, int, Any]]) -> None:
        """``out[dst:dst + n_out] = staging[src:src + n]`` read as ``src_element``, cast."""
        for src, length, dst, out_len, element in copies:
            source = staging[src : src + length].view(element)
            if self.name == "pt":
                out[dst : dst + out_len].view(self.dtype).copy_(source)
            else:
                out[dst : dst + out_len].view(self.dtype)[...] = source

    def parts_in_rank_order(self, region: Any, shape: tuple[int, ...], dim: int, parts: int) -> Any:
        """The bytes of ``region`` (a C-ordered array of ``shape``, bytes along its last
        dimension) cut into ``parts`` equal parts along ``dim``, each made contiguous, one
        after another: a new flat byte array."""
        cut = shape[:dim] + (parts, shape[dim] // parts) + shape[dim + 1 :]
        if self.name == "pt":
            return region.view(shape).reshape(cut).movedim(dim, 0).contiguous().view(-1)
        moved = self.numpy.moveaxis(region.reshape(shape).reshape(cut), dim, 0)
        return self.numpy.ascontiguousarray(moved).reshape(-1)

    def fence(self) -> Any:
        """A mark after the casts queued so far, to wait on before their staging is reused."""
        if self.stream is None:
            return None
        event = self.torch.cuda.Event()
        event.record(self.stream)
        return event
