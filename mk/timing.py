"""Predicted decode-step time on a chip or a slice, from the step plans (mk.plan), for two engines: the one
path in mk from a step plan to seconds.

- **megakernel**: one kernel per step. Each chip follows its own plan (mk.plan.build_plan with a Shard
  over the slice's chips): weight tiles stream at the chip's HBM bandwidth while compute runs behind
  them (mk.plan.timeline), matrix work at the chip's FLOP/s with rows padded to what its matrix unit
  takes at once, all-reduces over one link at the ICI bandwidth plus a per-hop latency, and the step
  waits for the chip that sets the pace (:func:`pace`: the busiest chip under whole experts, exact under
  uniform routing). :data:`FIXES` are the write-up's eight-chip configurations in order, the last one the
  workbook's kernel (every switch that helps on): what :func:`predict` models by default.
- **general**: the general stack, the same work split into many kernels (:func:`plan_kernels`): each
  kernel reads its bytes at HBM bandwidth or does its matrix work, whichever is longer, with nothing in
  flight across kernel boundaries, plus a fixed cost per kernel.

Every constant comes from ``data/timing.csv`` (or ``data/chips.csv``), each row naming its source and
its kind: ``cited`` (a public source), ``published`` (the write-up's own numbers), ``fitted`` (solved at
run time so the model meets one published number: the general stack's per-kernel cost, once for GPUs
and once for TPUs; the published numbers they are fitted to are not tests of the model) or ``assumed``
(a cost nothing public gives: the megakernel's per-op and per-DMA-issue costs, one default for the whole
workbook, every notebook that shows a modelled megakernel step shows them as a sensitivity too).

Data types: the plan is built in BF16 (F32 for ``f32``); INT8 (``int8-experts``, ``int8``) is the plan's
own (mk.quant: the kernel streams the codes and their scales); FP8, which no kernel here streams, scales
each weight tile's bytes by its component's bytes per element (mk.sol.DTYPES).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import pandas as pd

from .chips import Chip, get_chip
from .config import SLIDING, ModelConfig, get_config
from .params import EXPERTS, HEAD, param_specs
from .paths import TIMING_CSV
from .plan import Attend, HeadTile, Load, MatmulTile, Op, StepPlan, build_plan, step_end, timeline
from .routing import busiest_chip_distribution
from .sharding import Collective, Placement, Shard
from .sol import get_dtype, speed_of_light
from .units import positive_int

ENGINES = ("megakernel", "general")
MODELLED = "modelled (mk.timing)"
ASSUMED = ("op_overhead_s", "dma_issue_s")  # the megakernel's costs data/timing.csv gives as assumed


@dataclass(frozen=True)
class Fix:
    """One configuration of the megakernel over a slice: where the experts live and the all-reduce's
    switches; ``published``: the key of data/published.csv that timed it, if any."""

    name: str
    placement: Placement
    collective: Collective
    published: str | None = None
    ffn_layout: str = "lanes"  # the gated MLPs' layout (ModelConfig.ffn_layout): the first kernel's, padded to lanes
    attention_split: str = "heads"  # how attention is cut over the chips (mk.sharding.AttentionSplit)


FIXES = (
    Fix("(a) whole experts, no overlap, f32", Placement.WHOLE, Collective(overlap=False), "mk_v5e8_moe_step_before"),
    Fix("(b) split experts, no overlap, f32", Placement.SPLIT, Collective(overlap=False)),
    Fix("(c) split + overlap, f32", Placement.SPLIT, Collective()),
    Fix("(d) split + overlap + bf16 payload", Placement.SPLIT, Collective(bf16_payload=True), "mk_v5e8_moe_step"),
    Fix("(e) (d) + reduce-scatter", Placement.SPLIT, Collective(bf16_payload=True, reduce_scatter=True)),
    Fix(
        "(f) (e) + MLPs on rows",
        Placement.SPLIT,
        Collective(bf16_payload=True, reduce_scatter=True),
        ffn_layout="sublanes",
    ),
    Fix(
        "(g) (f) + positions split",
        Placement.SPLIT,
        Collective(bf16_payload=True, reduce_scatter=True),
        ffn_layout="sublanes",
        attention_split="positions",
    ),
)
BEFORE_FIXES = FIXES[0]  # the write-up's kernel before its fixes
WRITE_UP = FIXES[3]  # the write-up's kernel as published (1.56 ms)
KERNEL = FIXES[-1]  # the workbook's kernel, every fix on: what predict models unless told otherwise
# (f) with the users split over the chips instead of the positions (mk.sharding.AttentionSplit.USERS): the other way
# past (f), for a batch the chips divide, so not a step of FIXES (whose case is the write-up's one user)
USERS_SPLIT = dataclasses.replace(KERNEL, name="(h) (f) + users split", attention_split="users")


# Constants --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Constant:
    """One row of data/timing.csv. ``value`` is None for a fitted or derived constant (see ``fit_to``)."""

    name: str
    applies_to: str  # tpu, gpu, all, or base chip names separated by spaces (mi300x mi325x)
    value: float | None
    unit: str
    kind: str  # cited, published, fitted or assumed
    fit_to: str | None  # the published key (data/published.csv) it is fitted to or read from
    source: str


@lru_cache(maxsize=None)
def constants() -> tuple[Constant, ...]:
    t = pd.read_csv(TIMING_CSV, dtype={"fit_to": str}, keep_default_na=False)
    return tuple(
        Constant(
            r["name"],
            r["applies_to"],
            float(r["value"]) if str(r["value"]).strip() else None,
            r["unit"],
            r["kind"],
            r["fit_to"] or None,
            r["source"],
        )
        for _, r in t.iterrows()
    )


def _rows(name: str, kind: str, chip: str | None) -> list[tuple[int, Constant]]:
    """data/timing.csv's rows for ``name`` that apply to a ``kind`` chip (named ``chip``, its base name), each
    with its rank: 2 for a row naming the chip, 1 for the kind's row, 0 for the row for all."""
    ranked = []
    for c in constants():
        if c.name != name:
            continue
        if chip is not None and chip in c.applies_to.split():
            ranked.append((2, c))
        elif c.applies_to in (kind, "all"):
            ranked.append((int(c.applies_to == kind), c))
    return ranked


