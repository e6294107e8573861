"""Model configurations the reference, the step plan and the kernel run: a frozen config type, exact presets,
tiny test presets, and loading from a Hugging Face ``config.json``.

One config type covers the decoders mk runs: Gemma 4 text (26B-A4B / 31B: sliding and full layers, q/k/v norms,
sandwich norms, a shared MLP beside routed experts, tied and soft-capped head), and the Llama 3 / Qwen3 /
Qwen3-MoE / Mixtral families (pre-norm layers, SiLU, untied head, QK-norm for Qwen3, Llama 3's RoPE scaling,
softmax top-k routing without a shared expert), which mk runs; and gpt-oss, DeepSeek-V3's MLA and Gemma 2 and 3,
which mk plans and times (``ModelConfig.runnable`` says which). The fields that set a family apart (``family``,
``activation``, ``qk_norm`` ...) default to Gemma 4's. Variants no adapter here takes are described, for bytes and
counts only, by mk.decoders.

Field names describe the model, not the checkpoint; ``from_hf_dict`` maps Hugging Face names
onto them. Every derived quantity (heads per layer type, layer indices) is a property, so a
config is just the numbers the architecture needs.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from .paths import CONFIGS_DIR
from .units import positive_int


class LayerType(StrEnum):
    """A layer's attention: a sliding window or the full context (equal to the strings "sliding", "full")."""

    SLIDING = "sliding"
    FULL = "full"


SLIDING, FULL = LayerType.SLIDING, LayerType.FULL
LAYER_TYPES = tuple(LayerType)


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's RoPE frequency scaling (``rope_type: llama3``): wavelengths beyond
    ``original_max_position_embeddings / low_freq_factor`` are slowed by ``factor``, those below
    ``... / high_freq_factor`` kept, the band between interpolated."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek's multi-head latent attention (MLA): queries through a ``q_lora_rank`` bottleneck (0: none), keys and
    values through one ``kv_lora_rank`` latent a position plus a ``qk_rope_head_dim`` RoPE key shared by every head:
    the cache holds those two a position (decode absorbs the up-projections into the query and the output)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


GEMMA4 = "gemma4_text"
ACTIVATIONS = ("gelu_tanh", "silu", "swiglu_clamped")  # the last gpt-oss's: planned and timed, not run
# Gemma 4's scaled router; softmax over all experts then the top k; gpt-oss's biased logits, top k, softmax over the k;
# DeepSeek-V3's biased sigmoid scores picked in groups (the last two planned and timed, not run)
ROUTERS = ("gemma4", "softmax_topk", "topk_softmax", "sigmoid_grouped")
FFN_LAYOUTS = ("sublanes", "lanes")  # the kernel's layouts of a gated MLP (ModelConfig.ffn_layout)
GATED_IN = ("mlp_gate", "mlp_up", "expert_gate", "expert_up")  # a gated MLP's input projections [..., H, I]
GATED_OUT = ("mlp_down", "expert_down")  # [..., I, H]


