"""The megakernel on INT8 weights (mk.quant): the plan's bytes and buffers, and the kernel held to the
quantized reference (the reference on the dequantized tree, the weights both multiply by) in Pallas TPU
interpret mode with the race detector on, on one chip and over 8 simulated chips."""

import jax.numpy as jnp
import numpy as np
import pytest

from mk import quant
from mk.config import FFN_LAYOUTS, GEMMA4_26B_A4B, TINY_MOE, from_hf_dict
from mk.generate import generate
from mk.kernel_setup import KernelSetup
from mk.params import EXPERTS, tile_rows_scaled
from mk.plan import build_plan
from mk.sol import bytes_per_token
from mk.tpu import races_detected
from mk.weights import random_params


def test_int8_tiles_halve_the_expert_bytes_and_bring_their_scales():
    bf16 = build_plan(GEMMA4_26B_A4B, 1, 1024, weight_dtype="bfloat16", kv_dtype="bfloat16")
    int8 = build_plan(GEMMA4_26B_A4B, 1, 1024, weight_dtype="bfloat16", kv_dtype="bfloat16", quantize="int8-experts")
    experts = [ld for ld in int8.loads if ld.component == EXPERTS]
    assert experts and all(ld.scaled and int8.buffers[ld.buffer].itemsize == 1 for ld in experts)
    assert not any(ld.scaled for ld in int8.loads if ld.component != EXPERTS)
    b, i = bf16.bytes_by_component(payload=True), int8.bytes_by_component(payload=True)
    # codes: half; scales: 4 bytes per output channel of each expert matrix (0.6% of the codes here)
    assert i[EXPERTS] == pytest.approx(b[EXPERTS] / 2, rel=0.01) and i[EXPERTS] > b[EXPERTS] / 2
    assert {k: v for k, v in i.items() if k != EXPERTS} == {k: v for k, v in b.items() if k != EXPERTS}

    # the expert buffers' VMEM halves too (plus their scale blocks)
    def expert_vmem(plan):
        names = {ld.buffer for ld in plan.loads if ld.component == EXPERTS}
        return sum(b.nbytes for name, b in plan.buffers.items() if name.removesuffix(".scale") in names)

    assert expert_vmem(int8) < 0.6 * expert_vmem(bf16)


@pytest.mark.parametrize("scheme", ["int8-experts", "int8"])
@pytest.mark.parametrize("batch", [1, 8])
def test_plan_and_sol_agree_on_int8_bytes(scheme, batch):
    """python -m mk sol --dtype int8-experts (or int8) and the plan's real bytes (codes, scales, KV), expected
    over uniform routing, within 1%."""
    plan = build_plan(GEMMA4_26B_A4B, batch, 1024, weight_dtype="bfloat16", kv_dtype="bfloat16", quantize=scheme)
    sol = bytes_per_token(GEMMA4_26B_A4B, 1024, batch, scheme)
    assert abs(plan.payload_bytes + plan.kv_bytes - sol.total) / sol.total < 0.01


def kernel_against_dequantized_reference(params, cfg, prompts, new_tokens=3, **options):
    """The megakernel on a quantized tree (INT8, or a shipped format: tests/test_formats_kernel.py) against the
    reference on its dequantized tree: the same tokens, logits within 1e-4, no races."""
    want_tokens, want_logits = generate(quant.dequantize(params, cfg), cfg, prompts, new_tokens, return_logits=True)
    got_tokens, got_logits = generate(
        params, cfg, prompts, new_tokens, engine="megakernel", return_logits=True,
        engine_options=dict(detect_races=True, **options),
    )  # fmt: skip
    assert not races_detected()
    np.testing.assert_array_equal(np.asarray(got_tokens), np.asarray(want_tokens))
    for got, want in zip(got_logits, want_logits):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4)


B4 = [[1, 2, 3, 4, 5], [7, 8, 9], [4], [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]]  # ragged, one past the window