def constant(name: str, kind: str, chip: str | None = None) -> Constant:
    """The constant ``name`` for a chip kind (``tpu`` or ``gpu``), or for one chip of it (``chip``: a base name
    of data/chips.csv, ``mi300x``): the row naming the chip, else the kind's own row, else the row for all."""
    rows = _rows(name, kind, chip)
    if not rows:
        raise ValueError(
            f"data/timing.csv has no {name!r} for {kind} chips; the timing model needs one (with its source)"
        )
    return max(rows, key=lambda rc: rc[0])[1]


def chip_constant(name: str, chip: Chip) -> Constant:
    """The constant ``name`` for ``chip`` (a chip or a slice of it): :func:`constant` for its kind and base name."""
    return constant(name, chip.kind, chip.base)


def assumed_costs(kind: str, **given) -> dict[str, float]:
    """The megakernel's assumed costs for ``kind`` chips (``op_overhead_s``, ``dma_issue_s``): data/timing.csv's
    defaults, each replaced by a value ``given`` (a sensitivity) unless that is None."""
    unknown = set(given) - set(ASSUMED)
    if unknown:
        raise ValueError(f"unknown assumed cost(s) {sorted(unknown)}; known: {', '.join(ASSUMED)}")
    return {n: constant(n, kind).value if given.get(n) is None else float(given[n]) for n in ASSUMED}


def assumed_label(costs: dict[str, float]) -> str:
    """The assumed costs in words, for a table's kind or a figure's footer."""
    ns = {n: costs[n] * 1e9 for n in ASSUMED}
    return f"assumed: {ns['op_overhead_s']:g} ns per op, {ns['dma_issue_s']:g} ns per DMA issued"


def constants_table() -> pd.DataFrame:
    """data/timing.csv with the fitted constants' values filled in (fitted at run time)."""
    rows = []
    for c in constants():
        value = c.value
        if c.kind == "fitted":
            value = kernel_cost(c.applies_to)
        elif c.kind == "published":
            from .published import published

            value = published(c.fit_to)
        unit = c.unit
        if unit == "s":  # shown in microseconds: the constants are a few of them
            value, unit = value * 1e6, "us"
        rows.append(
            dict(
                name=c.name,
                applies_to=c.applies_to,
                value=value,
                unit=unit,
                kind=c.kind,
                fit_to=c.fit_to or "",
                source=c.source,
            )
        )
    return pd.DataFrame(rows)


# Work on one chip ---------------------------------------------------------------------------------
def plan_itemsizes(dtype: str) -> tuple[int, int]:
    """Weight and KV bytes per element of the plan a data type is modelled with."""
    get_dtype(dtype)
    return (4, 4) if dtype == "f32" else (2, 2)


def load_bytes(dtype: str, attr: str = "nbytes") -> Callable[[Load], float]:
    """The bytes a weight tile's DMA moves under ``dtype`` (``attr``: ``nbytes`` with the layout's padding,
    ``payload_bytes`` without): the plan's bytes scaled by the component's bytes per element."""
    pol, (wi, _) = get_dtype(dtype), plan_itemsizes(dtype)
    if plan_quantize(dtype) != "none":  # the plan streams the INT8 codes and their scales itself
        return lambda ld: getattr(ld, attr)
    per = {EXPERTS: pol.expert / wi, HEAD: pol.head / wi}
    return lambda ld: getattr(ld, attr) * per.get(ld.component, pol.matrix / wi)


def plan_quantize(dtype: str) -> str:
    """The mk.quant scheme the plan for ``dtype`` streams (``none`` for BF16, F32 and FP8, modelled by bytes)."""
    from .quant_schemes import SCHEMES

    return dtype if dtype in SCHEMES else "none"


def compute_seconds(plan: StepPlan, chip: Chip) -> Callable[[Op], float]:
    """An op's compute time on one chip of ``chip``: FLOPs at its bf16 rate, a matrix op's rows padded to
    what the matrix unit takes at once (``matmul_rows``: the users for a weight tile, the query heads
    sharing a KV head for attention). Vector work (norms, softmax, GeLU) is counted at the same rate,
    unpadded: at decode it is a few thousand FLOPs an op."""
    rows = chip_constant("matmul_rows", chip).value
    peak = chip.bf16_flops / chip.chips

    def seconds(op: Op) -> float:
        if isinstance(op, (MatmulTile, HeadTile)):
            m = plan.batch
        elif isinstance(op, Attend):
            m = op.query_rows
        else:
            return op.flops / peak
        return op.flops * max(m, rows) / m / peak

    return seconds


