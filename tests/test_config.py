"""Model configs (Gemma 4 and the pre-norm families): exact parameter counts, loading Hugging Face configs, and clear
validation errors."""

import json
import math
from pathlib import Path

import pytest

from mk.config import (
    CONFIG_FAMILIES,
    FULL,
    GEMMA4_26B_A4B,
    GEMMA4_31B,
    PRESETS,
    SLIDING,
    TINY_LLAMA,
    TINY_MOE,
    TINY_QWEN3_MOE,
    ModelConfig,
    YarnScaling,
    from_hf_dict,
    get_config,
    load_hf_config,
    to_hf_dict,
)
from mk.config.hf import ARCH_FIELDS
from mk.params import count_active_params, count_params


# Published totals (transformers' Gemma 4 conversion script and the real checkpoints' tensor listings).
@pytest.mark.parametrize(
    "cfg, total, active",
    [
        (GEMMA4_26B_A4B, 25_233_141_790, 3_822_530_590),
        (GEMMA4_31B, 30_697_345_340, 30_697_345_340),
    ],
    ids=["26b-a4b", "31b"],
)
def test_parameter_counts_match_published_totals(cfg, total, active):
    assert count_params(cfg) == total
    assert count_active_params(cfg) == active


def test_layer_pattern_five_sliding_one_full():
    assert GEMMA4_26B_A4B.full_layers == (5, 11, 17, 23, 29)
    assert GEMMA4_31B.full_layers == tuple(range(5, 60, 6))
    assert GEMMA4_26B_A4B.layer_types.count(SLIDING) == 25


def test_cache_positions_saturate_at_window_on_sliding_layers_only():
    c = GEMMA4_26B_A4B
    assert c.cache_positions(SLIDING, 500) == 500
    assert c.cache_positions(SLIDING, 100_000) == c.sliding_window == 1024
    assert c.cache_positions(FULL, 100_000) == 100_000


@pytest.mark.parametrize("cfg", list(PRESETS.values()), ids=list(PRESETS))
def test_hf_round_trip_plain_and_nested(cfg):
    d = to_hf_dict(cfg)
    assert from_hf_dict(d, name=cfg.name) == cfg
    nested = {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": d,
        "vision_config": {"hidden_size": 1152},
    }
    assert from_hf_dict(nested, name=cfg.name) == cfg


def test_load_hf_config_reads_a_folder_or_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": to_hf_dict(GEMMA4_26B_A4B)}))
    assert load_hf_config(tmp_path).replace(name=GEMMA4_26B_A4B.name) == GEMMA4_26B_A4B
    assert load_hf_config(tmp_path / "config.json").name == tmp_path.name
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_hf_config(tmp_path / "missing")


@pytest.mark.parametrize("multimodal", [False, True], ids=["Gemma4TextConfig", "Gemma4Config"])
def test_reads_what_transformers_save_pretrained_writes(tmp_path, multimodal):
    """transformers writes the full-layer shapes as per_layer_config, and nests text_config in the multimodal config."""
    gemma4 = pytest.importorskip("transformers.models.gemma4")
    d = {k: v for k, v in to_hf_dict(TINY_MOE).items() if k not in ("architectures", "model_type")}
    text = gemma4.Gemma4TextConfig(**d)
    hf = gemma4.Gemma4Config(text_config=text.to_dict()) if multimodal else text
    hf.save_pretrained(tmp_path)
    assert ("text_config" in json.loads((tmp_path / "config.json").read_text())) == multimodal
    assert load_hf_config(tmp_path) == TINY_MOE.replace(name=tmp_path.name)


def test_hf_config_without_layer_types_gets_the_5_1_pattern():
    d = to_hf_dict(GEMMA4_31B)
    del d["layer_types"]
    assert from_hf_dict(d).layer_types == GEMMA4_31B.layer_types


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(model_type="gpt2"), r"model_type is 'gpt2': mk runs gemma4_text, llama, qwen3, qwen3_moe, mixtral"),
        (dict(hidden_size_per_layer_input=256), "per-layer input embeddings"),
        (dict(num_kv_shared_layers=4), "KV sharing"),
        (dict(tie_word_embeddings=False), "untied"),
        (dict(layer_types=["sliding_attention", "chunked"]), "layer_types must list"),
    ],
)
def test_hf_dict_rejects_unsupported_configs(change, message):
    d = {**to_hf_dict(TINY_MOE), **change}
    with pytest.raises(ValueError, match=message):
        from_hf_dict(d)


