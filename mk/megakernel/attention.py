"""Decode attention inside the kernel: q/k/v norms and RoPE at each user's own position, then, per
user, an online softmax over the KV cache read in double-buffered tiles, and the new K/V written back
to the cache in HBM.

The new token's K/V seed the softmax (they are in VMEM already); cache tiles are read only up to the
tile holding the user's position, and slots that hold nothing for this user are masked out: the slot
being overwritten (the token that left a sliding window, or nothing yet in a full layer), slots past
the position, and a sliding cache's padding slots (the window rounded up to whole blocks). Scores scaled by
the model's score scale (folded into q: 1 for Gemma 4, 1/sqrt(head_dim) for the pre-norm families), no softcap.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..config import SLIDING
from ..plan import BLOCK
from .dense import NEG, rms
from .refs import POSITION


def rope(x, cos, sin, sign):
    """Rotate-half RoPE on ``x [rows, head_dim]``: x*cos + [-x2, x1]*sin (a lane roll by half)."""
    half = x.shape[-1] // 2
    return x * cos + pltpu.roll(x, half, 1) * sign * sin


def emit_qkv_norm_rope(k, op):
    """In place on the q, k, v activations of layer ``op.layer``: q/k norms (where the family has them) + RoPE at
    each user's position, v's weightless norm (Gemma 4; for K=V layers, v is the k projection before its norm).
    q is scaled by the model's score scale here, so the scores need none."""
    cfg, t, i, on = k.cfg, op.layer_type, op.layer, k.norms_on
    hd, kv, nh, eps = cfg.head_dim(t), cfg.kv_heads(t), cfg.num_heads, cfg.rms_eps
    n = k.model.head_dim(t)  # the head's own dims (a padded head has zero lanes)
    s = k.scratch
    inv = s.inv_freq[0:1, :hd] if t == SLIDING else s.inv_freq[1:2, :hd]
    pos = s.users_vmem[:, POSITION : POSITION + 1].astype(jnp.float32)  # [rows, 1]
    ang = pos * inv
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    lane = jax.lax.broadcasted_iota(jnp.int32, (1, hd), 1)
    sign = jnp.where(lane < hd // 2, -1.0, 1.0).astype(jnp.float32)
    qk = cfg.qk_norm
    qn, kn = (k.layer_vec(i, "q_norm", hd), k.layer_vec(i, "k_norm", hd)) if qk else (None, None)
    scale = k.model.score_scale(t)  # of the model's own head dim
    q, kr, vr = s.acts["q"], s.acts["k"], s.acts["v"]
    for h in range(nh):
        c = slice(h * hd, (h + 1) * hd)
        qh = rope(rms(q[:, c], eps, qn, on and qk, n), cos, sin, sign)
        q[:, c] = qh if scale == 1.0 else qh * jnp.float32(scale)
    for g in range(kv):
        c = slice(g * hd, (g + 1) * hd)
        kg = kr[:, c]
        vg = vr[:, c] if cfg.has_v_proj(t) else kg
        vr[:, c] = rms(vg, eps, None, on and cfg.v_norm, n)
        kr[:, c] = rope(rms(kg, eps, kn, on and qk, n), cos, sin, sign)


def emit_attend(k, op):
    """attn[b, heads] for every user b, reading layer ``op.layer``'s cache in tiles; writes the new K/V."""
    cfg, t, B = k.cfg, op.layer_type, k.plan.batch
    hd, kv, nh = cfg.head_dim(t), cfg.kv_heads(t), cfg.num_heads
    rep = nh // kv
    T = k.plan.kv_tile(t)
    S = k.plan.cache_len(t)
    W = cfg.sliding_window if t == SLIDING else S  # slots that can hold a position
    kc, vc = k.outputs.cache[f"{t}.k"].at[op.index], k.outputs.cache[f"{t}.v"].at[op.index]
    buf = k.scratch.kv[t]
    qblk = k.scratch.qblk
    a = k.scratch.acts
    q, knew, vnew, out = a["q"], a["k"], a["v"], a["attn"]

    def tile_copies(b, tix, slot):
        src = pl.ds(pl.multiple_of(tix * T, T), T)
        return (
            pltpu.make_async_copy(kc.at[b, :, src, :], buf.k.at[slot], buf.sem.at[0, slot]),
            pltpu.make_async_copy(vc.at[b, :, src, :], buf.v.at[slot], buf.sem.at[1, slot]),
        )

    writes = []
    for b in range(B):
        pos = k.position(b)
        slot_new = pos % cfg.sliding_window if t == SLIDING else pos
        n_tiles = jnp.minimum(pos // T + 1, S // T)
        for c in tile_copies(b, 0, 0):
            c.start()
        state = []
        for g in range(kv):
            for r in range(rep):
                h = g * rep + r
                qblk[g, r : r + 1, :hd] = q[b : b + 1, h * hd : (h + 1) * hd]
            qg = qblk[g, :, :hd]
            k0 = knew[b : b + 1, g * hd : (g + 1) * hd]
            v0 = vnew[b : b + 1, g * hd : (g + 1) * hd]
            m = jnp.sum(qg * k0, axis=1, keepdims=True)
            state.append((m, jnp.ones_like(m), jnp.broadcast_to(v0, qg.shape)))

        def body(tix, carry, b=b, pos=pos, slot_new=slot_new, n_tiles=n_tiles):
            slot = tix % 2

            @pl.when(tix + 1 < n_tiles)
            def _():
                for c in tile_copies(b, tix + 1, 1 - slot):
                    c.start()

            for c in tile_copies(b, tix, slot):
                c.wait()
            s_idx = tix * T + jax.lax.broadcasted_iota(jnp.int32, (1, T), 1)
            valid = (s_idx <= pos) & (s_idx < W) & (s_idx != slot_new)
            new = []
            for g in range(kv):
                m, l, acc = carry[g]
                qg = qblk[g, :, :hd]
                kt = buf.k[slot, g].astype(jnp.float32)
                vt = buf.v[slot, g].astype(jnp.float32)
                s = jax.lax.dot_general(qg, kt, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
                s = jnp.where(valid, s, NEG)
                m2 = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
                alpha = jnp.exp(m - m2)
                p = jnp.exp(s - m2)
                l2 = l * alpha + jnp.sum(p, axis=1, keepdims=True)
                acc2 = acc * alpha + jnp.dot(p, vt, preferred_element_type=jnp.float32)
                new.append((m2, l2, acc2))
            return tuple(new)

        state = jax.lax.fori_loop(0, n_tiles, body, tuple(state))
        for g in range(kv):
            _, l, acc = state[g]
            o = acc / l
            for r in range(rep):
                h = g * rep + r
                out[b : b + 1, h * hd : (h + 1) * hd] = o[r : r + 1]
        # Every read of this user's cache is done: write the new position back. A DMA may not cut a
        # (16, 128) bf16 tile, so read the aligned block of BLOCK slots around it, set the row, write back.
        blk = pl.ds(pl.multiple_of(slot_new // BLOCK * BLOCK, BLOCK), BLOCK)
        row = jax.lax.broadcasted_iota(jnp.int32, (BLOCK, hd), 0) == slot_new % BLOCK
        pairs = ((buf.stage_k, kc, knew), (buf.stage_v, vc, vnew))
        reads = [
            pltpu.make_async_copy(cache.at[b, :, blk, :], stage.at[b], buf.stage_sem.at[n, b])
            for n, (stage, cache, _) in enumerate(pairs)
        ]
        for c in reads:
            c.start()
        for c in reads:
            c.wait()
        for n, (stage, cache, new) in enumerate(pairs):
            for g in range(kv):
                block = stage[b, g].astype(jnp.float32)
                stage[b, g] = jnp.where(row, new[b : b + 1, g * hd : (g + 1) * hd], block).astype(stage.dtype)
            w = pltpu.make_async_copy(stage.at[b], cache.at[b, :, blk, :], buf.stage_sem.at[n, b])
            w.start()
            writes.append(w)
    for w in writes:
        w.wait()