def link_latency(chip: Chip) -> float:
    """Seconds per round of a cross-chip op on ``chip`` (0 on one chip); refuses a slice whose link is
    not in the data: a chip with no interconnect bandwidth (a PCIe-only GPU), or one whose link has no cited
    latency (for GPUs, data/timing.csv names the NVLink chips; AMD's Infinity Fabric has none)."""
    if chip.chips == 1:
        return 0.0
    if math.isnan(chip.ici_bandwidth):
        raise ValueError(
            f"{chip.name}: data/chips.csv has no interconnect bandwidth for {chip.base} (ici_bandwidth_Bps); add it "
            "(with its source) to model a slice of it"
        )
    if not _rows("ici_hop_latency_s", chip.kind, chip.base):
        raise ValueError(
            f"{chip.name}: data/timing.csv has no link latency for {chip.base} (an ici_hop_latency_s row for "
            f"{chip.kind} chips or naming {chip.base}; for GPUs: NVLink's or Infinity Fabric's), so a slice of it is "
            f"not modelled; add one with its source, or model one {chip.base}"
        )
    return chip_constant("ici_hop_latency_s", chip).value


def _shard(chip: Chip, placement: str, collective: Collective, attention_split: str = "heads") -> Shard | None:
    if chip.chips == 1:
        return None
    return Shard(chip.chips, Placement(placement), collective, attention_split=attention_split)


@lru_cache(maxsize=32)  # the sweeps and the pacing chip's variants time the same plan many ways
def step_plan(
    cfg,
    chip,
    context,
    batch,
    dtype,
    placement,
    collective,
    knockout=frozenset(),
    attention_split="heads",
    draft_tokens=0,
) -> StepPlan:
    """The plan the model times: chip 0's over a slice, in the plan's data type for ``dtype``; ``draft_tokens``
    drafted tokens per user verified in the step (mk.plan.build_plan)."""
    wi, ki = plan_itemsizes(dtype)
    shard = _shard(chip, placement, collective, attention_split)
    return build_plan(
        cfg,
        batch,
        context,
        context,
        weight_itemsize=wi,
        kv_itemsize=ki,
        knockout=knockout,
        shard=shard,
        quantize=plan_quantize(dtype),
        draft_tokens=draft_tokens,
    )


def check_speculation(speculate: int, acceptance: float | None) -> float:
    """The mean tokens a round emits per user: ``acceptance``, which with ``speculate`` = K drafted tokens must be
    in 1 (no draft accepted: the target's own token) .. K + 1 (every draft accepted), and is 1 without drafts."""
    if speculate < 0:
        raise ValueError(f"speculate={speculate}: drafted tokens per round must be 0 or more")
    if not speculate:
        if acceptance not in (None, 1, 1.0):
            raise ValueError(f"acceptance={acceptance} without drafts: give speculate=K drafted tokens per round")
        return 1.0
    if acceptance is None:
        raise ValueError(
            f"speculate={speculate} needs an acceptance: the mean tokens a round emits per user, 1 (no draft "
            f"accepted) to {speculate + 1} (all accepted)"
        )
    if not 1 <= acceptance <= speculate + 1:
        raise ValueError(
            f"acceptance={acceptance} with {speculate} drafted tokens: a round emits 1 (no draft accepted) to "
            f"{speculate + 1} (all accepted) tokens per user"
        )
    return float(acceptance)


# The chip that sets the pace ----------------------------------------------------------------------------
def megakernel_costs(plan: StepPlan, chip: Chip, dtype: str = "bf16", **assumed) -> dict:
    """What mk.plan.timeline charges on ``chip`` for ``plan`` under ``dtype``: the assumed per-op and
    per-DMA-issue costs (data/timing.csv, or ``assumed``), the link latency, each op's compute time and each
    weight tile's bytes."""
    compute, nbytes = compute_seconds(plan, chip), load_bytes(dtype)
    # each op's and tile's cost once: the pacing chip's variants walk the same plan many times
    op_s = {id(op): compute(op) for op in plan.ops}
    load_b = {id(ld): nbytes(ld) for ld in plan.loads}
    return dict(
        assumed_costs(chip.kind, **assumed),
        ici_latency_s=link_latency(chip),
        compute_s=lambda op: op_s[id(op)],
        load_bytes=lambda ld: load_b[id(ld)],
    )


def pace_distribution(plan: StepPlan) -> dict[int, float]:
    """Distinct experts per layer loaded by the chip that sets the pace, count -> probability (exact,
    uniform routing): the busiest chip's under whole placement, every chip's otherwise."""
    cfg = plan.cfg
    if cfg.is_moe and plan.experts_held < cfg.num_experts:
        return busiest_chip_distribution(cfg.num_experts, plan.chips, cfg.top_k, plan.batch)
    return plan.distinct_experts


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
    return {i: experts for i in range(plan.cfg.num_layers)}


def _loaded(plan: StepPlan, experts: int, nbytes: Callable[[Load], float]) -> float:
    """Weight bytes the DMAs move with ``experts`` fetched in every layer."""
    return sum(nbytes(ld) for ld in plan.loads if ld.expert is None or ld.expert < experts)


