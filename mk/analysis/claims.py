"""The claims table: each claim of the write-up (a key of data/published.csv) beside the workbook's own value for
it, its kind and error, and the figures and tables that show it; then the workbook's own claims (no published value:
each computed here, its kind naming the model, the kernel setup and what it assumes). The report page opens with it."""

from __future__ import annotations

import math

import pandas as pd

from ..chips import get_chip
from ..config import LAYER_PAIR, get_config
from ..kernel_setup import WORKBOOK_KERNEL, WRITE_UP_KERNEL
from ..published import published_table
from ..routing import busiest_chip_distribution
from ..sol import bytes_per_token, speed_of_light
from ..timing import op_costs_label, predict
from .on_tpu import stand_in_headline, tpu_steps
from .sweeps import speculation_table
from .verdict import MEGAKERNEL_SLICE, STAND_IN_ROLE, STAND_INS, big_model_cases, validation_table, verdict_table

# Each claim of the write-up (a key of data/published.csv), with the figures and tables that show it, best first.
CLAIMS = {
    **{k: ("01_sol_table", "01_sol_by_chip") for k in ("sol_h100", "sol_h200", "sol_b200", "sol_v5e8", "sol_v6e8")},
    "bytes_per_token_moe": ("01_sol_table", "01_bytes_by_component"),
    "mk_v5e8_moe_tps": ("07_validation", "06_context"),
    "mk_v5e8_moe_step": ("07_validation", "05_fix_steps"),
    "mk_v5e8_moe_sol_fraction": ("07_validation",),
    "mk_v5e8_moe_step_before": ("05_fix_steps", "07_validation"),
    "mk_v5e8_moe_int8_tps": ("07_validation", "08_int8_against_limit"),
    "straggler_max_experts": ("04_busiest_chip_distribution", "04_busiest_summary"),
    "vllm_h100_moe_tps": ("07_validation", "01_published_vs_sol"),
    "vllm_h100_moe_kernels": ("07_validation", "02_kernels_per_step"),
    "vllm_h100_moe_sol_fraction": ("07_validation", "01_published_runs"),
    "vllm_v5e8_dense_sol_fraction": ("07_validation", "06_context"),
    "mk_v5e8_dense_sol_fraction": ("07_validation", "06_context"),
    **{
        k: ("07_verdict",)
        for k in (
            "verdict_moe_one_user",
            "verdict_moe_eight_users",
            "verdict_long_prompt",
            "verdict_dense_h100",
            "verdict_dense_same_tpu",
            "verdict_small_model",
        )
    },
    **{k: ("07_verdict", "09_kimi_rows") for k in ("verdict_kimi_one_user", "verdict_kimi_eight_users")},
    "kimi_speculative_tps": ("09_kimi_rows",),
}
QUANTITIES = {
    "speed_of_light": "speed of light",
    "bytes_per_token": "bytes per token",
    "tokens_per_s": "tokens/s",
    "step_time": "step",
    "fraction_of_sol": "fraction of the speed of light",
    "kernels_per_token": "kernels per token",
    "experts_per_layer_max_chip": "the busiest chip's experts per layer",
    "speedup": "speed-up",
    "tokens_per_s_lower_bound": "tokens/s, a lower bound",
}
POINT_KINDS = {
    "test": "modelled",
    "test (baseline fitted)": "modelled (its baseline fitted)",
    "fitted (megakernel step)": "fitted (its megakernel step: the GPU cost per op's point; the general stack modelled)",
    STAND_IN_ROLE: "modelled: {}, in its released format on the smallest v5e slice holding it",
}
# What a claim's row is: a test of the workbook, a point it was fitted to or scales from, one it meets by construction,
# a ratio of two others, a bound (a published "over" or "under" figure, compared as a bound), a measurement, or the
# workbook's own claim (no published value).
TEST, BOUND, MEASURED, OWN = "test", "bound", "measured", "workbook's own"
OTHER_COMPARISON = "measured, another comparison"  # measured, but not against what the claim compares with: no error
NO_OP_COSTS = "-"  # a claim no per-op cost enters (bytes, the speed of light, routing, a measurement)


