"""Hypothesis settings shared by the fuzz tests (test_fuzz_*.py).

Each test runs a few hundred examples by default, so that the whole set stays well under
half a minute in CI. ``GPUMAP_FUZZ_EXAMPLES=100000`` runs that many per test instead, by hand
(see docs/fuzzing.md). Nothing is stored between runs (no ``.hypothesis`` directory): a failure
prints the example and the ``@reproduce_failure`` line that replays it.
"""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings


def examples(default: int) -> settings:
    """``default`` examples, or ``GPUMAP_FUZZ_EXAMPLES`` where set."""
    wanted = os.environ.get("GPUMAP_FUZZ_EXAMPLES", "").strip()
    return settings(
        max_examples=int(wanted) if wanted else default,
        # Far above any example's time, so only a parse that runs away (or hangs) trips it.
        deadline=timedelta(seconds=10),
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