def pace(plan: StepPlan, chip: Chip, dtype: str = "bf16", distribution: dict[int, float] | None = None, **assumed):
    """The step of the chip that sets the pace, expected over its experts per layer (``distribution``,
    default :func:`pace_distribution`): each count m's timeline with m experts in every layer, weighted by
    its probability (the counts that hold all but 1e-9 of it). Exact where a layer's time depends on its own
    count only (layers add up); the all-reduce that closes each layer makes the slowest chip's layer
    everyone's. Returns the distinct experts per layer the chip fetches and the share of each it holds (1/C
    with split experts), bytes (weights as the DMAs move them, their payload without the layout's padding,
    KV), bytes each chip sends, and the step and its floors in seconds."""
    dist = {m: p for m, p in (distribution or pace_distribution(plan)).items() if p > 0}
    costs = megakernel_costs(plan, chip, dtype, **assumed)
    timed = _likely(dist)

    def expect(f, over=timed):
        return sum(p * f(m) for m, p in over.items())

    moved, payload = load_bytes(dtype), load_bytes(dtype, "payload_bytes")
    weights, real = expect(lambda m: _loaded(plan, m, moved)), expect(lambda m: _loaded(plan, m, payload))
    ends = {m: step_end(plan, chip, _every_layer(plan, m), **costs) for m in dist}
    cross = [op for op in plan.ops if op.sent_bytes]
    bw = chip.per_chip_bandwidth
    split = plan.cfg.is_moe and plan.chips > 1 and plan.experts_held == plan.cfg.num_experts
    return dict(
        experts_per_layer=expect(float, dist),
        expert_share=1 / plan.chips if split else 1.0,  # of each fetched expert's bytes this chip holds
        weight_bytes=weights,
        weight_payload_bytes=real,
        kv_bytes=plan.kv_bytes,
        sent_bytes=sum(op.sent_bytes for op in cross),
        hbm_floor_s=(weights + plan.kv_bytes) / bw,
        payload_floor_s=(real + plan.kv_bytes) / bw,
        ici_s=sum(op.sent_bytes / chip.ici_bandwidth + op.rounds * costs["ici_latency_s"] for op in cross),
        step_s=expect(ends.__getitem__),
    )


def pace_timeline(plan: StepPlan, chip: Chip, dtype: str = "bf16", experts: int | None = None, **assumed):
    """The timeline (mk.plan.timeline rows) of the chip that sets the pace, ``experts`` fetched in every layer
    (default: the expected number, rounded), with the costs :func:`pace` charges."""
    dist = pace_distribution(plan)
    n = round(sum(m * p for m, p in dist.items())) if experts is None else experts
    return timeline(plan, chip, _every_layer(plan, n), **megakernel_costs(plan, chip, dtype, **assumed))


# The general stack's kernels ------------------------------------------------------------------------
@dataclass(frozen=True)
class Kernel:
    """One kernel of the general stack: the plan's ops it runs, what it reads, its matrix time, its link time."""

    name: str
    layer: int
    component: str
    ops: int
    nbytes: float
    compute_s: float
    ici_s: float

    def seconds(self, bandwidth: float) -> float:
        return max(self.nbytes / bandwidth, self.compute_s) + self.ici_s


def _kernel_key(op: Op, plan: StepPlan) -> tuple:
    """Which kernel of a general stack runs ``op``: one per weight matrix (its tiles together), one per
    kind of routed-expert op in a layer (a grouped GEMM over the routed experts, however many), the head's
    tiles together, and each other kind of op once per layer and role (a norm per weight vector, the
    GeGLU of all of an MLP's chunks, each all-reduce)."""
    loads = plan.loads
    if isinstance(op, HeadTile):
        return ("head",)
    if op.expert is not None:
        what = loads[op.load].tensor if isinstance(op, MatmulTile) else op.kind
        return ("experts", op.layer, what)
    if isinstance(op, MatmulTile):
        return ("matmul", op.layer, loads[op.load].tensor)
    return ("op", op.layer, op.kind, op.component, getattr(op, "vector", ""), getattr(op, "seq", 0))


def plan_kernels(plan: StepPlan, chip: Chip, dtype: str) -> list[Kernel]:
    """The general stack's kernels for one chip's plan, in order, with their expected bytes (routed experts
    weighted by the probability that they are fetched, the payload without the kernel's layout padding)."""
    loads = plan.loads
    nbytes = load_bytes(dtype, "payload_bytes")
    compute = compute_seconds(plan, chip)
    latency = link_latency(chip)
    groups: dict[tuple, list[Op]] = {}
    for op in plan.ops:
        groups.setdefault(_kernel_key(op, plan), []).append(op)
    out = []
    for key, ops in groups.items():
        first = ops[0]
        weights = sum(
            nbytes(loads[op.load]) * plan.fetch_probability(loads[op.load]) for op in ops if op.load is not None
        )
        streamed = sum(op.kv_bytes + op.serial_bytes for op in ops)
        ici = sum(op.sent_bytes / chip.ici_bandwidth + op.rounds * latency for op in ops if op.sent_bytes)
        name = key[2] if key[0] in ("matmul", "experts") else first.kind
        out.append(
            Kernel(
                str(name),
                first.layer,
                first.component,
                len(ops),
                weights + streamed,
                sum(compute(op) for op in ops),
                ici,
            )
        )
    return out


