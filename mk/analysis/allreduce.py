"""The in-kernel all-reduce priced from the step plans, and what each fix of the eight-chip step buys.

Every number here is modelled from one chip's plan (``mk.plan.build_plan`` with a ``KernelSetup``) and the timing
model (``mk.timing``, the one path from a plan to seconds): the all-reduces' payloads and the bytes each chip
sends (what the kernel sends: the users' rows, 2 at least in bf16; the head's argmax gather its whole 8-row
block), how much of the time on the link the weight DMAs stream through, and the step of the chip that sets
the pace after each fix (``mk.kernel_setup.FIXES``: whole -> split experts, the weight DMAs kept in flight across
the all-reduce, a bf16 payload, reduce-scatter + all-gather). A chip's sends leave over one link at its ICI
bandwidth (a simplification: a slice's chip has several links; ``links`` scales it as a sensitivity).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..chips import Chip, get_chip, slice_of, slice_shape
from ..config import FFN_LAYOUTS, ModelConfig, get_config
from ..kernel_setup import FIXES, WORKBOOK_KERNEL, Collective, KernelSetup, Placement
from ..plan import ROWS, AllReduce, GatherBest
from ..plan.layout import laid_out_intermediate
from ..published import published, published_table
from ..sharding import flat_ring_all_reduce, one_link_all_reduce, torus_all_reduce
from ..timing import DEFAULT_COSTS, MODELLED, GivenCosts, assumed_costs, link_latency, predict, step_plan
from ..units import LANE, positive_int

# Which partial sum each activation of an all-reduce is.
_ACTS = {"x": "embedding", "attn_out": "attention", "ffn": "shared MLP", "moe": "experts"}

# The all-reduce's algorithm and wire type, every combination: (algorithm, payload, switches).
SWITCHES = tuple(
    (algorithm, dtype, Collective(bf16_payload=bf16, reduce_scatter=rs))
    for rs, algorithm in ((False, "all to all"), (True, "reduce-scatter + all-gather"))
    for bf16, dtype in ((False, "f32"), (True, "bf16"))
)


def with_links(chip: Chip | str, links: int) -> Chip:
    """``chip`` with its sends spread evenly over ``links`` links (ICI bandwidth x links)."""
    chip = get_chip(chip)
    positive_int("links", links)
    return dataclasses.replace(chip, ici_bandwidth=chip.ici_bandwidth * links)


# The collective's payload ---------------------------------------------------------------------------
def reduces(op) -> str:
    """What a cross-chip op sums (or gathers), in words."""
    if isinstance(op, GatherBest):
        return "head argmax (gather)"
    return " + ".join(_ACTS.get(a, a) for a in op.acts)


def payload_table(cfg: ModelConfig, chip: Chip | str, batches, context: int = 1024) -> pd.DataFrame:
    """Every cross-chip op of one chip's step under each switch (``SWITCHES``), one row per kind of op and
    batch: the payload each chip contributes as the kernel sends it (the users' rows, rounded to whole
    packed rows in bf16; the FFN's shared MLP and experts travel together; the argmax gather's 8-row
    blocks), the bytes one chip sends, the rounds, how often a step does it, and the time at one link of
    the slice ``chip``'s ICI bandwidth plus its link latency per round (mk.timing.link_latency). Also what the
    users' own rows alone would send (``unpadded``)."""
    chip = get_chip(chip)
    chips, ici_latency_s = chip.chips, link_latency(chip)
    rows = []
    for batch in batches:
        for algorithm, dtype, coll in SWITCHES:
            setup = KernelSetup(placement=Placement.SPLIT, collective=coll, name=f"split experts, {algorithm}, {dtype}")
            plan = step_plan(cfg, chip, context, batch, "bf16", setup)
            ops = [op for op in plan.ops if isinstance(op, (AllReduce, GatherBest))]
            for what in dict.fromkeys(reduces(op) for op in ops):
                same = [op for op in ops if reduces(op) == what]
                op = same[0]
                if isinstance(op, AllReduce):
                    n = len(op.acts)
                    shape, wire, padded = (
                        f"{n} x {op.rows} x {op.width}",
                        "bf16" if op.itemsize == 2 else "f32",
                        op.rows,
                    )
                    payload, users = n * op.rows * op.width * op.itemsize, batch
                else:  # each chip's best value and its index, one [8, 128] f32 block each
                    shape, wire, padded = f"2 x {ROWS} x {LANE}", "f32", ROWS
                    payload, users = op.sent_bytes // (chips - 1), batch
                each_s = op.sent_bytes / chip.ici_bandwidth + op.rounds * ici_latency_s
                # the bytes sent are linear in the rows: what the users' own rows alone would send
                unpadded_s = op.sent_bytes * min(1.0, users / padded) / chip.ici_bandwidth + op.rounds * ici_latency_s
                rows.append(
                    dict(
                        model=cfg.name,
                        batch=batch,
                        algorithm=algorithm,
                        payload=dtype,
                        reduces=what,
                        per_step=len(same),
                        shape=shape,
                        wire=wire,
                        payload_bytes=payload,
                        sent_bytes=op.sent_bytes,
                        rounds=op.rounds,
                        sent_MB_per_step=len(same) * op.sent_bytes / 1e6,
                        ici_us_each=each_s * 1e6,
                        ici_ms_per_step=len(same) * each_s * 1e3,
                        unpadded_ms_per_step=len(same) * unpadded_s * 1e3,
                    )
                )
    return pd.DataFrame(rows)