@pytest.mark.parametrize(
    "source, prompts", [("tiny-moe", B4[:1]), ("hf-snippet", B4)], ids=["b1-tiny-moe", "b4-hf-snippet"]
)  # each source and each batch once (a minute each in interpret mode), not every pair
def test_cli_generate_int8_experts_megakernel_gives_the_quantized_references_tokens(
    hf_checkpoint, mk_json, source, prompts
):
    """``python -m mk generate --quantize int8-experts --engine megakernel --detect-races`` on the tiny MoE
    preset and on a checkpoint transformers saved: each user gets the quantized reference's greedy tokens."""
    from mk.weights import load_checkpoint

    if source == "tiny-moe":
        cfg, params, args = TINY_MOE, random_params(TINY_MOE, 0), ["--model", "tiny-moe", "--seed", 0]
    else:
        folder, _ = hf_checkpoint(source)
        (cfg, params), args = load_checkpoint(folder), ["--checkpoint", folder]
    want = generate(quant.quantize(params, cfg, "int8-experts"), cfg, prompts, 3)
    got = mk_json(
        "generate", *args, "--quantize", "int8-experts", "--engine", "megakernel", "--detect-races", "--json",
        "--prompt-ids", ";".join(",".join(map(str, p)) for p in prompts), "--new-tokens", 3,
    )  # fmt: skip
    assert got["quantize"] == "int8-experts" and not got["races"]
    assert got["tokens"] == np.asarray(want).tolist()


@pytest.mark.parametrize("placement", ["whole", "split"])
def test_each_chips_scales_are_cut_with_its_matrix(placement):
    """Every matrix INT8 over 8 chips: a chip's slice of the quantized tree dequantizes to its slice of the
    dequantized tree (q/k/v scales cut with their heads, o's whole; the shared MLP's gate/up cut, down's whole;
    experts' cut with the experts or with their intermediate)."""
    from conftest import HF_EIGHT_HEADS

    from mk.kernel_setup import KernelSetup
    from mk.sharding import chip_config, chip_params

    cfg, setup = from_hf_dict(HF_EIGHT_HEADS), KernelSetup(8, placement)
    q = quant.quantize(random_params(cfg, 2), cfg, "int8")
    local = chip_config(cfg, setup)
    for chip in range(8):
        got = quant.dequantize(chip_params(q, cfg, setup, chip), local)
        want = chip_params(quant.dequantize(q, cfg), cfg, setup, chip)
        for path in quant.quantized_paths(cfg, "int8"):
            np.testing.assert_array_equal(np.asarray(got[path]), np.asarray(want[path]), err_msg=path)


@pytest.mark.slow
def test_kernel_over_8_chips_gives_the_quantized_references_tokens():
    """Every matrix INT8 over 8 simulated chips, experts split: same tokens, logits as close as in F32 without
    INT8 (the kernel dequantizes each tile exactly as the reference's tree was dequantized). The whole
    placement's scales: the test above; both placements compile for TPU slices: tests/test_tpu_aot.py."""
    from conftest import HF_EIGHT_HEADS

    cfg = from_hf_dict(HF_EIGHT_HEADS)
    params = quant.quantize(random_params(cfg, 0), cfg, "int8")
    kernel_against_dequantized_reference(
        params, cfg, [[1, 2, 3], [9, 8, 7, 6, 5, 4, 3, 2, 1, 7]], 2, setup=KernelSetup(8, "split")
    )


@pytest.mark.parametrize("ffn_layout", FFN_LAYOUTS)
def test_packed_scales_follow_their_matrix(ffn_layout):
    """pack lays a matrix's scales out as its output channels: dequantizing the packed codes with the packed
    scales gives the packed dequantized matrix (head lanes spread, intermediates padded; a scale per row where
    gate and up are stored transposed, in the "sublanes" layout, and for the down projections)."""
    from mk.megakernel.pack import pack

    cfg = TINY_MOE.replace(ffn_layout=ffn_layout)
    params = quant.quantize(random_params(cfg, 1), cfg, "int8")
    q = pack(params, cfg)["weights"]
    f = pack(quant.dequantize(params, cfg, jnp.float32), cfg)["weights"]
    names = ("sliding.q", "sliding.o", "sliding.mlp_gate", "sliding.mlp_down", "full.expert_gate", "full.expert_down")
    for name in names:
        codes, scales = q[name], q[quant.scale_path(name)]
        assert codes.dtype == jnp.int8 and scales.dtype == jnp.float32
        # an expert's scales in its row, a layer's matrix's in row 0, broadcast over the input axis
        per = scales[:, : codes.shape[1]] if codes.ndim == 4 else scales[:, 0]  # [L, (E,) lanes]
        if tile_rows_scaled(cfg, name):  # a scale per row: a scale row's lanes, as a column
            per = per[..., : codes.shape[-2], None]
        else:
            per = per[..., None, :]
        got = codes.astype(jnp.float32) * per
        np.testing.assert_array_equal(np.asarray(got), np.asarray(f[name]))
