"""DeepSeek-V3 / Kimi K2 in the megakernel: greedy tokens and logits equal to the reference's (and so to transformers',
tests/test_mla.py) on the tiny checkpoints tests/conftest.py builds, ragged prompts, the race detector on; one chip
(with the query bottleneck and interleaved RoPE; without it, rotate-half, and Kimi's YaRN) and 8 simulated chips (4
query heads: attention on every chip, 8 experts whole or split; 8 query heads: one a chip, the latent cache on every
chip, the down-projections split by rows). MLA decoded absorbed, the latent cache, YaRN's frequencies, cos/sin factor
and softmax mscale, grouped sigmoid routing with its correction bias, the routed scaling, the shared expert and the
dense first layer all run in the kernel; dropping the correction bias or the mscale in the kernel changes its logits
past the tolerance."""

import numpy as np
import pytest

from mk.generate import generate
from mk.kernel_setup import Collective, KernelSetup
from mk.tpu import races_detected
from mk.weights import load_checkpoint

LOGIT_ATOL = 1e-4
NEW_TOKENS = 3


def _prompts(cfg, lengths=(13, 3)):
    rng = np.random.default_rng(3)
    return [rng.integers(0, cfg.vocab_size, n).tolist() for n in lengths]


def _run(params, cfg, prompts, setup=None, new_tokens=NEW_TOKENS, detect_races=True):
    options = dict(detect_races=detect_races, **({} if setup is None else dict(setup=setup)))
    return generate(params, cfg, prompts, new_tokens, engine="megakernel", return_logits=True, engine_options=options)


IDS = ["one-chip", "one-chip-yarn", "8-chips-split", "8-chips-heads-split"]
# Two kernel steps (the second reading the latent cache the first wrote) on one chip; over 8 chips one step (the first
# token is the prefill's): an 8-chip step is ~8 s in the interpreter, and each chip holds the whole latent cache, as one
# chip does. Whole experts over 8 run with the heads split (the placement is the MoE tests' own; MLA with its heads
# replicated, the split case)
CASES = [
    ("deepseek-v3", None, (13, 3), 3),
    # Kimi K2's YaRN (cos and sin scaled too), a prompt past its original 64 positions
    ("deepseek-v3-no-q-lora-yarn", None, (70, 5), 3),
    ("deepseek-v3", KernelSetup(8, "split"), (13, 3), 2),
    # 8 query heads: each chip its head's queries, kv_b columns and o rows, the latent cache on every chip; q_a's and
    # kv_a's rows a block of 128 on chips 0 and 1, their partial sums reduce-scattered then gathered
    ("deepseek-v3-eight-heads", KernelSetup(8, "whole", collective=Collective(reduce_scatter=True)), (13, 3), 2),
]


@pytest.mark.parametrize("name, setup, lengths, new_tokens", CASES, ids=IDS)
def test_greedy_tokens_and_logits_equal_the_references(hf_checkpoint, name, setup, lengths, new_tokens):
    folder, _ = hf_checkpoint(name)
    cfg, params = load_checkpoint(folder)
    assert cfg.latent_attention is not None and cfg.dense_layers == (0,)
    cfg.check_runnable("megakernel")
    prompts = _prompts(cfg, lengths)
    want_tokens, want = generate(params, cfg, prompts, new_tokens, return_logits=True)
    tokens, logits = _run(params, cfg, prompts, setup, new_tokens)
    assert not races_detected()
    np.testing.assert_array_equal(tokens, want_tokens)
    assert np.abs(logits - want).max() < LOGIT_ATOL


@pytest.fixture(scope="module")
def five_layers(tmp_path_factory):
    """The tiny DeepSeek-V3 with YaRN as it publishes it (mscale^2 = 1.46 on the scores) and five layers: the dense
    one, then the MoE pair repeated, so the kernel runs its loop over layers (the layer, its places in the stacked
    tensors and the vector table traced)."""
    import torch
    from conftest import DEEPSEEK_V3, DEEPSEEK_YARN, init_hf_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    d = dict(DEEPSEEK_V3, num_hidden_layers=5, rope_parameters=DEEPSEEK_YARN)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d))
    init_hf_weights(model, seed=7)
    folder = tmp_path_factory.mktemp("tiny-deepseek-v3-5l")
    model.save_pretrained(folder)
    return load_checkpoint(folder)


