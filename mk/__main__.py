"""The ``python -m mk`` command line. Each subcommand parses its arguments here and calls into ``mk``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _print(obj: dict, as_json: bool, text: str) -> None:
    print(json.dumps(obj) if as_json else text)


def _add_quantize(p) -> None:
    from .params import SCHEMES

    p.add_argument(
        "--quantize",
        choices=SCHEMES,
        default=None,
        help="INT8 weights (mk.quant): quantize the float weights at load time, before any engine sees them "
        "(default none); a quantized checkpoint is used as it is (give its own scheme or leave this out)",
    )


# What --model takes, everywhere: mk.config.get_config resolves it (the engines refuse what they do not run).
MODEL_HELP = (
    "a preset name (python -m mk models lists them), a config.json or a checkpoint folder (data/configs has some), "
    "or a hub id whose config is in the local Hugging Face cache"
)
RUNNABLE_HELP = " (Gemma 4, Llama 3, Qwen3, Qwen3-MoE, Mixtral)"
PLANNED_HELP = " (those run; gpt-oss, DeepSeek-V3 / Kimi K2, Gemma 2/3 planned and timed)"


# sol ---------------------------------------------------------------------------------------------
def _add_sol(sub) -> None:
    from .sol import DTYPES

    p = sub.add_parser("sol", help="speed of light: bytes read per token and the tokens/s they allow on a chip")
    p.add_argument("--model", required=True, help=MODEL_HELP + RUNNABLE_HELP + PLANNED_HELP)
    p.add_argument("--chip", required=True, help="a chip (h100), a slice (tpu-v5e-8) or auto (each TPU's smallest)")
    p.add_argument("--context", type=_positive_int, required=True, help="positions in the KV cache")
    p.add_argument("--batch", type=_positive_int, default=1, help="users decoded together (default 1)")
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES), help="weight data type policy")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_sol)


def _run_sol(a) -> None:
    from .sol import smallest_slices, speed_of_light, text

    if a.chip == "auto":  # the smallest documented slice of each TPU that holds the model
        t = smallest_slices(a.model, a.context, a.batch, a.dtype).drop(columns=["source"])
        return _print({"slices": t.to_dict("records")}, a.json, t.to_string(index=False))
    s = speed_of_light(a.model, a.chip, a.context, a.batch, a.dtype)
    _print(s.to_dict(), a.json, text(s))


# models / chips ------------------------------------------------------------------------------------
def _add_lists(sub) -> None:
    p = sub.add_parser("models", help="list model presets (or describe one model: --model)")
    p.add_argument("--model", action="append", help=MODEL_HELP + RUNNABLE_HELP + PLANNED_HELP + "; repeatable")
    p.set_defaults(run=_run_models)
    sub.add_parser("chips", help="list chips and their sources").set_defaults(run=_run_chips)


def _run_models(a) -> None:
    from .config import PRESETS, get_config
    from .params import count_active_params, count_params

    for model in a.model or PRESETS:
        d = get_config(model)
        kind = f"MoE {d.num_experts}x top-{d.top_k}" if d.is_moe else "dense"
        print(
            f"{d.name:<16} {d.family:<12} {d.num_layers:>3} layers  {kind:<18} {count_params(d):>16,} params "
            f"({count_active_params(d):,} active)"
        )


def _run_chips(a) -> None:
    from .chips import base_chips

    for c in base_chips().values():
        print(
            f"{c.name:<10} {c.hbm_bandwidth / 1e12:6.3f} TB/s  {c.bf16_flops / 1e12:7.0f} TFLOP/s  "
            f"{c.hbm_bytes / 1e9:5.0f} GB  source: {c.source}"
        )


# generate ----------------------------------------------------------------------------------------
def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="greedy generation from a checkpoint or a preset with random weights")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a Hugging Face checkpoint folder or hub repo id")
    src.add_argument(
        "--model", "--preset", dest="model", help="seeded random weights for " + MODEL_HELP + RUNNABLE_HELP
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights of --model (default 0)")
    p.add_argument(
        "--prompt-ids",
        required=True,
        help="comma-separated token ids; ';' separates one prompt per user (of any lengths)",
    )
    p.add_argument("--new-tokens", type=_positive_int, required=True, help="tokens to generate per user")
    p.add_argument("--engine", default="reference", help="a registered decode engine (default reference)")
    p.add_argument(
        "--batch",
        type=_positive_int,
        default=None,
        help="users: a single prompt is replicated for each (default: one per prompt)",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="weight dtype (default: the checkpoint's own; float32 for --model)",
    )
    _add_quantize(p)
    p.add_argument(
        "--max-len",
        type=_positive_int,
        default=None,
        help="KV cache positions (default: the longest prompt plus --new-tokens, less one)",
    )
    p.add_argument(
        "--kv-tile",
        type=_positive_int,
        default=None,
        help="megakernel: KV cache positions per tile (a multiple of 8 in f32, 16 in bf16)",
    )
    p.add_argument(
        "--detect-races",
        action="store_true",
        help="megakernel off a TPU: run the interpreter's race detector (exit 1 if it fires)",
    )
    _add_setup(p, "one-chip", chips=True)
    spec = p.add_argument_group("speculative decoding (the same greedy tokens, fewer target passes)")
    spec.add_argument(
        "--speculate", choices=("ngram", "mtp"), default=None,
        help="draft with prompt lookup (ngram) or Gemma 4's assistant (mtp, needs --assistant); each round verifies "
        "every user's drafts in one step",
    )  # fmt: skip
    spec.add_argument("--assistant", default=None, help="--speculate mtp: the assistant's checkpoint folder or hub id")
    spec.add_argument("--draft-tokens", type=_positive_int, default=None, help="drafts per user and round (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_generate)


def _add_setup(p, default: str, chips: bool = False) -> None:
    """The megakernel's setup (mk.kernel_setup.KernelSetup): a named one, each of its switches changed by a flag."""
    from .config import FFN_LAYOUTS
    from .kernel_setup import SETUPS, AttentionSplit, Placement

    g = p.add_argument_group(
        "megakernel setup (mk.kernel_setup; over several chips: simulated CPU devices off a TPU)"
        if chips
        else "megakernel setup (mk.kernel_setup)"
    )
    names = ["one-chip", *SETUPS] if chips else list(SETUPS)
    g.add_argument(
        "--setup", choices=names, default=default,
        help=f"a named setup, the flags below changing it (default {default}: "
        + ("one chip" if default == "one-chip" else SETUPS[default].name) + ")",
    )  # fmt: skip
    p.set_defaults(default_setup=default)
    if chips:
        g.add_argument("--chips", type=_positive_int, default=None, help="chips to split the step over (default 1)")
    g.add_argument("--placement", choices=[str(x) for x in Placement], default=None, help="routed experts over chips")
    g.add_argument("--no-overlap", action="store_true", help="issue no weight DMA while an all-reduce runs")
    g.add_argument("--bf16-payload", action="store_true", help="all-reduce partial sums in bf16")
    g.add_argument("--reduce-scatter", action="store_true", help="all-reduce as reduce-scatter then all-gather")
    g.add_argument(
        "--attention-split", choices=[str(s) for s in AttentionSplit], default=None,
        help="attention over a slice's chips: by heads (a KV head shared by several chips' query heads is read whole "
        "on each), by positions (those chips each hold and read a share of its positions; needs a --max-len and a "
        "sliding window rounding to whole blocks of 16 on each) or by users (chip c owns users c*B/C..; B a multiple "
        "of the chips)",
    )  # fmt: skip
    g.add_argument(
        "--ffn-layout", choices=FFN_LAYOUTS, default=None,
        help="the gated MLPs' intermediate on rows, padded to 8 (sublanes) or on lanes, padded to 128 (the first "
        "kernel's)",
    )  # fmt: skip


