"""The megakernel on the formats big models ship in (mk.format_trees: FP8 blocks, MXFP4, INT4 groups): it streams their
codes and scales and widens each tile in VMEM, held to the reference on the dequantized tree (Pallas TPU interpret
mode, race detector on), on one chip and over 8 simulated chips; the plan's bytes are mk.sol's for the format."""

import importlib.util
import json

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from test_int8_kernel import kernel_against_dequantized_reference

from mk import checkpoint_formats as F, format_trees, quant
from mk.config import GEMMA4_26B_A4B, TINY_DENSE, TINY_MOE
from mk.generate import generate
from mk.kernel_setup import KernelSetup
from mk.params import EXPERTS
from mk.plan import Tiles, build_plan
from mk.sol import bytes_per_token
from mk.weights import random_params


def _kernel_against_dequantized_reference(cfg, scheme, prompts, params=None, **options):
    """The kernel on ``scheme``'s tree (of random weights unless ``params``) against the reference on it dequantized."""
    params = params if params is not None else format_trees.quantize(random_params(cfg, 0), cfg, scheme)
    kernel_against_dequantized_reference(params, cfg, prompts, 2, **options)


PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9]]


def test_kernel_streams_fp8_blocks_and_gives_the_dequantized_references_tokens():
    """Every matrix but the embedding FP8 with a scale per 128 x 128 block (DeepSeek-V3's release), tiny MoE."""
    _kernel_against_dequantized_reference(TINY_MOE, "fp8-block", PROMPTS)


# gpt-oss-20b's 2,880-wide experts on one chip: its down projections' rows in tiles of 1,536 and 1,344, the last
# tile's 42 rows of scales fewer than its slot's 48 (their own buffer: mk.plan.FormatLoad.tile_scales). Two layers:
# the experts' tiles are the point, and each layer of them is code of its own (a third of the compile a layer)
WIDE_EXPERTS = TINY_MOE.replace(name="tiny-moe-wide-experts", expert_intermediate=2880).truncated(2)
NARROWER_LAST = Tiles(weight_tile_bytes=196608)


@pytest.mark.parametrize("scheme", ["mxfp4", "int4"])
def test_kernel_streams_4_bit_experts_and_gives_the_dequantized_references_tokens(scheme):
    """The routed experts in MXFP4 (gpt-oss's) or INT4 groups of 32 (Kimi K2 Thinking's), two codes a byte; MXFP4's
    2,880 wide, a down projection's last tile of rows narrower than the others."""
    if scheme == "int4":
        _kernel_against_dequantized_reference(TINY_MOE, scheme, PROMPTS)
    else:
        _kernel_against_dequantized_reference(WIDE_EXPERTS, scheme, PROMPTS[:1], tiles=NARROWER_LAST)


@pytest.mark.parametrize("scheme", ["mxfp4", "int4"])
def test_kernel_over_8_chips_streams_4_bit_experts_cut_in_whole_groups(scheme):
    """4-bit experts over 8 simulated chips, each expert's intermediate split: 96 / 8 = 12 rows a chip would cut the
    down projection's input groups of 32, so the setup the kernel runs (mk.sharding.pods.pod_setup, as for
    gpt-oss-120b's 2,880 over 8 chips) rounds each chip's slice up to one whole group, the experts zero-padded (chips 3
    to 7 hold zeros only). 4-bit experts whole a chip: Kimi K2 Thinking's INT4 experts over 8 chips, below. Two
    layers, as over 8 chips below: the formats' tiles are the point."""
    from mk.chips import get_chip
    from mk.sharding.pods import pod_setup

    cfg = TINY_MOE.replace(name="tiny-moe-experts-96", expert_intermediate=96).truncated(2)
    setup = pod_setup(KernelSetup(8, "split"), get_chip("tpu-v5e-8"), cfg, dtype=scheme)
    assert setup.expert_rows == 32 and build_plan(cfg, 1, 64, setup=setup).share.expert_intermediate == 32
    _kernel_against_dequantized_reference(cfg, scheme, PROMPTS, setup=setup)


def test_kernel_over_8_chips_streams_fp8_blocks():
    """FP8 blocks over 8 simulated chips, whole experts: each chip's 128 of the shared MLP's 1024 are one block."""
    cfg = TINY_MOE.replace(name="tiny-moe-mlp-1024", mlp_intermediate=1024).truncated(2)
    _kernel_against_dequantized_reference(cfg, "fp8-block", PROMPTS[:1], setup=KernelSetup(8, "whole"))


