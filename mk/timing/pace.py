"""The megakernel's pace: one kernel per step, each chip following its own plan, weight tiles streaming at the
chip's HBM bandwidth while compute runs behind them (mk.plan.timeline), and the step waiting for the chip that sets
the pace (the busiest chip under whole experts, its distribution exact under uniform routing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..chips import Chip
from ..plan import Load, StepPlan, step_ends, timeline
from .bandwidth import copy_latency, read_rate
from .constants import assumed_costs
from .scheduled import ScheduledStep, scheduled_costs, scheduled_step
from .work import compute_seconds, link_latency, load_bytes


@dataclass(frozen=True)
class Pace:
    """The step of the chip that sets the megakernel's pace (:func:`pace`), expected over its experts per layer."""

    experts_per_layer: float  # distinct routed experts a layer the chip fetches
    expert_share: float  # the share of each fetched expert's bytes the chip holds (1 whole, 1/C split over C chips)
    weight_bytes: float  # as the DMAs move them, the layout's padding included
    weight_payload_bytes: float  # without the padding
    kv_bytes: float
    sent_bytes: float  # the chip sends over the links a step
    hbm_floor_s: float  # the moved bytes at the HBM read rate charged
    payload_floor_s: float  # the payload's
    ici_s: float  # the links' time: bytes at a link's bandwidth plus the latency of every round (0: a loopback's)
    step_s: float


def megakernel_costs(
    plan: StepPlan,
    chip: Chip,
    dtype: str | None = None,
    revision: int | None = None,
    bandwidth: float | None = None,
    stalls: bool = True,
    **assumed,
) -> dict:
    """What mk.plan.timeline charges on ``chip`` for ``plan`` (its tiles' bytes under the policy ``dtype``:
    mk.timing.work.load_bytes, default the plan's own): the core's cost of each op and DMA
    start, the link latency and each weight tile's bytes. The core's costs are the compiler's schedule of the kernel's
    ``revision`` (default: this tree's) where data/schedule has the plan's (mk.timing.scheduled) and no cost is
    ``assumed``; otherwise each op's FLOPs at the chip's rate plus the assumed per-op and per-DMA-issue costs
    (data/timing.csv's, or ``assumed``: a sensitivity). ``bandwidth``: the HBM read rate a chip is charged (bytes/s;
    default mk.timing.bandwidth.read_rate's, a sensitivity otherwise). ``stalls``: the schedule's bundles that wait
    on a unit charged at the chip's measured issue rate (mk.timing.scheduled.seconds_a_bundle; False: at its clock)."""
    nbytes = load_bytes(plan, dtype)
    load_b = {id(ld): nbytes(ld) for ld in plan.loads}  # once: the pacing chip's variants walk the plan many times
    common = dict(
        ici_latency_s=link_latency(chip),
        dma_latency_s=copy_latency(chip).seconds,
        load_bytes=lambda ld: load_b[id(ld)],
        bandwidth=read_rate(chip).per_chip if bandwidth is None else bandwidth,
    )
    scheduled = op_costs(plan, chip, revision, stalls, **assumed)
    if scheduled is not None:
        return dict(common, **{k: v for k, v in scheduled.items() if k != "source"})
    compute = compute_seconds(plan, chip)
    op_s = {id(op): compute(op) for op in plan.ops}
    return dict(assumed_costs(chip.kind, **assumed), compute_s=lambda op: op_s[id(op)], **common)


def op_costs(plan: StepPlan, chip: Chip, revision: int | None = None, stalls: bool = True, **assumed) -> dict | None:
    """The compiler-scheduled costs of the core for ``plan`` and the kernel's ``revision`` (default: this tree's;
    mk.timing.scheduled.scheduled_costs), unless a cost is ``assumed`` (a sensitivity) or data/schedule has none for
    it: then None."""
    if any(v is not None for v in assumed.values()):
        return None
    return scheduled_costs(plan, chip, revision, stalls)


def _likely(dist: dict[int, float], tail: float = 1e-9) -> dict[int, float]:
    """The most likely counts of ``dist`` that hold all but ``tail`` of its probability, renormalised: the
    counts :func:`pace` walks a timeline for (the rest moves an expected step by less than ``tail`` of it)."""
    kept, mass = {}, 0.0
    for m, p in sorted(dist.items(), key=lambda mp: -mp[1]):
        if mass >= 1 - tail:
            break
        kept[m], mass = p, mass + p
    return {m: p / mass for m, p in sorted(kept.items())}


def _every_layer(plan: StepPlan, experts: int) -> dict[int, int]:
    return {i: experts for i in range(plan.share.num_layers)}


