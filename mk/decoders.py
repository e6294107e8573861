"""Any decoder's structure, read from a Hugging Face ``config.json``: every tensor with its shape and component,
each layer's attention (window, KV-cache elements a position) and feed-forward (dense or routed experts), for the
bytes a step reads (mk.sol) and parameter counts.

For the families mk.config describes (Gemma 2, 3 and 4, Llama 3, Qwen3, Qwen3-MoE, Mixtral, gpt-oss, DeepSeek-V3 /
Kimi K2) a Decoder is that description's view (:func:`as_decoder`: the tensors of mk.params, the ones the plan
streams). This module adds, for bytes and counts only, the variants of the pre-norm families mk.config refuses
(biased projections, Qwen3's sliding layers or dense layers between MoE ones, Mixtral's window). The
tensors follow the model as transformers builds it, so its parameter count is transformers' own
(tests/test_decoders.py). A ``model_type`` outside these, or a config field that changes the architecture in a way
the family's description does not model, is refused with the field named.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from .config import (
    FULL,
    GEMMA4,
    HF_FAMILIES,
    PRESETS,
    SLIDING,
    ModelConfig,
    UnsupportedVariant,
    check_fields,
    from_hf_dict,
    get_config,
    hf_config_of,
    unknown_model,
)
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


def _windows(d: dict, family: str, n: int) -> list[int | None]:
    """Each layer's sliding window (None: full attention), as transformers' config class derives it."""
    window = d.get("sliding_window")
    if "layer_types" in d and d["layer_types"] is not None:
        types = d["layer_types"]
        bad = sorted({t for t in types if t not in ("sliding_attention", "full_attention")})
        if bad or len(types) != n:
            raise ValueError(f"layer_types must list {n} entries of sliding_attention / full_attention, got {types}")
        return [window if t == "sliding_attention" else None for t in types]
    if family in ("qwen3", "qwen3_moe"):
        if not d.get("use_sliding_window", False) or window is None:
            return [None] * n
        first = d.get("max_window_layers", n)
        return [window if i >= first else None for i in range(n)]
    if family == "mixtral":
        return [window] * n
    return [None] * n


def _mlp(p: str, H: int, inner: int, bias: bool = False) -> list[ParamSpec]:
    specs = [
        ParamSpec(p + "mlp_gate", (H, inner), SHARED_MLP, True),
        ParamSpec(p + "mlp_up", (H, inner), SHARED_MLP, True),
        ParamSpec(p + "mlp_down", (inner, H), SHARED_MLP, True),
    ]
    if bias:
        widths = (("gate", inner), ("up", inner), ("down", H))
        specs += [ParamSpec(p + f"mlp_{n}_bias", (w,), SHARED_MLP, False) for n, w in widths]
    return specs


def from_hf_config(d: dict, name: str = "hf") -> Decoder:
    """A Decoder from a Hugging Face config dict (a multimodal config's ``text_config`` is used): mk.config's own
    description where it takes the config (:func:`as_decoder`), else, for the pre-norm variants it does not (biased
    Llama projections, Qwen3's sliding layers and dense layers between MoE ones, Mixtral's window), the tensor list
    below, for bytes and counts only."""
    if "text_config" in d:
        d = d["text_config"]
    family = {"gemma4": GEMMA4, "gemma3": "gemma3_text"}.get(d.get("model_type"), d.get("model_type"))
    if family not in HF_FAMILIES:
        raise ValueError(f"unsupported model_type {family!r}; supported families: {', '.join(HF_FAMILIES)}")
    try:
        return as_decoder(from_hf_dict(d, name))
    except UnsupportedVariant:
        if family not in _VARIANTS:
            raise
    check_fields(d, family)
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads") if k not in d]
    if missing:
        raise ValueError(f"{family} config is missing {missing}")
    H, n, nh = d["hidden_size"], d["num_hidden_layers"], d["num_attention_heads"]
    kv = d.get("num_key_value_heads") or nh
    hd = d.get("head_dim") or H // nh
    tied = d.get("tie_word_embeddings", False)
    windows = _windows(d, family, n)
    bias = bool(d.get("attention_bias"))
    specs = [ParamSpec("embed", (d["vocab_size"], H), HEAD if tied else EMBED, True)]
    layers = []
    for i in range(n):
        p = f"layers.{i}."
        kind = SLIDING if windows[i] is not None else FULL
        att = attention_component(kind)
        specs.append(ParamSpec(p + "input_norm", (H,), NORMS, False))
        specs += [
            ParamSpec(p + "q", (H, nh * hd), att, True),
            ParamSpec(p + "k", (H, kv * hd), att, True),
            ParamSpec(p + "v", (H, kv * hd), att, True),
            ParamSpec(p + "o", (nh * hd, H), att, True),
        ]
        if bias:
            widths = (("q", nh * hd), ("k", kv * hd), ("v", kv * hd), ("o", H))
            specs += [ParamSpec(p + f"{m}_bias", (w,), att, False) for m, w in widths]
        if family in ("qwen3", "qwen3_moe"):
            specs += [ParamSpec(p + "q_norm", (hd,), NORMS, False), ParamSpec(p + "k_norm", (hd,), NORMS, False)]
        specs.append(ParamSpec(p + "pre_ffn_norm", (H,), NORMS, False))
        experts, top_k, ffn = _ffn(d, family, i, p, H)
        specs += ffn
        layers.append(Layer(kind, windows[i], 2 * kv * hd, experts, top_k))
    specs.append(ParamSpec("final_norm", (H,), NORMS, False))
    if not tied:
        specs.append(ParamSpec("head", (d["vocab_size"], H), HEAD, True))
    return Decoder(name, family, d["vocab_size"], H, tied, tuple(layers), tuple(specs))


_VARIANTS = ("llama", "qwen3", "qwen3_moe", "mixtral")  # families whose refused variants are described here


def _ffn(d: dict, family: str, i: int, p: str, H: int) -> tuple[int, int, list[ParamSpec]]:
    """Layer ``i``'s feed-forward: (routed experts, top-k, tensors)."""
    dense = d.get("intermediate_size")
    if family == "qwen3_moe":
        E, I = d.get("num_experts", d.get("num_local_experts")), d["moe_intermediate_size"]
        step = d.get("decoder_sparse_step", 1)
        sparse = E > 0 and i not in (d.get("mlp_only_layers") or []) and (i + 1) % step == 0
    elif family == "mixtral":
        E, I, sparse = d["num_local_experts"], dense, True
    else:  # dense: Llama, Qwen3
        return 0, 0, _mlp(p, H, dense, bias=family == "llama" and bool(d.get("mlp_bias")))
    if not sparse:
        return 0, 0, _mlp(p, H, dense)
    k = d.get("num_experts_per_tok")
    if not k or not 0 < k <= E:
        raise ValueError(f"{family} config needs 0 < num_experts_per_tok <= {E}, got {k}")
    specs = [
        ParamSpec(p + "router_proj", (H, E), ROUTER, True),
        ParamSpec(p + "expert_gate", (E, H, I), EXPERTS, True),
        ParamSpec(p + "expert_up", (E, H, I), EXPERTS, True),
        ParamSpec(p + "expert_down", (E, I, H), EXPERTS, True),
    ]
    return E, k, specs


@functools.cache
def as_decoder(cfg: ModelConfig) -> Decoder:
    """A model config (a preset, or one read by mk.config) as a Decoder: mk.config's own description, the one the
    plan (and, for the families it runs, the reference and the kernel) reads."""
    layers = tuple(
        Layer(
            t,
            cfg.sliding_window if t == SLIDING else None,
            cfg.cache_elements(t),
            cfg.num_experts if cfg.is_moe_layer(i) else 0,
            cfg.top_k if cfg.is_moe_layer(i) else 0,
        )
        for i, t in enumerate(cfg.layer_types)
    )
    return Decoder(
        cfg.name, cfg.family, cfg.vocab_size, cfg.hidden_size, cfg.tied_embeddings, layers, tuple(param_specs(cfg))
    )


def get_decoder(model: ModelLike) -> Decoder:
    """A model as a Decoder: a preset name (``python -m mk models``), a ``config.json`` or the folder holding it
    (a checkpoint), or a hub id whose config is in the local Hugging Face cache (nothing is downloaded)."""
    if isinstance(model, Decoder):
        return model
    if isinstance(model, ModelConfig):
        return as_decoder(model)
    if str(model) in PRESETS:
        return as_decoder(get_config(str(model)))
    found = hf_config_of(model)
    if found is None:
        raise ValueError(unknown_model(model))
    d, name = found
    return from_hf_config(d, name=name)
