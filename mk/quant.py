"""INT8 weights: symmetric, one scale per output channel (and per expert), made from a BF16 or F32 tree.

A quantized matrix ``path`` ([..., in, out], as in mk.params) is stored as ``int8`` codes in ``params[path]``
and its scales as ``float32`` in ``params[scale_path(path)]``, one per output channel: shape
``[..., out]`` (``[out]`` for a layer's matrix, ``[E, out]`` for an expert tensor). Codes are
``round(w / s)`` clipped to [-127, 127] with ``s = max|w| / 127`` over the input axis (1 where a column is
all zeros), so a weight comes back as ``codes * s``.

Dequantizing is the same everywhere: ``(codes as float32) * scale``, then rounded to the compute dtype.
The reference dequantizes the whole tree that way (:func:`dequantize`) and the megakernel each weight tile
in VMEM the same way, so both multiply by identical weights and the kernel is held to the reference as
tightly as in BF16 or F32.

Schemes: ``int8-experts`` quantizes the routed experts only; ``int8`` every matrix but the embedding (the
tied head) and the vectors (norms, scales).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .config import Gemma4Config
from .params import EXPERTS, HEAD, param_specs

SCHEMES = ("none", "int8-experts", "int8")
SCALE_SUFFIX = "_qscale"
QMAX = 127


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization {scheme!r}; known: {', '.join(SCHEMES)}")
    return scheme


def scale_path(path: str) -> str:
    """Where a quantized matrix's per-output-channel scales live in the parameter tree."""
    return path + SCALE_SUFFIX


def quantized_paths(cfg: Gemma4Config, scheme: str) -> tuple[str, ...]:
    """The matrices ``scheme`` stores as INT8, in mk.params order."""
    check_scheme(scheme)
    if scheme == "none":
        return ()
    return tuple(
        s.path
        for s in param_specs(cfg)
        if s.matrix and s.component != HEAD and (scheme == "int8" or s.component == EXPERTS)
    )


def quantize_matrix(w) -> tuple[np.ndarray, np.ndarray]:
    """INT8 codes and per-output-channel float32 scales of ``w`` [..., in, out] (symmetric, round to nearest)."""
    w = np.asarray(w, np.float32)
    amax = np.max(np.abs(w), axis=-2)
    scale = np.where(amax > 0, amax / QMAX, 1.0).astype(np.float32)
    codes = np.clip(np.rint(w / scale[..., None, :]), -QMAX, QMAX).astype(np.int8)
    return codes, scale


def quantize(params: dict, cfg: Gemma4Config, scheme: str) -> dict:
    """``params`` with the matrices of ``scheme`` as INT8 codes plus their scales (a new dict; the others shared).
    Already-quantized input is refused: quantize the float tree."""
    out = dict(params)
    for path in quantized_paths(cfg, scheme):
        if jnp.asarray(params[path]).dtype == jnp.int8:
            raise ValueError(f"{path} is already INT8: quantize a BF16 or F32 parameter tree")
        codes, scale = quantize_matrix(params[path])
        out[path], out[scale_path(path)] = jnp.asarray(codes), jnp.asarray(scale)
    return out


def scheme_of(params: dict, cfg: Gemma4Config) -> str:
    """Which scheme a parameter tree is quantized with (``none`` for a float tree); a tree that matches no
    scheme (scales missing, or INT8 where no scheme puts it) is refused with what is wrong."""
    int8 = {s.path for s in param_specs(cfg) if s.path in params and jnp.asarray(params[s.path]).dtype == jnp.int8}
    for scheme in SCHEMES:
        if int8 == set(quantized_paths(cfg, scheme)):
            missing = [scale_path(p) for p in sorted(int8) if scale_path(p) not in params]
            if missing:
                raise ValueError(f"INT8 matrices without their scales: {', '.join(missing[:3])}")
            return scheme
    raise ValueError(
        f"the INT8 matrices ({len(int8)}) match no quantization scheme ({', '.join(SCHEMES[1:])}); "
        "quantize the float tree with mk.quant.quantize"
    )


def dequantize_matrix(codes, scale, dtype):
    """``codes * scale`` in float32, rounded to ``dtype``: what the kernel does to each INT8 weight tile."""
    return (jnp.asarray(codes).astype(jnp.float32) * jnp.asarray(scale)[..., None, :]).astype(dtype)


def dequantize(params: dict, cfg: Gemma4Config, dtype=None) -> dict:
    """The float tree the quantized one stands for (every INT8 matrix dequantized to ``dtype``, by default the
    embedding's, scales dropped): the weights the reference and the kernel both multiply by."""
    scheme = scheme_of(params, cfg)
    dtype = dtype or jnp.asarray(params["embed"]).dtype
    out = {k: v for k, v in params.items() if not k.endswith(SCALE_SUFFIX)}
    for path in quantized_paths(cfg, scheme):
        out[path] = dequantize_matrix(params[path], params[scale_path(path)], dtype)
    return out


def quantized_as(params: dict, cfg: Gemma4Config, scheme: str | None = None) -> dict:
    """``params`` under ``scheme``, as a loader hands them to the engines: a float tree is quantized with
    ``scheme`` (None: ``none``, left as it is); an already quantized tree (a quantized checkpoint) is used
    as it is when ``scheme`` is None or its own scheme, and refused otherwise (it cannot be re-quantized)."""
    have = scheme_of(params, cfg)
    if have != "none":
        if scheme not in (None, have):
            raise ValueError(
                f"the weights are already quantized as {have!r} (a quantized checkpoint is used as it is); "
                f"quantization {scheme!r} does not match: leave it out or ask for {have!r}"
            )
        return params
    scheme = check_scheme(scheme or "none")
    return params if scheme == "none" else quantize(params, cfg, scheme)


# Quality: the quantized reference against the float one -------------------------------------------
QUALITY_KIND = "measured (mk.quant.quality: the reference on the quantized tree against the float tree)"


def quality(params: dict, cfg: Gemma4Config, scheme: str, prompts, new_tokens: int = 32, cache_dtype=jnp.float32):
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
    import pandas as pd

    from .generate import generate, prompt_batch
    from .reference import decode_step, init_cache, prefill

    check_scheme(scheme)
    if scheme_of(params, cfg) != "none":
        raise ValueError("quality compares a quantized tree with the float tree it is made from: pass the float tree")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens <= 0:
        raise ValueError(f"new_tokens must be a positive integer, got {new_tokens!r}")
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


def quality_summary(table):
    """One row per (model, scheme, user) of a :func:`quality` table: ``agreement`` (the fraction of new tokens
    the free-running quantized model picks the same as the float one), ``first_divergence`` (the first step
    where they differ; missing when they never do), ``forced_agreement`` (the same fraction given the float
    model's prefix), and the logit error over the steps (its largest, and the mean of each step's mean)."""
    import pandas as pd

    rows = []
    for (model, scheme, user), g in table.groupby(["model", "scheme", "user"], sort=False):
        g = g.sort_values("step")
        differ = g.loc[~g.agree, "step"]
        rows.append(
            dict(
                model=model,
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
