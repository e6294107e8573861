"""The reference decoder in plain JAX: prefill, one-token decode with a KV cache, speculative verification, any batch.
It runs Gemma 4 (below), Llama 3, Qwen3, Qwen3-MoE and Mixtral (pre-norm layers, mk.blocks), gpt-oss (attention
sinks, biased projections and experts, the clamped SwiGLU, YaRN RoPE) and DeepSeek-V3 / Kimi K2 (multi-head latent
attention, mk.mla, with YaRN RoPE and its softmax mscale; grouped sigmoid routing with its correction bias, dense
first layers, a shared expert), all of which the megakernel runs too (``ModelConfig.check_runnable(engine)``).

This is the "general stack": ordinary XLA ops, one compiled program per decode step. Users need not
be in step: :func:`prefill` takes right-padded prompts of different lengths (``lengths [B]``; padding
is never attended to nor written to the cache, and each user gets the logits of its own last prompt
position), and :func:`decode_step` takes one position per user (``pos [B]``; a shared int is
broadcast): each user's K/V go to its own slot, its RoPE and attention mask follow its own position.
The KV cache (:func:`init_cache`) may be padded for engines that read it in blocks: every layer's
slot count rounded up to a ``multiple``; a sliding layer's ring is all of its slots (position p in slot
p mod slots), of which a query sees only the window. For speculative verification (:func:`verify_step`) the
ring is longer than the window (mk.kv_slots.ring_slots), so the K/V written for drafts that are then rejected never
overwrite a position still read: they are hidden by position until overwritten. It follows
transformers' ``Gemma4ForCausalLM`` exactly (tests/test_parity.py holds it to that, and the other families to theirs;
tests/test_mla.py DeepSeek-V3):

- embeddings times sqrt(hidden), the scale rounded to the weights' dtype first (as transformers does);
- per layer: ``x = x + post_attn_norm(attn(input_norm(x)))``; then the FFN block
  ``x = x + post_ffn_norm(ffn)`` where ffn is ``mlp(pre_ffn_norm(x))`` for a dense model and, for MoE,
  ``post_ffn_norm_1(mlp(pre_ffn_norm(x))) + post_ffn_norm_2(experts(pre_ffn_norm_2(x)))`` with the
  router reading the same ``x``; finally the whole stream is multiplied by ``layer_scalar``;
- attention: q/k RMSNorm over head_dim (learned), V RMSNorm without weight, RoPE on q and k, scaling
  1.0, no attention softcap; full layers with K=V take V from the k projection before its norm;
- RoPE: sliding layers rotate all of head_dim (theta 1e4); full layers "proportional": the first
  ``partial*head_dim/2`` frequency pairs use theta^(-2i/head_dim), the rest have frequency 0;
- a sliding layer at position p sees positions p-W+1..p; the final norm, the tied head, then
  ``softcap * tanh(logits / softcap)``.

RMSNorms and softmaxes run in float32 and cast back to the activations' dtype, as transformers does.

The other families follow their transformers classes the same way (tests/test_parity.py, tests/test_gpt_oss.py):
Llama 3 / Qwen3 / Qwen3-MoE / Mixtral's pre-norm residuals, SiLU MLP, scores over sqrt(head_dim), QK-norm (Qwen3),
softmax-then-top-k routing, Llama 3's RoPE scaling; gpt-oss (``GptOssForCausalLM``) adds biased q/k/v/o, a learned
sink logit per head in every softmax's denominator (its weight dropped after), sliding and full layers alternating,
YaRN RoPE (cos and sin times its attention factor), a router taking the top k of its biased logits then a softmax
over those k, and biased experts with the clamped SwiGLU ``(clip(up, +-limit) + 1) * g * sigmoid(alpha g)``,
``g = min(gate, limit)``.

INT8 trees (mk.quant: int8 codes plus float32 scales per output channel) are accepted wherever a tree is:
they are dequantized once (:func:`float_params`, ``mk.quant.dequantize``: codes x scale in float32, rounded
to the embedding's dtype) and kept for that tree, beside its decode layout, so every step computes with
exactly the weights the quantized tree stands for, and a float tree goes through untouched.

Knock-outs (``decode_step(knockout=...)``; names from mk.params), for measuring what each part costs:

- ``sliding_attention`` / ``full_attention``: those layers' attention block is skipped: its output is
  zero, the residual stream passes through, and their KV cache is left as it was.
- ``shared_mlp``: the shared (dense) MLP's output is zero (dense model: the FFN block adds nothing).
- ``experts``: the routed experts' output is zero (the router still runs, unless knocked out too).
- ``router``: no routing: every user takes experts 0..k-1 with weight 1/k each, so the experts'
  weight reads stay but the router's work goes.
- ``norms``: every RMSNorm (learned or not, incl. q/k/v norms, the router's and the final norm) is a
  plain pass-through and ``layer_scalar`` is not applied.
- ``head``: no output head: the logits are zeros (the embedding lookup of the input token stays).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from . import mla
from .blocks import (
    activations_rounded,
    attend,
    attend_one,
    biased,
    embed,
    fed,
    head,
    matmul_t,
    qkv,
    residual_layer,
    rms_norm,
    route,
    router_input,
)
from .config import SLIDING, ModelConfig
from .format_trees import FSCALE_SUFFIX
from .kv_slots import cache_len
from .params import NORMS, attention_component, check_knockout, layer_params
from .quant import SCALE_SUFFIX, dequantize
from .units import positive_int


# Cache ------------------------------------------------------------------------------------------
def init_cache(
    cfg: ModelConfig, batch: int, max_len: int, dtype=jnp.float32, multiple: int = 1, draft_tokens: int = 0
) -> dict[str, jax.Array]:
    """An empty KV cache for ``batch`` users and up to ``max_len`` positions.

    ``layers.{i}.k`` / ``.v``: ``[batch, kv_heads, slots, head_dim]``; position p lives in slot ``p % slots`` (a
    full layer's slots outnumber its positions: slot p). K is stored after k_norm and RoPE, V after its weightless
    norm. ``multiple``: every layer's slot count is rounded up to a multiple of it (for engines that read the cache
    in blocks). ``draft_tokens``: a sliding ring that many slots longer (mk.kv_slots.cache_len). Multi-head latent
    attention (DeepSeek-V3) keeps ``layers.{i}.latent [batch, 1, slots, kv_lora_rank]`` and ``layers.{i}.rope_k
    [batch, 1, slots, qk_rope_head_dim]`` instead (mk.mla).
    """
    for name, v in (("batch", batch), ("max_len", max_len), ("multiple", multiple)):
        positive_int(name, v)
    cache = {}
    for i, t in enumerate(cfg.layer_types):
        slots = cache_len(cfg, t, int(max_len), int(multiple), int(draft_tokens))
        shape = cfg.latent_attention
        if shape is not None:
            cache[f"layers.{i}.latent"] = jnp.zeros((batch, 1, slots, shape.kv_lora_rank), dtype)
            cache[f"layers.{i}.rope_k"] = jnp.zeros((batch, 1, slots, shape.qk_rope_head_dim), dtype)
            continue
        shape = (batch, cfg.kv_heads(t), slots, cfg.head_dim(t))
        cache[f"layers.{i}.k"] = jnp.zeros(shape, dtype)
        cache[f"layers.{i}.v"] = jnp.zeros(shape, dtype)
    return cache


def held_positions(newest, slots: int):
    """The position each of a cache's ``slots`` slots holds when ``newest [..., 1]`` is the newest position written
    (every position written in order, each in slot ``p % slots``): ``[..., slots]``, negative for a slot not yet
    written. A slot holding a rejected draft's K/V (written past ``newest``) reads as its position less ``slots``."""
    s = jnp.arange(slots, dtype=jnp.int32)
    return newest - jnp.mod(newest - s, slots)


