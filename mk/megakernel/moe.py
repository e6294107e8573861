"""Routing and expert combination inside the kernel.

``lax.top_k`` and sort have no Mosaic lowering, so top-k is k rounds of max + lowest index among
the maxima (the tie-break ``lax.top_k`` uses) + mask. The chosen ids go VMEM -> SMEM by DMA so
the expert DMAs can address the HBM expert tensors with them as scalars; each routed slot (user b,
rank r) whose expert an earlier slot already fetched is skipped, so each selected expert is read
once and applied to every user with that user's weight (zero for users that did not pick it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from .attention import NEG


def gelu_tanh(x):
    """jax.nn.gelu(approximate=True), written out (same operation order)."""
    return x * (0.5 * (1.0 + jnp.tanh(jnp.sqrt(2.0 / jnp.pi).astype(x.dtype) * (x + 0.044715 * (x * x * x)))))


def route(k_, cfg, i, router_on):
    """Top-k routing of every row: the combine weights [rows, E_pad] into ``k_.gates`` and the ids
    [rows, k] into SMEM (``k_.ids_smem``)."""
    E, K = cfg.num_experts, cfg.top_k
    rows, ep = k_.gates.shape
    lane = jax.lax.broadcasted_iota(jnp.int32, (rows, ep), 1)
    id_lane = jax.lax.broadcasted_iota(jnp.int32, k_.ids_vmem.shape, 1)
    ids = jnp.zeros(k_.ids_vmem.shape, jnp.int32)
    gates = jnp.zeros((rows, ep), jnp.float32)
    if not router_on:  # the reference's knock-out: experts 0..k-1, weight 1/k each
        for r in range(K):
            ids = jnp.where(id_lane == r, r, ids)
        gates = jnp.where(lane < K, 1.0 / K, 0.0).astype(jnp.float32)
    else:
        logits = jnp.where(lane < E, k_.act["router"][...], NEG)
        p = jnp.exp(logits - jnp.max(logits, axis=1, keepdims=True))
        p = p / jnp.sum(p, axis=1, keepdims=True)
        picked = []
        for r in range(K):
            m = jnp.max(p, axis=1, keepdims=True)
            idx = jnp.min(jnp.where(p == m, lane, ep), axis=1, keepdims=True)
            picked.append((m, idx))
            ids = jnp.where(id_lane == r, idx, ids)
            p = jnp.where(lane == idx, -1.0, p)
        total = picked[0][0]
        for m, _ in picked[1:]:
            total = total + m
        scale = k_.vec(f"layers.{i}.expert_scale", ep)
        for m, idx in picked:
            hit = lane == idx
            w = m / total * jnp.sum(jnp.where(hit, scale, 0.0), axis=1, keepdims=True)
            gates = jnp.where(hit, w, gates)
    k_.gates[...] = gates
    k_.ids_vmem[...] = ids
    c = pltpu.make_async_copy(k_.ids_vmem, k_.ids_smem, k_.ids_sem.at[0])
    c.start()
    c.wait()
    k_.act["moe"][...] = jnp.zeros(k_.act["moe"].shape, jnp.float32)


REPEAT_FLAGS = 64  # column of ids_smem where routed slot j's "holds a new expert" flag starts


def mark_repeats(k_, batch, top_k):
    """Flag in SMEM, for every routed slot j = b * k + r, whether it holds an expert no earlier slot
    holds (a repeat was fetched and applied already): loops over slots read the flag by index."""
    assert top_k <= REPEAT_FLAGS
    ids = [k_.ids_smem[b, r] for b in range(batch) for r in range(top_k)]
    for j, e in enumerate(ids):
        new = jnp.bool_(True)
        for e2 in ids[:j]:
            new = jnp.logical_and(new, e != e2)
        k_.ids_smem[j // top_k, REPEAT_FLAGS + j % top_k] = new.astype(jnp.int32)


def combine(k_, e):
    """moe += gate[:, e] * (expert e's output)."""
    g = k_.gates[...]
    lane = jax.lax.broadcasted_iota(jnp.int32, g.shape, 1)
    w = jnp.sum(jnp.where(lane == e, g, 0.0), axis=1, keepdims=True)
    k_.act["moe"][...] += w * k_.act["eo"][...]
