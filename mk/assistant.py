"""Gemma 4's drafter, the "assistant" (transformers' ``Gemma4AssistantForCausalLM``, model type
``gemma4_assistant``), in plain JAX: a small Gemma 4 text stack with no KV cache of its own.

Each draft step, for a user whose last token t sits at position P (its K/V not yet in the target's cache):

- the input is ``pre_projection([embed_target(t), h])``: the target's scaled embedding of t beside a hidden
  state h of the target's width (first the target's final-normed hidden state that chose t, then the
  assistant's own ``post_projection`` of its last output);
- every layer is a Gemma 4 layer whose attention is query-only: q (its norm, RoPE at P) attends over the target's
  K/V of the last layer of its attention type, the positions before P (a sliding layer: the last W + 1 of them,
  W the window, as transformers' assistant reads them; the speculative cache's ring keeps one slot for it);
- the final norm, then the tied head picks the next draft, and ``post_projection`` gives the next h.

The position stays P for every draft of a round (as transformers' assisted generation keeps it). One difference
from transformers' loop, which changes only drafts, never the tokens emitted: after a partly accepted round
transformers also lets the assistant see the K/V the target wrote at P for the first rejected draft; here the
assistant sees exactly the positions before P.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from .assistant_config import AssistantConfig, source_layers
from .blocks import attend_one, embed, residual_layer, rms_norm, rope
from .config import SLIDING, ModelConfig
from .params import NORMS, layer_params
from .reference import held_positions


def assistant_step(params: dict, a: AssistantConfig, target: ModelConfig, target_embed, cache: dict, token, hidden,
                   pos):  # fmt: skip
    """One draft step for every user: ``token [B]`` at position ``pos [B]`` (not in ``cache``, the target's),
    ``hidden [B, target hidden]``. Returns (logits [B, V] float32, the next hidden [B, target hidden])."""
    cfg, knockout = a.decoder, frozenset()
    x = embed({"embed": target_embed}, target, token)
    x = jnp.concatenate([x, hidden.astype(x.dtype)], axis=-1) @ params["pre_projection"]
    x = x[:, None, :]  # [B, 1, H]
    src = source_layers(target)
    positions = pos[:, None]
    for i, t in enumerate(cfg.layer_types):
        p = layer_params(params, i)
        h = rms_norm(x, p["input_norm"], cfg.rms_eps)
        q = (h @ p["q"]).reshape(x.shape[0], 1, cfg.num_heads, cfg.head_dim(t))
        q = rope(rms_norm(q, p["q_norm"], cfg.rms_eps), positions, cfg, t)
        kc, vc = cache[f"layers.{src[t]}.k"], cache[f"layers.{src[t]}.v"]
        held = held_positions(positions - 1, kc.shape[2])
        # the positions before P; on a sliding layer the window's W and one more, as transformers' assistant reads
        mask = (held >= 0) & ((held >= positions - 1 - cfg.sliding_window) if t == SLIDING else True)
        attn = attend_one(q, kc, vc, mask, cfg.score_scale(t)) @ p["o"]
        x = residual_layer(p, cfg, x, attn, knockout, dense_experts=False)
    hn = rms_norm(x[:, 0], params["final_norm"], cfg.rms_eps, NORMS not in knockout)
    logits = jax.lax.dot_general(hn, params["embed"], (((1,), (1,)), ((), ()))).astype(jnp.float32)
    return logits, hn @ params["post_projection"]


@partial(jax.jit, static_argnames=("a", "target", "k"))
def draft(params: dict, a: AssistantConfig, target: ModelConfig, target_embed, cache: dict, token, hidden, pos, k: int):
    """``k`` drafts [B, k] int32 per user, each step's greedy pick fed to the next (:func:`assistant_step`)."""
    out = []
    for _ in range(k):
        logits, hidden = assistant_step(params, a, target, target_embed, cache, token, hidden, pos)
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        out.append(token)
    return jnp.stack(out, axis=1)
