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

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from .config import SLIDING, ModelConfig, from_hf_dict, read_config_json
from .params import NORMS, layer_params, param_specs
from .progress import tqdm
from .reference import _layer, attend_one, embed, held_positions, rms_norm, rope

MODEL_TYPE = "gemma4_assistant"
# the attention weights a query-only layer has: no k/v projections, no k norm
_QUERY_ONLY_SKIP = ("k", "v", "k_norm")


@dataclass(frozen=True)
class AssistantConfig:
    """An assistant: its decoder (a Gemma 4 text config) and the hidden width of the target it was trained for."""

    decoder: ModelConfig
    backbone_hidden_size: int

    @property
    def name(self) -> str:
        return self.decoder.name

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """mk's tree of an assistant: the decoder's tree less every layer's k/v projections and k norm, plus the two
        projections (``[in, out]``, as mk stores matrices); ``embed`` is also the head."""
        out = {}
        for s in param_specs(self.decoder):
            if s.path.startswith("layers.") and s.path.rsplit(".", 1)[1] in _QUERY_ONLY_SKIP:
                continue
            out[s.path] = s.shape
        h, hb = self.decoder.hidden_size, self.backbone_hidden_size
        out["pre_projection"] = (2 * hb, h)
        out["post_projection"] = (h, hb)
        return out

    def weight_bytes(self, itemsize: int = 2) -> int:
        """Bytes of the weights one draft step reads: every tensor of :meth:`param_shapes`, the embedding table whole
        (it is the tied head)."""
        return sum(int(np.prod(s)) for s in self.param_shapes().values()) * itemsize


def assistant_config(d: dict, name: str = "assistant") -> AssistantConfig:
    """An :class:`AssistantConfig` from a ``gemma4_assistant`` config.json dict."""
    if d.get("model_type") != MODEL_TYPE:
        raise ValueError(
            f"config model_type is {d.get('model_type')!r}, not {MODEL_TYPE!r}: --assistant takes a Gemma 4 assistant "
            "checkpoint (Gemma4AssistantForCausalLM)"
        )
    if d.get("use_ordered_embeddings"):
        raise ValueError(
            f"assistant {name!r} uses ordered embeddings (a centroid-masked head), which mk does not implement: "
            "use an assistant with use_ordered_embeddings false"
        )
    if "text_config" not in d or "backbone_hidden_size" not in d:
        raise ValueError(f"assistant config {name!r} needs text_config and backbone_hidden_size")
    tc = dict(d["text_config"])
    shared = tc.pop("num_kv_shared_layers", tc.get("num_hidden_layers"))
    if shared != tc.get("num_hidden_layers"):
        raise ValueError(
            f"assistant {name!r}: num_kv_shared_layers={shared} but an assistant's every layer reads the target's K/V "
            f"(num_hidden_layers={tc.get('num_hidden_layers')})"
        )
    return AssistantConfig(from_hf_dict(tc, name=name), int(d["backbone_hidden_size"]))


def source_layers(target: ModelConfig) -> dict[str, int]:
    """The target's layer whose K/V the assistant reads, for each attention type: the last of that type."""
    return {t: max(i for i, u in enumerate(target.layer_types) if u == t) for t in set(target.layer_types)}


def check_pair(a: AssistantConfig, target: ModelConfig) -> None:
    """That ``a`` drafts for ``target``: the target's hidden width, vocabulary, and K/V shapes of every attention
    type the assistant has."""
    problems = []
    if a.backbone_hidden_size != target.hidden_size:
        problems.append(
            f"its backbone_hidden_size is {a.backbone_hidden_size}, the target's hidden size {target.hidden_size}"
        )
    if a.decoder.vocab_size != target.vocab_size:
        problems.append(f"its vocabulary has {a.decoder.vocab_size} tokens, the target's {target.vocab_size}")
    for t in sorted(set(a.decoder.layer_types)):
        if t not in target.layer_types:
            problems.append(f"it has {t} layers, the target none to read K/V from")
            continue
        mine, theirs = (a.decoder.kv_heads(t), a.decoder.head_dim(t)), (target.kv_heads(t), target.head_dim(t))
        if mine != theirs:
            problems.append(
                f"its {t} layers read {mine[0]} KV heads of {mine[1]}, the target has {theirs[0]} of {theirs[1]}"
            )
    if problems:
        raise ValueError(
            f"assistant {a.name!r} does not draft for {target.name!r}: "
            + "; ".join(problems)
            + ". Use the assistant released with this target"
        )


def load_assistant(path, target: ModelConfig, dtype=None) -> tuple[AssistantConfig, dict[str, jax.Array]]:
    """Load a Gemma 4 assistant checkpoint folder (or hub repo id) for ``target``: its config (checked against the
    target, :func:`check_pair`), then every tensor, each checked for presence and shape before any is read (all
    problems in one error), as mk's loader checks a target."""
    from .weights import _Checkpoint, _from_hf, _resolve, _safetensors_files, hf_tensor_map

    folder = _resolve(path)
    a = read_assistant_config(folder)
    check_pair(a, target)
    ckpt = _Checkpoint(_safetensors_files(folder))
    shapes = a.param_shapes()
    where = {p: ("model." + t.names[0], t.kind) for p, t in hf_tensor_map(a.decoder).items() if p in shapes}
    where.update(
        pre_projection=("pre_projection.weight", "linear"), post_projection=("post_projection.weight", "linear")
    )
    problems = []
    for path_, (name, kind) in where.items():
        if name not in ckpt.info:
            problems.append(f"missing {name} (for {path_})")
            continue
        stored = ckpt.info[name][0]
        want = tuple(reversed(shapes[path_])) if kind == "linear" else shapes[path_]
        if stored != want:
            problems.append(f"{name} has shape {list(stored)}, expected {list(want)} for this config")
    extra = sorted(set(ckpt.info) - {n for n, _ in where.values()} - {"lm_head.weight"})
    if extra:
        problems.append(f"unexpected tensors {extra[:8]}: the checkpoint has parts an assistant does not")
    if problems:
        raise ValueError(f"assistant checkpoint {folder} does not match its config ({len(problems)} problem(s)):\n  "
                         + "\n  ".join(problems))  # fmt: skip
    params = {}
    for path_, (name, kind) in tqdm(where.items(), desc=f"loading {folder.name}", leave=False):
        x = _from_hf(kind, ckpt.read(name))
        params[path_] = jnp.asarray(np.ascontiguousarray(x, dtype=dtype or x.dtype))
    return a, params


def assistant_step(params: dict, a: AssistantConfig, target: ModelConfig, target_embed, cache: dict, token, hidden,
                   pos):  # fmt: skip
    """One draft step for every user: ``token [B]`` at position ``pos [B]`` (not in ``cache``, the target's),
    ``hidden [B, target hidden]``. Returns (logits [B, V] float32, the next hidden [B, target hidden])."""
    cfg, ko = a.decoder, frozenset()
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
        x = _layer(p, cfg, x, attn, ko, dense_experts=False)
    hn = rms_norm(x[:, 0], params["final_norm"], cfg.rms_eps, NORMS not in ko)
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


def read_assistant_config(path) -> AssistantConfig:
    """An assistant's config from its folder (or config.json), no weights."""
    d, name = read_config_json(path)
    return assistant_config(d, name=name)
