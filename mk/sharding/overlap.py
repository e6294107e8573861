"""The eight-chip kernel run on a TPU slice, or over simulated chips in interpret mode."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..config import Gemma4Config

CHIPS = 8


def on_slice(chips: int = CHIPS) -> bool:
    """Whether this process runs on a TPU slice of at least ``chips`` chips."""
    import jax

    from ..tpu import on_tpu

    return on_tpu() and len(jax.devices()) >= chips


def bench_slice(cfg: Gemma4Config, context: int, batch: int, placements, budget_s: float = 30.0) -> pd.DataFrame:
    """Time the eight-chip kernel (random bf16 weights) under each expert placement with mk.bench.run_bench
    and append each row to the bench CSV (mk.bench.append_row: device, JAX version and date in the row).
    Only on a TPU slice: interpret-mode timings say nothing about a TPU and are never recorded."""
    from ..bench import append_row, run_bench

    if not on_slice(CHIPS):
        raise RuntimeError(f"bench_slice times the kernel on a TPU slice of {CHIPS} chips; this process has none")
    rows = []
    for placement in placements:
        r = run_bench(
            cfg,
            context,
            batch,
            "bf16",
            engine="megakernel",
            engine_options=dict(chips=CHIPS, placement=placement),
            budget_s=budget_s,
        )
        append_row(r.row())
        rows.append(r.row())
    return pd.DataFrame(rows)


def interpret_parity(cfg: Gemma4Config, prompts, new_tokens: int, placements, seed: int = 0) -> pd.DataFrame:
    """Greedy tokens of the eight-chip kernel (off a TPU: Pallas's TPU interpreter over the simulated
    chips of mk.sharding.simulate_chips) under each placement against the reference engine, random weights
    by ``seed``: one row per placement and user."""
    from ..generate import generate
    from ..weights import random_params

    params = random_params(cfg, seed)
    want = generate(params, cfg, prompts, new_tokens)
    rows = []
    for placement in placements:
        got = generate(
            params, cfg, prompts, new_tokens, engine="megakernel", engine_options=dict(chips=CHIPS, placement=placement)
        )
        for user, (g, w) in enumerate(zip(got, want)):
            rows.append(
                dict(
                    placement=placement,
                    user=user,
                    reference=w.tolist(),
                    megakernel=g.tolist(),
                    same_tokens=bool(np.array_equal(g, w)),
                )
            )
    return pd.DataFrame(rows)
