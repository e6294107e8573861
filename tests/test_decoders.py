"""mk.decoders against transformers: the same config built by transformers on the meta device (no weights) has
the parameter count mk's tensor list gives, for every family, tiny and full size."""

import json
from pathlib import Path

import pytest

from mk.config import GEMMA4_31B, HF_FAMILIES, to_hf_dict
from mk.decoders import from_hf_config, get_decoder
from mk.params import count_params

CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"
SMALL = dict(vocab_size=100, hidden_size=16, intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8)  # fmt: skip
MLA = dict(kv_lora_rank=10, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5)
TINY = {
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
    bias: loaded from the checkpoint and read every step; RoPE tables are not persistent)."""
    import torch
    import transformers

    cls = transformers.CONFIG_MAPPING[d["model_type"]]
    cfg = cls(**{k: v for k, v in d.items() if k not in ("model_type", "architectures")})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    persistent = set(model.state_dict())
    buffers = sum(b.numel() for n, b in model.named_buffers() if n in persistent)
    return sum(p.numel() for p in model.parameters()) + buffers


@pytest.mark.parametrize("name", TINY)
def test_tiny_configs_count_what_transformers_builds(name):
    assert from_hf_config(TINY[name]).count_params() == transformers_count(TINY[name])


@pytest.mark.parametrize("folder", sorted(p.name for p in CONFIGS.iterdir() if p.is_dir()))
def test_full_size_configs_count_what_transformers_builds(folder):
    d = json.loads((CONFIGS / folder / "config.json").read_text())
    dec = get_decoder(CONFIGS / folder)
    assert dec.name == folder and dec.family == d["model_type"]
    assert dec.count_params() == transformers_count(d)
    # all of a dense model with a tied embedding is read each step; an MoE model's or an untied embedding's not
    read_whole = not dec.is_moe and dec.tied
    assert (dec.count_active_params() == dec.count_params()) == read_whole


def test_gemma4_is_mk_configs_own_description():
    d = to_hf_dict(GEMMA4_31B)
    assert from_hf_config(d).count_params() == count_params(GEMMA4_31B) == transformers_count(d)


def test_each_family_reads_its_layers():
    gpt = from_hf_config(TINY["gpt_oss"])
    assert [layer.window for layer in gpt.layers] == [8, None, 8, None]  # alternating, the first sliding
    qwen = from_hf_config(TINY["qwen3_moe"])
    assert [layer.experts for layer in qwen.layers] == [0, 4, 0, 0]  # every second layer, not the MLP-only one
    ds = from_hf_config(TINY["deepseek_v3"])
    assert [layer.experts for layer in ds.layers] == [0, 4, 4, 4]  # dense first layer
    assert {layer.cache_per_position for layer in ds.layers} == {10 + 4}  # MLA: the latent and one RoPE key
    assert {layer.cache_per_position for layer in from_hf_config(TINY["llama"]).layers} == {2 * 2 * 8}


def test_unknown_family_and_field_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unsupported model_type 'bert'; supported families: .*llama.*deepseek_v3"):
        from_hf_config({"model_type": "bert"})
    assert "gemma4_text" in HF_FAMILIES
    with pytest.raises(ValueError, match=r"llama config field\(s\) \['cross_attention_layers'\]"):
        from_hf_config(dict(TINY["llama"], cross_attention_layers=[1]))


@pytest.mark.parametrize("folder", ["llama-3.2-1b", "qwen3-30b-a3b", "deepseek-v3"])
def test_cli_sol_reads_a_config_json(mk_json, folder):
    """``python -m mk sol --model path/to/config.json``: the bytes of mk.sol for that decoder, by component; an
    MoE model reads top-k experts of its routed ones, MLA its compressed cache."""
    from mk.sol import bytes_per_token

    got = mk_json("sol", "--model", CONFIGS / folder / "config.json", "--chip", "h100", "--context", 1024, "--json")
    dec = get_decoder(CONFIGS / folder)
    assert got["model"] == folder and got["bytes_per_token"] == bytes_per_token(dec, 1024).total
    kv = got["bytes_by_component"]["kv_full"]
    assert kv == 1024 * sum(layer.cache_per_position for layer in dec.layers) * 2  # bf16, every layer full
    assert (got["bytes_by_component"]["experts"] > 0) == dec.is_moe


def test_a_hub_id_is_read_from_the_local_cache_offline(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--someone--tiny-qwen3" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(TINY["qwen3"]))
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    dec = get_decoder("someone/tiny-qwen3")
    assert dec.family == "qwen3" and dec.count_params() == from_hf_config(TINY["qwen3"]).count_params()
    with pytest.raises(ValueError, match="not a hub id in the local Hugging Face cache"):
        get_decoder("someone/absent")


@pytest.mark.parametrize("name", TINY)
def test_every_config_mk_config_takes_is_planned_and_timed(name):
    """A tiny config of each family: where mk.config takes it (every family but the pre-norm variants it refuses) the
    step plan builds and mk.timing times it, never faster than the speed of light; the rest are counted only."""
    from mk.config import UnsupportedVariant, from_hf_dict
    from mk.sol import speed_of_light
    from mk.timing import predict

    try:
        cfg = from_hf_dict(TINY[name], name)
    except UnsupportedVariant:
        assert name in ("llama", "qwen3", "qwen3_moe", "mixtral")  # bias, windows, dense layers between MoE ones
        return
    for engine in ("megakernel", "general"):
        assert predict(cfg, "h100", 64, 2, engine).step_s >= speed_of_light(cfg, "h100", 64, 2).step_s * (1 - 1e-12)


# Gemma 2 and 3 at a full-size model's shapes (no config of theirs is in data/configs)
GEMMA_SIZE = dict(vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=6,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=256, sliding_window=4096)  # fmt: skip


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_gemma_2_and_3_plans_read_mk_sols_bytes(family):
    from mk.config import from_hf_dict
    from mk.plan import build_plan
    from mk.sol import bytes_per_token

    d = dict(TINY[family], **GEMMA_SIZE)
    assert from_hf_config(d).count_params() == transformers_count(d)
    cfg = from_hf_dict(d, family)
    assert not cfg.runnable and cfg.family == family and not cfg.layer_scalar
    for context in (1024, 16384):
        plan = build_plan(cfg, 1, context, weight_itemsize=2, kv_itemsize=2)
        sol = bytes_per_token(cfg, context, 1, "bf16")
        assert abs(plan.payload_bytes + plan.kv_payload_bytes - sol.total) / sol.total < 0.01
