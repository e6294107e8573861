"""Bytes per token against counts written out by hand, the seed's speed-of-light table, and the sweeps."""

import math
from pathlib import Path

import pytest
from test_config import TINY_HF, transformers_count

from mk import sol
from mk.config import GEMMA4_26B_A4B, GEMMA4_31B, TINY_MOE, from_hf_dict, get_config
from mk.dtypes import get_dtype
from mk.params import count_params, param_specs
from mk.published import published, published_table
from mk.routing import expected_distinct_experts

SEED_CHIPS = ["h100", "h200", "b200", "tpu-v5e-8", "tpu-v6e-8"]


def hand_count_26b(context: int) -> dict[str, int]:
    """Elements (weights) and positions x values (KV) read at batch 1, by hand from the published 26B-A4B
    config's sizes alone (not from mk.config)."""
    H, V = 2816, 262_144
    sliding_layers, full_layers = 25, 5
    sliding_attn = H * 16 * 256 + H * 8 * 256 + H * 8 * 256 + 16 * 256 * H  # q, k, v, o
    full_attn = H * 16 * 512 + H * 2 * 512 + 16 * 512 * H  # q, k (K=V: no v), o
    return {
        "sliding_attention": sliding_layers * sliding_attn,
        "full_attention": full_layers * full_attn,
        "shared_mlp": 30 * 3 * H * 2112,
        "experts": 30 * 8 * 3 * H * 704,  # top-8 of 128 experts
        "router": 30 * (H * 128 + H + 128),  # proj, scale, per-expert scale
        # input, post-attn, pre-ffn, post-ffn, pre-ffn-2, post-ffn-1, post-ffn-2 norms; q/k norms; layer scalar
        "norms": sliding_layers * (7 * H + 2 * 256 + 1) + full_layers * (7 * H + 2 * 512 + 1) + H,
        "head": V * H,  # tied embedding, read once
        "kv_sliding": sliding_layers * min(context, 1024) * 2 * 8 * 256,  # K and V
        "kv_full": full_layers * context * 2 * 2 * 512,
    }


def hand_count_31b(context: int) -> dict[str, int]:
    H, V = 5376, 262_144
    return {
        "sliding_attention": 50 * (H * 32 * 256 + 2 * H * 16 * 256 + 32 * 256 * H),
        "full_attention": 10 * (H * 32 * 512 + H * 4 * 512 + 32 * 512 * H),
        "shared_mlp": 60 * 3 * H * 21504,
        "experts": 0,
        "router": 0,
        "norms": 50 * (4 * H + 2 * 256 + 1) + 10 * (4 * H + 2 * 512 + 1) + H,
        "head": V * H,
        "kv_sliding": 50 * min(context, 1024) * 2 * 16 * 256,
        "kv_full": 10 * context * 2 * 4 * 512,
    }


def test_hand_count_agrees_with_published_active_params():
    weights = sum(v for k, v in hand_count_26b(1024).items() if not k.startswith("kv_"))
    assert weights == 3_822_530_590


@pytest.mark.parametrize(
    "cfg, hand", [(GEMMA4_26B_A4B, hand_count_26b), (GEMMA4_31B, hand_count_31b)], ids=["26b-a4b", "31b"]
)
@pytest.mark.parametrize("context", [1, 1024, 8192, 131_072])
def test_bf16_bytes_by_component_match_hand_count(cfg, hand, context):
    bc = sol.bytes_per_token(cfg, context)
    expected = {k: 2 * v for k, v in hand(context).items()}  # BF16: 2 bytes per element
    assert bc.by_component == pytest.approx(expected, rel=1e-12)
    assert bc.total == pytest.approx(sum(expected.values()), rel=1e-12)


def test_reference_totals_at_1k():
    # By hand from the published configs, BF16: 7.645 GB of weights + 0.231 GB of KV = 7.876 GB; 31B: 61.39 + 0.923 GB.
    moe, dense = sol.bytes_per_token(GEMMA4_26B_A4B, 1024), sol.bytes_per_token(GEMMA4_31B, 1024)
    assert (moe.weights, moe.kv, moe.total) == pytest.approx((7.645e9, 0.2307e9, 7.876e9), rel=1e-3)
    assert (dense.weights, dense.kv) == pytest.approx((61.39e9, 0.923e9), rel=1e-3)


