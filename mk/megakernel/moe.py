"""Routing and the routed experts inside the kernel (Gemma 4's router, softmax-then-top-k, and gpt-oss's biased
top-k-then-softmax; gpt-oss's expert biases and its clamped SwiGLU).

An expert's biases are a row of each bias tensor, read as the aligned block of 8 rows around it. Read where they are
used, each chunk's read is a serial DMA queued behind the weight copies in flight; read ahead
(mk.plan.Tiles.expert_bias_ahead), a routed slot's rows start as soon as the route has listed its expert and land
in a ring of VMEM places while the weight stream runs.

``lax.top_k`` and sort have no Mosaic lowering, so top-k is k rounds of max + lowest index among the
maxima (the tie-break ``lax.top_k`` uses) + mask. The experts any user routed to are flagged in a
vector and listed, distinct and in expert order, with their count, by vector work alone (how many are flagged
up to each expert from one small matmul), then go VMEM -> SMEM by one DMA. Expert slot j then runs
(its DMAs and matmuls) only when more than j distinct experts were routed, so each routed expert is read once
and applied to every user with that user's weight (zero for users that did not pick it).

Kernel revision 1 gathered the list by a scalar loop over the chip's experts, reading the flags from SMEM: with
128 experts that loop was most of what libtpu schedules for a route, and the route sits on the chain of work
between two layers' expert streams, where the weight stream waits for it (data/kernel_revisions.csv; notebook 11
shows the bundles each revision issues).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..plan import LANE, ROWS
from ..plan.layout import EXPERT_BIASES
from . import mxu
from .dense import NEG
from .repeats import when

COUNT = 1  # row of Scratch.experts whose lane 0 holds how many distinct experts were routed


def gelu_tanh(x):
    """jax.nn.gelu(approximate=True), written out (same operation order)."""
    return x * (0.5 * (1.0 + jnp.tanh(jnp.sqrt(2.0 / jnp.pi).astype(x.dtype) * (x + 0.044715 * (x * x * x)))))


def emit_route(k, op):
    """Top-k routing of every user: the combine weights [rows, E_pad] into ``gates``; the distinct
    routed experts into SMEM (``experts``: row 0 the ids, [COUNT, 0] how many)."""
    layout, s, B = k.layout, k.scratch, k.plan.batch
    E, K = layout.num_experts, layout.top_k
    rows, ep = s.gates.shape
    lane = jax.lax.broadcasted_iota(jnp.int32, (rows, ep), 1)
    if not op.router_on:  # the reference's knock-out: experts 0..k-1, weight 1/k each
        gates = jnp.where(lane < K, 1.0 / K, 0.0).astype(jnp.float32)
        picked = lane < K
    elif layout.router == "topk_softmax":
        gates, picked = _topk_softmax(k, op, lane, E, K)
    elif layout.router == "sigmoid_grouped":
        gates, picked = _sigmoid_grouped(k, op, lane, E, K)
    else:
        logits = jnp.where(lane < E, s.acts["router"][...], NEG)
        p = jnp.exp(logits - jnp.max(logits, axis=1, keepdims=True))
        p = p / jnp.sum(p, axis=1, keepdims=True)
        chosen = []
        for _ in range(K):
            m, idx = _top(p, lane, ep)
            chosen.append((m, idx))
            p = jnp.where(lane == idx, -1.0, p)
        total = chosen[0][0]
        for m, _ in chosen[1:]:
            total = total + m
        gemma = layout.router == "gemma4"  # its per-expert scale; softmax_topk renormalises only if norm_topk
        scale = k.layer_vec(op.layer, "expert_scale", ep) if gemma else None
        gates = jnp.zeros((rows, ep), jnp.float32)
        picked = jnp.zeros((rows, ep), jnp.bool_)
        for m, idx in chosen:
            hit = lane == idx
            w = m / total if layout.norm_topk else m
            if gemma:
                w = w * jnp.sum(jnp.where(hit, scale, 0.0), axis=1, keepdims=True)
            gates = jnp.where(hit, w, gates)
            picked = picked | hit
    s.gates[...] = gates
    if not k.plan.route_known:  # else the experts 0..k-1, known before the step: no table (kernel.expert_id)
        user = jax.lax.broadcasted_iota(jnp.int32, (rows, ep), 0) < B  # padding rows route too: ignore them
        used = jnp.max(jnp.where(picked & user, 1, 0), axis=0, keepdims=True)  # [1, ep]
        s.expert_table[...] = expert_table(used, k.expert_base, k.plan.experts_held, s.expert_table.shape)
        c = pltpu.make_async_copy(s.expert_table, s.experts, s.route_sem.at[0])
        c.start()
        c.wait()
    for j in range(k.plan.expert_bias_ring):  # the first slots' biases, read ahead
        k.guarded(j, partial(_start_biases, k, op, j))
    s.acts["moe"][...] = jnp.zeros(s.acts["moe"].shape, jnp.float32)


def _topk_softmax(k, op, lane, E: int, K: int):
    """gpt-oss's routing (mk.blocks.route): the top k of the logits plus the router's bias, a softmax over those k.
    (combine weights, picked) over the [rows, E_pad] lanes."""
    ep = lane.shape[1]
    logits = jnp.where(lane < E, k.scratch.acts["router"][...] + k.layer_vec(op.layer, "router_bias", ep), NEG)
    chosen = []
    for _ in range(K):
        m, idx = _top(logits, lane, ep)
        chosen.append((m, idx))
        logits = jnp.where(lane == idx, 2 * NEG, logits)  # below every real and padded logit
    top = chosen[0][0]  # the largest: the softmax's shift
    weights = [jnp.exp(m - top) for m, _ in chosen]
    total = weights[0]
    for w in weights[1:]:
        total = total + w
    gates = jnp.zeros(lane.shape, jnp.float32)
    picked = jnp.zeros(lane.shape, jnp.bool_)
    for w, (_, idx) in zip(weights, chosen):
        hit = lane == idx
        gates = jnp.where(hit, w / total, gates)
        picked = picked | hit
    return gates, picked


def _top(x, lane, ep: int):
    """Each row's largest value of ``x`` and its lowest lane among the maxima (lax.top_k's tie-break)."""
    m = jnp.max(x, axis=1, keepdims=True)
    return m, jnp.min(jnp.where(x == m, lane, ep), axis=1, keepdims=True)


def correction_bias(k, op, ep: int):
    """DeepSeek-V3's routing bias [1, ep] (its e_score_correction_bias): added to the scores for picking only."""
    return k.layer_vec(op.layer, "router_bias", ep)


