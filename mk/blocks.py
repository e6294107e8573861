"""The reference decoder's building blocks, one layer's worth: RMSNorm, RoPE, the projections, grouped-query
attention, the gated MLP, routing and the routed experts, a layer's residual wiring, the embedding and the head.

mk.reference strings them into prefill and decode over a KV cache; the assistant drafter (mk.assistant) reuses
them. Every block follows transformers' arithmetic for the families mk runs (float32 norms and softmaxes, cast
back), as mk.reference's docstring lists.
"""

from __future__ import annotations

import math
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np

from .config import ModelConfig, YarnScaling
from .params import EXPERTS, HEAD, NORMS, ROUTER, SHARED_MLP


# Building blocks ------------------------------------------------------------------------------------
def rms_norm(x, w, eps: float, on: bool = True):
    """transformers' Gemma4RMSNorm: float32 ``x * (mean(x^2) + eps)^-0.5 * w``, cast back. ``w=None``: no weight."""
    if not on:
        return x
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.pow(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps, -0.5)
    if w is not None:
        y = y * w.astype(jnp.float32)
    return y.astype(x.dtype)


def inv_freq(cfg: ModelConfig, layer_type: str) -> np.ndarray:
    """RoPE inverse frequencies [head_dim/2]; a full layer's non-rotated pairs have frequency 0; Llama 3's scaling
    (``cfg.rope_scaling``) slows the long wavelengths, as transformers' ``llama3`` RoPE does, and YaRN's as its
    ``yarn`` RoPE does (in float32; :func:`rope` scales cos and sin by YaRN's attention factor)."""
    hd = cfg.head_dim(layer_type)
    rot = cfg.rotary_dims(layer_type) // 2
    scaling = cfg.rope_scaling
    if isinstance(scaling, YarnScaling):
        f = yarn_inv_freq(cfg.rope_theta(layer_type), 2 * rot, scaling)
    else:
        f = (1.0 / (cfg.rope_theta(layer_type) ** (np.arange(0, 2 * rot, 2, dtype=np.float32) / hd))).astype(np.float32)
        if scaling is not None:
            f = _llama3_scaled(f, scaling)
    return np.concatenate([f, np.zeros(hd // 2 - rot, np.float32)]).astype(np.float32)


def yarn_inv_freq(base: float, dim: int, y: YarnScaling) -> np.ndarray:
    """transformers' ``_compute_yarn_parameters`` for ``dim`` rotated dims, step by step in float32 (its bounds in
    float64, as Python computes them there)."""
    pos = (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))).astype(np.float32)
    extrapolation = (np.float32(1.0) / pos).astype(np.float32)
    interpolation = (np.float32(1.0) / (np.float32(y.factor) * pos)).astype(np.float32)

    def correction_dim(rotations: float) -> float:
        old = y.original_max_position_embeddings
        return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(y.beta_fast), correction_dim(y.beta_slow)
    if y.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolated = (np.float32(1) - ramp).astype(np.float32)
    return (interpolation * (np.float32(1) - extrapolated) + extrapolation * extrapolated).astype(np.float32)


def _llama3_scaled(f: np.ndarray, r) -> np.ndarray:
    old = np.float32(r.original_max_position_embeddings)
    wavelen = np.float32(2 * np.pi) / f
    slow = np.where(wavelen > old / np.float32(r.low_freq_factor), f / np.float32(r.factor), f)
    smooth = (old / wavelen - np.float32(r.low_freq_factor)) / np.float32(r.high_freq_factor - r.low_freq_factor)
    smoothed = (1 - smooth) * slow / np.float32(r.factor) + smooth * slow
    medium = ~(wavelen < old / np.float32(r.high_freq_factor)) & ~(wavelen > old / np.float32(r.low_freq_factor))
    return np.where(medium, smoothed, slow).astype(np.float32)


def rope(x, positions, cfg: ModelConfig, layer_type: str):
    """Rotate ``x [B, T, heads, head_dim]`` at ``positions`` (rotate-half convention, as transformers):
    ``[T]`` shared by every user, or ``[B, T]`` each user its own."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq(cfg, layer_type))
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    if isinstance(cfg.rope_scaling, YarnScaling):  # YaRN's attention factor, in float32 as transformers applies it
        scale = jnp.float32(cfg.rope_scaling.attention_scale)
        cos, sin = cos * scale, sin * scale
    cos = cos.astype(x.dtype)[..., None, :]
    sin = sin.astype(x.dtype)[..., None, :]
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def matmul(x, w):
    """``x [..., in]`` times a matrix stored as mk's tree stores it, ``[in, out]``."""
    return x @ w


def matmul_t(x, w):
    """``x [..., in]`` times a matrix stored transposed, ``[out, in]`` (the decode layout of
    :func:`prepare`): contracting both minor axes is a library GEMV that reads ``w`` in place,
    measured ~20% faster on XLA:CPU than ``x @ w`` of the same matrix stored [in, out]."""
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())))