def payloads_per_step(payloads: pd.DataFrame) -> pd.DataFrame:
    """:func:`payload_table` summed over a step: cross-chip ops, MB each chip sends, ICI time (padded rows,
    and the users' rows alone)."""
    keys = ["model", "batch", "algorithm", "payload"]
    return (
        payloads.groupby(keys, sort=False, as_index=False)
        .agg(
            ops=("per_step", "sum"),
            sent_MB_per_step=("sent_MB_per_step", "sum"),
            ici_ms_per_step=("ici_ms_per_step", "sum"),
            unpadded_ms_per_step=("unpadded_ms_per_step", "sum"),
        )
        .reset_index(drop=True)
    )


# How much of the link time the weight DMAs stream through -------------------------------------
def link_overlap(rows: list[dict]) -> dict:
    """Of a timeline's (mk.plan.timeline rows), the time on the link (lane "ici", compute waiting) and how
    much of it the DMA engine spends streaming weights and KV meanwhile (lane "dma"): what the overlap
    hides. Seconds, with the step."""
    t = pd.DataFrame(rows)
    ici, dma = t[t.lane == "ici"], t[t.lane == "dma"]
    s = np.maximum.outer(ici.start_s.to_numpy(), dma.start_s.to_numpy())
    e = np.minimum.outer(ici.end_s.to_numpy(), dma.end_s.to_numpy())
    return dict(
        step_s=t.end_s.max(),
        link_s=(ici.end_s - ici.start_s).sum(),
        dma_during_link_s=np.clip(e - s, 0, None).sum(),
    )


# The step after each fix ------------------------------------------------------------------------------
def published_step(key: str, cfg: ModelConfig, chip: Chip, context: int, batch: int) -> float:
    """The published step time ``key`` (data/published.csv) when it timed this model, slice, context and
    batch; NaN otherwise."""
    row = published_table().set_index("key").loc[key]
    same = (row.model, row.chip, int(row.context), int(row.batch)) == (cfg.name, chip.name, context, batch)
    return published(key) if same else float("nan")


def fix_steps(
    cfg: ModelConfig,
    chip: Chip | str,
    context: int,
    batch: int,
    fixes=FIXES,
    links: int = 1,
    costs: GivenCosts = DEFAULT_COSTS,
) -> pd.DataFrame:
    """The modelled step after each fix (``mk.kernel_setup.FIXES``: whole experts without overlap, then split
    experts, the overlap, a bf16 payload, reduce-scatter, the intermediate on rows) on the slice ``chip``
    (``tpu-v5e-8``), one row each: ``mk.timing.predict``'s step and the pacing chip's bytes and floors, beside
    its published time where data/published.csv has one for this model, slice, context and batch, the
    error modelled / published - 1, and where the step's per-op costs came from (``op_costs``: mk.timing.predict's,
    the compiler's schedule where data/schedule keeps the plan's, else assumed). ``links``: links a chip's sends
    spread over; ``costs`` (mk.timing.GivenCosts): op costs given (a sensitivity; default none: the schedule where it
    is kept, else data/timing.csv's)."""
    chip = with_links(chip, links)
    rows = []
    for fix in fixes:
        p = predict(cfg, chip, context, batch, setup=fix, costs=costs)
        b = p.pacing
        published = published_step(fix.published, cfg, chip, context, batch) if fix.published else float("nan")
        rows.append(
            dict(
                fix=fix.name,
                placement=str(fix.placement),
                overlap=fix.collective.overlap,
                bf16_payload=fix.collective.bf16_payload,
                reduce_scatter=fix.collective.reduce_scatter,
                ffn_layout=fix.ffn_layout,
                attention_split=str(fix.attention_split),
                pace="busiest chip" if fix.placement == Placement.WHOLE and cfg.is_moe else "every chip",
                experts_fetched=b.experts_per_layer,
                whole_experts_worth=b.experts_per_layer * b.expert_share,
                weight_GB=b.weight_bytes / 1e9,
                weight_payload_GB=b.weight_payload_bytes / 1e9,
                kv_GB=b.kv_bytes / 1e9,
                sent_MB=b.sent_bytes / 1e6,
                hbm_floor_ms=b.hbm_floor_s * 1e3,
                payload_floor_ms=b.payload_floor_s * 1e3,
                ici_ms=b.ici_s * 1e3,
                step_ms=p.step_s * 1e3,
                fraction_of_sol=p.fraction_of_sol,
                published_ms=published * 1e3,
                error=p.step_s / published - 1,
                op_costs=p.op_costs,
            )
        )
    return pd.DataFrame(rows).assign(kind=MODELLED)