# The workbook's own claims: key -> (what, model, context, users, data type; the figures and tables that show it).
# ``fraction_of_sol``: the workbook's kernel's fraction of the speed of light (its data type's own speed of light);
# ``speculative_gain``: tokens/s per user verifying SPECULATION's drafts over plain decoding, on the kernel that
# verifies drafts (mk.kernel_setup.VERIFYING_KERNEL: attention split by heads).
MOE, DENSE = "gemma4-26b-a4b", "gemma4-31b"
SPECULATION = dict(draft_tokens=3, accept_rate=0.7)  # K drafts a step, each accepted with a (given, not measured)
WORKBOOK_CLAIMS = {
    "wb_moe_sol_fraction": ("fraction_of_sol", MOE, 1024, 1, "bf16", ("07_workbook_claims", "06_context_sweep")),
    "wb_moe_sol_fraction_128k": (
        "fraction_of_sol", MOE, 131072, 1, "bf16", ("07_workbook_claims", "06_context_sweep", "06_context")
    ),
    "wb_moe_sol_fraction_eight_users": (
        "fraction_of_sol", MOE, 1024, 8, "bf16", ("07_workbook_claims", "06_batch_sweep", "06_batch")
    ),
    "wb_moe_int8_sol_fraction": (
        "fraction_of_sol", MOE, 1024, 1, "int8-experts", ("07_workbook_claims", "08_sol_by_chip")
    ),
    "wb_moe_speculative_gain": ("speculative_gain", MOE, 1024, 1, "bf16", ("07_workbook_claims", "10_speculation")),
    "wb_dense_speculative_gain": ("speculative_gain", DENSE, 1024, 1, "bf16", ("07_workbook_claims", "10_speculation")),
}  # fmt: skip


def workbook_claims(chip: str = MEGAKERNEL_SLICE) -> pd.DataFrame:
    """The workbook's own claims (:data:`WORKBOOK_CLAIMS`), each computed now by mk.timing for the workbook's kernel
    (mk.kernel_setup.WORKBOOK_KERNEL) on ``chip``: no published value and so no error; its kind names the model, the
    setup and where its per-op costs come from (the compiler's schedule, data/schedule, where it has the plan's; else
    the assumed costs of data/timing.csv; for speculation, K and the acceptance)."""
    costs = op_costs_label(get_chip(chip).kind)  # the speculation gain's two steps may take them from either source
    rows = []
    for key, (what, model, context, users, dtype, shown) in WORKBOOK_CLAIMS.items():
        size = f"{context} positions, {users} user{'s' if users > 1 else ''}"
        if what == "fraction_of_sol":
            p = predict(model, chip, context, users, dtype=dtype, setup=WORKBOOK_KERNEL)
            value, unit, op_costs = p.fraction_of_sol, "", p.op_costs
            claim = f"fraction of the speed of light: {model}, the workbook's kernel, {chip}, {dtype} ({size})"
            kind = f"modelled (mk.timing, {p.setup}; {p.op_cost_words}"
            kind += "; against its own speed of light, mk.sol)" if dtype != "bf16" else ")"
        else:
            k, a = SPECULATION["draft_tokens"], SPECULATION["accept_rate"]
            t = speculation_table([model], [chip], [users], [k], [a], context).iloc[0]
            value, unit = float(t.speedup), "x"
            op_costs = " / ".join(sorted({t.op_costs, t.plain_op_costs}))
            claim = (
                f"speculative decoding's gain, tokens/s with {k} n-gram drafts a step over plain decoding: {model}, "
                f"{t.setup}, {chip}, {dtype} ({size})"
            )
            kind = (
                f"modelled (mk.timing, {t.setup}, verifying {k} drafts a step; assumes each draft accepted with "
                f"probability {a:g} (given, not measured) and a drafter that reads no weights (n-gram lookup); "
                f"{costs})"
            )
        rows.append(
            dict(key=key, claim=claim, published=math.nan, workbook=value, unit=unit, kind=kind, role=OWN,
                 op_costs=op_costs, error=math.nan, shown_in=list(shown))
        )  # fmt: skip
    return pd.DataFrame(rows)


