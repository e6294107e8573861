"""The timing model's constants: data/timing.csv, each row with its source and kind (``cited``, ``published``,
``fitted`` or ``assumed``), looked up for a chip, its kind or all chips."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import pandas as pd

from ..chips import Chip
from ..paths import TIMING_CSV

MODELLED = "modelled (mk.timing)"
ASSUMED = ("op_overhead_s", "dma_issue_s")  # the megakernel's costs data/timing.csv assumes (GPUs' per op: fitted)


@dataclass(frozen=True)
class Constant:
    """One row of data/timing.csv. ``value`` is None for a fitted or derived constant (see ``fit_to``)."""

    name: str
    applies_to: str  # tpu, gpu, all, or base chip names separated by spaces (mi300x mi325x)
    value: float | None
    unit: str
    kind: str  # cited, published, fitted, assumed, or measured (read from data/measured/ at run time)
    fit_to: str | None  # the published key it is fitted to or read from: data/published.csv's (data/independent.csv's
    # for the GPU megakernel's cost per op)
    source: str


@lru_cache(maxsize=None)
def constants() -> tuple[Constant, ...]:
    t = pd.read_csv(TIMING_CSV, dtype={"fit_to": str}, keep_default_na=False)
    return tuple(
        Constant(
            r["name"],
            r["applies_to"],
            float(r["value"]) if str(r["value"]).strip() else None,
            r["unit"],
            r["kind"],
            r["fit_to"] or None,
            r["source"],
        )
        for _, r in t.iterrows()
    )


def matching_rows(name: str, kind: str, chip: str | None) -> list[tuple[int, Constant]]:
    """data/timing.csv's rows for ``name`` that apply to a ``kind`` chip (named ``chip``, its base name), each
    with its rank: 2 for a row naming the chip, 1 for the kind's row, 0 for the row for all."""
    ranked = []
    for c in constants():
        if c.name != name:
            continue
        if chip is not None and chip in c.applies_to.split():
            ranked.append((2, c))
        elif c.applies_to in (kind, "all"):
            ranked.append((int(c.applies_to == kind), c))
    return ranked


def constant(name: str, kind: str, chip: str | None = None) -> Constant:
    """The constant ``name`` for a chip kind (``tpu`` or ``gpu``), or for one chip of it (``chip``: a base name
    of data/chips.csv, ``mi300x``): the row naming the chip, else the kind's own row, else the row for all."""
    rows = matching_rows(name, kind, chip)
    if not rows:
        raise ValueError(
            f"data/timing.csv has no {name!r} for {kind} chips; the timing model needs one (with its source)"
        )
    return max(rows, key=lambda rc: rc[0])[1]


def chip_constant(name: str, chip: Chip) -> Constant:
    """The constant ``name`` for ``chip`` (a chip or a slice of it): :func:`constant` for its kind and base name."""
    return constant(name, chip.kind, chip.base)


def assumed_costs(kind: str, **given) -> dict[str, float]:
    """The megakernel's costs for ``kind`` chips (``op_overhead_s``, ``dma_issue_s``): data/timing.csv's defaults
    (assumed; a ``fitted`` row's fitted at run time: the GPU cost per op, mk.timing.fitted), each replaced by a value
    ``given`` (a sensitivity) unless that is None."""
    unknown = set(given) - set(ASSUMED)
    if unknown:
        raise ValueError(f"unknown assumed cost(s) {sorted(unknown)}; known: {', '.join(ASSUMED)}")
    return {n: _default_cost(n, kind) if given.get(n) is None else float(given[n]) for n in ASSUMED}


# How each fitted constant is fitted, by name: registered by mk.timing.fitted, which predicts steps and so sits above
# this module; the package imports it, so no fitted row is read before its fit is here. A fit predicts with the cost
# given, so it never asks for its own default.
FITS: dict[str, Callable[[str], float]] = {}


def _default_cost(name: str, kind: str) -> float:
    c = constant(name, kind)
    if c.kind != "fitted":
        return c.value
    if name not in FITS:
        raise RuntimeError(f"{name} for {kind} chips is fitted at run time by mk.timing.fitted; import mk.timing")
    return FITS[name](c.applies_to)


def fitted_costs(kind: str, **given) -> dict[str, str]:
    """The megakernel's costs for ``kind`` chips that are data/timing.csv's fitted defaults (none ``given``): name ->
    the published point it is fitted to."""
    fitted = {n: constant(n, kind) for n in ASSUMED if given.get(n) is None}
    return {n: c.fit_to for n, c in fitted.items() if c.kind == "fitted"}


def assumed_label(costs: dict[str, float], fitted: dict[str, str] | None = None) -> str:
    """The megakernel's costs in words, for a table's kind or a figure's footer; those in ``fitted``
    (:func:`fitted_costs`) said to be fitted, and to what."""
    fitted = fitted or {}
    words = {"op_overhead_s": "ns per op", "dma_issue_s": "ns per DMA issued"}
    words = {n: f"{costs[n] * 1e9:g} {w}" for n, w in words.items()}
    assumed = [w for n, w in words.items() if n not in fitted]
    out = [f"assumed: {', '.join(assumed)}"] if assumed else []
    return "; ".join(out + [f"fitted to {fitted[n]}: {words[n]}" for n in words if n in fitted])
