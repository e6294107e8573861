"""Reading a Hugging Face ``config.json`` into a ModelConfig: one adapter per ``model_type``, each checking the
config's fields (one that may change the architecture and that the adapter does not read is refused by name), and
``to_hf_dict``, the config transformers writes for a model mk runs.

Every adapter describes the model as transformers builds it, so mk.params' tensors count what transformers holds
(tests/test_config.py, on the meta device). What an adapter reads but the reference and the kernel do not run is
described and planned, and refused by the engines by name (ModelConfig.variants_not_run).
"""

from __future__ import annotations

import dataclasses

from .model import (
    CONFIG_FAMILIES,
    FULL,
    GEMMA4,
    PLANNED_FAMILIES,
    PRE_NORM_FAMILIES,
    PRE_NORM_WIRING,
    RUNNABLE_FAMILIES,
    SLIDING,
    LatentAttention,
    ModelConfig,
    RopeScaling,
    YarnScaling,
    period_pattern,
)

_HF_LAYER_TYPE = {"sliding_attention": SLIDING, "full_attention": FULL}


# Fields that do not change what a decode step reads (token ids, training, numerics, bookkeeping), for every family.
NEUTRAL_FIELDS = {
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

# Per family: the architectural fields its adapter reads, beyond the common ones.
_DEEPSEEK_FIELDS = {
    "attention_bias", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "qk_head_dim", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
    "first_k_dense_replace", "moe_layer_freq",
}  # fmt: skip
ARCH_FIELDS = {
    "llama": {"attention_bias", "mlp_bias"},
    "qwen3": {"attention_bias", "use_sliding_window", "max_window_layers"},
    "qwen3_moe": {
        "attention_bias", "use_sliding_window", "max_window_layers", "num_experts", "num_local_experts",
        "num_experts_per_tok",
        "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
    },
    "mixtral": {"num_local_experts", "num_experts_per_tok"},
    "gpt_oss": {"attention_bias", "num_local_experts", "num_experts_per_tok", "experts_per_token", "swiglu_alpha"},
    "deepseek_v3": _DEEPSEEK_FIELDS,
    "kimi_k2": _DEEPSEEK_FIELDS,  # Kimi K2: DeepSeek-V3's architecture (DeepseekV3ForCausalLM) under its own name
    "gemma2": set(),
    "gemma3_text": set(),
}  # fmt: skip
_FAMILY_OF = {"gemma3": "gemma3_text", "gemma4": GEMMA4}  # a multimodal model_type's text family


def _check_fields(d: dict, family: str) -> None:
    """Refuse a config field the family's adapter does not read and that may change the architecture."""
    unknown = sorted(set(d) - NEUTRAL_FIELDS - ARCH_FIELDS[family])
    if unknown:
        raise ValueError(
            f"{family} config field(s) {unknown} are not modelled by mk; remove them if they do not change "
            f"the architecture, or add them to the {family} description"
        )


def from_hf_dict(d: dict, name: str = "hf") -> ModelConfig:
    """A ModelConfig from a Hugging Face config dict (a multimodal config's ``text_config`` is used): Gemma 4 (also
    without a model_type), Llama 3, Qwen3, Qwen3-MoE, Mixtral, gpt-oss, DeepSeek-V3, Kimi K2, Gemma 2 or 3."""
    if "text_config" in d:
        d = d["text_config"]
    family = d.get("model_type")
    family = _FAMILY_OF.get(family, family)
    if family in (None, GEMMA4):
        cfg = _gemma4_from_hf(d, name)
    elif family not in CONFIG_FAMILIES:
        raise ValueError(
            f"config model_type is {family!r}: mk runs {', '.join(RUNNABLE_FAMILIES)} and plans and times "
            f"{', '.join(PLANNED_FAMILIES)}"
        )
    else:
        _check_fields(d, family)
        cfg = _ADAPTERS[family](d, name)
    longest = d.get("max_position_embeddings")
    return cfg.replace(max_position_embeddings=int(longest)) if longest else cfg


def _layer_types(hf_types: list[str], n: int) -> tuple[str, ...]:
    """A config's ``layer_types`` (sliding_attention / full_attention) as ModelConfig's."""
    bad = sorted({t for t in hf_types if t not in _HF_LAYER_TYPE})
    if bad or len(hf_types) != n:
        raise ValueError(f"layer_types must list {n} entries from {list(_HF_LAYER_TYPE)}, got {hf_types}")
    return tuple(_HF_LAYER_TYPE[t] for t in hf_types)


def _require(d: dict, family: str, keys) -> None:
    missing = [k for k in keys if d.get(k) is None]
    if missing:
        raise ValueError(f"{family} config is missing {missing}")


def _rope_parameters(d: dict) -> dict:
    """RoPE's parameters: transformers 5's ``rope_parameters`` over the older ``rope_scaling``."""
    return dict(d.get("rope_scaling") or {}, **(d.get("rope_parameters") or {}))


def _scaling_kind(rope: dict) -> str:
    """The type of a RoPE scaling the reference does not run (yarn), named for the record ("" for none)."""
    return rope.get("rope_type", rope.get("type", "")) if rope.get("factor") else ""


def _rope(d: dict) -> tuple[float, RopeScaling | None, str]:
    """A pre-norm family's RoPE: theta, Llama 3's scaling (which the reference runs), and the type of any other
    scaling (yarn, linear ...: described for the record, not run)."""
    rope = _rope_parameters(d)
    theta = float(rope.get("rope_theta", d.get("rope_theta", 10_000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return theta, None, ""
    if kind != "llama3":
        return theta, None, kind
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in keys if k not in rope]
    if missing:
        raise ValueError(f"llama3 RoPE scaling is missing {missing}")
    return theta, RopeScaling(*(float(rope[k]) for k in keys[:3]), int(rope[keys[3]])), ""


def yarn_scaling(rope: dict, max_position_embeddings: int | None = None) -> YarnScaling:
    """A ``rope_type: yarn`` RoPE's parameters (``rope_parameters`` or ``rope_scaling``) as transformers'
    ``_compute_yarn_parameters`` reads them: ``factor`` (else ``max_position_embeddings`` over the original),
    ``beta_fast`` / ``beta_slow`` (32 / 1 when absent or 0), ``truncate`` (default true), and ``attention_factor``,
    ``mscale``, ``mscale_all_dim`` for the cos/sin scale (mk.config.model.YarnScaling)."""
    if not rope.get("original_max_position_embeddings"):
        raise ValueError(f"yarn RoPE scaling is missing original_max_position_embeddings: {rope}")
    old = int(rope["original_max_position_embeddings"])
    factor = rope.get("factor")
    if factor is None:
        if not max_position_embeddings:
            raise ValueError(f"yarn RoPE scaling without a factor needs max_position_embeddings: {rope}")
        factor = max_position_embeddings / old
    af = rope.get("attention_factor")
    return YarnScaling(
        factor=float(factor),
        original_max_position_embeddings=old,
        beta_fast=float(rope.get("beta_fast") or 32),
        beta_slow=float(rope.get("beta_slow") or 1),
        truncate=bool(rope.get("truncate", True)),
        attention_factor=None if af is None else float(af),
        mscale=float(rope.get("mscale") or 0.0),
        mscale_all_dim=float(rope.get("mscale_all_dim") or 0.0),
    )


def _read_alike(d: dict, name: str, layer_types, eps: float = 1e-6) -> dict:
    """The fields every family's config.json spells alike: the model's name, its vocabulary and width, its layers'
    kinds and the norms' epsilon."""
    return dict(
        name=name,
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        layer_types=layer_types,
        rms_eps=float(d.get("rms_norm_eps", eps)),
    )


def _same_heads(d: dict) -> dict:
    """The head counts and dims of a family whose sliding and full layers share them (gpt-oss, Gemma 2 and 3)."""
    nh = d["num_attention_heads"]
    hd, kv = d.get("head_dim") or d["hidden_size"] // nh, d.get("num_key_value_heads") or nh
    return dict(num_heads=nh, sliding_kv_heads=kv, sliding_head_dim=hd, full_kv_heads=kv, full_head_dim=hd)


def _gemma2_3_from_hf(d: dict, name: str) -> ModelConfig:
    """Gemma 2 and 3 text: sliding and full layers (alternating, or Gemma 3's five sliding to one full), sandwich
    norms without Gemma 4's layer scalar, QK-norm in Gemma 3, a tied and scaled embedding (planned and timed, not
    run: their (1 + w) norms and Gemma 2's attention soft cap are not the reference's)."""
    family = "gemma3_text" if d["model_type"] == "gemma3" else d["model_type"]
    _require(d, family, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                         "sliding_window"))  # fmt: skip
    n = d["num_hidden_layers"]
    if d.get("layer_types"):
        types = _layer_types(d["layer_types"], n)
    else:  # transformers' defaults: Gemma 2 alternates from a sliding layer, Gemma 3 ends each period on a full one
        period = 2 if family == "gemma2" else d.get("sliding_window_pattern", 6)
        types = period_pattern(n, period)
    theta = float(d.get("rope_theta", 10_000.0))
    return ModelConfig(
        **_read_alike(d, name, types),
        **_same_heads(d),
        final_softcap=float(d.get("final_logit_softcapping") or 0.0),
        sliding_window=d["sliding_window"],
        mlp_intermediate=d["intermediate_size"],
        sliding_rope_theta=float(d.get("rope_local_base_freq", theta)),
        full_rope_theta=theta,
        full_partial_rotary=1.0,
        full_k_eq_v=False,
        family=family,
        tied_embeddings=bool(d.get("tie_word_embeddings", True)),
        qk_norm=family == "gemma3_text",
        v_norm=False,
        layer_scalar=False,
        scale_scores=True,
    )


def _gpt_oss_from_hf(d: dict, name: str) -> ModelConfig:
    """gpt-oss: alternating sliding and full layers (the first sliding), attention sinks and biases, biased experts
    without a shared one, a clamped SwiGLU and YaRN RoPE (both engines run it). A RoPE
    without scaling (``default``) runs too; another scaling is described and refused by name."""
    _require(d, "gpt_oss", ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "sliding_window",
                            "intermediate_size", "num_local_experts"))  # fmt: skip
    n = d["num_hidden_layers"]
    types = d.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    rope = _rope_parameters(d)
    theta = float(rope.get("rope_theta", d.get("rope_theta", 150_000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if not rope:  # transformers' default: the published YaRN scaling
        rope, kind = dict(factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                          original_max_position_embeddings=4096), "yarn"  # fmt: skip
    scaling = yarn_scaling(rope, d.get("max_position_embeddings")) if kind == "yarn" else None
    return ModelConfig(
        **_read_alike(d, name, _layer_types(types, n), eps=1e-5),
        **_same_heads(d),
        sliding_window=d["sliding_window"],
        mlp_intermediate=0,
        num_experts=d["num_local_experts"],
        top_k=d.get("num_experts_per_tok") or d.get("experts_per_token"),
        expert_intermediate=d["intermediate_size"],
        sliding_rope_theta=theta,
        full_rope_theta=theta,
        family="gpt_oss",
        tied_embeddings=bool(d.get("tie_word_embeddings", False)),
        router="topk_softmax",
        **dict(PRE_NORM_WIRING, activation="swiglu_clamped"),
        attention_bias=bool(d.get("attention_bias", True)),
        sinks=True,
        expert_bias=True,
        swiglu_alpha=float(d.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(d.get("swiglu_limit", 7.0)),
        rope_scaling=scaling,
        rope_scaling_kind="" if kind in ("default", "yarn") else kind,
    )


_GEMMA4_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "sliding_window",
)


def _gemma4_from_hf(d: dict, name: str) -> ModelConfig:
    """Gemma 4 text, the 26B-A4B / 31B family (no per-layer inputs, no KV sharing, a tied head)."""
    missing = [k for k in _GEMMA4_REQUIRED if k not in d]
    if missing:
        raise ValueError(f"Gemma 4 config is missing {missing}")
    unsupported = []
    if d.get("hidden_size_per_layer_input"):
        unsupported.append("hidden_size_per_layer_input (per-layer input embeddings)")
    if d.get("num_kv_shared_layers"):
        unsupported.append("num_kv_shared_layers (cross-layer KV sharing)")
    if d.get("use_double_wide_mlp"):
        unsupported.append("use_double_wide_mlp")
    if not d.get("tie_word_embeddings", True):
        unsupported.append("untied word embeddings")
    if unsupported:
        raise ValueError("mk models the 26B-A4B / 31B family only; this config uses " + ", ".join(unsupported))
    n = d["num_hidden_layers"]
    hf_types = d.get("layer_types")
    layer_types = period_pattern(n) if hf_types is None else _layer_types(hf_types, n)
    k_eq_v = bool(d.get("attention_k_eq_v", False))
    full_hd = d.get("global_head_dim", 512)
    full_kv = d.get("num_global_key_value_heads") if k_eq_v else None
    # save_pretrained writes the full-layer overrides as per_layer_config instead of the global_* keys
    for layer, over in (d.get("per_layer_config") or {}).items():
        if layer_types[int(layer)] == FULL:
            full_hd = over.get("head_dim", full_hd)
            full_kv = over.get("num_key_value_heads", full_kv)
    rope = d.get("rope_parameters") or {}
    sl_rope = rope.get("sliding_attention", {})
    fu_rope = rope.get("full_attention", {})
    if fu_rope.get("rope_type", "proportional") != "proportional" or sl_rope.get("rope_type", "default") != "default":
        raise ValueError(f"unsupported rope_parameters {rope}: expected default (sliding) and proportional (full)")
    moe = bool(d.get("enable_moe_block", False))
    return ModelConfig(
        **_read_alike(d, name, layer_types),
        final_softcap=float(d.get("final_logit_softcapping") or 0.0),
        num_heads=d["num_attention_heads"],
        sliding_kv_heads=d["num_key_value_heads"],
        sliding_head_dim=d["head_dim"],
        full_kv_heads=full_kv or d["num_key_value_heads"],
        full_head_dim=full_hd,
        sliding_window=d["sliding_window"],
        mlp_intermediate=d["intermediate_size"],
        num_experts=d.get("num_experts") or 0 if moe else 0,
        top_k=d.get("top_k_experts") or 0 if moe else 0,
        expert_intermediate=d.get("moe_intermediate_size") or 0 if moe else 0,
        sliding_rope_theta=float(sl_rope.get("rope_theta", 10_000.0)),
        full_rope_theta=float(fu_rope.get("rope_theta", 1_000_000.0)),
        full_partial_rotary=float(fu_rope.get("partial_rotary_factor", 0.25)),
        full_k_eq_v=k_eq_v,
    )


def _deepseek_from_hf(d: dict, name: str) -> ModelConfig:
    """DeepSeek-V3 and Kimi K2 (model_type kimi_k2, DeepSeek-V3's architecture): MLA in every layer, the first
    ``first_k_dense_replace`` layers dense, then routed experts picked by biased sigmoid scores in groups beside shared
    ones, YaRN RoPE (``rope_scaling`` or ``rope_parameters``; the published configs') or none. The reference runs it
    and the megakernel too (another RoPE scaling is described and refused by name). Missing fields take
    transformers' DeepseekV3Config defaults."""
    family = d["model_type"]
    need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "kv_lora_rank", "qk_rope_head_dim",
            "qk_nope_head_dim", "v_head_dim")  # fmt: skip
    _require(d, family, need)
    if d.get("moe_layer_freq", 1) != 1:
        raise ValueError(f"{name}: moe_layer_freq {d['moe_layer_freq']} (MoE every few layers) is not modelled")
    for key, want in (("hidden_act", "silu"), ("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        if d.get(key, want) != want:
            raise ValueError(f"{name}: this {family} config's {key} {d[key]!r} is not modelled (mk: {want})")
    if d.get("attention_bias"):
        raise ValueError(f"{name}: attention_bias (biased MLA projections) is not modelled for {family}")
    mla = LatentAttention(
        d.get("q_lora_rank", 1536) or 0,
        d["kv_lora_rank"],
        d["qk_rope_head_dim"],
        d["qk_nope_head_dim"],
        d["v_head_dim"],
        rope_interleave=bool(d.get("rope_interleave", True)),
    )
    rope = _rope_parameters(d)
    kind, longest = rope.get("rope_type", rope.get("type", "default")), d.get("max_position_embeddings", 4096)
    scaling = None
    if kind == "yarn":  # transformers takes max_position_embeddings for a missing original length
        scaling = yarn_scaling({"original_max_position_embeddings": longest, **rope}, longest)
    n = d["num_hidden_layers"]
    dense = tuple(range(min(d.get("first_k_dense_replace", 3), n)))
    return ModelConfig(
        **_read_alike(d, name, (FULL,) * n),
        num_heads=d["num_attention_heads"],
        sliding_kv_heads=0,
        sliding_head_dim=0,
        full_kv_heads=1,  # one latent a position, read by every head
        full_head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        sliding_window=0,
        mlp_intermediate=(d.get("n_shared_experts") or 0) * d["moe_intermediate_size"],
        num_experts=d["n_routed_experts"],
        top_k=d["num_experts_per_tok"],
        expert_intermediate=d["moe_intermediate_size"],
        full_rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10_000.0))),
        family=family,
        tied_embeddings=bool(d.get("tie_word_embeddings", False)),
        router="sigmoid_grouped",
        norm_topk=bool(d.get("norm_topk_prob", True)),
        router_groups=d.get("n_group") or 1,
        router_topk_groups=d.get("topk_group") or 1,
        routed_scaling=float(d.get("routed_scaling_factor", 2.5)),
        **PRE_NORM_WIRING,  # (RoPE's share of the query/key head: latent_attention.qk_rope_head_dim)
        latent_attention=mla,
        router_bias=True,
        dense_layers=dense,
        dense_intermediate=d["intermediate_size"] if dense else 0,
        rope_scaling=scaling,
        rope_scaling_kind="" if kind == "yarn" else _scaling_kind(rope),
    )


def _deepseek_to_hf(cfg: ModelConfig) -> dict:
    """What DeepseekV3ForCausalLM's save_pretrained writes for a DeepSeek-V3 (or Kimi K2) config the reference runs."""
    mla = cfg.latent_attention
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": cfg.family,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.dense_intermediate or cfg.expert_intermediate,
        "moe_intermediate_size": cfg.expert_intermediate,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_heads,
        "n_shared_experts": cfg.mlp_intermediate // cfg.expert_intermediate,
        "n_routed_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.top_k,
        "routed_scaling_factor": cfg.routed_scaling,
        "n_group": cfg.router_groups,
        "topk_group": cfg.router_topk_groups,
        "norm_topk_prob": cfg.norm_topk,
        "first_k_dense_replace": len(cfg.dense_layers),
        "q_lora_rank": mla.q_lora_rank or None,
        "kv_lora_rank": mla.kv_lora_rank,
        "qk_rope_head_dim": mla.qk_rope_head_dim,
        "qk_nope_head_dim": mla.qk_nope_head_dim,
        "v_head_dim": mla.v_head_dim,
        "rope_interleave": mla.rope_interleave,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_eps,
        "tie_word_embeddings": cfg.tied_embeddings,
        "attention_bias": False,
        "rope_parameters": _yarn_to_hf(cfg),
    }


def _pre_norm_layer_types(d: dict, family: str, n: int) -> tuple[tuple[str, ...], int]:
    """Each layer's attention and the sliding window (0: none): a window only where the config enables one
    (Qwen3's use_sliding_window, Mixtral's sliding_window), on the layers its ``layer_types`` say, else Qwen3's from
    layer ``max_window_layers`` on and every Mixtral layer (a Llama attends to the full context)."""
    window = d.get("sliding_window")
    if family in ("qwen3", "qwen3_moe") and not d.get("use_sliding_window"):
        window = None  # transformers drops a Qwen3 window unless use_sliding_window
    if not window or family == "llama":
        return (FULL,) * n, 0
    if d.get("layer_types") is not None:
        types = _layer_types(d["layer_types"], n)
    elif family == "mixtral":
        types = (SLIDING,) * n
    else:
        first = d.get("max_window_layers", n)
        types = tuple(SLIDING if i >= first else FULL for i in range(n))
    return types, window if SLIDING in types else 0


def _pre_norm_from_hf(d: dict, name: str) -> ModelConfig:
    """A Llama 3, Qwen3, Qwen3-MoE or Mixtral config: pre-norm layers, SiLU. Biased projections (attention_bias, a
    Llama's mlp_bias), sliding layers, Qwen3-MoE's dense layers between MoE ones (decoder_sparse_step, mlp_only_layers)
    and a RoPE scaling other than Llama 3's are described, planned and timed, not run."""
    family = d["model_type"]
    _require(d, family, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"))
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{name}: this {family} config's hidden_act {d['hidden_act']!r} is not modelled (mk: silu)")
    H, n, nh = d["hidden_size"], d["num_hidden_layers"], d["num_attention_heads"]
    kv, hd = d.get("num_key_value_heads") or nh, d.get("head_dim") or H // nh
    theta, scaling, scaling_kind = _rope(d)
    layer_types, window = _pre_norm_layer_types(d, family, n)
    # sliding layers (if any) have the full layers' heads and RoPE
    sliding = dict(sliding_kv_heads=kv, sliding_head_dim=hd, sliding_window=window, sliding_rope_theta=theta)
    dense = ()
    if family == "qwen3_moe":
        # the published configs say num_experts; transformers 5 saves num_local_experts
        E = d.get("num_experts", d.get("num_local_experts"))
        k, I, mlp = d["num_experts_per_tok"], d["moe_intermediate_size"], 0
        step, only = d.get("decoder_sparse_step") or 1, set(d.get("mlp_only_layers") or ())
        dense = tuple(i for i in range(n) if i in only or (i + 1) % step)
    elif family == "mixtral":
        E, k, I, mlp = d["num_local_experts"], d["num_experts_per_tok"], d["intermediate_size"], 0
    else:
        E, k, I, mlp = 0, 0, 0, d["intermediate_size"]
    return ModelConfig(
        **_read_alike(d, name, layer_types),
        num_heads=nh,
        **(sliding if window else dict(sliding_kv_heads=0, sliding_head_dim=0, sliding_window=0)),
        full_kv_heads=kv,
        full_head_dim=hd,
        mlp_intermediate=mlp,
        num_experts=E,
        top_k=k,
        expert_intermediate=I,
        full_rope_theta=theta,
        family=family,
        tied_embeddings=bool(d.get("tie_word_embeddings", False)),
        **dict(PRE_NORM_WIRING, qk_norm=family in ("qwen3", "qwen3_moe")),
        router="softmax_topk",
        norm_topk=bool(d.get("norm_topk_prob", True)) if family == "qwen3_moe" else True,
        rope_scaling=scaling,
        attention_bias=bool(d.get("attention_bias")),
        mlp_bias=bool(d.get("mlp_bias")),  # only a Llama's config may say it (ARCH_FIELDS)
        dense_layers=dense,
        dense_intermediate=d["intermediate_size"] if dense else 0,
        rope_scaling_kind=scaling_kind,
    )


_ADAPTERS = {
    **dict.fromkeys(PRE_NORM_FAMILIES, _pre_norm_from_hf),
    "gpt_oss": _gpt_oss_from_hf,
    "deepseek_v3": _deepseek_from_hf,
    "kimi_k2": _deepseek_from_hf,
    "gemma2": _gemma2_3_from_hf,
    "gemma3_text": _gemma2_3_from_hf,
}


_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}


def _pre_norm_to_hf(cfg: ModelConfig) -> dict:
    rope = {"rope_type": "default", "rope_theta": cfg.full_rope_theta}
    if cfg.rope_scaling:
        rope.update(rope_type="llama3", **dataclasses.asdict(cfg.rope_scaling))
    d = {
        "architectures": [_ARCHITECTURES[cfg.family]],
        "model_type": cfg.family,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.full_kv_heads,
        "head_dim": cfg.full_head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_eps,
        "tie_word_embeddings": cfg.tied_embeddings,
        "rope_parameters": rope,
    }
    if cfg.family != "mixtral":  # MixtralConfig has no attention_bias
        d["attention_bias"] = False
    if cfg.family == "qwen3_moe":
        d.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.top_k, norm_topk_prob=cfg.norm_topk,
                 moe_intermediate_size=cfg.expert_intermediate, intermediate_size=cfg.expert_intermediate,
                 decoder_sparse_step=1, mlp_only_layers=[])  # fmt: skip
    elif cfg.family == "mixtral":
        d.update(num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.top_k,
                 intermediate_size=cfg.expert_intermediate, sliding_window=None)  # fmt: skip
    else:
        d["intermediate_size"] = cfg.mlp_intermediate
    return d


