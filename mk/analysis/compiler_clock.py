"""The kernel's own clock as tables (notebook 11): where the compiler's scheduled bundles go, the step's issue time
against its HBM time by context and users, the cost per op it implies beside the assumed one, and what each revision of
the kernel's code bought. Every number is read
from data/schedule/ (mk.timing.scheduled), compiled once by ``python -m mk schedule``."""

from __future__ import annotations

import pandas as pd

from ..chips import get_chip
from ..kernel_setup import KernelSetup
from ..timing import GivenCosts, named_plan, predict, scheduled_pace
from ..timing.constants import assumed_costs
from ..timing.scheduled import KIND, OTHER, ScheduledStep, kernel_revisions, scheduled_step


def scope_table(step: ScheduledStep) -> pd.DataFrame:
    """One row per scope of the step's code (mk.plan.item_scope: an op kind, a weight tile's start, wait or product by
    component, ``other`` for loop control and set-up): items a step runs, bundles, bundles and ns each, ns a step and
    its share of the step's issue time. The ns are the bundles as mk.timing charges them (``step.bundle_s``: the issue
    rate measured for work that waits on a unit, the clock elsewhere)."""
    t = pd.DataFrame(step.ops())
    parts = t.kind.str.partition(".")
    ns = pd.Series([b * step.bundle_s(scope) * 1e9 for scope, b in zip(t.kind, t.bundles)], index=t.index)
    return t.assign(
        op_kind=parts[0], detail=parts[2], ns=ns, time_share=ns / (step.compute_s * 1e9), kind_of_number=KIND
    )[["kind", "op_kind", "detail", "count", "bundles", "bundles_each", "ns_each", "ns", "time_share",
       "kind_of_number"]]  # fmt: skip


def op_kind_table(step: ScheduledStep) -> pd.DataFrame:
    """:func:`scope_table` summed by op kind (a weight tile's DMA start and wait and every matrix product together),
    the longest issue time first."""
    t = scope_table(step)
    g = t.groupby("op_kind", sort=False).agg(count=("count", "sum"), bundles=("bundles", "sum"), ns=("ns", "sum"))
    g["ns_each"] = g.ns / g["count"].where(g["count"] > 0)
    g["time_share"] = g.ns / (step.compute_s * 1e9)
    return g.sort_values("ns", ascending=False).reset_index().assign(kind_of_number=KIND)


def issue_against_hbm(model, chip: str, contexts, users, setup: KernelSetup) -> pd.DataFrame:
    """For each context and users: the step's issued bundles and their time as mk.timing charges them (compute with
    every DMA and semaphore wait taken out: ScheduledStep.compute_s) beside the HBM time of the same step's bytes,
    from the stored schedule of the plan's code (rows without one say so and carry no numbers)."""
    c = get_chip(chip)
    rows = []
    for b in users:
        for n in contexts:
            plan = named_plan(model, chip, n, b, setup)
            row = dict(model=plan.model.name, chip=c.name, context=n, users=b, code=plan.code_fingerprint)
            try:
                s = scheduled_pace(plan, c)
            except LookupError:
                rows.append(dict(row, stored=False))
                continue
            rows.append(
                dict(
                    row, stored=True, bundles=s.bundles, compute_ms=s.compute_s * 1e3, hbm_ms=s.hbm_s * 1e3,
                    compute_over_hbm=s.compute_s / s.hbm_s,
                )
            )  # fmt: skip
    return pd.DataFrame(rows).assign(kind=f"{KIND} + modelled (the HBM time: mk.timing.pace's floor)")


