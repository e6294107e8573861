"""The step timer: wall-clock seconds of repeated calls, each waited on until its results are ready."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax
import numpy as np


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of ``runs`` calls, each waited on until its results were ready."""

    times_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def iqr_s(self) -> float:
        """Interquartile range (75th minus 25th percentile): the spread, robust to one slow run."""
        q75, q25 = np.percentile(self.times_s, [75, 25])
        return float(q75 - q25)

    @property
    def spread(self) -> float:
        """The interquartile range as a fraction of the median."""
        return self.iqr_s / self.median_s

    def to_dict(self) -> dict:
        return {
            "median_s": self.median_s,
            "min_s": self.min_s,
            "iqr_s": self.iqr_s,
            "spread": self.spread,
            "runs": len(self.times_s),
        }


def time_call(call: Callable[[], Any], warmup: int = 2, runs: int = 10) -> Timing:
    """Time ``call()`` ``runs`` times after ``warmup`` untimed calls (compilation, caches).

    Each call is waited on with ``jax.block_until_ready`` so the time covers the device work, not
    just the dispatch. A call that must thread state (a donated KV cache) does so in its closure.
    """
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a positive integer, got {runs!r}")
    for _ in range(warmup):
        jax.block_until_ready(call())
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - t0)
    return Timing(tuple(times))
