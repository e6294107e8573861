"""The commands that compute from data and the models, running nothing: sol, models, chips, straggler, predict."""

from __future__ import annotations

from .common import (
    MODEL_HELP,
    PLANNED_HELP,
    RUNNABLE_HELP,
    add_setup,
    positive,
    setup_of,
    show,
    warn_past_max_positions,
)


# sol ---------------------------------------------------------------------------------------------
def add_sol(sub) -> None:
    from ..dtypes import DTYPES

    p = sub.add_parser("sol", help="speed of light: bytes read per token and the tokens/s they allow on a chip")
    p.add_argument("--model", required=True, help=MODEL_HELP + RUNNABLE_HELP + PLANNED_HELP)
    p.add_argument("--chip", required=True, help="a chip (h100), a slice (tpu-v5e-8) or auto (each TPU's smallest)")
    p.add_argument("--context", type=positive, required=True, help="positions in the KV cache")
    p.add_argument("--batch", type=positive, default=1, help="users decoded together (default 1)")
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES), help="weight data type policy")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_sol)


def _run_sol(a) -> None:
    from ..sol import smallest_slices, speed_of_light, text

    warn_past_max_positions(a.model, a.context)
    if a.chip == "auto":  # the smallest documented slice of each TPU that holds the model
        t = smallest_slices(a.model, a.context, a.batch, a.dtype).drop(columns=["source"])
        return show({"slices": t.to_dict("records")}, a.json, t.to_string(index=False))
    s = speed_of_light(a.model, a.chip, a.context, a.batch, a.dtype)
    show(s.to_dict(), a.json, text(s))


# models / chips ------------------------------------------------------------------------------------
def add_lists(sub) -> None:
    p = sub.add_parser("models", help="list model presets (or describe one model: --model)")
    p.add_argument("--model", action="append", help=MODEL_HELP + RUNNABLE_HELP + PLANNED_HELP + "; repeatable")
    p.set_defaults(run=_run_models)
    sub.add_parser("chips", help="list chips and their sources").set_defaults(run=_run_chips)


def _run_models(a) -> None:
    from ..config import PRESETS, get_config
    from ..params import count_active_params, count_params

    for model in a.model or PRESETS:
        d = get_config(model)
        kind = f"MoE {d.num_experts}x top-{d.top_k}" if d.is_moe else "dense"
        print(
            f"{d.name:<16} {d.family:<12} {d.num_layers:>3} layers  {kind:<18} {count_params(d):>16,} params "
            f"({count_active_params(d):,} active)"
        )


def _run_chips(a) -> None:
    from ..chips import base_chips

    for c in base_chips().values():
        print(
            f"{c.name:<10} {c.hbm_bandwidth / 1e12:6.3f} TB/s  {c.bf16_flops / 1e12:7.0f} TFLOP/s  "
            f"{c.hbm_bytes / 1e9:5.0f} GB  source: {c.source}"
        )


