"""Notebook 06's sweeps: the modelled tokens/s of Gemma 4 26B-A4B (MoE) and 31B (dense) against context,
batch, expert placement and chip, for the megakernel and the general stack (``mk.timing``) beside the speed
of light (``mk.sol``), with the write-up's published points on them.

Every table has a ``kind`` column. Published numbers are read from data/published.csv (``mk.published``),
never typed; a published fraction of the speed of light is drawn as that fraction times the modelled speed
of light at its configuration, and its label says so. The engines are the write-up's: the megakernel on its
TPU slice (split experts, the published collective), the general stack on its baseline GPU in the baseline's
data type (``mk.analysis.verdict.BASELINE_DTYPE``) and on the same TPU slice. Every megakernel row names its
kernel setup (mk.kernel_setup): the write-up's kernel as published, or the workbook's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pandas as pd

from ..chips import get_chip
from ..config import ModelConfig, get_config
from ..kernel_setup import (
    BEFORE_FIXES,
    VERIFYING_KERNEL,
    WORKBOOK_KERNEL,
    WRITE_UP_KERNEL,
    AttentionSplit,
    KernelSetup,
    Placement,
)
from ..params import count_active_params, count_params
from ..published import published_table
from ..routing import expected_distinct_experts
from ..sharding import kv_replication, position_share
from ..sol import SOL_KIND, bytes_per_token, speed_of_light
from ..speculative import emitted_per_round
from ..timing import MODELLED, predict
from ..timing.fitted import fitted_bound
from .verdict import BASELINE_DTYPE, GENERAL_GPU, MEGAKERNEL_SLICE, Case, validation_table

SOL = "speed of light"
FRACTION_OF_SOL = "published fraction x modelled speed of light"
# The write-up's points drawn on the sweeps: tokens/s where it gives them, else a fraction of the speed of light.
PUBLISHED_POINTS = (
    "mk_v5e8_moe_tps",
    "vllm_h100_moe_tps",
    "mk_v5e8_dense_sol_fraction",
    "vllm_v5e8_dense_sol_fraction",
)
BEFORE_FIXES_KEY = "mk_v5e8_moe_step_before"  # the megakernel with whole experts, before the write-up's fixes


# The series -------------------------------------------------------------------------------------------
WORKBOOK = "workbook kernel"  # the role of the workbook's own megakernel (mk.kernel_setup.WORKBOOK_KERNEL)
SOL_BASELINE = "speed of light baseline"  # the role of the baseline chip's own speed of light, the bound of its line


@dataclass(frozen=True)
class Series:
    """One line of the sweeps: an engine (``megakernel``, ``general`` or the speed of light) on a chip or
    slice, in a data type; ``role`` keys its colour and legend entry across models."""

    role: str
    engine: str
    chip: str
    dtype: str
    setup: KernelSetup = WRITE_UP_KERNEL  # the megakernel's (mk.kernel_setup)

    @property
    def label(self) -> str:
        if self.engine == SOL:
            return f"speed of light, {self.chip}"
        if self.engine == "general":
            return f"general stack, {self.chip}" + (
                ", the write-up's baseline" if self.role == "general baseline" else ""
            )
        return f"megakernel, {self.chip}, {self.setup.name}"

    def case(self, model: ModelConfig | str, context: int, batch: int) -> Case:
        return Case(model, self.chip, context, batch, self.engine, self.dtype, self.setup)


def engine_series(
    model: ModelConfig | str, tpu_slice: str = MEGAKERNEL_SLICE, general_chip: str = GENERAL_GPU
) -> tuple[Series, ...]:
    """The write-up's engines for ``model``: the megakernel on ``tpu_slice`` (split experts, bf16), the general
    stack on ``general_chip`` in the baseline's data type and on ``tpu_slice`` (bf16), the speed of light on
    ``tpu_slice`` and on ``general_chip`` (each line's own bound); and beside the write-up's megakernel the
    workbook's (mk.kernel_setup.WORKBOOK_KERNEL)."""
    baseline = BASELINE_DTYPE.get(get_config(model).name, "bf16")
    return (
        Series("megakernel", "megakernel", tpu_slice, "bf16", WRITE_UP_KERNEL),
        Series(WORKBOOK, "megakernel", tpu_slice, "bf16", WORKBOOK_KERNEL),
        Series("general baseline", "general", general_chip, baseline),
        Series("general same chip", "general", tpu_slice, "bf16"),
        Series(SOL, SOL, tpu_slice, "bf16"),
        Series(SOL_BASELINE, SOL, general_chip, baseline),
    )


def _row(model: ModelConfig | str, series: Series, context: int, batch: int) -> dict:
    cfg = get_config(model)
    # a dense model has no experts: its experts' columns stay blank
    experts = expected_distinct_experts(cfg.num_experts, cfg.top_k, batch) if cfg.is_moe else math.nan
    base = dict(
        model=cfg.name,
        series=series.label,
        role=series.role,
        engine=series.engine,
        chip=series.chip,
        dtype=series.dtype,
        context=context,
        batch=batch,
        expected_experts=experts,
    )
    if series.engine == SOL:
        s = speed_of_light(cfg, series.chip, context, batch, series.dtype)
        return base | dict(
            placement="-",
            setup="-",
            step_ms=s.step_s * 1e3,
            tokens_per_s=s.tokens_per_s,
            tokens_per_s_total=s.tokens_per_s_total,
            fraction_of_sol=1.0,
            fits_in_hbm=s.fits_in_hbm,
            op_costs="-",
            kind=SOL_KIND,
        )
    p = series.case(cfg, context, batch).predict()
    paced = p.pacing
    return base | dict(
        placement=p.placement if cfg.is_moe else "-",  # a dense model has no experts to place
        setup=p.setup,
        # whole experts' worth one chip loads per layer: the pacing chip's distinct experts x its share of each
        experts_per_chip=paced.experts_per_layer * paced.expert_share if paced and cfg.is_moe else math.nan,
        step_ms=p.step_s * 1e3,
        tokens_per_s=p.tokens_per_s,
        tokens_per_s_total=p.tokens_per_s_total,
        fraction_of_sol=p.fraction_of_sol,
        fits_in_hbm=p.fits_in_hbm,
        op_costs=p.op_costs or "-",  # the megakernel's (mk.timing.predict); the general stack has none
        kind=MODELLED,
    )


def engine_table(
    models, contexts=(1024,), batches=(1,), tpu_slice: str = MEGAKERNEL_SLICE, general_chip: str = GENERAL_GPU
) -> pd.DataFrame:
    """Every model's engines (:func:`engine_series`) at every context and batch: tokens/s per user and in
    total, the step, the fraction of the speed of light on the series' own chip and data type, the expected
    distinct experts per layer (uniform routing), whether weights and caches fit the chip's HBM and where a megakernel
    step's per-op costs came from (``op_costs``: mk.timing.predict's, the compiler's schedule where data/schedule keeps
    the plan's, else assumed; "-" for the general stack and the speed of light)."""
    series = {m: engine_series(m, tpu_slice, general_chip) for m in models}
    return pd.DataFrame([_row(m, s, n, b) for m in models for s in series[m] for n in contexts for b in batches])


def speedup_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per model, context and batch of an :func:`engine_table`: the megakernel's tokens/s over each general
    stack's (the baseline and the one on the same slice), and where each megakernel step's per-op costs came from
    (``megakernel_op_costs``, ``workbook_op_costs``: the table's ``op_costs``)."""
    index = ["model", "context", "batch"]
    t = table.pivot_table(index=index, columns="role", values="tokens_per_s", sort=False)
    costs = table.pivot_table(index=index, columns="role", values="op_costs", aggfunc="first", sort=False)
    out = dict(
        megakernel_tokens_per_s=t["megakernel"],
        over_general_baseline=t["megakernel"] / t["general baseline"],
        over_general_same_chip=t["megakernel"] / t["general same chip"],
        megakernel_op_costs=costs["megakernel"],
    )
    if WORKBOOK in t:
        out.update(
            workbook_tokens_per_s=t[WORKBOOK],
            workbook_over_general_baseline=t[WORKBOOK] / t["general baseline"],
            workbook_over_general_same_chip=t[WORKBOOK] / t["general same chip"],
            workbook_op_costs=costs[WORKBOOK],
        )
    kind = f"{MODELLED}: the megakernel's tokens/s over the general stack's (the write-up's kernel; the workbook's)"
    return pd.DataFrame(dict(out, kind=kind)).reset_index()


def context_change(table: pd.DataFrame) -> pd.DataFrame:
    """Per model and series of an :func:`engine_table` over contexts: tokens/s per user at the shortest and the
    longest context and the change between them, with where each end's per-op costs came from (``from_op_costs``,
    ``to_op_costs``: the table's ``op_costs``)."""
    rows = []
    for (model, series), g in table.groupby(["model", "series"], sort=False):
        g = g.sort_values("context")
        lo, hi = g.iloc[0], g.iloc[-1]
        rows.append(
            dict(
                model=model,
                series=series,
                from_context=lo.context,
                to_context=hi.context,
                from_tokens_per_s=lo.tokens_per_s,
                to_tokens_per_s=hi.tokens_per_s,
                change=hi.tokens_per_s / lo.tokens_per_s - 1,
                from_fraction_of_sol=lo.fraction_of_sol,
                to_fraction_of_sol=hi.fraction_of_sol,
                from_op_costs=lo.op_costs,
                to_op_costs=hi.op_costs,
                kind=lo.kind,
            )
        )
    return pd.DataFrame(rows)


def kv_table(models, contexts, chip: str = MEGAKERNEL_SLICE) -> pd.DataFrame:
    """Per model, layer type and context: the KV cache one step reads (bf16, one user), and what one chip of
    ``chip`` reads of it when each KV head is kept on every chip whose query heads read it
    (``mk.sharding.kv_replication``), and when those chips split its positions instead
    (``mk.sharding.position_share``: the workbook's kernel), against an even 1/C share, which the speed of light
    assumes."""
    c = get_chip(chip)
    rows = []
    for m in models:
        cfg = get_config(m)
        copies = kv_replication(cfg, c.chips) if c.chips > 1 else {}
        split = KernelSetup(c.chips, attention_split="positions") if c.chips > 1 else None
        for t in sorted(set(cfg.layer_types)):
            per_pos = 2 * cfg.kv_heads(t) * cfg.head_dim(t) * 2  # K and V, bf16
            for n in contexts:
                total = cfg.layer_types.count(t) * cfg.cache_positions(t, n) * per_pos
                k = copies.get(str(t), 1)
                rows.append(
                    dict(
                        model=cfg.name,
                        layer_type=str(t),
                        layers=cfg.layer_types.count(t),
                        kv_heads=cfg.kv_heads(t),
                        window=cfg.sliding_window if t == "sliding" else None,
                        context=n,
                        positions_read=cfg.cache_positions(t, n),
                        kv_GB=total / 1e9,
                        copies_per_head=k,
                        per_chip_GB=total * k / c.chips / 1e9,
                        positions_split_GB=total * k / position_share(cfg, t, split) / c.chips / 1e9,
                        even_share_GB=total / c.chips / 1e9,
                        chip=c.name,
                        kind="modelled (mk.sol bytes, mk.sharding.placement)",
                    )
                )
    return pd.DataFrame(rows)


def attention_split_table(models, contexts, batches, chip: str = MEGAKERNEL_SLICE) -> pd.DataFrame:
    """The workbook's kernel (mk.kernel_setup.WORKBOOK_KERNEL) on ``chip`` with attention cut each way over its chips
    (mk.kernel_setup.AttentionSplit: by heads, by positions, by users), per model, context and batch: the step, its
    fraction of the speed of light, the KV cache and the bytes one chip sends, the link's time, the step against
    the positions split's, and where its per-op costs came from (``op_costs``, mk.timing.predict's). The users split
    is left out where the batch is not a multiple of the chips (it cannot run there)."""
    c = get_chip(chip)
    rows = []
    for m in models:
        cfg = get_config(m)
        for n in contexts:
            for b in batches:
                steps = {}
                for split in AttentionSplit:
                    if split == AttentionSplit.USERS and b % c.chips:
                        continue
                    p = predict(cfg, c, n, b, setup=WORKBOOK_KERNEL.but(attention_split=split))
                    steps[split] = p.step_s
                    rows.append(
                        dict(
                            model=cfg.name, attention_split=str(split), context=n, batch=b, step_ms=p.step_s * 1e3,
                            fraction_of_sol=p.fraction_of_sol, kv_GB=p.pacing.kv_bytes / 1e9,
                            sent_MB=p.pacing.sent_bytes / 1e6, ici_ms=p.pacing.ici_s * 1e3,
                            vs_positions=p.step_s / steps[AttentionSplit.POSITIONS] if AttentionSplit.POSITIONS in steps
                            else math.nan, op_costs=p.op_costs,
                        )
                    )  # fmt: skip
    return pd.DataFrame(rows).assign(
        chip=c.name,
        setup=WORKBOOK_KERNEL.name,
        kind=f"{MODELLED}: {WORKBOOK_KERNEL.name}, its attention split each way",
    )


def speculation_table(
    models, chips, users, drafts, accept_rates, context: int = 1024, assistant=None, dtype: str = "bf16"
) -> pd.DataFrame:
    """The kernel that verifies drafts (mk.kernel_setup.VERIFYING_KERNEL: the workbook's but for the positions split)
    with K drafts a user (``draft_tokens=K``) against its own plain decoding, per
    model, slice, users, K and per-draft acceptance rate a (each round then emits mk.speculative.emitted_per_round
    tokens a user): the round's time, tokens/s per user and the speed-up, with the distinct experts a layer's rows
    route to (expected, uniform routing) beside plain decoding's, and where each step's per-op costs came from
    (``op_costs``, ``plain_op_costs``: mk.timing.predict's). The drafter is n-gram lookup (no weights), or with
    ``assistant`` (mk.assistant_config.AssistantConfig) Gemma 4's assistant, its K programs a round costed too;
    weights in ``dtype``."""
    rows = []
    for m in models:
        cfg = get_config(m)
        for chip in chips:
            for b in users:
                plain = predict(cfg, chip, context, b, dtype=dtype, setup=VERIFYING_KERNEL)
                for k in drafts:
                    # the round's time does not depend on the acceptance: one prediction, its tokens scaled
                    setup = VERIFYING_KERNEL.but(draft_tokens=k)
                    spec = predict(cfg, chip, context, b, dtype=dtype, setup=setup, acceptance=1, assistant=assistant)
                    for a in accept_rates:
                        emitted = emitted_per_round(a, k)
                        p = dataclasses.replace(spec, tokens_per_round=emitted)
                        rows.append(
                            dict(
                                model=cfg.name, chip=chip, users=b, draft_tokens=k, accept_rate=a,
                                emitted_per_round=emitted, step_ms=p.step_s * 1e3, round_ms=p.round_s * 1e3,
                                tokens_per_s=p.tokens_per_s, plain_tokens_per_s=plain.tokens_per_s,
                                speedup=p.tokens_per_s / plain.tokens_per_s, step_vs_plain=p.step_s / plain.step_s,
                                distinct_experts=expected_distinct_experts(cfg.num_experts, cfg.top_k, b * (k + 1)),
                                plain_distinct_experts=expected_distinct_experts(cfg.num_experts, cfg.top_k, b),
                                op_costs=p.op_costs, plain_op_costs=plain.op_costs,
                            )
                        )  # fmt: skip
    drafter = f"Gemma 4's assistant {assistant.name}" if assistant is not None else "n-gram lookup"
    return pd.DataFrame(rows).assign(
        drafter=drafter, setup=VERIFYING_KERNEL.name, kind=f"{MODELLED}: {VERIFYING_KERNEL.name}, verifying drafts"
    )


def bytes_share(models, contexts, dtype: str = "bf16") -> pd.DataFrame:
    """The weights' and the KV cache's bytes per step (one user) by context, and the KV's share of them."""
    rows = []
    for m in models:
        for n in contexts:
            bc = bytes_per_token(get_config(m), n, 1, dtype)
            rows.append(
                dict(
                    model=bc.model,
                    context=n,
                    weights_GB=bc.weights / 1e9,
                    kv_GB=bc.kv / 1e9,
                    kv_share=bc.kv / bc.total,
                    kind=SOL_KIND,
                )
            )
    return pd.DataFrame(rows)


# Published points ---------------------------------------------------------------------------------------
def published_points(models, keys=PUBLISHED_POINTS) -> pd.DataFrame:
    """The write-up's points for ``models`` as tokens/s per user at their own configuration: tokens/s as
    published, a step time as 1 / step, a fraction of the speed of light as that fraction times the
    modelled speed of light (``how`` says which)."""
    names = {get_config(m).name for m in models}
    t = published_table().set_index("key")
    rows = []
    for key in keys:
        r = t.loc[key]
        if r["model"] not in names:
            continue
        value, n, b = float(r["value"]), int(r["context"]), int(r["batch"])
        engine = str(r["engine"])
        if r["quantity"] == "tokens_per_s":
            tps, how = value, "published tokens/s"
        elif r["quantity"] == "step_time":
            tps, how = 1 / value, "1 / published step"
        elif r["quantity"] == "fraction_of_sol":
            sol = speed_of_light(get_config(r["model"]), r["chip"], n, b, r["dtype"])
            tps, how = value * sol.tokens_per_s, FRACTION_OF_SOL
        else:
            raise ValueError(f"published {key!r} is a {r['quantity']}, not a point on a tokens/s sweep")
        rows.append(
            dict(
                key=key,
                model=r["model"],
                engine=engine,
                series_engine="general" if engine.startswith("vllm") else "megakernel",
                placement="whole" if engine.endswith("whole-experts") else "split",
                chip=r["chip"],
                dtype=r["dtype"],
                context=n,
                batch=b,
                quantity=r["quantity"],
                published=value,
                tokens_per_s=tps,
                how=how,
                source=f"data/published.csv row {key}",
                kind="published" if how != FRACTION_OF_SOL else f"published fraction x {SOL_KIND}",
            )
        )
    return pd.DataFrame(rows)


def validation(models, keys=PUBLISHED_POINTS + (BEFORE_FIXES_KEY,)) -> pd.DataFrame:
    """The published points beside the model's predictions for them (``mk.analysis.verdict.validation_table``;
    step times in ms): the error modelled / published - 1 and whether the model was fitted to that number (``role``; a
    tokens/s that is the same published point as a step says so: ``fitted (as vllm_h100_moe_step)``)."""
    names = {get_config(m).name for m in models}
    t = validation_table()
    # a tokens/s drawn here for a step counted elsewhere takes that point's role, and says which point it is
    own = t.set_index("key").role
    t["role"] = [own[p] + f" (as {p})" if p != k else r for k, p, r in zip(t.key, t.point, t.role)]
    model = published_table().set_index("key")["model"]
    t = t[t.key.isin(keys) & t.key.map(model).isin(names)].copy()
    steps = t.quantity == "step_time"  # seconds as milliseconds, a fraction named
    t.loc[steps, ["published", "modelled"]] *= 1e3
    t.loc[steps, "unit"] = "ms"
    t.loc[t.quantity == "fraction_of_sol", "unit"] = "of the speed of light"
    return t[["key", "quantity", "case", "published", "modelled", "unit", "error", "role", "kind"]].reset_index(
        drop=True
    )


# Whole against split experts ------------------------------------------------------------------------------
def placement_table(model: ModelConfig | str, batches, context: int = 1024, tpu_slice: str = MEGAKERNEL_SLICE):
    """The write-up's kernel on ``tpu_slice`` with the routed experts split over its chips (as published), placed
    whole (the same switches), and whole before the write-up's fixes (overlap off, f32 payload), by batch: tokens/s
    per user and in total, and the experts one chip loads per layer (split: 1/C of each distinct expert, counted in
    whole experts; whole: the busiest chip's expected count, exact under uniform routing), with where each step's
    per-op costs came from (``op_costs``, as in :func:`engine_table`)."""
    cfg, chip = get_config(model), get_chip(tpu_slice)
    if chip.chips == 1 or not cfg.is_moe:
        raise ValueError(f"whole against split experts needs an MoE model on a slice, got {cfg.name} on {chip.name}")
    series = (
        Series("megakernel", "megakernel", chip.name, "bf16", WRITE_UP_KERNEL),
        Series("whole", "megakernel", chip.name, "bf16", WRITE_UP_KERNEL.but(placement=Placement.WHOLE)),
        Series("before fixes", "megakernel", chip.name, "bf16", BEFORE_FIXES),
    )
    rows = []
    for b in batches:
        split_step = None
        for s in series:
            r = _row(cfg, s, context, b)
            split_step = split_step or r["step_ms"]
            rows.append(r | dict(vs_split=r["step_ms"] / split_step))
    return pd.DataFrame(rows)


# Chips ----------------------------------------------------------------------------------------------------
def chip_table(models, chips, context: int = 1024, batch: int = 1, dtype: str = "bf16") -> pd.DataFrame:
    """Per model and chip (a slice: the write-up's kernel as published): the megakernel, the general
    stack and the speed of light in ``dtype``, with the model's weights and the chip's HBM, whether weights
    and caches fit it (a prediction that does not fit still says how fast the step would be) and where the
    megakernel's per-op costs came from (``op_costs``, as in :func:`engine_table`)."""
    rows = []
    for m in models:
        cfg = get_config(m)
        for c in chips:
            chip = get_chip(c)
            held = bytes_per_token(cfg, context, batch, dtype).all_weights
            extra = dict(weights_GB=held / 1e9, hbm_GB=chip.hbm_bytes / 1e9)
            for s in (
                Series("megakernel", "megakernel", chip.name, dtype, WRITE_UP_KERNEL),
                Series("general same chip", "general", chip.name, dtype),
                Series(SOL, SOL, chip.name, dtype),
            ):
                rows.append(_row(cfg, s, context, batch) | extra)
    t = pd.DataFrame(rows)
    return t.assign(series=t.engine.map({"megakernel": "megakernel", "general": "general stack", SOL: SOL}))


def megakernel_losses(chips: pd.DataFrame) -> pd.DataFrame:
    """Where the megakernel is slower than the general stack on the same chip (rows of :func:`chip_table`): model,
    chip, both tokens/s per user, their ratio and where the megakernel's per-op costs came from. ``lower_bound``: the
    megakernel's tokens/s is a lower bound, its cost per op fitted to a step published as an upper bound
    (mk.timing.fitted.fitted_bound: GPUs, Hazy's "under one millisecond"), so a loss there may be the bound's."""
    mk = chips[chips.engine == "megakernel"].set_index(["model", "chip"])
    general = chips[chips.engine == "general"].set_index(["model", "chip"])
    t = pd.DataFrame(
        dict(
            megakernel_tokens_per_s=mk.tokens_per_s,
            general_tokens_per_s=general.tokens_per_s,
            ratio=mk.tokens_per_s / general.tokens_per_s,
            op_costs=mk.op_costs,
        )
    ).reset_index()
    t["lower_bound"] = t.chip.map(lambda c: fitted_bound(get_chip(c).kind) == "upper")
    return t[t.ratio < 1].reset_index(drop=True).assign(kind=MODELLED)


def family_table(models, context: int = 1024, dtype: str = "bf16") -> pd.DataFrame:
    """Per model (any mk.config takes): its family, layers, experts, parameters (all and read per token), the bytes
    one decode step reads for one user at ``context`` (mk.sol) and whether mk runs it (both engines, or the reference
    only) or plans and times it only."""
    rows = []
    for m in models:
        d = get_config(m)
        rows.append(
            dict(
                model=d.name, family=d.family, layers=d.num_layers,
                experts=f"{d.num_experts} (top {d.top_k})" if d.is_moe else "dense",
                params_B=count_params(d) / 1e9, active_B=count_active_params(d) / 1e9,
                step_GB=bytes_per_token(d, context, 1, dtype).total / 1e9,
                mk="runs" if d.runnable else "plans and times",
            )
        )  # fmt: skip
    return pd.DataFrame(rows).assign(kind=f"modelled (mk.sol, {dtype}, context {context}); counts: mk.params")