def test_hf_dict_missing_keys_are_named():
    d = to_hf_dict(TINY_MOE)
    del d["hidden_size"], d["sliding_window"]
    with pytest.raises(ValueError, match=r"missing \['hidden_size', 'sliding_window'\]"):
        from_hf_dict(d)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(hidden_size=0), "hidden_size must be a positive integer, got 0"),
        (dict(sliding_kv_heads=3), r"num_heads=2 is not a multiple of the sliding KV heads \(3\)"),
        (dict(layer_types=()), "layer_types is empty"),
        (dict(layer_types=("sliding", "global")), "each must be one of"),
        (dict(top_k=9), "top_k <= num_experts"),
        (dict(sliding_window=2.5), "sliding_window must be a positive integer"),
    ],
)
def test_invalid_config_names_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        TINY_MOE.replace(**change)


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ValueError, match="unknown model 'gemma5'.*gemma4-26b-a4b.*gemma4-31b"):
        get_config("gemma5")


def test_truncated_keeps_shapes():
    t = GEMMA4_31B.truncated(6)
    assert t.num_layers == 6 and t.full_layers == (5,) and t.hidden_size == GEMMA4_31B.hidden_size
    with pytest.raises(ValueError, match="1..60"):
        GEMMA4_31B.truncated(0)
    assert isinstance(t, ModelConfig)


@pytest.mark.parametrize("cfg", [TINY_LLAMA, TINY_QWEN3_MOE], ids=lambda c: c.name)
def test_other_families_round_trip_through_their_hf_config(cfg):
    assert from_hf_dict(to_hf_dict(cfg), cfg.name) == cfg


@pytest.mark.parametrize(
    "folder, family, what",
    [
        ("llama-3.2-1b", "llama", dict(tied_embeddings=True, qk_norm=False, num_experts=0)),
        ("llama-3.1-8b", "llama", dict(tied_embeddings=False, full_rope_theta=500_000.0)),
        ("qwen3-8b", "qwen3", dict(qk_norm=True, tied_embeddings=False)),
        ("qwen3-30b-a3b", "qwen3_moe", dict(num_experts=128, top_k=8, mlp_intermediate=0, norm_topk=True)),
        ("mixtral-8x7b", "mixtral", dict(num_experts=8, top_k=2, expert_intermediate=14336, qk_norm=False)),
    ],
)
def test_full_size_configs_of_other_families(folder, family, what):
    cfg = load_hf_config(Path(__file__).resolve().parent.parent / "data" / "configs" / folder)
    assert cfg.family == family and not cfg.sliding_layers and cfg.activation == "silu" and not cfg.sandwich_norms
    assert {k: getattr(cfg, k) for k in what} == what
    if folder.startswith("llama-3"):  # Llama 3.x's RoPE scaling is read, not dropped
        assert cfg.rope_scaling is not None and cfg.rope_scaling.original_max_position_embeddings == 8192


@pytest.mark.parametrize(
    "change, variant",
    [
        (dict(attention_bias=True), "attention biases"),
        (dict(use_sliding_window=True, sliding_window=4096, max_window_layers=1), "sliding-window layers"),
        (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}), "yarn RoPE scaling"),
        (dict(mlp_only_layers=[0], intermediate_size=256), "dense layers among MoE layers"),
    ],
)
def test_other_families_variants_are_described_and_refused_by_the_engines_by_name(change, variant):
    """What a pre-norm family's config may say beyond what mk runs is read into the one description (planned, timed
    and counted); the reference and the kernel refuse it naming the variant, and to_hf_dict writes runnable models
    only."""
    cfg = from_hf_dict({**to_hf_dict(TINY_QWEN3_MOE), **change}, "variant")
    assert cfg.variants_not_run == (variant,) and not cfg.runnable
    message = rf"variant is a qwen3_moe model with {variant}: mk plans and times it .* run gemma4_text, llama"
    with pytest.raises(ValueError, match=message):
        cfg.check_runnable()
    with pytest.raises(ValueError, match=message):
        to_hf_dict(cfg)


