"""The model description: ModelConfig (frozen), the small records it holds, and the names of what it can say.

One config type describes every decoder mk reads: Gemma 4 text (26B-A4B / 31B: sliding and full layers, q/k/v norms,
sandwich norms, a shared MLP beside routed experts, tied and soft-capped head), the Llama 3 / Qwen3 / Qwen3-MoE /
Mixtral families (pre-norm layers, SiLU, untied head, QK-norm for Qwen3, Llama 3's RoPE scaling, softmax top-k routing
without a shared expert), gpt-oss (attention sinks, biased projections and experts, a clamped SwiGLU, YaRN RoPE) and
DeepSeek-V3 / Kimi K2 (MLA, grouped sigmoid routing with its correction bias, dense first layers, YaRN RoPE with its
softmax mscale), which mk runs (reference and megakernel: ``check_runnable(engine)``; what a setup of the kernel
refuses, mk.megakernel names); and what it plans
and times only (``runnable`` says which): Gemma 2 and 3, and the pre-norm families' variants (biased projections and
MLP, a RoPE scaling other than Llama 3's, Qwen3's sliding layers, Qwen3-MoE's dense layers between MoE ones, Mixtral's
window). The fields that set a family apart (``family``, ``activation``, ``qk_norm`` ...) default to Gemma 4's.

Field names describe the model, not the checkpoint (mk.config.hf maps Hugging Face names onto them). Every derived
quantity (heads per layer type, layer indices) is a property, so a config is just the numbers the architecture
needs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import StrEnum

from ..units import positive_int


class LayerType(StrEnum):
    """A layer's attention: a sliding window or the full context (equal to the strings "sliding", "full")."""

    SLIDING = "sliding"
    FULL = "full"


SLIDING, FULL = LayerType.SLIDING, LayerType.FULL
LAYER_TYPES = tuple(LayerType)


