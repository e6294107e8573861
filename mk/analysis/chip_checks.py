"""The chip's own checks of what the timing model assumes (notebook 12), each a table read from a file that
``python -m mk tpu-measure`` wrote on a TPU (mk.measure.tpu_runs):

- **knock-outs** (tpu_knockouts.csv): each component switched off in turn, the step's shrink in device time, beside
  the component's bytes at the chip's measured limit and the timing model's shrink of the same step;
- **the clock** (tpu_clock.csv): an issue-bound kernel's scheduled bundles over its device time, against the clock the
  model turns bundles into time with;
- **the attention anchor** (tpu_attention.csv): JAX's ragged paged attention beside the megakernel's attention, by
  context, and each one's rate for one more cached byte;
- **kernel revisions** (tpu_logs/, :data:`REVISION_RUNS`): a revision of the megakernel against the one before it,
  both interleaved with XLA's compiled reference in one run (data/kernel_revisions.csv says what each changed)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..chips import ISSUE_BOUND, measured_chip, trips_share
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
)


def _read(name: str, folder) -> pd.DataFrame:
    path = Path(folder or MEASURED_DIR) / name
    return pd.read_csv(path) if path.exists() else pd.DataFrame()


def knockout_table(folder=None) -> pd.DataFrame:
    """Each knock-out measured on the chip (of a cell measured more than once, the runs' median of each column) beside
    its bytes at the limit and the timing model's shrink of the same step, ms."""
    t = _read(KNOCKOUTS_CSV, folder)
    if t.empty:
        return t
    keys = ["model", "layers", "setup", "dtype", "context", "batch", "component"]
    num = ["whole_ms", "device_step_ms", "shrink_ms", "shrink_low_ms", "shrink_high_ms", "bytes_at_limit_ms"]
    g = t.groupby(keys, sort=False, dropna=False)
    out = g[num].median().join(g.size().rename("runs")).join(g.verdict.last()).join(g.device.last()).reset_index()
    out = out[out.component != WHOLE]
    modelled = []
    for (model, layers, setup, dtype, context, batch), rows in out.groupby(keys[:-1], sort=False):  # a step's cell
        # the CSV names the cut model; a stand-in's step is modelled without its links (on_tpu.modelled_step)
        row = dict(base_model=model.partition("[")[0], layers=layers, setup=setup, dtype=dtype, context=context,
                   batch=batch, engine="megakernel", chip=measured_chip(rows.device.iloc[0]))  # fmt: skip
        whole = on_tpu.modelled_step(row, on_tpu.measured_prediction(row))
        modelled += [(whole - on_tpu.modelled_step(row, on_tpu.measured_prediction(row, knockout={c}))) * 1e3
                     for c in rows.component]  # fmt: skip
    what = [on_tpu.cell_words(m, s, d) for m, s, d in zip(out.model, out.setup, out["dtype"])]
    return out.assign(what=what, modelled_shrink_ms=modelled, kind="measured (TPU, device time) beside modelled")


def clock_table(folder=None) -> pd.DataFrame:
    """Each kind of issue-bound kernel: its scheduled bundles a trip, its device time a trip (the two trip counts'
    difference), the clock that implies against the assumed one, and the device time over the bundles' time at it."""
    t = _read(CLOCK_CSV, folder)
    if t.empty:
        return t
    rows = []
    for (date, kind), g in t.groupby(["date", "kind"], sort=False):
        lo, hi = g.iloc[0], g.iloc[-1]
        trip_bundles = (hi.bundles - lo.bundles) / (hi.trips - lo.trips)
        share = trips_share(lo, hi)
        rows.append(dict(
            date=date, work=kind, trips=f"{lo.trips}-{hi.trips}", bundles_a_trip=trip_bundles,
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
    t = t[t.date == t.date.max()]
    return t.assign(slope_fraction_of_limit=t.slope_GBps / t.limit_GBps)[
        ["model", "batch", "engine", "context", "kv_bytes", "device_step_ms", "device_step_low_ms",
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
        without = on_tpu.modelled_step(r, at_clock) * 1e3
        rows.append(dict(
            model=r.model, setup=r.setup, dtype=r["dtype"], context=r.context, batch=r.batch, device_ms=r.device_ms,
            modelled_ms=r.modelled_ms, error=r.error, at_clock_ms=without, error_at_clock=without / r.device_ms - 1,
            op_costs=at_clock.op_costs,
        ))  # fmt: skip
    return pd.DataFrame(rows).assign(kind="measured (TPU, device time) against modelled (mk.timing)")


def revision_table(folder=None, runs=REVISION_RUNS) -> pd.DataFrame:
    """Each cell of each :data:`REVISION_RUNS` run: the megakernel's device time at the revision before and after
    (medians of steps back to back, 95% intervals), the change, and XLA's reference timed in the same loop where the
    cell has one (a stand-in has none)."""
    rows = []
    for name in runs:
        t = pd.read_csv(Path(folder or TPU_LOGS_DIR) / name)
        setups = t["setup"] if "setup" in t else pd.Series("one chip", index=t.index)
        t = t.assign(setup=setups.fillna("one chip"), revision=t.variant.str.extract(r"\[r(\d+)\]")[0])
        for (model, setup, context, batch), g in t.groupby(["model", "setup", "context", "batch"], sort=False):
            kernels = g.dropna(subset=["revision"]).sort_values("revision", key=lambda r: r.astype(int))
            before, after = kernels.iloc[0], kernels.iloc[-1]
            xla = g[g.variant == "reference"].device_step_ms
            rows.append(dict(
                what=on_tpu.cell_words(model, setup, "bf16"), context=int(context), batch=int(batch),
                revisions=f"{before.revision} -> {after.revision}", before_ms=before.device_step_ms,
                before_low_ms=before.device_step_low_ms, before_high_ms=before.device_step_high_ms,
                after_ms=after.device_step_ms, after_low_ms=after.device_step_low_ms,
                after_high_ms=after.device_step_high_ms, change=after.device_step_ms / before.device_step_ms - 1,
                xla_ms=xla.iloc[0] if len(xla) else float("nan"),
                xla_over_after=xla.iloc[0] / after.device_step_ms if len(xla) else float("nan"),
                rounds=int(after.rounds), date=str(after.date)[:10], source=f"tpu_logs/{name}",
            ))  # fmt: skip
    return pd.DataFrame(rows).assign(kind="measured (TPU, device time), interleaved in one run")