def test_other_families_refuse_what_mk_does_not_describe():
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        from_hf_dict({**to_hf_dict(TINY_QWEN3_MOE), "hidden_act": "gelu"})


def test_a_model_without_sliding_layers_needs_no_sliding_shapes():
    assert TINY_LLAMA.sliding_window == 0 and not TINY_LLAMA.sliding_layers
    with pytest.raises(ValueError, match="sliding_window must be a positive integer"):
        TINY_LLAMA.replace(layer_types=("sliding", "full", "full"))
    with pytest.raises(ValueError, match="shared MLP beside its experts"):
        TINY_MOE.replace(mlp_intermediate=0)


@pytest.mark.parametrize(
    "name, family, factor, betas",
    [("deepseek-v3", "deepseek_v3", 40.0, (32.0, 1.0)), ("kimi-k2", "kimi_k2", 32.0, (1.0, 1.0))],
)
def test_deepseek_v3_and_kimi_k2_run_in_both_engines_with_yarn(name, family, factor, betas):
    """The published DeepSeek-V3 and Kimi K2 configs (YaRN rope_scaling, mscale = mscale_all_dim = 1) are run by the
    reference (tests/test_mla.py holds YaRN to transformers on tiny checkpoints) and by the megakernel
    (tests/test_mla_kernel.py), which splits their query heads over chips by heads only (by positions: refused by
    name)."""
    from mk.kernel_setup import AttentionSplit, KernelSetup
    from mk.megakernel.engine import MegakernelEngine

    cfg = get_config(name)
    assert cfg.family == family and cfg.runnable and not cfg.variants_not_run and not cfg.rope_scaling_kind
    y = cfg.rope_scaling
    assert isinstance(y, YarnScaling) and (y.factor, y.original_max_position_embeddings) == (factor, 4096)
    assert (y.beta_fast, y.beta_slow, y.mscale, y.mscale_all_dim) == (*betas, 1.0, 1.0)
    assert y.attention_scale == 1.0 and y.score_factor == pytest.approx((0.1 * math.log(factor) + 1) ** 2)
    assert cfg.score_scale("full") == pytest.approx(192**-0.5 * y.score_factor)
    cfg.check_runnable("reference")
    cfg.check_runnable("megakernel")
    with pytest.raises(ValueError, match="splits multi-head latent attention over chips by heads only"):
        MegakernelEngine(cfg, setup=KernelSetup(8, attention_split=AttentionSplit.USERS))


def test_gpt_oss_runs_in_the_reference_and_the_kernel():
    """gpt-oss's published config: both engines run it (tests/test_gpt_oss.py holds the reference to transformers,
    tests/test_gpt_oss_kernel.py the megakernel to the reference); its 64 query heads split over 8 chips, each chip
    its heads' biases and sinks in a vector table of its own."""
    from mk.kernel_setup import KernelSetup
    from mk.sharding import heads_split, vectors_split

    cfg = load_hf_config(Path(__file__).resolve().parent.parent / "data" / "configs" / "gpt-oss-20b")
    assert cfg.family == "gpt_oss" and cfg.runnable and cfg.rope_scaling.factor == 32.0
    cfg.check_runnable("reference")
    cfg.check_runnable("megakernel")
    assert heads_split(cfg, 8) and vectors_split(cfg, KernelSetup(8))
    assert not vectors_split(get_config("llama-3.2-1b"), KernelSetup(8))  # no vector a head owns: one table


def test_a_folder_of_data_configs_is_a_model_by_its_name():
    from mk.paths import CONFIGS_DIR

    assert get_config("qwen3-8b") == load_hf_config(CONFIGS_DIR / "qwen3-8b")
    with pytest.raises(ValueError, match=r"not a folder of data/configs \(.*llama-3.2-1b"):
        get_config("llama-9")