def test_fp8_and_int8_experts_bytes():
    h = hand_count_26b(1024)
    matrices = sum(h[k] for k in ("sliding_attention", "full_attention", "shared_mlp", "experts", "head"))
    router_matrix = 30 * 2816 * 128
    vectors = h["norms"] + h["router"] - router_matrix
    kv = h["kv_sliding"] + h["kv_full"]
    fp8 = sol.bytes_per_token(GEMMA4_26B_A4B, 1024, dtype="fp8")
    assert fp8.total == pytest.approx(1 * (matrices + router_matrix) + 2 * vectors + 2 * kv, rel=1e-12)
    # INT8 experts: 1 byte per element instead of 2, plus a float32 scale per output channel of each expert read
    # (per input channel of its down projection: 704)
    expert_scales = 4 * 30 * 8 * (704 + 704 + 704)  # gate, up and down of the top-8 experts
    bf16 = sol.bytes_per_token(GEMMA4_26B_A4B, 1024)
    int8 = sol.bytes_per_token(GEMMA4_26B_A4B, 1024, dtype="int8-experts")
    assert int8.total == pytest.approx(bf16.total - h["experts"] + expert_scales, rel=1e-12)
    assert int8.by_component["experts"] == pytest.approx(h["experts"] + expert_scales, rel=1e-12)
    f32 = sol.bytes_per_token(GEMMA4_26B_A4B, 1024, dtype="f32")
    assert f32.total == pytest.approx(2 * sol.bytes_per_token(GEMMA4_26B_A4B, 1024).total, rel=1e-12)


def test_int8_bytes_keep_the_head_in_bf16_and_count_every_scale():
    h = hand_count_26b(1024)
    scales = 4 * (  # a float32 per output channel of every matrix but the head (per input channel: down)
        25 * (16 * 256 + 8 * 256 + 8 * 256 + 2816)  # sliding q, k, v, o
        + 5 * (16 * 512 + 2 * 512 + 2816)  # full q, k, o
        + 30 * (2112 + 2112 + 2112)  # shared MLP gate, up, down
        + 30 * 128  # router projection
        + 30 * 8 * (704 + 704 + 704)  # the top-8 experts' gate, up, down
    )
    int8_matrices = (
        sum(h[k] for k in ("sliding_attention", "full_attention", "shared_mlp", "experts")) + 30 * 2816 * 128
    )
    bf16 = sol.bytes_per_token(GEMMA4_26B_A4B, 1024)
    int8 = sol.bytes_per_token(GEMMA4_26B_A4B, 1024, dtype="int8")
    assert int8.total == pytest.approx(bf16.total - int8_matrices + scales, rel=1e-12)
    assert int8.by_component["head"] == bf16.by_component["head"] == 2 * h["head"]
    assert sol.bytes_per_token(GEMMA4_26B_A4B, 1024, dtype="fp8").by_component["head"] == h["head"]
    # a float base with an INT8 scheme: bf16+int8 is int8; f32+int8-experts keeps the rest in f32
    assert sol.bytes_per_token(GEMMA4_26B_A4B, 1024, dtype="bf16+int8").by_component == int8.by_component
    f32 = sol.bytes_per_token(GEMMA4_26B_A4B, 1024, dtype="f32")
    mixed = sol.bytes_per_token(GEMMA4_26B_A4B, 1024, dtype="f32+int8-experts")
    experts = sol.bytes_per_token(GEMMA4_26B_A4B, 1024, dtype="int8-experts").by_component["experts"]
    assert mixed.by_component == pytest.approx({**f32.by_component, "experts": experts}, rel=1e-12)
    with pytest.raises(ValueError, match="BASE\\+SCHEME"):
        get_dtype("fp8+int8")


def test_batch_reads_expected_distinct_experts_and_kv_per_user():
    E, k, B = 128, 8, 8
    expected_experts = E * (1 - (1 - k / E) ** B)
    assert expected_distinct_experts(E, k, B) == pytest.approx(expected_experts)
    assert expected_distinct_experts(E, k, 1) == pytest.approx(k)
    one, eight = sol.bytes_per_token(GEMMA4_26B_A4B, 1024), sol.bytes_per_token(GEMMA4_26B_A4B, 1024, batch=B)
    assert eight.by_component["experts"] == pytest.approx(one.by_component["experts"] * expected_experts / k)
    assert eight.kv == pytest.approx(B * one.kv)
    assert eight.by_component["head"] == one.by_component["head"]  # weights read once for all users
    # never more than all experts
    assert expected_distinct_experts(E, k, 10_000) <= E


