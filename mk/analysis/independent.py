"""The timing model (mk.timing) held against independent published decode measurements (data/independent.csv):
megakernels and general stacks on GPUs and TPUs, one to eight users. One of them is fitted to, not a test: the GPU
megakernel's cost per op (data/timing.csv's ``op_overhead_s`` for ``gpu``, mk.timing.fitted) is fitted to Hazy
Research's Llama-3.2-1B megakernel on an H100, and the other GPU megakernel points test it (:func:`gpu_op_cost`).

Each point is predicted in the configuration its page states: its model's config (data/configs), chip or slice,
users, weights' data type, engine (megakernel: mk.timing's kernel; general: the general stack with the per-kernel
cost fitted to the write-up's vLLM step), at a context of the prompt plus half the generated tokens (the mean
position while decoding; :data:`ASSUMED_CONTEXT` where the page gives neither: mk.timing.fitted.context_of). A point
the model cannot take (no config, a data type mk.sol does not have, a slice without a cited link) says why instead of
a number.

A page that times whole requests (``request_latency``) includes the prompt's prefill in its per-token time: the
modelled decode step is expected to come out below it, by the prefill's share.
"""

from __future__ import annotations

import math

import pandas as pd

from ..chips import get_chip
from ..dtypes import DTYPES
from ..published import independent_table, read_independent
from ..timing import MODELLED, GivenCosts, assumed_costs, constant, constants
from ..timing.fitted import (
    ASSUMED_CONTEXT as ASSUMED_CONTEXT,  # the context a point is modelled at: mk.timing's
    context_of,
    implied_op_cost,
    op_overhead_cost,
    point_prediction,
)

MISS = 0.30  # an error beyond +-30% is a miss, explained row by row
KIND = f"published (data/independent.csv) vs {MODELLED}"


def _not_modelled(row) -> str | None:
    if not row["config"]:
        return "no config of this model in data/configs"
    if row["dtype"] not in DTYPES:
        return f"weights in {row['dtype']}: not a data type of mk.sol ({', '.join(DTYPES)})"
    return None


def _implied(r, context: int, published_s: float, p) -> tuple[float, float]:
    """What the published step implies of the model's per-kernel or per-op cost: the general stack's cost per kernel
    (us) that would meet it (the step is linear in it), or the megakernel's cost per op (ns, data/timing.csv's
    ``op_overhead_s``: mk.timing.fitted.implied_op_cost, by bisection). NaN where the published step is faster than
    the model's with no such cost."""
    if r["engine"] == "general":
        work = point_prediction(r, context, costs=GivenCosts(kernel_s=0.0)).step_s
        return (published_s - work) / p.kernels_per_step * 1e6, math.nan
    return math.nan, implied_op_cost(r, published_s, context) * 1e9


def fitted_points() -> dict[str, str]:
    """The points of data/independent.csv a constant of data/timing.csv is fitted to (not tests): key -> the role
    they are given (the constant and the chips it is fitted for)."""
    return {c.fit_to: f"{FITTED}: {c.name} ({c.applies_to})" for c in constants() if c.kind == "fitted" and c.fit_to}


def predictions(path=None, engine: str | None = None) -> pd.DataFrame:
    """Every independent point (data/independent.csv, or a file laid out like it at ``path``; only ``engine``'s
    points where it is given) beside the model's
    prediction: published and modelled time per output token per user (ms), the error (modelled / published - 1), the
    speed of light on that hardware and both fractions of it, and what the published time implies of the model's
    costs (:func:`_implied`). A megakernel point also has its step with no per-op or per-DMA-issue cost
    (``no_op_cost_ms``). Its ``role``: a test, fitted (a constant of data/timing.csv is fitted to it), or not
    modelled and why."""
    rows = []
    points = independent_table() if path is None else read_independent(path)
    if engine is not None:
        points = points[points["engine"] == engine]
    fitted = fitted_points()
    for _, r in points.iterrows():
        context, assumed = context_of(r)
        out = dict(
            key=r["key"], model=r["model"], config=r["config"], chip=r["chip"], engine=r["engine"], stack=r["stack"],
            batch=int(r["batch"]), dtype=r["dtype"], quantity=r["quantity"], context=context,
            context_assumed=assumed, published_ms=r["step_ms"], note=r["note"],
        )  # fmt: skip
        reason = _not_modelled(r)
        if reason is None:
            try:
                p = point_prediction(r, context)
            except ValueError as e:  # a slice whose link is not in the data
                reason = str(e).split(" (")[0]
        if reason is not None:
            rows.append(dict(out, role=f"not modelled: {reason}"))
            continue
        kernel_us, op_ns = _implied(r, context, r["step_ms"] / 1e3, p)
        zero = point_prediction(r, context, costs=GivenCosts(0.0, 0.0)) if r["engine"] == "megakernel" else None
        rows.append(
            dict(
                out,
                modelled_ms=p.step_s * 1e3,
                sol_ms=p.sol_step_s * 1e3,
                error=p.step_s * 1e3 / r["step_ms"] - 1,
                published_fraction=p.sol_step_s * 1e3 / r["step_ms"],
                modelled_fraction=p.fraction_of_sol,
                implied_kernel_us=kernel_us,
                implied_op_ns=op_ns,
                no_op_cost_ms=math.nan if zero is None else zero.step_s * 1e3,
                setup=p.setup,  # the megakernel's setup (predict's default: the workbook's kernel), or general stack
                role=fitted.get(r["key"], TESTED),
            )
        )
    return pd.DataFrame(rows).assign(kind=KIND)


