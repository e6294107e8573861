"""The one timing loop every measurement in mk runs: the variants to compare run interleaved in one run (each
round runs every variant once, in a shuffled order), never against a baseline from another cell or process.

The one stopping rule: rounds go on until every watched quantity's median is known to +-``precision`` of
itself (its 95% interval's half-width), or ``budget_s`` has passed, or ``max_rounds`` are run, after at least
``min_rounds``. The watched quantities are the variants' own times, or what ``watch`` derives from them round
by round (the CPU bench: each round's fraction of the speed of light). Each time is reported as a median with
a distribution-free interval (mk.profiling.stats), each difference from the baseline as the median of the
per-round paired differences with its interval, and the machine's load beside them.

The loop reads the time from one clock, ``time.perf_counter`` unless a caller gives another: a test gives a clock
that each call advances by a set amount, and asserts the loop's statistics exactly rather than what a loaded machine's
sleeps happen to take.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import pandas as pd

from ..profiling.stats import Estimate

PRECISION = 0.01  # every watched median known to +-1% of itself (95% interval), unless a caller asks otherwise
MIN_ROUNDS = 7
MAX_ROUNDS = 500  # read at each call: a test may lower it
CONFIDENCE = 0.95


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
                    **t.columns("step"),
                    **d.columns("diff"),
                    resolved=name == self.baseline or not d.holds_zero,
                    rounds=self.rounds,
                )
            )
        return pd.DataFrame(rows)

    def ratio(self, name: str) -> Estimate:
        """``name``'s time over the baseline's, paired by round: the median of the per-round ratios with its
        interval (a slow round slows both, and the pair cancels it)."""
        pairs = zip(self.raw[name], self.raw[self.baseline])
        return Estimate.of([a / b for a, b in pairs], self.confidence)

    def rate(self, short: str, long: str, amount: float, calls: int = 1) -> Estimate:
        """``amount`` (of work: bytes, bundles) over ``long``'s time less ``short``'s, paired by round, each time over
        the ``calls`` it spans: the rate of the work ``long`` does beyond ``short``, their fixed costs cancelled."""
        pairs = zip(self.raw[short], self.raw[long])
        return Estimate.of([amount * calls / (b - a) for a, b in pairs], self.confidence)

    def provenance(self) -> dict:
        return dict(
            confidence=self.confidence,
            rounds=self.rounds,
            elapsed_s=self.elapsed_s,
            load_before=self.load[0],
            load_after=self.load[1],
        )


def back_to_back(call: Callable[[], Any], n: int) -> Callable[[], Any]:
    """``call`` run ``n`` times without waiting in between, its last result returned for the loop to wait on once: a
    round's time over ``n`` is the device's time a call, the host's dispatch hidden behind the device's work, as a
    serving loop runs (a call threading state, a donated cache, threads it through all ``n``)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")

    def run():
        out = None
        for _ in range(n):
            out = call()
        return out

    return run


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not on every platform
        return float("nan")


def precise(series: dict[str, list[float]], precision: float, confidence: float = CONFIDENCE) -> bool:
    """The stopping rule: every series' median known to +-``precision`` of itself (``precision`` 0: never)."""
    if precision == 0:
        return False
    estimates = [Estimate.of(xs, confidence) for xs in series.values()]
    return all(e.halfwidth <= precision * abs(e.median) for e in estimates)


def interleaved(
    calls: dict[str, Callable[[], Any]],
    baseline: str,
    precision: float = PRECISION,
    budget_s: float = 60.0,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int | None = None,
    warmup: int = 2,
    confidence: float = CONFIDENCE,
    seed: int = 0,
    watch: Callable[[dict[str, list[float]]], dict[str, list[float]]] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Comparison:
    """Time every call of ``calls`` once per round, in a shuffled order, until the stopping rule (the module's
    docstring) holds for the calls' times, or for ``watch(times so far)`` when given. ``max_rounds`` defaults
    to ``MAX_ROUNDS``. Each call is waited on with ``jax.block_until_ready``; a call that must thread state (a
    donated cache) does so itself. ``clock()``: seconds, for the calls' times and the budget alike."""
    max_rounds = MAX_ROUNDS if max_rounds is None else max_rounds
    if baseline not in calls:
        raise ValueError(f"baseline {baseline!r} is not one of the variants {list(calls)}")
    for name, v in (("min_rounds", min_rounds), ("max_rounds", max_rounds)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 3:
            raise ValueError(f"{name} must be an integer >= 3, got {v!r}")
    if not 0 < confidence < 1 or precision < 0 or budget_s <= 0:
        raise ValueError(
            f"confidence must be in (0, 1), precision >= 0 (0: run to the budget) and budget_s positive; got "
            f"{confidence}, {precision}, {budget_s}"
        )
    for call in calls.values():
        for _ in range(warmup):
            jax.block_until_ready(call())
    rng = random.Random(seed)
    names = list(calls)
    times: dict[str, list[float]] = {n: [] for n in names}
    load0, t_start = _load(), clock()
    rounds = 0
    while rounds < max_rounds:
        order = names[:]
        rng.shuffle(order)
        for n in order:
            t0 = clock()
            jax.block_until_ready(calls[n]())
            times[n].append(clock() - t0)
        rounds += 1
        if rounds < min_rounds:
            continue
        if precise(watch(times) if watch else times, precision, confidence) or clock() - t_start > budget_s:
            break
    diffs = {n: Estimate.of([a - b for a, b in zip(times[n], times[baseline])], confidence) for n in names}
    return Comparison(
        baseline=baseline,
        times={n: Estimate.of(times[n], confidence) for n in names},
        differences=diffs,
        confidence=confidence,
        rounds=rounds,
        elapsed_s=clock() - t_start,
        load=(load0, _load()),
        raw=times,
    )
