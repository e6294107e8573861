"""The megakernel against the reference: both decode greedily from the same prefilled cache, each
feeding back its own tokens (the kernel's own greedy pick), so equal token streams mean equal greedy
generation; users may have prompts of different lengths."""

from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from .. import reference as R
from ..params import param_specs
from ..plan import BLOCK, Tiles
from ..profiling import count_kernels
from ..quant import quantized_as
from ..reference import decode_step_program
from ..tpu import aot_compile, races_detected
from ..weights import random_params
from .aot import compile_for_tpu
from .engine import make_step
from .refs import TOKEN


def _weights(cfg, seed: int, dtype, quantize: str) -> tuple[dict, dict]:
    """(the reference's f32 weights, the kernel's: rounded to ``dtype``, or the same quantized tree)."""
    params = random_params(cfg, seed)
    if quantize == "none":
        return params, {k: v.astype(dtype) for k, v in params.items()}
    if jnp.dtype(dtype) != jnp.float32:
        raise ValueError(f"quantize={quantize!r}: compare a quantized tree in f32 (its codes are the rounding)")
    params = quantized_as(params, cfg, quantize)
    return params, params


def _round_cache(cache: dict, dtype) -> dict:
    return {k: v.astype(dtype).astype(jnp.float32) for k, v in cache.items()}


class _RoundingReferences:
    """The f32 reference run on the kernel's rounded weights, its cache rounded to ``dtype`` after every step
    (``rounding``), and the same with every weight product's activations rounded to ``dtype`` too
    (``kernel_rounding``: it rounds where the kernel does)."""

    def __init__(self, cfg, mk_params: dict, cache: dict, dtype):
        self.cfg, self.dtype = cfg, dtype
        self.params = {k: v.astype(jnp.float32) for k, v in mk_params.items()}
        self.caches = {"rounding": _round_cache(cache, dtype), "kernel_rounding": _round_cache(cache, dtype)}

    def step(self, tokens, pos, knockout) -> dict:
        """Each reference's logits for ``tokens`` at ``pos``, by name."""
        logits = {}
        with jax.default_matmul_precision("highest"):
            for name, activations in (("rounding", None), ("kernel_rounding", jnp.dtype(self.dtype).name)):
                logits[name], cache = R.decode_step(
                    self.params, self.cfg, self.caches[name], tokens, pos, knockout, activation_dtype=activations
                )
                self.caches[name] = _round_cache(cache, self.dtype)
        return logits


def _max_abs(x) -> float:
    return float(jnp.max(jnp.abs(x)))


def _row(step: int, pos, l_ref, cache, out, mk_as_reference, rounding: dict | None, batch: int, seconds: float) -> dict:
    """One step of the comparison (:func:`compare_with_reference`'s columns)."""
    tok_ref, tok_mk = jnp.argmax(l_ref, -1).astype(jnp.int32), out.users[:batch, TOKEN]
    as_f32 = {k: v.astype(jnp.float32) for k, v in cache.items()}
    row = dict(
        max_logit=_max_abs(l_ref),
        step=step,
        positions=np.asarray(pos).tolist(),
        max_logit_diff=_max_abs(l_ref - out.logits),
        max_cache_diff=max(_max_abs(as_f32[k] - mk_as_reference[k].astype(jnp.float32)) for k in cache),
        max_cache=max(_max_abs(v) for v in as_f32.values()),
        tokens_reference=np.asarray(tok_ref).tolist(),
        tokens_megakernel=np.asarray(tok_mk).tolist(),
        same_tokens=bool(jnp.all(tok_ref == tok_mk)),
        kernel_pick_is_argmax=bool(jnp.all(tok_mk == jnp.argmax(out.logits, -1))),
    )
    for name in ("rounding", "kernel_rounding"):
        logits = None if rounding is None else rounding[name]
        row[f"{name}_logit_diff"] = np.nan if logits is None else _max_abs(logits - l_ref)
        row[f"tokens_{name}"] = None if logits is None else np.asarray(jnp.argmax(logits, -1)).tolist()
    return dict(row, expert_dmas=int(out.dma_counts[0, 0]), step_s=seconds, races=races_detected())