def visible(held, query, cfg: ModelConfig, layer_type: str):
    """Whether a query at position ``query`` attends to the position ``held`` (:func:`held_positions`): written, not
    after it, and inside the window on a sliding layer."""
    ok = (held >= 0) & (held <= query)
    return ok & (held > query - cfg.sliding_window) if layer_type == SLIDING else ok


def cache_capacity(cfg: ModelConfig, cache: dict) -> int | None:
    """Positions the cache can hold (its full layers' slots); None when every layer slides."""
    full = cfg.full_layers
    return layer_slots(cache, full[0]) if full else None


def layer_slots(cache: dict, i: int) -> int:
    """The slots of layer ``i``'s cache (its arrays are ``[batch, heads, slots, ...]``)."""
    return next(v.shape[2] for k, v in cache.items() if k.startswith(f"layers.{i}."))


def cache_batch(cache: dict) -> int:
    """Users the cache holds."""
    return next(iter(cache.values())).shape[0]


def check_tokens(cfg: ModelConfig, tokens) -> np.ndarray:
    """Concrete token ids as int32, with a clear error for ids outside the vocabulary."""
    t = np.asarray(tokens)
    if t.size and not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"token ids must be integers, got dtype {t.dtype}")
    bad = t[(t < 0) | (t >= cfg.vocab_size)]
    if bad.size:
        raise ValueError(
            f"token id(s) {sorted(set(bad.tolist()))[:8]} outside the vocabulary "
            f"0..{cfg.vocab_size - 1} of {cfg.name!r}"
        )
    return t.astype(np.int32)


