"""The chip's own checks of what the timing model assumes (notebook 12), each a table read from a file that
``python -m mk tpu-measure`` wrote on a TPU (mk.measure.tpu_runs):

- **knock-outs** (tpu_knockouts.csv): each component switched off in turn, the step's shrink in device time, beside
  the component's bytes at the chip's measured limit and the timing model's shrink of the same step;
- **the clock** (tpu_clock.csv): an issue-bound kernel's scheduled bundles over its device time, against the clock the
  model turns bundles into time with;
- **the attention anchor** (tpu_attention.csv): JAX's ragged paged attention beside the megakernel's attention, by
  context, and each one's rate for one more cached byte;
- **kernel revisions** (tpu_logs/, :data:`REVISION_RUNS`): a revision of the megakernel against the one before it,
  both interleaved with XLA's compiled reference in one run (data/kernel_revisions.csv says what each changed);
- **probes** (tpu_logs/, :data:`PROBES`): a kernel built with one piece of its work left out or changed, timed
  interleaved with the kernel it differs from (each CSV's script beside it says how it was built);
- **formats** (tpu_logs/, :data:`FORMAT_RUNS`): the kernel streaming a shipped format against itself on bf16.

Each reads only the rows taken on a TPU (mk.analysis.on_tpu.chip_rows, by each row's device), and a cell measured on
two kinds of chip stays two cells, each set against its own chip's model."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..chips import ISSUE_BOUND, measured_chip, measured_limit, trips_share
from ..config import get_config
from ..kernel_setup import WORKBOOK_KERNEL
from ..params import NORMS, ROUTE_WAIT, ROUTER, knocked_out
from ..paths import MEASURED_DIR, TPU_LOGS_DIR
from ..timing import GivenCosts
from . import on_tpu

KNOCKOUTS_CSV, CLOCK_CSV, ATTENTION_CSV = "tpu_knockouts.csv", "tpu_clock.csv", "tpu_attention.csv"
WHOLE = "(whole step)"
# The runs that timed a kernel revision against the one before it on the chip (each CSV's script beside it); a
# variant ``megakernel[rN]`` is revision N.
REVISION_RUNS = (
    "2026-12-05-packed-heads.csv",
    "2026-12-06-slot-zero.csv",
    "2026-12-06-slot-zero-stand-in.csv",
    "2026-12-06-slot-zero-stand-in-8.csv",
    "2026-12-07-head-tiles-r4-r5.csv",  # r4: revision 5's kernel building revision 4's head (its program, same digest)
)

# A routed model's knock-outs that change which experts are read: the router's (every user takes the first experts)
# and the norms' (the residual stream overflows and routing picks none): their shrinks are not those components' cost
ROUTING_KNOCKOUTS = {
    ROUTER: "not like for like: every user takes the first experts, so other experts are read",
    ROUTE_WAIT: "not like for like: as the router's, and the first experts' tiles load before the route",
    NORMS: "not like for like: routing then runs on un-normed activations (the 26B-A4B's overflow and its router picks "
    "no expert, so the experts' tiles are skipped)",
}

# The chip's probes: (run, variant, the variant it differs from, what it changes); each run's script beside its CSV
PROBES = (
    ("2026-12-06-layer-vectors.csv", "shared-rms", "base", "the residual's three norms of x share one rsqrt (exact)"),
    ("2026-12-06-layer-vectors.csv", "static-vectors", "base", "each layer's norm weights read at a fixed row"),
    ("2026-12-06-head-norms.csv", "no-head-norms", "base", "the q, k and v heads' norms passed through"),
    ("2026-12-06-logits-out.csv", "step, picks only", "step, logits out", "no logits written, the picks alone"),
    ("2026-12-06-floor.csv", "fixed-route", "base", "the router knocked out: routing fixed, its projection not read"),
    ("2026-12-06-floor.csv", "fixed-route-no-exchanges", "fixed-route", "the exchanges' local copies left out"),
    ("2026-12-06-route-wait.csv", "fixed-route-no-route-wait", "fixed-route",
     "the experts' loads free to start before the route (logits equal)"),
    ("2026-12-06-floor.csv", "floor", "base", "every component knocked out: the floor"),
    ("2026-12-06-floor.csv", "floor-bare", "floor", "the floor less its route, residuals and exchanges' copies"),
    ("2026-12-06-floor-layers.csv", "1 layers", "30 layers", "the floor of the first layer alone"),
)  # fmt: skip


def _read(name: str, folder) -> pd.DataFrame:
    """A TPU table of data/measured/ (or ``folder``): its rows taken on a TPU."""
    path = Path(folder or MEASURED_DIR) / name
    return on_tpu.chip_rows(pd.read_csv(path)) if path.exists() else pd.DataFrame()


def _read_run(name: str, folder) -> pd.DataFrame:
    """A run's CSV in tpu_logs/: its rows taken on a TPU, each row's setup named ("one chip" where the run had none)."""
    t = on_tpu.chip_rows(pd.read_csv(Path(folder or TPU_LOGS_DIR) / name))
    setups = t["setup"] if "setup" in t else pd.Series("one chip", index=t.index)
    return t.assign(setup=setups.fillna("one chip"))


def knockout_table(folder=None) -> pd.DataFrame:
    """Each knock-out measured on the chip (of a cell measured more than once at the same steps a call, the runs'
    median of each column) beside its bytes at the limit and the timing model's shrink of the same step, ms."""
    t = _read(KNOCKOUTS_CSV, folder)
    if t.empty:
        return t
    # rows from before the column were timed one step a call
    steps = t["steps_a_call"] if "steps_a_call" in t else pd.Series(float("nan"), index=t.index)
    t = t.assign(steps_a_call=steps.fillna(1).astype(int))
    keys = ["device", "model", "layers", "setup", "dtype", "context", "batch", "steps_a_call", "component"]
    num = ["whole_ms", "device_step_ms", "shrink_ms", "shrink_low_ms", "shrink_high_ms", "bytes_at_limit_ms"]
    g = t.groupby(keys, sort=False, dropna=False)
    out = g[num].median().join(g.size().rename("runs")).join(g.verdict.last()).reset_index()
    out = out[out.component != WHOLE]
    out = out.assign(bytes_at_limit_ms=[_at_limit(r) for _, r in out.iterrows()])
    modelled = []
    for (device, model, layers, setup, dtype, context, batch, _), rows in out.groupby(keys[:-1], sort=False):  # a cell
        # the CSV names the cut model; a stand-in's step is chip 0's alone, its exchanges local copies
        row = dict(base_model=model.partition("[")[0], layers=layers, setup=setup, dtype=dtype, context=context,
                   batch=batch, engine="megakernel", chip=measured_chip(device))  # fmt: skip
        whole = on_tpu.measured_prediction(row).step_s
        modelled += [(whole - on_tpu.measured_prediction(row, knockout=knocked_out(c)).step_s) * 1e3
                     for c in rows.component]  # fmt: skip
    what = [on_tpu.cell_words(m, s, d) for m, s, d in zip(out.model, out.setup, out["dtype"])]
    routed = [get_config(m.partition("[")[0]).is_moe for m in out.model]
    verdict = [ROUTING_KNOCKOUTS[c] if moe and c in ROUTING_KNOCKOUTS else v
               for moe, c, v in zip(routed, out.component, out.verdict)]  # fmt: skip
    return out.assign(what=what, modelled_shrink_ms=modelled, verdict=verdict,
                      kind="measured (TPU, device time) beside modelled")  # fmt: skip