def sensitivity(cfg: ModelConfig, chip: Chip | str, context: int, batch: int, links, overheads_s) -> pd.DataFrame:
    """:func:`fix_steps` for each number of ``links`` a chip's sends spread over and each assumed cost per op
    and per DMA issued in ``overheads_s`` (seconds; data/timing.csv's assumed value among them), charged to every op
    in place of the compiler's schedule (every row's ``op_costs`` is assumed): how far the model's simplifications
    move each fix. ``timing_csv``: the case of one link and data/timing.csv's assumed costs (not the model's default
    where data/schedule keeps a plan's schedule: :func:`fix_steps` with no cost given)."""
    chip = get_chip(chip)
    csv = assumed_costs(chip.kind)
    runs = [
        fix_steps(cfg, chip, context, batch, FIXES, n, GivenCosts(o, o)).assign(
            links=n,
            overhead_ns=o * 1e9,
            timing_csv=n == 1 and all(v == o for v in csv.values()),
        )
        for n in links
        for o in sorted({*overheads_s, *csv.values()})
    ]
    return pd.concat(runs, ignore_index=True)


def sensitivity_grid(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`sensitivity` as one row per fix and one column per case (``1 link, 300 ns``: the modelled step in
    ms; the case of data/timing.csv's assumed costs on one link marked ``(data/timing.csv)``), beside the published
    step: the cases read across."""

    def case(r) -> str:
        mark = " (data/timing.csv)" if r.timing_csv else ""
        return f"{r.links} link{'s' if r.links > 1 else ''}, {r.overhead_ns:g} ns{mark}"

    t = table.assign(case=[case(r) for r in table.itertuples()])
    grid = t.pivot_table(index="fix", columns="case", values="step_ms", sort=False)
    published = t.drop_duplicates("fix").set_index("fix").published_ms
    return grid.assign(published_ms=published).reset_index().rename_axis(columns=None)


def best_fits(table: pd.DataFrame) -> pd.DataFrame:
    """For each fix with a published time, the case of :func:`sensitivity` that comes closest to it."""
    timed = table.dropna(subset=["published_ms"])
    return timed.loc[timed.error.abs().groupby(timed.fix, sort=False).idxmin()].reset_index(drop=True)


def padding_table(cfg: ModelConfig, chip: Chip | str, context: int, batch: int) -> pd.DataFrame:
    """Per chip, FFN layout (mk.config.FFN_LAYOUTS) and placement, expected weight bytes by component as the DMAs
    move them (the "lanes" layout pads every matrix's intermediate to whole 128-lane tiles, "sublanes" to rows of 8)
    against the bytes that hold weights: the plan's ``weight_bytes`` against its ``payload_bytes`` (average chip,
    uniform routing), with the intermediate widths a chip holds and lays out."""
    chip = get_chip(chip)
    rows = []
    for layout in FFN_LAYOUTS[::-1]:  # the first layout first
        laid = cfg.replace(ffn_layout=layout)
        for placement in (Placement.WHOLE, Placement.SPLIT) if cfg.is_moe else (Placement.SPLIT,):
            setup = KernelSetup(placement=placement, ffn_layout=layout, name=f"{placement} experts, MLPs on {layout}")
            plan = step_plan(cfg, chip, context, batch, "bf16", setup)
            moved, payload = plan.bytes_by_component(), plan.bytes_by_component(payload=True)
            widths = {"shared_mlp": plan.share.mlp_intermediate, "experts": plan.share.expert_intermediate}
            for component in [*moved, "(all weights)"]:
                m = plan.weight_bytes if component == "(all weights)" else moved[component]
                p = plan.payload_bytes if component == "(all weights)" else payload[component]
                w = widths.get(component)
                rows.append(
                    dict(
                        ffn_layout=layout,
                        placement=str(placement),
                        component=component,
                        intermediate_per_chip=w,
                        laid_out=None if w is None else laid_out_intermediate(laid, w),
                        moved_GB=m / 1e9,
                        payload_GB=p / 1e9,
                        padding=m / p - 1,
                    )
                )
    return pd.DataFrame(rows)


# Past one host ----------------------------------------------------------------------------------------------
def torus_against_ring(chip: Chip | str, payloads_bytes, itemsize: int = 2) -> pd.DataFrame:
    """One all-reduce of each payload (bytes of a chip's partial sum: one row of payload / itemsize lanes) over the
    slice ``chip`` (a documented shape, data/slices.csv), three ways, the exchange's microseconds at its ICI bandwidth
    one way per link and link latency per round (mk.timing.link_latency): dimension by dimension over its torus
    (mk.sharding.links.torus_all_reduce, what the timing model charges past one host), one ring through all its
    chips (``flat ring``, both directions), and today's one-host model (reduce-scatter + all-gather, every byte over
    one link, two rounds). Rows: algorithm, payload, rounds, bytes a chip sends, its busiest link's bytes, seconds."""
    chip = get_chip(chip)
    shape = slice_shape(chip)
    if shape is None:
        raise ValueError(f"{chip.name}: data/slices.csv documents no such slice, so it has no torus to price")
    latency = link_latency(chip)
    rows = []
    for payload in payloads_bytes:
        width = max(1, int(payload) // itemsize)
        for algorithm, ex in (
            (f"torus {shape.topology}, dimension by dimension", torus_all_reduce(1, width, itemsize, shape.torus)),
            (f"flat ring over {chip.chips} chips", flat_ring_all_reduce(1, width, itemsize, chip.chips)),
            ("one link, reduce-scatter (one host's model)", one_link_all_reduce(
                Collective(bf16_payload=itemsize == 2, reduce_scatter=True), 1, width, chip.chips, itemsize)),
        ):  # fmt: skip
            rows.append(
                dict(
                    chip=chip.name, topology=shape.topology, algorithm=algorithm, payload_bytes=payload,
                    rounds=ex.rounds, sent_bytes=ex.sent_bytes, link_bytes=ex.link_bytes,
                    exchange_us=ex.seconds(chip.ici_bandwidth, latency) * 1e6,
                )
            )  # fmt: skip
    return pd.DataFrame(rows).assign(kind=MODELLED)


def allreduce_share(
    model, base_chip: str = "tpu-v5e", chips=(8, 16, 32, 64, 128, 256), context: int = 1024, batch: int = 1,
    dtype: str = "bf16", setup: KernelSetup = WORKBOOK_KERNEL,
) -> pd.DataFrame:  # fmt: skip
    """The modelled step (mk.timing.predict, ``setup`` as the timing model charges it over each slice: past one host
    the torus and whole experts over hosts, mk.sharding.pods) of ``model`` on slices of ``base_chip`` of each count in
    ``chips``, and the time its all-reduces hold compute on the link (the plan's AllReduce ops: their busiest link's
    bytes at one link's bandwidth plus their rounds' latency): chips, topology, hosts, step_ms, allreduce_ms, share
    (allreduce_ms / step_ms), whether the model fits the slice's HBM in ``dtype``."""
    cfg = get_config(model)
    rows = []
    for n in chips:
        chip = slice_of(base_chip, n)
        shape, latency = slice_shape(chip), link_latency(chip)
        p = predict(cfg, chip, context, batch, dtype=dtype, setup=setup)
        plan = step_plan(cfg, chip, context, batch, dtype, setup)
        ar = [op for op in plan.ops if isinstance(op, AllReduce)]
        allreduce_s = sum(op.wire_bytes / chip.ici_bandwidth + op.rounds * latency for op in ar)
        rows.append(
            dict(
                model=cfg.name, chip=chip.name, chips=n, topology=shape.topology if shape else "",
                hosts=shape.hosts if shape else float("nan"), placement=p.placement, step_ms=p.step_s * 1e3,
                allreduce_ms=allreduce_s * 1e3, share=allreduce_s / p.step_s, all_reduces=len(ar),
                fraction_of_sol=p.fraction_of_sol, fits_in_hbm=p.fits_in_hbm,
            )
        )  # fmt: skip
    return pd.DataFrame(rows).assign(kind=MODELLED)