def measured_claims(steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """The claims that a measurement on one real TPU v5e speaks to (mk.analysis.on_tpu), each in its real scope and
    with its own date, to stand beside its modelled twin (the key without ``_measured``):

    - the MoE headline (step, tokens/s, fraction of the speed of light) from chip 0 of the write-up's v5e-8 step
      measured on the chip plus the links' modelled time on one link (partly modelled: the long end of the links);
    - the workbook's own MoE claim (:data:`WORKBOOK_CLAIMS`) the same way, from chip 0 of the workbook's kernel;
    - the dense model's fraction of the speed of light from Gemma 4 31B's first sliding and full layer on one chip;
    - the dense speed-up on the same TPU from the same cut against XLA's compiled reference: another comparison than
      the write-up's (vLLM on a v5e-8), so no error is given.

    Empty where nothing was measured on a TPU."""
    s = tpu_steps() if steps is None else steps
    pub = published_table().set_index("key")
    rows = []
    head = stand_in_headline(s).set_index("setup")
    scope = "chip 0 of the v5e-8 step measured on one TPU v5e, {}, + its links modelled on one link (mk.timing)"
    if WRITE_UP_KERNEL.name in head.index:
        r = head.loc[WRITE_UP_KERNEL.name]
        kind = "measured + modelled (" + scope.format(r.date) + ")"
        for key, ours in (("mk_v5e8_moe_step", r.step_ms / 1e3), ("mk_v5e8_moe_tps", r.tokens_per_s),
                          ("mk_v5e8_moe_sol_fraction", r.fraction_of_sol)):  # fmt: skip
            rows.append(_measured_row(pub.loc[key], key, ours, kind, ("12_headline",)))
    if WORKBOOK_KERNEL.name in head.index:
        r = head.loc[WORKBOOK_KERNEL.name]
        claim = (f"fraction of the speed of light: {MOE}, the workbook's kernel, {MEGAKERNEL_SLICE}, bf16 "
                 "(1024 positions, 1 user)")  # fmt: skip
        rows.append(dict(key="wb_moe_sol_fraction_measured", claim=claim, published=math.nan,
                         workbook=r.fraction_of_sol, unit="", kind="measured + modelled (" + scope.format(r.date) + ")",
                         role=MEASURED, op_costs=NO_OP_COSTS, error=math.nan, shown_in=["12_headline"]))  # fmt: skip
    dense = s[(s.base_model == DENSE) & (s.context == 1024) & (s.batch == 1) & (s.setup == "one chip")]
    dense = dense[dense.layers == LAYER_PAIR]  # the cut measured at every context and batch
    if set(dense.engine) == {"megakernel", "reference"}:
        mk, xla = (dense[dense.engine == e].iloc[0] for e in ("megakernel", "reference"))
        where = f"{mk.model} (a cut of {DENSE}) on one TPU v5e, not a v5e-8, {str(mk.date)[:10]}"
        kind = f"measured ({where}; a fraction of the speed of light at the data sheet's bandwidth)"
        row = _measured_row(pub.loc["mk_v5e8_dense_sol_fraction"], "mk_v5e8_dense_sol_fraction",
                            mk.device_fraction_of_spec, kind, ("12_measured_answer", "12_steps"))  # fmt: skip
        claim = f"fraction of the speed of light: {mk.model}, megakernel, one TPU v5e, bf16 (1024 positions, 1 user)"
        rows.append(dict(row, claim=claim))
        kind = f"measured ({where}; the general stack: XLA's compiled reference, not vLLM)"
        row = _measured_row(pub.loc["verdict_dense_same_tpu"], "verdict_dense_same_tpu", xla.device_ms / mk.device_ms,
                            kind, ("12_measured_answer", "12_steps"))  # fmt: skip
        claim = f"speed-up: {mk.model}, megakernel/XLA's compiled reference, one TPU v5e, bf16 (1024 positions, 1 user)"
        rows.append(dict(row, claim=claim, role=OTHER_COMPARISON, error=math.nan))
    return pd.DataFrame(rows)


def _measured_row(r, key: str, ours: float, kind: str, shown) -> dict:
    value = float(r["value"])
    claim = _claim(r)
    return dict(key=f"{key}_measured", claim=claim, published=value, workbook=ours,
                unit=r["unit"] if isinstance(r["unit"], str) else "", kind=kind, role=MEASURED, op_costs=NO_OP_COSTS,
                error=ours / value - 1, shown_in=list(shown))  # fmt: skip


def beside_twins(claims: pd.DataFrame) -> pd.DataFrame:
    """``claims`` with each measured row (key ``K_measured``) moved to just after its modelled twin ``K``."""
    measured = claims[claims.key.str.endswith("_measured")]
    rest = claims[~claims.key.str.endswith("_measured")]
    out = []
    for _, r in rest.iterrows():
        out.append(r)
        out += [m for _, m in measured[measured.key == f"{r.key}_measured"].iterrows()]
    placed = {r.key for r in out}
    out += [m for _, m in measured.iterrows() if m.key not in placed]
    return pd.DataFrame(out).reset_index(drop=True)


def claims_table(
    validation: pd.DataFrame | None = None, verdicts: pd.DataFrame | None = None, workbook: bool = True
) -> pd.DataFrame:
    """Every claim of the write-up in :data:`CLAIMS`: its published value (data/published.csv), the workbook's
    own (the speeds of light and bytes from mk.sol, the busiest chip exact from mk.routing, the timing model's
    steps and speed-ups from mk.analysis.verdict's validation and verdict tables: ``validation``, ``verdicts`` when
    already computed), the kind of the workbook's value (modelled; fitted, input or by construction where the
    model meets it by design; derived where it is a ratio of two other claims; not modelled) and the error
    workbook / published - 1. Units as published; ``shown_in`` names the figures and tables that show it. With
    ``workbook``, the workbook's own claims follow (:func:`workbook_claims`: no published value, no error)."""
    v = (validation_table() if validation is None else validation).set_index("key")
    d = (verdict_table() if verdicts is None else verdicts).set_index("key")
    rows = []
    for key, r in published_table().set_index("key").loc[list(CLAIMS)].iterrows():
        value = float(r["value"])
        ours, kind, role, op_costs = _workbook_value(key, r, v, d)
        rows.append(
            dict(
                key=key,
                claim=_claim(r),
                published=value,
                workbook=ours,
                unit=r["unit"] if isinstance(r["unit"], str) else "",
                kind=kind,
                role=role,
                op_costs=op_costs,
                error=ours / value - 1,  # for a bound: how far past it (above a lower bound is >= 0)
                shown_in=list(CLAIMS[key]),
            )
        )
    out = pd.concat([pd.DataFrame(rows), measured_claims()], ignore_index=True)
    return beside_twins(pd.concat([out, workbook_claims()], ignore_index=True) if workbook else out)


def _workbook_value(key: str, r, v: pd.DataFrame, d: pd.DataFrame) -> tuple[float, str, str, str]:
    """The workbook's value for the write-up's claim ``key`` (its published row ``r``), its kind, its role
    (:data:`TEST`, :data:`BOUND`, the validation's and verdict's roles) and where its per-op costs come from
    (``v``, ``d``: the validation and verdict tables by key)."""
    q = r["quantity"]
    if q in ("speed_of_light", "bytes_per_token", "experts_per_layer_max_chip"):
        cfg = get_config(r["model"])
        if q == "speed_of_light":
            s = speed_of_light(cfg, r["chip"], int(r["context"]), int(r["batch"]), r["dtype"])
            return s.tokens_per_s, "modelled", TEST, NO_OP_COSTS
        if q == "bytes_per_token":
            total = bytes_per_token(cfg, int(r["context"]), int(r["batch"]), r["dtype"]).total
            return total, "modelled", TEST, NO_OP_COSTS
        dist = busiest_chip_distribution(cfg.num_experts, get_chip(r["chip"]).chips, cfg.top_k, int(r["batch"]))
        return sum(m * p for m, p in dist.items()), "modelled (exact, uniform routing)", TEST, NO_OP_COSTS
    if q == "speedup":
        row = d.loc[key]
        role = row["role"]
        if role.startswith("derived:"):  # "derived: A / B"
            return row["modelled"], f"derived ({role.split(':', 1)[1].strip()})", "derived", row["op_costs"]
        kind = POINT_KINDS.get(role, role).format(row["situation"].split(": ", 1)[-1])
        return row["modelled"], kind, role, row["op_costs"]
    if q == "tokens_per_s_lower_bound":
        ours, kind, op_costs = speculative_stand_in(r)
        return ours, kind, BOUND, op_costs
    row = v.loc[key]
    point = v.loc[row["point"], "role"]
    kind = POINT_KINDS.get(point, point) + (f" (same point as {row['point']})" if row["point"] != key else "")
    return row["modelled"], kind, point, row["op_costs"]


def speculative_stand_in(r) -> tuple[float, str, str]:
    """A published speculative decoding figure for a model past one host (Inferact's Kimi K3): tokens/s per user
    of its stand-in (mk.analysis.verdict.STAND_INS) in its released format on the smallest v5e slice holding it,
    verifying SPECULATION's n-gram drafts a step (the drafter the workbook has for it), and the kind in words."""
    model = STAND_INS[r["model"]]
    mk_case, _ = big_model_cases(model, 1)
    k, a = SPECULATION["draft_tokens"], SPECULATION["accept_rate"]
    t = speculation_table([model], [mk_case.chip], [1], [k], [a], mk_case.context, dtype=mk_case.dtype).iloc[0]
    kind = (
        f"modelled with a stand-in: {model} for {r['model']}, {mk_case.dtype} on {mk_case.chip}, {k} n-gram drafts a "
        f"step each accepted with probability {a:g} (given, not measured); {t.plain_tokens_per_s:.0f} tok/s without"
    )
    return float(t.tokens_per_s), kind, t.op_costs


def _claim(r) -> str:
    """A published row in words: what, of which model, where, at which context and batch."""
    what = QUANTITIES.get(r["quantity"], str(r["quantity"]).replace("_", " "))
    engine = str(r["engine"]) if isinstance(r["engine"], str) else ""
    where = ", ".join(str(x) for x in (r["model"], engine, r["chip"], r["dtype"]) if isinstance(x, str) and x)
    size = f"{int(r['context'])} positions, " if not pd.isna(r["context"]) else ""
    users = int(r["batch"]) if not pd.isna(r["batch"]) else 1
    return f"{what}: {where} ({size}{users} user{'s' if users > 1 else ''})"
