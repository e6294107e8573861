"""The quality cost of INT8 weights: the reference on a quantized tree (mk.quant) against the float tree it
was made from, teacher-forced logit error and free-running greedy agreement."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pandas as pd

from ..config import ModelConfig
from ..generate import generate, prompt_batch
from ..params import check_scheme
from ..quant import quantize, scheme_of
from ..reference import decode_step, init_cache, prefill
from ..units import positive_int

QUALITY_KIND = "measured (mk.analysis.quality.quality: the reference on the quantized tree against the float tree)"


def quality(params: dict, cfg: ModelConfig, scheme: str, prompts, new_tokens: int = 32, cache_dtype=jnp.float32):
    """How far the reference moves when ``params`` (a float tree) is quantized with ``scheme``: one row per
    user and new token (``step`` 0 is the token prefill picks), as a DataFrame.

    Two measurements, both by the reference (mk.reference) with a ``cache_dtype`` KV cache:

    - **logit error, teacher-forced**: the quantized model is fed the float model's own greedy tokens, so at
      every step both see the same prefix and one early divergence does not make every later step differ;
      ``max_abs_logit_error`` and ``mean_abs_logit_error`` are over the vocabulary at that step, and
      ``forced_token`` is the quantized model's pick given that prefix (``forced_agree``).
    - **greedy agreement, free-running**: the quantized model decodes its own tokens (``quantized_token``)
      beside the float model's (``reference_token``); ``agree`` says whether they are the same token at
      that step (after a divergence the prefixes differ, so later steps mostly disagree).

    ``reference_margin`` is the float model's gap between its best and second-best logit at that step: an
    error larger than it can flip the pick. ``prompts`` as :func:`mk.generate.generate` takes them (a
    ``[B, T]`` array or per-user lists). :func:`quality_summary` gives one row per user. Nothing is asserted.
    """
    check_scheme(scheme)
    if scheme_of(params, cfg) != "none":
        raise ValueError("quality compares a quantized tree with the float tree it is made from: pass the float tree")
    positive_int("new_tokens", new_tokens)
    tokens, lengths = prompt_batch(cfg, prompts)
    ref_tokens, ref_logits = generate(params, cfg, prompts, new_tokens, return_logits=True, cache_dtype=cache_dtype)
    q = quantize(params, cfg, scheme)
    free = generate(q, cfg, prompts, new_tokens, cache_dtype=cache_dtype)
    # Teacher-forced: the prompt, then the float model's tokens, through the quantized model.
    B = tokens.shape[0]
    cache = init_cache(cfg, B, int(lengths.max()) + new_tokens - 1, cache_dtype)
    logits, cache = prefill(q, cfg, tokens, cache, lengths)
    forced = [np.asarray(logits)]
    pos = jnp.asarray(lengths, jnp.int32)
    for n in range(1, new_tokens):
        logits, cache = decode_step(q, cfg, cache, jnp.asarray(ref_tokens[:, n - 1]), pos + n - 1)
        forced.append(np.asarray(logits))
    forced = np.stack(forced, axis=1)  # [B, new_tokens, V]
    err = np.abs(forced - ref_logits)
    top2 = np.sort(ref_logits, axis=-1)[..., -2:]
    rows = []
    for b in range(B):
        for n in range(new_tokens):
            rows.append(
                dict(
                    model=cfg.name,
                    scheme=scheme,
                    user=b,
                    prompt_len=int(lengths[b]),
                    step=n,
                    max_abs_logit_error=float(err[b, n].max()),
                    mean_abs_logit_error=float(err[b, n].mean()),
                    reference_margin=float(top2[b, n, 1] - top2[b, n, 0]),
                    reference_token=int(ref_tokens[b, n]),
                    forced_token=int(forced[b, n].argmax()),
                    forced_agree=bool(forced[b, n].argmax() == ref_tokens[b, n]),
                    quantized_token=int(free[b, n]),
                    agree=bool(free[b, n] == ref_tokens[b, n]),
                    kind=QUALITY_KIND,
                )
            )
    return pd.DataFrame(rows)


RANDOM_WEIGHTS = "random: the mechanism, not a trained model's quality"  # a summary row's ``weights``


def quality_summary(table, random_models=frozenset()):
    """One row per (model, scheme, user) of a :func:`quality` table: ``agreement`` (the fraction of new tokens
    the free-running quantized model picks the same as the float one), ``first_divergence`` (the first step
    where they differ; missing when they never do), ``forced_agreement`` (the same fraction given the float
    model's prefix), and the logit error over the steps (its largest, and the mean of each step's mean). ``weights``
    says which rows are models of ``random_models`` (random weights: their flat logits measure the mechanism, not a
    trained model's quality) and which a checkpoint's."""
    rows = []
    for (model, scheme, user), g in table.groupby(["model", "scheme", "user"], sort=False):
        g = g.sort_values("step")
        differ = g.loc[~g.agree, "step"]
        rows.append(
            dict(
                model=model,
                weights=RANDOM_WEIGHTS if model in random_models else "a checkpoint",
                scheme=scheme,
                user=user,
                new_tokens=len(g),
                agreement=float(g.agree.mean()),
                first_divergence=int(differ.iloc[0]) if len(differ) else None,
                forced_agreement=float(g.forced_agree.mean()),
                max_abs_logit_error=float(g.max_abs_logit_error.max()),
                mean_abs_logit_error=float(g.mean_abs_logit_error.mean()),
                kind=QUALITY_KIND,
            )
        )
    out = pd.DataFrame(rows)
    out["first_divergence"] = out["first_divergence"].astype("Int64")
    return out