def _setup_flags(a) -> list[str]:
    """The setup flags given on the command line, as written."""
    named = ["--setup"] if a.setup != a.default_setup else []
    switches = ("chips", "placement", "no_overlap", "bf16_payload", "reduce_scatter", "attention_split", "ffn_layout")
    return named + [f"--{k.replace('_', '-')}" for k in switches if getattr(a, k, None) not in (None, False)]


def _setup(a, draft_tokens: int = 0):
    """The KernelSetup the flags of :func:`_add_setup` name: the named setup, each flag given changing it."""
    import dataclasses

    from .kernel_setup import ONE_CHIP, SETUPS

    base = ONE_CHIP if a.setup == "one-chip" else SETUPS[a.setup]
    coll = base.collective
    coll = dataclasses.replace(
        coll,
        overlap=coll.overlap and not a.no_overlap,
        bf16_payload=coll.bf16_payload or a.bf16_payload,
        reduce_scatter=coll.reduce_scatter or a.reduce_scatter,
    )
    given = dict(
        chips=getattr(a, "chips", None),
        placement=a.placement,
        attention_split=a.attention_split,
        ffn_layout=a.ffn_layout,
        draft_tokens=draft_tokens or None,
    )
    if draft_tokens and not a.attention_split:  # the kernel verifies drafts with attention split by heads only
        given["attention_split"] = "heads"
    return base.but(collective=coll, **{k: v for k, v in given.items() if v is not None})