matmul_t.layout = "out_in"  # the matrices it takes are stored [out, in] (mk.mla.kv_b_heads reads it)


@lru_cache(maxsize=None)
def activations_rounded(dtype: str):
    """:func:`matmul_t` with its activations rounded to ``dtype`` first, as a kernel computing in that data type feeds
    its matrix unit (the megakernel's bf16 step: mk.megakernel.parity's reference that rounds where the kernel does).
    One function a data type, so a jitted program taking it as static compiles once."""
    dt = jnp.dtype(dtype)

    def mm(x, w):
        return matmul_t(x.astype(dt).astype(x.dtype), w)

    mm.layout, mm.activation_dtype = matmul_t.layout, dt  # products mk.mla writes as einsums round the same
    return mm


def fed(x, mm):
    """``x`` as ``mm`` feeds a product with a weight matrix: rounded to its activations' data type where it has one
    (:func:`activations_rounded`), else as it is; for products not written as calls of ``mm`` (einsums, the scaled
    embedding a kernel stores in its weights' type)."""
    dt = getattr(mm, "activation_dtype", None)
    return x if dt is None else x.astype(dt).astype(x.dtype)


def activate(x, activation: str):
    """The gated MLP's activation of its gate: GELU (tanh approximation; Gemma) or SiLU (Llama, Qwen3)."""
    return jax.nn.gelu(x, approximate=True) if activation == "gelu_tanh" else jax.nn.silu(x)


def gated(g, u, cfg: ModelConfig):
    """A gated MLP's hidden units from its gate and up projections: ``act(g) * u``, or gpt-oss's clamped SwiGLU
    (transformers' GptOssExperts): ``g = min(g, limit)``, ``(clip(u, -limit, limit) + 1) * g * sigmoid(alpha g)``."""
    if cfg.activation != "swiglu_clamped":
        return activate(g, cfg.activation) * u
    limit = cfg.swiglu_limit
    g = jnp.minimum(g, jnp.asarray(limit, g.dtype))
    u = jnp.clip(u, jnp.asarray(-limit, u.dtype), jnp.asarray(limit, u.dtype))
    return (u + 1) * (g * jax.nn.sigmoid(g * jnp.asarray(cfg.swiglu_alpha, g.dtype)))


def mlp(x, gate, up, down, mm=matmul, activation: str = "gelu_tanh"):
    """A gated MLP: ``down(act(gate(x)) * up(x))`` (GeGLU or SwiGLU), each product by ``mm``."""
    return mm(activate(mm(x, gate), activation) * mm(x, up), down)