def _sigmoid_grouped(k, op, lane, E: int, K: int):
    """DeepSeek-V3's routing (mk.blocks.route_grouped): sigmoid scores, the correction bias added for picking; each
    group of experts scored by its two best biased scores, the best ``router_topk_groups`` groups kept, the top k of
    their experts, weighted by their unbiased scores (renormalised where ``norm_topk``) times ``routed_scaling``."""
    layout, ep = k.layout, lane.shape[1]
    G = layout.router_groups
    scores = jax.nn.sigmoid(k.scratch.acts["router"][...])
    choice = jnp.where(lane < E, scores + correction_bias(k, op, ep), NEG)
    group = lane // (E // G)  # padded lanes fall past the last group
    best = []
    for g in range(G):
        x = jnp.where(group == g, choice, NEG)
        m, idx = _top(x, lane, ep)
        best.append(m + jnp.max(jnp.where(lane == idx, NEG, x), axis=1, keepdims=True))
    kept = jnp.zeros(lane.shape, jnp.bool_)
    taken = [jnp.zeros(best[0].shape, jnp.bool_) for _ in range(G)]
    for _ in range(layout.router_topk_groups):  # the best groups, the lowest index among equal ones
        top = jnp.where(taken[0], 4 * NEG, best[0])
        for g in range(1, G):
            top = jnp.maximum(top, jnp.where(taken[g], 4 * NEG, best[g]))
        found = jnp.zeros(top.shape, jnp.bool_)
        for g in range(G):
            hit = ~taken[g] & ~found & (best[g] == top)
            taken[g], found = taken[g] | hit, found | hit
            kept = kept | (hit & (group == g))
    choice = jnp.where(kept, choice, 2 * NEG)
    gates = jnp.zeros(lane.shape, jnp.float32)
    picked = jnp.zeros(lane.shape, jnp.bool_)
    for _ in range(K):
        _, idx = _top(choice, lane, ep)
        hit = lane == idx
        gates = jnp.where(hit, scores, gates)
        picked = picked | hit
        choice = jnp.where(hit, 4 * NEG, choice)
    if layout.norm_topk:
        gates = gates / (jnp.sum(gates, axis=1, keepdims=True) + 1e-20)
    return gates * jnp.float32(layout.routed_scaling), picked


