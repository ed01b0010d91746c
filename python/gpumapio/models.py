"""Checkpoints straight into models: :func:`load_into_model` fills a ``torch.nn.Module`` (a
transformers model included) built with its parameters on the ``meta`` device — under
:func:`empty_weights` — from :func:`gpumapio.load_checkpoint`'s views, with no copy."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from gpumapio.checkpoint import Source, load_checkpoint
from gpumapio.tensor_parallel import TensorParallel

__all__ = ["empty_weights", "load_into_model"]


@contextlib.contextmanager
def empty_weights() -> Iterator[None]:
    """Builds modules with their parameters on the ``meta`` device (no memory, no
    initialisation) and their buffers where they would be — so that buffers a checkpoint does
    not hold (rotary embeddings' ``inv_freq``) are computed as usual — for
    :func:`load_into_model`. Every parameter registered inside the block is moved to ``meta``
    as it is registered."""
    import torch

    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param: Any) -> None:
        if param is not None and param.device.type != "meta":
            param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    torch.nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def load_into_model(
    model: Any,
    source: Source,
    device: Any = "cuda",
    *,
    dtype: Any = None,
    tp: TensorParallel | None = None,
    exchange: Any = None,
    strict: bool = True,
) -> Any:
    """Loads ``source`` into ``model`` (a ``torch.nn.Module``, a transformers model included,
    typically built under :func:`empty_weights` or on the ``meta`` device): only the tensors
    the model's state dict names are read, and they become its parameters and buffers
    (``load_state_dict(..., assign=True)``: no copy). Tied weights are tied again
    (transformers' ``tie_weights``). With ``strict``, a tensor of the model that the
    checkpoint lacks, and is not tied to one it has, raises ``KeyError`` naming it. ``tp`` and
    ``exchange``: as :func:`gpumapio.load_checkpoint`. Returns ``model``."""
    wanted = set(model.state_dict().keys())
    state = load_checkpoint(source, device, tensors=lambda n: n in wanted, dtype=dtype, tp=tp, exchange=exchange)
    model.load_state_dict(state, strict=False, assign=True)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    if strict:
        left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
        if left:
            raise KeyError(f"the checkpoint has no tensor for {left[0]!r}" + (f" ({len(left)} left on meta)" if len(left) > 1 else ""))
    return model
