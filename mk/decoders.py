"""Decoders beyond the Gemma 4 presets, read from a Hugging Face ``config.json``: every tensor with its shape and
component, each layer's attention (window, KV heads or MLA latent) and feed-forward (dense or routed experts).

One description for the families people serve: Gemma 2, 3 and 4 text; Llama 3.x; Qwen3 and Qwen3-MoE; Mixtral;
gpt-oss (alternating sliding attention, attention sinks, biased experts); DeepSeek-V3 / Kimi K2 (MLA attention
with a compressed KV cache, shared plus routed experts, dense first layers). The tensor list follows the model
as transformers builds it, so its parameter count is transformers' own (tests/test_decoders.py). A
``model_type`` outside these, or a config field that changes the architecture in a way the family's
description does not model, is refused with the field named.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from .config import FULL, PRESETS, SLIDING, ModelConfig, from_hf_dict, get_config, is_hub_id, read_config_json
from .params import (
    EMBED,
    EXPERTS,
    HEAD,
    NORMS,
    ROUTER,
    SHARED_MLP,
    ParamSpec,
    attention_component,
    param_specs,
)


@dataclass(frozen=True)
class Layer:
    """One decoder layer as a decode step reads it."""

    attention: str  # SLIDING or FULL
    window: int | None  # positions a sliding layer attends to (None: the whole context)
    cache_per_position: int  # KV-cache elements one position adds (K and V, or MLA's latent and RoPE key)
    experts: int = 0  # routed experts (0: a dense feed-forward)
    top_k: int = 0


@dataclass(frozen=True)
class Decoder:
    """A decoder's structure: its layers and every tensor (``[in, out]`` shapes, as in mk.params)."""

    name: str
    family: str
    vocab_size: int
    hidden_size: int
    tied: bool
    layers: tuple[Layer, ...]
    specs: tuple[ParamSpec, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def is_moe(self) -> bool:
        return any(layer.experts for layer in self.layers)

    @property
    def num_experts(self) -> int:
        """Routed experts of an MoE layer (0 for a dense model)."""
        return max(layer.experts for layer in self.layers)

    @property
    def top_k(self) -> int:
        return max(layer.top_k for layer in self.layers)

    def layer_of(self, spec: ParamSpec) -> Layer:
        """The layer a tensor of ``specs`` belongs to (``layers.{i}.``)."""
        return self.layers[int(spec.path.split(".")[1])]

    def count_params(self) -> int:
        """Every parameter, a tied embedding counted once (as ``model.parameters()`` does)."""
        return sum(s.size for s in self.specs)

    def count_active_params(self) -> int:
        """Parameters read for one token: top-k of each MoE layer's routed experts, one row of an untied
        embedding; a tied embedding is read whole, as the head."""
        total = 0
        for s in self.specs:
            if s.component == EXPERTS:
                layer = self.layer_of(s)
                total += s.size // layer.experts * layer.top_k
            elif s.component == EMBED:
                total += self.hidden_size
            else:
                total += s.size
        return total


ModelLike = str | Path | ModelConfig | Decoder  # what get_decoder takes: a preset, a config path, a hub id, ...

# Fields that do not change what a decode step reads (token ids, training, numerics, bookkeeping), for every family.
_NEUTRAL = {
    "architectures",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "initializer_range",
    "attention_dropout",
    "hidden_act",
    "hidden_activation",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "pretraining_tp",
    "output_router_logits",
    "router_aux_loss_coef",
    "router_jitter_noise",
    "router_z_loss_coef",
    "tie_word_embeddings",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "name_or_path",
    "_name_or_path",
    "quantization_config",
    "auto_map",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "id2label",
    "label2id",
    "problem_type",
    "tokenizer_class",
    "bos_token",
    "eos_token",
    "query_pre_attn_scalar",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "partial_rotary_factor",
    "layer_types",
    "sliding_window",
    "use_bidirectional_attention",
    "cache_implementation",
    "num_nextn_predict_layers",
    "initializer_factor",
    "rope_local_base_freq",
    "norm_topk_prob",
    "routed_scaling_factor",
    "scoring_func",
    "topk_method",
    "n_group",
    "topk_group",
    "aux_loss_alpha",
    "seq_aux",
    "ep_size",
    "swiglu_limit",
    "rope_interleave",
    "sliding_window_pattern",
    "_sliding_window_pattern",
    "qkv_bias",
}
# Per family: the architectural fields its description models (beyond the common ones above).
_FIELDS = {
    "llama": {"attention_bias", "mlp_bias"},
    "qwen3": {"attention_bias", "use_sliding_window", "max_window_layers"},
    "qwen3_moe": {
        "attention_bias", "use_sliding_window", "max_window_layers", "num_experts", "num_local_experts",
        "num_experts_per_tok",
        "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
    },
    "mixtral": {"num_local_experts", "num_experts_per_tok"},
    "gpt_oss": {"attention_bias", "num_local_experts", "num_experts_per_tok", "experts_per_token"},
    "deepseek_v3": {
        "attention_bias", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
        "qk_head_dim", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
        "first_k_dense_replace", "moe_layer_freq",
    },
    "gemma2": set(),
    "gemma3_text": set(),
}  # fmt: skip
_TIED_BY_DEFAULT = {"gemma2", "gemma3_text"}
FAMILIES = (*_FIELDS, "gemma4_text")


def _check_fields(d: dict, family: str) -> None:
    unknown = sorted(set(d) - _NEUTRAL - _FIELDS[family])
    if unknown:
        raise ValueError(
            f"{family} config field(s) {unknown} are not modelled by mk.decoders; remove them if they do not change "
            f"the architecture, or add them to the {family} description"
        )


def _windows(d: dict, family: str, n: int) -> list[int | None]:
    """Each layer's sliding window (None: full attention), as transformers' config class derives it."""
    window = d.get("sliding_window")
    if "layer_types" in d and d["layer_types"] is not None:
        types = d["layer_types"]
        bad = sorted({t for t in types if t not in ("sliding_attention", "full_attention")})
        if bad or len(types) != n:
            raise ValueError(f"layer_types must list {n} entries of sliding_attention / full_attention, got {types}")
        return [window if t == "sliding_attention" else None for t in types]
    if family in ("gemma2", "gpt_oss"):  # alternating, the first layer sliding
        return [window if (i + 1) % 2 else None for i in range(n)]
    if family == "gemma3_text":
        period = d.get("sliding_window_pattern", 6)
        return [window if (i + 1) % period else None for i in range(n)]
    if family in ("qwen3", "qwen3_moe"):
        if not d.get("use_sliding_window", False) or window is None:
            return [None] * n
        first = d.get("max_window_layers", n)
        return [window if i >= first else None for i in range(n)]
    if family == "mixtral":
        return [window] * n
    return [None] * n


def _mlp(p: str, H: int, inner: int, component: str, bias: bool = False) -> list[ParamSpec]:
    specs = [
        ParamSpec(p + "gate", (H, inner), component, True),
        ParamSpec(p + "up", (H, inner), component, True),
        ParamSpec(p + "down", (inner, H), component, True),
    ]
    if bias:
        specs += [
            ParamSpec(p + n + "_bias", (s,), component, False) for n, s in (("gate", inner), ("up", inner), ("down", H))
        ]
    return specs


def from_hf_config(d: dict, name: str = "hf") -> Decoder:
    """A Decoder from a Hugging Face config dict (a multimodal config's ``text_config`` is used)."""
    if "text_config" in d:
        d = d["text_config"]
    family = d.get("model_type")
    if family in ("gemma4_text", "gemma4"):
        return _gemma4(d, name)
    if family == "gemma3":
        family = "gemma3_text"
    if family not in _FIELDS:
        raise ValueError(f"unsupported model_type {family!r}; supported families: {', '.join(FAMILIES)}")
    _check_fields(d, family)
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads") if k not in d]
    if missing:
        raise ValueError(f"{family} config is missing {missing}")
    H, n, nh = d["hidden_size"], d["num_hidden_layers"], d["num_attention_heads"]
    kv = d.get("num_key_value_heads") or nh
    hd = d.get("head_dim") or H // nh
    tied = d.get("tie_word_embeddings", family in _TIED_BY_DEFAULT)
    windows = _windows(d, family, n)
    bias = bool(d.get("attention_bias", family == "gpt_oss"))
    specs = [ParamSpec("embed", (d["vocab_size"], H), HEAD if tied else EMBED, True)]
    layers = []
    for i in range(n):
        p = f"layers.{i}."
        kind = SLIDING if windows[i] is not None else FULL
        att = attention_component(kind)
        specs.append(ParamSpec(p + "input_norm", (H,), NORMS, False))
        if family == "deepseek_v3":
            cache, attn = _mla(d, p, H, nh, att)
        else:
            cache = 2 * kv * hd
            attn = [
                ParamSpec(p + "q", (H, nh * hd), att, True),
                ParamSpec(p + "k", (H, kv * hd), att, True),
                ParamSpec(p + "v", (H, kv * hd), att, True),
                ParamSpec(p + "o", (nh * hd, H), att, True),
            ]
            if bias:
                attn += [ParamSpec(p + f"{m}_bias", (s,), att, False) for m, s in
                         (("q", nh * hd), ("k", kv * hd), ("v", kv * hd), ("o", H))]  # fmt: skip
            if family in ("qwen3", "qwen3_moe", "gemma3_text"):
                attn += [ParamSpec(p + "q_norm", (hd,), NORMS, False), ParamSpec(p + "k_norm", (hd,), NORMS, False)]
            if family == "gpt_oss":
                attn.append(ParamSpec(p + "sinks", (nh,), att, False))
        specs += attn
        specs.append(ParamSpec(p + "post_attn_norm", (H,), NORMS, False))
        if family in ("gemma2", "gemma3_text"):
            specs += [
                ParamSpec(p + "pre_ffn_norm", (H,), NORMS, False),
                ParamSpec(p + "post_ffn_norm", (H,), NORMS, False),
            ]
        experts, top_k, ffn = _ffn(d, family, i, p, H)
        specs += ffn
        layers.append(Layer(kind, windows[i], cache, experts, top_k))
    specs.append(ParamSpec("final_norm", (H,), NORMS, False))
    if not tied:
        specs.append(ParamSpec("head", (d["vocab_size"], H), HEAD, True))
    return Decoder(name, family, d["vocab_size"], H, tied, tuple(layers), tuple(specs))


def _mla(d: dict, p: str, H: int, nh: int, att: str) -> tuple[int, list[ParamSpec]]:
    """DeepSeek's multi-head latent attention: the cache holds one compressed latent and one RoPE key a position."""
    need = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    missing = [k for k in need if not d.get(k)]
    if missing:
        raise ValueError(f"deepseek_v3 config is missing MLA field(s) {missing}")
    lora, rope, nope, v = (d[k] for k in need)
    q_rank = d.get("q_lora_rank")
    if q_rank:
        specs = [
            ParamSpec(p + "q_a", (H, q_rank), att, True),
            ParamSpec(p + "q_a_norm", (q_rank,), NORMS, False),
            ParamSpec(p + "q_b", (q_rank, nh * (nope + rope)), att, True),
        ]
    else:
        specs = [ParamSpec(p + "q", (H, nh * (nope + rope)), att, True)]
    specs += [
        ParamSpec(p + "kv_a", (H, lora + rope), att, True),
        ParamSpec(p + "kv_a_norm", (lora,), NORMS, False),
        ParamSpec(p + "kv_b", (lora, nh * (nope + v)), att, True),
        ParamSpec(p + "o", (nh * v, H), att, True),
    ]
    return lora + rope, specs


def _ffn(d: dict, family: str, i: int, p: str, H: int) -> tuple[int, int, list[ParamSpec]]:
    """Layer ``i``'s feed-forward: (routed experts, top-k, tensors)."""
    dense = d.get("intermediate_size")
    if family in ("llama", "qwen3", "gemma2", "gemma3_text"):
        return 0, 0, _mlp(p + "mlp_", H, dense, SHARED_MLP, bias=family == "llama" and bool(d.get("mlp_bias")))
    if family == "qwen3_moe":
        E, I = d.get("num_experts", d.get("num_local_experts")), d["moe_intermediate_size"]
        step = d.get("decoder_sparse_step", 1)
        sparse = E > 0 and i not in (d.get("mlp_only_layers") or []) and (i + 1) % step == 0
        shared, bias = 0, False
    elif family == "mixtral":
        E, I, sparse, shared, bias = d["num_local_experts"], dense, True, 0, False
    elif family == "gpt_oss":
        E, I, sparse, shared, bias = d["num_local_experts"], dense, True, 0, True
    else:  # deepseek_v3
        E, I = d["n_routed_experts"], d["moe_intermediate_size"]
        freq = d.get("moe_layer_freq", 1)
        sparse = E > 0 and i >= d.get("first_k_dense_replace", 0) and i % freq == 0
        shared, bias = (d.get("n_shared_experts") or 0) * I, False
    if not sparse:
        return 0, 0, _mlp(p + "mlp_", H, dense, SHARED_MLP)
    k = d.get("num_experts_per_tok") or d.get("experts_per_token")
    if not k or not 0 < k <= E:
        raise ValueError(f"{family} config needs 0 < num_experts_per_tok <= {E}, got {k}")
    specs = [ParamSpec(p + "router_proj", (H, E), ROUTER, True)]
    if bias or family == "deepseek_v3":  # DeepSeek's: a correction added to the scores to pick experts
        specs.append(ParamSpec(p + "router_bias", (E,), ROUTER, False))
    specs += [
        ParamSpec(p + "expert_gate", (E, H, I), EXPERTS, True),
        ParamSpec(p + "expert_up", (E, H, I), EXPERTS, True),
        ParamSpec(p + "expert_down", (E, I, H), EXPERTS, True),
    ]
    if bias:
        specs += [
            ParamSpec(p + "expert_gate_up_bias", (E, 2 * I), EXPERTS, False),
            ParamSpec(p + "expert_down_bias", (E, H), EXPERTS, False),
        ]
    if shared:
        specs += _mlp(p + "shared_", H, shared, SHARED_MLP)
    return E, k, specs


def _gemma4(d: dict, name: str) -> Decoder:
    return as_decoder(from_hf_dict(d, name))


@functools.cache
def as_decoder(cfg: ModelConfig) -> Decoder:
    """A Gemma 4 config (a preset, or one read by mk.config) as a Decoder: mk.config's own description, the
    one the reference and the kernel run."""
    layers = tuple(
        Layer(
            t,
            cfg.sliding_window if t == SLIDING else None,
            2 * cfg.kv_heads(t) * cfg.head_dim(t),  # K and V (a K=V layer's cache holds both, as mk.sol counts)
            cfg.num_experts,
            cfg.top_k,
        )
        for t in cfg.layer_types
    )
    return Decoder(cfg.name, "gemma4_text", cfg.vocab_size, cfg.hidden_size, True, layers, tuple(param_specs(cfg)))


def load_decoder(path: str | Path) -> Decoder:
    """A Decoder from ``config.json`` or the folder holding it (named after the folder)."""
    d, name = read_config_json(path)
    return from_hf_config(d, name=name)


def get_decoder(model: ModelLike) -> Decoder:
    """A model as a Decoder: a preset name (``python -m mk models``), a ``config.json`` or the folder holding it
    (a checkpoint), or a hub id whose config is in the local Hugging Face cache (nothing is downloaded)."""
    if isinstance(model, Decoder):
        return model
    if isinstance(model, ModelConfig):
        return as_decoder(model)
    if str(model) in PRESETS:
        return as_decoder(get_config(str(model)))
    if Path(model).exists():
        return load_decoder(model)
    if is_hub_id(str(model)) and not str(model).startswith("."):  # owner/name, not a relative path
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(str(model), "config.json")
        if isinstance(cached, str):
            return from_hf_config(json.loads(Path(cached).read_text()), name=str(model))
    raise ValueError(
        f"unknown model {str(model)!r}: not a preset ({', '.join(PRESETS)}), not a config.json or a folder holding "
        "one, and not a hub id in the local Hugging Face cache (download it first, e.g. `hf download ID config.json`)"
    )
