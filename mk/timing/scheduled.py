"""The megakernel's own clock: the bundles libtpu's compiler schedules for a step, read from data/schedule/.

mk.measure.compiler_schedule compiles a plan's kernel ahead of time and writes one CSV a kernel's code (the plan's
code fingerprint, which plans at any context with KV tiles of the same size share; the kernel's revision, data/
kernel_revisions.csv, whose last row is the code in this tree) and libtpu version: rows of
bundles, each with the factors it issues per (the trips of a user's loop over a layer type's KV tiles,
``kv_tiles.sliding``; the share of routed expert slots that run, ``Routed``) and the scope it was emitted in (an
item's kind, mk.plan.item_scope). Rows from the kernel as it runs (``plain``) count the step; rows from the same
kernel compiled with its named scopes kept (``scoped``) say which items the bundles belong to. This module reads them
and evaluates them for a plan at its own context: no compile, no libtpu.

The core issues one bundle a cycle unless it waits: for a DMA or a semaphore, or, as a v5e measured (notebook 12:
data/measured/tpu_clock.csv), for a unit's result (a chain of matrix products, a norm's cross-lane sum and rsqrt), where
it issues well under one a cycle. A step's compute time with the DMA and semaphore waits taken out is therefore each
bundle at :func:`seconds_a_bundle`'s rate: the rate measured for its kind of work where one was measured on such a chip,
one cycle of the chip's clock (data/chips.csv ``clock_hz``, derived from cited figures) elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import pandas as pd

from ..chips import Chip, measured_issue_rates
from ..files import source_digest
from ..paths import KERNEL_DIR, KERNEL_REVISIONS_CSV, SCHEDULE_DIR
from ..plan import ROUTED, Op, StepPlan, Wait, item_scope
from .constants import assumed_costs, assumed_label, fitted_costs

KIND = "compiler-scheduled"
PLAIN, SCOPED = "plain", "scoped"  # the kernel as it runs; the same kernel with its named scopes kept as marks
STEP = "step"  # the scope of the plain compile's rows: the whole step
OTHER = "other"  # bundles in no item's scope: loop control, set-up, the barrier between chips
KV_TILES = "kv_tiles."  # + a layer type: the trips of one user's loop over that type's KV tiles
COLUMNS = (
    "plan",
    "libtpu",
    "model",
    "chip",
    "context",
    "batch",
    "setup",
    "revision",
    "compile",
    "scope",
    "factors",
    "bundles",
    "compile_s",
    "date",
    "commit",
    "jax",
    "program",  # the digest of the kernel's traced program (mk.megakernel.aot.program_digest); blank: not recorded
)


@lru_cache(maxsize=None)
def kernel_revisions() -> pd.DataFrame:
    """data/kernel_revisions.csv: each revision of the megakernel's code, the op kinds its change targets
    (comma-separated), the digests of mk/megakernel/'s code that are that revision (``kernel_digests``, space-separated;
    blank: not recorded) and what changed; the last row is the kernel in this tree (a change to the kernel's code adds a
    row and stores the schedules for it: python -m mk schedule --missing, which carries a plan's rows over where its
    traced program is unchanged and compiles the rest).

    A revision is a number a person gives, so the file also records what it names: each revision's digests. A change
    to mk/megakernel/ changes :func:`kernel_digest`, and tests/test_provenance.py fails until the file says what the
    new code is: a new row where the kernel's programs changed, or the new digest appended to the last row's where
    they did not (a comment, a rename; tests/test_compiler_schedule.py holds the stored programs to this tree's). A row
    measured on a chip records the digest it computed there and the revision that digest is (:func:`recorded_revision`),
    never a number the tree declares."""
    return pd.read_csv(KERNEL_REVISIONS_CSV, keep_default_na=False)


def kernel_revision() -> int:
    """The revision of the megakernel's code in this tree (data/kernel_revisions.csv's last row)."""
    return int(kernel_revisions()["revision"].max())


def kernel_digest() -> str:
    """The digest of the megakernel's code in this tree: mk/megakernel/'s source as it is on the disk here
    (mk.files.source_digest), computed where it runs."""
    return source_digest(KERNEL_DIR)


def revision_digests(revision: int | None = None) -> set[str]:
    """The digests of mk/megakernel/'s code data/kernel_revisions.csv records for ``revision`` (default: the last)."""
    revs = kernel_revisions()
    rev = kernel_revision() if revision is None else revision
    return {d for cell in revs.loc[revs["revision"] == rev, "kernel_digests"] for d in str(cell).split()}


