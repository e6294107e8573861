"""Model configs (Gemma 4 and the pre-norm families): exact parameter counts, loading Hugging Face configs, and clear
validation errors."""

import json
from pathlib import Path

import pytest

from mk.config import (
    FULL,
    GEMMA4_26B_A4B,
    GEMMA4_31B,
    PRESETS,
    SLIDING,
    TINY_LLAMA,
    TINY_MOE,
    TINY_QWEN3_MOE,
    ModelConfig,
    from_hf_dict,
    get_config,
    load_hf_config,
    to_hf_dict,
)
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
    "change, message",
    [
        (dict(attention_bias=True), "attention_bias"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
        (dict(use_sliding_window=True, sliding_window=4096), "sliding_window"),
        (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}), "unsupported RoPE type 'yarn'"),
        (dict(mlp_only_layers=[0]), "mlp_only_layers"),
    ],
)
def test_other_families_refuse_what_mk_does_not_run(change, message):
    with pytest.raises(ValueError, match=message):
        from_hf_dict({**to_hf_dict(TINY_QWEN3_MOE), **change})


def test_a_model_without_sliding_layers_needs_no_sliding_shapes():
    assert TINY_LLAMA.sliding_window == 0 and not TINY_LLAMA.sliding_layers
    with pytest.raises(ValueError, match="sliding_window must be a positive integer"):
        TINY_LLAMA.replace(layer_types=("sliding", "full", "full"))
    with pytest.raises(ValueError, match="shared MLP beside its experts"):
        TINY_MOE.replace(mlp_intermediate=0)


@pytest.mark.parametrize("folder, family", [("gpt-oss-20b", "gpt_oss"), ("deepseek-v3", "deepseek_v3")])
def test_planned_families_are_refused_by_the_reference_and_the_kernel(folder, family):
    """gpt-oss and DeepSeek-V3 are planned and timed (their configs are read whole), not run: the engines say so."""
    from mk import reference as R
    from mk.megakernel.kernel import MegakernelEngine

    cfg = load_hf_config(Path(__file__).resolve().parent.parent / "data" / "configs" / folder)
    assert cfg.family == family and not cfg.runnable
    with pytest.raises(ValueError, match=r"mk plans and times it .* reference and kernel run gemma4_text, llama"):
        R.prefill({}, cfg, [[1, 2]], {})
    with pytest.raises(ValueError, match="mk plans and times it"):
        MegakernelEngine(cfg)


def test_a_folder_of_data_configs_is_a_model_by_its_name():
    from mk.paths import CONFIGS_DIR

    assert get_config("qwen3-8b") == load_hf_config(CONFIGS_DIR / "qwen3-8b")
    with pytest.raises(ValueError, match=r"not a folder of data/configs \(.*llama-3.2-1b"):
        get_config("llama-9")