def expert_table(used, base, held: int, shape):
    """The routed-expert table (``shape`` [8, E_pad] int32) from ``used`` ([1, E_pad], 1 where any user routed to
    the expert): row 0 lists the flagged experts among this chip's ``held`` from ``base`` (all E unless they are
    placed whole over chips), distinct and in expert order, as indices among them; row COUNT holds how many.
    Entries past the count name the chip's last expert: slot 0 runs even when none of the chip's experts was routed
    (whole experts), and must read a tile the chip holds (its combine weight is then zero).

    With n(e) the flagged experts up to and including e, the j-th flagged expert (from 0) is the number of experts
    e with n(e) <= j. n(e) is a sum over lanes, done as one matmul of 0/1 values (exact: bf16 holds 0 and 1, the
    MXU adds in f32) whose result every lane of row e holds; the count over e is a sum over sublanes."""
    ep = shape[1]
    lane = jax.lax.broadcasted_iota(jnp.int32, (1, ep), 1)
    mine = jnp.where((lane >= base) & (lane < base + held), used, 0)  # [1, ep]
    row = jax.lax.broadcasted_iota(jnp.int32, (ep, ep), 0)  # e
    col = jax.lax.broadcasted_iota(jnp.int32, (ep, ep), 1)  # e' in the product, list slot j in the result
    upto = jnp.where(col <= row, jnp.broadcast_to(mine, (ep, ep)), 0).astype(jnp.bfloat16)  # [e, e'] = flag of e' <= e
    n = mxu.dot(upto, jnp.ones((ep, ep), jnp.bfloat16)).astype(jnp.int32)
    ids = jnp.minimum(jnp.sum(jnp.where(n <= col, 1, 0), axis=0, keepdims=True) - base, held - 1)  # [1, ep]
    count = jnp.sum(mine, axis=1, keepdims=True)  # [1, 1]
    r = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    return jnp.where(r == 0, ids, jnp.where(r == COUNT, count, 0))


def clamped_swiglu(g, u, alpha: float, limit: float):
    """gpt-oss's clamped SwiGLU (mk.blocks.gated): ``(clip(u, +-limit) + 1) * g * sigmoid(alpha g)``, g capped at
    ``limit``."""
    g = jnp.minimum(g, jnp.float32(limit))
    u = jnp.clip(u, jnp.float32(-limit), jnp.float32(limit))
    return (u + 1.0) * (g * jax.nn.sigmoid(g * jnp.float32(alpha)))


def emit_gated_act(k, op):
    a, layout = k.scratch.acts, k.layout
    g, u = a[op.src][:, : op.n], a[op.dst][:, : op.n]
    if layout.expert_bias and op.expert is not None:  # gpt-oss: the chunk's gate and up biases of the slot's expert
        half = k.inputs.weights[f"{op.layer_type}.expert_gate_up_bias"].shape[-1] // 2
        if k.plan.expert_bias_ring:  # read ahead: the slot's first chunk waits for its rows
            when(op.off == 0, partial(_wait_biases, k, op))
        g = g + _expert_bias(k, op, "expert_gate_up_bias", op.off, op.n)
        u = u + _expert_bias(k, op, "expert_gate_up_bias", half + op.off, op.n)
    if layout.activation == "swiglu_clamped":
        a[op.dst][:, : op.n] = clamped_swiglu(g, u, layout.swiglu_alpha, layout.swiglu_limit)
        return
    act = gelu_tanh if layout.activation == "gelu_tanh" else jax.nn.silu
    a[op.dst][:, : op.n] = act(g) * u