def test_int4_experts_with_the_intermediate_on_lanes():
    """The "lanes" layout of the gated MLPs: gate and up as they are, their input groups (and nibble pairs) on rows,
    the down projection's on rows too."""
    cfg = TINY_MOE.truncated(2)  # two layers: the MLPs' layout is the point
    _kernel_against_dequantized_reference(cfg, "int4", PROMPTS[:1], setup=KernelSetup(1, ffn_layout="lanes"))


def test_a_layout_that_splits_a_block_is_refused():
    """Heads of 96 dims spread to 128 lanes each: the second head's dims straddle two FP8 blocks of 128 columns
    but share one block of the kernel's lanes."""
    from mk.megakernel.pack import pack

    cfg = TINY_DENSE.replace(sliding_head_dim=96, full_head_dim=96)
    params = format_trees.quantize(random_params(cfg, 0), cfg, "fp8-block")
    with pytest.raises(ValueError, match=r"layers.0.q: the kernel's layout of it puts weights of one fp8-block block"):
        pack(params, cfg)


def test_a_chips_slice_may_split_an_fp8_block_but_not_a_4_bit_group():
    """A shared MLP of 768 over 8 chips is 96 a chip: chip 1's columns 96..191 end one FP8 block of 128 and start the
    next. Its codes are those columns, its scales its blocks' over blocks of 32 (three), and they stand for its slice
    of the matrix's weights exactly. A split expert's 128 over 8 chips, 16 a chip, would cut INT4's groups of 32
    inputs of its down projection: refused by name."""
    from mk.sharding import chip_params

    cfg, setup = TINY_MOE.replace(mlp_intermediate=768), KernelSetup(8, "split")
    fp8 = format_trees.quantize(random_params(cfg, 0), cfg, "fp8-block")
    whole = format_trees.decode_matrix(fp8["layers.0.mlp_gate"], fp8["layers.0.mlp_gate_fscale"], "fp8-block")
    chip = chip_params(fp8, cfg, setup, 1)
    codes, scales = chip["layers.0.mlp_gate"], chip["layers.0.mlp_gate_fscale"]
    assert codes.shape[-1] == 96 and scales.shape[-1] == 3
    assert format_trees.matrix_block(codes, scales, "fp8-block") == (128, 32)
    np.testing.assert_array_equal(format_trees.decode_matrix(codes, scales, "fp8-block"), whole[:, 96:192])
    int4 = format_trees.quantize(random_params(TINY_MOE, 0), TINY_MOE, "int4")
    with pytest.raises(ValueError, match="expert_down from 16 split int4's blocks of 32 along its input"):
        chip_params(int4, cfg, setup, 1)


@pytest.mark.parametrize("scheme", ["fp8-block", "int4"])
def test_in_bf16_the_kernel_on_codes_is_the_kernel_on_their_float_tree(scheme):
    """In BF16 the widened tiles are the dequantized tree's weights exactly: the kernel streaming the codes gives the
    tokens and logits of the kernel streaming that BF16 tree, bit for bit (the reference in BF16 differs from
    both alike, by more than the F32 tests' tolerance, for these weights)."""
    cfg = TINY_MOE.truncated(2)  # two layers: the widened tiles are the point (every layer's, the test above)
    params = format_trees.quantize(random_params(cfg, 0, jnp.bfloat16), cfg, scheme)
    floats = quant.dequantize(params, cfg)
    want = generate(floats, cfg, PROMPTS, 2, engine="megakernel", return_logits=True)
    got = generate(params, cfg, PROMPTS, 2, engine="megakernel", return_logits=True)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    for g, w in zip(got[1], want[1]):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


@pytest.mark.parametrize("scheme, cfg", [("fp8-block", TINY_DENSE), ("mxfp4", TINY_MOE)], ids=["fp8-block", "mxfp4"])
def test_dropping_the_block_scales_fails(scheme, cfg):
    """The mutation the tests above must catch: the kernel fed the codes with every block scale 1 (E8M0's 127)."""
    params = format_trees.quantize(random_params(cfg, 0), cfg, scheme)
    want = generate(quant.dequantize(params, cfg), cfg, PROMPTS[:1], 1, return_logits=True)[1]
    unit = 127 if scheme == "mxfp4" else 1
    ones = {k: jnp.full_like(v, unit) if k.endswith(format_trees.FSCALE_SUFFIX) else v for k, v in params.items()}
    got = generate(ones, cfg, PROMPTS[:1], 1, engine="megakernel", return_logits=True)[1]
    assert not np.allclose(np.asarray(got[-1]), np.asarray(want[-1]), atol=1e-4, rtol=1e-4)