def _at_limit(r) -> float:
    """A knock-out row's bytes at the chip's measured limit, ms: as measured, or for a stand-in (whose run could not
    count them) what chip 0 streams of the component (mk.analysis.on_tpu.stand_in_bytes)."""
    if r.bytes_at_limit_ms == r.bytes_at_limit_ms or not str(r.setup).endswith(on_tpu.STAND_IN):
        return r.bytes_at_limit_ms
    row = dict(base_model=r.model.partition("[")[0], layers=r.layers, setup=r.setup, dtype=r["dtype"],
               context=r.context, batch=r.batch, chip=measured_chip(r.device))  # fmt: skip
    component = ROUTER if r.component == ROUTE_WAIT else r.component  # the route's wait: the router's bytes
    limit = measured_limit(row["chip"])
    nbytes = on_tpu.stand_in_bytes(row).get(component)
    return float("nan") if limit is None or nbytes is None else nbytes / limit.bandwidth * 1e3


def clock_table(folder=None) -> pd.DataFrame:
    """Each kind of issue-bound kernel: its scheduled bundles a trip, its device time a trip (the two trip counts'
    difference), the clock that implies against the assumed one, and the device time over the bundles' time at it."""
    t = _read(CLOCK_CSV, folder)
    if t.empty:
        return t
    rows = []
    for (device, date, kind), g in t.groupby(["device", "date", "kind"], sort=False):
        lo, hi = g.iloc[0], g.iloc[-1]
        trip_bundles = (hi.bundles - lo.bundles) / (hi.trips - lo.trips)
        share = trips_share(lo, hi)
        rows.append(dict(
            device=device, date=date, work=kind, trips=f"{lo.trips}-{hi.trips}", bundles_a_trip=trip_bundles,
            device_ns_a_trip=(hi.device_us - lo.device_us) / (hi.trips - lo.trips) * 1e3,
            longest_call_us=hi.device_us, clock_GHz=hi.clock_GHz, clock_low_GHz=hi.clock_low_GHz,
            clock_high_GHz=hi.clock_high_GHz, assumed_clock_GHz=hi.assumed_clock_GHz,
            time_over_schedule=hi.assumed_clock_GHz / hi.clock_GHz, trips_share=share,
            verdict="issue-bound: a clock" if share > ISSUE_BOUND else "the call's fixed cost hides the trips",
        ))  # fmt: skip
    return pd.DataFrame(rows).assign(kind="measured (TPU, device time) against the compiler's schedule")