TESTED = "test (independent)"
FITTED = "fitted (data/timing.csv)"  # the start of a fitted point's role: then the constant and its chips


def gpu_op_cost(t: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The GPU megakernel's cost per op, fitted to one point (data/timing.csv ``op_overhead_s`` for ``gpu``) and
    tested on the others: the GPU megakernel points of ``t`` (:func:`predictions`' table), each with its role, its
    published step, its modelled step with no per-op cost (before: op_overhead_s = dma_issue_s = 0) and with the
    fitted cost (after: predict's default) and both errors; and a summary: the fitted cost (ns), the point it is
    fitted to, the median |error| before over every point and over the test points, and after over the test points
    only (the fitted point meets its published step by construction)."""
    mega = t[(t.engine == "megakernel") & t.modelled_ms.notna()]
    mega = mega[[get_chip(c).kind == "gpu" for c in mega.chip]]
    table = pd.DataFrame(
        dict(
            key=mega.key,
            chip=mega.chip,
            stack=mega["stack"],  # not mega.stack: a DataFrame method
            role=mega.role,
            published_ms=mega.published_ms,
            before_ms=mega.no_op_cost_ms,
            after_ms=mega.modelled_ms,
            error_before=mega.no_op_cost_ms / mega.published_ms - 1,
            error_after=mega.error,
            implied_op_ns=mega.implied_op_ns,
        )
    ).reset_index(drop=True)
    tests = table[table.role == TESTED]
    summary = dict(
        fitted_ns=op_overhead_cost("gpu") * 1e9,
        fit_to=constant("op_overhead_s", "gpu").fit_to,
        points=len(table),
        tests=len(tests),
        median_before=float(table.error_before.abs().median()),
        median_before_tests=float(tests.error_before.abs().median()),
        median_after=float(tests.error_after.abs().median()),
    )
    return table.assign(kind=KIND), summary


def summary(t: pd.DataFrame) -> dict:
    """How the model does on the points it predicts: their count, the median |error| (all, and by engine) and how many
    fall within +-30%."""
    tested = t[t.role == TESTED]
    err = tested.error.abs()
    return dict(
        points=len(t),
        modelled=len(tested),
        median_abs_error=float(err.median()),
        within_30pct=int((err <= MISS).sum()),
        by_engine={e: float(g.error.abs().median()) for e, g in tested.groupby("engine")},
    )


def misses(t: pd.DataFrame, fitted_kernel_us: float) -> pd.DataFrame:
    """The points the model misses by more than 30%, each with why, in the numbers the model itself gives: how far from
    the speed of light the published and modelled steps are, and the unfitted cost the published step implies
    (``fitted_kernel_us``: the general stack's fitted cost per kernel, for comparison)."""
    rows = []
    for _, r in t[(t.role == TESTED) & (t.error.abs() > MISS)].iterrows():
        pub, mod = f"{r.published_fraction:.0%}", f"{r.modelled_fraction:.0%}"
        if r.published_ms < r.sol_ms:
            why = (
                f"the published step beats this hardware's speed of light in {r.dtype}: the setup differs from the row"
            )
        elif r.engine == "megakernel":
            kind = get_chip(r.chip).kind
            c, charged = constant("op_overhead_s", kind), assumed_costs(kind)["op_overhead_s"] * 1e9
            how = f"fitted to {c.fit_to}" if c.kind == "fitted" else "data/timing.csv's assumed cost"
            would = (
                "no per-op cost would meet the published step: the model's step is slower without one"
                if math.isnan(r.implied_op_ns)
                else f"{r.implied_op_ns:.0f} ns per op would meet the published step, a fixed cost a faster chip and a "
                "smaller model feel most"
            )
            why = (
                f"the published kernel reaches {pub} of the speed of light, the model's {mod}: it charges "
                f"{charged:.0f} ns per op ({how}); {would}"
            )
        else:
            side = "slower" if r.error < 0 else "faster"
            why = (
                f"the stack is {side} than the model: its step implies {r.implied_kernel_us:.2f} us per kernel against "
                f"the {fitted_kernel_us:.2f} us fitted to vLLM 0.30 on Gemma 4"
            )
            if r.quantity == "request_latency":
                why += " (and its per-token time includes the prompt's prefill)"
        rows.append(dict(key=r.key, chip=r.chip, engine=r.engine, error=r.error, why=why))
    return pd.DataFrame(rows, columns=["key", "chip", "engine", "error", "why"]).assign(kind=KIND)
