"""Statistics over repetitions: a figure's median and spread (:class:`Spread`), ratios,
and the runs that disagree with the median beyond a tolerance."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """Median and spread of one figure over repetitions."""

    median: float
    low: float
    high: float
    n: int

    @property
    def rel_spread(self) -> float:
        """(max - min) / median: 0 when all runs agree."""
        if self.n < 2 or self.median == 0:
            return 0.0
        return (self.high - self.low) / abs(self.median)


def spread(values: Sequence[float]) -> Spread | None:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return None
    return Spread(median=statistics.median(vals), low=min(vals), high=max(vals), n=len(vals))


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is unknown or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def disagreeing(values: Sequence[float], tolerance: float) -> list[int]:
    """Indexes of runs further than ``tolerance`` (relative) from the median."""
    s = spread(values)
    if s is None or s.n < 2 or s.median == 0:
        return []
    return [i for i, v in enumerate(values) if abs(v - s.median) / abs(s.median) > tolerance]
