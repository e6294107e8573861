"""The in-kernel all-reduce priced from the step plans, and what each fix of the eight-chip step buys.

Every number here is modelled from one chip's plan (``mk.plan.build_plan`` with a ``Shard``) and its timeline
(``mk.plan.timeline``): the all-reduces' payloads and the bytes each chip sends (what the kernel sends: the
users' rows, 2 at least in bf16; the head's argmax gather its whole 8-row block), and the step time of the
chip that sets the pace under each fix (whole -> split experts, the weight DMAs kept in flight across the
all-reduce, a bf16 payload, reduce-scatter + all-gather). A chip's sends leave over one link at its ICI
bandwidth (a simplification: a slice's chip has several links; ``links`` scales it), and the per-op costs and
link latency are assumed, not measured.

The step waits for every chip at each all-reduce, so each layer takes as long as its busiest chip: under
whole placement the chip that sets the pace loads the busiest chip's experts in every layer
(``mk.sharding.straggler``), under split placement every chip loads 1/C of every distinct routed expert.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..chips import Chip, get_chip
from ..config import Gemma4Config
from ..plan import LANE, ROWS, AllReduce, GatherBest, StepPlan, build_plan, round_up, timeline
from ..routing import busiest_chip_distribution
from .collective import Collective
from .placement import Placement, Shard

CHIPS = 8
ITEMSIZE = 2  # bf16 weights and KV cache: the step the published numbers time

# Which partial sum each activation of an all-reduce is.
_ACTS = {"x": "embedding", "attn_out": "attention", "ffn": "shared MLP", "moe": "experts"}

# The all-reduce's algorithm and wire type, every combination: (algorithm, payload, switches).
SWITCHES = tuple(
    (algorithm, dtype, Collective(bf16_payload=bf16, reduce_scatter=rs))
    for rs, algorithm in ((False, "all to all"), (True, "reduce-scatter + all-gather"))
    for bf16, dtype in ((False, "f32"), (True, "bf16"))
)


@dataclass(frozen=True)
class Fix:
    """One configuration of the eight-chip step; ``published``: the key of data/published.csv that timed
    it, if any."""

    name: str
    placement: Placement
    collective: Collective
    published: str | None = None


FIXES = (
    Fix("(a) whole experts, no overlap, f32", Placement.WHOLE, Collective(overlap=False), "mk_v5e8_moe_step_before"),
    Fix("(b) split experts, no overlap, f32", Placement.SPLIT, Collective(overlap=False)),
    Fix("(c) split + overlap, f32", Placement.SPLIT, Collective()),
    Fix("(d) split + overlap + bf16 payload", Placement.SPLIT, Collective(bf16_payload=True), "mk_v5e8_moe_step"),
    Fix("(e) (d) + reduce-scatter", Placement.SPLIT, Collective(bf16_payload=True, reduce_scatter=True)),
)


def chip_plan(
    cfg: Gemma4Config,
    context: int,
    batch: int,
    placement: str = "split",
    collective: Collective = Collective(),
    chips: int = CHIPS,
) -> StepPlan:
    """Chip 0's plan of the bf16 decode step over ``chips`` chips, ``context`` positions in the cache."""
    shard = Shard(chips, placement, collective)
    return build_plan(cfg, batch, context, context, weight_itemsize=ITEMSIZE, kv_itemsize=ITEMSIZE, shard=shard)


def with_links(chip: Chip | str, links: int) -> Chip:
    """``chip`` with its sends spread evenly over ``links`` links (ICI bandwidth x links)."""
    chip = get_chip(chip) if isinstance(chip, str) else chip
    if isinstance(links, bool) or not isinstance(links, int) or links <= 0:
        raise ValueError(f"links must be a positive integer, got {links!r}")
    return dataclasses.replace(chip, ici_bandwidth=chip.ici_bandwidth * links)


# The collective's payload ---------------------------------------------------------------------------
def reduces(op) -> str:
    """What a cross-chip op sums (or gathers), in words."""
    if isinstance(op, GatherBest):
        return "head argmax (gather)"
    return " + ".join(_ACTS.get(a, a) for a in op.acts)


def payload_table(
    cfg: Gemma4Config, chip: Chip | str, batches, context: int = 1024, chips: int = CHIPS, ici_latency_s: float = 0.0
) -> pd.DataFrame:
    """Every cross-chip op of one chip's step under each switch (``SWITCHES``), one row per kind of op and
    batch: the payload each chip contributes as the kernel sends it (the users' rows, rounded to whole
    packed rows in bf16; the FFN's shared MLP and experts travel together; the argmax gather's 8-row
    blocks), the bytes one chip sends, the rounds, how often a step does it, and the time at one link of
    ``chip``'s ICI bandwidth plus ``ici_latency_s`` per round. Also what the users' own rows alone would
    send (``unpadded``)."""
    chip = get_chip(chip) if isinstance(chip, str) else chip
    rows = []
    for batch in batches:
        for algorithm, dtype, coll in SWITCHES:
            plan = chip_plan(cfg, context, batch, "split", coll, chips)
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