def _prompts(text: str, batch: int | None) -> list[list[int]]:
    """'1,2,3' or '1,2;3,4,5' -> one list of ids per user (lengths may differ); a single prompt is
    replicated ``batch`` times."""
    prompts = []
    for part in text.split(";"):
        try:
            ids = [int(t) for t in part.split(",") if t.strip()]
        except ValueError:
            raise ValueError(
                f"--prompt-ids must be integers separated by ',' (and ';' between users), got {part!r}"
            ) from None
        if not ids:
            raise ValueError(f"--prompt-ids has an empty prompt in {text!r}")
        prompts.append(ids)
    if batch is not None and len(prompts) == 1:
        prompts *= batch
    elif batch is not None and batch != len(prompts):
        raise ValueError(f"--batch {batch} does not match the {len(prompts)} prompts given")
    return prompts


def _run_generate(a) -> None:
    import jax.numpy as jnp

    from .config import get_config
    from .engines import check_engine
    from .generate import generate
    from .quant import quantized_as, scheme_of
    from .weights import load_assistant, load_checkpoint, random_params

    check_engine(a.engine)  # an unknown engine fails before any weights are read
    if not a.speculate and (a.assistant or a.draft_tokens):
        raise ValueError("--assistant and --draft-tokens are speculative decoding's: add --speculate ngram|mtp")
    if a.speculate:
        from .generate import check_drafter

        check_drafter(a.speculate, a.assistant)
    setup = _setup(a)
    given = dict(kv_tile=a.kv_tile, detect_races=a.detect_races or None)
    options = {k: v for k, v in given.items() if v is not None}
    flags = [f"--{k.replace('_', '-')}" for k in options] + _setup_flags(a)
    if flags and a.engine != "megakernel":
        raise ValueError(f"{' '.join(flags)}: megakernel options, not {a.engine!r}'s")
    if a.engine == "megakernel":
        options["setup"] = setup
    if setup.chips > 1:
        from .sharding import simulate_chips

        simulate_chips(setup.chips)  # off a TPU: the CPU's simulated devices (before JAX starts its backends)
    prompts = _prompts(a.prompt_ids, a.batch)
    dtype = getattr(jnp, a.dtype) if a.dtype else None
    if a.checkpoint:
        cfg, params = load_checkpoint(a.checkpoint, dtype=dtype)
    else:
        cfg = get_config(a.model)
        params = random_params(cfg, a.seed, dtype or jnp.float32)
    params = quantized_as(params, cfg, a.quantize)
    d = {"engine": a.engine, "model": cfg.name, "quantize": scheme_of(params, cfg), "batch": len(prompts),
         "prompt_ids": prompts}  # fmt: skip
    run = dict(engine=a.engine, max_len=a.max_len, progress=not a.json, engine_options=options)
    if a.speculate:
        from .generate import generate_speculative

        assistant = load_assistant(a.assistant, cfg, dtype=dtype) if a.assistant else None
        k = a.draft_tokens or 3
        r = generate_speculative(params, cfg, prompts, a.new_tokens, a.speculate, k, assistant=assistant, **run)
        d.update(speculate=a.speculate, draft_tokens=k, **r.to_dict())
    else:
        d["tokens"] = generate(params, cfg, prompts, a.new_tokens, **run).tolist()
    if a.detect_races:
        from .tpu import races_detected

        d["races"] = races_detected()
        if d["races"]:
            _print(d, a.json, "the race detector fired")
            raise SystemExit(1)
    _print(d, a.json, "\n".join(f"user {u}: {' '.join(map(str, t))}" for u, t in enumerate(d["tokens"])))


