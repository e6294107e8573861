"""The generate command: greedy (or speculative) tokens from a checkpoint or random weights, on any engine."""

from __future__ import annotations

from .common import (
    MODEL_HELP,
    RUNNABLE_HELP,
    add_quantize,
    add_setup,
    positive,
    setup_flags,
    setup_of,
    show,
)


# generate ----------------------------------------------------------------------------------------
def add_generate(sub) -> None:
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
    p.add_argument("--new-tokens", type=positive, required=True, help="tokens to generate per user")
    p.add_argument("--engine", default="reference", help="a registered decode engine (default reference)")
    p.add_argument(
        "--batch",
        type=positive,
        default=None,
        help="users: a single prompt is replicated for each (default: one per prompt)",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="weight dtype (default: the checkpoint's own; float32 for --model)",
    )
    add_quantize(p, formats=True)
    p.add_argument(
        "--max-len",
        type=positive,
        default=None,
        help="KV cache positions (default: the longest prompt plus --new-tokens, less one)",
    )
    p.add_argument(
        "--kv-tile",
        type=positive,
        default=None,
        help="megakernel: KV cache positions per tile (a multiple of 8 in f32, 16 in bf16)",
    )
    p.add_argument(
        "--detect-races",
        action="store_true",
        help="megakernel off a TPU: run the interpreter's race detector (exit 1 if it fires)",
    )
    add_setup(p, "one-chip", chips=True)
    spec = p.add_argument_group("speculative decoding (the same greedy tokens, fewer target passes)")
    spec.add_argument(
        "--speculate", choices=("ngram", "mtp"), default=None,
        help="draft with prompt lookup (ngram) or Gemma 4's assistant (mtp, needs --assistant); each round verifies "
        "every user's drafts in one step",
    )  # fmt: skip
    spec.add_argument("--assistant", default=None, help="--speculate mtp: the assistant's checkpoint folder or hub id")
    spec.add_argument("--draft-tokens", type=positive, default=None, help="drafts per user and round (default 3)")
    p.add_argument(
        "--multi-host", action="store_true",
        help="on every host of a multi-host TPU slice: start JAX's multi-controller runtime first "
        "(jax.distributed.initialize), so the step spans every host's chips (refused on one process)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_generate)


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

    from ..config import get_config
    from ..engines import check_engine
    from ..format_trees import FORMAT_SCHEMES
    from ..generate import generate
    from ..quant import quantized_as, scheme_of
    from ..weights import load_assistant, load_checkpoint, random_params

    if a.multi_host:  # before anything touches JAX's devices
        from ..tpu import start_multi_host

        start_multi_host()
    check_engine(a.engine)  # an unknown engine fails before any weights are read
    if not a.speculate and (a.assistant or a.draft_tokens):
        raise ValueError("--assistant and --draft-tokens are speculative decoding's: add --speculate ngram|mtp")
    if a.speculate:
        from ..generate import check_drafter

        check_drafter(a.speculate, a.assistant)
    setup = setup_of(a)
    given = dict(kv_tile=a.kv_tile, detect_races=a.detect_races or None)
    options = {k: v for k, v in given.items() if v is not None}
    flags = [f"--{k.replace('_', '-')}" for k in options] + setup_flags(a)
    if flags and a.engine != "megakernel":
        raise ValueError(f"{' '.join(flags)}: megakernel options, not {a.engine!r}'s")
    if a.engine == "megakernel":
        options["setup"] = setup
    if setup.chips > 1:
        from ..sharding import simulate_chips

        simulate_chips(setup.chips)  # off a TPU: the CPU's simulated devices (before JAX starts its backends)
    prompts = _prompts(a.prompt_ids, a.batch)
    _check_positions(a, prompts)
    dtype = getattr(jnp, a.dtype) if a.dtype else None
    if a.checkpoint:
        cfg, params = load_checkpoint(a.checkpoint, dtype=dtype, codes=a.quantize in FORMAT_SCHEMES)
    else:
        cfg = get_config(a.model)
        params = random_params(cfg, a.seed, dtype or jnp.float32)
    params = quantized_as(params, cfg, a.quantize)
    if a.multi_host and a.engine == "megakernel":  # the slice as `mk compile` compiles it (mk.sharding.pods.pod_setup)
        options["setup"] = _over_the_slice(setup, cfg, a.quantize)
    d = {"engine": a.engine, "model": cfg.name, "quantize": scheme_of(params, cfg), "batch": len(prompts),
         "prompt_ids": prompts}  # fmt: skip
    run = dict(engine=a.engine, max_len=a.max_len, progress=not a.json, engine_options=options)
    if a.speculate:
        from ..generate import generate_speculative

        assistant = load_assistant(a.assistant, cfg, dtype=dtype) if a.assistant else None
        k = a.draft_tokens or 3
        r = generate_speculative(params, cfg, prompts, a.new_tokens, a.speculate, k, assistant=assistant, **run)
        d.update(speculate=a.speculate, draft_tokens=k, **r.to_dict())
    else:
        d["tokens"] = generate(params, cfg, prompts, a.new_tokens, **run).tolist()
    if a.detect_races:
        from ..tpu import races_detected

        d["races"] = races_detected()
        if d["races"]:
            show(d, a.json, "the race detector fired")
            raise SystemExit(1)
    show(d, a.json, "\n".join(f"user {u}: {' '.join(map(str, t))}" for u, t in enumerate(d["tokens"])))


def _check_positions(a, prompts: list[list[int]]) -> None:
    """Refuse, before any weights are read, tokens decoded past the model's max_position_embeddings: the model was
    not trained at those positions (its RoPE, a scaled one the more so, was fitted to that length), so the tokens
    there would be well-formed but no model's, and nothing in what generate prints would say so. (sol and predict
    warn instead: a step's cost at a context is a fair what-if.) What counts is the positions the tokens are decoded
    at, the longest prompt plus the new tokens less one; a larger --max-len only allocates cache positions unused."""
    from ..config import get_config
    from ..weights import checkpoint_folder

    cfg = get_config(checkpoint_folder(a.checkpoint) if a.checkpoint else a.model)
    longest = max(len(p) for p in prompts)
    reached_by = f"the longest prompt, {longest} tokens, plus {a.new_tokens} new tokens, less one"
    past = cfg.past_max_positions(longest + a.new_tokens - 1, reached_by)
    if past:
        most = cfg.max_position_embeddings
        fix = f"--new-tokens {most - longest + 1} or fewer" if longest <= most else f"a prompt of {most} tokens at most"
        raise ValueError(f"{past}: the model was not trained at those positions; give {fix}")


def _over_the_slice(setup, cfg, quantize: str = "none"):
    """``setup`` over every chip of the slice JAX's runtime joined (``--chips`` must say all of them), past one
    host round its torus, a split MoE's experts whole over hosts (mk.sharding.pods.pod_setup)."""
    import jax

    from ..chips import known_chip, slice_of
    from ..sharding.pods import pod_setup

    devices = jax.devices()
    if setup.chips != len(devices):
        raise ValueError(f"--multi-host: the slice has {len(devices)} chips; give --chips {len(devices)}")
    kind = known_chip(devices[0])
    return pod_setup(setup, slice_of(kind, len(devices)), cfg, dtype=quantize) if kind else setup