def compare_with_reference(
    cfg,
    batch: int,
    steps: int,
    knockout=frozenset(),
    prompt_len=12,
    max_len: int = 32,
    seed: int = 0,
    detect_races: bool = True,
    tiles: Tiles = Tiles(),
    dtype=jnp.float32,
    teacher_forced: bool = False,
    quantize: str = "none",
) -> pd.DataFrame:
    """One row per step: each user's position, max |logit difference|, max |cache difference| (and the
    reference cache's largest |value|, its scale), both
    engines' tokens, whether the kernel's own greedy pick is the argmax of its logits, the expert
    weight DMAs the kernel issued, the megakernel step's wall time (interpret mode off a TPU), and
    whether the race detector fired. ``prompt_len``: one length for every user, or one per user.

    The reference runs in float32. ``dtype``: the kernel's weights and KV cache (the reference's,
    rounded to it; the kernel computes in f32 from them). ``teacher_forced``: the kernel is fed the
    reference's tokens rather than its own, so each step compares the same inputs (for a lower precision,
    whose greedy stream may leave the reference's at a near-tie). For a ``dtype`` other than float32,
    ``rounding_logit_diff`` and ``tokens_rounding`` give what the rounding alone costs: the float32
    reference against itself run on the rounded weights, its cache rounded to ``dtype`` after every
    step, fed the same tokens; ``kernel_rounding_logit_diff`` and ``tokens_kernel_rounding`` the same reference with
    every weight product's activations rounded to ``dtype`` too (mk.reference.decode_step's ``activation_dtype``):
    it rounds where the kernel does, so a routing near-tie that rounding flips flips there too.

    Where the kernel rounds, beyond the weights and cache: the embedding row times sqrt(H) is rounded
    to the weight dtype (as the reference does), and every matmul's activations are rounded to the
    weight dtype before the MXU pass (bf16 x bf16, f32 accumulation), and so are attention's query and probabilities
    before their products with the cache (mk.megakernel.mxu); norms, softmax, RoPE and the residual stream stay f32.
    Every reference runs its products at ``HIGHEST``, whatever the machine: the f32 one rounds nothing, the rounding
    ones round only where they say (on a TPU XLA's default would take one bf16 pass for every product, rounding
    operands the kernel keeps f32, such as the routed experts' combine weights).

    ``quantize``: the weights as that mk.quant scheme or shipped format (f32 only): the kernel streams their codes and
    scales, the reference dequantizes the same tree once."""
    params, mk_params = _weights(cfg, seed, dtype, quantize)
    lengths = np.broadcast_to(np.asarray(prompt_len, np.int32), (batch,)).copy()
    prompt = np.random.RandomState(seed + 1).randint(0, cfg.vocab_size, (batch, int(lengths.max()))).astype(np.int32)
    cache = R.init_cache(cfg, batch, max_len, multiple=BLOCK)
    with jax.default_matmul_precision("highest"):
        logits, cache = R.prefill(params, cfg, prompt, cache, lengths)
    engine = make_step(cfg, tiles=tiles, detect_races=detect_races)
    mk_cache = engine.adopt_cache({k: v.astype(dtype) for k, v in cache.items()})
    rounding = _RoundingReferences(cfg, mk_params, cache, dtype) if jnp.dtype(dtype) != jnp.float32 else None
    tok_ref = tok_mk = jnp.argmax(logits, -1).astype(jnp.int32)
    pos = jnp.asarray(lengths)
    rows = []
    for n in range(steps):
        with jax.default_matmul_precision("highest"):
            l_ref, cache = R.decode_step(params, cfg, cache, tok_ref, pos, knockout)
        tok_in = tok_ref if teacher_forced else tok_mk  # what the kernel, and the rounding references, are fed
        t0 = time.perf_counter()
        out = engine.run(mk_params, cfg, mk_cache, tok_in, pos, knockout, with_logits=True, count_dmas=True)
        out.logits.block_until_ready()
        seconds = time.perf_counter() - t0
        mk_cache = out.cache
        rounded = None if rounding is None else rounding.step(tok_in, pos, knockout)
        rows.append(_row(n, pos, l_ref, cache, out, engine.reference_cache(mk_cache), rounded, batch, seconds))
        tok_ref, tok_mk = jnp.argmax(l_ref, -1).astype(jnp.int32), out.users[:batch, TOKEN]
        pos = pos + 1
    return pd.DataFrame(rows)


def reference_on_tpu(cfg, chip: str, batch: int, max_len: int, dtype=jnp.bfloat16):
    """The reference's decode step (plain JAX through XLA, on :func:`mk.reference.prepare`'s layout) compiled ahead of
    time for one device of ``chip`` (libtpu, no TPU needed)."""
    shapes = {s.path: jax.ShapeDtypeStruct(s.shape, dtype) for s in param_specs(cfg)}
    param_shapes = jax.eval_shape(partial(R.prepare, cfg=cfg, experts=R.expert_layout("tpu")), shapes)
    cache_shapes = jax.eval_shape(partial(R.init_cache, cfg, batch, max_len, dtype))
    return aot_compile(
        lambda p, c, t, pos: decode_step_program(p, cfg, c, t, pos, frozenset()),
        chip,
        param_shapes,
        cache_shapes,
        jax.ShapeDtypeStruct((batch,), jnp.int32),
        jax.ShapeDtypeStruct((batch,), jnp.int32),
        donate_argnums=(1,),
    )


def kernels_per_step_on_tpu(cfg, chip: str, batch: int, max_len: int, dtype=jnp.bfloat16) -> pd.DataFrame:
    """Kernels one decode step launches on ``chip``, counted by mk.profiling in the TPU program that
    libtpu compiles ahead of time: the reference (plain JAX through XLA) against the megakernel."""
    ref = reference_on_tpu(cfg, chip, batch, max_len, dtype)
    arrays = jnp.dtype(dtype).name
    _, mk = compile_for_tpu(cfg, chip, batch, max_len, weight_dtype=arrays, kv_dtype=arrays)
    rows = []
    for engine, compiled in (("reference (XLA)", ref), ("megakernel", mk)):
        kc = count_kernels(compiled.as_text())
        rows.append(dict(engine=engine, chip=chip, kernels=kc.total, **{f"by_{k}": v for k, v in kc.by_opcode.items()}))
    table = pd.DataFrame(rows).fillna(0)
    counts = [c for c in table.columns if c == "kernels" or c.startswith("by_")]
    return table.astype({c: int for c in counts})  # counts, whole (an opcode one program lacks: 0)