def test_seed_speed_of_light_table_within_1_5_percent():
    pub = published_table()
    rows = pub[pub["quantity"] == "speed_of_light"]
    assert sorted(rows["chip"]) == sorted(SEED_CHIPS)
    for r in rows.itertuples():
        s = sol.speed_of_light(GEMMA4_26B_A4B, r.chip, int(r.context), int(r.batch), r.dtype)
        assert s.tokens_per_s == pytest.approx(r.value, rel=0.015), r.chip
    # and the seed's bytes per token ("7.8 GB")
    assert sol.bytes_per_token(GEMMA4_26B_A4B, 1024).total == pytest.approx(published("bytes_per_token_moe"), rel=0.015)


def test_sol_table_compares_with_published():
    t = sol.sol_table([GEMMA4_26B_A4B.name, GEMMA4_31B.name], SEED_CHIPS)
    assert len(t) == 10 and set(t["model"]) == {"gemma4-26b-a4b", "gemma4-31b"}
    moe = t[t["model"] == "gemma4-26b-a4b"]
    assert moe["diff_pct"].abs().max() < 1.5
    assert moe["published_tokens_per_s"].notna().all()
    assert t[t["model"] == "gemma4-31b"]["published_tokens_per_s"].isna().all()
    assert t["tokens_per_s"].tolist() == pytest.approx((t["bandwidth_Bps"] / t["bytes_per_token"]).tolist(), rel=1e-12)
    assert t["kind"].str.startswith("modelled").all()


def test_fp8_h100_speed_of_light_and_vllm():
    # The seed: vLLM 0.30 on an H100 with FP8 reaches 173 tok/s, "21% of the speed of light".
    runs = sol.published_vs_sol().set_index("key")
    vllm = runs.loc["vllm_h100_moe_tps"]
    assert vllm["published_tokens_per_s"] == published("vllm_h100_moe_tps")
    sol_h100 = sol.speed_of_light(GEMMA4_26B_A4B, "h100", 1024, 1, "fp8")
    assert vllm["sol_tokens_per_s"] == pytest.approx(sol_h100.tokens_per_s)
    assert vllm["fraction_of_sol"] == pytest.approx(published("vllm_h100_moe_sol_fraction"), abs=0.005)
    # against BF16 the same number would be about twice that fraction: the 21% holds only against FP8
    bf16 = sol.speed_of_light(GEMMA4_26B_A4B, "h100", 1024).tokens_per_s
    assert published("vllm_h100_moe_tps") / bf16 > 0.35
    mk = runs.loc["mk_v5e8_moe_tps"]
    assert mk["fraction_of_sol"] == pytest.approx(published("mk_v5e8_moe_sol_fraction"), abs=0.005)


def test_context_sweep_sliding_kv_saturates_at_window():
    ctx = sol.context_sweep([GEMMA4_26B_A4B], ["h100"], [512, 1024, 4096, 131_072])
    sliding = ctx.set_index("context")["kv_sliding_bytes"]
    assert sliding[512] < sliding[1024] == sliding[4096] == sliding[131_072]
    full = ctx.set_index("context")["kv_full_bytes"]
    assert full[131_072] == pytest.approx(128 * full[1024])
    assert ctx["tokens_per_s"].is_monotonic_decreasing


def test_batch_sweep_per_user_falls_total_rises():
    b = sol.batch_sweep(GEMMA4_26B_A4B.name, ["tpu-v5e-8"], [1, 2, 8, 64])
    assert b["tokens_per_s"].is_monotonic_decreasing and b["tokens_per_s_total"].is_monotonic_increasing
    assert b["tokens_per_s_total"].tolist() == pytest.approx((b["batch"] * b["tokens_per_s"]).tolist(), rel=1e-12)
    assert b["expected_experts"].iloc[0] == pytest.approx(8) and b["expected_experts"].iloc[-1] < 128