def test_logits_in_the_loop_over_layers_and_what_breaks_them(five_layers, monkeypatch):
    """One chip, the loop over layers: the kernel's logits are the reference's within 1e-4; with the router's
    correction bias dropped, or the softmax's mscale, they are not."""
    from mk.megakernel import latent, moe
    from mk.plan import LayerLoop, build_plan

    cfg, params = five_layers
    assert any(isinstance(s, LayerLoop) for s in build_plan(cfg, 2, 32).folded)
    prompts = _prompts(cfg)
    want = generate(params, cfg, prompts, NEW_TOKENS, return_logits=True)[1]

    def off(module, name, fn):
        # the first kernel step's logits show a break; the race detector has run over the whole kernel below
        with monkeypatch.context() as m:
            m.setattr(module, name, fn)
            return np.abs(_run(params, cfg, prompts, new_tokens=2, detect_races=False)[1] - want[:, :2]).max()

    assert np.abs(_run(params, cfg, prompts)[1] - want).max() < LOGIT_ATOL and not races_detected()
    no_bias = off(moe, "correction_bias", lambda *a: 0.0)
    no_mscale = off(latent, "score_scale", lambda c: c.score_scale("full") / c.rope_scaling.score_factor)
    assert min(no_bias, no_mscale) > 100 * LOGIT_ATOL, (no_bias, no_mscale)


def test_attention_split_other_than_by_heads_refused_by_name(hf_checkpoint):
    """By users, refused; by positions (the workbook's setup), run by heads: MLA's heads are its KV heads, so where
    they divide the chips no chips share a head's positions."""
    from mk.kernel_setup import AttentionSplit
    from mk.megakernel.engine import make_step

    cfg, _ = load_checkpoint(hf_checkpoint("deepseek-v3-eight-heads")[0])
    with pytest.raises(ValueError, match="splits multi-head latent attention over chips by heads only.*users"):
        make_step(cfg, setup=KernelSetup(8, "whole", attention_split=AttentionSplit.USERS))
    make_step(cfg, setup=KernelSetup(8, "whole", attention_split=AttentionSplit.POSITIONS))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_latent_cache_over_many_tiles_equals_the_references(hf_checkpoint, dtype):
    """Random weights, ragged prompts of 20 and 7, 6 steps, KV tiles of 16 slots (the latent cache read in several
    double-buffered tiles) and weight tiles of 128 KiB (kv_b in four tiles of one head each, a loop over tiles whose
    heads are traced): in f32 the kernel's tokens, logits and latent cache (each step) are the reference's; in
    bf16 weights and cache (as on a TPU, fed the reference's tokens) its logits are off the f32 reference by at most
    1.25x what a reference rounding where the kernel does is off it (mk.measure.chip_parity's criterion)."""
    import jax.numpy as jnp

    from mk.megakernel.parity import compare_with_reference
    from mk.plan import Loop, Tiles, build_plan

    cfg = load_checkpoint(hf_checkpoint("deepseek-v3")[0])[0]
    bf16 = dtype == "bfloat16"
    tiles = Tiles(kv_tile=16, weight_tile_bytes=128 * 1024)
    plan = build_plan(cfg, 2, 48, tiles=tiles)
    loops = [s for s in plan.folded if isinstance(s, Loop)]
    ops = [next(it for it in plan.items[slice(*plan.groups[s.start])] if hasattr(it, "mode")) for s in loops]
    assert [s.count for s, op in zip(loops, ops) if op.mode == "absorb"] == [cfg.num_heads] * cfg.num_layers
    df = compare_with_reference(cfg, 2, 6, prompt_len=[20, 7], max_len=48, tiles=tiles, dtype=getattr(jnp, dtype),
                                teacher_forced=bf16)  # fmt: skip
    assert not df.races.any() and df.kernel_pick_is_argmax.all()
    if bf16:  # the rounding where the kernel rounds (activations, and attention's query and probabilities too)
        like = df.kernel_rounding_logit_diff.max()
        assert df.max_logit_diff.max() <= 1.25 * like, (df.max_logit_diff.max(), like)
        return
    np.testing.assert_array_equal(np.stack(df.tokens_megakernel), np.stack(df.tokens_reference))
    assert df.max_logit_diff.max() < LOGIT_ATOL
    assert df.max_cache_diff.max() / max(1.0, df.max_cache.max()) < LOGIT_ATOL
