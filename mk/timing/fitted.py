"""The megakernel's cost per op on GPU chips, fitted at run time (data/timing.csv's ``op_overhead_s`` row for ``gpu``,
kind ``fitted``) to one published megakernel step of data/independent.csv (the row's ``fit_to``): the cost per op
that makes :func:`mk.timing.predict` of that point, in the configuration its page states, equal its published step.
Neither GPU megakernel project states a per-op cost, so it is fitted, not cited; the other GPU megakernel points of
data/independent.csv test it (mk.analysis.independent). TPU chips keep the ``all`` row's assumed cost.

Also here, because the fit needs them: the context a published point is modelled at (:func:`context_of`), its
prediction (:func:`point_prediction`) and the per-op cost its published step implies (:func:`implied_op_cost`)."""

from __future__ import annotations

import math
from functools import lru_cache

import pandas as pd

from ..published import independent_table
from .constants import FITS, Constant, constant
from .general_stack import kernel_cost
from .predict import GivenCosts, Prediction, predict

ASSUMED_CONTEXT = 1024  # positions where a page gives no prompt or output length


def context_of(row) -> tuple[int, bool]:
    """The context a point of data/independent.csv is modelled at: the prompt plus half the generated tokens (the
    mean position while decoding), and whether it is assumed (:data:`ASSUMED_CONTEXT`: the page gives no lengths)."""
    prompt, output = row["prompt_tokens"], row["output_tokens"]
    if pd.isna(prompt) and pd.isna(output):
        return ASSUMED_CONTEXT, True
    return int((0 if pd.isna(prompt) else prompt) + (0 if pd.isna(output) else output) // 2), False


def point_prediction(row, context: int | None = None, **kw) -> Prediction:
    """:func:`mk.timing.predict` for a point of data/independent.csv (a row of it) in the configuration its page
    states: its model's config (a data/configs name or a preset), chip or slice, users, weights' data type and engine,
    at ``context`` (default: :func:`context_of`). ``kw``: predict's keywords."""
    context = context_of(row)[0] if context is None else context
    return predict(row["config"], row["chip"], context, int(row["batch"]), row["engine"], dtype=row["dtype"], **kw)


def implied_op_cost(row, published_s: float, context: int | None = None, rtol: float = 1e-6) -> float:
    """The megakernel's cost per op (seconds) at which the modelled step of ``row`` (a megakernel point of
    data/independent.csv) equals ``published_s``, within ``rtol`` of it: the step grows with the cost only once the
    ops outlast the weight stream, so it is solved for by bisection, every prediction with the cost given (so none
    of them calls the fit). NaN where the published step is no slower than the model's with no per-op cost."""

    def step(cost: float) -> float:
        return point_prediction(row, context, costs=GivenCosts(op_overhead_s=cost)).step_s

    if published_s <= step(0.0):
        return math.nan
    lo, hi = 0.0, 1e-7
    while step(hi) < published_s:
        lo, hi = hi, hi * 4
        if hi > 1.0:
            raise ValueError(f"no per-op cost up to 1 s meets the published step of {published_s * 1e3:.4g} ms")
    while True:
        mid = (lo + hi) / 2
        s = step(mid)
        if abs(s / published_s - 1) <= rtol or hi - lo <= 1e-12 * hi:
            return mid
        lo, hi = (mid, hi) if s < published_s else (lo, mid)


@lru_cache(maxsize=None)
def op_overhead_cost(kind: str) -> float:
    """The megakernel's cost per op on ``kind`` chips: data/timing.csv's value where it gives one (TPUs: assumed, 0),
    else fitted at run time to the published megakernel step its ``fit_to`` names (a key of data/independent.csv;
    not a test of the model): the cost :func:`implied_op_cost` solves for at that point."""
    c, row = constant("op_overhead_s", kind), fit_point(kind)
    if row is None:
        return c.value
    cost = implied_op_cost(row, row["step_ms"] / 1e3)
    if math.isnan(cost):
        raise ValueError(
            f"fitting the per-op cost to {c.fit_to}: the model's step with no per-op cost already meets or exceeds the "
            f"published {row['step_ms']:.4g} ms"
        )
    return cost


def fit_point(kind: str):
    """The row of data/independent.csv ``kind`` chips' cost per op is fitted to (data/timing.csv's ``fit_to``), or
    None where the cost is not fitted."""
    c = constant("op_overhead_s", kind)
    if c.kind != "fitted":
        return None
    points = independent_table().set_index("key", drop=False)
    if c.fit_to not in points.index:
        raise ValueError(f"op_overhead_s for {kind} chips is fitted to {c.fit_to!r}, not a key of data/independent.csv")
    return points.loc[c.fit_to]


def fitted_bound(kind: str) -> str:
    """Whether the point ``kind`` chips' cost per op is fitted to is published as a bound: ``upper`` where its page
    gives the step as one ("under one millisecond", data/independent.csv's ``bound``), so the cost fitted to it is an
    upper bound too and every megakernel step charged with it an upper bound (its tokens/s a lower bound); empty where
    the point is a value or the cost is not fitted."""
    row = fit_point(kind)
    return "" if row is None else str(row["bound"])


def fitted_value(c: Constant) -> float:
    """The value of a ``fitted`` row of data/timing.csv, fitted now: the general stack's cost per kernel
    (``kernel_s``) or the megakernel's cost per op (``op_overhead_s``)."""
    if c.kind != "fitted" or c.name not in FITS:
        raise ValueError(f"{c.name} ({c.applies_to}) is not a constant mk.timing fits (fitted: {', '.join(FITS)})")
    return FITS[c.name](c.applies_to)


FITS.update(kernel_s=kernel_cost, op_overhead_s=op_overhead_cost)
