"""Integer arguments checked as the API documents them: whole numbers only (``int(1.9)`` would
quietly be 1, and a bool is not a count), and ranges of row indices checked against a table
before an array of them is made. Pure Python, so that modules which must not import NumPy at
import time can use it."""

from __future__ import annotations

import operator
from typing import Any, Iterable


def whole_number(name: str, value: Any) -> int:
    """``value`` as a Python int (Python's ints and NumPy's integers); a float, a bool or
    anything else is a ``TypeError`` naming ``name`` and the value."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def whole_numbers(name: str, values: Iterable[Any]) -> list[int]:
    """``values`` as Python ints, refused as :func:`whole_number` refuses one, naming the
    value's position."""
    out = []
    for position, value in enumerate(values):
        try:
            out.append(whole_number(name, value))
        except TypeError:
            raise TypeError(f"{name} must be integers, got {value!r} ({type(value).__name__}) at position {position}") from None
    return out


def first_outside(indices: range, rows: int) -> tuple[int, int] | None:
    """The position and value of the first of ``indices`` outside ``[0, rows)``, or None when
    all are inside. Constant time, so that a range of 2**64 values (``range(2**63, 2**64)``,
    whose ``len`` overflows) is refused as outside the table, not by NumPy's ``arange``."""
    if not indices:
        return None
    start, step = indices.start, indices.step
    if not 0 <= start < rows:
        return 0, start
    if 0 <= indices[-1] < rows:
        return None  # a range is monotonic: every value lies between its ends
    # The first position past the bound it runs towards.
    position = -(-(rows - start) // step) if step > 0 else start // -step + 1
    return position, start + position * step