def recorded_revision(digest: str | None = None) -> int | None:
    """The revision whose code has ``digest`` (default: this tree's, :func:`kernel_digest`) in
    data/kernel_revisions.csv; None where no row records it (the kernel changed and the file does not say so yet): a
    measured row's ``kernel_revision``, looked up from the code that ran rather than declared."""
    digest = kernel_digest() if digest is None else digest
    found = [int(r.revision) for r in kernel_revisions().itertuples() if digest in str(r.kernel_digests).split()]
    return found[-1] if found else None


def current_kernel(rows: pd.DataFrame) -> pd.Series:
    """Which of ``rows`` (a measured CSV's) ran the megakernel's code in this tree: a row with a ``kernel_digest``
    where it is this tree's or one the last revision records (:func:`revision_digests`); a row without one (measured
    before rows carried it, blank) where its ``kernel_revision`` is the last revision. False for a row with neither."""
    blank = pd.Series("", index=rows.index)
    digest = rows["kernel_digest"] if "kernel_digest" in rows else blank
    digest = digest.astype(object).fillna("").astype(str).str.strip()
    revision = pd.to_numeric(rows["kernel_revision"] if "kernel_revision" in rows else blank, errors="coerce")
    now = revision_digests() | {kernel_digest()}
    return ((digest != "") & digest.isin(now)) | ((digest == "") & (revision == kernel_revision()))


def schedule_file(plan: StepPlan, libtpu: str, folder: Path | None = None, revision: int | None = None) -> Path:
    """Where a plan's rows for a libtpu version and kernel ``revision`` (default: this tree's) live."""
    rev = kernel_revision() if revision is None else revision
    return Path(folder or SCHEDULE_DIR) / f"{plan.code_fingerprint}_k{rev}_libtpu-{libtpu}.csv"


@lru_cache(maxsize=64)
def _read(path: Path, mtime: float) -> pd.DataFrame:
    return pd.read_csv(path, dtype={"factors": str, "plan": str, "libtpu": str, "program": str}, keep_default_na=False)


def stored_rows(
    plan: StepPlan, libtpu: str | None = None, folder: Path | None = None, revision: int | None = None
) -> pd.DataFrame | None:
    """The stored rows of ``plan``'s schedule for kernel ``revision`` (default: this tree's) and ``libtpu`` (else the
    newest stored version), or None."""
    rev = kernel_revision() if revision is None else revision
    found = sorted(Path(folder or SCHEDULE_DIR).glob(f"{plan.code_fingerprint}_k{rev}_libtpu-*.csv"))
    if libtpu is not None:
        found = [p for p in found if p == schedule_file(plan, libtpu, folder, rev)]
    if not found:
        return None
    path = max(found, key=lambda p: p.stat().st_mtime)
    return _read(path, path.stat().st_mtime)


def factor_values(plan: StepPlan) -> dict[str, float]:
    """What each factor a row names is for ``plan``: the trips of a user's loop over each layer type's KV tiles at the
    plan's context, and the share of the routed expert slots that run for the chip that sets the pace (its expected
    distinct experts over its slots; exact where the slots run as one loop over all of them)."""
    values = {KV_TILES + t: float(plan.kv_tiles_read(t)) for t in set(plan.share.layer_types)}
    if plan.expert_slots:
        values[ROUTED] = sum(m * p for m, p in plan.pacing_experts.items()) / plan.expert_slots
    return values


def evaluate(rows: pd.DataFrame, values: dict[str, float]) -> pd.Series:
    """Each row's bundles times its factors' values."""

    def times(factors: str) -> float:
        names = [f for f in factors.split("*") if f]
        missing = [f for f in names if f not in values]
        if missing:
            raise ValueError(f"the schedule's rows name factors {missing} this plan does not have")
        return math.prod(values[f] for f in names)

    return rows["bundles"] * rows["factors"].map(times)


def item_counts(plan: StepPlan) -> dict[str, float]:
    """How many items of each scope one step runs on the chip that sets the pace: an expert slot's items as often as
    that slot holds an expert (mk.plan.item_scope names the scopes)."""
    dist = plan.pacing_experts
    live = {j: sum(p for m, p in dist.items() if m > j) for j in range(plan.expert_slots)}
    loads = {ld.id: ld for ld in plan.loads}
    counts: dict[str, float] = {}
    for it in plan.items:
        load = None if isinstance(it, Op) else loads[it.load]
        slot = it.expert if load is None else load.expert
        scope = item_scope(it, load)
        counts[scope] = counts.get(scope, 0.0) + (1.0 if slot is None else live[slot])
    return counts