def _loaded(plan: StepPlan, nbytes: Callable[[Load], float]) -> Callable[[int], float]:
    """Weight bytes the DMAs move with m experts fetched in every layer, as a function of m (the plan's loads
    summed once, by expert slot)."""
    shared, by_slot = 0.0, {}
    for ld in plan.loads:
        if ld.expert is None:
            shared += nbytes(ld)
        else:
            by_slot[ld.expert] = by_slot.get(ld.expert, 0.0) + nbytes(ld)
    return lambda m: shared + sum(b for slot, b in by_slot.items() if slot < m)


def pace(
    plan: StepPlan,
    chip: Chip,
    dtype: str | None = None,
    distribution: dict[int, float] | None = None,
    revision: int | None = None,
    bandwidth: float | None = None,
    stalls: bool = True,
    **assumed,
) -> Pace:
    """The step of the chip that sets the pace, expected over its experts per layer (``distribution``,
    default the plan's ``pacing_experts``): each count m's timeline with m experts in every layer, weighted by
    its probability (the counts that hold all but 1e-9 of it); the core's costs from the kernel's ``revision``
    (:func:`megakernel_costs`). Exact where a layer's time depends on its own
    count only (layers add up); the all-reduce that closes each layer makes the slowest chip's layer
    everyone's."""
    dist = {m: p for m, p in (distribution or plan.pacing_experts).items() if p > 0}
    costs = megakernel_costs(plan, chip, dtype, revision, bandwidth, stalls, **assumed)
    timed = _likely(dist)

    def expect(f, over=timed):
        return sum(p * f(m) for m, p in over.items())

    moved, payload = load_bytes(plan, dtype), load_bytes(plan, dtype, "payload_bytes")
    weights, real = expect(_loaded(plan, moved)), expect(_loaded(plan, payload))
    cross = [op for op in plan.ops if op.sent_bytes]
    ici_s = sum(op.wire_bytes / chip.ici_bandwidth + op.rounds * costs["ici_latency_s"] for op in cross)
    if plan.setup is not None and plan.setup.loopback:  # chip 0 alone: no links, its exchanges local copies
        chip, costs, ici_s = *loopback(chip, costs), 0.0
    bw = costs["bandwidth"]
    counts = [_every_layer(plan, m) for m in timed]
    ends = dict(zip(timed, step_ends(plan, chip, counts, **costs)))
    return Pace(
        experts_per_layer=expect(float, dist),
        expert_share=plan.expert_share,
        weight_bytes=weights,
        weight_payload_bytes=real,
        kv_bytes=plan.kv_bytes,
        sent_bytes=sum(op.sent_bytes for op in cross),
        hbm_floor_s=(weights + plan.kv_bytes) / bw,
        payload_floor_s=(real + plan.kv_bytes) / bw,
        ici_s=ici_s,
        step_s=expect(ends.__getitem__),
    )


def loopback(chip: Chip, costs: dict) -> tuple[Chip, dict]:
    """``chip`` and the ``costs`` :func:`megakernel_costs` gives it, for chip 0 of its slice run alone with its
    exchanges made local copies (mk.kernel_setup.KernelSetup.loopback, a stand-in): each round one copy's fixed time
    (mk.timing.bandwidth.copy_latency) in place of a link's latency, its bytes at the HBM read rate in place of a
    link's."""
    return replace(chip, ici_bandwidth=costs["bandwidth"]), dict(costs, ici_latency_s=costs["dma_latency_s"])


def pace_timeline(plan: StepPlan, chip: Chip, dtype: str | None = None, experts: int | None = None, **assumed):
    """The timeline (mk.plan.timeline rows) of the chip that sets the pace, ``experts`` fetched in every layer
    (default: the expected number, rounded), with the costs :func:`pace` charges."""
    dist = plan.pacing_experts
    n = round(sum(m * p for m, p in dist.items())) if experts is None else experts
    costs = megakernel_costs(plan, chip, dtype, **assumed)
    if plan.setup is not None and plan.setup.loopback:
        chip, costs = loopback(chip, costs)
    return timeline(plan, chip, _every_layer(plan, n), **costs)


def scheduled_pace(plan: StepPlan, chip: Chip, rows=None, folder=None) -> ScheduledStep:
    """``plan``'s compiler-scheduled step (mk.timing.scheduled.scheduled_step) with the HBM time of its bytes: the
    floor :func:`pace` gives the same plan."""
    return replace(scheduled_step(plan, chip, rows, folder), hbm_s=pace(plan, chip).hbm_floor_s)
