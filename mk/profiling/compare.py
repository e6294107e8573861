"""The measurement method every timed number in mk uses: the variants to compare run interleaved in one
run (each round runs every variant once, in a shuffled order), never against a baseline from another cell
or process; rounds go on until every variant's difference from the baseline is known to a stated
precision or a time budget runs out. Each time is reported as a median with a distribution-free
confidence interval (order statistics: no assumption on the noise's shape), each difference as the
median of the per-round paired differences with its interval, and the machine's load beside them. A
difference whose interval holds zero is noise, and says so.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import pandas as pd


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

    @property
    def halfwidth(self) -> float:
        return (self.high - self.low) / 2

    @property
    def holds_zero(self) -> bool:
        return self.low <= 0 <= self.high


@dataclass(frozen=True)
class Comparison:
    """Interleaved timings of named variants against ``baseline``."""

    baseline: str
    times: dict[str, Estimate]
    differences: dict[str, Estimate]  # variant minus baseline, paired by round
    confidence: float
    rounds: int
    elapsed_s: float
    load: tuple[float, float]  # the machine's 1-minute load average before and after
    raw: dict[str, list[float]] = field(repr=False, default_factory=dict)

    def table(self) -> pd.DataFrame:
        """One row per variant: median and interval of its time and of its difference from the baseline
        (seconds), and whether that difference is resolved (its interval excludes zero)."""
        rows = []
        for name, t in self.times.items():
            d = self.differences[name]
            rows.append(
                dict(
                    variant=name,
                    median_s=t.median,
                    low_s=t.low,
                    high_s=t.high,
                    diff_s=d.median,
                    diff_low_s=d.low,
                    diff_high_s=d.high,
                    resolved=name == self.baseline or not d.holds_zero,
                    rounds=self.rounds,
                )
            )
        return pd.DataFrame(rows)

    def provenance(self) -> dict:
        return dict(
            confidence=self.confidence,
            rounds=self.rounds,
            elapsed_s=self.elapsed_s,
            load_before=self.load[0],
            load_after=self.load[1],
        )


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not on every platform
        return float("nan")


def interleaved(
    calls: dict[str, Callable[[], Any]],
    baseline: str,
    precision: float = 0.05,
    budget_s: float = 60.0,
    min_rounds: int = 7,
    max_rounds: int = 500,
    warmup: int = 2,
    confidence: float = 0.95,
    seed: int = 0,
    precise: Callable[[dict[str, list[float]]], bool] | None = None,
) -> Comparison:
    """Time every call of ``calls`` once per round, in a shuffled order, until each one's difference from
    ``baseline`` is known to +-``precision`` x the baseline's median (the interval's half-width), or
    ``precise(times so far)`` says so when given, or ``budget_s`` has passed (at least ``min_rounds``
    rounds either way). Each call is waited on with ``jax.block_until_ready``; a call that must thread
    state (a donated cache) does so itself."""
    if baseline not in calls:
        raise ValueError(f"baseline {baseline!r} is not one of the variants {list(calls)}")
    for name, v in (("min_rounds", min_rounds), ("max_rounds", max_rounds)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 3:
            raise ValueError(f"{name} must be an integer >= 3, got {v!r}")
    if not 0 < confidence < 1 or precision <= 0 or budget_s <= 0:
        raise ValueError("confidence must be in (0, 1), precision and budget_s positive")
    for call in calls.values():
        for _ in range(warmup):
            jax.block_until_ready(call())
    rng = random.Random(seed)
    names = list(calls)
    times: dict[str, list[float]] = {n: [] for n in names}
    load0, t_start = _load(), time.perf_counter()
    rounds = 0
    while rounds < max_rounds:
        order = names[:]
        rng.shuffle(order)
        for n in order:
            t0 = time.perf_counter()
            jax.block_until_ready(calls[n]())
            times[n].append(time.perf_counter() - t0)
        rounds += 1
        if rounds < min_rounds:
            continue
        if precise is not None:
            if precise(times):
                break
        else:
            base = statistics.median(times[baseline])
            diffs = {n: Estimate.of([a - b for a, b in zip(times[n], times[baseline])], confidence) for n in names}
            if all(d.halfwidth <= precision * base for n, d in diffs.items() if n != baseline):
                break
        if time.perf_counter() - t_start > budget_s:
            break
    diffs = {n: Estimate.of([a - b for a, b in zip(times[n], times[baseline])], confidence) for n in names}
    return Comparison(
        baseline=baseline,
        times={n: Estimate.of(times[n], confidence) for n in names},
        differences=diffs,
        confidence=confidence,
        rounds=rounds,
        elapsed_s=time.perf_counter() - t_start,
        load=(load0, _load()),
        raw=times,
    )
