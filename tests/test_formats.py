"""mk.checkpoint_formats: the layouts big models ship in (FP8 with block scales, INT4 in packed groups, MXFP4),
decoded as the code that ships them decodes them, and loaded by mk.weights as float trees.

Oracles we did not write: transformers' FP8 dequantizer (``_dequantize_fp8_weight``) and its FP8 loading
(``FineGrainedFP8Config(dequantize=True)``), its MXFP4 decoder (``_convert_moe_packed_tensors``); for INT4 (the
compressed-tensors package is not installed here) the packing its ``pack_to_int32`` documents: signed values
offset by 8, eight a 32-bit word, the first in the lowest four bits.
"""

import json
import shutil

import ml_dtypes
import numpy as np
import pytest
from test_parity import hf_greedy

from mk.checkpoint_formats import (
    decode_fp8_block,
    decode_int4_packed,
    decode_mxfp4,
    encode_fp8_block,
    encode_int4_packed,
    encode_mxfp4,
)
from mk.generate import generate
from mk.weights import load_checkpoint

NEW_TOKENS = 12
FP8_BLOCK = [16, 32]  # not square, and not dividing every tiny width: partial edge blocks


def _torch(a):
    import torch

    if a.dtype == ml_dtypes.float8_e4m3fn:
        return torch.from_numpy(a.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def test_fp8_block_decoding_is_transformers():
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    w = np.random.default_rng(0).normal(size=(40, 70)).astype(np.float32)
    q, s = encode_fp8_block(w, tuple(FP8_BLOCK))
    assert s.shape == (3, 3)  # 40 rows in blocks of 16, 70 columns in blocks of 32: partial edges
    want = _dequantize_fp8_weight(_torch(q), _torch(s), FP8_BLOCK, _torch(w).dtype).numpy()
    np.testing.assert_array_equal(decode_fp8_block(q, s, tuple(FP8_BLOCK)), want)
    assert np.abs(want - w).max() <= np.abs(w).max() / 8  # FP8 e4m3: 3 mantissa bits, a coarse but real copy


def test_mxfp4_decoding_is_transformers():
    import torch
    from transformers.integrations.mxfp4 import _convert_moe_packed_tensors

    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (3, 6, 2, 16), dtype=np.uint8)  # [experts, rows, groups, 16 bytes]
    scales = rng.integers(118, 136, (3, 6, 2), dtype=np.uint8)
    want = _convert_moe_packed_tensors(_torch(blocks), _torch(scales), dtype=torch.float32).numpy()
    got = np.swapaxes(decode_mxfp4(blocks, scales), -1, -2)  # as mk.checkpoint_formats.DecodedCheckpoint shows it
    np.testing.assert_array_equal(got, want)


def test_mxfp4_encoding_round_trips_values_it_can_hold():
    """Blocks of FP4 values times a power of two, each holding a 6 (FP4's largest): encoded and decoded exactly."""
    rng = np.random.default_rng(2)
    fp4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    values = rng.choice(np.concatenate([fp4, -fp4]), (4, 2, 32))
    values[..., 0] = 6.0
    w = (values * np.ldexp(np.float32(1), rng.integers(-3, 4, (4, 2, 1)))).reshape(4, 64)
    blocks, scales = encode_mxfp4(w)
    np.testing.assert_array_equal(decode_mxfp4(blocks, scales), w)


def test_int4_packing_is_compressed_tensors():
    """Known words: -8..-1 are stored as 0..7 and 0..7 as 8..15, the first value in the lowest nibble."""
    packed = np.array([[0x76543210, 0xFEDCBA98]], np.uint32).view(np.int32)
    got = decode_int4_packed(packed, np.array([[0.5]], np.float32), (1, 16))
    np.testing.assert_array_equal(got, np.arange(-8, 8, dtype=np.float32)[None] * 0.5)
    w = np.array([[0, 1, 2, 3, 4, 5, 6, 7, -1, -2, -3, -4, -5, -6, -7, 0]], np.float32)  # largest magnitude 7: scale 1
    packed, scale, shape = encode_int4_packed(w, group=16)
    assert shape.tolist() == [1, 16] and scale.tolist() == [[1.0]]
    assert packed.view(np.uint32).tolist() == [[0xFEDCBA98, 0x81234567]]


def test_int4_round_trip_is_code_times_scale():
    w = np.random.default_rng(3).normal(size=(6, 64)).astype(np.float32)
    packed, scale, shape = encode_int4_packed(w, group=32)
    got = decode_int4_packed(packed, scale, shape)
    q = np.clip(np.rint(w.reshape(6, 2, 32) / scale[..., None]), -8, 7)
    np.testing.assert_array_equal(got, (q * scale[..., None]).reshape(6, 64))
    assert np.abs(got - w).max() <= np.abs(w).max() / 7 / 2 * 1.0001  # half a step of the largest group