# straggler ---------------------------------------------------------------------------------------
def add_straggler(sub) -> None:
    p = sub.add_parser(
        "straggler",
        help="the busiest chip's experts per layer with experts placed whole over chips (exact, uniform routing)",
    )
    p.add_argument("--experts", type=positive, required=True, help="experts per layer (E)")
    p.add_argument("--chips", type=positive, required=True, help="chips the experts are placed over (C divides E)")
    p.add_argument("--top-k", type=positive, required=True, help="experts each user routes to (k)")
    p.add_argument("--batch", type=positive, default=1, help="users decoded together (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_straggler)


def _run_straggler(a) -> None:
    from ..analysis.straggler import busiest_chip

    s = busiest_chip(a.experts, a.chips, a.top_k, a.batch)
    lines = [
        f"{s.experts} experts placed whole over {s.chips} chips ({s.experts // s.chips} each), top-{s.top_k}, "
        f"batch {s.batch} (modelled: exact under uniform routing)",
        "  busiest chip's distinct experts   probability",
    ]
    lines += [f"  {m:>30}   {p:11.4g}" for m, p in s.distribution.items()]
    lines += [
        f"  expected busiest chip  {s.expected_max:8.4f} experts per layer",
        f"  mean per chip          {s.mean:8.4f} experts per layer (what split placement loads on every chip)",
    ]
    show(s.to_dict(), a.json, "\n".join(lines))


# predict -----------------------------------------------------------------------------------------
def add_predict(sub) -> None:
    from ..dtypes import DTYPES
    from ..timing import ENGINES

    p = sub.add_parser(
        "predict", help="modelled decode step: time, tokens/s and fraction of the speed of light (mk.timing)"
    )
    p.add_argument("--model", required=True, help=MODEL_HELP + RUNNABLE_HELP + PLANNED_HELP)
    p.add_argument(
        "--chip",
        required=True,
        help="a chip (h100) or a slice (tpu-v5e-8); auto: the smallest documented tpu-v5e slice that holds the model "
        "in --dtype, auto:CHIP the smallest of CHIP's (auto:tpu-v5p)",
    )
    p.add_argument("--context", type=positive, required=True, help="positions in the KV cache")
    p.add_argument("--batch", type=positive, default=1, help="users decoded together (default 1)")
    p.add_argument("--engine", default="megakernel", choices=ENGINES, help="one kernel per step, or a general stack")
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES), help="weight data type policy")
    add_setup(p, "workbook")
    p.add_argument(
        "--speculate",
        type=positive,
        default=0,
        metavar="K",
        help="megakernel: verify K drafted tokens per user in each step (n-gram drafts: no drafter weights)",
    )
    p.add_argument(
        "--acceptance",
        type=float,
        default=None,
        metavar="A",
        help="with --speculate: mean tokens a round emits per user, 1 (no draft accepted) to K + 1",
    )
    p.add_argument(
        "--assistant",
        default=None,
        metavar="DIR",
        help="with --speculate: drafts by this Gemma 4 assistant (its config.json, or the folder holding it), "
        "K programs a round outside the kernel (default: n-gram drafts, no drafter cost)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_predict)


AUTO_BASE = "tpu-v5e"  # --chip auto: the write-up's megakernel ran on v5e


def _picked_words(chip: str) -> str:
    from ..chips import get_chip, slice_shapes

    if get_chip(chip).base in slice_shapes():
        return "the smallest documented slice that does"
    return "the fewest chips, a power of two, that do; no slice shapes of this chip are documented in data/slices.csv"


def _run_predict(a) -> None:
    from ..assistant_config import read_assistant_config
    from ..sol import auto_chip
    from ..timing import predict

    warn_past_max_positions(a.model, a.context)
    assistant = read_assistant_config(a.assistant) if a.assistant else None
    chip, picked = a.chip, a.chip == "auto" or a.chip.startswith("auto:")
    if picked:
        base = a.chip.partition(":")[2] or AUTO_BASE
        chip = auto_chip(a.model, base, a.dtype, a.context, a.batch).name
    p = predict(
        a.model, chip, a.context, a.batch, a.engine, a.dtype, setup=setup_of(a, a.speculate), acceptance=a.acceptance,
        assistant=assistant,
    )  # fmt: skip
    links_s = None if p.pacing is None else p.pacing.ici_s  # the megakernel's time on the links between chips
    d = dict(p.to_dict(), chip_picked=picked, links_ms=None if links_s is None else links_s * 1e3)
    lines = [
        f"{p.model} on {p.chip}, context {p.context}, batch {p.batch}, {p.dtype}, {p.engine} (modelled: {p.models})",
        f"  setup           {p.setup}",
        f"  step            {d['step_ms']:10.4f} ms",
        *([f"  tokens/round    {p.tokens_per_round:10.2f} per user ({p.draft_tokens} drafted)"] * bool(p.draft_tokens)),
        f"  tokens/s/user   {d['tokens_per_s']:10.1f}",
        f"  tokens/s total  {d['tokens_per_s_total']:10.1f}",
        f"  speed of light  {d['sol_tokens_per_s']:10.1f} tokens/s/user ({d['fraction_of_sol']:.1%} of it)",
        f"  kernels/step    {d['kernels_per_step']:10.0f}",
        *([f"  on the links    {links_s * 1e3:10.4f} ms (all-reduces and gathers between chips)"] if links_s else []),
        f"  note: {p.fit_note}" + (f" (--chip {a.chip}: {_picked_words(chip)})" if picked else ""),
    ]
    lines += [f"  constant {k}: {v}" for k, v in p.constants.items()]
    show(d, a.json, "\n".join(lines))
