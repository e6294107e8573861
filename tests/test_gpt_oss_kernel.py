"""gpt-oss in the megakernel: greedy tokens equal to the reference's (and so to transformers', tests/test_gpt_oss.py) on
the tiny checkpoint, ragged prompts (one past the sliding window), the race detector on; one chip, and 2, 4 and 8
simulated chips with its heads split over them (8 query heads; each chip its heads' biases and sinks) or, with 4 query
heads on 8 chips, split over 4 and repeated over the other 4 (as past one host); experts whole, split, or whole over
groups of 2 chips and split within them (placement hosts). Sinks, the q/k/v/o biases, YaRN's cos/sin factor, the
router's bias and top-k-then-softmax, the expert biases and the clamped SwiGLU all run in the kernel; dropping the sinks
or an expert bias in the kernel, or giving every chip the first chip's heads' biases or sinks, changes its logits past
the tolerance."""

import numpy as np
import pytest
from test_gpt_oss import TINY_GPT_OSS, init_gpt_oss

from mk.generate import generate
from mk.kernel_setup import AttentionSplit, KernelSetup
from mk.plan import Tiles
from mk.tpu import races_detected
from mk.weights import load_checkpoint

LOGIT_ATOL = 1e-4
NEW_TOKENS = 3


def _checkpoint(folder, **changes):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    d = dict(TINY_GPT_OSS, **changes)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d))
    init_gpt_oss(model, seed=5)
    model.save_pretrained(folder)
    return load_checkpoint(folder)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny gpt-oss of tests/test_gpt_oss.py with 8 experts (whole over 8 chips: one a chip)."""
    return _checkpoint(tmp_path_factory.mktemp("tiny-gpt-oss-8e"), num_local_experts=8)


@pytest.fixture(scope="module")
def eight_heads(tmp_path_factory):
    """The same with 8 query heads (2 KV heads): split over 2, 4 or 8 chips; a sliding window of 32, so that 2 chips
    sharing a KV head's positions each hold a whole block of its sliding cache."""
    folder = tmp_path_factory.mktemp("tiny-gpt-oss-8h")
    return _checkpoint(folder, num_local_experts=8, num_attention_heads=8, sliding_window=32)


def _prompts(cfg):
    rng = np.random.default_rng(3)
    return [rng.integers(0, cfg.vocab_size, n).tolist() for n in (13, 3)]


def _run(params, cfg, setup=None, logits=False, new_tokens=NEW_TOKENS, max_len=None, **options):
    if setup is not None:
        options["setup"] = setup
    return generate(params, cfg, _prompts(cfg), new_tokens, engine="megakernel", return_logits=logits,
                    max_len=max_len, engine_options={"detect_races": True, **options})  # fmt: skip


# Two kernel steps (the second reading the cache the first wrote) on one chip; over chips one step (the first token
# is the prefill's, and an 8-chip step takes seconds interpreted): 4 query heads on 8 chips split over chips 0-3 and
# repeated on 4-7 (repeat_heads, as mk.sharding.pods places heads past one host: the repeats' output projections zero,
# the o bias added once); with 8 each chip runs its heads, their biases and sinks, and with attention
# split by positions 2 chips share each KV head (each head's sink added once, when their partial softmaxes merge).
# Experts split, whole, and the hosts' groups: each group of 2 chips holds its half of the experts whole, each split
# over its 2, so a chip's own expert rows of the bias tensors and the split's biases run together
POSITIONS = KernelSetup(4, "split", attention_split=AttentionSplit.POSITIONS)
REPEATED = KernelSetup(8, "split", repeat_heads=True)


@pytest.mark.parametrize(
    "checkpoint, setup, max_len, tiles",
    [("tiny", None, None, Tiles()), ("tiny", REPEATED, None, Tiles()),
     ("eight_heads", KernelSetup(8, "split"), None, Tiles()),
     ("eight_heads", KernelSetup(4, "hosts", host_chips=2), None, Tiles()),
     ("eight_heads", KernelSetup(4, "whole"), None, Tiles()),
     ("eight_heads", KernelSetup(2, "split"), None, Tiles(expert_bias_ahead=True)),
     ("eight_heads", POSITIONS, 64, Tiles())],
    ids=["one-chip", "8-chips-heads-repeated", "8-chips-split", "4-chips-hosts", "4-chips-whole",
         "2-chips-split-biases-read-ahead", "4-chips-positions"],
)  # fmt: skip
def test_greedy_tokens_equal_the_references(checkpoint, setup, max_len, tiles, request):
    from mk.sharding import attention_chips, heads_split, position_share

    cfg, params = request.getfixturevalue(checkpoint)
    cfg.check_runnable("megakernel")
    assert setup is None or heads_split(cfg, setup.chips) == (checkpoint == "eight_heads")
    assert setup is not POSITIONS or {position_share(cfg, t, setup) for t in cfg.layer_types} == {2}
    assert setup is not REPEATED or attention_chips(cfg, setup) == 4
    new_tokens = NEW_TOKENS if setup is None else 2
    want_tokens, want = generate(params, cfg, _prompts(cfg), new_tokens, return_logits=True, max_len=max_len)
    tokens, logits = _run(params, cfg, setup, logits=True, new_tokens=new_tokens, max_len=max_len, tiles=tiles)
    assert not races_detected()
    np.testing.assert_array_equal(tokens, want_tokens)
    assert np.abs(logits - want).max() < LOGIT_ATOL


