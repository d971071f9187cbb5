"""The simulator's own percentile, for its truth files: checked against the analysis, never computed by it.

The same convention the analysis documents (docs/methods.md: DuckDB `quantile_cont`, the
value at rank (n - 1) q of the sorted values, linear interpolation between neighbours), written
out plainly here so that a truth file does not share code with the analysis it checks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def quantile(values: Iterable[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of `values` by linear interpolation at rank (n - 1) q; nan when empty."""
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q
    below = math.floor(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (rank - below) * (ordered[above] - ordered[below])