# bench -------------------------------------------------------------------------------------------
def _add_bench(sub) -> None:
    from .measure.cpu import ARRAY_DTYPES
    from .paths import BENCH_CSV

    p = sub.add_parser("bench", help="time the compiled decode step against this device's measured speed of light")
    p.add_argument(
        "--model", "--preset", dest="model", help=MODEL_HELP + RUNNABLE_HELP + " (random weights unless --checkpoint)"
    )
    p.add_argument("--checkpoint", help="a Hugging Face checkpoint folder or hub repo id (checked against --preset)")
    p.add_argument("--context", type=_positive_int, required=True, help="positions in the KV cache")
    p.add_argument("--batch", type=_positive_int, default=1, help="users decoded together (default 1)")
    p.add_argument(
        "--precision",
        type=float,
        default=0.02,
        help="stop once the fraction of the speed of light is known to +- this share of itself (95%% interval; "
        "default 0.02)",
    )
    p.add_argument("--budget", type=float, default=30.0, help="seconds of interleaved rounds at most (default 30)")
    p.add_argument(
        "--dtype",
        choices=list(ARRAY_DTYPES),
        default="f32",
        help="weights and KV cache data type (default f32: XLA:CPU runs f32 matvecs fastest)",
    )
    _add_quantize(p)
    p.add_argument("--engine", default="reference", help="a registered decode engine (default reference)")
    p.add_argument("--csv", default=str(BENCH_CSV), help=f"CSV to append the row to (default {BENCH_CSV})")
    p.add_argument("--no-csv", action="store_true", help="do not append a row")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_bench)


def _run_bench(a) -> None:
    from .config import get_config
    from .engines import check_engine
    from .measure.cpu import ARRAY_DTYPES, append_row, run_bench
    from .weights import load_checkpoint

    if not a.model and not a.checkpoint:
        raise ValueError("bench needs --model MODEL (random weights) or --checkpoint DIR")
    check_engine(a.engine)
    cfg = get_config(a.model) if a.model else None
    params = weights = None
    if a.checkpoint:
        cfg, params = load_checkpoint(a.checkpoint, cfg, dtype=ARRAY_DTYPES[a.dtype])
        weights = str(a.checkpoint)
    if not 0 < a.precision < 1 or a.budget <= 0:
        raise ValueError(f"--precision must be in (0, 1) and --budget positive, got {a.precision} and {a.budget}")
    r = run_bench(
        cfg,
        a.context,
        a.batch,
        a.dtype,
        a.engine,
        params=params,
        weights=weights,
        precision=a.precision,
        budget_s=a.budget,
        quantize=a.quantize,
    )
    row = r.row()
    if not a.no_csv:
        row["csv"] = str(append_row(row, a.csv))
    _print(row, a.json, r.text() + (f"\n  appended to {row['csv']}" if "csv" in row else ""))


