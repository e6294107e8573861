"""DeepSeek's multi-head latent attention (MLA; DeepSeek-V3, Kimi K2) for the reference decoder, as transformers'
``DeepseekV3Attention`` computes it.

- queries: ``q_b(norm(q_a(h)))`` (or ``q(h)`` without a query bottleneck), each head's ``qk_nope_head_dim`` part
  kept as is and its ``qk_rope_head_dim`` part rotated;
- keys and values: ``kv_a(h)`` is the ``kv_lora_rank`` latent (then RMSNormed) and one RoPE key of
  ``qk_rope_head_dim`` shared by every head; ``kv_b(latent)`` gives each head's no-RoPE key and its value;
- RoPE over ``qk_rope_head_dim`` (theta^(-2i/qk_rope_head_dim), or YaRN's frequencies over those dims with cos and sin
  times its attention factor, as transformers' ``_compute_yarn_parameters`` gives them for DeepSeek-V3); with
  ``rope_interleave`` (DeepSeek-V3's default) its pairs are the neighbours (0, 1), (2, 3) ... and the rotated vector
  comes out de-interleaved (the even dims' results, then the odd's), as transformers'
  ``apply_rotary_pos_emb_interleave`` writes it (queries and keys alike, so the scores are those of the interleaved
  layout); else transformers' rotate-half pairs (i, i + d/2);
- scores times ``(qk_nope_head_dim + qk_rope_head_dim)^-0.5`` (ModelConfig.score_scale), and with YaRN times
  ``(0.1 mscale_all_dim ln(factor) + 1)^2`` (YarnScaling.score_factor; transformers' ``yarn_apply_mscale``).

The cache holds, a position, the normed latent and the rotated RoPE key (``layers.{i}.latent [B, 1, slots,
kv_lora_rank]`` and ``layers.{i}.rope_k [B, 1, slots, qk_rope_head_dim]``: one "KV head", as transformers views
them), not per-head keys and values. Prefill expands them into per-head keys and values (:func:`attend_expanded`,
transformers' form); decode absorbs the up-projection instead (:func:`attend_absorbed`): the query's no-RoPE part is
taken into the latent space by ``kv_b``'s key half, the scores are ``q_latent . latent + q_rope . rope_k``, the
weighted sum of latents goes through ``kv_b``'s value half, so a step reads the latent cache once and never makes
per-head keys. The two are the same sums in another order (equal to round-off; tests/test_mla.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .blocks import fed, matmul, matmul_t, rms_norm, yarn_inv_freq
from .config import FULL, ModelConfig, YarnScaling
from .params import NORMS


def inv_freq(cfg: ModelConfig) -> np.ndarray:
    """RoPE's inverse frequencies over the RoPE key's ``qk_rope_head_dim`` dims [qk_rope_head_dim / 2], float32
    (YaRN's where ``cfg.rope_scaling`` is one: transformers' DeepSeek-V3 takes its head_dim as qk_rope_head_dim)."""
    d = cfg.latent_attention.qk_rope_head_dim
    if isinstance(cfg.rope_scaling, YarnScaling):
        return yarn_inv_freq(cfg.full_rope_theta, d, cfg.rope_scaling)
    return (1.0 / (cfg.full_rope_theta ** (np.arange(0, d, 2, dtype=np.float32) / d))).astype(np.float32)


def rope(x, positions, cfg: ModelConfig):
    """Rotate ``x [B, T, heads, qk_rope_head_dim]`` at ``positions`` (``[T]``, or ``[B, T]`` each user its own), in
    DeepSeek's interleaved layout (the result de-interleaved, as transformers writes it) or in rotate-half pairs."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq(cfg))  # [..., T, d/2]
    cos, sin = jnp.cos(freqs), jnp.sin(freqs)
    if isinstance(cfg.rope_scaling, YarnScaling):  # YaRN's attention factor, in float32 as transformers applies it
        scale = jnp.float32(cfg.rope_scaling.attention_scale)
        cos, sin = cos * scale, sin * scale
    cos, sin = cos.astype(x.dtype)[..., None, :], sin.astype(x.dtype)[..., None, :]
    if cfg.latent_attention.rope_interleave:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def project(p: dict, cfg: ModelConfig, h, positions, knockout: frozenset, mm=matmul):
    """One layer's query and its cache entries for the normed stream ``h [B, T, H]``: ``((q_nope [B, T, heads,
    qk_nope_head_dim], q_rope [B, T, heads, qk_rope_head_dim] rotated), {"latent": [B, 1, T, kv_lora_rank] normed,
    "rope_k": [B, 1, T, qk_rope_head_dim] rotated})``."""
    mla, on = cfg.latent_attention, NORMS not in knockout
    B, T, _ = h.shape
    if mla.q_lora_rank:
        q = mm(rms_norm(mm(h, p["q_a"]), p["q_a_norm"], cfg.rms_eps, on), p["q_b"])
    else:
        q = mm(h, p["q"])
    q = q.reshape(B, T, cfg.num_heads, mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    q_nope, q_rope = q[..., : mla.qk_nope_head_dim], q[..., mla.qk_nope_head_dim :]
    kv = mm(h, p["kv_a"])
    latent = rms_norm(kv[..., : mla.kv_lora_rank], p["kv_a_norm"], cfg.rms_eps, on)
    rope_k = kv[..., mla.kv_lora_rank :].reshape(B, T, 1, mla.qk_rope_head_dim)
    q_rope, rope_k = rope(q_rope, positions, cfg), rope(rope_k, positions, cfg)
    return (q_nope, q_rope), {"latent": latent[:, None], "rope_k": rope_k.transpose(0, 2, 1, 3)}


def kv_b_heads(w, cfg: ModelConfig, mm=matmul):
    """``kv_b`` as ``[heads, qk_nope_head_dim + v_head_dim, kv_lora_rank]`` (each head's key rows, then its value
    rows), from mk's ``[in, out]`` tree (``mm`` matmul) or the decode layout's ``[out, in]`` (``mm`` matmul_t, or one
    that takes its layout: mk.blocks.activations_rounded)."""
    mla = cfg.latent_attention
    width = mla.qk_nope_head_dim + mla.v_head_dim
    if getattr(mm, "layout", None) == matmul_t.layout:
        return w.reshape(cfg.num_heads, width, mla.kv_lora_rank)
    return w.reshape(mla.kv_lora_rank, cfg.num_heads, width).transpose(1, 2, 0)


def _softmax(s, mask, dtype):
    """Scores ``s [B, heads, T, S]`` masked (``mask`` broadcast to them) and softmaxed in float32, cast back."""
    return jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1).astype(dtype)


