"""The timing model (mk.timing) held against independent published decode measurements (data/independent.csv):
megakernels and general stacks on GPUs and TPUs, one to eight users, none of them used to fit anything.

Each point is predicted in the configuration its page states: its model's config (data/configs), chip or slice,
users, weights' data type, engine (megakernel: mk.timing's kernel; general: the general stack with the per-kernel
cost fitted to the write-up's vLLM step), at a context of the prompt plus half the generated tokens (the mean
position while decoding; :data:`ASSUMED_CONTEXT` where the page gives neither). A point the model cannot take (no
config, a data type mk.sol does not have, a slice without a cited link) says why instead of a number.

A page that times whole requests (``request_latency``) includes the prompt's prefill in its per-token time: the
modelled decode step is expected to come out below it, by the prefill's share.
"""

from __future__ import annotations

import math

import pandas as pd

from ..paths import CONFIGS_DIR
from ..published import independent_table, read_independent
from ..sol import DTYPES
from ..timing import MODELLED, predict

ASSUMED_CONTEXT = 1024  # positions where a page gives no prompt or output length
MISS = 0.30  # an error beyond +-30% is a miss, explained row by row
KIND = f"published (data/independent.csv) vs {MODELLED}"


def context_of(row) -> tuple[int, bool]:
    """The context a point is modelled at, and whether it is assumed (the page gives no lengths)."""
    prompt, output = row["prompt_tokens"], row["output_tokens"]
    if pd.isna(prompt) and pd.isna(output):
        return ASSUMED_CONTEXT, True
    return int((0 if pd.isna(prompt) else prompt) + (0 if pd.isna(output) else output) // 2), False


def _not_modelled(row) -> str | None:
    if not row["config"]:
        return "no config of this model in data/configs"
    if row["dtype"] not in DTYPES:
        return f"weights in {row['dtype']}: not a data type of mk.sol ({', '.join(DTYPES)})"
    return None


def _prediction(r, context: int, **kw):
    return predict(str(CONFIGS_DIR / r["config"]), r["chip"], context, int(r["batch"]), r["engine"], dtype=r["dtype"],
                   **kw)  # fmt: skip


def _implied(r, context: int, published_s: float, p) -> tuple[float, float]:
    """What the published step implies of the model's unfitted costs: the general stack's cost per kernel (us) that
    would meet it (the step is linear in it), or the megakernel's cost per op (ns, data/timing.csv's assumed
    ``op_overhead_s``; the step grows with it only once the ops outlast the weight stream, so it is solved for by
    bisection). NaN where the published step is faster than the model's with no such cost."""
    if r["engine"] == "general":
        work = _prediction(r, context, kernel_s=0.0).step_s
        return (published_s - work) / p.kernels_per_step * 1e6, math.nan
    if published_s <= p.step_s:
        return math.nan, math.nan
    lo, hi = 0.0, 1e-7
    while _prediction(r, context, op_overhead_s=hi).step_s < published_s:
        lo, hi = hi, hi * 4
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _prediction(r, context, op_overhead_s=mid).step_s < published_s else (lo, mid)
    return math.nan, (lo + hi) / 2 * 1e9


def predictions(path=None) -> pd.DataFrame:
    """Every independent point (data/independent.csv, or a file laid out like it at ``path``) beside the model's
    prediction: published and modelled time per output token per user (ms), the error (modelled / published - 1), the
    speed of light on that hardware and both fractions of it, and what the published time implies of the model's
    unfitted costs (:func:`_implied`)."""
    rows = []
    points = independent_table() if path is None else read_independent(path)
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
                p = _prediction(r, context)
            except ValueError as e:  # a slice whose link is not in the data
                reason = str(e).split(" (")[0]
        if reason is not None:
            rows.append(dict(out, role=f"not modelled: {reason}"))
            continue
        kernel_us, op_ns = _implied(r, context, r["step_ms"] / 1e3, p)
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
                setup=p.setup,  # the megakernel's setup (predict's default: the workbook's kernel), or general stack
                role=TESTED,
            )
        )
    return pd.DataFrame(rows).assign(kind=KIND)


TESTED = "test (independent)"


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
            why = (
                f"the published kernel reaches {pub} of the speed of light, the model's {mod}: it charges nothing per "
                f"op (data/timing.csv's assumed cost, 0 ns); {r.implied_op_ns:.0f} ns per op would meet the published "
                "step, a fixed cost a faster chip and a smaller model feel most"
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