# Checkpoints in those layouts ------------------------------------------------------------------------
def _rewrite(src, dst, encode, quantization_config):
    """Copy the checkpoint folder ``src`` to ``dst`` with each tensor ``encode(name, array)`` picks rewritten in its
    format (a dict of new tensors, or None to keep it), and config.json naming the format."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = {}
    for name, t in load_file(src / "model.safetensors").items():
        parts = encode(name, t.float().numpy())
        tensors.update({n: _torch(a) for n, a in parts.items()} if parts else {name: t})
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    if quantization_config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg["quantization_config"] = quantization_config
        (dst / "config.json").write_text(json.dumps(cfg))
    return torch


def _fp8(name, a):
    if name.endswith("proj.weight"):
        q, s = encode_fp8_block(a, tuple(FP8_BLOCK))
        return {name: q, name + "_scale_inv": s}
    return None


def test_an_fp8_block_checkpoint_loads_as_transformers_loads_it(hf_checkpoint, tmp_path):
    """A tiny Llama saved with FP8 e4m3 projections and 16x32 block scales: mk's tree is transformers' dequantized
    model's, weight for weight, and the reference's greedy tokens are its."""
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    folder, _ = hf_checkpoint("tiny-llama")
    fp8 = tmp_path / "fp8"
    qc = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": FP8_BLOCK, "activation_scheme": "dynamic"}
    torch = _rewrite(folder, fp8, _fp8, qc)
    model = AutoModelForCausalLM.from_pretrained(
        fp8, quantization_config=FineGrainedFP8Config(dequantize=True), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    cfg, params = load_checkpoint(fp8)
    q_proj = model.model.layers[1].self_attn.q_proj.weight.detach().numpy()
    np.testing.assert_array_equal(np.asarray(params["layers.1.q"]).T, q_proj)
    float_cfg, float_params = load_checkpoint(folder)
    assert float_cfg == cfg.replace(name=float_cfg.name)
    assert not np.array_equal(np.asarray(float_params["layers.1.q"]), np.asarray(params["layers.1.q"]))  # decoded
    prompt = np.random.default_rng(5).integers(0, cfg.vocab_size, (2, 9))
    want, _ = hf_greedy(model, prompt, NEW_TOKENS)
    np.testing.assert_array_equal(generate(params, cfg, prompt, NEW_TOKENS), want)


def test_an_int4_experts_checkpoint_loads_as_its_dequantized_weights(hf_checkpoint, tmp_path):
    """A tiny Qwen3-MoE whose routed experts are packed INT4 in groups of 32 with BF16 scales (compressed-tensors'
    layout, as Kimi K2 Thinking ships its experts): mk's tree holds code x scale for every expert, and its greedy
    tokens are those of transformers' model loaded from a float checkpoint of those same dequantized weights."""
    from transformers import AutoModelForCausalLM

    folder, _ = hf_checkpoint("tiny-qwen3-moe")
    decoded = {}

    def int4(name, a):
        if ".mlp.experts." not in name or not name.endswith(".weight"):
            return None
        packed, scale, shape = encode_int4_packed(a, 32)
        scale = scale.astype(ml_dtypes.bfloat16)
        decoded[name] = decode_int4_packed(packed, scale.astype(np.float32), shape)
        base = name[: -len(".weight")]
        return {base + ".weight_packed": packed, base + ".weight_scale": scale, base + ".weight_shape": shape}

    group = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "group_size": 32}}
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": group}}
    torch = _rewrite(folder, tmp_path / "int4", int4, qc)
    assert len(decoded) >= 3 * 4, "the experts were not rewritten"
    cfg, params = load_checkpoint(tmp_path / "int4")
    name = next(n for n in decoded if ".experts.1.down_proj" in n)
    layer = int(name.split(".layers.")[1].split(".")[0])
    np.testing.assert_array_equal(np.asarray(params[f"layers.{layer}.expert_down"][1]).T, decoded[name])

    _rewrite(folder, tmp_path / "dequantized", lambda n, a: {n: decoded[n]} if n in decoded else None, None)
    oracle = AutoModelForCausalLM.from_pretrained(
        tmp_path / "dequantized", dtype=torch.float32, attn_implementation="eager"
    ).eval()
    prompt = np.random.default_rng(6).integers(0, cfg.vocab_size, (2, 9))
    want, _ = hf_greedy(oracle, prompt, NEW_TOKENS)
    np.testing.assert_array_equal(generate(params, cfg, prompt, NEW_TOKENS), want)


def test_a_format_checkpoint_missing_its_scales_is_refused_by_name(hf_checkpoint, tmp_path):
    folder, _ = hf_checkpoint("tiny-llama")
    qc = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": FP8_BLOCK}
    _rewrite(
        folder,
        tmp_path / "bad",
        lambda n, a: {n: encode_fp8_block(a, (16, 32))[0]} if n.endswith("q_proj.weight") else None,
        qc,
    )
    with pytest.raises(ValueError, match=r"q_proj.weight is FP8 but the checkpoint has no .*q_proj.weight_scale_inv"):
        load_checkpoint(tmp_path / "bad")
    qc = {"quant_method": "awq"}
    _rewrite(folder, tmp_path / "awq", lambda n, a: None, qc)
    with pytest.raises(ValueError, match=r"quant_method 'awq'.*fp8, compressed-tensors, mxfp4"):
        load_checkpoint(tmp_path / "awq")