REFERENCE_KERNELS = dict(model="gemma4-26b-a4b", context=1024, batch=1, dtype="bf16")  # what the count scales from


@lru_cache(maxsize=None)
def _reference_kernel_count() -> int:
    cfg, r = get_config(REFERENCE_KERNELS["model"]), REFERENCE_KERNELS
    plan = step_plan(cfg, get_chip("h100"), r["context"], r["batch"], r["dtype"], "split", Collective(), frozenset())
    return len(plan_kernels(plan, get_chip("h100"), r["dtype"]))


def kernels_per_plan_kernel() -> float:
    """The general stack's kernels for each kernel of the plan's split: the published count for vLLM on
    gemma4-26b-a4b over the plan's count for the same step (data/timing.csv ``general_kernels``)."""
    from .published import published

    return published(constant("general_kernels", "all").fit_to) / _reference_kernel_count()


# Fitting the general stack's per-kernel cost --------------------------------------------------------
def _published_step(key: str) -> tuple[float, dict]:
    """The step time a published row implies (its own, or from a fraction of the speed of light or tokens/s),
    and the configuration it timed."""
    from .published import published_table

    row = published_table().set_index("key").loc[key]
    cfg = dict(
        model=row["model"], chip=row["chip"], context=int(row["context"]), batch=int(row["batch"]), dtype=row["dtype"]
    )
    value = float(row["value"])
    if row["quantity"] == "step_time":
        return value, cfg
    if row["quantity"] == "fraction_of_sol":
        sol = speed_of_light(get_config(cfg["model"]), cfg["chip"], cfg["context"], cfg["batch"], cfg["dtype"])
        return sol.step_s / value, cfg
    if row["quantity"] == "tokens_per_s":
        return 1.0 / value, cfg
    raise ValueError(f"published {key!r} is a {row['quantity']}, not a step time a kernel cost can be fitted to")


@lru_cache(maxsize=None)
def kernel_cost(kind: str) -> float:
    """The general stack's fixed cost per kernel on ``kind`` (tpu or gpu) chips, fitted at run time to the
    published number data/timing.csv names (not a test of the model): (published step - the model's kernel
    work for that step) / the general stack's kernels."""
    c = constant("kernel_s", kind)
    target, at = _published_step(c.fit_to)
    work = _general(get_config(at["model"]), get_chip(at["chip"]), at["context"], at["batch"], at["dtype"], 0.0)
    cost = (target - work.step_s) / work.kernels_per_step
    if cost < 0:
        raise ValueError(
            f"fitting the per-kernel cost to {c.fit_to}: the model's kernel work alone ({work.step_s * 1e3:.3f} ms) "
            f"exceeds the published step ({target * 1e3:.3f} ms)"
        )
    return cost


# Predictions ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    """A modelled decode step beside the speed of light: ``step_s`` emits ``tokens_per_round`` tokens per user (1;
    with speculation, the mean of the drafted tokens accepted, plus the target's own)."""

    model: str
    chip: str
    context: int
    batch: int
    dtype: str
    engine: str
    placement: str
    step_s: float
    sol_step_s: float
    kernels_per_step: float
    models: str  # what is modelled, in words
    fits_in_hbm: bool
    components: dict[str, float] = field(default_factory=dict)  # seconds by component (general: kernel time)
    constants: dict[str, str] = field(default_factory=dict)  # constant -> value and kind
    breakdown: dict[str, float] = field(default_factory=dict)  # megakernel: the pacing chip's bytes and floors
    draft_tokens: int = 0  # tokens drafted per user and verified in the step
    tokens_per_round: float = 1.0
    drafter_s: float = 0.0  # a round's drafting outside the step (Gemma 4's assistant: one program per draft)

    @property
    def round_s(self) -> float:
        """A round: the drafter's programs, then the step that verifies their drafts."""
        return self.step_s + self.drafter_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_round / self.round_s

    @property
    def tokens_per_s_total(self) -> float:
        return self.batch * self.tokens_per_s

    @property
    def fraction_of_sol(self) -> float:
        """The speed of light's step over the time per emitted token."""
        return self.sol_step_s * self.tokens_per_round / self.round_s

    def to_dict(self) -> dict:
        return dict(
            model=self.model,
            chip=self.chip,
            context=self.context,
            batch=self.batch,
            dtype=self.dtype,
            engine=self.engine,
            placement=self.placement,
            step_ms=self.step_s * 1e3,
            draft_tokens=self.draft_tokens,
            tokens_per_round=self.tokens_per_round,
            drafter_ms=self.drafter_s * 1e3,
            round_ms=self.round_s * 1e3,
            tokens_per_s=self.tokens_per_s,
            tokens_per_s_total=self.tokens_per_s_total,
            fraction_of_sol=self.fraction_of_sol,
            sol_tokens_per_s=1.0 / self.sol_step_s,
            kernels_per_step=self.kernels_per_step,
            fits_in_hbm=self.fits_in_hbm,
            models=self.models,
            components_ms={k: v * 1e3 for k, v in self.components.items()},
            constants=dict(self.constants),
            breakdown=dict(_in_ms(k, v) for k, v in self.breakdown.items()),
            kind=MODELLED,
        )


