"""How each family's Hugging Face checkpoint names and lays out mk's tensors: the one map (:func:`hf_tensor_map`)
mk.weights reads and writes checkpoints by, both ways, so a save and a load round-trip exactly.

Hugging Face stores Linear weights ``[out, in]``; Gemma 4 its experts as ``gate_up_proj [E, 2I, H]`` (gate rows
first) and ``down_proj [E, H, I]``, Qwen3-MoE, Mixtral and DeepSeek-V3 each expert's as its own Linear layers (what
transformers 5's save_pretrained writes of its fused experts, and the hub's checkpoints hold), gpt-oss its
experts ``[in, out]`` with gate and up interleaved on the last axis (``gate_up_proj [E, H, 2I]``: gate at even
columns, up at odd; ``gate_up_proj_bias [E, 2I]`` likewise) and ``down_proj [E, I, H]``; mk stores ``[in, out]``
(``mk.params``; gpt-oss's ``expert_gate_up_bias`` the gate's half first).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import GEMMA4, ModelConfig
from .params import param_specs, scales_inputs


@dataclass(frozen=True)
class HFTensor:
    """Where an mk tensor lives in a Hugging Face checkpoint and how it is laid out there.

    ``kind``: ``same`` (identical layout), ``linear`` (stored [out, in], transpose), ``gate``/``up``
    (rows :I / I: of ``gate_up_proj [E, 2I, H]``, then [E, H, I]), ``gate_i``/``up_i`` (the even / odd columns of
    gpt-oss's ``gate_up_proj [E, H, 2I]``), ``gate_up_bias_i`` (gpt-oss's interleaved ``gate_up_proj_bias
    [E, 2I]`` as mk's, the gate's half first), ``down`` (``[E, H, I]`` -> [E, I, H]),
    ``experts`` (one ``linear`` per expert, its name with ``{e}`` for the expert's index: the mk tensor
    ``[E, in, out]`` is their transposes stacked). ``names`` lists the accepted suffixes after the text prefix,
    the current name first.
    """

    names: tuple[str, ...]
    kind: str
    in_text_model: bool = True  # under the text prefix (``model.``); an untied ``lm_head.weight`` is not


_LAYER_NAMES = {
    "input_norm": ("input_layernorm.weight", "same"),
    "q": ("self_attn.q_proj.weight", "linear"),
    "k": ("self_attn.k_proj.weight", "linear"),
    "v": ("self_attn.v_proj.weight", "linear"),
    "o": ("self_attn.o_proj.weight", "linear"),
    "q_norm": ("self_attn.q_norm.weight", "same"),
    "k_norm": ("self_attn.k_norm.weight", "same"),
    "post_attn_norm": ("post_attention_layernorm.weight", "same"),
    "pre_ffn_norm": ("pre_feedforward_layernorm.weight", "same"),
    "mlp_gate": ("mlp.gate_proj.weight", "linear"),
    "mlp_up": ("mlp.up_proj.weight", "linear"),
    "mlp_down": ("mlp.down_proj.weight", "linear"),
    "post_ffn_norm": ("post_feedforward_layernorm.weight", "same"),
    "layer_scalar": ("layer_scalar", "same"),
    "router_scale": ("router.scale", "same"),
    "router_proj": ("router.proj.weight", "linear"),
    "expert_scale": ("router.per_expert_scale", "same"),
    "pre_ffn_norm_2": ("pre_feedforward_layernorm_2.weight", "same"),
    "expert_gate": ("experts.gate_up_proj", "gate"),
    "expert_up": ("experts.gate_up_proj", "up"),
    "expert_down": ("experts.down_proj", "down"),
    "post_ffn_norm_1": ("post_feedforward_layernorm_1.weight", "same"),
    "post_ffn_norm_2": ("post_feedforward_layernorm_2.weight", "same"),
}
# The pre-norm families (Llama, Qwen3, Qwen3-MoE, Mixtral) where they differ from Gemma 4: the post-attention norm is
# their FFN's input norm, the router is the MoE block's ``gate``, each expert its own Linear layers (as the hub's
# checkpoints and transformers' save_pretrained store them).
_PRE_NORM_NAMES = {
    **_LAYER_NAMES,
    "pre_ffn_norm": ("post_attention_layernorm.weight", "same"),
    "router_proj": ("mlp.gate.weight", "linear"),
    "expert_gate": ("mlp.experts.{e}.gate_proj.weight", "experts"),
    "expert_up": ("mlp.experts.{e}.up_proj.weight", "experts"),
    "expert_down": ("mlp.experts.{e}.down_proj.weight", "experts"),
}
_MIXTRAL_NAMES = {
    **_PRE_NORM_NAMES,
    "router_proj": ("block_sparse_moe.gate.weight", "linear"),
    "expert_gate": ("block_sparse_moe.experts.{e}.w1.weight", "experts"),
    "expert_up": ("block_sparse_moe.experts.{e}.w3.weight", "experts"),
    "expert_down": ("block_sparse_moe.experts.{e}.w2.weight", "experts"),
}
# gpt-oss: the pre-norm names, biased attention with sinks, a biased router and biased experts stored [in, out].
_GPT_OSS_NAMES = {
    **_PRE_NORM_NAMES,
    **{f"{m}_bias": (f"self_attn.{m}_proj.bias", "same") for m in "qkvo"},
    "sinks": ("self_attn.sinks", "same"),
    "router_proj": ("mlp.router.weight", "linear"),
    "router_bias": ("mlp.router.bias", "same"),
    "expert_gate": ("mlp.experts.gate_up_proj", "gate_i"),
    "expert_up": ("mlp.experts.gate_up_proj", "up_i"),
    "expert_gate_up_bias": ("mlp.experts.gate_up_proj_bias", "gate_up_bias_i"),
    "expert_down": ("mlp.experts.down_proj", "same"),
    "expert_down_bias": ("mlp.experts.down_proj_bias", "same"),
}
# DeepSeek-V3 (and Kimi K2): MLA's projections, the router's correction bias; a dense layer's MLP is ``mlp.*``, an MoE
# layer's shared expert(s) ``mlp.shared_experts.*`` (one MLP of n_shared_experts times the experts' width).
_DEEPSEEK_NAMES = {
    **_PRE_NORM_NAMES,
    "q_a": ("self_attn.q_a_proj.weight", "linear"),
    "q_a_norm": ("self_attn.q_a_layernorm.weight", "same"),
    "q_b": ("self_attn.q_b_proj.weight", "linear"),
    "kv_a": ("self_attn.kv_a_proj_with_mqa.weight", "linear"),
    "kv_a_norm": ("self_attn.kv_a_layernorm.weight", "same"),
    "kv_b": ("self_attn.kv_b_proj.weight", "linear"),
    "router_bias": ("mlp.gate.e_score_correction_bias", "same"),
}
_SHARED_EXPERTS = {"mlp_gate": "gate_proj", "mlp_up": "up_proj", "mlp_down": "down_proj"}
_NAMES_OF = {GEMMA4: _LAYER_NAMES, "mixtral": _MIXTRAL_NAMES, "gpt_oss": _GPT_OSS_NAMES}
# Older exports keep the experts and the per-expert scale under ``.moe.``.
_OLDER = {
    "experts.gate_up_proj": "moe.gate_up_proj",
    "experts.down_proj": "moe.down_proj",
    "router.per_expert_scale": "moe.per_expert_scale",
}


def hf_tensor_map(cfg: ModelConfig) -> dict[str, HFTensor]:
    """For every mk path of ``cfg``, its Hugging Face name(s) (without the text prefix) and layout."""
    cfg.check_runnable(engine="reference")
    out = {"embed": HFTensor(("embed_tokens.weight",), "same"), "final_norm": HFTensor(("norm.weight",), "same")}
    if not cfg.tied_embeddings:
        out["head"] = HFTensor(("lm_head.weight",), "same", in_text_model=False)  # [V, H], as mk keeps it
    names_of = _DEEPSEEK_NAMES if cfg.latent_attention is not None else _NAMES_OF.get(cfg.family, _PRE_NORM_NAMES)
    for s in param_specs(cfg):
        if not s.path.startswith("layers."):
            continue
        _, i, short = s.path.split(".", 2)
        name, kind = names_of[short]
        if cfg.latent_attention is not None and short in _SHARED_EXPERTS and cfg.is_moe_layer(int(i)):
            name = f"mlp.shared_experts.{_SHARED_EXPERTS[short]}.weight"
        names = (f"layers.{i}.{name}",)
        if name in _OLDER:
            names += (f"layers.{i}.{_OLDER[name]}",)
        out[s.path] = HFTensor(names, kind)
    return out


def hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape the checkpoint stores for an mk tensor of ``shape``."""
    if kind == "linear":
        return shape[::-1]
    if kind in ("gate", "up"):
        E, H, I = shape
        return (E, 2 * I, H)
    if kind in ("gate_i", "up_i"):
        return shape[:-1] + (2 * shape[-1],)
    if kind == "down":
        E, I, H = shape
        return (E, H, I)
    return shape