def test_each_released_format_is_one_mk_counts_for_a_model_it_knows():
    """data/released_formats.csv: each row's model resolves, its data type is mk.sol's and applies to that model (a
    format for routed experts only on a model with them), and it names its source."""
    from mk.checkpoint_formats import released_format, released_formats
    from mk.config import get_config
    from mk.sol import bytes_per_token

    assert {"kimi-k2", "deepseek-v3", "gpt-oss-20b"} <= set(released_formats())
    for r in released_formats().values():
        bytes_per_token(get_config(r.model), 1024, 1, r.dtype)  # refuses a format that does not apply
        assert len(r.source) > 40 and r.release.count("/") == 1
    with pytest.raises(ValueError, match="no released format recorded for 'gemma4-31b'.*kimi-k2"):
        released_format("gemma4-31b")


def test_gpt_oss_mxfp4_experts_load_as_transformers_dequantizes_them(tmp_path):
    """A tiny gpt-oss whose experts are MXFP4 (``*_blocks`` and ``*_scales``, as openai/gpt-oss ships them): mk's
    experts are transformers' dequantized ones (``Mxfp4Config(dequantize=True)``) weight for weight, and the
    reference's greedy tokens are its."""
    import torch
    from safetensors.torch import load_file
    from test_gpt_oss import TINY_GPT_OSS, init_gpt_oss
    from transformers import AutoConfig, AutoModelForCausalLM, Mxfp4Config

    d = {k: v for k, v in TINY_GPT_OSS.items() if k != "model_type"}
    config = AutoConfig.for_model("gpt_oss", **{**d, "intermediate_size": 64})  # MXFP4 blocks of 32 need it
    model = AutoModelForCausalLM.from_config(config)
    init_gpt_oss(model, seed=7)
    model.save_pretrained(tmp_path / "float")

    def mxfp4(name, a):
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            return None
        blocks, scales = encode_mxfp4(np.swapaxes(a, -1, -2))  # stored [experts, out, in / 32, 16]
        return {name + "_blocks": blocks, name + "_scales": scales}

    keep = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
    _rewrite(tmp_path / "float", tmp_path / "mxfp4", mxfp4, {"quant_method": "mxfp4", "modules_to_not_convert": keep})
    assert any(n.endswith("_blocks") for n in load_file(tmp_path / "mxfp4" / "model.safetensors"))
    hf = AutoModelForCausalLM.from_pretrained(
        tmp_path / "mxfp4", quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32,
        attn_implementation="eager",
    ).eval()  # fmt: skip
    cfg, params = load_checkpoint(tmp_path / "mxfp4")
    experts = hf.model.layers[1].mlp.experts
    np.testing.assert_array_equal(np.asarray(params["layers.1.expert_down"]), experts.down_proj.detach().numpy())
    gate_up = experts.gate_up_proj.detach().numpy()  # gate at even columns, up at odd
    np.testing.assert_array_equal(np.asarray(params["layers.1.expert_up"]), gate_up[..., 1::2])
    prompt = np.random.default_rng(8).integers(0, cfg.vocab_size, (2, 7))
    want, _ = hf_greedy(hf, prompt, NEW_TOKENS)
    np.testing.assert_array_equal(generate(params, cfg, prompt, NEW_TOKENS), want)


def test_a_deepseek_v3_fp8_block_checkpoint_loads_as_transformers_loads_it(hf_checkpoint, tmp_path):
    """A tiny DeepSeek-V3 in its released layout (every projection FP8 e4m3 with block scales; the router, norms,
    embedding and head in float): the reference's greedy tokens are those of transformers' dequantized model."""
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    folder, _ = hf_checkpoint("deepseek-v3")
    # Blocks of 8 x 8 divide every width here: transformers' loader takes a block's size from the scale grid
    # (rows // scale rows), which misplaces a partial edge block (its 24-row q_a with blocks of 16 reads as 12-row
    # blocks); mk reads weight_block_size, as the format says (partial edges: test_fp8_block_decoding_is_transformers)
    qc = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [8, 8], "activation_scheme": "dynamic"}

    def fp8_8x8(name, a):
        if name.endswith("proj.weight") or name.endswith("proj_with_mqa.weight"):
            q, s = encode_fp8_block(a, (8, 8))
            return {name: q, name + "_scale_inv": s}
        return None

    torch = _rewrite(folder, tmp_path / "fp8", fp8_8x8, qc)
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path / "fp8", quantization_config=FineGrainedFP8Config(dequantize=True), dtype=torch.float32,
        attn_implementation="eager",
    ).eval()  # fmt: skip
    cfg, params = load_checkpoint(tmp_path / "fp8")
    kv_b = model.model.layers[1].self_attn.kv_b_proj.weight.detach().numpy()
    np.testing.assert_array_equal(np.asarray(params["layers.1.kv_b"]).T, kv_b)
    prompt = np.random.default_rng(9).integers(0, cfg.vocab_size, (2, 7))
    want, _ = hf_greedy(model, prompt, NEW_TOKENS)
    np.testing.assert_array_equal(generate(params, cfg, prompt, NEW_TOKENS), want)
