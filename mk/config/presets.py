"""The presets: the two real Gemma 4 models at their exact shapes, tiny test models of each family mk runs, and
cpu-moe (``python -m mk models`` lists them)."""

from __future__ import annotations

from .hf import from_hf_dict
from .model import FULL, PRE_NORM_WIRING, SLIDING, ModelConfig, RopeScaling, period_pattern

PRESETS: dict[str, ModelConfig] = {}


def _register(cfg: ModelConfig) -> ModelConfig:
    PRESETS[cfg.name] = cfg
    return cfg


def _gemma4(
    name: str, hidden_size: int, layers: int, num_heads: int, kv_heads: tuple[int, int], **widths
) -> ModelConfig:
    """A Gemma 4 model at its size: the family's vocabulary, head dims (256 sliding, 512 full), window (1024) and
    5:1 sliding/full pattern; ``kv_heads``: (sliding, full); ``widths``: its MLP's and experts'."""
    return ModelConfig(
        name=name,
        vocab_size=262_144,
        hidden_size=hidden_size,
        layer_types=period_pattern(layers),
        num_heads=num_heads,
        sliding_kv_heads=kv_heads[0],
        sliding_head_dim=256,
        full_kv_heads=kv_heads[1],
        full_head_dim=512,
        sliding_window=1024,
        **widths,
    )


GEMMA4_26B_A4B = _register(
    _gemma4(
        "gemma4-26b-a4b", 2816, layers=30, num_heads=16, kv_heads=(8, 2), mlp_intermediate=2112, num_experts=128,
        top_k=8, expert_intermediate=704,
    )
)  # fmt: skip
GEMMA4_31B = _register(_gemma4("gemma4-31b", 5376, layers=60, num_heads=32, kv_heads=(16, 4), mlp_intermediate=21504))
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
_PRE_NORM = dict(
    PRE_NORM_WIRING,
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
        layer_types=period_pattern(6),
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

# The other families the kernel runs, tiny, at shapes libtpu's Mosaic compiles (every width a multiple of 128 or a
# head dim of 64), for the kernel's parity on a real chip (mk.measure.parity) and its ahead-of-time compile; written
# as transformers' config keys, read by the families' own adapters. Three layers each, ragged prompts cross a window.
_TINY_HF = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, tie_word_embeddings=False)  # fmt: skip
TINY_MIXTRAL = _register(
    from_hf_dict(
        dict(_TINY_HF, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2),
        "tiny-mixtral",
    )
)
# sinks, biases, the clamped SwiGLU (its limit lowered so it bites at these sizes), YaRN, sliding and full layers
TINY_GPT_OSS = _register(
    from_hf_dict(
        dict(
            _TINY_HF,
            model_type="gpt_oss",
            intermediate_size=128,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=16,
            swiglu_limit=1.5,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=150000.0,
                factor=32.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=4096,
            ),
        ),  # fmt: skip
        "tiny-gpt-oss",
    )
)
# MLA with a query LoRA, interleaved RoPE, one dense layer, then 8 routed experts in 2 groups beside a shared one
TINY_DEEPSEEK_V3 = _register(
    from_hf_dict(
        dict(
            _TINY_HF,
            model_type="deepseek_v3",
            num_key_value_heads=4,
            moe_intermediate_size=128,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=2.5,
            first_k_dense_replace=1,
            q_lora_rank=128,
            kv_lora_rank=128,
            qk_rope_head_dim=64,
            qk_nope_head_dim=64,
            v_head_dim=64,
            rope_interleave=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        ),
        "tiny-deepseek-v3",
    )
)
