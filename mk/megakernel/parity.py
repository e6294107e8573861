"""The megakernel against the reference: both decode greedily from the same prefilled cache, each
feeding back its own tokens, so equal token streams mean equal greedy generation."""

from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np
import pandas as pd

from .. import reference as R
from ..plan import Tiles
from ..tpu import races_detected
from ..weights import random_params
from .kernel import make_step


def compare_with_reference(cfg, batch: int, steps: int, knockout=frozenset(), prompt_len: int = 12,
                           max_len: int = 32, seed: int = 0, detect_races: bool = True,
                           tiles: Tiles = Tiles()) -> pd.DataFrame:
    """One row per step: position, max |logit difference|, max |cache difference|, both engines' tokens,
    the megakernel step's wall time (interpret mode off a TPU), and whether the race detector fired."""
    params = random_params(cfg, seed)
    prompt = np.random.RandomState(seed + 1).randint(0, cfg.vocab_size, (batch, prompt_len)).astype(np.int32)
    cache = R.init_cache(cfg, batch, max_len)
    logits, cache = R.prefill(params, cfg, prompt, cache)
    mk_cache = {k: v + 0 for k, v in cache.items()}
    engine = make_step(cfg, tiles, detect_races=detect_races)
    tok_ref = tok_mk = jnp.argmax(logits, -1).astype(jnp.int32)
    rows = []
    for n in range(steps):
        pos = prompt_len + n
        l_ref, cache = R.decode_step(params, cfg, cache, tok_ref, pos, knockout)
        t0 = time.perf_counter()
        l_mk, mk_cache = engine(params, cfg, mk_cache, tok_mk, pos, knockout)
        l_mk.block_until_ready()
        dt = time.perf_counter() - t0
        tok_ref, tok_mk = jnp.argmax(l_ref, -1).astype(jnp.int32), jnp.argmax(l_mk, -1).astype(jnp.int32)
        rows.append(dict(
            step=n, position=pos, max_logit_diff=float(jnp.max(jnp.abs(l_ref - l_mk))),
            max_cache_diff=max(float(jnp.max(jnp.abs(cache[k] - mk_cache[k]))) for k in cache),
            tokens_reference=np.asarray(tok_ref).tolist(), tokens_megakernel=np.asarray(tok_mk).tolist(),
            same_tokens=bool(jnp.all(tok_ref == tok_mk)), step_s=dt, races=races_detected()))
    return pd.DataFrame(rows)


def kernels_per_step_on_tpu(cfg, chip: str, batch: int, max_len: int, dtype=jnp.bfloat16) -> pd.DataFrame:
    """Kernels one decode step launches on ``chip``, counted by mk.profiling in the TPU program that
    libtpu compiles ahead of time: the reference (plain JAX through XLA) against the megakernel."""
    from functools import partial

    import jax

    from ..params import param_specs
    from ..profiling import count_kernels
    from ..reference import _decode_step
    from ..tpu import aot_compile
    from .kernel import compile_for_tpu

    # The reference step runs on its prepared (decode) layout, as decode_step does.
    param_shapes = jax.eval_shape(partial(R.prepare, cfg=cfg),
                                  {s.path: jax.ShapeDtypeStruct(s.shape, dtype) for s in param_specs(cfg)})
    cache_shapes = jax.eval_shape(partial(R.init_cache, cfg, batch, max_len, dtype))
    ref = aot_compile(lambda p, c, t, pos: _decode_step(p, cfg, c, t, pos, frozenset()), chip, param_shapes,
                      cache_shapes, jax.ShapeDtypeStruct((batch,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32),
                      donate_argnums=(1,))
    _, mk = compile_for_tpu(cfg, chip, batch, max_len, dtype, dtype)
    rows = []
    for engine, compiled in (("reference (XLA)", ref), ("megakernel", mk)):
        kc = count_kernels(compiled.as_text())
        rows.append(dict(engine=engine, chip=chip, kernels=kc.total, **{f"by_{k}": v for k, v in kc.by_opcode.items()}))
    return pd.DataFrame(rows).fillna(0)