def test_format_trees_decode_as_checkpoint_formats_does():
    """A format tree's matrix is mk.checkpoint_formats' encoding of the float matrix transposed to [out, in] (a
    checkpoint's orientation), in the format's dtypes: dequantized, each expert is what mk.checkpoint_formats decodes
    it to."""
    cfg = TINY_MOE
    params = random_params(cfg, 1)
    w = np.asarray(params["layers.2.expert_down"][3]).T  # [out, in]
    bf16_scales = lambda words, s, shape: F.decode_int4_packed(words, s.astype(ml_dtypes.bfloat16), shape)  # noqa: E731
    want = {
        "fp8-block": F.decode_fp8_block(*F.encode_fp8_block(w)),
        "mxfp4": F.decode_mxfp4(*F.encode_mxfp4(w)),
        "int4": bf16_scales(*F.encode_int4_packed(w)),
    }
    for scheme, fmt in format_trees.FORMAT_SCHEMES.items():
        q = format_trees.quantize(params, cfg, scheme)
        for path in format_trees.format_paths(cfg, scheme):
            assert q[path].dtype == fmt.codes and q[format_trees.fscale_path(path)].dtype == fmt.scales
        got = np.asarray(quant.dequantize(q, cfg)["layers.2.expert_down"][3]).T
        np.testing.assert_array_equal(got, want[scheme], err_msg=scheme)


@pytest.mark.parametrize("scheme", ["fp8-block", "mxfp4", "int4"])
def test_plan_and_sol_agree_on_format_bytes(scheme):
    """python -m mk sol --dtype fp8-block (mxfp4, int4) and the plan's real bytes (codes, block scales, KV),
    expected over uniform routing, within 1%."""
    plan = build_plan(GEMMA4_26B_A4B, 1, 1024, weight_dtype="bfloat16", kv_dtype="bfloat16", quantize=scheme)
    sol = bytes_per_token(GEMMA4_26B_A4B, 1024, 1, scheme)
    assert abs(plan.payload_bytes + plan.kv_bytes - sol.total) / sol.total < 0.01
    experts = [ld for ld in plan.loads if ld.component == EXPERTS]
    assert experts and all(ld.fmt == scheme for ld in experts)


def test_formats_refuse_what_they_cannot_hold():
    int8 = quant.quantize(random_params(TINY_MOE, 0), TINY_MOE, "int8-experts")
    with pytest.raises(ValueError, match="quantized already"):
        format_trees.quantize(int8, TINY_MOE, "mxfp4")
    with pytest.raises(ValueError, match="mxfp4 is a format of routed experts.*use fp8-block"):
        format_trees.format_paths(TINY_DENSE, "mxfp4")
    odd = TINY_MOE.replace(expert_intermediate=48)
    with pytest.raises(ValueError, match="expert width 48 is not a multiple of 32"):
        format_trees.format_paths(odd, "int4")


