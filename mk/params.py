"""mk's parameter tree: every tensor of a model (any mk.config describes) with its shape and the component it
belongs to.

This one list is the truth for shapes (random init, checkpoint checks), for bytes (``mk.sol``) and
for knock-outs, so the byte count and the model can never disagree about what exists. It also says which of its
matrices an INT8 scheme stores as codes and where their scales live (names and paths, no JAX: the numerics are
mk.quant's).

The tree is a flat dict keyed by path: ``embed``, ``final_norm`` and ``layers.{i}.{name}``.
Matrices are stored ``[in, out]`` (activations multiply from the left); experts ``[E, in, out]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import SLIDING, ModelConfig

# Component names: the same in byte counts, knock-outs, the reference, the kernel and the timing model.
SLIDING_ATTENTION = "sliding_attention"
FULL_ATTENTION = "full_attention"
SHARED_MLP = "shared_mlp"
EXPERTS = "experts"
ROUTER = "router"
NORMS = "norms"
HEAD = "head"
WEIGHT_COMPONENTS = (SLIDING_ATTENTION, FULL_ATTENTION, SHARED_MLP, EXPERTS, ROUTER, NORMS, HEAD)
EMBED = "embed"  # an untied embedding: the lookup reads one row per user, not the matrix
KNOCKOUTS = WEIGHT_COMPONENTS
# Not a component but a probe a knock-out set may hold: with the router knocked out (every user takes experts 0..k-1),
# the route known before the step where the chip holds every expert, so no expert tile waits for it
# (mk.plan.builder.route_known). Knocked out with the router it times the router's work and the stream's wait for it.
ROUTE_WAIT = "route_wait"
PROBES = (ROUTE_WAIT,)


def knocked_out(name: str) -> frozenset[str]:
    """What knocking out ``name`` switches off: a component alone, or the route's wait with the router it needs."""
    return frozenset({ROUTER, ROUTE_WAIT}) if name == ROUTE_WAIT else frozenset({name})


def attention_component(layer_type: str) -> str:
    return SLIDING_ATTENTION if layer_type == SLIDING else FULL_ATTENTION


@dataclass(frozen=True)
class ParamSpec:
    path: str
    shape: tuple[int, ...]
    component: str
    matrix: bool  # a matmul weight (quantisable); vectors and scales are not

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _attention_specs(cfg: ModelConfig, i: int, p: str) -> list[ParamSpec]:
    t = cfg.layer_types[i]
    H, hd, kv, nh = cfg.hidden_size, cfg.head_dim(t), cfg.kv_heads(t), cfg.num_heads
    att = attention_component(t)
    mla = cfg.latent_attention
    if mla is not None:  # DeepSeek's MLA: a query bottleneck (or none), one latent and one RoPE key a position
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        down = mla.down_rows or H  # a chip's block of rows where they are split over chips
        q = [ParamSpec(p + "q", (H, nh * qk), att, True)]
        if mla.q_lora_rank:
            q = [
                ParamSpec(p + "q_a", (down, mla.q_lora_rank), att, True),
                ParamSpec(p + "q_a_norm", (mla.q_lora_rank,), NORMS, False),
                ParamSpec(p + "q_b", (mla.q_lora_rank, nh * qk), att, True),
            ]
        return q + [
            ParamSpec(p + "kv_a", (down, mla.kv_lora_rank + mla.qk_rope_head_dim), att, True),
            ParamSpec(p + "kv_a_norm", (mla.kv_lora_rank,), NORMS, False),
            ParamSpec(p + "kv_b", (mla.kv_lora_rank, nh * (mla.qk_nope_head_dim + mla.v_head_dim)), att, True),
            ParamSpec(p + "o", (nh * mla.v_head_dim, H), att, True),
        ]
    specs = [ParamSpec(p + "q", (H, nh * hd), att, True), ParamSpec(p + "k", (H, kv * hd), att, True)]
    if cfg.has_v_proj(t):
        specs.append(ParamSpec(p + "v", (H, kv * hd), att, True))
    specs.append(ParamSpec(p + "o", (nh * hd, H), att, True))
    if cfg.attention_bias:
        widths = (("q", nh * hd), ("k", kv * hd), ("v", kv * hd), ("o", H))
        specs += [ParamSpec(p + f"{m}_bias", (w,), att, False) for m, w in widths]
    if cfg.sinks:
        specs.append(ParamSpec(p + "sinks", (nh,), att, False))
    return specs