# Prefill ------------------------------------------------------------------------------------------
@partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def _prefill(params, cfg: ModelConfig, tokens, lengths, cache):
    B, T = tokens.shape
    W = cfg.sliding_window
    knockout = frozenset()
    positions = jnp.arange(T, dtype=jnp.int32)
    causal = positions[None, :] <= positions[:, None]
    window = positions[None, :] > positions[:, None] - W
    last = lengths[:, None] - 1  # [B, 1]: each user's last prompt position
    # A full layer keeps positions 0..length-1 of each user in their slots; padding writes nothing.
    real = positions[None, :] <= last  # [B, T]
    # A sliding layer's slot s keeps each user's newest prompt position p == s (mod its slots), when there is
    # one (p >= 0): the last positions of its own prompt, not of the padded block.
    x = embed(params, cfg, tokens)
    cache = dict(cache)
    for i, t in enumerate(cfg.layer_types):
        p = layer_params(params, i)
        h = rms_norm(x, p["input_norm"], cfg.rms_eps)
        attn, written = _attention(p, cfg, t, h, positions, causal & window if t == SLIDING else causal, knockout)
        for name, val in written.items():
            c = cache[f"layers.{i}.{name}"]
            if t == SLIDING:
                n = c.shape[2]
                newest = held_positions(last, n)  # [B, n]
                kept = jnp.take_along_axis(val, jnp.clip(newest, 0, T - 1)[:, None, :, None], axis=2)
                keep = (newest >= 0)[:, None, :, None]
            else:
                kept, keep, n = val, real[:, None, :, None], T
            cache[f"layers.{i}.{name}"] = c.at[:, :, :n].set(jnp.where(keep, kept.astype(c.dtype), c[:, :, :n]))
        x = residual_layer(p, cfg, x, attn, knockout, dense_experts=True)
    last_x = x[jnp.arange(B), lengths - 1]
    return head(params, cfg, last_x, knockout), rms_norm(last_x, params["final_norm"], cfg.rms_eps), cache