def test_checkpoints_in_the_formats_load_as_codes_for_the_kernel(hf_checkpoint, tmp_path):
    """A tiny Llama saved with FP8 projections in 128 x 128 blocks, and a tiny Qwen3-MoE with packed INT4 experts
    (compressed-tensors' layout), load with ``codes=True`` as the format trees mk.format_trees makes from their float
    weights, bit for bit; the INT4 one runs in the kernel as the decoded checkpoint does in the reference."""
    from test_formats import _rewrite

    from mk.weights import load_checkpoint

    def fp8(name, a):
        if name.endswith("proj.weight"):
            q, s = F.encode_fp8_block(a, (128, 128))
            return {name: q, name + "_scale_inv": s}
        return None

    def int4(name, a):
        if ".mlp.experts." not in name or not name.endswith(".weight"):
            return None
        packed, scale, shape = F.encode_int4_packed(a, 32)
        base = name[: -len(".weight")]
        return {base + ".weight_packed": packed, base + ".weight_scale": scale.astype(ml_dtypes.bfloat16),
                base + ".weight_shape": shape}  # fmt: skip

    group = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "group_size": 32}}
    cases = [
        ("tiny-llama", fp8, {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, "fp8-block"),
        ("tiny-qwen3-moe", int4, {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                  "config_groups": {"group_0": group}}, "int4"),
    ]  # fmt: skip
    for source, encode, qc, scheme in cases:
        folder, _ = hf_checkpoint(source)
        _rewrite(folder, tmp_path / scheme, encode, qc)
        cfg, float_params = load_checkpoint(folder)
        _, codes = load_checkpoint(tmp_path / scheme, codes=True)
        want = format_trees.quantize(float_params, cfg, scheme)
        assert format_trees.format_of(codes) == scheme and sorted(codes) == sorted(want)
        for path in want:
            np.testing.assert_array_equal(np.asarray(codes[path]), np.asarray(want[path]), err_msg=path)
    _kernel_against_dequantized_reference(cfg, scheme, PROMPTS, params=codes)


def test_cli_generate_mxfp4_megakernel_gives_the_dequantized_references_tokens(mk_json):
    """``python -m mk generate --model tiny-moe --quantize mxfp4 --engine megakernel --detect-races``."""
    params = format_trees.quantize(random_params(TINY_MOE, 0), TINY_MOE, "mxfp4")
    want = generate(quant.dequantize(params, TINY_MOE), TINY_MOE, PROMPTS[:1], 2)
    got = mk_json(
        "generate", "--model", "tiny-moe", "--seed", 0, "--quantize", "mxfp4", "--engine", "megakernel",
        "--detect-races", "--json", "--prompt-ids", ",".join(map(str, PROMPTS[0])), "--new-tokens", 2,
    )  # fmt: skip
    assert got["quantize"] == "mxfp4" and not got["races"]
    assert got["tokens"] == np.asarray(want).tolist()


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="AOT compilation for TPU needs libtpu")
@pytest.mark.parametrize("scheme, chip", [("fp8-block", "tpu-v5e"), ("fp8-block", "tpu-v6e"), ("int4", "tpu-v5e"),
                                          ("mxfp4", "tpu-v5e")])  # fmt: skip
def test_each_formats_step_compiles_for_tpu(scheme, chip):
    """libtpu's Mosaic compiles the step that streams each format's tiles and their scales and widens them in VMEM:
    the 4-bit codes unpacked by whole tiles (mk.plan.layout.NIBBLE_CHUNK: a chunk's halves in the low and high
    nibbles; the checkpoints' interleave does not lower). MXFP4 on 2,880-wide experts: a narrower last tile's scales
    (42 of 48 rows) fill a buffer of their own, as a slice of the slot's would split a sublane tile, which Mosaic
    refuses (as it did on the v5e for gpt-oss-20b)."""
    from mk.megakernel.aot import compile_for_tpu

    cfg, tiles = (WIDE_EXPERTS, NARROWER_LAST) if scheme == "mxfp4" else (TINY_MOE, Tiles())
    plan, compiled = compile_for_tpu(cfg, chip, 4, 64, quantize=scheme, tiles=tiles)
    assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == 1
    assert any(getattr(ld, "fmt", None) == scheme for ld in plan.loads)
    narrower = {ld.tile_scales for ld in plan.loads if getattr(ld, "tile_scales", None)}
    assert (scheme == "mxfp4") == ((42, 128) in narrower)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="AOT compilation for TPU needs libtpu")
def test_latent_attention_in_fp8_blocks_compiles_with_the_plans_bytes():
    """Kimi K2's layers at its own head dims (128 + 64 query dims a head, 128 value dims, ranks 1,536 and 512) in a
    narrower model (2,048 wide, 2 heads, 8 experts: the compile a tenth of the full width's): Mosaic lowers the FP8
    tiles of MLA's projections, q_b's scales in cells of 128 x 64 (each head's 192 columns from lane-tile edges),
    every tile bringing its matrix's whole scales; the compiler's argument bytes are the plan's, byte for byte."""
    from mk.config import get_config
    from mk.megakernel.aot import compile_for_tpu
    from mk.megakernel.on_slice import plan_bytes

    narrow = dict(hidden_size=2048, vocab_size=4096, mlp_intermediate=512, dense_intermediate=1024, num_experts=8)
    heads = dict(num_heads=2, sliding_kv_heads=2, full_kv_heads=2, expert_intermediate=256)
    cfg = get_config("kimi-k2").truncated(2).replace(**narrow, **heads)
    plan, compiled = compile_for_tpu(cfg, "tpu-v5e", 1, 256, quantize="fp8-block")
    assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == 1
    assert {ld.grid for ld in plan.loads if ld.tensor == "full.q_b"} == {(128, 64)}
    assert compiled.memory_analysis().argument_size_in_bytes == sum(plan_bytes(plan).values())


