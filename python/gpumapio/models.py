"""Checkpoints straight into models: :func:`load_into_model` fills a ``torch.nn.Module`` (a
transformers model included) built with its parameters on the ``meta`` device — under
:func:`empty_weights` — from :func:`gpumapio.load_checkpoint`'s views, with no copy."""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any, Iterator

from gpumapio.checkpoint import Source, load_checkpoint
from gpumapio.tensor_parallel import TensorParallel

__all__ = ["empty_weights", "load_into_model"]


# empty_weights() blocks entered by each thread, still open: a parameter is moved to meta as
# it is registered where its thread is in one.
_inside = threading.local()
_install = threading.Lock()


def _register_on_meta(original: Any) -> Any:
    """``register_parameter`` that moves the parameter to ``meta`` in a thread inside an
    :func:`empty_weights` block, and is ``original`` elsewhere."""

    def register(module: Any, name: str, param: Any) -> None:
        inside: int = getattr(_inside, "depth", 0)
        if param is not None and inside and param.device.type != "meta" and not _lazy(param):
            param = _on_meta(name, param)
        original(module, name, param)

    register._gpumapio_meta = True  # type: ignore[attr-defined]
    return register


def _lazy(param: Any) -> bool:
    """Whether ``param`` is a lazy module's ``UninitializedParameter``: it holds no memory
    yet, and its class takes no tensor to be made from."""
    from torch.nn.parameter import UninitializedTensorMixin

    return isinstance(param, UninitializedTensorMixin)


def _on_meta(name: str, param: Any) -> Any:
    """``param`` moved to ``meta``, of its own class and with the attributes set on it (a
    ``Parameter`` subclass may carry its sharding or quantisation there)."""
    try:
        moved = type(param)(param.to("meta"), requires_grad=param.requires_grad)
    except TypeError as e:
        raise TypeError(
            f"empty_weights cannot move parameter {name!r} to the meta device: its class "
            f"{type(param).__qualname__} is not made as Parameter(data, requires_grad) ({e})"
        ) from None
    moved.__dict__.update(param.__dict__)
    return moved


@contextlib.contextmanager
def empty_weights() -> Iterator[None]:
    """Builds modules with their parameters on the ``meta`` device (no memory, no
    initialisation) and their buffers where they would be — so that buffers a checkpoint does
    not hold (rotary embeddings' ``inv_freq``) are computed as usual — for
    :func:`load_into_model`. Every parameter registered inside the block, by the thread that
    entered it, is moved to ``meta`` as it is registered; other threads build as usual.

    Blocks nest, and may overlap across threads in any order: the first one wraps
    ``torch.nn.Module.register_parameter`` once, for good (a wrapper that is the original
    outside any block, and is installed again if something else restored the original), so
    that no block's exit can undo another's or leave the patch on."""
    import torch

    with _install:
        current = torch.nn.Module.register_parameter
        if not getattr(current, "_gpumapio_meta", False):
            torch.nn.Module.register_parameter = _register_on_meta(current)  # type: ignore[method-assign]
    _inside.depth = getattr(_inside, "depth", 0) + 1
    try:
        yield
    finally:
        _inside.depth -= 1


def _tied_groups(model: Any) -> list[tuple[list[str], Any]]:
    """The names under which one tensor (the same ``Parameter`` or buffer object, as weights
    tied by assignment are) is registered more than once, in the model's order, and that
    tensor: a checkpoint saved by ``safetensors.torch.save_model`` holds it under one name."""
    groups: dict[int, tuple[list[str], Any]] = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if tensor is not None:
            groups.setdefault(id(tensor), ([], tensor))[0].append(name)
    return [(names, tensor) for names, tensor in groups.values() if len(names) > 1]


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
    (transformers' ``tie_weights``), and so are tensors the model registers under several names
    (one ``Parameter`` set as two modules' weights): the checkpoint needs one of the names
    (``safetensors.torch.save_model`` keeps one), and every name gets the same ``Parameter``
    of it. With ``strict``, a tensor of the model that the checkpoint lacks, and is not tied
    to one it has, raises ``KeyError`` naming it; without, it is left on ``meta`` with a
    warning naming it. ``tp`` and ``exchange``: as :func:`gpumapio.load_checkpoint`. Returns
    ``model``."""
    import torch

    wanted = set(model.state_dict().keys())
    ties = _tied_groups(model)
    state = load_checkpoint(source, device, tensors=lambda n: n in wanted, dtype=dtype, tp=tp, exchange=exchange)
    for group, before in ties:
        found = next((n for n in group if n in state), None)
        if found is None:
            continue
        # One object for every name: assign=True sets a Parameter given as it is, where it
        # would wrap a tensor in a new Parameter per name (and so untie them).
        tensor = state[found]
        if isinstance(before, torch.nn.Parameter) and not isinstance(tensor, torch.nn.Parameter):
            tensor = torch.nn.Parameter(tensor, requires_grad=before.requires_grad)
        for name in group:
            state[name] = tensor
    model.load_state_dict(state, strict=False, assign=True)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    left, on_meta = _not_loaded(model, state, wanted)
    if left:
        message = f"the checkpoint has no tensor for {left[0]!r}" + (f" ({len(left)} not loaded)" if len(left) > 1 else "")
        if strict:
            raise KeyError(message)
        where = "on the meta device" if on_meta else "as the model had it"
        warnings.warn(f"{message}; left {where} (strict=False)", stacklevel=2)
    return model


def _not_loaded(model: Any, state: dict[str, Any], wanted: set[str]) -> tuple[list[str], bool]:
    """The model's tensors the load did not fill: those still on ``meta``, and those of its
    state dict the checkpoint lacked that do not share a loaded tensor's memory (as weights
    tied by ``tie_weights`` after the load do) — the model's own values, where it was not
    built on ``meta``; and whether every one of them is on ``meta``."""
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    meta_count = len(left)
    loaded = {t.untyped_storage().data_ptr() for t in state.values() if t.device.type != "meta"}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if name in wanted and name not in state and name not in left and tensor is not None:
            if tensor.device.type != "meta" and tensor.untyped_storage().data_ptr() not in loaded:
                left.append(name)
    return left, len(left) == meta_count