@dataclass(frozen=True)
class ModelConfig:
    """A decoder the reference and the kernel run: Gemma 4 text (26B-A4B / 31B family: no per-layer inputs, no KV
    sharing) by default, or a Llama 3 / Qwen3 / Qwen3-MoE / Mixtral decoder (``family`` and the fields after it).

    A model without sliding layers leaves ``sliding_*`` at 0; a model with experts and no shared MLP has
    ``mlp_intermediate = 0``."""

    name: str
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]
    num_heads: int
    sliding_kv_heads: int
    sliding_head_dim: int
    full_kv_heads: int
    full_head_dim: int
    sliding_window: int
    mlp_intermediate: int
    num_experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    sliding_rope_theta: float = 10_000.0
    full_rope_theta: float = 1_000_000.0
    full_partial_rotary: float = 0.25
    rms_eps: float = 1e-6
    final_softcap: float = 30.0
    full_k_eq_v: bool = True
    # What sets the families apart (Gemma 4's by default) --------------------------------------------
    family: str = GEMMA4  # the Hugging Face model_type the weights' names and the config follow
    activation: str = "gelu_tanh"  # the gated MLP's: gelu_tanh(gate) * up, or silu(gate) * up
    tied_embeddings: bool = True  # the head is the embedding (else its own [hidden, vocab] matrix)
    scale_embeddings: bool = True  # the embedding rows times sqrt(hidden)
    qk_norm: bool = True  # learned RMSNorms on q and k over head_dim
    v_norm: bool = True  # a weightless RMSNorm on v
    sandwich_norms: bool = True  # norms after attention and after the FFN (Gemma)
    layer_scalar: bool = True  # each layer's output times a learned scalar (Gemma 4)
    scale_scores: bool = False  # scores / sqrt(head_dim) (Gemma 4: 1, its q/k norms set the scale)
    router: str = "gemma4"
    norm_topk: bool = True  # softmax_topk: the k weights renormalised to sum to 1
    rope_scaling: RopeScaling | None = None
    # Planned and timed, not run (gpt-oss, DeepSeek-V3): mk.config.RUNNABLE_FAMILIES run --------------
    latent_attention: LatentAttention | None = None  # MLA in every layer (full_* are its query/key head dims)
    attention_bias: bool = False  # q, k, v and o biases
    sinks: bool = False  # a learned logit per head in every softmax's denominator (gpt-oss)
    expert_bias: bool = False  # biases on each expert's projections and on the router (gpt-oss)
    router_bias: bool = False  # a bias on the router's scores, for picking only (DeepSeek-V3)
    dense_layers: int = 0  # the first layers of an MoE model are a dense MLP of dense_intermediate (DeepSeek-V3)
    dense_intermediate: int = 0
    rope_scaling_kind: str = ""  # a RoPE scaling the reference does not run (yarn), named for the record
    # How the kernel lays out the gated MLPs (mk.plan.layout), carried here so every chip's slice, the packing and
    # the plan agree: "sublanes" holds the intermediate on rows (gate and up transposed), padded to 8 rows;
    # "lanes" (the first layout) on lanes, padded to 128. The reference ignores it.
    ffn_layout: str = "sublanes"

    def __post_init__(self) -> None:
        problems = []
        sliding = SLIDING in self.layer_types
        required = ["vocab_size", "hidden_size", "num_heads", "full_kv_heads", "full_head_dim"]
        if sliding:
            required += ["sliding_kv_heads", "sliding_head_dim", "sliding_window"]
        if not self.num_experts or self.mlp_intermediate:
            required.append("mlp_intermediate")
        for f in required:
            try:
                positive_int(f, getattr(self, f))
            except ValueError as e:
                problems.append(str(e))
        if not self.layer_types:
            problems.append("layer_types is empty: a model needs at least one layer")
        bad = sorted({t for t in self.layer_types if t not in LAYER_TYPES})
        if bad:
            problems.append(f"layer_types holds {bad}; each must be one of {[str(t) for t in LAYER_TYPES]}")
        else:  # plain strings become LayerType members (equal to them)
            object.__setattr__(self, "layer_types", tuple(LayerType(t) for t in self.layer_types))
        if self.num_experts < 0 or self.top_k < 0 or self.expert_intermediate < 0 or self.mlp_intermediate < 0:
            problems.append("num_experts, top_k, expert_intermediate and mlp_intermediate must not be negative")
        if self.num_experts and not (0 < self.top_k <= self.num_experts and self.expert_intermediate > 0):
            problems.append(
                f"an MoE model needs 0 < top_k <= num_experts and expert_intermediate > 0, "
                f"got top_k={self.top_k}, num_experts={self.num_experts}, "
                f"expert_intermediate={self.expert_intermediate}"
            )
        for t, kv in ((SLIDING, self.sliding_kv_heads), (FULL, self.full_kv_heads)):
            if kv > 0 and self.num_heads % kv:
                problems.append(f"num_heads={self.num_heads} is not a multiple of the {t} KV heads ({kv})")
        rot = self.full_head_dim * self.full_partial_rotary
        if not (0 < self.full_partial_rotary <= 1) or rot != int(rot) or int(rot) % 2:
            problems.append(
                f"full_partial_rotary={self.full_partial_rotary} must give an even number of "
                f"rotated dims of full_head_dim={self.full_head_dim}"
            )
        if self.activation not in ACTIVATIONS:
            problems.append(f"activation {self.activation!r} is not one of {list(ACTIVATIONS)}")
        if self.ffn_layout not in FFN_LAYOUTS:
            problems.append(f"ffn_layout {self.ffn_layout!r} is not one of {list(FFN_LAYOUTS)}")
        if self.router not in ROUTERS:
            problems.append(f"router {self.router!r} is not one of {list(ROUTERS)}")
        if self.family == GEMMA4 and self.num_experts and not self.mlp_intermediate:
            problems.append("a Gemma 4 MoE model has a shared MLP beside its experts: mlp_intermediate must be > 0")
        if problems:
            raise ValueError(f"invalid ModelConfig {self.name!r}: " + "; ".join(problems))

    # Derived structure -------------------------------------------------------------------
    def outputs_on_rows(self, path: str) -> bool:
        """Whether the kernel stores matrix ``path`` (a parameter path or a stacked tensor name) transposed, its output
        channels on rows (gate and up in the "sublanes" FFN layout): a tile is applied as ``x @ tile.T``, and its INT8
        scales are per row."""
        return self.ffn_layout == "sublanes" and path.rsplit(".", 1)[-1] in GATED_IN

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == SLIDING)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    def kv_heads(self, layer_type: str) -> int:
        return self.sliding_kv_heads if layer_type == SLIDING else self.full_kv_heads

    def head_dim(self, layer_type: str) -> int:
        return self.sliding_head_dim if layer_type == SLIDING else self.full_head_dim

    def has_v_proj(self, layer_type: str) -> bool:
        """Full layers with K=V have no ``v_proj``: V is the normed K projection."""
        return not (layer_type == FULL and self.full_k_eq_v)

    @property
    def has_shared_mlp(self) -> bool:
        """A dense model's MLP, or the shared MLP beside an MoE model's experts (Gemma 4, DeepSeek-V3's shared expert;
        Qwen3-MoE has none)."""
        return self.mlp_intermediate > 0

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` routes to experts (an MoE model's first ``dense_layers`` do not)."""
        return self.is_moe and i >= self.dense_layers

    def mlp_width(self, i: int) -> int:
        """The intermediate width of layer ``i``'s dense or shared MLP (0: none)."""
        return self.dense_intermediate if self.is_moe and i < self.dense_layers else self.mlp_intermediate

    def cache_elements(self, layer_type: str) -> int:
        """KV-cache elements one position adds in a layer of this type: K and V of every KV head, or MLA's latent
        and RoPE key (a K=V layer's cache holds both, as mk.sol counts)."""
        if self.latent_attention is not None:
            return self.latent_attention.kv_lora_rank + self.latent_attention.qk_rope_head_dim
        return 2 * self.kv_heads(layer_type) * self.head_dim(layer_type)

    @property
    def runnable(self) -> bool:
        """Whether the reference and the kernel run this model (else its plan, bytes and timing are modelled only)."""
        return self.family in RUNNABLE_FAMILIES and not (
            self.latent_attention or self.attention_bias or self.sinks or self.expert_bias or self.router_bias
            or self.dense_layers or self.rope_scaling_kind or self.activation == "swiglu_clamped"
            or self.router in ("topk_softmax", "sigmoid_grouped")
        )  # fmt: skip

    def check_runnable(self) -> None:
        if not self.runnable:
            raise ValueError(
                f"{self.name} is a {self.family} model: mk plans and times it (mk.plan, mk.timing, mk.sol) but its "
                f"reference and kernel run {', '.join(RUNNABLE_FAMILIES)} only"
            )

    def score_scale(self, layer_type: str) -> float:
        """What attention scores are multiplied by before the softmax."""
        return self.head_dim(layer_type) ** -0.5 if self.scale_scores else 1.0

    def rope_theta(self, layer_type: str) -> float:
        return self.sliding_rope_theta if layer_type == SLIDING else self.full_rope_theta

    def rotary_dims(self, layer_type: str) -> int:
        """Number of leading dims (of head_dim) whose RoPE frequency is non-zero."""
        hd = self.head_dim(layer_type)
        return hd if layer_type == SLIDING else int(hd * self.full_partial_rotary)

    def cache_positions(self, layer_type: str, context: int) -> int:
        """Positions of the KV cache read by one decode step at this context length."""
        return min(context, self.sliding_window) if layer_type == SLIDING else context

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def truncated(self, num_layers: int) -> "ModelConfig":
        """The same shapes cut to the first ``num_layers`` layers (for compiling a slice of a big model)."""
        if not 0 < num_layers <= self.num_layers:
            raise ValueError(f"num_layers must be in 1..{self.num_layers}, got {num_layers}")
        return self.replace(name=f"{self.name}[:{num_layers}]", layer_types=self.layer_types[:num_layers])

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _pattern(num_layers: int, period: int = 6) -> tuple[str, ...]:
    """Gemma 4's 5 sliding + 1 full pattern; the last layer of each period is full."""
    return tuple(FULL if (i + 1) % period == 0 else SLIDING for i in range(num_layers))


PRESETS: dict[str, ModelConfig] = {}


def _register(cfg: ModelConfig) -> ModelConfig:
    PRESETS[cfg.name] = cfg
    return cfg


GEMMA4_26B_A4B = _register(
    ModelConfig(
        name="gemma4-26b-a4b",
        vocab_size=262_144,
        hidden_size=2816,
        layer_types=_pattern(30),
        num_heads=16,
        sliding_kv_heads=8,
        sliding_head_dim=256,
        full_kv_heads=2,
        full_head_dim=512,
        sliding_window=1024,
        mlp_intermediate=2112,
        num_experts=128,
        top_k=8,
        expert_intermediate=704,
    )
)
GEMMA4_31B = _register(
    ModelConfig(
        name="gemma4-31b",
        vocab_size=262_144,
        hidden_size=5376,
        layer_types=_pattern(60),
        num_heads=32,
        sliding_kv_heads=16,
        sliding_head_dim=256,
        full_kv_heads=4,
        full_head_dim=512,
        sliding_window=1024,
        mlp_intermediate=21504,
    )
)
# Tiny presets for tests: two sliding + one full layer, a window shorter than the test context,
# head dims and widths that are multiples of 128 so the same shapes lower on a real TPU.
TINY_DENSE = _register(
    ModelConfig(
        name="tiny-dense",
        vocab_size=512,
        hidden_size=128,
        layer_types=(SLIDING, SLIDING, FULL),
        num_heads=2,
        sliding_kv_heads=1,
        sliding_head_dim=128,
        full_kv_heads=1,
        full_head_dim=256,
        sliding_window=16,
        mlp_intermediate=256,
    )
)
TINY_MOE = _register(TINY_DENSE.replace(name="tiny-moe", num_experts=8, top_k=2, expert_intermediate=128))
# The other families at the same tiny shapes, every layer full: a Llama 3 (untied head, SiLU, Llama 3's RoPE
# scaling with a short original context so the test positions cross its bands) and a Qwen3-MoE (QK-norm,
# softmax top-k routing, no shared MLP).
# What every pre-norm family shares: every layer's norms before its blocks, SiLU, an untied head, scaled scores.
_PRE_NORM_WIRING = dict(
    full_partial_rotary=1.0,
    final_softcap=0.0,
    full_k_eq_v=False,
    activation="silu",
    scale_embeddings=False,
    qk_norm=False,
    v_norm=False,
    sandwich_norms=False,
    scale_scores=True,
)

_PRE_NORM = dict(
    _PRE_NORM_WIRING,
    layer_types=(FULL, FULL, FULL),
    sliding_kv_heads=0,
    sliding_head_dim=0,
    sliding_window=0,
    full_head_dim=128,
    tied_embeddings=False,
    router="softmax_topk",
)
TINY_LLAMA = _register(
    TINY_DENSE.replace(
        name="tiny-llama",
        **_PRE_NORM,
        family="llama",
        full_rope_theta=500_000.0,
        rms_eps=1e-5,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 64),
    )
)
TINY_QWEN3_MOE = _register(
    TINY_DENSE.replace(
        name="tiny-qwen3-moe",
        **dict(_PRE_NORM, qk_norm=True),
        family="qwen3_moe",
        mlp_intermediate=0,
        num_experts=8,
        top_k=2,
        expert_intermediate=128,
    )
)
# Gemma-4-shaped but small enough for a CPU: 26B-A4B's wiring (5:1 sliding/full pattern, shared
# MLP beside routed experts, K=V full layers) with narrower widths and fewer experts, so one decode
# step reads ~640 MB of f32 weights (weight reads dominate) and all of it ~1.1 GB (fits a 24 GiB machine).
# One period of the pattern (6 layers) at hidden 1536 rather than 12 at 1024: the same bytes in half
# the kernels, and 16 experts rather than 32: the decode step switches over the experts per layer, so
# its compile time grows with layers x experts (measured on a 2-core EPYC: ~24 s -> ~7 s, same step
# speed). Expert width H/4 and head share of the bytes (~16%) near 26B-A4B's (H/4, ~19%).
CPU_MOE = _register(
    ModelConfig(
        name="cpu-moe",
        vocab_size=16_384,
        hidden_size=1536,
        layer_types=_pattern(6),
        num_heads=12,
        sliding_kv_heads=6,
        sliding_head_dim=128,
        full_kv_heads=2,
        full_head_dim=256,
        sliding_window=256,
        mlp_intermediate=1536,
        num_experts=16,
        top_k=4,
        expert_intermediate=384,
    )
)


def get_config(model: "str | Path | ModelConfig") -> ModelConfig:
    """A model as the reference, the plan and the kernel take it: a preset name (``python -m mk models``), a
    ``config.json`` or the folder holding it (a checkpoint), or a hub id whose config is in the local Hugging Face
    cache (nothing is downloaded); a config is returned as it is. An unknown name says what was looked for."""
    if isinstance(model, ModelConfig):
        return model
    if str(model) in PRESETS:
        return PRESETS[str(model)]
    found = hf_config_of(model)
    if found is None:
        raise ValueError(unknown_model(model))
    return from_hf_dict(*found)


def unknown_model(model) -> str:
    folders = ", ".join(sorted(p.name for p in CONFIGS_DIR.iterdir() if p.is_dir()))
    return (
        f"unknown model {str(model)!r}: not a preset ({', '.join(PRESETS)}), not a config.json or a folder holding "
        f"one, not a folder of data/configs ({folders}), and not a hub id in the local Hugging Face cache (download "
        "it first, e.g. `hf download ID config.json`)"
    )


def hf_config_of(model: "str | Path") -> tuple[dict, str] | None:
    """The ``config.json`` of ``model`` and the model's name: a path to it or to the folder holding it (named after
    the folder), a folder of data/configs by its name (``llama-3.2-1b``), or a hub id (owner/name) whose config is in
    the local Hugging Face cache; None for none of these."""
    if Path(model).exists():
        return read_config_json(model)
    s = str(model)
    if s and (CONFIGS_DIR / s / "config.json").is_file():
        return read_config_json(CONFIGS_DIR / s)
    if is_hub_id(s) and not s.startswith("."):  # owner/name, not a relative path
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(s, "config.json")
        if isinstance(cached, str):
            return json.loads(Path(cached).read_text()), s
    return None


# Loading from Hugging Face -----------------------------------------------------------------
_HF_LAYER_TYPE = {"sliding_attention": SLIDING, "full_attention": FULL}
_HF_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "sliding_window",
)


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
# Per family: the architectural fields its adapter (here, or mk.decoders' for bytes only) reads, beyond the common ones.
ARCH_FIELDS = {
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


HF_FAMILIES = (*ARCH_FIELDS, GEMMA4)  # the model_types mk reads: plans and bytes (mk.decoders), or run


class UnsupportedVariant(ValueError):
    """A config of a family mk knows that uses something ModelConfig does not describe (mk.decoders may still count
    its bytes)."""


def check_fields(d: dict, family: str) -> None:
    """Refuse a config field the family's adapter does not read and that may change the architecture."""
    unknown = sorted(set(d) - NEUTRAL_FIELDS - ARCH_FIELDS[family])
    if unknown:
        raise ValueError(
            f"{family} config field(s) {unknown} are not modelled by mk; remove them if they do not change "
            f"the architecture, or add them to the {family} description"
        )


# The pre-norm families the reference and the kernel run besides Gemma 4 (mk.decoders describes more, for bytes).
PRE_NORM_FAMILIES = ("llama", "qwen3", "qwen3_moe", "mixtral")
RUNNABLE_FAMILIES = (GEMMA4, *PRE_NORM_FAMILIES)
PLANNED_FAMILIES = ("gpt_oss", "deepseek_v3", "gemma2", "gemma3_text")  # planned and timed, not run
CONFIG_FAMILIES = (*RUNNABLE_FAMILIES, *PLANNED_FAMILIES)


def from_hf_dict(d: dict, name: str = "hf") -> ModelConfig:
    """Build a config from a Hugging Face config dict: a Gemma 4 config (with ``text_config``, or a text config), or
    a Llama 3, Qwen3, Qwen3-MoE or Mixtral config."""
    if "text_config" in d:
        d = d["text_config"]
    family = d.get("model_type")
    if family in ARCH_FIELDS:
        check_fields(d, family)
    if family in PRE_NORM_FAMILIES:
        return _pre_norm_from_hf(d, name)
    if family == "gpt_oss":
        return _gpt_oss_from_hf(d, name)
    if family in ("gemma2", "gemma3_text", "gemma3"):
        return _gemma2_3_from_hf(d, name)
    if family == "deepseek_v3":
        return _deepseek_from_hf(d, name)
    if family not in (None, "gemma4_text", "gemma4"):
        raise ValueError(
            f"config model_type is {family!r}: mk runs {', '.join(RUNNABLE_FAMILIES)} and plans "
            f"{', '.join(PLANNED_FAMILIES)} (other decoders' bytes: mk.decoders)"
        )
    missing = [k for k in _HF_REQUIRED if k not in d]
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
    if hf_types is None:
        layer_types = _pattern(n)
    else:
        bad = sorted({t for t in hf_types if t not in _HF_LAYER_TYPE})
        if bad or len(hf_types) != n:
            raise ValueError(f"layer_types must list {n} entries from {list(_HF_LAYER_TYPE)}, got {hf_types}")
        layer_types = tuple(_HF_LAYER_TYPE[t] for t in hf_types)
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
        name=name,
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        layer_types=layer_types,
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
        rms_eps=float(d.get("rms_norm_eps", 1e-6)),
        final_softcap=float(d.get("final_logit_softcapping") or 0.0),
        full_k_eq_v=k_eq_v,
    )


def _rope(d: dict) -> tuple[float, RopeScaling | None]:
    """RoPE's theta and Llama 3 scaling, from transformers 5's ``rope_parameters`` or the older
    ``rope_theta`` + ``rope_scaling``."""
    rope = dict(d.get("rope_scaling") or {})
    rope.update(d.get("rope_parameters") or {})
    theta = float(rope.get("rope_theta", d.get("rope_theta", 10_000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise UnsupportedVariant(f"unsupported RoPE type {kind!r} ({rope}); mk runs default and llama3 RoPE")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in keys if k not in rope]
    if missing:
        raise ValueError(f"llama3 RoPE scaling is missing {missing}")
    return theta, RopeScaling(*(float(rope[k]) for k in keys[:3]), int(rope[keys[3]]))


def _require(d: dict, family: str, keys) -> None:
    missing = [k for k in keys if d.get(k) is None]
    if missing:
        raise ValueError(f"{family} config is missing {missing}")


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
        types = tuple(_HF_LAYER_TYPE[t] for t in d["layer_types"])
    else:  # transformers' defaults: Gemma 2 alternates from a sliding layer, Gemma 3 ends each period on a full one
        period = 2 if family == "gemma2" else d.get("sliding_window_pattern", 6)
        types = _pattern(n, period)
    theta = float(d.get("rope_theta", 10_000.0))
    return ModelConfig(
        name=name,
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        layer_types=types,
        **_same_heads(d),
        sliding_window=d["sliding_window"],
        mlp_intermediate=d["intermediate_size"],
        sliding_rope_theta=float(d.get("rope_local_base_freq", theta)),
        full_rope_theta=theta,
        full_partial_rotary=1.0,
        rms_eps=float(d.get("rms_norm_eps", 1e-6)),
        final_softcap=float(d.get("final_logit_softcapping") or 0.0),
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
    without a shared one, a clamped SwiGLU and YaRN RoPE (planned and timed, not run)."""
    _require(d, "gpt_oss", ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "sliding_window",
                            "intermediate_size", "num_local_experts"))  # fmt: skip
    n = d["num_hidden_layers"]
    types = d.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    rope = dict(d.get("rope_scaling") or {}, **(d.get("rope_parameters") or {}))
    theta = float(rope.get("rope_theta", d.get("rope_theta", 150_000.0)))
    return ModelConfig(
        name=name,
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        layer_types=tuple(_HF_LAYER_TYPE[t] for t in types),
        **_same_heads(d),
        sliding_window=d["sliding_window"],
        mlp_intermediate=0,
        num_experts=d["num_local_experts"],
        top_k=d.get("num_experts_per_tok") or d.get("experts_per_token"),
        expert_intermediate=d["intermediate_size"],
        sliding_rope_theta=theta,
        full_rope_theta=theta,
        rms_eps=float(d.get("rms_norm_eps", 1e-5)),
        family="gpt_oss",
        tied_embeddings=bool(d.get("tie_word_embeddings", False)),
        router="topk_softmax",
        **dict(_PRE_NORM_WIRING, activation="swiglu_clamped"),
        attention_bias=bool(d.get("attention_bias", True)),
        sinks=True,
        expert_bias=True,
        rope_scaling_kind=rope.get("rope_type", rope.get("type", "")) if rope.get("factor") else "",
    )


def _deepseek_from_hf(d: dict, name: str) -> ModelConfig:
    """DeepSeek-V3 / Kimi K2: MLA in every layer, the first ``first_k_dense_replace`` layers dense, then routed experts
    picked by biased sigmoid scores in groups beside shared ones (planned and timed, not run)."""
    need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "kv_lora_rank", "qk_rope_head_dim",
            "qk_nope_head_dim", "v_head_dim")  # fmt: skip
    _require(d, "deepseek_v3", need)
    if d.get("moe_layer_freq", 1) != 1:
        raise UnsupportedVariant(f"{name}: moe_layer_freq {d['moe_layer_freq']} (MoE every few layers) is not modelled")
    mla = LatentAttention(
        d.get("q_lora_rank") or 0, d["kv_lora_rank"], d["qk_rope_head_dim"], d["qk_nope_head_dim"], d["v_head_dim"]
    )
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    rope = dict(d.get("rope_scaling") or {}, **(d.get("rope_parameters") or {}))
    dense = min(d.get("first_k_dense_replace", 0), d["num_hidden_layers"])
    return ModelConfig(
        name=name,
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        layer_types=(FULL,) * d["num_hidden_layers"],
        num_heads=d["num_attention_heads"],
        sliding_kv_heads=0,
        sliding_head_dim=0,
        full_kv_heads=1,  # one latent a position, read by every head
        full_head_dim=qk,
        sliding_window=0,
        mlp_intermediate=(d.get("n_shared_experts") or 0) * d["moe_intermediate_size"],
        num_experts=d["n_routed_experts"],
        top_k=d["num_experts_per_tok"],
        expert_intermediate=d["moe_intermediate_size"],
        full_rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10_000.0))),
        rms_eps=float(d.get("rms_norm_eps", 1e-6)),
        family="deepseek_v3",
        tied_embeddings=bool(d.get("tie_word_embeddings", False)),
        router="sigmoid_grouped",
        **_PRE_NORM_WIRING,  # (RoPE's share of the query/key head: latent_attention.qk_rope_head_dim)
        latent_attention=mla,
        router_bias=True,
        dense_layers=dense,
        dense_intermediate=d["intermediate_size"] if dense else 0,
        rope_scaling_kind=rope.get("rope_type", rope.get("type", "")) if rope.get("factor") else "",
    )


def _pre_norm_from_hf(d: dict, name: str) -> ModelConfig:
    """A Llama 3, Qwen3, Qwen3-MoE or Mixtral config (every layer full attention, pre-norm, SiLU)."""
    family = d["model_type"]
    need = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"]
    missing = [k for k in need if k not in d]
    if missing:
        raise ValueError(f"{family} config is missing {missing}")
    unsupported = []
    if d.get("attention_bias") or d.get("mlp_bias"):
        unsupported.append("attention_bias / mlp_bias (biased projections)")
    if d.get("use_sliding_window") or (family == "mixtral" and d.get("sliding_window")):
        unsupported.append("sliding_window (mk runs these families with full attention in every layer)")
    if d.get("hidden_act", "silu") != "silu":
        unsupported.append(f"hidden_act {d.get('hidden_act')!r} (expected silu)")
    if family == "qwen3_moe" and (d.get("decoder_sparse_step", 1) != 1 or d.get("mlp_only_layers")):
        unsupported.append("decoder_sparse_step / mlp_only_layers (dense layers between MoE layers)")
    if unsupported:
        raise UnsupportedVariant(f"{name}: this {family} config uses " + "; ".join(unsupported))
    H, n, nh = d["hidden_size"], d["num_hidden_layers"], d["num_attention_heads"]
    hd = d.get("head_dim") or H // nh
    theta, scaling = _rope(d)
    if family == "qwen3_moe":
        # the published configs say num_experts; transformers 5 saves num_local_experts
        E = d.get("num_experts", d.get("num_local_experts"))
        E, k, I, mlp = E, d["num_experts_per_tok"], d["moe_intermediate_size"], 0
    elif family == "mixtral":
        E, k, I, mlp = d["num_local_experts"], d["num_experts_per_tok"], d["intermediate_size"], 0
    else:
        E, k, I, mlp = 0, 0, 0, d["intermediate_size"]
    return ModelConfig(
        name=name,
        vocab_size=d["vocab_size"],
        hidden_size=H,
        layer_types=(FULL,) * n,
        num_heads=nh,
        sliding_kv_heads=0,
        sliding_head_dim=0,
        full_kv_heads=d.get("num_key_value_heads") or nh,
        full_head_dim=hd,
        sliding_window=0,
        mlp_intermediate=mlp,
        num_experts=E,
        top_k=k,
        expert_intermediate=I,
        full_rope_theta=theta,
        rms_eps=float(d.get("rms_norm_eps", 1e-6)),
        family=family,
        tied_embeddings=bool(d.get("tie_word_embeddings", False)),
        **dict(_PRE_NORM_WIRING, qk_norm=family in ("qwen3", "qwen3_moe")),
        router="softmax_topk",
        norm_topk=bool(d.get("norm_topk_prob", True)) if family == "qwen3_moe" else True,
        rope_scaling=scaling,
    )


def read_config_json(path: str | Path) -> tuple[dict, str]:
    """``config.json`` (or the folder holding it) as a dict, and the name of its folder (the model's name)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise FileNotFoundError(f"no config.json at {p}")
    return json.loads(p.read_text()), p.parent.name or "hf"


def is_hub_id(s: str) -> bool:
    """Whether ``s`` has the form of a Hugging Face hub repo id (owner/name)."""
    return re.fullmatch(r"[\w.-]+/[\w.-]+", s) is not None


def load_hf_config(path: str | Path) -> ModelConfig:
    """Read ``config.json`` (or the folder holding it)."""
    d, name = read_config_json(path)
    return from_hf_dict(d, name=name)


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
        "attention_bias": False,
        "rope_parameters": rope,
    }
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


def to_hf_dict(cfg: ModelConfig) -> dict:
    """The Hugging Face text config for ``cfg`` (what ``save_pretrained`` of its transformers class writes)."""
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