def _bias_copies(k, op, slot) -> list:
    """Read ahead (mk.plan.StepPlan.expert_bias_ring): the copies of routed slot ``slot``'s expert's bias rows, the
    aligned block of 8 rows around them of each bias tensor, into its place in the ring (``slot`` mod its places)."""
    s, place, start = k.scratch, slot % k.plan.expert_bias_ring, _aligned(k.expert_id(slot))
    out = []
    for n, name in enumerate(EXPERT_BIASES):
        src = _bias_rows(k, op, name, start)
        dst = s.expert_bias.at[place, n, :, pl.ds(0, src.shape[-1])]
        out.append(pltpu.make_async_copy(src, dst, s.expert_bias_sem.at[place, n]))
    return out


def _start_biases(k, op, slot):
    for c in _bias_copies(k, op, slot):
        c.start()


def _wait_biases(k, op):
    for c in _bias_copies(k, op, op.expert):
        c.wait()


def _start_next_biases(k, op):
    """After slot j's combine has read its biases: slot j + ring's into the place j leaves (if that slot runs)."""
    nxt = op.expert + k.plan.expert_bias_ring
    when(nxt < k.plan.expert_slots, partial(k.guarded, nxt, partial(_start_biases, k, op, nxt)))


def _aligned(e):
    """The first row of the aligned block of ``ROWS`` rows holding row ``e`` (a scalar, maybe traced)."""
    start = e // ROWS * ROWS
    return start if isinstance(start, int) else pl.multiple_of(start, ROWS)


def _bias_rows(k, op, name: str, start):
    """Bias ``name``'s block of ``ROWS`` rows from ``start`` (:func:`_aligned`), layer ``op.index`` of its type."""
    return k.inputs.weights[f"{op.layer_type}.{name}"].at[op.index, pl.ds(start, ROWS), :]


def _expert_bias(k, op, name: str, first, n: int):
    """[1, n] lanes ``first`` .. of the bias ``name`` of the expert in slot ``op.expert``, layer ``op.index`` of its
    type: the aligned block of 8 rows holding the expert's row, in the ring where read ahead, else HBM -> VMEM now (a
    serial DMA); its row picked out."""
    s = k.scratch
    e = k.expert_id(op.expert)  # among this chip's experts: the rows of its bias tensors
    first = first if isinstance(first, int) else pl.multiple_of(first, LANE)
    if k.plan.expert_bias_ring:
        block = s.expert_bias[op.expert % k.plan.expert_bias_ring, EXPERT_BIASES.index(name), :, pl.ds(first, n)]
    else:
        src = _bias_rows(k, op, name, _aligned(e))
        c = pltpu.make_async_copy(src, s.expert_bias.at[:, pl.ds(0, src.shape[-1])], s.expert_bias_sem.at[0])
        c.start()
        c.wait()
        block = s.expert_bias[:, pl.ds(first, n)]
    block = block.astype(jnp.float32)
    pick = jax.lax.broadcasted_iota(jnp.int32, block.shape, 0) == e % ROWS
    return jnp.sum(jnp.where(pick, block, 0.0), axis=0, keepdims=True)


def emit_expert_combine(k, op):
    """moe += gate[:, e] * (expert e's output (+ its down projection's bias, gpt-oss)), e the expert in slot
    ``op.expert``; read ahead, then slot ``op.expert`` + the ring's places' biases start."""
    s = k.scratch
    e = k.expert_base + k.expert_id(op.expert)
    g = s.gates[...]
    lane = jax.lax.broadcasted_iota(jnp.int32, g.shape, 1)
    w = jnp.sum(jnp.where(lane == e, g, 0.0), axis=1, keepdims=True)
    out = s.acts["eo"][...]
    if k.layout.expert_bias:
        out = out + _expert_bias(k, op, "expert_down_bias", 0, out.shape[1])
        if k.plan.expert_bias_ring:
            _start_next_biases(k, op)
    s.acts["moe"][...] += w * out
