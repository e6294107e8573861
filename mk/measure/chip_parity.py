"""The megakernel against the reference on this machine's chip, for a tiny model of every family the kernel runs and
each format libtpu compiles, in f32 and in bf16: one row a check (``python -m mk tpu-measure --parts parity``, and
``tpu-smoke --family-parity``; off a TPU the kernel runs in Pallas's interpreter with its race detector on, and a race
fails the check).

Both engines decode greedily for three users with prompts of different lengths (mk.megakernel.parity: the same
prefilled cache, the kernel from its own greedy picks). What must hold, and why:

- **f32**: the same tokens at every step, and every logit within ``F32_LOGIT_ATOL`` of the reference's. Both run their
  products at ``HIGHEST`` (the kernel's f32 dots always do, mk.megakernel.mxu; the reference under
  ``jax.default_matmul_precision("highest")``), six bf16 passes that keep f32's 24 bits: what is left is the order of
  the sums, about 1e-6 of logits of order 0.3 here. At XLA's default the reference would run one bf16 pass and differ
  from the kernel by bf16's rounding; that is the reference's imprecision, not the kernel's, so it is not the criterion.
- **bf16**: the kernel reads bf16 weights and cache and computes in f32 from them, rounding each weight product's
  activations, and attention's query and probabilities, to bf16 (mk.megakernel.mxu: what a TPU's one-pass products
  do, made explicit so that the interpreter computes what the chip does); the reference stays f32. Fed the reference's
  tokens (teacher-forced) for ``BF16_STEPS`` steps of four ragged users (the test suite's bf16 run), the kernel's
  largest logit error must stay within ``BF16_FACTOR`` times that of a reference that rounds where the kernel does
  (``kernel_rounding_logit_diff``, mk.megakernel.parity), and its greedy picks may leave the reference's at most
  ``BF16_PICKS_MARGIN`` more often than that reference's do. What the rounding of the weights and cache alone costs is
  kept beside it (``rounding_logit_diff``). Every reference runs at ``HIGHEST`` on every machine, rounding only where
  it says (on a TPU XLA's default would round operands the kernel keeps f32).
- **bf16, routed families**: routing is discontinuous. Where two experts' router scores are within rounding of each
  other (a few tokens of tiny-qwen3-moe's check: the k-th and the next expert's logits nearly equal), the kernel and
  the kernel-like reference fall either way on differences below what a reference reproduces (the order of f32 sums,
  the kernel's online softmax over KV tiles, a TPU's f32 products as bf16 passes), and that user's logits then jump by
  many times rounding's error, for the rest of its stream (the other expert's output enters the cache). Which side
  takes the jump is luck, not the kernel's accuracy: in the interpreter tiny-qwen3-moe's kernel takes one its
  kernel-like reference does not, on a v5e DeepSeek-V3's kernel takes one (as it does in the interpreter) that the
  chip's XLA reference does not. So a routed family's logits bound is taken with routing fixed: the router knocked out
  in both engines (every token to experts 0..k-1 at equal weights), every other product, attention and the experts'
  combine as they are (``fixed_routing_logit_diff`` against ``fixed_routing_kernel_rounding_logit_diff``); routing as
  is must keep the picks as above, and its largest jump is kept beside (``max_logit_diff``). The router's own
  arithmetic is held exact by the f32 check.
- **Formats** (INT8 experts, FP8 blocks): the kernel streams the codes and their scales; the reference dequantizes the
  same tree once. f32 as above.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from ..config import get_config
from ..megakernel.parity import compare_with_reference
from ..params import ROUTER
from ..progress import Log
from ..tpu import on_tpu, reset_interpreter

FAMILIES = (
    "tiny-dense",
    "tiny-moe",
    "tiny-llama",
    "tiny-qwen3-moe",
    "tiny-mixtral",
    "tiny-gpt-oss",
    "tiny-deepseek-v3",
)
# every format, each on a model it applies to; FP8 on MLA's latent projections too
FORMATS = (("tiny-moe", "int8-experts"), ("tiny-dense", "fp8-block"), ("tiny-deepseek-v3", "fp8-block"),
           ("tiny-moe", "int4"), ("tiny-moe", "mxfp4"))  # fmt: skip
PROMPTS = (7, 3, 12)  # the users' prompt lengths: ragged, each decoding from its own position
STEPS = 4
F32_LOGIT_ATOL = 1e-4
BF16_PROMPTS = (20, 11, 30, 5)  # tests/test_megakernel.py's bf16 run: one user across a window of 32, 16 steps
BF16_STEPS = 16
BF16_FACTOR = 1.25
BF16_PICKS_MARGIN = 0.05
_KERNEL_LIKE = "a reference rounding where the kernel does"
COLUMNS = (
    "model",
    "family",
    "dtype",
    "quantize",
    "users",
    "steps",
    "same_tokens",
    "max_logit_diff",
    "rounding_logit_diff",
    "kernel_rounding_logit_diff",
    "picks_kept",
    "rounding_picks_kept",
    "kernel_rounding_picks_kept",
    "fixed_routing_logit_diff",
    "fixed_routing_kernel_rounding_logit_diff",
    "criterion",
    "held",
    "races",
    "check_s",
    "error",
)
_MEASURED = COLUMNS[COLUMNS.index("same_tokens") : COLUMNS.index("criterion")]  # what a check that failed to run lacks


def checks(families=FAMILIES, formats=FORMATS) -> list[tuple[str, str, str]]:
    """(model, dtype, format) of every check: each family in f32 and bf16, each format in f32."""
    return [(m, d, "none") for m in families for d in ("f32", "bf16")] + [(m, "f32", f) for m, f in formats]


def check(model: str, dtype: str, quantize: str = "none", seed: int = 0, steps: int = STEPS) -> dict:
    """One check (the module's docstring); a kernel that does not compile or run is a row that did not hold."""
    cfg = get_config(model)
    bf16 = dtype == "bf16"
    prompts, steps = (BF16_PROMPTS, BF16_STEPS) if bf16 else (PROMPTS, steps)
    row = dict(model=cfg.name, family=cfg.family, dtype=dtype, quantize=quantize, users=len(prompts), steps=steps)
    interpret = not on_tpu()
    t = time.perf_counter()
    try:
        if interpret:
            reset_interpreter()
        if bf16:
            rows = _bf16_check(cfg, list(prompts), steps, seed, interpret, row)
        else:
            rows = _f32_check(cfg, list(prompts), steps, seed, interpret, quantize, row)
        row["races"] = bool(rows["races"].any()) if interpret else None
        row["held"] = row["held"] and not row["races"]
        row["error"] = ""
    except Exception as e:  # a kernel that does not compile or run here: the check fails, the run goes on
        text = str(e).strip().splitlines()
        row.update(held=False, races=None, error=f"{type(e).__name__}: {text[0] if text else ''}"[:300])
        row.update(dict.fromkeys(_MEASURED + ("criterion",)))
    row["check_s"] = round(time.perf_counter() - t, 2)
    return {k: row.get(k) for k in COLUMNS}


def _f32_check(cfg, prompts, steps, seed, interpret, quantize, row):
    """Both engines at HIGHEST: the same tokens, logits within F32_LOGIT_ATOL. Fills ``row``; returns the steps."""
    with jax.default_matmul_precision("highest"):
        rows = compare_with_reference(
            cfg, len(prompts), steps, prompt_len=prompts, max_len=32, seed=seed, detect_races=interpret,
            quantize=quantize,
        )  # fmt: skip
    worst, same = float(rows["max_logit_diff"].max()), bool(rows["same_tokens"].all())
    row.update(same_tokens=same, max_logit_diff=worst)
    row["criterion"] = f"same tokens, logits within {F32_LOGIT_ATOL:g} (both at HIGHEST)"
    row["held"] = same and worst <= F32_LOGIT_ATOL
    return rows


def _bf16_check(cfg, prompts, steps, seed, interpret, row):
    """Teacher-forced bf16 against the rounding references (the module's docstring); a routed family's logits bound
    is taken a second time with the router knocked out in both engines. Fills ``row``; returns the steps."""
    import jax.numpy as jnp

    def compare(knockout=frozenset()):
        return compare_with_reference(
            cfg, len(prompts), steps, knockout, prompt_len=prompts, max_len=64, seed=seed, detect_races=interpret,
            dtype=jnp.bfloat16, teacher_forced=True,
        )  # fmt: skip

    rows = compare()
    ref = np.array(rows["tokens_reference"].tolist())

    def kept(column):
        return float((np.array(rows[column].tolist()) == ref).mean())

    worst, like = float(rows["max_logit_diff"].max()), float(rows["kernel_rounding_logit_diff"].max())
    row.update(same_tokens=bool(rows["same_tokens"].all()), max_logit_diff=worst, kernel_rounding_logit_diff=like)
    row.update(rounding_logit_diff=float(rows["rounding_logit_diff"].max()), picks_kept=kept("tokens_megakernel"))
    row.update(rounding_picks_kept=kept("tokens_rounding"), kernel_rounding_picks_kept=kept("tokens_kernel_rounding"))
    picks_held = row["picks_kept"] >= row["kernel_rounding_picks_kept"] - BF16_PICKS_MARGIN
    picks = f"picks kept within {BF16_PICKS_MARGIN:g} of its"
    if not cfg.is_moe:
        row["criterion"] = f"teacher-forced: logits within {BF16_FACTOR:g}x those of {_KERNEL_LIKE}, {picks}"
        row["held"] = worst <= BF16_FACTOR * like and picks_held
        return rows
    fixed = compare(frozenset({ROUTER}))
    worst, like = float(fixed["max_logit_diff"].max()), float(fixed["kernel_rounding_logit_diff"].max())
    row.update(fixed_routing_logit_diff=worst, fixed_routing_kernel_rounding_logit_diff=like)
    row["criterion"] = (
        f"teacher-forced: routing fixed (router knocked out in both), logits within {BF16_FACTOR:g}x those of "
        f"{_KERNEL_LIKE}; routed, {picks}"
    )
    row["held"] = worst <= BF16_FACTOR * like and picks_held
    return fixed  # its races column: since the interpreter's reset, so both runs'


def run_checks(chosen=None, seed: int = 0, quiet: bool = False, on_row=None) -> list[dict]:
    """Every check of ``chosen`` (default :func:`checks`) in turn, a line each; ``on_row(row)`` after each."""
    log, rows = Log(quiet), []
    for model, dtype, quantize in checks() if chosen is None else chosen:
        row = check(model, dtype, quantize, seed)
        rows.append(row)
        if on_row is not None:
            on_row(row)
        diff = "" if row["max_logit_diff"] is None else f", max logit diff {row['max_logit_diff']:.3g}"
        if row["kernel_rounding_logit_diff"] is not None:
            diff += f" (a reference rounding as the kernel does: {row['kernel_rounding_logit_diff']:.3g})"
        if row["fixed_routing_logit_diff"] is not None:
            diff += (f"; routing fixed {row['fixed_routing_logit_diff']:.3g} "
                     f"({row['fixed_routing_kernel_rounding_logit_diff']:.3g})")  # fmt: skip
        what = f"{model} {dtype}" + ("" if quantize == "none" else f" {quantize}")
        log(f"parity {what}: {'held' if row['held'] else 'FAILED ' + (row['error'] or '')}{diff}, {row['check_s']} s")
    return rows


def parity_table(rows: list[dict]):
    import pandas as pd

    return pd.DataFrame(rows, columns=COLUMNS)
