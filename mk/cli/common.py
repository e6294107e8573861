"""What every subcommand of ``python -m mk`` shares: argument types, the one way a result is printed, what --model
takes, the --quantize flag and the megakernel's setup flags."""

from __future__ import annotations

import argparse
import json
import sys


def positive(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def show(obj: dict, as_json: bool, text: str) -> None:
    print(json.dumps(obj) if as_json else text)


def add_quantize(p, formats: bool = False) -> None:
    """--quantize: mk.quant's INT8 schemes, and with ``formats`` the shipped formats (mk.format_trees) too."""
    from ..format_trees import FORMAT_SCHEMES
    from ..params import SCHEMES

    shipped = (
        "; or a format big models ship in (fp8-block, mxfp4, int4: mk.format_trees), which a checkpoint in it loads as"
        if formats
        else ""
    )
    p.add_argument(
        "--quantize",
        choices=SCHEMES + (tuple(FORMAT_SCHEMES) if formats else ()),
        default=None,
        help="INT8 weights (mk.quant): quantize the float weights at load time, before any engine sees them "
        f"(default none); a quantized checkpoint is used as it is (give its own scheme or leave this out){shipped}",
    )


def warn_past_max_positions(model, context: int) -> None:
    """sol and predict: a ``context`` past the model's max_position_embeddings is said on stderr, in one line, and
    computed all the same. A step's bytes and time at a context are well defined whatever the model was trained for,
    and a what-if past it (what a longer-context variant of the model would cost) is a fair question to ask of a
    model; generate refuses it (mk.cli.generate), its tokens there would be no model's."""
    from ..config import get_config

    cfg = get_config(model)
    past = cfg.past_max_positions(context)
    if past:
        print(
            f"warning: {past}: modelled all the same, as a what-if (a --context of at most "
            f"{cfg.max_position_embeddings} is one the model was trained for)",
            file=sys.stderr,
        )


# What --model takes, everywhere: mk.config.get_config resolves it (the engines refuse what they do not run).
MODEL_HELP = (
    "a preset name (python -m mk models lists them), a config.json or a checkpoint folder (data/configs has some), "
    "or a hub id whose config is in the local Hugging Face cache"
)
RUNNABLE_HELP = " (Gemma 4, Llama 3, Qwen3, Qwen3-MoE, Mixtral)"
PLANNED_HELP = " (those run; gpt-oss, DeepSeek-V3 / Kimi K2, Gemma 2/3 planned and timed)"


def add_setup(p, default: str, chips: bool = False) -> None:
    """The megakernel's setup (mk.kernel_setup.KernelSetup): a named one, each of its switches changed by a flag."""
    from ..config import FFN_LAYOUTS
    from ..kernel_setup import LATENT_DOWN, SETUPS, AttentionSplit, Placement

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
        g.add_argument("--chips", type=positive, default=None, help="chips to split the step over (default 1)")
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
        "--latent-down", choices=LATENT_DOWN, default=None,
        help="MLA's down-projections (q_a, kv_a) over the chips: split by rows where that reads fewer bytes a chip "
        "(their partial sums add an all-reduce a layer; the default) or whole on every chip",
    )  # fmt: skip
    g.add_argument(
        "--ffn-layout", choices=FFN_LAYOUTS, default=None,
        help="the gated MLPs' intermediate on rows, padded to 8 (sublanes) or on lanes, padded to 128 (the first "
        "kernel's)",
    )  # fmt: skip


def setup_flags(a) -> list[str]:
    """The setup flags given on the command line, as written."""
    named = ["--setup"] if a.setup != a.default_setup else []
    switches = (
        "chips", "placement", "no_overlap", "bf16_payload", "reduce_scatter", "attention_split", "latent_down",
        "ffn_layout",
    )  # fmt: skip
    return named + [f"--{k.replace('_', '-')}" for k in switches if getattr(a, k, None) not in (None, False)]


def setup_of(a, draft_tokens: int = 0):
    """The KernelSetup the flags of :func:`add_setup` name: the named setup, each flag given changing it."""
    import dataclasses

    from ..kernel_setup import ONE_CHIP, SETUPS

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
        latent_down=a.latent_down,
        ffn_layout=a.ffn_layout,
        draft_tokens=draft_tokens or None,
    )
    if draft_tokens and not a.attention_split:  # the kernel verifies drafts with attention split by heads only
        given["attention_split"] = "heads"
    return base.but(collective=coll, **{k: v for k, v in given.items() if v is not None})