@dataclass(frozen=True)
class ScheduledStep:
    """A plan's step as the compiler scheduled it: bundles issued in one step (the plain compile), and by item scope
    (the scoped compile's, scaled to the step's: the marks cost it ``scoped_overhead`` more bundles)."""

    plan: StepPlan
    chip: Chip
    libtpu: str
    revision: int  # of the kernel's code (data/kernel_revisions.csv)
    bundles: float
    by_scope: dict[str, float]
    counts: dict[str, float]
    scoped_overhead: float
    hbm_s: float = math.nan  # the HBM time of the step's bytes (mk.timing.pace.scheduled_pace gives it)
    stalls: bool = True  # bundles waiting on a unit at their measured issue rate (seconds_a_bundle), else the clock

    @property
    def clock_hz(self) -> float:
        return self.chip.clock_hz

    def bundle_s(self, scope: str) -> float:
        """Seconds a bundle of ``scope`` issues in, as mk.timing charges it (:func:`seconds_a_bundle`)."""
        return seconds_a_bundle(self.chip, self.stalls)(scope)

    @property
    def compute_s(self) -> float:
        """The step's issued bundles in seconds, every DMA and semaphore wait taken out: each scope's at
        :meth:`bundle_s` (the scoped bundles sum to the step's)."""
        return sum(b * self.bundle_s(scope) for scope, b in self.by_scope.items())

    @property
    def rates(self) -> str:
        """How bundles become seconds here, in words: the clock, and the measured issue rates where they apply."""
        words = f"{self.clock_hz / 1e9:.3f} GHz clock, derived (data/chips.csv)"
        return words + stall_words(self.chip, seconds_a_bundle(self.chip, self.stalls))

    def ops(self) -> list[dict]:
        """Per scope: items a step runs, bundles each, ns each (at :meth:`bundle_s`; ``other`` has no items)."""
        out = []
        for scope, b in sorted(self.by_scope.items(), key=lambda kv: -kv[1]):
            n = self.counts.get(scope)
            each = b / n if n else math.nan
            ns_each = each * self.bundle_s(scope) * 1e9
            out.append(dict(kind=scope, count=n, bundles=b, bundles_each=each, ns_each=ns_each))
        return out

    def to_dict(self) -> dict:
        return dict(
            kind=KIND,
            model=self.plan.model.name,
            chip=self.chip.name,
            context=self.plan.context,
            batch=self.plan.users,
            plan=self.plan.code_fingerprint,
            libtpu=self.libtpu,
            kernel_revision=self.revision,
            bundles_per_step=self.bundles,
            clock_hz=self.clock_hz,
            clock_source=self.chip.clock_source,
            bundle_rates=self.rates,
            compute_ms=self.compute_s * 1e3,
            hbm_ms=self.hbm_s * 1e3,
            scoped_overhead=self.scoped_overhead,
            ops=self.ops(),
        )


def scheduled_step(
    plan: StepPlan,
    chip: Chip,
    rows: pd.DataFrame | None = None,
    folder: Path | None = None,
    revision: int | None = None,
) -> ScheduledStep:
    """``plan``'s step on ``chip`` from its schedule's rows (default: the ones stored in data/schedule or ``folder`` for
    kernel ``revision``, default this tree's). Refuses a chip with no clock rate and a plan with no rows, naming the
    command that makes them."""
    if math.isnan(chip.clock_hz):
        raise ValueError(f"data/chips.csv derives no clock rate for {chip.base}; add clock_hz with its derivation")
    rows = stored_rows(plan, folder=folder, revision=revision) if rows is None else rows
    if rows is None:
        rev = kernel_revision() if revision is None else revision
        raise LookupError(
            f"no stored schedule for this plan ({plan.code_fingerprint}) and kernel revision {rev} in data/schedule; "
            "compile it with libtpu: python -m mk schedule ... --store"
        )
    values = factor_values(plan)
    issued = evaluate(rows, values)
    plain, scoped = rows["compile"] == PLAIN, rows["compile"] == SCOPED
    total, traced = float(issued[plain].sum()), float(issued[scoped].sum())
    by_scope = issued[scoped].groupby(rows["scope"][scoped]).sum() * (total / traced)
    return ScheduledStep(
        plan,
        chip,
        str(rows["libtpu"].iloc[0]),
        int(rows["revision"].iloc[0]),
        total,
        {k: float(v) for k, v in by_scope.items()},
        item_counts(plan),
        traced / total - 1,
    )