def _yarn_to_hf(cfg: ModelConfig) -> dict:
    """``rope_parameters`` of a RoPE that is plain or YaRN-scaled (gpt-oss, DeepSeek-V3)."""
    rope = {"rope_type": "default", "rope_theta": cfg.full_rope_theta}
    if cfg.rope_scaling is not None:
        y = dataclasses.asdict(cfg.rope_scaling)  # unset: no attention_factor, no mscale (transformers' defaults)
        unset = [k for k in ("attention_factor", "mscale", "mscale_all_dim") if not y[k]]
        rope.update(rope_type="yarn", **{k: v for k, v in y.items() if k not in unset})
    return rope


def _gpt_oss_to_hf(cfg: ModelConfig) -> dict:
    inv = {v: k for k, v in _HF_LAYER_TYPE.items()}
    rope = _yarn_to_hf(cfg)
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.expert_intermediate,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.full_kv_heads,
        "head_dim": cfg.full_head_dim,
        "num_local_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.top_k,
        "sliding_window": cfg.sliding_window,
        "layer_types": [inv[t] for t in cfg.layer_types],
        "attention_bias": cfg.attention_bias,
        "rms_norm_eps": cfg.rms_eps,
        "swiglu_alpha": cfg.swiglu_alpha,
        "swiglu_limit": cfg.swiglu_limit,
        "tie_word_embeddings": cfg.tied_embeddings,
        "rope_parameters": rope,
    }