# straggler ---------------------------------------------------------------------------------------
def _add_straggler(sub) -> None:
    p = sub.add_parser(
        "straggler",
        help="the busiest chip's experts per layer with experts placed whole over chips (exact, uniform routing)",
    )
    p.add_argument("--experts", type=_positive_int, required=True, help="experts per layer (E)")
    p.add_argument("--chips", type=_positive_int, required=True, help="chips the experts are placed over (C divides E)")
    p.add_argument("--top-k", type=_positive_int, required=True, help="experts each user routes to (k)")
    p.add_argument("--batch", type=_positive_int, default=1, help="users decoded together (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_straggler)


def _run_straggler(a) -> None:
    from .analysis.straggler import busiest_chip

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
    _print(s.to_dict(), a.json, "\n".join(lines))


# predict -----------------------------------------------------------------------------------------
def _add_predict(sub) -> None:
    from .sol import DTYPES
    from .timing import ENGINES

    p = sub.add_parser(
        "predict", help="modelled decode step: time, tokens/s and fraction of the speed of light (mk.timing)"
    )
    p.add_argument("--model", required=True, help=MODEL_HELP + RUNNABLE_HELP + PLANNED_HELP)
    p.add_argument("--chip", required=True, help="a chip (h100) or a slice (tpu-v5e-8)")
    p.add_argument("--context", type=_positive_int, required=True, help="positions in the KV cache")
    p.add_argument("--batch", type=_positive_int, default=1, help="users decoded together (default 1)")
    p.add_argument("--engine", default="megakernel", choices=ENGINES, help="one kernel per step, or a general stack")
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES), help="weight data type policy")
    _add_setup(p, "workbook")
    p.add_argument(
        "--speculate",
        type=_positive_int,
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


def _run_predict(a) -> None:
    from .assistant_config import read_assistant_config
    from .timing import predict

    assistant = read_assistant_config(a.assistant) if a.assistant else None
    p = predict(
        a.model, a.chip, a.context, a.batch, a.engine, a.dtype, setup=_setup(a, a.speculate), acceptance=a.acceptance,
        assistant=assistant,
    )  # fmt: skip
    d = p.to_dict()
    lines = [
        f"{p.model} on {p.chip}, context {p.context}, batch {p.batch}, {p.dtype}, {p.engine} (modelled: {p.models})",
        f"  setup           {p.setup}",
        f"  step            {d['step_ms']:10.4f} ms",
        *([f"  tokens/round    {p.tokens_per_round:10.2f} per user ({p.draft_tokens} drafted)"] * bool(p.draft_tokens)),
        f"  tokens/s/user   {d['tokens_per_s']:10.1f}",
        f"  tokens/s total  {d['tokens_per_s_total']:10.1f}",
        f"  speed of light  {d['sol_tokens_per_s']:10.1f} tokens/s/user ({d['fraction_of_sol']:.1%} of it)",
        f"  kernels/step    {d['kernels_per_step']:10.0f}",
    ]
    if not p.fits_in_hbm:
        lines.append(f"  note: the weights and caches do not fit {p.chip}'s HBM; the time assumes they did")
    lines += [f"  constant {k}: {v}" for k, v in p.constants.items()]
    _print(d, a.json, "\n".join(lines))


# schedule ----------------------------------------------------------------------------------------
def _add_schedule(sub) -> None:
    from .sol import DTYPES
    from .timing.work import kernel_streams

    p = sub.add_parser(
        "schedule",
        help="the megakernel's step as libtpu's compiler schedules it: bundles by op kind, compute time beside the "
        "HBM time (compiles with libtpu, exit 2 without; --stored reads data/schedule)",
    )
    p.add_argument("--model", help=MODEL_HELP + RUNNABLE_HELP + " (not with --refresh, --missing)")
    p.add_argument("--chip", help="a TPU (tpu-v5e) or a slice of one (tpu-v5e-8) (not with --refresh, --missing)")
    p.add_argument("--context", type=_positive_int, default=1024, help="positions in the KV cache (default 1024)")
    p.add_argument("--batch", type=_positive_int, default=1, help="users decoded together (default 1)")
    dtypes = [d for d in DTYPES if kernel_streams(d)]  # FP8 and the 4-bit formats are modelled by bytes: no schedule
    p.add_argument("--dtype", default="bf16", choices=dtypes, help="the weights' data type as the kernel streams it")
    _add_setup(p, "workbook")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--stored", action="store_true", help="read the rows kept in data/schedule; compile nothing")
    g.add_argument("--store", action="store_true", help="keep the compiled rows in data/schedule")
    g.add_argument("--refresh", action="store_true", help="compile and store every case data/schedule keeps")
    g.add_argument("--missing", action="store_true", help="compile and store the kept cases data/schedule lacks")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_schedule)