def _in_ms(key: str, value: float) -> tuple[str, float]:
    """A seconds entry (``*_s``) as milliseconds (``*_ms``), anything else as it is."""
    return (key[:-2] + "_ms", value * 1e3) if key.endswith("_s") else (key, value)


def model_bytes(cfg: ModelConfig, dtype: str) -> float:
    """Bytes of every weight of the model under ``dtype`` (all experts; INT8 matrices with their scales)."""
    from .quant_schemes import SCALE_BYTES, quantized_paths, scale_count

    pol = get_dtype(dtype)
    scaled = set(quantized_paths(cfg, pol.quant))
    per = {EXPERTS: pol.expert, HEAD: pol.head}
    return sum(
        s.size * (per.get(s.component, pol.matrix) if s.matrix else pol.vector)
        + (scale_count(s) * SCALE_BYTES if s.path in scaled else 0)
        for s in param_specs(cfg)
    )


def fits_in_hbm(cfg: ModelConfig, chip: Chip, context: int, batch: int, dtype: str) -> bool:
    """Whether the weights and the users' caches fit the slice's HBM (spread evenly over its chips)."""
    kv = sum(
        v for k, v in speed_of_light(cfg, chip, context, batch, dtype).bytes_by_component.items() if k.startswith("kv")
    )
    return model_bytes(cfg, dtype) + kv <= chip.hbm_bytes


def _check(cfg, chip, context, batch, engine, placement, ffn_layout=None):
    cfg = get_config(cfg)
    if ffn_layout is not None:
        cfg = cfg.replace(ffn_layout=ffn_layout)
    chip = get_chip(chip) if isinstance(chip, str) else chip
    positive_int("context", context)
    positive_int("batch", batch)
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if placement not in {p.value for p in Placement}:
        raise ValueError(f"unknown placement {placement!r}; known: {', '.join(p.value for p in Placement)}")
    return cfg, chip


def _general(cfg, chip, context, batch, dtype, kernel_s, knockout=frozenset()) -> Prediction:
    plan = step_plan(cfg, chip, context, batch, dtype, "split", Collective(overlap=False), knockout)
    ks = plan_kernels(plan, chip, dtype)
    scale = kernels_per_plan_kernel()
    bw = chip.per_chip_bandwidth
    components: dict[str, float] = {}
    for k in ks:
        components[k.component] = components.get(k.component, 0.0) + k.seconds(bw) + scale * kernel_s
    sol = speed_of_light(cfg, chip, context, batch, dtype)
    where = f"chip 0 of {chip.chips}, tensor-parallel" if chip.chips > 1 else "one chip"
    return Prediction(
        cfg.name,
        chip.name,
        context,
        batch,
        dtype,
        "general",
        "split" if chip.chips > 1 else "-",
        sum(components.values()),
        sol.step_s,
        scale * len(ks),
        f"general stack on {chip.name} ({where}): {len(ks)} kernels of the plan's work x {scale:.2f} "
        f"(the published count's ratio), {kernel_s * 1e6:.2f} us each, nothing in flight across them",
        fits_in_hbm(cfg, chip, context, batch, dtype),
        components,
    )


def predict(
    model: ModelConfig | str,
    chip: Chip | str,
    context: int,
    batch: int = 1,
    engine: str = "megakernel",
    placement: str = KERNEL.placement,
    dtype: str = "bf16",
    *,
    collective: Collective = KERNEL.collective,
    knockout=frozenset(),
    op_overhead_s: float | None = None,
    dma_issue_s: float | None = None,
    kernel_s: float | None = None,
    ffn_layout: str | None = None,
    attention_split: str = KERNEL.attention_split,
    speculate: int = 0,
    acceptance: float | None = None,
    assistant=None,
) -> Prediction:
    """The modelled decode step of ``model`` on ``chip`` (a chip or a slice: ``tpu-v5e-8``) at ``context``
    positions for ``batch`` users. ``placement`` and ``collective`` apply to the megakernel over a slice
    (default: :data:`KERNEL`, every fix on); ``knockout``: components switched off (mk.params.KNOCKOUTS);
    ``op_overhead_s``, ``dma_issue_s``: the megakernel's assumed costs (default: data/timing.csv's);
    ``kernel_s``: the general stack's cost per kernel (default: fitted; 0 gives its kernels' work alone);
    ``ffn_layout``: the megakernel's layout of the gated MLPs (default: the config's, mk.config.FFN_LAYOUTS);
    ``attention_split``: how attention is cut over a slice's chips (mk.sharding.AttentionSplit: by heads, by
    positions where chips share a KV head, or by users). ``speculate`` = K: the megakernel verifies K drafted
    tokens per user in each step (a drafter that costs no weight reads: n-gram prompt lookup), emitting
    ``acceptance`` tokens per user on average (``check_speculation``); tokens/s and the fraction of the speed of
    light count emitted tokens. ``assistant`` (mk.assistant.AssistantConfig): the drafts come from Gemma 4's
    assistant, whose K programs a round cost :func:`drafter_seconds` (default: a drafter that reads nothing).
    A round is the drafter's time plus the step's."""
    cfg, chip = _check(model, chip, context, batch, engine, placement, ffn_layout)
    per_round = check_speculation(speculate, acceptance)
    if engine == "general":
        if speculate:
            raise ValueError("speculate: verification is modelled for the megakernel (engine='megakernel') only")
        kernel_s = kernel_cost(chip.kind) if kernel_s is None else kernel_s
        p = _general(cfg, chip, context, batch, dtype, kernel_s, frozenset(knockout))
        return _with_constants(p, chip, kernel_s)
    plan = step_plan(
        cfg, chip, context, batch, dtype, placement, collective, frozenset(knockout), attention_split, speculate
    )
    costs = assumed_costs(chip.kind, op_overhead_s=op_overhead_s, dma_issue_s=dma_issue_s)
    paced = pace(plan, chip, dtype, **costs)
    sol = speed_of_light(cfg, chip, context, batch, dtype)
    if chip.chips > 1:
        who = "the busiest chip (whole experts)" if plan.experts_held < cfg.num_experts else "every chip"
        models = f"megakernel on {chip.chips} chips ({placement} experts), paced by {who}"
    else:
        models = "megakernel on one chip"
    drafter_s = 0.0
    if speculate:
        models += f"; {speculate} drafted tokens verified per user a round, {per_round:g} emitted (given)"
        if assistant is not None:
            from .assistant import check_pair

            check_pair(assistant, cfg)
            drafter_s = drafter_seconds(assistant, cfg, chip, context, batch, dtype, speculate)
            models += f"; drafts by {assistant.name}, {speculate} programs of its own"
    elif assistant is not None:
        raise ValueError("assistant: a drafter's cost is modelled with speculate=K drafted tokens")
    p = Prediction(
        cfg.name,
        chip.name,
        context,
        batch,
        dtype,
        "megakernel",
        placement if chip.chips > 1 else "-",
        paced["step_s"],
        sol.step_s,
        1,
        models + f"; {assumed_label(costs)}",
        fits_in_hbm(cfg, chip, context, batch, dtype),
        breakdown=paced,
        draft_tokens=speculate,
        tokens_per_round=per_round,
        drafter_s=drafter_s,
    )
    return _with_constants(p, chip, None, costs)


