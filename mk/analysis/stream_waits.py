"""Where the modelled weight stream waits: the time in a megakernel step when the DMA engine moves nothing, placed on
what the core is doing then.

The timing model (mk.plan.timeline, with the costs mk.timing.pace charges: the compiler's schedule of the kernel where
data/schedule keeps the plan's, the measured copy latency, the measured read rate) walks a step as one DMA engine and
one core. The engine's busy time is the step's bytes at the charged rate; every other moment of the step it waits: for
the core to free a slot, to compute a route, to issue the next copy. Each such moment is placed on the phase of the op
the core is in (the op's component, as the knock-outs name them, with the experts' combine apart; the links for a
slice's exchanges), or on ``between ops`` where the core is in none (issuing copies). The sum over phases is the
modelled step less its bytes' time: what a kernel built as this one loses to the stream's waits, by phase, set beside
what a measured row takes past its bytes (mk.analysis.moe_one_user) to say how much of that the model places.
"""

from __future__ import annotations

import pandas as pd

from ..chips import get_chip, measured_limit
from ..config import ModelConfig
from ..timing.pace import pace_timeline
from ..timing.work import named_plan
from .moe_one_user import SEVERAL, newest_rows
from .on_tpu import call_floor, cell_words, engine_bytes, kernel_setup_of, measured_config

KIND = "modelled (mk.plan.timeline: the compiler's schedule where kept, measured copy latency and read rate)"
COMBINE = "combine"  # the experts' weighted sum (ExpertCombine), apart from the expert stream
EXCHANGES = "exchanges"  # a slice's cross-chip rounds (the links' lane)
BETWEEN = "between ops"  # the core in no op: issuing the next copies
COLUMNS = ["phase", "wait_us", "wait_us_a_layer", "share_of_step"]


def _phase(row: dict) -> str:
    if row["lane"] == "ici":
        return EXCHANGES
    return COMBINE if row["what"] == "ExpertCombine" else row["component"]


def _busy(rows: list[dict]) -> list[tuple[float, float]]:
    """The DMA engine's busy intervals, merged."""
    merged: list[list[float]] = []
    for s, e in sorted((r["start_s"], r["end_s"]) for r in rows if r["lane"].startswith("dma")):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def _gaps(busy: list[tuple[float, float]], end: float) -> list[tuple[float, float]]:
    edges = [0.0] + [t for iv in busy for t in iv] + [end]
    return [(a, b) for a, b in zip(edges[::2], edges[1::2]) if b > a]


def waits_by_phase(rows: list[dict]) -> tuple[dict[str, float], float]:
    """Seconds the DMA engine waits in a timeline's ``rows``, by the phase of the core's op at the time (where the
    core and the links both run, the links'), and the step's end."""
    end = max(r["end_s"] for r in rows)
    gaps = _gaps(_busy(rows), end)
    work = sorted((r for r in rows if r["lane"] in ("compute", "ici")), key=lambda r: r["start_s"])
    out: dict[str, float] = {}
    i = 0
    for a, b in gaps:
        while i < len(work) and work[i]["end_s"] <= a:
            i += 1
        placed, j = {}, i
        while j < len(work) and work[j]["start_s"] < b:
            r = work[j]
            overlap = min(b, r["end_s"]) - max(a, r["start_s"])
            if overlap > 0:
                p = _phase(r)
                placed[p] = max(placed.get(p, 0.0), overlap) if p == EXCHANGES else placed.get(p, 0.0) + overlap
            j += 1
        ici = placed.pop(EXCHANGES, 0.0)
        core = sum(placed.values())
        scale = min(1.0, max(0.0, (b - a) - ici) / core) if core else 0.0  # the links first, then the core's ops
        for p, t in placed.items():
            out[p] = out.get(p, 0.0) + t * scale
        if ici:
            out[EXCHANGES] = out.get(EXCHANGES, 0.0) + min(ici, b - a)
        rest = (b - a) - min(ici, b - a) - core * scale
        if rest > 1e-15:
            out[BETWEEN] = out.get(BETWEEN, 0.0) + rest
    return out, end


def plan_waits(plan, chip: str) -> pd.DataFrame:
    """``plan``'s modelled step on ``chip`` (a loopback plan: chip 0 alone, its exchanges local copies), its stream
    waits by phase (the module's docstring): microseconds a step, a layer (over the model's layers) and their share of
    the step, largest first."""
    waits, end = waits_by_phase(pace_timeline(plan, get_chip(chip)))
    layers = plan.share.num_layers
    rows = [dict(phase=p, wait_us=s * 1e6, wait_us_a_layer=s * 1e6 / layers, share_of_step=s / end)
            for p, s in sorted(waits.items(), key=lambda kv: -kv[1])]  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS).assign(step_us=end * 1e6, kind=KIND)