def prefill(params: dict, cfg: ModelConfig, tokens, cache: dict, lengths=None, return_hidden: bool = False):
    """Run the prompts ``tokens [B, T]`` (positions 0..T-1) and fill ``cache``.

    ``lengths [B]`` (default: all T): user b's prompt is ``tokens[b, :lengths[b]]``, right-padded to T.
    Padding changes nothing: the causal mask keeps it out of every real position, it is never written
    to the cache (a sliding layer keeps each user's own last ``sliding_window`` positions), and its
    ids are not read (any value will do). Returns (logits [B, V] float32 of each user's last prompt
    position, ``lengths[b] - 1``; the cache). The cache passed in is donated: use the returned one.
    The cache may be padded (``init_cache(multiple=...)``). A quantized tree computes with its float tree
    (:func:`float_params`). ``return_hidden``: (logits, the final-normed hidden state of each user's last prompt
    position [B, H], cache), what Gemma 4's assistant drafts from.
    """
    cfg.check_runnable(engine="reference")
    t = np.asarray(tokens)
    if t.ndim != 2 or t.shape[1] == 0:
        raise ValueError(f"tokens must be [batch, length] with length >= 1, got shape {t.shape}")
    B, T = t.shape
    if cache_batch(cache) != B:
        raise ValueError(f"tokens are for {B} users but the cache holds {cache_batch(cache)}")
    if lengths is None:
        lengths = np.full(B, T, np.int64)
    else:
        lengths = np.asarray(lengths)
        if lengths.shape != (B,) or (lengths.size and not np.issubdtype(lengths.dtype, np.integer)):
            raise ValueError(f"lengths must be {B} integers (one per user), got {lengths.tolist()!r}")
        for b, n in enumerate(lengths.tolist()):
            if not 1 <= n <= T:
                raise ValueError(f"length {n} of user {b} is outside 1..{T} (the tokens' length)")
    # Only the real tokens are checked; padding is replaced by id 0 (never read into anything kept).
    real = np.arange(T)[None, :] < lengths[:, None]
    check_tokens(cfg, t[real])
    cap = cache_capacity(cfg, cache)
    if cap is not None:
        for b, n in enumerate(lengths.tolist()):
            if n > cap:
                raise ValueError(
                    f"prompt of {n} tokens for user {b} is longer than the cache ({cap} positions); "
                    "make the cache with a larger max_len"
                )
    Tmax = int(lengths.max())  # columns past every prompt are padding only
    t = np.where(real, t, 0)[:, :Tmax].astype(np.int32)
    logits, hidden, cache = _prefill(
        float_params(params, cfg), cfg, jnp.asarray(t), jnp.asarray(lengths, jnp.int32), cache
    )
    return (logits, hidden, cache) if return_hidden else (logits, cache)


def _attention(p, cfg: ModelConfig, t: str, h, positions, mask, knockout):
    """A layer's attention over its own rows (prefill's form) for the normed stream ``h [B, T, H]`` with ``mask [T,
    T]``: (the o-projected output [B, T, H], what its cache keeps of the rows: ``{name: [B, heads, T, dim]}``)."""
    if cfg.latent_attention is not None:
        q, written = mla.project(p, cfg, h, positions, knockout)
        return mla.attend_expanded(p, cfg, q, written["latent"], written["rope_k"], mask) @ p["o"], written
    q, k, v = qkv(p, cfg, t, h, positions, knockout)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, kv, T, hd]
    return biased(p, "o", attend(q, k, v, mask, cfg.score_scale(t), p.get("sinks"))), {"k": k, "v": v}


# Routing ------------------------------------------------------------------------------------------
def routed_experts(params: dict, cfg: ModelConfig, tokens) -> np.ndarray:
    """The experts each position of the token streams ``tokens [B, T]`` routes to in every layer: int32
    ``[layers, B, T, top_k]``, by :func:`route` on the residual stream of one causal pass (prefill's
    masks, no cache); -1 in a dense layer (DeepSeek-V3's first). Position p's routes are those the decode step
    that reads token p takes (the same arithmetic; summed in another order, so a near tie in the top-k may rarely
    break the other way)."""
    if not cfg.is_moe:
        raise ValueError(f"{cfg.name} is a dense model: it routes to no experts")
    cfg.check_runnable(engine="reference")
    t = check_tokens(cfg, tokens)
    if t.ndim != 2 or t.size == 0:
        raise ValueError(f"tokens must be [batch, length] with both >= 1, got shape {t.shape}")
    return np.asarray(_routed_experts(float_params(params, cfg), cfg, jnp.asarray(t, jnp.int32)))