def route(p: dict, cfg: ModelConfig, x, knockout: frozenset, mm=matmul):
    """Top-k experts and their weights for each row of ``x [N, H]`` (:func:`router_input`): (weights [N, k],
    ids [N, k]). Gemma 4: a weightless norm and a learned scale before the projection, the renormalised top-k
    weights times a per-expert scale; ``softmax_topk`` (Qwen3-MoE, Mixtral): softmax over every expert's logit,
    the top k, renormalised when ``cfg.norm_topk``; ``topk_softmax`` (gpt-oss): the top k of the biased logits, a
    softmax over those k."""
    if ROUTER in knockout:
        n = x.shape[0]
        ids = jnp.broadcast_to(jnp.arange(cfg.top_k, dtype=jnp.int32), (n, cfg.top_k))
        return jnp.full((n, cfg.top_k), 1.0 / cfg.top_k, x.dtype), ids
    if cfg.router == "sigmoid_grouped":
        return route_grouped(p, cfg, x, mm)
    h = x
    if cfg.router == "gemma4":
        h = rms_norm(x, None, cfg.rms_eps, NORMS not in knockout)
        h = h * p["router_scale"] * jnp.asarray(cfg.hidden_size**-0.5, x.dtype)
    logits = mm(h, p["router_proj"])
    if cfg.router == "topk_softmax":
        top, ids = jax.lax.top_k(logits + p["router_bias"], cfg.top_k)
        return jax.nn.softmax(top.astype(jnp.float32), axis=-1).astype(x.dtype), ids
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    w, ids = jax.lax.top_k(probs, cfg.top_k)
    if cfg.norm_topk:
        w = w / jnp.sum(w, axis=-1, keepdims=True)
    if cfg.router == "gemma4":
        w = w * p["expert_scale"][ids].astype(jnp.float32)
    return w.astype(x.dtype), ids