def per_step(payloads: pd.DataFrame) -> pd.DataFrame:
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


# The step of the chip that sets the pace ------------------------------------------------------------
def pace_distribution(plan: StepPlan) -> dict[int, float]:
    """Distinct experts per layer loaded by the chip that sets the pace, count -> probability (exact,
    uniform routing): the busiest chip's under whole placement, every chip's otherwise."""
    cfg = plan.cfg
    if cfg.is_moe and plan.experts_held < cfg.num_experts:
        return busiest_chip_distribution(cfg.num_experts, plan.chips, cfg.top_k, plan.batch)
    return plan.distinct_experts


def _every_layer(plan: StepPlan, experts: int) -> dict[int, int]:
    return {i: experts for i in range(plan.cfg.num_layers)}


def _loaded(plan: StepPlan, experts: int, attr: str) -> int:
    """Weight bytes (``nbytes`` or ``payload_bytes``) the DMAs move with ``experts`` fetched in every layer."""
    return sum(getattr(ld, attr) for ld in plan.loads if ld.expert is None or ld.expert < experts)


def pace_timeline(plan: StepPlan, chip: Chip | str, experts: int | None = None, **costs) -> list[dict]:
    """The timeline (mk.plan.timeline) of the chip that sets the pace, ``experts`` fetched in every layer
    (default: the expected number, rounded). ``costs``: the timeline's assumed op, DMA-issue and link costs."""
    dist = pace_distribution(plan)
    n = round(sum(m * p for m, p in dist.items())) if experts is None else experts
    return timeline(plan, chip, _every_layer(plan, n), **costs)


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


def pace(plan: StepPlan, chip: Chip | str, **costs) -> dict:
    """The step of the chip that sets the pace, expected over its experts per layer: each count m's
    timeline with m experts in every layer, weighted by its probability. Exact where a layer's time
    depends on its own count only (layers add up); the all-reduce that closes each layer makes the
    slowest chip's layer everyone's. Returns experts per layer, bytes (weights moved with the layout's
    padding, their payload, KV), bytes each chip sends, and the step and its floors in seconds."""
    chip = get_chip(chip) if isinstance(chip, str) else chip
    dist = {m: p for m, p in pace_distribution(plan).items() if p > 0}

    def expect(f):
        return sum(p * f(m) for m, p in dist.items())

    weights, payload = expect(lambda m: _loaded(plan, m, "nbytes")), expect(lambda m: _loaded(plan, m, "payload_bytes"))
    ends = {m: max(r["end_s"] for r in timeline(plan, chip, _every_layer(plan, m), **costs)) for m in dist}
    cross = [op for op in plan.ops if op.sent_bytes]
    bw = chip.per_chip_bandwidth
    return dict(
        experts_per_layer=expect(float),
        weight_GB=weights / 1e9,
        weight_payload_GB=payload / 1e9,
        kv_GB=plan.kv_bytes / 1e9,
        sent_MB=sum(op.sent_bytes for op in cross) / 1e6,
        hbm_floor_s=(weights + plan.kv_bytes) / bw,
        payload_floor_s=(payload + plan.kv_bytes) / bw,
        ici_s=sum(op.sent_bytes / chip.ici_bandwidth + op.rounds * costs.get("ici_latency_s", 0.0) for op in cross),
        step_s=expect(ends.__getitem__),
    )


def published_step(key: str, cfg: Gemma4Config, chip: Chip, context: int, batch: int) -> float:
    """The published step time ``key`` (data/published.csv) when it timed this model, slice, context and
    batch; NaN otherwise."""
    from ..published import published, published_table

    row = published_table().set_index("key").loc[key]
    same = (row.model, row.chip, int(row.context), int(row.batch)) == (cfg.name, chip.name, context, batch)
    return published(key) if same else float("nan")