@partial(jax.jit, static_argnames=("cfg",))
def _routed_experts(params, cfg: ModelConfig, tokens):
    B, T = tokens.shape
    knockout = frozenset()
    positions = jnp.arange(T, dtype=jnp.int32)
    causal = positions[None, :] <= positions[:, None]
    window = positions[None, :] > positions[:, None] - cfg.sliding_window
    x = embed(params, cfg, tokens)
    ids = []
    for i, t in enumerate(cfg.layer_types):
        p = layer_params(params, i)
        h = rms_norm(x, p["input_norm"], cfg.rms_eps)
        attn, _ = _attention(p, cfg, t, h, positions, causal & window if t == SLIDING else causal, knockout)
        if not cfg.is_moe_layer(i):
            ids.append(jnp.full((B, T, cfg.top_k), -1, jnp.int32))
        else:
            # the stream after attention, as _layer wires it, and what the router reads of it
            routed = x + (rms_norm(attn, p["post_attn_norm"], cfg.rms_eps) if cfg.sandwich_norms else attn)
            h = router_input(p, cfg, routed.reshape(B * T, -1), knockout)
            ids.append(route(p, cfg, h, knockout)[1].reshape(B, T, cfg.top_k))
        x = residual_layer(p, cfg, x, attn, knockout, dense_experts=True)
    return jnp.stack(ids)


# Decode -------------------------------------------------------------------------------------------
PREPARED = "prepared"  # marks a tree in the decode layout (its value, None, holds no arrays)


def is_quantized(params: dict) -> bool:
    """Whether ``params`` holds INT8 weights or their scales (mk.quant), or a shipped format's (mk.format_trees): is
    not a plain float tree."""
    return any(k.endswith((SCALE_SUFFIX, FSCALE_SUFFIX)) for k in params) or any(
        getattr(v, "dtype", None) == jnp.int8 for v in params.values()
    )


def _traced(params: dict) -> bool:
    return any(isinstance(v, jax.core.Tracer) for v in params.values())


def _kept_for_last_tree(kept: dict, params: dict, cfg: ModelConfig, make):
    """``make(params, cfg)``, made once for the last tree seen: ``kept`` maps (cfg, the ids of the tree's arrays) to
    (the arrays, held so their ids stay theirs; what was made)."""
    key = (cfg, tuple(id(v) for v in params.values()))
    if key not in kept:
        kept.clear()
        kept[key] = (tuple(params.values()), make(params, cfg))
    return kept[key][1]


_dequantized: dict = {}  # (cfg, ids of the quantized tree's arrays) -> (the arrays, kept; its float tree)


def float_params(params: dict, cfg: ModelConfig) -> dict:
    """The float tree the reference computes with: ``params`` itself when it is a float tree (or a prepared
    one), else ``mk.quant.dequantize(params, cfg)`` (every INT8 matrix as codes x scale in float32, rounded
    to the embedding's dtype; a tree that matches no scheme is refused). The dequantized tree is made once
    and kept for the last quantized tree seen (keyed by its arrays' ids), so prefill and every decode step
    share it; a quantized tree traced by someone's jit is dequantized inside it."""
    if PREPARED in params or not is_quantized(params):
        return params
    if _traced(params):
        return dequantize(params, cfg)
    return _kept_for_last_tree(_dequantized, params, cfg, dequantize)


EXPERT_LAYOUTS = ("split", "stacked")


def expert_layout(backend: str | None = None) -> str:
    """How :func:`prepare` lays the experts out for ``backend`` (default: JAX's): ``"stacked"`` on a TPU, whose XLA
    reads each routed expert's slice in place in a straight-line program, where the split layout's loop of conditionals
    over E branches cost 1-4 ms a step more than the experts' bytes on a v5e (data/measured/tpu.csv, its 26B-A4B rows
    first measured); ``"split"``, E arrays, elsewhere: a CPU's XLA copies a dynamic slice of an ``[E, ...]`` array
    (~1.5 GB/s) before a dot reads it (a GPU's is not measured stacked)."""
    return "stacked" if (backend or jax.default_backend()) == "tpu" else "split"