def _run_schedule(a) -> None:
    from .measure import compiler_schedule as cs
    from .timing import named_plan

    whole = a.refresh or a.missing  # every kept case: no plan named
    if whole and (a.model or a.chip) or not whole and not (a.model and a.chip):
        raise SystemExit(
            "mk schedule: give --model and --chip for one plan, or --refresh / --missing (no --model, --chip) for "
            "every case data/schedule keeps"
        )
    try:
        if whole:
            for case, bundles in cs.refresh(missing=a.missing):
                print(f"{case}: {bundles:,.0f} bundles", flush=True)
            return
        plan = named_plan(a.model, a.chip, a.context, a.batch, _setup(a), a.dtype)
        s = cs.schedule_for(plan, a.chip, stored=a.stored, keep=a.store)
    except (RuntimeError, LookupError) as e:
        print(f"mk schedule: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    _print(s.to_dict(), a.json, cs.text(s.to_dict()))


# report ------------------------------------------------------------------------------------------
def _add_report(sub) -> None:
    p = sub.add_parser(
        "report", help="write figures/index.html: every exported figure and table by notebook, with provenance"
    )
    p.add_argument(
        "--figures", type=Path, help="the figures folder (default: $MK_FIGURES_DIR, else figures/ in the repository)"
    )
    p.set_defaults(run=_run_report)


def _run_report(a) -> None:
    from .report import write_report

    print(write_report(a.figures))


# measure-gpu -------------------------------------------------------------------------------------
def _add_measure(sub) -> None:
    from .measure.gpu import ARRAY_DTYPES, DEVICES, ENGINES
    from .paths import GPU_CSV

    p = sub.add_parser(
        "measure-gpu",
        help="the reference's decode step and transformers' Gemma 4 timed interleaved on one device, with kernels "
        "per step, beside the speed of light",
    )
    p.add_argument(
        "--model", default="gemma4-26b-a4b", help="random bf16 weights for " + MODEL_HELP + " (default gemma4-26b-a4b)"
    )
    p.add_argument("--context", type=_positive_int, default=1024, help="positions in the KV cache (default 1024)")
    p.add_argument("--batch", type=_positive_int, default=1, help="users decoded together (default 1)")
    p.add_argument(
        "--budget-s", type=float, default=300.0, help="seconds for the whole run, weight init included (default 300)"
    )
    p.add_argument("--device", choices=DEVICES, default="gpu", help="where to run both engines (default gpu)")
    p.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help=f"comma-separated, some of {', '.join(ENGINES)} (default both, interleaved)",
    )
    p.add_argument("--dtype", choices=list(ARRAY_DTYPES), default="bf16", help="weights and KV cache (default bf16)")
    p.add_argument("--chip", default=None, help="the speed of light's chip (default: the device's, if a known chip)")
    p.add_argument("--out", default=str(GPU_CSV), help=f"CSV to append the rows to (default {GPU_CSV})")
    p.add_argument("--no-csv", action="store_true", help="do not append rows")
    p.set_defaults(run=_run_measure)