def stream_waits(cfg: ModelConfig | str, chip: str = "tpu-v5e", context: int = 1024, batch: int = 1,
                 setup: str = "workbook", dtype: str = "bf16") -> pd.DataFrame:  # fmt: skip
    """:func:`plan_waits` of the plan the timing model gives ``cfg`` on ``chip`` in ``setup``."""
    return plan_waits(named_plan(cfg, chip, context, batch, setup, dtype, ()), chip)


PLACED_COLUMNS = ["model", "steps_a_call", "device_ms", "past_bytes_us", "uncounted_us", "call_share_us", "waits_us",
                  "unplaced_us", "kernel_revision", "date"]  # fmt: skip


def _measured_plan(r) -> tuple:
    """The plan a measured MoE row (mk.analysis.moe_one_user's) ran, the chip the model times it on, and the bytes
    its fraction of the limit is of (a stand-in's: chip 0's of its slice, alone; its share of the slice's bytes)."""
    row = dict(base_model=r.base_model, layers=r.layers, setup=r.setup, chip="tpu-v5e", dtype="bf16", context=1024,
               batch=1, engine="megakernel")  # fmt: skip
    chip, setup = kernel_setup_of(row)
    return named_plan(measured_config(row), chip, 1024, 1, setup, "bf16", ()), chip, engine_bytes(row)


def gap_placed(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What each MoE cell's newest kernel row at :data:`~mk.analysis.moe_one_user.SEVERAL` steps a call
    (mk.analysis.moe_one_user's rows: the kernel's own step, the call's cost spread thin; one chip, and chip 0 of a
    v5e-8 stood in for by one) takes past its bytes at the limit (measured), placed: the bytes the plan moves past
    those its fraction is of, at the limit (``uncounted_us``: the layout's padding; for a stand-in also what chip 0
    reads whole where its slice splits the rest, as the router), the row's share of the call's fixed time
    (mk.analysis.on_tpu.call_floor), the modelled stream's waits (:func:`plan_waits`; a stand-in's exchanges as local
    copies); and what none of them holds (``unplaced_us``: measured less the three). Returns the table, and the waits
    by phase of each cell (microseconds a step) beside it."""
    k = newest_rows(rows[(rows.engine == "megakernel") & (rows.steps_a_call == SEVERAL)], ["model", "setup"])
    limit = measured_limit("tpu-v5e").bandwidth
    out, phases = [], []
    for r in k.itertuples():
        plan, chip, counted = _measured_plan(r)
        uncounted = (plan.weight_bytes_max + plan.kv_bytes - counted) / limit
        waits = plan_waits(plan, chip)
        call = call_floor("tpu-v5e") / r.steps_a_call
        placed = uncounted * 1e6 + call * 1e6 + waits.wait_us.sum()
        what = cell_words(r.model, r.setup, "bf16")
        out.append(dict(
            model=what, steps_a_call=r.steps_a_call, device_ms=r.device_ms, past_bytes_us=r.past_bytes_us,
            uncounted_us=uncounted * 1e6, call_share_us=call * 1e6, waits_us=waits.wait_us.sum(),
            unplaced_us=r.past_bytes_us - placed, kernel_revision=r.kernel_revision, date=r.date,
        ))  # fmt: skip
        phases.append(waits[["phase", "wait_us"]].assign(model=what))
    table = pd.DataFrame(out, columns=PLACED_COLUMNS).assign(kind=f"measured (TPU) past its bytes; placed: {KIND}")
    by_phase = pd.concat(phases).pivot(index="model", columns="phase", values="wait_us").fillna(0.0) if phases else None
    return table, by_phase


def placed_sentence(table: pd.DataFrame, phases: pd.DataFrame | None) -> str:
    """What :func:`gap_placed` places, in one sentence: the share of each cell's time past its bytes the three parts
    hold, the phase whose waits are largest, and what is left."""
    t = table
    if t.empty or phases is None:
        return "No MoE cell at one user has a kernel row to place yet."
    share = 1 - t.unplaced_us / t.past_bytes_us
    top = phases.reindex(t.model).sum().sort_values(ascending=False)
    worst = t.loc[t.unplaced_us.idxmax()]
    return (
        f"At {int(t.steps_a_call.iloc[0])} steps a call the model places {100 * share.min():.0f}-"
        f"{100 * share.max():.0f}% of what each MoE cell takes past its bytes ({len(t)} cells): the bytes it moves "
        f"past those counted (up to {t.uncounted_us.max():.1f} us, {t.loc[t.uncounted_us.idxmax(), 'model']}), the "
        f"call's fixed time over its steps ({t.call_share_us.iloc[0]:.1f} us) and the stream's waits, most while the "
        f"core is in {top.index[0]} ({top.iloc[0]:.1f} us over the cells) and {top.index[1]} ({top.iloc[1]:.1f} us); "
        f"the most left unplaced is {worst.model}'s {worst.unplaced_us:.1f} us of {worst.past_bytes_us:.1f}"
        + (" (past 100%: the model's stream waits longer than the chip's)." if share.max() > 1 else ".")
    )