def drafter_seconds(assistant, cfg: ModelConfig, chip: Chip, context: int, batch: int, dtype: str, k: int) -> float:
    """A round of Gemma 4's assistant drafting ``k`` tokens for ``batch`` users, outside the verification kernel:
    ``k`` programs, each reading the assistant's weights and the target's K/V it attends to (the last layer of each
    attention type: up to ``context`` positions, a sliding layer's window and one more), spread evenly over the
    slice's chips at their bandwidth, plus one general-stack kernel's cost (fitted, data/timing.csv) for its launch.
    A lower bound of a separate drafter: every byte once, one launch a draft."""
    from .assistant import source_layers

    pol = get_dtype(dtype)
    weights = assistant.weight_bytes(pol.matrix)
    kv = 0
    for t in source_layers(cfg):
        seen = min(context, cfg.sliding_window + 1) if t == SLIDING else context
        kv += 2 * batch * cfg.kv_heads(t) * seen * cfg.head_dim(t) * pol.kv
    per_draft = (weights + kv) / chip.chips / chip.per_chip_bandwidth + kernel_cost(chip.kind)
    return k * per_draft


def _with_constants(p: Prediction, chip: Chip, kernel_s: float | None, costs: dict | None = None) -> Prediction:
    used = {"matmul_rows": f"{chip_constant('matmul_rows', chip).value:g} (cited)"}
    if chip.chips > 1:
        used["ici_hop_latency_s"] = f"{link_latency(chip):g} (cited)"
    if kernel_s is not None:
        fitted = kernel_s == kernel_cost(chip.kind)
        used["kernel_s"] = f"{kernel_s:.3g} " + (
            f"(fitted to {constant('kernel_s', chip.kind).fit_to})" if fitted else "(given)"
        )
        used["kernels_per_plan_kernel"] = f"{kernels_per_plan_kernel():.3f} (published count / plan count)"
    else:
        for name, value in costs.items():
            default = value == constant(name, chip.kind).value
            used[name] = f"{value:g} ({'assumed, data/timing.csv' if default else 'given'})"
    return dataclasses.replace(p, constants=used)


def knockouts(
    model, chip, context: int, batch: int = 1, engine: str = "megakernel", dtype: str = "bf16", components=None, **kw
) -> pd.DataFrame:
    """Per component: how much the modelled step shrinks when it is switched off (the megakernel column of
    the write-up's component table), and for the general stack also the time of its own kernels (the
    profiler's column). ``kw``: :func:`predict`'s keywords (placement, collective, assumed costs)."""
    from .params import KNOCKOUTS

    base = predict(model, chip, context, batch, engine, dtype=dtype, **kw)
    rows = []
    for c in components or KNOCKOUTS:
        off = predict(model, chip, context, batch, engine, dtype=dtype, knockout={c}, **kw)
        rows.append(
            dict(
                component=c,
                step_ms=base.step_s * 1e3,
                knocked_out_ms=off.step_s * 1e3,
                shrink_ms=(base.step_s - off.step_s) * 1e3,
                kernel_time_ms=base.components.get(c, float("nan")) * 1e3,
            )
        )
    return pd.DataFrame(rows).assign(model=base.model, chip=base.chip, engine=engine, dtype=dtype, kind=MODELLED)