def _run_measure(a) -> None:
    import os

    from .config import get_config
    from .measure import gpu

    cfg = get_config(a.model)
    engines = tuple(e.strip() for e in a.engines.split(",") if e.strip())
    if not a.budget_s > 0:
        raise ValueError(f"--budget-s must be positive, got {a.budget_s}")
    table = gpu.run(
        cfg,
        a.context,
        a.batch,
        a.budget_s,
        a.device,
        engines=engines,
        dtype=a.dtype,
        out=None if a.no_csv else a.out,
        chip=a.chip,
    )
    print(gpu.text(table) + ("" if a.no_csv or not len(table) else f"\n  appended to {a.out}"), flush=True)
    code = 0 if len(table) else 1  # nothing measured: the reference alone ran out of time compiling
    if gpu.unfinished():  # an abandoned XLA compile is still running in a thread: do not wait for it
        sys.stderr.flush()
        os._exit(code)
    if code:
        raise SystemExit(code)


# tpu-smoke ---------------------------------------------------------------------------------------
def _add_tpu_smoke(sub) -> None:
    from .measure.tpu import PLACEMENTS
    from .paths import TPU_CSV

    p = sub.add_parser(
        "tpu-smoke",
        help="on a TPU VM or slice: the megakernel's greedy tokens against the reference's on its chips, then both "
        "decode steps timed interleaved beside the speed of light (exit 2 without a TPU)",
    )
    p.add_argument("--model", default="gemma4-26b-a4b", help="the timed model, random weights (default gemma4-26b-a4b)")
    p.add_argument(
        "--parity-model", default="cpu-moe", help="the model the tokens are checked on, f32 (default cpu-moe)"
    )
    p.add_argument("--context", type=_positive_int, default=1024, help="positions in the KV cache (default 1024)")
    p.add_argument("--batch", type=_positive_int, default=1, help="users decoded together (default 1)")
    p.add_argument(
        "--placements",
        default=",".join(PLACEMENTS),
        help=f"expert placements to check and time, comma-separated, some of {', '.join(PLACEMENTS)} (default both)",
    )
    p.add_argument("--chips", type=_positive_int, default=None, help="the first N chips (default: all found)")
    p.add_argument(
        "--budget-s", type=float, default=300.0, help="seconds for the whole run, weights included (default 300)"
    )
    p.add_argument(
        "--chip", default=None, help="the speed of light's chip (default: the device's, where data/chips.csv has it)"
    )
    p.add_argument("--out", default=str(TPU_CSV), help=f"CSV to append the rows to (default {TPU_CSV})")
    p.add_argument("--no-csv", action="store_true", help="do not append rows")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_tpu_smoke)


def _run_tpu_smoke(a) -> None:
    from .measure import tpu as tpu_smoke

    placements = tuple(p.strip() for p in a.placements.split(",") if p.strip())
    try:
        r = tpu_smoke.run(
            a.model,
            a.parity_model,
            a.context,
            a.batch,
            placements,
            a.chips,
            a.budget_s,
            None if a.no_csv else a.out,
            chip=a.chip,
        )
    except tpu_smoke.NoTPU as e:
        print(e, file=sys.stderr)
        raise SystemExit(2) from None
    _print(r.to_dict(), a.json, tpu_smoke.text(r))
    if r.failed:  # parity did not hold, an engine failed, or nothing was timed
        raise SystemExit(1)


COMMANDS = (
    _add_sol,
    _add_lists,
    _add_generate,
    _add_bench,
    _add_straggler,
    _add_predict,
    _add_schedule,
    _add_report,
    _add_measure,
    _add_tpu_smoke,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mk", description="mk: decode megakernels for Gemma 4")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