def test_a_variant_is_refused_by_the_reference_and_the_kernel_by_name():
    from mk import reference as R
    from mk.megakernel.engine import MegakernelEngine

    cfg = from_hf_dict(TINY_HF["qwen3"], "sliding-qwen3")
    message = "sliding-qwen3 is a qwen3 model with sliding-window layers: mk plans and times it"
    with pytest.raises(ValueError, match=message):
        R.prefill({}, cfg, [[1, 2]], {})
    with pytest.raises(ValueError, match=message):
        MegakernelEngine(cfg)


# Every family's config against transformers: the same config built by transformers on the meta device (no weights)
# has the parameter count mk.params gives for mk.config's description, tiny and full size.
CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"
SMALL = dict(vocab_size=100, hidden_size=16, intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8)  # fmt: skip
MLA = dict(kv_lora_rank=10, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5)
TINY_HF = {
    "llama": dict(SMALL, model_type="llama", attention_bias=True, mlp_bias=True),
    "llama-tied": dict(SMALL, model_type="llama", tie_word_embeddings=True),
    "qwen3": dict(SMALL, model_type="qwen3", use_sliding_window=True, sliding_window=8, max_window_layers=2),
    "qwen3_moe": dict(SMALL, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=6,
                      decoder_sparse_step=2, mlp_only_layers=[3]),
    "mixtral": dict(SMALL, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
    "gpt_oss": dict(SMALL, model_type="gpt_oss", num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
    "deepseek_v3": dict(SMALL, **MLA, model_type="deepseek_v3", num_key_value_heads=4, moe_intermediate_size=6,
                        n_routed_experts=4, n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1,
                        q_lora_rank=12, n_group=2, topk_group=1),
    "deepseek_v3-no-q-lora": dict(SMALL, **MLA, model_type="deepseek_v3", num_key_value_heads=4, q_lora_rank=None,
                                  moe_intermediate_size=6, n_routed_experts=4, n_shared_experts=1,
                                  num_experts_per_tok=2, first_k_dense_replace=2, n_group=1, topk_group=1),
    "gemma2": dict(SMALL, model_type="gemma2", sliding_window=8),
    "gemma3_text": dict(SMALL, model_type="gemma3_text", sliding_window=8),
}  # fmt: skip


def transformers_count(d: dict) -> int:
    """transformers' own count of what a checkpoint holds: the model built from ``d`` on the meta device, its
    parameters (shared ones once) and its persistent buffers (Gemma 4's layer scalars, DeepSeek's routing
    bias: loaded from the checkpoint and read every step; RoPE tables are not persistent). Kimi K2's ``kimi_k2`` is
    built as the architecture it names, DeepSeek-V3 (transformers has no config of that name)."""
    import torch
    import transformers

    cls = transformers.CONFIG_MAPPING[{"kimi_k2": "deepseek_v3"}.get(d["model_type"], d["model_type"])]
    cfg = cls(**{k: v for k, v in d.items() if k not in ("model_type", "architectures")})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    persistent = set(model.state_dict())
    buffers = sum(b.numel() for n, b in model.named_buffers() if n in persistent)
    return sum(p.numel() for p in model.parameters()) + buffers


@pytest.mark.parametrize("name", TINY_HF)
def test_tiny_configs_count_what_transformers_builds(name):
    assert count_params(from_hf_dict(TINY_HF[name])) == transformers_count(TINY_HF[name])


@pytest.mark.parametrize("folder", sorted(p.name for p in CONFIGS.iterdir() if p.is_dir()))
def test_full_size_configs_count_what_transformers_builds(folder):
    d = json.loads((CONFIGS / folder / "config.json").read_text())
    cfg = get_config(CONFIGS / folder)
    assert cfg.name == folder and cfg.family == d["model_type"]
    assert count_params(cfg) == transformers_count(d)
    # all of a dense model with a tied embedding is read each step; an MoE model's or an untied embedding's not
    read_whole = not cfg.is_moe and cfg.tied_embeddings
    assert (count_active_params(cfg) == count_params(cfg)) == read_whole


def test_gemma4_is_counted_as_transformers_builds_it():
    d = to_hf_dict(GEMMA4_31B)
    assert count_params(from_hf_dict(d)) == count_params(GEMMA4_31B) == transformers_count(d)


def test_each_family_reads_its_layers():
    def windows(cfg):
        return [cfg.sliding_window if t == SLIDING else None for t in cfg.layer_types]

    def experts(cfg):
        return [cfg.num_experts if cfg.is_moe_layer(i) else 0 for i in range(cfg.num_layers)]

    assert windows(from_hf_dict(TINY_HF["gpt_oss"])) == [8, None, 8, None]  # alternating, the first sliding
    assert windows(from_hf_dict(TINY_HF["qwen3"])) == [None, None, 8, 8]  # from max_window_layers on
    assert windows(from_hf_dict(TINY_HF["mixtral"])) == [8, 8, 8, 8]
    qwen = from_hf_dict(TINY_HF["qwen3_moe"])
    assert experts(qwen) == [0, 4, 0, 0]  # every second layer, not the MLP-only one
    assert [qwen.mlp_width(i) for i in range(4)] == [24, 0, 24, 24]  # the others a dense MLP of intermediate_size
    ds = from_hf_dict(TINY_HF["deepseek_v3"])
    assert experts(ds) == [0, 4, 4, 4]  # dense first layer
    assert {ds.cache_elements(t) for t in ds.layer_types} == {10 + 4}  # MLA: the latent and one RoPE key
    llama = from_hf_dict(TINY_HF["llama"])
    assert {llama.cache_elements(t) for t in llama.layer_types} == {2 * 2 * 8}
    assert from_hf_dict(TINY_HF["deepseek_v3-no-q-lora"]).truncated(1).dense_layers == (0,)


def test_unknown_family_and_field_are_refused_by_name():
    refused = r"model_type is 'bert': mk runs gemma4_text, llama.*deepseek_v3, kimi_k2 and plans and times gemma2"
    with pytest.raises(ValueError, match=refused):
        from_hf_dict({"model_type": "bert"})
    assert "gemma4_text" in CONFIG_FAMILIES
    assert set(CONFIG_FAMILIES) == {"gemma4_text", *ARCH_FIELDS}  # every family but Gemma 4 has its fields checked
    with pytest.raises(ValueError, match=r"llama config field\(s\) \['cross_attention_layers'\]"):
        from_hf_dict(dict(TINY_HF["llama"], cross_attention_layers=[1]))


def test_a_hub_id_is_read_from_the_local_cache_offline(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--someone--tiny-qwen3" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(TINY_HF["qwen3"]))
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = get_config("someone/tiny-qwen3")
    assert cfg.family == "qwen3" and count_params(cfg) == count_params(from_hf_dict(TINY_HF["qwen3"]))
    with pytest.raises(ValueError, match="not a hub id in the local Hugging Face cache"):
        get_config("someone/absent")


def test_kimi_k2_is_read_as_deepseek_v3s_architecture(mk_json):
    """Kimi K2's own config.json (data/configs/kimi-k2): DeepSeek-V3's adapter reads it (MLA, one dense layer, 384
    experts of which 8 and a shared one a token); its ~1.03T parameters are transformers' DeepseekV3 count under the
    same fields, and ``python -m mk sol`` answers for it."""
    from mk.sol import bytes_per_token

    folder = CONFIGS / "kimi-k2"
    kimi = json.loads((folder / "config.json").read_text())
    cfg = get_config(folder / "config.json")
    assert cfg.name == "kimi-k2" and cfg.family == "kimi_k2" and cfg.runnable
    assert cfg.num_layers == 61 and cfg.dense_layers == (0,) and cfg.dense_intermediate == 18432
    assert (cfg.num_experts, cfg.top_k, cfg.expert_intermediate, cfg.mlp_intermediate) == (384, 8, 2048, 2048)
    assert cfg.latent_attention.q_lora_rank == 1536 and cfg.rope_scaling.factor == 32.0
    assert count_params(cfg) == transformers_count(kimi)
    assert count_params(cfg) == pytest.approx(1.03e12, rel=0.01)
    got = mk_json("sol", "--model", folder / "config.json", "--chip", "tpu-v5e-8", "--context", 1024, "--json")
    assert got["model"] == "kimi-k2" and got["bytes_per_token"] == bytes_per_token(cfg, 1024).total