def attention_table(folder=None) -> pd.DataFrame:
    """The anchor and the megakernel's attention at each context (device ms), and each one's rate for one more cached
    byte as a fraction of the chip's measured limit."""
    t = _read(ATTENTION_CSV, folder)
    if t.empty:
        return t
    t = t[t.date == t.groupby("device").date.transform("max")]  # each chip's newest run
    return t.assign(slope_fraction_of_limit=t.slope_GBps / t.limit_GBps)[
        ["device", "model", "batch", "engine", "context", "kv_bytes", "device_step_ms", "device_step_low_ms",
         "device_step_high_ms", "slope_GBps", "slope_low_GBps", "slope_high_GBps", "slope_fraction_of_limit",
         "limit_GBps", "kernel_revision", "commit"]
    ].assign(kind="measured (TPU, device time)")  # fmt: skip


def stall_effect(steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """The megakernel's measured steps beside the model's with the schedule's waits on a unit charged at the chip's
    measured issue rate (the default, mk.timing.scheduled.seconds_a_bundle) and without (every bundle one cycle of
    the clock): each one's error against the device's time. A step whose plan has no stored schedule is charged
    assumed op costs either way (``op_costs`` says which): the clock check moves only the others."""
    t = on_tpu.tpu_steps() if steps is None else steps
    rows = []
    for _, r in t[t.engine == "megakernel"].iterrows():
        at_clock = on_tpu.measured_prediction(r, GivenCosts(stalls=False))  # its op costs' source is the default's
        without = at_clock.step_s * 1e3
        rows.append(dict(
            model=r.model, setup=r.setup, dtype=r["dtype"], context=r.context, batch=r.batch, device_ms=r.device_ms,
            modelled_ms=r.modelled_ms, error=r.error, at_clock_ms=without, error_at_clock=without / r.device_ms - 1,
            op_costs=at_clock.op_costs,
        ))  # fmt: skip
    return pd.DataFrame(rows).assign(kind="measured (TPU, device time) against modelled (mk.timing)")


def revision_table(folder=None, runs=REVISION_RUNS) -> pd.DataFrame:
    """Each cell of each :data:`REVISION_RUNS` run (and steps a call, where a run timed several): the megakernel's
    device time a token at the revision before and after (medians of steps back to back, 95% intervals), the change,
    and XLA's reference timed in the same loop where the cell has one (a stand-in, or a model too big for both, has
    none)."""
    rows = []
    for name in runs:
        t = _read_run(name, folder)
        steps = t["steps_a_call"] if "steps_a_call" in t else pd.Series(float("nan"), index=t.index)
        t = t.assign(revision=t.variant.str.extract(r"\[r(\d+)\]")[0], steps_a_call=steps.fillna(1).astype(int))
        cells = t.groupby(["model", "setup", "context", "batch", "steps_a_call"], sort=False)
        for (model, setup, context, batch, steps_a_call), g in cells:
            kernels = g.dropna(subset=["revision"]).sort_values("revision", key=lambda r: r.astype(int))
            before, after = kernels.iloc[0], kernels.iloc[-1]
            xla = g[g.variant == "reference"].device_step_ms
            rows.append(dict(
                what=on_tpu.cell_words(model, setup, "bf16"), context=int(context), batch=int(batch),
                steps_a_call=int(steps_a_call), revisions=f"{before.revision} -> {after.revision}",
                before_ms=before.device_step_ms,
                before_low_ms=before.device_step_low_ms, before_high_ms=before.device_step_high_ms,
                after_ms=after.device_step_ms, after_low_ms=after.device_step_low_ms,
                after_high_ms=after.device_step_high_ms, change=after.device_step_ms / before.device_step_ms - 1,
                xla_ms=xla.iloc[0] if len(xla) else float("nan"),
                xla_over_after=xla.iloc[0] / after.device_step_ms if len(xla) else float("nan"),
                rounds=int(after.rounds), date=str(after.date)[:10], source=f"tpu_logs/{name}",
            ))  # fmt: skip
    return pd.DataFrame(rows).assign(kind="measured (TPU, device time), interleaved in one run")


def probe_table(folder=None, probes=PROBES) -> pd.DataFrame:
    """Each of :data:`PROBES`'s variants beside the one it differs from, for every cell of its run: both device times
    (medians of steps back to back, 95% intervals), the change in ms, and whether it lies beyond both intervals."""
    rows = []
    for name, variant, against, change in probes:
        t = _read_run(name, folder)
        # a run of one kernel at several depths names its variants by their layers
        t = t.assign(variant=t["variant"] if "variant" in t else t["layers"].astype(str) + " layers")
        for (model, setup, context, batch), g in t.groupby(["model", "setup", "context", "batch"], sort=False):
            by = g.set_index("variant")
            if variant not in by.index:
                continue
            a, b = by.loc[against], by.loc[variant]
            beyond = b.device_step_high_ms < a.device_step_low_ms or b.device_step_low_ms > a.device_step_high_ms
            rows.append(dict(
                what=on_tpu.cell_words(model, setup, "bf16"), context=int(context), batch=int(batch), probe=variant,
                against=against, change=change, against_ms=a.device_step_ms, against_low_ms=a.device_step_low_ms,
                against_high_ms=a.device_step_high_ms, probe_ms=b.device_step_ms, probe_low_ms=b.device_step_low_ms,
                probe_high_ms=b.device_step_high_ms, difference_ms=b.device_step_ms - a.device_step_ms,
                beyond_both_intervals=bool(beyond), date=str(b.date)[:10], source=f"tpu_logs/{name}",
            ))  # fmt: skip
    return pd.DataFrame(rows).assign(kind="measured (TPU, device time), interleaved in one run")


# Runs of the kernel streaming a shipped format on the chip, beside itself on bf16 where the run timed it too (each
# kernel interleaved with XLA's compiled reference on bf16 weights; the kernels one after the other in the same run):
# (run, the format)
FORMAT_RUNS = (
    ("2026-12-06-fp8-block.csv", "fp8-block"),
    ("2026-12-06-four-bit-timed-3.csv", "int4"),
    ("2026-12-06-four-bit-timed-2.csv", "mxfp4"),  # its bf16 kernel not timed: the call ran out
)


def format_table(folder=None, runs=FORMAT_RUNS) -> pd.DataFrame:
    """Each cell of each :data:`FORMAT_RUNS` run: the megakernel's device time on the format (medians of steps back to
    back, 95% intervals) against XLA's on bf16 in the same loop, and, where the run timed it, against the same kernel
    on bf16 (with XLA's in that kernel's loop): the speed-ups, the format's bytes a token over bf16's, and each
    kernel's fraction of the measured limit for its own bytes."""
    rows = []
    for name, fmt in runs:
        t = _read_run(name, folder)
        for (model, context, batch), g in t.groupby(["model", "context", "batch"], sort=False):
            kernels = _with_their_xla(g)
            (f, xf), (b, xb) = kernels[fmt], kernels.get("bf16", (None, None))
            bf16 = {} if b is None else dict(
                bf16_ms=b.device_step_ms, bf16_low_ms=b.device_step_low_ms, bf16_high_ms=b.device_step_high_ms,
                xla_bf16_ms=xb.device_step_ms, speedup_over_bf16=b.device_step_ms / f.device_step_ms,
                bytes_over_bf16=f.bytes_per_token / b.bytes_per_token,
                bf16_fraction_of_limit=on_tpu.fraction_of_limit(b.bytes_per_token, b.device_step_ms / 1e3, b.chip),
            )  # fmt: skip
            rows.append(dict(
                what=model, context=int(context), batch=int(batch), format=fmt,
                format_ms=f.device_step_ms, format_low_ms=f.device_step_low_ms, format_high_ms=f.device_step_high_ms,
                xla_ms=xf.device_step_ms, speedup_over_xla=xf.device_step_ms / f.device_step_ms,
                format_fraction_of_limit=on_tpu.fraction_of_limit(f.bytes_per_token, f.device_step_ms / 1e3, f.chip),
                **bf16, date=str(f.date)[:10],
                source=f"tpu_logs/{name}",
            ))  # fmt: skip
    return pd.DataFrame(rows).assign(kind="measured (TPU, device time); each kernel interleaved with XLA's in one run")


def _with_their_xla(cell: pd.DataFrame) -> dict:
    """A cell's kernels by data type, each with the XLA row timed in its loop (the reference row before it)."""
    out, xla = {}, None
    for r in cell.itertuples():
        if r.engine == "reference":
            xla = r
        elif r.engine == "megakernel":
            out[r.dtype] = (r, xla)
    return out


# The probes that each take one piece of the stand-in's one-user step away without changing its bytes: (probe, the
# piece in words). Not the router's knock-out: what it saves there is about its projection's bytes at the limit
SHARE_PARTS = (
    ("fixed-route-no-route-wait", "the experts' loads held back for their route"),
    ("fixed-route-no-exchanges", "the exchanges' local copies"),
    ("step, picks only", "writing the logits out"),
    ("shared-rms", "the residual norms' separate rsqrts"),
)


def stand_in_share_parts(steps: pd.DataFrame, probes: pd.DataFrame | None = None, context: int = 1024) -> pd.DataFrame:
    """The stand-in's one-user step past its bytes at the chip's measured limit (its newest measured row in ``steps``,
    :func:`mk.analysis.on_tpu.tpu_steps`), and the part of it each of :data:`SHARE_PARTS` removes on the chip (ms):
    what holds its share of the limit under 1."""
    p = probe_table() if probes is None else probes
    setup = WORKBOOK_KERNEL.name + on_tpu.STAND_IN
    mine = steps[(steps.setup == setup) & (steps.context == context) & (steps.batch == 1)
                 & (steps.engine == "megakernel")]  # fmt: skip
    if mine.empty or p.empty:
        return pd.DataFrame()
    row = mine.sort_values("date").iloc[-1]
    past = row.device_ms * (1 - row.device_fraction_of_limit)
    what = on_tpu.cell_words(row.model, setup, "bf16")
    stand_in = p[(p.what == what) & (p.batch == 1) & (p.context == context)].set_index("probe")
    rows = [dict(part="the step past its bytes at the limit", ms=past, share_of_past=1.0, source="tpu.csv")]
    for probe, words in SHARE_PARTS:
        if probe in stand_in.index:
            ms = -stand_in.loc[probe, "difference_ms"]
            rows.append(dict(part=words, ms=ms, share_of_past=ms / past, source=stand_in.loc[probe, "source"]))
    placed = sum(max(r["ms"], 0.0) for r in rows[1:])
    rows.append(dict(part="not placed by these probes", ms=past - placed, share_of_past=1 - placed / past, source=""))
    kind = "measured (TPU, device time): the step's row, and probes interleaved with their kernel"
    return pd.DataFrame(rows).assign(step_ms=row.device_ms, fraction_of_limit=row.device_fraction_of_limit, kind=kind)