@pytest.mark.parametrize("vector", ["sinks", "k_bias"])  # cut as the query heads, and as the KV heads
def test_every_chip_needs_its_own_heads_vectors(eight_heads, vector, monkeypatch):
    """Over 2 chips with the heads split, each chip given the first chip's heads' ``vector`` instead of its own: the
    logits leave the reference's by far more than the tolerance."""
    from mk.sharding import placement

    cfg, params = eight_heads
    _, want = generate(params, cfg, _prompts(cfg), 2, return_logits=True)  # the second token is the kernel's
    cut = placement._matrix_cut
    monkeypatch.setattr(placement, "_matrix_cut",
                        lambda c, s, chip, path: cut(c, s, 0 if path.endswith(vector) else chip, path))  # fmt: skip
    _, logits = _run(params, cfg, KernelSetup(2, "split"), logits=True, new_tokens=2, detect_races=False)
    assert np.abs(logits - want).max() > 100 * LOGIT_ATOL


@pytest.fixture(scope="module")
def four_a_token(tmp_path_factory):
    """8 experts, 4 a token: two users route to up to 8 distinct experts, twice the ring of biases read ahead."""
    return _checkpoint(tmp_path_factory.mktemp("tiny-gpt-oss-top4"), num_local_experts=8, num_experts_per_tok=4)


def test_expert_biases_read_ahead_give_the_references_tokens(four_a_token):
    """Tiles.expert_bias_ahead: each routed slot's bias rows start at the route (the first 4 slots) or at the combine
    of the slot 4 before it, into a ring of 4 places; greedy tokens the reference's, logits within 1e-4, no races
    (over 2 chips: test_greedy_tokens_equal_the_references)."""
    from mk.plan import BIAS_RING, build_plan

    cfg, params = four_a_token
    plan = build_plan(cfg, 2, 32, tiles=Tiles(expert_bias_ahead=True))
    assert plan.expert_slots == 2 * BIAS_RING and plan.expert_bias_ring == BIAS_RING
    want_tokens, want = generate(params, cfg, _prompts(cfg), NEW_TOKENS, return_logits=True)
    tokens, logits = _run(params, cfg, logits=True, tiles=Tiles(expert_bias_ahead=True))
    assert not races_detected()
    np.testing.assert_array_equal(tokens, want_tokens)
    assert np.abs(logits - want).max() < LOGIT_ATOL


@pytest.fixture(scope="module")
def six_layers(tmp_path_factory):
    """Six layers: the sliding/full pair repeated, so the kernel runs its loop over layers (the layer, its place in
    the stacked tensors and the expert biases' rows traced)."""
    return _checkpoint(tmp_path_factory.mktemp("tiny-gpt-oss-6l"), num_hidden_layers=6)


def test_logits_in_the_loop_over_layers_and_what_breaks_them(six_layers, monkeypatch):
    """One chip, the loop over layers: the kernel's logits are the reference's within 1e-4 (f32), the experts'
    biases read ahead (their layer, slot and chunk traced); without the sinks in its softmax, or without the experts'
    gate/up or down biases (read where used), they are not."""
    from mk.megakernel import attention, moe
    from mk.plan import LayerLoop, build_plan

    cfg, params = six_layers
    assert any(isinstance(s, LayerLoop) for s in build_plan(cfg, 2, 32).folded)
    want_tokens, want = generate(params, cfg, _prompts(cfg), NEW_TOKENS, return_logits=True)
    tokens, logits = _run(params, cfg, logits=True, tiles=Tiles(expert_bias_ahead=True))
    assert not races_detected()
    np.testing.assert_array_equal(tokens, want_tokens)
    assert np.abs(logits - want).max() < LOGIT_ATOL

    def broken(module, name, fn):
        # the first kernel step's logits show a break; the race detector has run over the whole kernel above
        with monkeypatch.context() as m:
            m.setattr(module, name, fn)
            return np.abs(_run(params, cfg, logits=True, new_tokens=2, detect_races=False)[1] - want[:, :2]).max()

    no_sinks = broken(attention, "_head_sinks", lambda *a: -1e30)  # exp(-1e30 - m) = 0: no sink
    bias = moe._expert_bias
    no_gate_up = broken(
        moe, "_expert_bias", lambda k, op, name, *a: 0.0 if "gate_up" in name else bias(k, op, name, *a)
    )
    no_down = broken(moe, "_expert_bias", lambda k, op, name, *a: 0.0 if "down" in name else bias(k, op, name, *a))
    assert min(no_sinks, no_gate_up, no_down) > 100 * LOGIT_ATOL, (no_sinks, no_gate_up, no_down)