def layer_param_specs(cfg: ModelConfig, i: int) -> list[ParamSpec]:
    """Layer ``i``'s tensors: Gemma 4's (q/k norms, sandwich norms, a layer scalar, the router's scales and a second
    pair of FFN norms beside the experts) or a pre-norm family's (``pre_ffn_norm`` is its post-attention norm); an
    MoE model's dense layers (DeepSeek-V3's first, Qwen3-MoE's between MoE ones) a plain MLP."""
    t = cfg.layer_types[i]
    H, hd = cfg.hidden_size, cfg.head_dim(t)
    gemma = cfg.sandwich_norms
    p = f"layers.{i}."
    specs = [ParamSpec(p + "input_norm", (H,), NORMS, False), *_attention_specs(cfg, i, p)]
    if cfg.qk_norm:
        specs += [ParamSpec(p + "q_norm", (hd,), NORMS, False), ParamSpec(p + "k_norm", (hd,), NORMS, False)]
    if gemma:
        specs.append(ParamSpec(p + "post_attn_norm", (H,), NORMS, False))
    specs.append(ParamSpec(p + "pre_ffn_norm", (H,), NORMS, False))
    mlp = cfg.mlp_width(i)
    if mlp:
        specs += [
            ParamSpec(p + "mlp_gate", (H, mlp), SHARED_MLP, True),
            ParamSpec(p + "mlp_up", (H, mlp), SHARED_MLP, True),
            ParamSpec(p + "mlp_down", (mlp, H), SHARED_MLP, True),
        ]
        if cfg.mlp_bias:
            widths = (("gate", mlp), ("up", mlp), ("down", H))
            specs += [ParamSpec(p + f"mlp_{m}_bias", (w,), SHARED_MLP, False) for m, w in widths]
    if gemma:
        specs.append(ParamSpec(p + "post_ffn_norm", (H,), NORMS, False))
    if cfg.layer_scalar and gemma:
        specs.append(ParamSpec(p + "layer_scalar", (1,), NORMS, False))
    if cfg.is_moe_layer(i):
        E, I = cfg.num_experts, cfg.expert_intermediate
        if cfg.router == "gemma4":
            specs.append(ParamSpec(p + "router_scale", (H,), ROUTER, False))
        specs.append(ParamSpec(p + "router_proj", (H, E), ROUTER, True))
        if cfg.router == "gemma4":
            specs += [
                ParamSpec(p + "expert_scale", (E,), ROUTER, False),
                ParamSpec(p + "pre_ffn_norm_2", (H,), NORMS, False),
            ]
        if cfg.expert_bias or cfg.router_bias:
            specs.append(ParamSpec(p + "router_bias", (E,), ROUTER, False))
        specs += [
            ParamSpec(p + "expert_gate", (E, H, I), EXPERTS, True),
            ParamSpec(p + "expert_up", (E, H, I), EXPERTS, True),
            ParamSpec(p + "expert_down", (E, I, H), EXPERTS, True),
        ]
        if cfg.expert_bias:
            specs += [
                ParamSpec(p + "expert_gate_up_bias", (E, 2 * I), EXPERTS, False),  # the gate's I first, then the up's
                ParamSpec(p + "expert_down_bias", (E, H), EXPERTS, False),
            ]
        if gemma:
            specs += [
                ParamSpec(p + "post_ffn_norm_1", (H,), NORMS, False),
                ParamSpec(p + "post_ffn_norm_2", (H,), NORMS, False),
            ]
    return specs


def param_specs(cfg: ModelConfig) -> list[ParamSpec]:
    """Every tensor of the model, in the order a decode step reads them. A tied embedding is the head; an untied one
    is only looked up (``EMBED``) and the head is its own matrix, read last, stored as the embedding is:
    ``[vocab, hidden]`` (each token's row)."""
    embed = HEAD if cfg.tied_embeddings else EMBED
    specs = [ParamSpec("embed", (cfg.vocab_size, cfg.hidden_size), embed, True)]
    for i in range(cfg.num_layers):
        specs += layer_param_specs(cfg, i)
    specs.append(ParamSpec("final_norm", (cfg.hidden_size,), NORMS, False))
    if not cfg.tied_embeddings:
        specs.append(ParamSpec("head", (cfg.vocab_size, cfg.hidden_size), HEAD, True))
    return specs


