"""The measured answer: what running the whole decode step as one kernel buys over XLA's compiled step on a TPU, cell
by cell, and the one sentence that says it.

A cell is one model (or a cut of one), data type, context and users on one chip, both engines built in one run and
timed interleaved, device time of steps back to back (mk.analysis.on_tpu.tpu_steps: a cell's newest rows). The
speed-up is XLA's step over the megakernel's. Like for like, each engine's fraction of the chip's measured read limit
(mk.chips.measured_limit) is of the bytes that engine reads a step (mk.sol's count, at the data type it streams): the
megakernel streams a format's own codes, while XLA's reference computes with the float tree of a quantized one
(dequantized once, mk.reference), so its rows read bf16 bytes whatever the format. The bytes are what a step must read
(no padding), so a fraction above 1 means a count or a limit is wrong, never a faster chip: each row says whether its
interval reaches below 1 (:data:`PAST_LIMIT`).

Cells of chip 0 of a slice (a stand-in) have no XLA counterpart and are not here (notebook 12's headline has them).
"""

from __future__ import annotations

import statistics

import pandas as pd

from ..units import significant
from .on_tpu import STAND_IN, fraction_at_long_end, measured_config, tpu_steps

ENGINES = ("megakernel", "reference")  # the reference runs as XLA compiles it
CELL = ["base_model", "layers", "model", "dtype", "setup", "chip", "context", "batch"]
KIND = "measured (TPU, device time; fractions of the measured limit from mk.sol's bytes)"
# Where a row's fraction of the limit passes 1, what it says: within its own 95% interval of the limit, or not.
PAST_LIMIT = {True: "past the limit within its interval", False: "past the limit beyond its interval: a count is wrong"}
COLUMNS = [
    "model", "base_model", "layers", "family", "dtype", "setup", "chip", "context", "batch",
    "megakernel_ms", "megakernel_low_ms", "megakernel_high_ms", "xla_ms", "xla_low_ms", "xla_high_ms",
    "megakernel_GB", "xla_GB", "megakernel_fraction_of_limit", "xla_fraction_of_limit",
    "speedup", "speedup_low", "speedup_high", "note", "date", "xla_date", "commit",
    "kernel_revision", "kernel_digest",
]  # fmt: skip