def prepare(params: dict, cfg: ModelConfig, experts: str | None = None) -> dict:
    """The decode step's layout of a parameter tree, made once at load time: every layer matrix transposed to
    ``[out, in]`` (see :func:`matmul_t`), every expert matrix ``[intermediate, hidden]`` (gate and up ``[out, in]``,
    down kept ``[in, out]``): a TPU's program (XLA for a v5e) otherwise lays every expert's ``[hidden, intermediate]``
    down matrix out anew at every step, all of them, whichever were routed (:func:`mk.profiling.hlo.relayouts`).
    ``experts`` (:func:`expert_layout`'s, by default): ``"split"`` makes each expert its own array (tuples of E),
    ``"stacked"`` keeps them ``[E, ...]`` (see :func:`experts_gathered`). The embedding, the vectors and stacked down
    matrices are shared with ``params``; the other layer weights are a second copy, held beside ``params`` (which
    prefill reads). A quantized tree is dequantized first (:func:`float_params`): the layout is always float. ``cfg``
    is the engine interface's (mk.generate); the layout follows from the arrays. A prepared tree is returned as is.
    """
    if PREPARED in params:
        return params
    experts = experts or expert_layout()
    if experts not in EXPERT_LAYOUTS:
        raise ValueError(f"experts must be one of {EXPERT_LAYOUTS}, got {experts!r}")
    params = float_params(params, cfg)
    out = {PREPARED: None}
    for path, a in params.items():
        if path.endswith("_bias"):  # vectors, or gpt-oss's experts' [E, ...] biases: kept as they are
            pass
        elif path.startswith("layers.") and a.ndim == 3:
            transposed = not path.endswith("expert_down")
            a = _split(a, transposed) if experts == "split" else _swap_last(a) if transposed else a
        elif path.startswith("layers.") and a.ndim == 2:
            a = _transpose(a)
        out[path] = a
    return out


@partial(jax.jit, static_argnames="transposed")
def _split(a, transposed: bool):
    """``a [E, in, out]`` as E arrays, ``[out, in]`` where ``transposed`` else ``[in, out]``: one compiled program per
    shape."""
    return tuple(a[e].T if transposed else a[e] for e in range(a.shape[0]))


_swap_last = jax.jit(partial(jnp.swapaxes, axis1=1, axis2=2))
_transpose = jax.jit(jnp.transpose)
_prepared: dict = {}  # (cfg, ids of the tree's arrays) -> (the arrays, kept so the ids stay theirs; prepared)


def prepared(params: dict, cfg: ModelConfig) -> dict:
    """:func:`prepare` of ``params``, kept for the last tree seen (keyed by its arrays' ids; a quantized
    tree's float tree is made on a miss only, so a cached step pays nothing for it). A plain tree traced by
    someone's jit is prepared inside it: right, but the re-layout is then in every step."""
    if PREPARED in params or _traced(params):
        return prepare(params, cfg)
    return _kept_for_last_tree(_prepared, params, cfg, prepare)


def forget_prepared() -> None:
    """Drop the decode layout and the dequantized tree kept for the last tree seen (and the device memory
    they hold): before other work needs that memory."""
    _prepared.clear()
    _dequantized.clear()


def write_slots(c, val, slot):
    """``c [B, kv, S, hd]`` with user b's ``val[b] [kv, 1, hd]`` written at slot ``slot[b]``: a
    dynamic-update-slice per user (one in-place scatter of B rows)."""
    return jax.vmap(lambda cb, vb, sb: jax.lax.dynamic_update_slice_in_dim(cb, vb, sb, axis=1))(c, val, slot)


@partial(jax.jit, static_argnames=("cfg", "knockout", "activation_dtype"), donate_argnames=("cache",))
def decode_step_program(
    params, cfg: ModelConfig, cache, tokens, pos, knockout: frozenset, activation_dtype: str | None = None
):
    """:func:`decode_step`'s compiled program: ``params`` in :func:`prepare`'s layout, ``tokens`` and ``pos``
    int32 ``[B]`` device arrays, nothing checked (what an ahead-of-time compile lowers)."""
    B = tokens.shape[0]
    pos = jnp.broadcast_to(jnp.asarray(pos, jnp.int32), (B,))  # a shared position, or each user's own
    mm = matmul_t if activation_dtype is None else activations_rounded(activation_dtype)
    x, cache = _decode_rows(params, cfg, cache, tokens[:, None], pos, knockout, mm)
    return head(params, cfg, x[:, 0], knockout, mm), cache


@partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def verify_step_program(params, cfg: ModelConfig, cache, tokens, pos):
    """:func:`verify_step`'s compiled program: ``tokens [B, T]``, ``pos [B]`` int32 device arrays, nothing checked.
    Returns (the target's greedy picks [B, T] int32, the final-normed hidden states [B, T, H], the cache)."""
    knockout = frozenset()
    B, T = tokens.shape
    x, cache = _decode_rows(params, cfg, cache, tokens, pos, knockout)
    logits = head(params, cfg, x.reshape(B * T, -1), knockout).reshape(B, T, -1)
    hidden = rms_norm(x, params["final_norm"], cfg.rms_eps)
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), hidden, cache


def _decode_rows(params, cfg: ModelConfig, cache, tokens, pos, knockout: frozenset, mm=matmul_t):
    """The residual stream after the last layer for ``tokens [B, T]``, user b's row j at position ``pos[b] + j``,
    each row's K/V written at its slot first (``(pos + j) % slots``) and each row attending to what it sees
    (:func:`visible`: its own and earlier rows among them); the updated cache. ``mm``: every product with a weight
    matrix (:func:`matmul_t`, or its activations rounded first: mk.blocks.activations_rounded)."""
    B, T = tokens.shape
    x = fed(embed(params, cfg, tokens), mm)  # [B, T, H]: scaled and stored as a kernel stores it, where mm rounds
    positions = pos[:, None] + jnp.arange(T, dtype=jnp.int32)  # [B, T]
    cache = dict(cache)
    for i, t in enumerate(cfg.layer_types):
        p = layer_params(params, i)
        attn = None
        if attention_component(t) not in knockout:
            h = rms_norm(x, p["input_norm"], cfg.rms_eps, NORMS not in knockout)
            if cfg.latent_attention is not None:
                q, written = mla.project(p, cfg, h, positions, knockout, mm)
            else:
                q, k, v = qkv(p, cfg, t, h, positions, knockout, mm)
                written = {"k": k.transpose(0, 2, 1, 3), "v": v.transpose(0, 2, 1, 3)}  # [B, kv, T, hd]
            S = layer_slots(cache, i)
            for name, val in written.items():
                c = cache[f"layers.{i}.{name}"]
                val = val.astype(c.dtype)
                for j in range(T):
                    c = write_slots(c, val[:, :, j : j + 1], (pos + j) % S)
                cache[f"layers.{i}.{name}"] = c
            held = held_positions(positions[:, -1:], S)  # [B, S]
            mask = visible(held[:, None, :], positions[:, :, None], cfg, t)  # [B, T, S]
            if cfg.latent_attention is not None:
                lc, rc = cache[f"layers.{i}.latent"], cache[f"layers.{i}.rope_k"]
                attn = mla.attend_absorbed(p, cfg, q, lc, rc, mask[:, None], mm)
            else:
                kc, vc = cache[f"layers.{i}.k"], cache[f"layers.{i}.v"]
                scale, sinks = cfg.score_scale(t), p.get("sinks")
                if T == 1:
                    attn = attend_one(q, kc, vc, mask[:, 0], scale, sinks, mm)
                else:
                    attn = attend(q, kc, vc, mask[:, None, None], scale, sinks, mm)
            attn = biased(p, "o", attn, mm)
        x = residual_layer(p, cfg, x, attn, knockout, dense_experts=False, mm=mm)
    return x, cache