def route_grouped(p: dict, cfg: ModelConfig, x, mm=matmul):
    """DeepSeek-V3's router, as transformers' DeepseekV3TopkRouter (float32): sigmoid scores; the correction bias
    added for picking only: each group of experts scored by its two best biased scores, the best
    ``router_topk_groups`` groups kept, the top k of their experts; the weights are the unbiased scores of those k,
    renormalised when ``cfg.norm_topk`` (over their sum plus 1e-20), times ``cfg.routed_scaling``."""
    n, E, G = x.shape[0], cfg.num_experts, cfg.router_groups
    scores = jax.nn.sigmoid(mm(x.astype(jnp.float32), p["router_proj"].astype(jnp.float32)))
    choice = scores + p["router_bias"].astype(jnp.float32)
    best2 = jax.lax.top_k(choice.reshape(n, G, E // G), 2)[0]
    _, groups = jax.lax.top_k(jnp.sum(best2, axis=-1), cfg.router_topk_groups)  # [n, topk_group]
    kept = jnp.any(jax.nn.one_hot(groups, G, dtype=jnp.bool_), axis=1)  # [n, G]
    choice = jnp.where(jnp.repeat(kept, E // G, axis=1), choice, -jnp.inf)
    _, ids = jax.lax.top_k(choice, cfg.top_k)
    w = jnp.take_along_axis(scores, ids, axis=1)
    if cfg.norm_topk:
        w = w / (jnp.sum(w, axis=-1, keepdims=True) + 1e-20)
    return (w * cfg.routed_scaling).astype(x.dtype), ids


def router_input(p: dict, cfg: ModelConfig, x, knockout: frozenset):
    """What the router reads of the residual stream ``x`` after attention: Gemma 4's router the stream itself (it
    norms it on its own); a pre-norm family's router the FFN's input, ``pre_ffn_norm(x)``."""
    return x if cfg.router == "gemma4" else rms_norm(x, p["pre_ffn_norm"], cfg.rms_eps, NORMS not in knockout)


def experts_gathered(p: dict, cfg: ModelConfig, x, w, ids, mm=matmul):
    """Decode path: apply only the selected experts (N*k of them) to ``x [N, H]``, the slots summed in order (the sums
    differ from the dense path by round-off), in either of :func:`mk.reference.prepare`'s expert layouts:

    - stacked ``[E, ...]`` arrays (a TPU's layout, or a tree not prepared): each (row, slot) pair's expert is a
      dynamic slice of them, N*k of them unrolled: a straight-line program whose dots a TPU's XLA feeds from the
      slices in place (only the routed experts' bytes are read);
    - E arrays each (the layout elsewhere, a CPU's): a loop over the (row, slot) pairs runs a ``lax.switch`` over
      the experts whose branch reads its expert as its own buffer. Measured on XLA:CPU (2-core EPYC, JAX 0.10.2): a
      gather or dynamic slice of an [E, ...] array runs at ~1.5 GB/s (the whole step ~2x slower) and even a static
      slice is copied first (~72 copies, ~12 ms of a ~47 ms cpu-moe step). The loop keeps one switch per layer:
      unrolling the k slots compiles k times the branches (cpu-moe: ~19 s against ~7 s) for the same speed.

    gpt-oss's experts add their biases (``expert_gate_up_bias``: the gate's first, then the up's; ``expert_down_bias``).
    """
    gate, up, down = p["expert_gate"], p["expert_up"], p["expert_down"]
    biases = (p["expert_gate_up_bias"], p["expert_down_bias"]) if cfg.expert_bias else None
    N, k = ids.shape
    if not isinstance(gate, (tuple, list)):
        y = jnp.zeros_like(x)
        for n in range(N):
            for j in range(k):
                y = y.at[n].add(w[n, j] * _expert(gate, up, down, biases, mm, cfg, ids[n, j], x[n]))
        return y
    branches = [partial(_expert, gate, up, down, biases, mm, cfg, e) for e in range(len(gate))]

    def slot(s, y):
        n, j = s // k, s % k
        out = jax.lax.switch(ids[n, j], branches, x[n])
        return y.at[n].add(w[n, j] * out)

    return jax.lax.fori_loop(0, ids.size, slot, jnp.zeros_like(x))


def _expert(gate, up, down, biases, mm, cfg: ModelConfig, e, x):
    """Expert ``e`` (an index, static or traced) applied to ``x [H]``: ``gate[e]`` a static or dynamic slice of the
    stacked arrays, or the e-th of E arrays."""
    gate_up_bias, down_bias = (None, None) if biases is None else biases
    g, u = mm(x, gate[e]), mm(x, up[e])
    if gate_up_bias is not None:
        I = g.shape[-1]
        g, u = g + gate_up_bias[e, :I], u + gate_up_bias[e, I:]
    y = matmul(fed(gated(g, u, cfg), mm), down[e])  # down is [in, out] in every layout (mk.reference.prepare)
    return y if down_bias is None else y + down_bias[e]


def experts_dense(p: dict, cfg: ModelConfig, x, w, ids):
    """Prefill path: every expert on every row, weighted by a combine matrix that is zero off the top-k.

    For many rows this reads each expert once instead of gathering N*k copies; the unselected
    experts add exact zeros.
    """
    combine = jnp.sum(jax.nn.one_hot(ids, cfg.num_experts, dtype=x.dtype) * w[..., None], axis=1)  # [N, E]
    g = jnp.einsum("nh,ehi->nei", x, p["expert_gate"])
    u = jnp.einsum("nh,ehi->nei", x, p["expert_up"])
    if not cfg.expert_bias:
        return jnp.einsum("nei,eih,ne->nh", gated(g, u, cfg), p["expert_down"], combine)
    bias, I = p["expert_gate_up_bias"], g.shape[-1]
    h = gated(g + bias[:, :I], u + bias[:, I:], cfg)
    return jnp.einsum("nei,eih,ne->nh", h, p["expert_down"], combine) + combine @ p["expert_down_bias"]


# One layer ------------------------------------------------------------------------------------------
def biased(p, name: str, x, mm=matmul):
    """``x`` times the layer's matrix ``name``, plus its bias ``name_bias`` where it has one (gpt-oss)."""
    y = mm(x, p[name])
    return y + p[name + "_bias"] if name + "_bias" in p else y


def qkv(p, cfg: ModelConfig, t: str, h, positions, knockout, mm=matmul):
    """q [B, T, nh, hd], k and v [B, T, kv, hd] after their norms (those the family has) and RoPE."""
    B, T, _ = h.shape
    hd, kv, on = cfg.head_dim(t), cfg.kv_heads(t), NORMS not in knockout
    q = biased(p, "q", h, mm).reshape(B, T, cfg.num_heads, hd)
    k = biased(p, "k", h, mm).reshape(B, T, kv, hd)
    v = biased(p, "v", h, mm).reshape(B, T, kv, hd) if cfg.has_v_proj(t) else k
    if cfg.qk_norm:
        q, k = rms_norm(q, p["q_norm"], cfg.rms_eps, on), rms_norm(k, p["k_norm"], cfg.rms_eps, on)
    if cfg.v_norm:
        v = rms_norm(v, None, cfg.rms_eps, on)
    return rope(q, positions, cfg, t), rope(k, positions, cfg, t), v


def softmax_sinks(s, sinks):
    """The softmax over the last axis of the float32 scores ``s [B, kv, g, T, S]`` (masked ones -inf), with each
    head's learned sink logit (``sinks [nh]``, gpt-oss; None: none) in the denominator, its own weight dropped
    after the softmax, as transformers' GptOss attention does."""
    if sinks is None:
        return jax.nn.softmax(s, axis=-1)
    B, kv, g, T, _ = s.shape
    sink = jnp.broadcast_to(sinks.astype(jnp.float32).reshape(1, kv, g, 1, 1), (B, kv, g, T, 1))
    return jax.nn.softmax(jnp.concatenate([s, sink], axis=-1), axis=-1)[..., :-1]


def attend(q, k, v, mask, scale: float = 1.0, sinks=None, mm=matmul):
    """Grouped-query attention, scores times ``scale`` (:meth:`ModelConfig.score_scale`), each head's sink logit in
    its softmax (:func:`softmax_sinks`). q [B, T, nh, hd]; k, v [B, kv, S, hd]; mask [T, S] or [S]. Where ``mm``
    rounds its activations (:func:`activations_rounded`), the query and the probabilities are rounded the same, as a
    kernel's one-pass products against its cache are fed (mk.megakernel.mxu)."""
    B, T, nh, hd = q.shape
    kv = k.shape[1]
    qg = fed(q, mm).reshape(B, T, kv, nh // kv, hd)  # head h reads KV head h // (nh // kv), as repeat_kv
    s = jnp.einsum("btkgd,bksd->bkgts", qg, k.astype(q.dtype)).astype(jnp.float32) * scale
    s = jnp.where(mask, s, -jnp.inf)
    a = fed(softmax_sinks(s, sinks), mm).astype(q.dtype)
    o = jnp.einsum("bkgts,bksd->btkgd", a, v.astype(q.dtype))
    return o.reshape(B, T, nh * hd)


def attend_one(q, k, v, mask, scale: float = 1.0, sinks=None, mm=matmul):
    """Decode attention: :func:`attend` for one new position (q [B, 1, nh, hd]; k, v the cache
    [B, kv, S, hd]; mask [B, S], each user's own) with the weighted sum of V written as a
    multiply-reduce, which XLA:CPU runs on the V cache in place; as a dot it transposes the
    probabilities, the output and the V cache through copies every layer (measured: about half the
    step's copy time goes). The scores stay a dot, summed as prefill sums them (a multiply-reduce
    there too would drop the K cache copies but moves decode's logits ~1e-5 away from prefill's).
    """
    B, T, nh, hd = q.shape
    kv = k.shape[1]
    qg = fed(q, mm).reshape(B, T, kv, nh // kv, hd)
    s = jnp.einsum("btkgd,bksd->bkgts", qg, k.astype(q.dtype)).astype(jnp.float32) * scale
    s = jnp.where(mask[:, None, None, None, :], s, -jnp.inf)
    a = fed(softmax_sinks(s, sinks), mm).astype(q.dtype)[:, :, :, 0]  # [B, kv, g, S]
    o = jnp.sum(a[..., None] * v[:, :, None].astype(q.dtype), axis=-2)  # [B, kv, g, hd]
    return o.reshape(B, T, nh * hd)


def _ffn(p, cfg: ModelConfig, x, knockout, dense_experts: bool, mm=matmul):
    """The FFN block's output (before Gemma's post_ffn_norm) for ``x [B, T, H]``, the residual stream: the shared
    (or dense) MLP and, in an MoE layer, the routed experts; Gemma 4 norms each of the two before adding them. The
    layer's tensors say which it has (an MoE model's dense layers have an MLP and no router)."""
    on, act = NORMS not in knockout, cfg.activation
    h = rms_norm(x, p["pre_ffn_norm"], cfg.rms_eps, on)
    shared = None
    if "mlp_gate" in p:
        off = SHARED_MLP in knockout
        shared = jnp.zeros_like(x) if off else mlp(h, p["mlp_gate"], p["mlp_up"], p["mlp_down"], mm, act)
    if "router_proj" not in p:
        return shared
    if EXPERTS in knockout:
        moe = jnp.zeros_like(x)
    else:
        flat = x.reshape(-1, x.shape[-1])
        w, ids = route(p, cfg, router_input(p, cfg, flat, knockout), knockout, mm)
        h2 = rms_norm(flat, p["pre_ffn_norm_2"], cfg.rms_eps, on) if cfg.sandwich_norms else h.reshape(flat.shape)
        moe = experts_dense(p, cfg, h2, w, ids) if dense_experts else experts_gathered(p, cfg, h2, w, ids, mm)
        moe = moe.reshape(x.shape)
    if not cfg.sandwich_norms:
        return moe if shared is None else shared + moe
    shared = rms_norm(shared, p["post_ffn_norm_1"], cfg.rms_eps, on)
    return shared + rms_norm(moe, p["post_ffn_norm_2"], cfg.rms_eps, on)


def residual_layer(p, cfg: ModelConfig, x, attn_out, knockout, dense_experts: bool, mm=matmul):
    """Residual wiring of one layer given its attention output (o-projected, None when knocked out): Gemma's
    sandwich (each block's output normed, then the layer scalar), or plain pre-norm residuals."""
    on = NORMS not in knockout
    if not cfg.sandwich_norms:
        if attn_out is not None:
            x = x + attn_out
        return x + _ffn(p, cfg, x, knockout, dense_experts, mm)
    if attn_out is not None:
        x = x + rms_norm(attn_out, p["post_attn_norm"], cfg.rms_eps, on)
    x = x + rms_norm(_ffn(p, cfg, x, knockout, dense_experts, mm), p["post_ffn_norm"], cfg.rms_eps, on)
    if on:
        x = x * p["layer_scalar"].astype(x.dtype)
    return x


def embed(params, cfg: ModelConfig, tokens):
    """The tokens' embedding rows, scaled by sqrt(hidden) where the family does (Gemma)."""
    e = params["embed"]
    return e[tokens] * jnp.asarray(cfg.hidden_size**0.5, e.dtype) if cfg.scale_embeddings else e[tokens]


def head(params, cfg: ModelConfig, x, knockout, mm=matmul):
    """Logits [B, V] float32 for the hidden states ``x [B, H]``: the final norm, the tied embedding or the untied
    head, Gemma's soft cap; the normed states fed as ``mm`` feeds its products (:func:`fed`)."""
    if HEAD in knockout:
        return jnp.zeros((x.shape[0], cfg.vocab_size), jnp.float32)
    h = fed(rms_norm(x, params["final_norm"], cfg.rms_eps, NORMS not in knockout), mm)
    # the head [V, H] times h as a matrix-vector product (contracting its minor axis), not h @ head.T:
    # for the latter XLA:CPU fuses the transposed embed and the last layer's residual and norm into
    # one elemental loop that recomputes them for every vocabulary row (measured: the head took ~2x
    # its bytes' time; this way it is one library GEMV).
    w = params["embed"] if cfg.tied_embeddings else params["head"]  # [V, H] either way
    logits = jax.lax.dot_general(w, h, (((1,), (1,)), ((), ()))).T.astype(jnp.float32)
    if cfg.final_softcap:
        logits = cfg.final_softcap * jnp.tanh(logits / cfg.final_softcap)
    return logits