def attend_expanded(p: dict, cfg: ModelConfig, q, latent, rope_k, mask, mm=matmul):
    """Attention as transformers computes it: every position's latent ``[B, 1, S, kv_lora_rank]`` expanded by
    ``kv_b`` into each head's no-RoPE key and value, the shared RoPE key ``[B, 1, S, qk_rope_head_dim]`` beside the
    key. ``q``: :func:`project`'s; ``mask`` broadcasts to ``[B, heads, T, S]``. Returns ``[B, T, heads *
    v_head_dim]`` (before ``o``)."""
    mla = cfg.latent_attention
    q_nope, q_rope = q
    B, T, nh, dn = q_nope.shape
    S = latent.shape[2]
    kv = mm(latent[:, 0].astype(q_nope.dtype), p["kv_b"]).reshape(B, S, nh, dn + mla.v_head_dim)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    s = jnp.einsum("bthd,bshd->bhts", q_nope, k_nope) + jnp.einsum(
        "bthd,bsd->bhts", q_rope, rope_k[:, 0].astype(q_rope.dtype)
    )
    a = _softmax(s.astype(jnp.float32) * cfg.score_scale(FULL), mask, q_nope.dtype)
    return jnp.einsum("bhts,bshv->bthv", a, v).reshape(B, T, nh * mla.v_head_dim)


def attend_absorbed(p: dict, cfg: ModelConfig, q, latent, rope_k, mask, mm=matmul):
    """:func:`attend_expanded` with the up-projection absorbed (decode): the no-RoPE query taken into the latent
    space by ``kv_b``'s key half, scores against the cached latents and RoPE keys as they are, the probabilities'
    weighted sum of latents through ``kv_b``'s value half. The cache is read once; no per-head key or value is
    made. Same arguments and result."""
    mla = cfg.latent_attention
    q_nope, q_rope = q
    B, T, nh, dn = q_nope.shape
    w = kv_b_heads(p["kv_b"], cfg, mm).astype(q_nope.dtype)  # [heads, dn + dv, r]
    c, r = latent[:, 0].astype(q_nope.dtype), rope_k[:, 0].astype(q_rope.dtype)  # [B, S, r], [B, S, dr]
    q_latent = jnp.einsum("bthd,hdr->bthr", fed(q_nope, mm), w[:, :dn])
    # the scores' and probabilities' products fed as the kernel's against its cache are (mk.blocks.attend)
    s = jnp.einsum("bthr,bsr->bhts", fed(q_latent, mm), c) + jnp.einsum("bthd,bsd->bhts", fed(q_rope, mm), r)
    a = fed(_softmax(s.astype(jnp.float32) * cfg.score_scale(FULL), mask, q_nope.dtype), mm)
    o_latent = jnp.einsum("bhts,bsr->bthr", a, c)
    return jnp.einsum("bthr,hvr->bthv", fed(o_latent, mm), w[:, dn:]).reshape(B, T, nh * mla.v_head_dim)
