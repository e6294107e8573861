"""DeepSeek's multi-head latent attention (MLA; DeepSeek-V3, Kimi K2) inside the kernel, decoded absorbed as
mk.mla.attend_absorbed does:

- over a slice's chips, q_a and kv_a split by rows where that reads fewer bytes a chip (mk.sharding.latent_down_rows):
  each chip multiplies its block of the normed input (MatmulTile ``chip_rows``), the partial sums all-reduced;
- QKVNormRope: the position's latent (kv_a's first kv_lora_rank columns, RMSNormed) and its RoPE key, each query
  head's RoPE part rotated, the queries times the score scale (YaRN's mscale included: ``score_scale``);
- MatmulTile ABSORB, ``kv_b`` in tiles of whole heads: each head's no-RoPE query through its key columns into the
  latent space; its value columns kept in VMEM (``stash``) for the output, so ``kv_b`` is read once a step;
- Attend: per user, scores ``q_latent . latent + q_rope . rope_k`` over the latent cache read once in tiles (one
  "KV head" every query head reads), the new position's latent and RoPE key written back; then each head's weighted
  sum of latents through its value columns.

The layout (``to_layout``): every head's no-RoPE query, RoPE query, kv_b key and value columns and o rows start at a
lane-tile edge (mk.plan.layout.latent_shape); the RoPE columns of q and kv_a are reordered so that DeepSeek's
interleaved pairs (0, 1), (2, 3) ... become the rotate-half's (i, i + d/2) in the kernel's head lanes: the rotated
key comes out in the order transformers writes it (mk.mla.rope), so the cache is the reference's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ..config import FULL, ModelConfig
from ..plan import LANE, kv_tiles_read, type_index
from ..plan.layout import head_lanes, latent_lanes, latent_placement, latent_shape
from . import mxu
from .attention import fold_scores, next_tile, rope, rope_tables, sees, start_write_back, tile_copies
from .dense import rms

CACHE = ("latent", "rope_k")  # the kernel's cache of an MLA layer type: {type}.latent, {type}.rope_k


# The layout ----------------------------------------------------------------------------------------
def to_layout(a, cfg: ModelConfig, path: str, lay: ModelConfig):
    """An MLA matrix of the reference tree (``q``, ``q_a``, ``q_b``, ``kv_a``, ``kv_b``, ``o``) in the kernel's
    layout ``lay``, zeros elsewhere."""
    name = path.rsplit(".", 1)[-1]
    (rs, rd), (cs, cd) = (latent_placement(cfg, name, n, axis) for axis, n in enumerate(a.shape))
    out = jnp.zeros(latent_shape(lay, name, a.shape), a.dtype)
    return out.at[rd[:, None], cd[None, :]].set(jnp.asarray(a)[rs[:, None], cs[None, :]])


def adopt_cache(cfg: ModelConfig, cache: dict) -> dict:
    """The kernel's latent cache from the reference's (``layers.{i}.latent`` [B, 1, slots, kv_lora_rank],
    ``layers.{i}.rope_k`` [B, 1, slots, qk_rope_head_dim]): stacked over the layers, the latent padded to whole
    lanes, the RoPE key in its head lanes."""
    _, Dr, _, L = latent_lanes(cfg)
    dr = cfg.latent_attention.qk_rope_head_dim
    out = {}
    for i in range(cfg.num_layers):
        lat, rk = cache[f"layers.{i}.latent"], cache[f"layers.{i}.rope_k"]
        wide = jnp.zeros((*rk.shape[:-1], Dr), rk.dtype).at[..., head_lanes(dr, Dr)].set(rk)
        out.setdefault(f"{FULL}.latent", []).append(jnp.pad(lat, [(0, 0)] * 3 + [(0, L - lat.shape[-1])]))
        out.setdefault(f"{FULL}.rope_k", []).append(wide)
    return {n: jnp.stack(v) for n, v in out.items()}


def reference_cache(cfg: ModelConfig, cache: dict) -> dict:
    """The reference's latent cache from the kernel's."""
    mla = cfg.latent_attention
    out = {}
    for i in range(cfg.num_layers):
        j = type_index(cfg, i)
        out[f"layers.{i}.latent"] = cache[f"{FULL}.latent"][j][..., : mla.kv_lora_rank]
        rope_lanes = head_lanes(mla.qk_rope_head_dim, latent_lanes(cfg)[1])
        out[f"layers.{i}.rope_k"] = cache[f"{FULL}.rope_k"][j][..., rope_lanes]
    return out


# The emitters --------------------------------------------------------------------------------------
def score_scale(cfg: ModelConfig) -> float:
    """MLA's scores' factor: (qk_nope + qk_rope)^-0.5, times YaRN's mscale^2 (ModelConfig.score_scale)."""
    return cfg.score_scale(FULL)


def _lanes(start, size: int):
    """``size`` lanes from ``start`` (a multiple of 128; traced inside a loop over tiles)."""
    return pl.ds(start if isinstance(start, int) else pl.multiple_of(start, LANE), size)