def test_kimi_k2_thinkings_int4_experts_on_deepseek_v3_over_8_chips(hf_checkpoint):
    """Kimi K2 Thinking's release: the DeepSeek-V3 architecture with INT4 routed experts, whole a chip over 8 chips
    (its latent attention on one chip and in FP8 blocks: the test below); the tiny checkpoint's experts quantized,
    the rest as loaded. INT8 on the latent projections is refused by name (no release ships them so)."""
    from mk.megakernel.pack import pack
    from mk.weights import load_checkpoint

    cfg, params = load_checkpoint(hf_checkpoint("deepseek-v3")[0])
    with pytest.raises(ValueError, match="MLA's projections as shipped .FP8 blocks. or unquantized, not as INT8"):
        pack(quant.quantize(params, cfg, "int8"), cfg)
    int4 = format_trees.quantize(params, cfg, "int4")
    _kernel_against_dequantized_reference(cfg, "int4", PROMPTS, params=int4, setup=KernelSetup(8, "whole"))


def _fp8_128(name, a):
    """DeepSeek-V3's and Kimi K2's release: every projection (attention's latent ones, the MLPs', each expert's) FP8
    in 128 x 128 blocks; the router, norms, embedding and head as they are."""
    if name.endswith(("proj.weight", "proj_with_mqa.weight")):
        q, s = F.encode_fp8_block(a, (128, 128))
        return {name: q, name + "_scale_inv": s}
    return None


@pytest.mark.parametrize(
    "source, setup",
    [("deepseek-v3", None), ("deepseek-v3", KernelSetup(8, "whole", repeat_heads=True)),
     ("kimi-k2", None), ("kimi-k2", KernelSetup(8, "split", torus=((2, False), (4, True))))],
    ids=["deepseek-v3-one-chip", "deepseek-v3-8-chips-whole-heads-repeated", "kimi-k2-one-chip",
         "kimi-k2-8-chips-split-over-a-torus"],
)  # fmt: skip
def test_deepseek_v3_and_kimi_k2_as_shipped_in_fp8_blocks(hf_checkpoint, tmp_path, source, setup):
    """The tiny checkpoints saved as the releases are (FP8 blocks of 128 x 128; Kimi K2's config names its own
    model type), loaded as shipped (``codes=True``): every projection streams as FP8 codes and block scales, MLA's
    latent ones too, and the kernel gives the dequantized reference's tokens. Over 8 chips the chips' cuts split
    blocks: DeepSeek-V3's dense and shared MLPs' 96 and 32 columns are 12 and 4 a chip, its 4 heads one a chip over
    chips 0-3 and repeated on 4-7 (as Kimi K2's 64 heads are over 128 chips: the repeats' o in FP8 zeros); Kimi K2's
    8 query heads are one a chip (24 q_b columns), its experts' 32 columns 4 a chip, its down-projections' 256 rows
    a block of 128 on each of chips 0 and 1 (zeros on 2-7), their partial sums all-reduced over a 2 x 4 torus. The
    kernel's layout of MLA's projections spreads each head's parts to lane-tile edges, its block scales with them."""
    from test_formats import _rewrite

    from mk.weights import load_checkpoint

    qc = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    folder = tmp_path / source
    _rewrite(hf_checkpoint(source)[0], folder, _fp8_128, qc)
    if source == "kimi-k2":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(dict(config, model_type="kimi_k2")))
    cfg, params = load_checkpoint(folder, codes=True)
    shipped = {p for p in params if p.endswith(format_trees.FSCALE_SUFFIX)}
    assert shipped == {format_trees.fscale_path(p) for p in format_trees.format_paths(cfg, "fp8-block")}
    assert {"layers.0.q_b_fscale", "layers.0.kv_a_fscale", "layers.2.o_fscale"} <= shipped
    options = {} if setup is None else dict(setup=setup)
    kernel_against_dequantized_reference(params, cfg, PROMPTS[:1], 2, **options)