_COSTS: dict[tuple, dict | None] = {}
# The scopes whose bundles wait on a unit's result, by the kind of work a clock check times (mk.measure.chip_clock):
# a tile's matrix products on the MXU's, a norm's mean and rsqrt on the cross-lane and transcendental units'. The
# schedule does not show these waits; on the v5e a chain of either takes well over a cycle a bundle (tpu_clock.csv).
WAITS_ON = {"matmul": ("MatmulTile", "HeadTile"), "vector": ("Norm", "QKVNormRope")}


def seconds_a_bundle(chip: Chip, stalls: bool = True) -> Callable[[str], float]:
    """A scope's (mk.plan.item_scope) seconds a scheduled bundle on ``chip``: one cycle of its clock, or, with
    ``stalls``, where the scope's work waits on a unit's result (:data:`WAITS_ON`), one bundle at the issue rate
    measured on such a chip for that work (mk.chips.measured_issue_rates; the clock where none was measured)."""
    rates = measured_issue_rates(chip.name) if stalls else {}
    by_prefix = {p: 1 / rates[w] for w, ps in WAITS_ON.items() if w in rates for p in ps}

    def seconds(scope: str) -> float:
        return by_prefix.get(scope.partition(".")[0], 1 / chip.clock_hz)

    return seconds


def scheduled_costs(plan: StepPlan, chip: Chip, revision: int | None = None, stalls: bool = True) -> dict | None:
    """The core's costs mk.plan.timeline charges, from the stored schedule of ``plan`` on ``chip`` for kernel
    ``revision`` (default: this tree's; None where none is stored or the chip has no clock rate): an op's issued
    bundles with its tile's wait (``compute_s``), a DMA start's by its tile's component (``dma_issue_s``), and the
    bundles in no item's scope (loop control, set-up) spread over the ops a step runs (``op_overhead_s``), each
    bundle at :func:`seconds_a_bundle` (``stalls``: with the measured waits of matrix products and norms)."""
    rev = kernel_revision() if revision is None else revision
    key = (plan.code_fingerprint, plan.context, chip.name, rev, stalls)
    if key not in _COSTS:
        try:
            s = scheduled_step(plan, chip, revision=rev)
        except (LookupError, ValueError):
            _COSTS[key] = None
        else:
            _COSTS[key] = _costs(s, seconds_a_bundle(chip, stalls))
    return _COSTS[key]


def _costs(s: ScheduledStep, bundle_s: Callable[[str], float]) -> dict:
    each = {o["kind"]: o["bundles_each"] * bundle_s(o["kind"]) for o in s.ops() if o["count"]}
    loads = {ld.id: ld for ld in s.plan.loads}
    ops = sum(n for scope, n in s.counts.items() if not scope.startswith(("Start.", "Wait.")))

    def compute_s(op: Op) -> float:
        wait = 0.0 if op.load is None else each.get(item_scope(Wait(op.load), loads[op.load]), 0.0)
        return each.get(item_scope(op), 0.0) + wait

    return dict(
        compute_s=compute_s,
        dma_issue_s=lambda ld: each.get(f"Start.{ld.component}", 0.0),
        op_overhead_s=s.by_scope.get(OTHER, 0.0) / ops * bundle_s(OTHER),
        source=f"{KIND} (libtpu {s.libtpu}, code {s.plan.code_fingerprint}, kernel revision {s.revision})"
        + stall_words(s.chip, bundle_s),
    )


def stall_words(chip: Chip, bundle_s: Callable[[str], float]) -> str:
    """``bundle_s``'s charge beyond the clock, in words ('' where it charges every bundle one cycle)."""
    cycles = {w: bundle_s(ps[0]) * chip.clock_hz for w, ps in WAITS_ON.items()}
    slower = {w: x for w, x in cycles.items() if x != 1}
    if not slower:
        return ""
    said = ", ".join(f"{'+'.join(WAITS_ON[w])} {x:.2f}x" for w, x in slower.items())
    return f"; bundles waiting on a unit at the measured issue rate ({said} the clock's cycle; tpu_clock.csv)"


def op_costs_label(kind: str) -> str:
    """Where a modelled megakernel step's per-op costs come from on ``kind`` chips, in words (a table's kind, a
    figure's footer): the compiler's schedule where data/schedule keeps the plan's (TPUs), else data/timing.csv's."""
    other = assumed_label(assumed_costs(kind), fitted_costs(kind))
    if kind != "tpu":
        return other
    return f"per-op costs {KIND} (libtpu's schedule, data/schedule) where it keeps the plan's, else {other}"