def period_pattern(num_layers: int, period: int = 6) -> tuple[str, ...]:
    """Gemma's layer pattern: the last layer of each period full, the others sliding (Gemma 4: 5 + 1)."""
    return tuple(FULL if (i + 1) % period == 0 else SLIDING for i in range(num_layers))


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
class YarnScaling:
    """YaRN RoPE scaling (``rope_type: yarn``; gpt-oss, DeepSeek-V3, Kimi K2), the fields transformers'
    ``_compute_yarn_parameters`` reads: the frequency pairs that turn fewer than ``beta_slow`` times over
    ``original_max_position_embeddings`` are slowed by ``factor``, those that turn more than ``beta_fast`` times kept,
    a linear ramp between (its ends rounded outwards when ``truncate``); cos and sin are multiplied by
    :attr:`attention_scale`: ``attention_factor`` if the config gives one, else ``0.1 ln(factor) + 1`` or, with
    ``mscale`` and ``mscale_all_dim`` both set (DeepSeek-V3), the ratio of that form for each. ``factor`` is the
    config's, or ``max_position_embeddings / original_max_position_embeddings`` where it gives none (as transformers
    does). DeepSeek-V3 (MLA) also multiplies its softmax scale by :attr:`score_factor`."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    mscale: float = 0.0
    mscale_all_dim: float = 0.0

    @property
    def attention_scale(self) -> float:
        """What cos and sin are multiplied by (transformers' ``attention_factor``)."""
        if self.attention_factor is not None:
            return float(self.attention_factor)

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if self.mscale and self.mscale_all_dim:
            return float(get_mscale(self.factor, self.mscale) / get_mscale(self.factor, self.mscale_all_dim))
        return get_mscale(self.factor)

    @property
    def score_factor(self) -> float:
        """What DeepSeek-V3's attention multiplies its softmax scale by (transformers' ``yarn_apply_mscale``):
        ``(0.1 mscale_all_dim ln(factor) + 1)^2`` where ``mscale_all_dim`` is set (and ``factor`` > 1), else 1.
        (DeepSeek-V3 / Kimi K2: mscale = mscale_all_dim = 1, so cos and sin are unscaled and the scores take it all.)"""
        if not self.mscale_all_dim or self.factor <= 1:
            return 1.0
        m = 0.1 * self.mscale_all_dim * math.log(self.factor) + 1.0
        return m * m


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
    rope_interleave: bool = True  # the RoPE pairs are (0, 1), (2, 3) ... (transformers' rope_interleave), else halves
    # rows of the down-projections (q_a, kv_a) held: a chip's block of the hidden size where they are split over chips
    # (mk.sharding.latent_down_rows), 0 for all of them
    down_rows: int = 0


GEMMA4 = "gemma4_text"
# The pre-norm families the reference and the kernel run besides Gemma 4 (without the variants ``runnable`` names).
PRE_NORM_FAMILIES = ("llama", "qwen3", "qwen3_moe", "mixtral")
# DeepSeek-V3's architecture, under its own model_type too (Kimi K2)
DEEPSEEK_FAMILIES = ("deepseek_v3", "kimi_k2")
# The families the reference and the megakernel run.
RUNNABLE_FAMILIES = (GEMMA4, *PRE_NORM_FAMILIES, "gpt_oss", *DEEPSEEK_FAMILIES)
# Planned and timed, not run.
PLANNED_FAMILIES = ("gemma2", "gemma3_text")
CONFIG_FAMILIES = (*RUNNABLE_FAMILIES, *PLANNED_FAMILIES)  # the model_types mk reads
ENGINES = ("reference", "megakernel")  # what ModelConfig.check_runnable asks about
ACTIVATIONS = ("gelu_tanh", "silu", "swiglu_clamped")  # the last gpt-oss's
# Gemma 4's scaled router; softmax over all experts then the top k; gpt-oss's biased logits, top k, softmax over the k
# (both engines run it); DeepSeek-V3's biased sigmoid scores picked in groups (both engines)
ROUTERS = ("gemma4", "softmax_topk", "topk_softmax", "sigmoid_grouped")
FFN_LAYOUTS = ("sublanes", "lanes")  # the kernel's layouts of a gated MLP (ModelConfig.ffn_layout)
GATED_IN = ("mlp_gate", "mlp_up", "expert_gate", "expert_up")  # a gated MLP's input projections [..., H, I]
GATED_OUT = ("mlp_down", "expert_down")  # [..., I, H]
# What every pre-norm family shares: every layer's norms before its blocks, SiLU, an untied head, scaled scores.
PRE_NORM_WIRING = dict(
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


# A field added after plans' code fingerprints were stored (data/schedule keys them on a plan's repr, its config's
# included): its repr leaves it out while it holds its default, so a model that does not use it keeps its fingerprint.
SHOWN_IF_SET = {"shown_if_set": True}


@dataclass(frozen=True)
class ModelConfig:
    """A decoder: Gemma 4 text (26B-A4B / 31B family: no per-layer inputs, no KV sharing) by default, or another
    family (``family`` and the fields after it).

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
    norm_topk: bool = True  # softmax_topk, sigmoid_grouped: the k weights renormalised to sum to 1
    # sigmoid_grouped (DeepSeek-V3): the experts in ``router_groups`` groups, the top k picked among the
    # ``router_topk_groups`` best groups, their weights times ``routed_scaling``
    router_groups: int = field(default=1, metadata=SHOWN_IF_SET)
    router_topk_groups: int = field(default=1, metadata=SHOWN_IF_SET)
    routed_scaling: float = field(default=1.0, metadata=SHOWN_IF_SET)
    # Llama 3's, or YaRN (gpt-oss, DeepSeek-V3: both engines run it)
    rope_scaling: RopeScaling | YarnScaling | None = None
    # gpt-oss's and DeepSeek-V3's (both engines run them), or what neither runs (``variants_not_run``) -----------
    latent_attention: LatentAttention | None = None  # MLA in every layer (full_* are its query/key head dims)
    attention_bias: bool = False  # q, k, v and o biases (gpt-oss, run; a Llama or Qwen3's, planned only)
    mlp_bias: bool = False  # gate, up and down biases of the dense MLP (a Llama's mlp_bias)
    sinks: bool = False  # a learned logit per head in every softmax's denominator (gpt-oss)
    expert_bias: bool = False  # biases on each expert's projections and on the router (gpt-oss)
    # the clamped SwiGLU's: (clip(up, +-limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit) (GptOssExperts)
    swiglu_alpha: float = field(default=1.702, metadata=SHOWN_IF_SET)
    swiglu_limit: float = field(default=7.0, metadata=SHOWN_IF_SET)
    router_bias: bool = False  # a bias on the router's scores, for picking only (DeepSeek-V3)
    # An MoE model's layers whose feed-forward is a dense MLP of dense_intermediate instead of routed experts:
    # DeepSeek-V3's first first_k_dense_replace; Qwen3-MoE's off its decoder_sparse_step or in its mlp_only_layers.
    dense_layers: tuple[int, ...] = ()
    dense_intermediate: int = 0
    rope_scaling_kind: str = ""  # a RoPE scaling the reference does not run (a Llama's yarn, linear ...), named
    # How the kernel lays out the gated MLPs (mk.plan.layout), carried here so every chip's slice, the packing and
    # the plan agree: "sublanes" holds the intermediate on rows (gate and up transposed), padded to 8 rows;
    # "lanes" (the first layout) on lanes, padded to 128. The reference ignores it.
    ffn_layout: str = "sublanes"
    # The longest sequence the model was trained for: a config.json's max_position_embeddings (None where it gives
    # none, and for the presets). What a step reads does not depend on it, so it is left out of the repr (the stored
    # plans' fingerprints) and of equality (a preset is the same model as the config.json it was written from).
    max_position_embeddings: int | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        shown = (
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.repr and not (f.metadata.get("shown_if_set") and getattr(self, f.name) == f.default)
        )
        return f"ModelConfig({', '.join(shown)})"

    def __post_init__(self) -> None:
        problems = []
        sliding = SLIDING in self.layer_types
        required = ["vocab_size", "hidden_size", "num_heads", "full_kv_heads", "full_head_dim"]
        if sliding:
            required += ["sliding_kv_heads", "sliding_head_dim", "sliding_window"]
        if not self.num_experts or self.mlp_intermediate:
            required.append("mlp_intermediate")
        if self.dense_layers:
            required.append("dense_intermediate")
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
        dense = tuple(self.dense_layers)  # a list (read from JSON) becomes a tuple, so the config stays hashable
        object.__setattr__(self, "dense_layers", dense)
        n = len(self.layer_types)
        if dense and (not self.num_experts or list(dense) != sorted(set(dense)) or not 0 <= dense[0] <= dense[-1] < n):
            problems.append(f"dense_layers={dense} must be increasing layer indices below {n}, of an MoE model")
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
        if self.router == "sigmoid_grouped" and self.num_experts:
            g, per = self.router_groups, self.num_experts // max(self.router_groups, 1)
            if not (g > 0 and self.num_experts % g == 0 and per >= 2 and 0 < self.router_topk_groups <= g):
                problems.append(
                    f"sigmoid_grouped routing needs router_groups dividing num_experts={self.num_experts} into groups "
                    f"of >= 2 and 0 < router_topk_groups <= router_groups, got {g} and {self.router_topk_groups}"
                )
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
        """Whether layer ``i`` routes to experts (an MoE model's ``dense_layers`` do not)."""
        return self.is_moe and i not in self.dense_layers

    def mlp_width(self, i: int) -> int:
        """The intermediate width of layer ``i``'s dense or shared MLP (0: none)."""
        return self.dense_intermediate if i in self.dense_layers else self.mlp_intermediate

    def cache_elements(self, layer_type: str) -> int:
        """KV-cache elements one position adds in a layer of this type: K and V of every KV head, or MLA's latent
        and RoPE key (a K=V layer's cache holds both, as mk.sol counts)."""
        if self.latent_attention is not None:
            return self.latent_attention.kv_lora_rank + self.latent_attention.qk_rope_head_dim
        return 2 * self.kv_heads(layer_type) * self.head_dim(layer_type)

    @property
    def variants_not_run(self) -> tuple[str, ...]:
        """What of this model the reference (and so the kernel) does not run (none: the reference runs it, if its
        family is one of RUNNABLE_FAMILIES); mk plans and times all of it."""
        found = {
            # gpt-oss's q/k/v/o biases run; a pre-norm family's attention_bias is planned only
            "attention biases": self.attention_bias and self.family in PRE_NORM_FAMILIES,
            "MLP biases": self.mlp_bias,
            # DeepSeek-V3's dense first layers run; Qwen3-MoE's dense layers between MoE ones are planned only
            "dense layers among MoE layers": bool(self.dense_layers) and self.family not in DEEPSEEK_FAMILIES,
            f"{self.rope_scaling_kind} RoPE scaling": bool(self.rope_scaling_kind),
            # the pre-norm families run with full attention in every layer
            "sliding-window layers": self.family in PRE_NORM_FAMILIES and bool(self.sliding_layers),
        }
        return tuple(what for what, used in found.items() if used)

    @property
    def runnable(self) -> bool:
        """Whether the reference and the megakernel run this model (else its plan, bytes and timing are modelled
        only: :meth:`check_runnable`)."""
        return self.family in RUNNABLE_FAMILIES and not self.variants_not_run

    def check_runnable(self, engine: str = "reference") -> None:
        """Refuse, by name, a family or a variant that ``engine`` ("reference" or "megakernel") does not run."""
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r} is not one of {list(ENGINES)}")
        if not self.runnable:
            variants = ", ".join(self.variants_not_run)
            raise ValueError(
                f"{self.name} is a {self.family} model{' with ' + variants if variants else ''}: mk plans and times "
                f"it (mk.plan, mk.timing, mk.sol) but its reference and kernel run {', '.join(RUNNABLE_FAMILIES)} "
                "only" + (", without those" if variants else "")
            )

    def score_scale(self, layer_type: str) -> float:
        """What attention scores are multiplied by before the softmax: ``head_dim^-0.5`` where ``scale_scores``, and
        for MLA (DeepSeek-V3) with YaRN also its :attr:`YarnScaling.score_factor`, as transformers'
        ``DeepseekV3Attention`` does (gpt-oss's YaRN scales cos and sin only)."""
        scale = self.head_dim(layer_type) ** -0.5 if self.scale_scores else 1.0
        if self.latent_attention is not None and isinstance(self.rope_scaling, YarnScaling):
            scale *= self.rope_scaling.score_factor
        return scale

    def rope_theta(self, layer_type: str) -> float:
        return self.sliding_rope_theta if layer_type == SLIDING else self.full_rope_theta

    def rotary_dims(self, layer_type: str) -> int:
        """Number of leading dims (of head_dim) whose RoPE frequency is non-zero."""
        hd = self.head_dim(layer_type)
        return hd if layer_type == SLIDING else int(hd * self.full_partial_rotary)

    def cache_positions(self, layer_type: str, context: int) -> int:
        """Positions of the KV cache read by one decode step at this context length."""
        return min(context, self.sliding_window) if layer_type == SLIDING else context

    def past_max_positions(self, context: int, reached_by: str = "") -> str | None:
        """``context`` positions past the model's ``max_position_embeddings``, in words (``reached_by``: how, said
        beside the context); None within it, or where the model does not give it."""
        longest = self.max_position_embeddings
        if longest is None or context <= longest:
            return None
        how = f" ({reached_by})" if reached_by else ""
        return f"context {context}{how} is past {self.name}'s max_position_embeddings ({longest})"

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def truncated(self, num_layers: int) -> "ModelConfig":
        """The same shapes cut to the first ``num_layers`` layers (for compiling a slice of a big model)."""
        if not 0 < num_layers <= self.num_layers:
            raise ValueError(f"num_layers must be in 1..{self.num_layers}, got {num_layers}")
        return self.replace(
            name=f"{self.name}[:{num_layers}]",
            layer_types=self.layer_types[:num_layers],
            dense_layers=tuple(i for i in self.dense_layers if i < num_layers),
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