def to_hf_dict(cfg: ModelConfig) -> dict:
    """The Hugging Face text config for ``cfg``, a model mk runs (what ``save_pretrained`` of its transformers class
    writes)."""
    cfg.check_runnable()
    if cfg.family == "gpt_oss":
        return _gpt_oss_to_hf(cfg)
    if cfg.latent_attention is not None:
        return _deepseek_to_hf(cfg)
    if cfg.family != GEMMA4:
        return _pre_norm_to_hf(cfg)
    inv = {v: k for k, v in _HF_LAYER_TYPE.items()}
    d = {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.mlp_intermediate,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.sliding_kv_heads,
        "head_dim": cfg.sliding_head_dim,
        "global_head_dim": cfg.full_head_dim,
        "num_global_key_value_heads": cfg.full_kv_heads,
        "attention_k_eq_v": cfg.full_k_eq_v,
        "sliding_window": cfg.sliding_window,
        "layer_types": [inv[t] for t in cfg.layer_types],
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": cfg.rms_eps,
        "final_logit_softcapping": cfg.final_softcap or None,
        "tie_word_embeddings": True,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "enable_moe_block": cfg.is_moe,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.sliding_rope_theta},
            "full_attention": {
                "rope_type": "proportional",
                "rope_theta": cfg.full_rope_theta,
                "partial_rotary_factor": cfg.full_partial_rotary,
            },
        },
    }
    if cfg.is_moe:
        d.update(num_experts=cfg.num_experts, top_k_experts=cfg.top_k, moe_intermediate_size=cfg.expert_intermediate)
    return d