def verify_step(params: dict, cfg: ModelConfig, cache: dict, tokens, pos):
    """Speculative verification: ``tokens [B, T]`` (each user's last token and its T - 1 drafts) through one
    pass, user b's row j at position ``pos[b] + j``; every row's K/V is written, so those of rejected drafts stay
    in the cache, hidden by position (:func:`visible`) until overwritten (the sliding ring has room for them:
    ``init_cache(draft_tokens=T - 1)``). Returns (the greedy pick after each row [B, T] int32, the final-normed
    hidden states [B, T, H] (what Gemma 4's assistant reads), the cache). The cache passed in is donated."""
    cfg.check_runnable(engine="reference")
    return verify_step_program(
        prepared(params, cfg), cfg, cache, jnp.asarray(tokens, jnp.int32), jnp.asarray(pos, jnp.int32)
    )


def decode_step(
    params: dict, cfg: ModelConfig, cache: dict, tokens, pos, knockout=frozenset(), activation_dtype: str | None = None
):
    """Decode one token per user: ``tokens [B]``, user b's at position ``pos[b]``.

    ``pos``: an int (every user at that position) or ``[B]`` ints (each user its own); inside it is
    always a ``[B]`` int32 vector. User b's new K/V are written at its own slot (``pos[b] % slots``),
    rotated at its own position, and it attends to its own positions ``<= pos[b]`` (the last
    ``sliding_window`` of them in sliding layers). Returns
    (logits [B, V] float32, the cache). One compiled XLA program per (cfg, knockout, shapes), whatever
    the positions. The cache passed in is donated: use the returned one.
    ``params`` is mk's tree, float or quantized (its :func:`prepare` layout, float, is made on the first
    call and kept for that tree) or that layout itself.
    Token ids and positions given as Python / NumPy values are checked; device arrays are not (that
    would wait for the device every step). ``activation_dtype`` (``"bfloat16"``): every product with a weight matrix
    rounds its activations to it first, as the megakernel's bf16 step feeds its matrix unit (a reference that rounds
    where the kernel does: mk.megakernel.parity).
    """
    cfg.check_runnable(engine="reference")
    knockout = check_knockout(knockout)
    if isinstance(tokens, (list, tuple, np.ndarray)):
        tokens = check_tokens(cfg, tokens)
    B = cache_batch(cache)
    if isinstance(pos, (int, np.integer, list, tuple, np.ndarray)):
        pos = np.broadcast_to(check_positions(cfg, cache, pos), (B,))
    elif jnp.ndim(pos) == 0:
        pos = jnp.broadcast_to(jnp.asarray(pos, jnp.int32), (B,))
    # pos is [B] either way: one program for a shared position and for each user's own
    return decode_step_program(
        prepared(params, cfg), cfg, cache, jnp.asarray(tokens, jnp.int32), jnp.asarray(pos, jnp.int32), knockout,
        activation_dtype,
    )  # fmt: skip


def check_positions(cfg: ModelConfig, cache: dict, pos) -> np.ndarray:
    """Concrete decode positions as int32 (a scalar or one per user), each inside the cache."""
    p = np.asarray(pos)
    B = cache_batch(cache)
    if p.size and not np.issubdtype(p.dtype, np.integer):
        raise ValueError(f"positions must be integers, got dtype {p.dtype}")
    if p.ndim > 1 or (p.ndim == 1 and p.shape[0] != B):
        raise ValueError(f"pos must be one position or one per user ({B} users), got shape {p.shape}")
    cap = cache_capacity(cfg, cache)
    for b, q in enumerate(p.reshape(-1).tolist()):
        if q < 0 or (cap is not None and q >= cap):
            who = f" of user {b}" if p.ndim else ""
            inside = f"0..{cap - 1}" if cap is not None else "0.."
            raise ValueError(f"position {q}{who} is outside the cache ({inside}); make a larger cache")
    return p.astype(np.int32)


# Engines may offer ``step.prepare(params, cfg)``: the layout their step runs on, made once at load
# time (mk.measure prepares before timing, so the timed program holds no re-layout), and ``step.verify``, speculative
# verification (mk.generate.generate_speculative).
decode_step.prepare = prepared  # the knock-out variants and the timed calls share one layout
decode_step.verify = verify_step