def from_hf_layout(kind: str, a: np.ndarray) -> np.ndarray:
    """A checkpoint array as mk lays it out (a view; the caller copies once while casting)."""
    if kind == "linear":
        return a.T
    if kind in ("gate", "up"):
        half = a.shape[1] // 2
        part = a[:, :half] if kind == "gate" else a[:, half:]
        return part.transpose(0, 2, 1)
    if kind in ("gate_i", "up_i"):
        return a[..., 0::2] if kind == "gate_i" else a[..., 1::2]
    if kind == "gate_up_bias_i":
        return np.concatenate([a[..., 0::2], a[..., 1::2]], axis=-1)
    if kind == "down":
        return a.transpose(0, 2, 1)
    return a


def interleaved(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gpt-oss's layout of a gate and an up half on their last axis: gate at even positions, up at odd."""
    return np.stack([gate, up], axis=-1).reshape(*gate.shape[:-1], -1)


def hf_scale_shape(path: str, kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape the checkpoint stores the scales of mk matrix ``path`` of ``shape`` in: its HF shape ([..., out,
    in]) less the input axis (one scale per output row), or less the output axis for a down projection."""
    hf = hf_shape(kind, shape)
    if kind in ("same", "gate_i", "up_i"):  # stored [..., in, out] (gpt-oss's experts)
        return hf[:-1] if scales_inputs(path) else hf[:-2] + hf[-1:]
    return hf[:-2] + hf[-1:] if scales_inputs(path) else hf[:-1]


def scale_from_hf(kind: str, a: np.ndarray) -> np.ndarray:
    """A checkpoint's scales as mk keeps them (mk.quant): ``gate_up_proj``'s are split in halves."""
    if kind in ("gate", "up"):
        half = a.shape[-1] // 2
        return a[..., :half] if kind == "gate" else a[..., half:]
    if kind in ("gate_i", "up_i"):
        return a[..., 0::2] if kind == "gate_i" else a[..., 1::2]
    return a