def measured_answer(steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row a cell measured with both engines (module docstring): each engine's device time with its 95% interval,
    the bytes it reads and its fraction of the measured limit, the speed-up (XLA over the megakernel, with the interval
    of the two intervals' extremes), the dates and the code that ran (commit, kernel revision, and the digest of the
    kernel's code where the run computed one). Sorted by family, users, context, model."""
    s = tpu_steps() if steps is None else steps
    s = s[~s.setup.str.endswith(STAND_IN) & s.engine.isin(ENGINES)]
    rows = []
    for key, g in s.groupby(CELL, sort=False):
        if set(g.engine) != set(ENGINES):
            continue
        mk, xla = (g[g.engine == e].iloc[0] for e in ENGINES)
        rows.append(_cell(dict(zip(CELL, key)), mk, xla))
    out = pd.DataFrame(rows, columns=COLUMNS)
    order = {"dense": 0, "MoE": 1}
    out = out.sort_values(["family", "batch", "context", "dtype", "model"], key=lambda c: c.map(order).fillna(c)
                          if c.name == "family" else c, kind="stable")  # fmt: skip
    return out.reset_index(drop=True).assign(kind=KIND)


def _cell(cell: dict, mk, xla) -> dict:
    notes = [f"{e}: {PAST_LIMIT[fraction_at_long_end(r) <= 1]}" for e, r in (("megakernel", mk), ("XLA", xla))
             if r.device_fraction_of_limit > 1]  # fmt: skip
    if "+" in str(cell["dtype"]):
        notes.append(f"XLA computes with the {str(cell['dtype']).split('+')[0]} weights it dequantized once")
    return dict(
        cell, family="MoE" if measured_config(mk).num_experts else "dense",
        megakernel_ms=mk.device_ms, megakernel_low_ms=mk.device_low_ms, megakernel_high_ms=mk.device_high_ms,
        xla_ms=xla.device_ms, xla_low_ms=xla.device_low_ms, xla_high_ms=xla.device_high_ms,
        megakernel_GB=mk.step_GB, xla_GB=xla.step_GB, megakernel_fraction_of_limit=mk.device_fraction_of_limit,
        xla_fraction_of_limit=xla.device_fraction_of_limit, speedup=xla.device_ms / mk.device_ms,
        speedup_low=xla.device_low_ms / mk.device_high_ms, speedup_high=xla.device_high_ms / mk.device_low_ms,
        note="; ".join(notes), date=str(mk.date)[:10], xla_date=str(xla.date)[:10],
        commit=str(mk.commit).split(" ")[0], kernel_revision=int(mk.kernel_revision),
        kernel_digest=mk.kernel_digest if isinstance(mk.kernel_digest, str) else "not recorded",
    )  # fmt: skip


# The answer's groups, in the order the sentence says them: (name, which rows). bf16 only: a format's rows compare
# different weights in the two engines (the table has them).
GROUPS = {
    "one user, 1K": lambda t: (t.batch == 1) & (t.context == 1024),
    "dense, one user, 1K": lambda t: (t.family == "dense") & (t.batch == 1) & (t.context == 1024),
    "eight users, 1K": lambda t: (t.batch == 8) & (t.context == 1024),
    "one user, 8K and longer": lambda t: (t.batch == 1) & (t.context > 1024),
    "MoE, one user, 1K": lambda t: (t.family == "MoE") & (t.batch == 1) & (t.context == 1024),
}
GROUP_COLUMNS = ["group", "cells", "median_speedup", "min_speedup", "max_speedup", "megakernel_min_fraction",
                 "megakernel_max_fraction", "xla_min_fraction", "xla_max_fraction", "models", "slowest"]  # fmt: skip
SAME = 0.01  # two median speed-ups closer than this are "about the same" in the sentence


def answer_groups(answer: pd.DataFrame) -> pd.DataFrame:
    """Per group of :data:`GROUPS` (bf16 cells): how many cells, the median speed-up and its range, and each engine's
    range of fractions of the limit."""
    t = answer[answer.dtype == "bf16"]
    # to the figures an exported table keeps (mk.units.SIGNIFICANT), so the sentence is the same from either
    t = t.assign(**{c: t[c].map(significant) for c in t.columns if c.startswith(("speedup", "megakernel_f", "xla_f"))})
    rows = []
    for name, which in GROUPS.items():
        g = t[which(t)]
        if g.empty:
            continue
        rows.append(dict(
            group=name, cells=len(g), median_speedup=statistics.median(g.speedup), min_speedup=g.speedup.min(),
            max_speedup=g.speedup.max(), megakernel_min_fraction=g.megakernel_fraction_of_limit.min(),
            megakernel_max_fraction=g.megakernel_fraction_of_limit.max(),
            xla_min_fraction=g.xla_fraction_of_limit.min(), xla_max_fraction=g.xla_fraction_of_limit.max(),
            models=", ".join(sorted(set(g.model))), slowest=g.model[g.speedup.idxmin()],
        ))  # fmt: skip
    return pd.DataFrame(rows, columns=GROUP_COLUMNS).assign(kind=KIND)


def value_range(lo: float, hi: float, fmt: str, unit: str = "") -> str:
    """``lo``-``hi`` in ``fmt`` with ``unit``; one value where both read the same (never "1.03-1.03x")."""
    a, b = format(lo, fmt), format(hi, fmt)
    return f"{a}{unit}" if a == b else f"{a}-{b}{unit}"


def _compared(this: float, that: float, more: str, less: str) -> str:
    """Words for median speed-up ``this`` against ``that``: ``more``, ``less`` or about the same (:data:`SAME`)."""
    return "about the same as" if abs(this - that) < SAME else more if this > that else less


def _positions(contexts) -> str:
    """A span of contexts in words: "8K-128K" (one: "8K")."""
    lo, hi = (f"{c // 1024}K" if c % 1024 == 0 else f"{c:,}" for c in (min(contexts), max(contexts)))
    return lo if lo == hi else f"{lo}-{hi}"


def answer_sentence(answer: pd.DataFrame) -> str:
    """The measured answer in one sentence, computed from :func:`measured_answer`'s rows: the typical speed-up at one
    user on dense models, how it changes with users and with context (against every model's at one user and 1K), and
    on MoE models at one user (against dense), each a median with its range and count of cells, and each engine's
    fractions of the limit where they say the most; the chips and dates it was measured on."""
    g = answer_groups(answer).set_index("group")
    if g.empty:
        return "No cell has been measured with both engines on a TPU yet (python -m mk tpu-measure)."

    def said(name: str) -> str:
        r = g.loc[name]
        cells = f"{r.cells} cell{'s' if r.cells > 1 else ''}"
        return f"{r.median_speedup:.2f}x ({value_range(r.min_speedup, r.max_speedup, '.2f', 'x')}, {cells})"

    def reads(name: str, limit: str = "the chip's measured read limit") -> str:
        r = g.loc[name]
        mk, xla = (value_range(lo, hi, ".2f") for lo, hi in ((r.megakernel_min_fraction, r.megakernel_max_fraction),
                                                        (r.xla_min_fraction, r.xla_max_fraction)))  # fmt: skip
        return f"the kernel reading {mk} of {limit} and XLA {xla}"

    parts, base = [], g.median_speedup.get("one user, 1K")
    if "dense, one user, 1K" in g.index:
        parts.append(f"at one user and 1K positions on dense models the megakernel's speed-up over XLA's compiled step "
                     f"is {said('dense, one user, 1K')}, {reads('dense, one user, 1K')}")  # fmt: skip
    long = answer[GROUPS["one user, 8K and longer"](answer)].context
    spans = {"eight users, 1K": "with eight users", "one user, 8K and longer": f"at {_positions(long)} positions"}
    for name, what in spans.items():
        if name in g.index and base is not None:
            change = _compared(g.median_speedup[name], base, "larger than", "smaller than")
            parts.append(f"{what} it is {said(name)}, {change} at one user and 1K")
    if "MoE, one user, 1K" in g.index:
        moe, dense = g.median_speedup["MoE, one user, 1K"], g.median_speedup.get("dense, one user, 1K")
        than = "" if dense is None else f", {_compared(moe, dense, 'more than', 'less than')} on dense models"
        low = g.loc["MoE, one user, 1K"]
        parts.append(f"on MoE models at one user it is {said('MoE, one user, 1K')}{than}, the least on {low.slowest} "
                     f"({low.min_speedup:.2f}x), {reads('MoE, one user, 1K', 'the limit')}")  # fmt: skip
    chips = ", ".join(sorted(set(answer.chip)))
    dates = sorted(set(answer.date) | set(answer.xla_date))
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    head = f"Measured on one {chips} chip ({when}; bf16, device time, both engines interleaved in each cell): "
    return head + "; ".join(parts) + "."