def fix_steps(
    cfg: Gemma4Config,
    chip: Chip | str,
    context: int,
    batch: int,
    fixes=FIXES,
    links: int = 1,
    **costs,
) -> pd.DataFrame:
    """The modelled step after each fix (``FIXES``: whole experts without overlap, then split experts, the
    overlap, a bf16 payload, reduce-scatter) on the slice ``chip`` (``tpu-v5e-8``), one row each (see
    :func:`pace`), beside its published time where data/published.csv has one for this model, slice,
    context and batch, and the error modelled / published - 1. ``links``: links a chip's sends spread
    over; ``costs``: the timeline's assumed op, DMA-issue and link costs (mk.plan.timeline)."""
    chip = with_links(chip, links)
    rows = []
    for fix in fixes:
        plan = chip_plan(cfg, context, batch, fix.placement, fix.collective, chip.chips)
        p = pace(plan, chip, **costs)
        ms = {k[:-2] + "_ms": v * 1e3 for k, v in p.items() if k.endswith("_s")}
        published = published_step(fix.published, cfg, chip, context, batch) if fix.published else float("nan")
        rows.append(
            dict(
                fix=fix.name,
                placement=str(fix.placement),
                overlap=fix.collective.overlap,
                bf16_payload=fix.collective.bf16_payload,
                reduce_scatter=fix.collective.reduce_scatter,
                pace="busiest chip" if plan.experts_held < cfg.num_experts else "every chip",
                **{k: v for k, v in p.items() if not k.endswith("_s")},
                **ms,
                published_ms=published * 1e3,
                error=ms["step_ms"] / (published * 1e3) - 1,
            )
        )
    return pd.DataFrame(rows)


def sensitivity(
    cfg: Gemma4Config, chip: Chip | str, context: int, batch: int, links, fixes=FIXES, **costs
) -> pd.DataFrame:
    """:func:`fix_steps` for each number of ``links`` a chip's sends spread over, with the assumed
    ``costs`` and with none (bytes only): how far the model's simplifications move each fix."""
    cases = (("assumed", costs), ("bytes only", {}))
    runs = [
        fix_steps(cfg, chip, context, batch, fixes, n, **c).assign(links=n, costs=label)
        for n in links
        for label, c in cases
    ]
    return pd.concat(runs, ignore_index=True)


def best_fits(table: pd.DataFrame) -> pd.DataFrame:
    """For each fix with a published time, the case of :func:`sensitivity` that comes closest to it."""
    timed = table.dropna(subset=["published_ms"])
    return timed.loc[timed.error.abs().groupby(timed.fix, sort=False).idxmin()].reset_index(drop=True)


def padding_table(cfg: Gemma4Config, context: int, batch: int, chips: int = CHIPS) -> pd.DataFrame:
    """Per chip and placement, expected weight bytes by component as the DMAs move them (the layout pads
    every matrix's intermediate to whole 128-lane tiles) against the bytes that hold weights: the plan's
    ``weight_bytes`` against its ``payload_bytes`` (average chip, uniform routing), with the intermediate
    widths a chip holds and lays out."""
    rows = []
    for placement in Placement if cfg.is_moe else (Placement.SPLIT,):
        plan = chip_plan(cfg, context, batch, placement, chips=chips)
        moved, payload = plan.bytes_by_component(), plan.bytes_by_component(payload=True)
        widths = {"shared_mlp": plan.cfg.mlp_intermediate, "experts": plan.cfg.expert_intermediate}
        for component in [*moved, "(all weights)"]:
            m = plan.weight_bytes if component == "(all weights)" else moved[component]
            p = plan.payload_bytes if component == "(all weights)" else payload[component]
            w = widths.get(component)
            rows.append(
                dict(
                    placement=str(placement),
                    component=component,
                    intermediate_per_chip=w,
                    laid_out=None if w is None else round_up(w, LANE),
                    moved_GB=m / 1e9,
                    payload_GB=p / 1e9,
                    padding=m / p - 1,
                )
            )
    return pd.DataFrame(rows)


# Figures ------------------------------------------------------------------------------------------
# The timeline's lanes as drawn: the KV cache and the serial reads (compute waits for those) share the DMA
# engine with the weights, and on lanes of their own they would be too short to see at the scale of a layer.
LANES = {"dma": "HBM DMAs", "dma (serial)": "HBM DMAs", "ici": "link (ICI)", "compute": "compute"}
LANE_NAMES = {
    "HBM DMAs": "HBM -> VMEM DMAs (weights, KV cache, serial reads)",
    "link (ICI)": "all-reduce sends on the link (compute waits)",
    "compute": "compute",
}


def _colours() -> tuple[str, ...]:
    """The colours of mk's figure template (mk.figures), so a lane keeps its colour in every panel."""
    import plotly.io as pio

    from .. import figures  # noqa: F401  (registers the template)

    return tuple(pio.templates["mk"].layout.colorway)