def sweep(
    models, chips, contexts=(1024,), batches=(1,), engines=ENGINES, placements=("split",), dtype="bf16", progress=False
):
    """Predictions over every combination, one row each (Prediction.to_dict without its dicts), with the
    speed of light's tokens/s."""
    from .progress import tqdm

    cases = [
        (m, c, n, b, e, p)
        for m in models
        for c in chips
        for n in contexts
        for b in batches
        for e in engines
        for p in (placements if e == "megakernel" and get_chip(c).chips > 1 else ("split",))
    ]
    rows = []
    for m, c, n, b, e, p in tqdm(cases, desc="predict", leave=False, disable=not progress):
        d = predict(m, c, n, b, e, p, dtype).to_dict()
        rows.append({k: v for k, v in d.items() if not isinstance(v, dict)})
    return pd.DataFrame(rows)


def step_breakdown(model, chip, context: int, batch: int = 1, dtype: str = "bf16", **kw) -> dict:
    """The megakernel's modelled step on ``chip`` in parts, per chip that sets the pace: the weight bytes
    its DMAs move (padding and INT8 scale blocks included) and the real ones, the scale blocks' share, the
    KV cache, the HBM floor those bytes set, and the time beyond it (serial reads, the link, compute),
    beside the speed of light. Seconds and bytes. ``kw``: :func:`predict`'s keywords."""
    p = predict(model, chip, context, batch, "megakernel", dtype=dtype, **kw)
    cfg, chip = _check(
        model, chip, context, batch, "megakernel", kw.get("placement", KERNEL.placement), kw.get("ffn_layout")
    )
    plan = step_plan(cfg, chip, context, batch, dtype, kw.get("placement", KERNEL.placement),
                     kw.get("collective", KERNEL.collective), frozenset(),
                     kw.get("attention_split", KERNEL.attention_split))  # fmt: skip
    scales = sum(ld.scale_bytes * plan.fetch_probability(ld) for ld in plan.loads)
    return dict(
        model=p.model,
        chip=p.chip,
        dtype=dtype,
        placement=p.placement,
        step_s=p.step_s,
        sol_step_s=p.sol_step_s,
        fraction_of_sol=p.fraction_of_sol,
        weights_moved_bytes=p.breakdown["weight_bytes"],
        weights_real_bytes=p.breakdown["weight_payload_bytes"],
        scale_blocks_bytes=scales,
        kv_bytes=p.breakdown["kv_bytes"],
        hbm_floor_s=p.breakdown["hbm_floor_s"],
        beyond_floor_s=p.step_s - p.breakdown["hbm_floor_s"],
    )


def straggler_cost(model, chip, context: int = 1024, batch: int = 1, dtype: str = "bf16", **kw) -> dict:
    """What the straggler of a whole-expert placement costs on the slice ``chip``: the modelled step paced
    by the busiest chip (its exact distribution of experts per layer) against the same plan paced by an
    average chip (one chip's own share of the distinct experts), and the step with split experts; seconds,
    with the experts per layer behind each. ``kw``: the assumed costs (:func:`predict`)."""
    cfg, chip = _check(model, chip, context, batch, "megakernel", "whole")
    if not cfg.is_moe:
        raise ValueError(f"{cfg.name} is a dense model: it has no experts to place")
    if chip.chips == 1:
        raise ValueError(f"{chip.name} is one chip: name a slice (e.g. {chip.name}-8) to place experts over")
    coll = kw.pop("collective", KERNEL.collective)
    attention = kw.pop("attention_split", KERNEL.attention_split)
    plan = step_plan(cfg, chip, context, batch, dtype, "whole", coll, frozenset(), attention)
    busiest = pace(plan, chip, dtype, **kw)
    average = pace(plan, chip, dtype, distribution=plan.distinct_experts, **kw)
    split = pace(step_plan(cfg, chip, context, batch, dtype, "split", coll, frozenset(), attention), chip, dtype, **kw)
    return dict(
        model=cfg.name,
        chip=chip.name,
        chips=chip.chips,
        context=context,
        batch=batch,
        dtype=dtype,
        busiest_experts=busiest["experts_per_layer"],
        average_experts=average["experts_per_layer"],
        whole_step_s=busiest["step_s"],
        average_chip_step_s=average["step_s"],
        straggler_s=busiest["step_s"] - average["step_s"],
        split_step_s=split["step_s"],
        split_saves_s=busiest["step_s"] - split["step_s"],
        kind=MODELLED,
    )


def straggler_table(model, chip: str, chip_counts, batches, context: int = 1024, dtype: str = "bf16", **kw):
    """:func:`straggler_cost` over slices of ``chip`` (a base chip: ``tpu-v5e``) of each of ``chip_counts`` chips
    and each batch, one row each, times in ms."""
    from .progress import tqdm

    base = get_chip(chip).base
    cases = [(c, b) for c in chip_counts for b in batches]
    rows = []
    for c, b in tqdm(cases, desc="straggler", leave=False, disable=not kw.pop("progress", False)):
        r = straggler_cost(model, f"{base}-{c}", context, b, dtype, **kw)
        rows.append(dict(_in_ms(k, v) for k, v in r.items() if k != "kind"))
    return pd.DataFrame(rows).assign(kind=MODELLED)