def test_component_table_shares_sum_to_one():
    c = sol.component_table([GEMMA4_26B_A4B, TINY_MOE])
    assert c.groupby("model")["share"].sum().tolist() == pytest.approx([1, 1])
    assert list(c[c.model == GEMMA4_26B_A4B.name]["component"]) == list(sol.COMPONENT_ORDER)


def test_speed_of_light_dict():
    s = sol.speed_of_light(GEMMA4_26B_A4B, "h100", 1024, batch=4)
    d = s.to_dict()
    assert d["step_ms"] == pytest.approx(1e3 * s.bytes_per_token / 3.35e12)
    assert d["tokens_per_s_total"] == pytest.approx(4 * d["tokens_per_s"])
    assert math.isclose(sum(d["bytes_by_component"].values()), d["bytes_per_token"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(context=0), "context must be a positive integer, got 0"),
        (dict(context=-5), "context must be a positive integer, got -5"),
        (dict(context=1024, batch=0), "batch must be a positive integer, got 0"),
        (dict(context=1024.0), "context must be a positive integer"),
        (dict(context=1024, dtype="fp4"), "unknown dtype 'fp4'; known: bf16, fp8, fp8-block, int8-experts, f32"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sol.bytes_per_token(GEMMA4_26B_A4B, **kwargs)


def test_unknown_chip_in_speed_of_light():
    with pytest.raises(ValueError, match="unknown chip 'a100'"):
        sol.speed_of_light(GEMMA4_26B_A4B, "a100", 1024)


# Other decoders, read from their config.json (tests/test_config.py holds their parameter counts against transformers)
CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"


@pytest.mark.parametrize("folder", ["llama-3.2-1b", "qwen3-30b-a3b", "deepseek-v3"])
def test_cli_sol_reads_a_config_json(mk_json, folder):
    """``python -m mk sol --model path/to/config.json``: the bytes of mk.sol for that decoder, by component; an
    MoE model reads top-k experts of its routed ones, MLA its compressed cache."""
    got = mk_json("sol", "--model", CONFIGS / folder / "config.json", "--chip", "h100", "--context", 1024, "--json")
    cfg = get_config(CONFIGS / folder)
    assert got["model"] == folder and got["bytes_per_token"] == sol.bytes_per_token(cfg, 1024).total
    kv = got["bytes_by_component"]["kv_full"]
    assert kv == 1024 * sum(cfg.cache_elements(t) for t in cfg.layer_types) * 2  # bf16, every layer full
    assert (got["bytes_by_component"]["experts"] > 0) == cfg.is_moe


@pytest.mark.parametrize("name", TINY_HF)
def test_every_config_mk_config_takes_is_planned_and_timed(name):
    """A tiny config of each family and variant (biased projections, sliding Qwen3 layers, dense layers between
    Qwen3-MoE's MoE ones, Mixtral's window too): the step plan builds and mk.timing times it, never faster than the
    speed of light."""
    from mk.timing import predict

    cfg = from_hf_dict(TINY_HF[name], name)
    for engine in ("megakernel", "general"):
        assert predict(cfg, "h100", 64, 2, engine).step_s >= sol.speed_of_light(cfg, "h100", 64, 2).step_s * (1 - 1e-12)


# Gemma 2 and 3 at a full-size model's shapes (no config of theirs is in data/configs)
GEMMA_SIZE = dict(vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=6,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=256, sliding_window=4096)  # fmt: skip


def plan_reads_sols_bytes(cfg) -> None:
    """The step plan streams, of real weights and cache, the bytes mk.sol counts, within 1%."""
    from mk.plan import build_plan

    for context in (1024, 16384):
        plan = build_plan(cfg, 1, context, weight_dtype="bfloat16", kv_dtype="bfloat16")
        total = sol.bytes_per_token(cfg, context, 1, "bf16").total
        assert abs(plan.payload_bytes + plan.kv_payload_bytes - total) / total < 0.01


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_gemma_2_and_3_plans_read_mk_sols_bytes(family):
    d = dict(TINY_HF[family], **GEMMA_SIZE)
    assert count_params(from_hf_dict(d)) == transformers_count(d)
    cfg = from_hf_dict(d, family)
    assert not cfg.runnable and cfg.family == family and not cfg.layer_scalar
    plan_reads_sols_bytes(cfg)


@pytest.mark.parametrize(
    "variant, change",
    [
        ("llama", {}),  # attention and MLP biases
        ("qwen3", dict(max_window_layers=3)),  # sliding layers from the fourth on
        ("qwen3_moe", dict(moe_intermediate_size=1024)),  # dense layers between MoE ones
        ("mixtral", {}),  # a window in every layer
    ],
)
def test_pre_norm_variants_plans_read_mk_sols_bytes(variant, change):
    """The pre-norm families' variants mk plans and times but does not run, at a full-size model's shapes."""
    cfg = from_hf_dict(dict(TINY_HF[variant], **GEMMA_SIZE, **change), variant)
    assert not cfg.runnable
    if variant in ("qwen3", "mixtral"):  # a sliding layer reads at most its window of the cache
        assert sol.bytes_per_token(cfg, 16384).by_component["kv_sliding"] == pytest.approx(
            len(cfg.sliding_layers) * 4096 * 2 * 8 * 256 * 2
        )
    plan_reads_sols_bytes(cfg)


@pytest.mark.parametrize(
    "model, dtype, per_value",
    [("kimi-k2", "int4", 0.5 + 2 / 32), ("gpt-oss-20b", "mxfp4", 0.5 + 1 / 32), ("gemma4-26b-a4b", "int4", 0.5625)],
)
def test_four_bit_expert_formats_count_their_group_scales_in_the_experts_only(model, dtype, per_value):
    """INT4 (a BF16 scale per 32 values) and MXFP4 (an 8-bit scale per 32) change the routed experts' matrices only:
    half a byte a value plus the scale's share, against BF16's two (gpt-oss's expert biases stay vectors, as its
    checkpoint holds them); every other component reads what BF16 reads."""
    four, bf16 = sol.bytes_per_token(model, 1024, 1, dtype), sol.bytes_per_token(model, 1024, 1, "bf16")
    specs = [s for s in param_specs(get_config(model)) if s.component == "experts"]
    matrices, vectors = sum(s.size for s in specs if s.matrix), sum(s.size for s in specs if not s.matrix)
    vector_bytes = get_dtype(dtype).vector
    assert get_dtype("bf16").vector == vector_bytes
    read = bf16.by_component["experts"] / (2 * matrices + vector_bytes * vectors)  # the share of the experts read
    expected = read * (per_value * matrices + vector_bytes * vectors)
    assert four.by_component["experts"] == pytest.approx(expected, rel=1e-12)
    for c, v in bf16.by_component.items():
        if c != "experts":
            assert four.by_component[c] == v, c


@pytest.mark.parametrize("dtype", ["int4", "mxfp4"])
def test_a_format_of_routed_experts_is_refused_for_a_dense_model(dtype):
    with pytest.raises(ValueError, match=f"dtype '{dtype}' is a format of routed experts.*gemma4-31b has none"):
        sol.bytes_per_token("gemma4-31b", 1024, 1, dtype)


def test_fp8_block_is_deepseek_v3s_checkpoint_format_beside_the_write_ups_fp8():
    """fp8-block: every matrix but the head one byte plus an F32 scale per 128 x 128 block, the head BF16; the
    write-up's fp8 (its speed-of-light table) reads the head in FP8 and no scales."""
    block, fp8, bf16 = (sol.bytes_per_token("deepseek-v3", 1024, 1, d) for d in ("fp8-block", "fp8", "bf16"))
    assert block.by_component["head"] == bf16.by_component["head"] == 2 * fp8.by_component["head"]
    for c in ("full_attention", "shared_mlp", "experts"):
        assert block.by_component[c] == pytest.approx(fp8.by_component[c] * (1 + 4 / 128**2), rel=1e-9), c


def test_the_format_table_skips_expert_formats_for_a_dense_model_and_names_each_tpus_smallest_slice():
    t = sol.format_table(["gemma4-31b", "kimi-k2"], ["bf16", "int4"], 1024)
    assert list(zip(t.model, t.dtype)) == [("gemma4-31b", "bf16"), ("kimi-k2", "bf16"), ("kimi-k2", "int4")]
    kimi = t[t.model == "kimi-k2"].set_index("dtype")
    assert kimi.loc["bf16", "tpu-v5e slice"] == "tpu-v5e-256" and kimi.loc["bf16", "tpu-v5e hosts"] == 32
    assert kimi.loc["int4", "held_GB"] < kimi.loc["bf16", "held_GB"] / 3  # the experts hold almost all of it
