"""Tensor-parallel loading: which part of each tensor a rank holds.

``TensorParallel(rank, world_size, rules)`` names, per tensor-name pattern, the dimension a
tensor is split along; :func:`gpumapio.load_checkpoint` then reads only that rank's bytes of
each split tensor (tensors no rule matches are loaded whole, replicated on every rank).

Megatron's and vLLM's layers, for a linear weight stored ``[out_features, in_features]``:

- column-parallel layers (``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj``;
  their biases too) split the output features: dimension 0, ``"row"`` here — one contiguous
  range per rank;
- row-parallel layers (``o_proj``, ``down_proj``) split the input features: dimension 1,
  ``"column"`` here — one strided piece per row, coalesced where pieces touch;
- vocabulary-parallel embeddings (``embed_tokens``, ``lm_head``) split dimension 0.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
from typing import Callable, Mapping, Union

__all__ = ["TensorParallel"]

Dim = Union[int, str]

_NAMED = {"row": 0, "column": 1}


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """Rank ``rank`` of ``world_size``; ``rules`` maps glob patterns of tensor names
    (``fnmatch``, case-sensitive: ``"*.q_proj.weight"``) to the dimension they are split along:
    an int (negative counts from the end), ``"row"`` (0) or ``"column"`` (1). The first
    pattern that matches a name, in the mapping's order, decides; a dimension whose size does
    not divide by ``world_size`` is an error when that tensor is loaded."""

    rank: int
    world_size: int
    rules: Mapping[str, Dim] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.world_size, bool) or not (isinstance(self.world_size, int) and self.world_size >= 1):
            raise ValueError(f"world_size {self.world_size!r} is not a positive number of ranks")
        if isinstance(self.rank, bool) or not (isinstance(self.rank, int) and 0 <= self.rank < self.world_size):
            raise ValueError(f"rank {self.rank!r} is not one of 0..{self.world_size - 1}")
        for pattern, dim in self.rules.items():
            if not isinstance(pattern, str):
                raise TypeError(f"pattern {pattern!r} is not a string")
            if not (isinstance(dim, int) and not isinstance(dim, bool)) and dim not in _NAMED:
                raise ValueError(f"pattern {pattern!r}: dimension {dim!r} is not an int, 'row' or 'column'")

    def split_dim(self, name: str) -> int | None:
        """The dimension tensor ``name`` is split along, or ``None`` (loaded whole)."""
        match, dims = self._matcher
        found = match(name)
        return None if found is None else dims[found.lastgroup]

    @functools.cached_property
    def _matcher(self) -> tuple[Callable[[str], re.Match[str] | None], dict[str | None, int]]:
        # One expression of every pattern, compiled once: a checkpoint has thousands of names,
        # and a match per pattern and name cost more than the planning around it. Alternatives
        # are tried in order, so the first pattern that matches decides; the group that matched
        # (the outermost, so the last closed) names it.
        groups = [f"(?P<_{k}>{fnmatch.translate(pattern)})" for k, pattern in enumerate(self.rules)]
        dims = {f"_{k}": _NAMED[dim] if isinstance(dim, str) else dim for k, dim in enumerate(self.rules.values())}
        return re.compile("|".join(groups) or "(?!)").match, dims
