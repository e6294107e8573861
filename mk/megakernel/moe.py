"""Routing and the routed experts inside the kernel.

``lax.top_k`` and sort have no Mosaic lowering, so top-k is k rounds of max + lowest index among the
maxima (the tie-break ``lax.top_k`` uses) + mask. The experts any user routed to are flagged in a
vector, which goes VMEM -> SMEM by DMA; a scalar loop over the experts gathers the distinct ones into
a list in SMEM, in expert order, with their count. Expert slot j then runs (its DMAs and matmuls) only
when more than j distinct experts were routed, so each routed expert is read once and applied to every
user with that user's weight (zero for users that did not pick it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from .dense import NEG

COUNT = 1  # row of Scratch.experts whose lane 0 holds how many distinct experts were routed


def gelu_tanh(x):
    """jax.nn.gelu(approximate=True), written out (same operation order)."""
    return x * (0.5 * (1.0 + jnp.tanh(jnp.sqrt(2.0 / jnp.pi).astype(x.dtype) * (x + 0.044715 * (x * x * x)))))


def emit_route(k, op):
    """Top-k routing of every user: the combine weights [rows, E_pad] into ``gates``; the distinct
    routed experts into SMEM (``experts``: row 0 the ids, [COUNT, 0] how many)."""
    cfg, s, B = k.cfg, k.scratch, k.plan.batch
    E, K = cfg.num_experts, cfg.top_k
    rows, ep = s.gates.shape
    lane = jax.lax.broadcasted_iota(jnp.int32, (rows, ep), 1)
    if not op.router_on:  # the reference's knock-out: experts 0..k-1, weight 1/k each
        gates = jnp.where(lane < K, 1.0 / K, 0.0).astype(jnp.float32)
        picked = lane < K
    else:
        logits = jnp.where(lane < E, s.acts["router"][...], NEG)
        p = jnp.exp(logits - jnp.max(logits, axis=1, keepdims=True))
        p = p / jnp.sum(p, axis=1, keepdims=True)
        chosen = []
        for _ in range(K):
            m = jnp.max(p, axis=1, keepdims=True)
            idx = jnp.min(jnp.where(p == m, lane, ep), axis=1, keepdims=True)
            chosen.append((m, idx))
            p = jnp.where(lane == idx, -1.0, p)
        total = chosen[0][0]
        for m, _ in chosen[1:]:
            total = total + m
        gemma = cfg.router == "gemma4"  # its per-expert scale; softmax_topk renormalises only if norm_topk
        scale = k.layer_vec(op.layer, "expert_scale", ep) if gemma else None
        gates = jnp.zeros((rows, ep), jnp.float32)
        picked = jnp.zeros((rows, ep), jnp.bool_)
        for m, idx in chosen:
            hit = lane == idx
            w = m / total if cfg.norm_topk else m
            if gemma:
                w = w * jnp.sum(jnp.where(hit, scale, 0.0), axis=1, keepdims=True)
            gates = jnp.where(hit, w, gates)
            picked = picked | hit
    s.gates[...] = gates
    user = jax.lax.broadcasted_iota(jnp.int32, (rows, ep), 0) < B  # padding rows route too: ignore them
    used = jnp.max(jnp.where(picked & user, 1, 0), axis=0, keepdims=True)  # [1, ep]
    s.used[...] = jnp.broadcast_to(used, s.used.shape)
    c = pltpu.make_async_copy(s.used, s.used_smem, s.route_sem.at[0])
    c.start()
    c.wait()

    def gather(e, n):  # over this chip's experts (all E unless they are placed whole over chips)
        s.experts[0, n] = e  # overwritten by the next expert unless this one is used
        return n + s.used_smem[0, k.expert_base + e]

    s.experts[COUNT, 0] = jax.lax.fori_loop(0, k.plan.experts_held, gather, jnp.int32(0))
    s.acts["moe"][...] = jnp.zeros(s.acts["moe"].shape, jnp.float32)


def emit_gated_act(k, op):
    a = k.scratch.acts
    act = gelu_tanh if k.cfg.activation == "gelu_tanh" else jax.nn.silu
    a[op.dst][:, : op.n] = act(a[op.src][:, : op.n]) * a[op.dst][:, : op.n]


def emit_expert_combine(k, op):
    """moe += gate[:, e] * (expert e's output), e the expert in slot ``op.expert``."""
    s = k.scratch
    e = k.expert_base + k.expert_id(op.expert)
    g = s.gates[...]
    lane = jax.lax.broadcasted_iota(jnp.int32, g.shape, 1)
    w = jnp.sum(jnp.where(lane == e, g, 0.0), axis=1, keepdims=True)
    s.acts["moe"][...] += w * s.acts["eo"][...]