def emit_rope(k, op):
    """The position's latent normed into ``latent`` and its RoPE key rotated into ``rope_k`` (from ``kva``); each query
    head's RoPE part rotated in place; the queries times the score scale, so the scores need none."""
    layout, a = k.layout, k.scratch.acts
    D, Dr, _, L = latent_lanes(layout)
    cos, sin, sign = rope_tables(k, op.layer_type, Dr)
    kva = a["kva"][...]
    norm = k.layer_vec(op.layer, "kv_a_norm", L)
    a["latent"][...] = rms(kva[:, :L], layout.rms_eps, norm, k.norms_on, layout.latent_attention.kv_lora_rank)
    a["rope_k"][...] = rope(kva[:, L : L + Dr], cos, sin, sign)
    scale, q = jnp.float32(score_scale(k.share)), a["q"]
    for h in range(layout.num_heads):
        c = h * (D + Dr)
        q[:, c : c + D] = q[:, c : c + D] * scale
        q[:, c + D : c + D + Dr] = rope(q[:, c + D : c + D + Dr], cos, sin, sign) * scale


def emit_absorb(k, op):
    """A kv_b tile of whole heads (from column ``op.dst_off``): each head's no-RoPE query (of ``op.src``) times its key
    columns, transposed, into its latent-space query (``op.dst``); its value columns into the stash."""
    D, Dr, Dv, L = latent_lanes(k.layout)
    w, a, stash = D + Dv, k.scratch.acts, k.scratch.latent.stash
    tile = k.weight_tile()  # [L, heads x (D + Dv)]
    first = op.dst_off // w
    for j in range(op.n // w):
        h = first + j
        qn = a[op.src][:, _lanes(h * (D + Dr), D)].astype(tile.dtype)
        wk = tile[:, j * w : j * w + D]  # [L, D]
        a[op.dst][:, _lanes(h * L, L)] = mxu.dot(qn, wk, mxu.ROWS_BY_ROWS)
        stash[:, _lanes(h * Dv, Dv)] = tile[:, j * w + D : (j + 1) * w]


def emit_attend(k, op):
    """Each user's heads over the latent cache of layer ``op.layer`` in tiles (an online softmax seeded by the new
    position, whose latent and RoPE key are then written back), the heads' latent sums into ``olat``; then ``attn``:
    each head's sum through its kv_b value columns."""
    layout, t = k.layout, op.layer_type
    D, Dr, Dv, L = latent_lanes(layout)
    nh = layout.num_heads
    T, S = k.plan.kv_tile(t), k.plan.cache_len(t)
    lc, rc = k.outputs.cache[f"{t}.latent"].at[op.index], k.outputs.cache[f"{t}.rope_k"].at[op.index]
    buf, x, a = k.scratch.kv[t], k.scratch.latent, k.scratch.acts
    x.qlat[...] = jnp.zeros(x.qlat.shape, jnp.float32)  # rows past the heads stay finite
    x.qrope[...] = jnp.zeros(x.qrope.shape, jnp.float32)
    writes = []
    for b in range(k.plan.users):
        pos = k.position(b)
        n_tiles = kv_tiles_read(pos, T, S, xp=jnp)
        for c in tile_copies(lc, rc, buf, T, b, 0, 0):
            c.start()
        for h in range(nh):
            x.qlat[h : h + 1, :] = a["qlat"][b : b + 1, h * L : (h + 1) * L]
            x.qrope[h : h + 1, :] = a["q"][b : b + 1, h * (D + Dr) + D : (h + 1) * (D + Dr)]
        new_lat, new_rope = a["latent"][b : b + 1], a["rope_k"][b : b + 1]
        ql, qr = x.qlat[...], x.qrope[...]
        m = jnp.sum(ql * new_lat, axis=1, keepdims=True) + jnp.sum(qr * new_rope, axis=1, keepdims=True)
        state = (m, jnp.ones_like(m), jnp.broadcast_to(new_lat, ql.shape))  # the new position seeds the softmax

        def body(tix, carry, b=b, pos=pos, n_tiles=n_tiles):
            slot = next_tile(lc, rc, buf, T, b, tix, n_tiles)
            valid = sees(tix * T + jax.lax.broadcasted_iota(jnp.int32, (1, T), 1), pos, S, None)
            lt, rt = buf.k[slot, 0].astype(jnp.float32), buf.v[slot, 0].astype(jnp.float32)
            s = mxu.dot(x.qlat[...], lt, mxu.ROWS_BY_ROWS, buf.k.dtype)
            s = s + mxu.dot(x.qrope[...], rt, mxu.ROWS_BY_ROWS, buf.k.dtype)
            return fold_scores(carry, s, lt, valid, buf.k.dtype)

        _, l, acc = jax.lax.fori_loop(0, n_tiles, body, state)
        o = acc / l
        for h in range(nh):
            a["olat"][b : b + 1, h * L : (h + 1) * L] = o[h : h + 1]
        # every read of this user's cache is done: its new latent and RoPE key into their slot
        writes += start_write_back(buf, lc, rc, a["latent"], a["rope_k"], b, pos % S, 1)
    for w in writes:
        w.wait()
    for h in range(nh):
        v = x.stash[:, h * Dv : (h + 1) * Dv]
        o = a["olat"][:, h * L : (h + 1) * L].astype(v.dtype)
        a["attn"][:, h * Dv : (h + 1) * Dv] = mxu.dot(o, v)
