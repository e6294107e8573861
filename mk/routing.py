"""How many routed experts a decode step loads, exactly, under uniform routing: each of B users routes to
top-k distinct experts of E, uniformly and independently.

- the distinct experts of a layer (the union of the users' picks), its distribution and mean;
- the share of them one chip holds when E/C whole experts sit on each of C chips (hypergeometric: given
  its size n, the union is a uniformly random n-set of experts);
- the most any one chip holds (the busiest chip, which sets the pace of a whole-expert placement):
  counting the n-sets with at most m experts on every chip in exact integers.

Pure arithmetic, read by the speed of light, the step plans, the straggler and the cost model alike.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

from .units import positive_int


def expected_distinct_experts(num_experts: int, top_k: int, batch: int) -> float:
    """Expected number of distinct experts that ``batch`` users touch in one layer, each routing to
    ``top_k`` of ``num_experts`` uniformly: E * (1 - (1 - k/E)^B)."""
    if num_experts == 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** batch)


def distinct_experts_distribution(num_experts: int, top_k: int, batch: int) -> dict[int, float]:
    """The exact distribution of the number of distinct experts ``batch`` users touch in one layer,
    each routing to ``top_k`` distinct experts of ``num_experts`` uniformly and independently: user by
    user, m of the k picks are new with probability C(E - d, m) C(d, k - m) / C(E, k) when d are taken."""
    positive_int("batch", batch)
    if num_experts == 0:
        return {0: 1.0}
    E, k = num_experts, top_k
    dist = {0: 1.0}
    for _ in range(batch):
        nxt: dict[int, float] = {}
        for d, p in dist.items():
            for m in range(max(0, k - d), min(k, E - d) + 1):
                q = math.comb(E - d, m) * math.comb(d, k - m) / math.comb(E, k)
                nxt[d + m] = nxt.get(d + m, 0.0) + p * q
        dist = nxt
    return dict(sorted(dist.items()))


def check_placement(experts: int, chips: int, top_k: int, batch: int = 1) -> None:
    """Positive integers, top_k <= experts, and C dividing E (whole placement)."""
    for name, value in (("experts", experts), ("chips", chips), ("top_k", top_k), ("batch", batch)):
        positive_int(name, value)
    if top_k > experts:
        raise ValueError(f"top_k ({top_k}) must not exceed experts ({experts}): users route to distinct experts")
    if experts % chips:
        divisors = ", ".join(str(c) for c in range(1, experts + 1) if experts % c == 0)
        raise ValueError(
            f"whole placement needs E divisible by C: {experts} experts do not split evenly over {chips} chips; "
            f"use split placement (every expert's intermediate over all chips) or a chip count of {divisors}"
        )


def chip_distinct_experts_distribution(experts: int, chips: int, top_k: int, batch: int) -> dict[int, float]:
    """Distribution of the distinct routed experts one chip holding E/C whole experts must load in a layer,
    uniform routing (exact): given n distinct experts in all, a uniformly random n-set, so the chip's
    share is hypergeometric."""
    held = experts // chips
    out: dict[int, float] = {}
    for n, p in distinct_experts_distribution(experts, top_k, batch).items():
        for m in range(max(0, n - (experts - held)), min(n, held) + 1):
            q = math.comb(held, m) * math.comb(experts - held, n - m) / math.comb(experts, n)
            out[m] = out.get(m, 0.0) + p * q
    return dict(sorted(out.items()))


@lru_cache(maxsize=None)
def _placements_with_max(experts: int, chips: int, most: int) -> tuple[tuple[int, ...], ...]:
    """``ways[m][n]``: how many n-sets of experts have at most m on any chip, for m = 0..E/C and n = 0..most:
    the x^n coefficient of (sum_{j<=m} C(E/C, j) x^j)^C, in exact integers."""
    per_chip = experts // chips
    ways = []
    for m in range(per_chip + 1):
        one_chip = [math.comb(per_chip, j) for j in range(m + 1)]
        poly = [1]
        for _ in range(chips):
            nxt = [0] * min(len(poly) + m, most + 1)
            for i, a in enumerate(poly):
                for j, b in enumerate(one_chip[: len(nxt) - i]):
                    nxt[i + j] += a * b
            poly = nxt
        ways.append(tuple(poly + [0] * (most + 1 - len(poly))))
    return tuple(ways)


def busiest_chip_distribution(experts: int, chips: int, top_k: int, batch: int = 1) -> dict[int, float]:
    """The exact distribution of the most distinct experts any one chip loads in a layer (whole placement,
    uniform routing): count -> probability, counts with probability 0 left out."""
    check_placement(experts, chips, top_k, batch)
    distinct = distinct_experts_distribution(experts, top_k, batch)
    ways = _placements_with_max(experts, chips, max(distinct))
    out = {}
    for m in range(1, experts // chips + 1):
        # P(max = m | n) = (ways[m][n] - ways[m-1][n]) / C(E, n), exact before it becomes a float
        p = sum(pn * float(Fraction(ways[m][n] - ways[m - 1][n], math.comb(experts, n))) for n, pn in distinct.items())
        if p > 0:
            out[m] = p
    return out
