"""gpt-oss in the megakernel: greedy tokens equal to the reference's (and so to transformers', tests/test_gpt_oss.py)
on the tiny checkpoint, ragged prompts (one past the sliding window), the race detector on; one chip and 8 simulated
chips (4 query heads: attention on every chip; experts whole, split, or whole over groups of 2 chips and split within
them: placement hosts). Sinks, the q/k/v/o biases, YaRN's cos/sin factor, the router's bias and top-k-then-softmax,
the expert biases and the clamped SwiGLU all run in the kernel; dropping the sinks or an expert bias in the kernel
changes its logits past the tolerance (the last test)."""

import numpy as np
import pytest
from test_gpt_oss import TINY_GPT_OSS, init_gpt_oss

from mk.generate import generate
from mk.kernel_setup import KernelSetup
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


def _prompts(cfg):
    rng = np.random.default_rng(3)
    return [rng.integers(0, cfg.vocab_size, n).tolist() for n in (13, 3)]


def _run(params, cfg, setup=None, logits=False, new_tokens=NEW_TOKENS, **options):
    if setup is not None:
        options["setup"] = setup
    return generate(params, cfg, _prompts(cfg), new_tokens, engine="megakernel", return_logits=logits,
                    engine_options={"detect_races": True, **options})  # fmt: skip


# Two kernel steps (the second reading the cache the first wrote) on one chip; over 8 chips one step (the first token
# is the prefill's, and an 8-chip step takes seconds interpreted): with 4 query heads attention runs on every chip,
# its cache as one chip's. Experts split over 8, and the hosts' groups: each group of 2 chips holds a quarter of the
# experts whole, each split over its 2, so a chip's own expert rows of the bias tensors and the split's biases run
# together
@pytest.mark.parametrize(
    "setup, new_tokens",
    [(None, NEW_TOKENS), (KernelSetup(8, "split"), 2), (KernelSetup(8, "hosts", host_chips=2), 2)],
    ids=["one-chip", "8-chips-split", "8-chips-hosts"],
)  # fmt: skip
def test_greedy_tokens_equal_the_references(tiny, setup, new_tokens):
    cfg, params = tiny
    cfg.check_runnable("megakernel")
    want = generate(params, cfg, _prompts(cfg), new_tokens)
    got = _run(params, cfg, setup, new_tokens=new_tokens)
    assert not races_detected()
    np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def six_layers(tmp_path_factory):
    """Six layers: the sliding/full pair repeated, so the kernel runs its loop over layers (the layer, its place in
    the stacked tensors and the expert biases' rows traced)."""
    return _checkpoint(tmp_path_factory.mktemp("tiny-gpt-oss-6l"), num_hidden_layers=6)


def test_logits_in_the_loop_over_layers_and_what_breaks_them(six_layers, monkeypatch):
    """One chip, the loop over layers: the kernel's logits are the reference's within 1e-4 (f32); without the
    sinks in its softmax, or without the experts' gate/up or down biases, they are not."""
    from mk.megakernel import attention, moe
    from mk.plan import LayerLoop, build_plan

    cfg, params = six_layers
    assert any(isinstance(s, LayerLoop) for s in build_plan(cfg, 2, 32).folded)
    want_tokens, want = generate(params, cfg, _prompts(cfg), NEW_TOKENS, return_logits=True)
    tokens, logits = _run(params, cfg, logits=True)
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