def timeline_figure(runs: dict[str, list[dict]], layers: int, title: str) -> go.Figure:
    """One panel per timeline (``runs``: label -> mk.plan.timeline rows): the start of the step up to the
    end of layer ``layers`` - 1 (the prologue, the embedding's all-reduce, the first layers), as bars on
    three lanes (the DMA engine, the link, compute), one colour each in every panel, on one time axis in ms."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=list(runs))
    colours = dict(zip(LANE_NAMES, _colours()))
    for row, rows in enumerate(runs.values(), start=1):
        t = pd.DataFrame(rows)
        end = t[(t.layer >= 0) & (t.layer < layers)].end_s.max()
        part = t[t.start_s < end].assign(drawn=lambda t: t.lane.map(LANES))
        for lane, name in LANE_NAMES.items():
            g = part[part.drawn == lane]
            fig.add_bar(
                y=g.drawn,
                x=(g.end_s - g.start_s) * 1e3,
                base=g.start_s * 1e3,
                orientation="h",
                name=name,
                legendgroup=lane,
                showlegend=row == 1,
                marker=dict(color=colours[lane], line_width=0),
                hovertext=g.component + ": " + g.what,
                row=row,
                col=1,
            )
        fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(LANE_NAMES)), row=row, col=1)
    fig.update_xaxes(title_text="time in the step (ms)", row=len(runs), col=1)
    fig.update_layout(barmode="overlay", title=title, legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0))
    return fig


def fix_figure(steps: pd.DataFrame, title: str) -> go.Figure:
    """:func:`fix_steps` as bars: the modelled step after each fix beside its published time, with the
    floors the chip's HBM bandwidth sets (weights as moved, and their payload, plus the KV cache) marked on
    the modelled bar."""
    label = steps.fix.str.replace(", ", "<br>").str.replace(" + ", "<br>+ ")
    timed = steps.published_ms.notna()
    fig = go.Figure()
    fig.add_bar(x=label, y=steps.step_ms, name="modelled step", offsetgroup="modelled")
    fig.add_bar(x=label[timed], y=steps.published_ms[timed], name="published step", offsetgroup="published")
    for column, name, symbol in (
        ("hbm_floor_ms", "floor: weights as moved (padded) + KV cache at HBM bandwidth", "line-ew"),
        ("payload_floor_ms", "floor: weights without the padding + KV cache", "x-thin"),
    ):
        fig.add_scatter(
            x=label,
            y=steps[column],
            mode="markers",
            name=name,
            offsetgroup="modelled",
            marker=dict(symbol=symbol, size=22, line=dict(width=3, color="black"), color="black"),
        )
    fig.update_layout(
        barmode="group",
        scattermode="group",
        title=title,
        yaxis_title="ms per decode step",
        yaxis_rangemode="tozero",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig


# The eight-chip kernel, run ------------------------------------------------------------------------
def on_slice(chips: int = CHIPS) -> bool:
    """Whether this process runs on a TPU slice of at least ``chips`` chips."""
    import jax

    from ..tpu import on_tpu

    return on_tpu() and len(jax.devices()) >= chips


def bench_slice(cfg: Gemma4Config, context: int, batch: int, placements, budget_s: float = 30.0) -> pd.DataFrame:
    """Time the eight-chip kernel (random bf16 weights) under each expert placement with mk.bench.run_bench
    and append each row to the bench CSV (mk.bench.append_row: device, JAX version and date in the row).
    Only on a TPU slice: interpret-mode timings say nothing about a TPU and are never recorded."""
    from ..bench import append_row, run_bench

    if not on_slice(CHIPS):
        raise RuntimeError(f"bench_slice times the kernel on a TPU slice of {CHIPS} chips; this process has none")
    rows = []
    for placement in placements:
        r = run_bench(
            cfg,
            context,
            batch,
            "bf16",
            engine="megakernel",
            engine_options=dict(chips=CHIPS, placement=placement),
            budget_s=budget_s,
        )
        append_row(r.row())
        rows.append(r.row())
    return pd.DataFrame(rows)


def interpret_parity(cfg: Gemma4Config, prompts, new_tokens: int, placements, seed: int = 0) -> pd.DataFrame:
    """Greedy tokens of the eight-chip kernel (off a TPU: Pallas's TPU interpreter over the simulated
    chips of mk.sharding.simulate_chips) under each placement against the reference engine, random weights
    by ``seed``: one row per placement and user."""
    from ..generate import generate
    from ..weights import random_params

    params = random_params(cfg, seed)
    want = generate(params, cfg, prompts, new_tokens)
    rows = []
    for placement in placements:
        got = generate(
            params, cfg, prompts, new_tokens, engine="megakernel", engine_options=dict(chips=CHIPS, placement=placement)
        )
        for user, (g, w) in enumerate(zip(got, want)):
            rows.append(
                dict(
                    placement=placement,
                    user=user,
                    reference=w.tolist(),
                    megakernel=g.tolist(),
                    same_tokens=bool(np.array_equal(g, w)),
                )
            )
    return pd.DataFrame(rows)
