"""Medians with distribution-free confidence intervals: how every timed number in mk is reported (order
statistics, no assumption on the noise's shape). A difference whose interval holds zero is noise."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def median_interval(xs, confidence: float = 0.95) -> tuple[float, float]:
    """A confidence interval for the median of ``xs`` from order statistics: [x_(k), x_(n+1-k)] holds the
    median with probability 1 - 2 P(Binomial(n, 1/2) <= k - 1); the narrowest such pair with at least
    ``confidence`` (the whole range when there are too few values to reach it)."""
    s = sorted(xs)
    n = len(s)
    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n >= confidence:
        k += 1
    return s[k - 1], s[n - k]


@dataclass(frozen=True)
class Estimate:
    """A median and its confidence interval (seconds, or a difference of seconds)."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, xs, confidence: float) -> "Estimate":
        lo, hi = median_interval(xs, confidence)
        return cls(statistics.median(xs), lo, hi, len(xs))

    def columns(self, name: str, unit: str = "s", scale: float = 1.0) -> dict[str, float]:
        """The median and its interval as a table's three columns, ``{name}_{unit}``, ``{name}_low_{unit}`` and
        ``{name}_high_{unit}``, each times ``scale`` (1e3 for seconds shown as ms)."""
        return {
            f"{name}_{unit}": self.median * scale,
            f"{name}_low_{unit}": self.low * scale,
            f"{name}_high_{unit}": self.high * scale,
        }

    @property
    def halfwidth(self) -> float:
        return (self.high - self.low) / 2

    @property
    def holds_zero(self) -> bool:
        return self.low <= 0 <= self.high