def per_op_costs(step: ScheduledStep) -> pd.DataFrame:
    """The cost per op the schedule gives (its compute time over the ops a step runs, and the bundles in no item's
    scope alone, spread the same way) beside the assumed per-op cost data/timing.csv charges by default."""
    ops = sum(n for scope, n in step.counts.items() if not scope.startswith(("Start.", "Wait.")))
    assumed = assumed_costs(step.chip.kind)["op_overhead_s"]
    return pd.DataFrame(
        [
            dict(cost="every issued bundle, per op", ns_per_op=step.compute_s / ops * 1e9, kind=KIND),
            dict(
                cost="bundles in no op's scope (loop control, set-up), per op",
                ns_per_op=step.by_scope.get(OTHER, 0.0) * step.bundle_s(OTHER) / ops * 1e9,
                kind=KIND,
            ),
            dict(cost="assumed per op (data/timing.csv)", ns_per_op=assumed * 1e9, kind="modelled (assumed)"),
        ]
    ).assign(ops_per_step=ops)


def scheduled_against_assumed(model, chip: str, contexts, users, setup: KernelSetup) -> pd.DataFrame:
    """The modelled step (mk.timing.predict) with the core's costs from the compiler's schedule, where data/schedule
    has the plan's (``op_costs`` says), against the same step with data/timing.csv's assumed costs."""
    c = get_chip(chip)
    costs = GivenCosts.assumed(c.kind)
    rows = []
    for b in users:
        for n in contexts:
            sched, assumed = predict(model, c, n, b, setup=setup), predict(model, c, n, b, setup=setup, costs=costs)
            rows.append(
                dict(
                    model=sched.model, context=n, users=b, op_costs=sched.op_costs, step_ms=sched.step_s * 1e3,
                    assumed_step_ms=assumed.step_s * 1e3, fraction_of_sol=sched.fraction_of_sol,
                    assumed_fraction_of_sol=assumed.fraction_of_sol,
                )
            )  # fmt: skip
    return pd.DataFrame(rows).assign(kind="modelled (mk.timing.predict: compiler-scheduled or assumed costs)")


def _bundles_each(s: ScheduledStep, kind: str) -> float:
    """Bundles an op of ``kind`` issues, over every op of it (``Attend``: ``Attend.full`` and ``Attend.sliding``)."""
    ops = [o for o in s.ops() if o["count"] and (o["kind"] == kind or o["kind"].startswith(kind + "."))]
    return sum(o["bundles"] for o in ops) / sum(o["count"] for o in ops) if ops else float("nan")


def revision_effect(model, chip: str, points, setup: KernelSetup) -> pd.DataFrame:
    """What each revision of the kernel's code bought (data/kernel_revisions.csv), at each (context, users) of
    ``points``: the bundles each of the op kinds the revision's change targets issues, the step's bundles, and the
    modelled step and fraction of the speed of light with that revision's schedule (mk.timing.predict), beside the
    revision before. Every revision whose schedule data/schedule keeps for the point's plan has a row; a point with
    none says so."""
    c = get_chip(chip)
    revisions = kernel_revisions()
    targets = list(dict.fromkeys(k for kinds in revisions.op_kinds for k in kinds.split(",") if k))  # comma-separated
    rows = []
    for n, b in points:
        plan = named_plan(model, chip, n, b, setup)
        point = dict(model=plan.model.name, chip=c.name, context=n, users=b, setup=setup.name)
        kept = []
        for r in revisions.itertuples():
            try:
                s = scheduled_step(plan, c, revision=r.revision)
            except LookupError:
                continue
            p = predict(model, c, n, b, setup=setup, costs=GivenCosts(revision=r.revision))
            each = {k: _bundles_each(s, k) for k in targets}
            kept.append(
                dict(
                    point, revision=r.revision, change=r.change,
                    **{f"{k} bundles each": each[k] for k in targets},
                    bundles_per_step=s.bundles, step_ms=p.step_s * 1e3, fraction_of_sol=p.fraction_of_sol,
                )
            )  # fmt: skip
        if not kept:
            rows.append(dict(point, revision=float("nan"), change="no stored schedule for this point's plan"))
        for before, after in zip([None] + kept, kept):
            rows.append(
                dict(after, step_saved_ms=float("nan") if before is None else before["step_ms"] - after["step_ms"])
            )
    return pd.DataFrame(rows).assign(kind=f"{KIND} + modelled (mk.timing.predict with each revision's schedule)")