def layer_params(params: dict, i: int) -> dict:
    """The tensors of layer ``i`` keyed by their short name (``q``, ``mlp_gate``, ...)."""
    prefix = f"layers.{i}."
    return {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}


def count_params(cfg: ModelConfig) -> int:
    """All parameters, the tied embedding counted once."""
    return sum(s.size for s in param_specs(cfg))


def count_active_params(cfg: ModelConfig) -> int:
    """Parameters read for one token: the top-k experts of each layer instead of all of them, one row of an untied
    embedding."""
    total = 0
    for s in param_specs(cfg):
        if s.component == EXPERTS:
            total += s.size // cfg.num_experts * cfg.top_k
        elif s.component == EMBED:
            total += cfg.hidden_size
        else:
            total += s.size
    return total


def check_knockout(knockout) -> frozenset[str]:
    """Validate a set of component names to switch off."""
    knockout = frozenset(knockout or ())
    bad = sorted(knockout - set(KNOCKOUTS) - set(PROBES))
    if bad:
        raise ValueError(f"unknown component(s) to knock out {bad}; known: {', '.join(KNOCKOUTS + PROBES)}")
    if ROUTE_WAIT in knockout and ROUTER not in knockout:
        raise ValueError(f"{ROUTE_WAIT} needs the router knocked out too: only then are the experts known before the "
                         f"step; knock out {{{ROUTER!r}, {ROUTE_WAIT!r}}}")  # fmt: skip
    return knockout


# INT8 schemes: which matrices a scheme stores as INT8 codes, where their scales live, what a scale costs ----------
SCHEMES = ("none", "int8-experts", "int8")
SCALE_SUFFIX = "_qscale"
SCALE_BYTES = 4  # an INT8 matrix's scale (per output channel, or per input channel of a down projection): float32
# Down projections are scaled per input channel (their rows): split over chips by that axis, as the intermediate of
# a split expert or shared MLP is, each chip reads only its own rows' scales, 4 bytes a row of codes. Per output
# channel every chip would read all H scales of an expert for its few rows (4 / 88 = 4.5% of a split 26B-A4B
# expert's codes, at best).
INPUT_SCALED = ("mlp_down", "expert_down")


def scales_inputs(path: str) -> bool:
    """Whether matrix ``path`` ([..., in, out]; a parameter path or a stacked tensor name) has one scale per input
    channel (a down projection) rather than per output channel."""
    return path.removesuffix(SCALE_SUFFIX).rsplit(".", 1)[-1] in INPUT_SCALED


def scale_count(spec) -> float:
    """Scales of a quantized matrix (mk.params.ParamSpec): one per input or output channel, per expert."""
    return spec.size / spec.shape[-1 if scales_inputs(spec.path) else -2]


def tile_rows_scaled(cfg: ModelConfig, path: str) -> bool:
    """Whether a tile of matrix ``path`` in the kernel's layout has one scale per row: it is stored with its outputs on
    rows (ModelConfig.outputs_on_rows) and scaled per output channel, or as it is and scaled per input channel."""
    return cfg.outputs_on_rows(path) != scales_inputs(path)


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization {scheme!r}; known: {', '.join(SCHEMES)}")
    return scheme


def scale_path(path: str) -> str:
    """Where a quantized matrix's scales live in the parameter tree."""
    return path + SCALE_SUFFIX


def quantized_paths(cfg: ModelConfig, scheme: str) -> tuple[str, ...]:
    """The matrices ``scheme`` stores as INT8, in mk.params order."""
    return quantized_in(param_specs(cfg), scheme)


def quantized_in(specs, scheme: str) -> tuple[str, ...]:
    """The paths of the matrices among ``specs`` (mk.params.ParamSpec) that ``scheme`` stores as INT8: every
    matrix but the head and embedding for ``int8``, the experts' for ``int8-experts``."""
    check_scheme(scheme)
    if scheme == "none":
        return ()
    return tuple(
        s.path
        for s in specs
        if s.matrix and s.component not in (HEAD, EMBED) and (scheme == "int8" or s.component == EXPERTS)
    )
