"""gpt-oss against transformers' GptOssForCausalLM, an implementation we did not write: attention sinks, biased
q/k/v/o, sliding and full layers alternating, biased experts with the clamped SwiGLU, the router's top k then softmax,
YaRN RoPE. A tiny random model saved by transformers is loaded by mk; the reference's greedy tokens (prefill, decode,
speculative verification) are transformers' own ``generate(do_sample=False)``'s.

transformers initialises the biases to zero: every tensor here is drawn afresh (biases and sinks around 0, not at
it), and the SwiGLU's limit is lowered so the clamp bites. Tolerance as tests/test_parity.py: float32 both sides.
"""

import copy

import numpy as np
import pytest

from mk.config import from_hf_dict, to_hf_dict
from mk.generate import generate
from mk.reference import init_cache, prefill, verify_step
from mk.weights import EMBED_STD, load_checkpoint, random_params, save_checkpoint

LOGIT_ATOL = 1e-4
NEW_TOKENS = 8
# transformers' config keys, tiny: 3 layers (sliding, full, sliding), a window of 4 (shorter than the long prompt),
# 4 query heads on 2 KV heads, 6 experts of which 2 a token, YaRN as the published config has it.
TINY_GPT_OSS = dict(
    model_type="gpt_oss",
    vocab_size=300,
    hidden_size=64,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=6,
    num_experts_per_tok=2,
    sliding_window=4,
    swiglu_limit=1.5,  # the published 7.0 never clips activations this small
    swiglu_alpha=1.6,
    rope_parameters=dict(
        rope_type="yarn",
        rope_theta=150000.0,
        factor=32.0,
        beta_fast=32.0,
        beta_slow=1.0,
        truncate=False,
        original_max_position_embeddings=4096,
    ),
)


def init_gpt_oss(model, seed: int) -> None:
    """Every tensor drawn: matrices N(0, 1/fan_in) (gpt-oss's experts are stored [in, out]: fan-in the second last
    axis; its Linear weights [out, in]: the last), the embedding as mk.weights draws it, norms 1 + N(0, 0.1^2),
    biases N(0, 0.3^2) and sinks N(0, 1) (both zero in transformers' init)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.named_parameters():
            z = torch.randn(t.shape, generator=gen)
            if name.endswith("embed_tokens.weight"):
                t.copy_(z * (EMBED_STD * t.shape[1] ** -0.5))
            elif name.endswith(("gate_up_proj", "experts.down_proj")):
                t.copy_(z * t.shape[-2] ** -0.5)
            elif name.endswith("sinks"):
                t.copy_(z)
            elif "bias" in name:
                t.copy_(0.3 * z)
            elif t.ndim >= 2:
                t.copy_(z * t.shape[-1] ** -0.5)
            else:
                t.copy_(1.0 + 0.1 * z)


@pytest.fixture(scope="module")
def hf_gpt_oss(tmp_path_factory):
    """(folder, model): the tiny GptOssForCausalLM saved by save_pretrained, reloaded with eager attention."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    d = dict(TINY_GPT_OSS)
    config = AutoConfig.for_model(d.pop("model_type"), **d)
    model = AutoModelForCausalLM.from_config(config)
    init_gpt_oss(model, seed=5)
    folder = tmp_path_factory.mktemp("tiny-gpt-oss")
    model.save_pretrained(folder)
    return folder, AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


def hf_greedy(model, prompt: list[int], n: int):
    """transformers' greedy tokens [n] for one prompt and the logits [n, V] that chose them (no end of sequence)."""
    import torch

    ids = torch.tensor([prompt], dtype=torch.long)
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id, config.pad_token_id = None, 0
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, do_sample=False,
                             max_new_tokens=n, output_logits=True, return_dict_in_generate=True)  # fmt: skip
    return out.sequences[0, len(prompt) :].numpy(), torch.stack(out.logits, 1)[0].float().numpy()


def test_the_config_is_read_whole(hf_gpt_oss):
    folder, _ = hf_gpt_oss
    cfg, _ = load_checkpoint(folder)
    assert cfg.family == "gpt_oss" and cfg.runnable and cfg.layer_types == ("sliding", "full", "sliding")
    assert (cfg.swiglu_limit, cfg.swiglu_alpha, cfg.sliding_window) == (1.5, 1.6, 4)
    assert cfg.rope_scaling.factor == 32.0 and not cfg.rope_scaling.truncate
    assert from_hf_dict(to_hf_dict(cfg), cfg.name) == cfg


def test_ragged_greedy_parity_with_transformers(hf_gpt_oss):
    """Two prompts of different lengths (one past the window of 4, one inside it) decoded together: each user gets
    transformers' greedy tokens and logits for its prompt alone; then speculative verification of those tokens as
    drafts picks them again."""
    folder, model = hf_gpt_oss
    cfg, params = load_checkpoint(folder)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (13, 3)]
    tokens, logits = generate(params, cfg, prompts, NEW_TOKENS, return_logits=True)
    want = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    for b, (want_tokens, want_logits) in enumerate(want):
        diff = np.abs(logits[b] - want_logits).max()
        assert diff <= LOGIT_ATOL, f"user {b}: max logit difference {diff:.2e}"
        np.testing.assert_array_equal(tokens[b], want_tokens, f"user {b}")
    assert all(len(set(row)) >= NEW_TOKENS // 4 for row in tokens.tolist())

    # verify_step: each user's first greedy token and the next ones as drafts, one pass: the picks are the next ones
    lengths = np.array([len(p) for p in prompts])
    padded = np.array([p + [0] * (lengths.max() - len(p)) for p in prompts])
    drafts = np.array([w[0][:-1] for w in want])  # [B, NEW_TOKENS - 1]
    cache = init_cache(cfg, 2, int(lengths.max()) + NEW_TOKENS, draft_tokens=drafts.shape[1] - 1)
    _, cache = prefill(params, cfg, padded, cache, lengths=lengths)
    picks, _, _ = verify_step(params, cfg, cache, drafts, lengths)
    np.testing.assert_array_equal(np.asarray(picks), np.array([w[0][1:] for w in want]))


def test_yarn_matches_transformers():
    """YaRN's inverse frequencies and its cos/sin factor, as transformers' ``_compute_yarn_parameters`` gives them:
    gpt-oss's published parameters, truncated bounds, an explicit attention factor, DeepSeek's mscale pair and a
    factor taken from max_position_embeddings (both float32; the bounds and the factor in float64, as Python)."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from mk.blocks import inv_freq

    base = TINY_GPT_OSS["rope_parameters"]
    variants = [
        {},
        dict(truncate=True, beta_fast=16.0, beta_slow=2.0, original_max_position_embeddings=64),
        dict(attention_factor=1.25, factor=8.0),
        dict(mscale=0.707, mscale_all_dim=1.0, factor=40.0),
        dict(factor=None, original_max_position_embeddings=1024),
    ]
    for change in variants:
        d = {k: v for k, v in TINY_GPT_OSS.items() if k != "model_type"}
        d.update(rope_parameters=dict(base, **change), max_position_embeddings=8192, head_dim=32)
        want_f, want_scale = ROPE_INIT_FUNCTIONS["yarn"](AutoConfig.for_model("gpt_oss", **d))
        cfg = from_hf_dict(dict(d, model_type="gpt_oss"))
        # float32 pow differs by an ulp between NumPy and torch: a few ulps' tolerance, any formula slip is far more
        np.testing.assert_allclose(inv_freq(cfg, "full"), want_f.numpy(), rtol=1e-6, atol=0, err_msg=str(change))
        assert cfg.rope_scaling.attention_scale == pytest.approx(want_scale, rel=1e-12), change


def test_save_checkpoint_round_trips_and_loads_in_transformers(tmp_path):
    """mk's save_checkpoint writes gpt-oss's Hugging Face layout (interleaved gate_up_proj and its bias): mk loads it
    back bit for bit, and transformers loads every tensor and gives the reference's logits."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = from_hf_dict(TINY_GPT_OSS, "tiny-gpt-oss")
    params = random_params(cfg, seed=4)
    save_checkpoint(params, cfg, tmp_path)
    back_cfg, back = load_checkpoint(tmp_path)
    assert back_cfg == cfg.replace(name=back_cfg.name) and set(back) == set(params)
    for path, a in params.items():
        np.testing.assert_array_equal(np.asarray(back[path]), np.asarray(a), path)
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        want = model.eval()(torch.tensor(prompt, dtype=torch.long)).logits[:, -1].float().numpy()
    got, _ = prefill(params, cfg, prompt, init_cache(cfg, 2, 12))
    assert np.abs(np.asarray(got) - want).max() <= LOGIT_ATOL


def test_int8_checkpoint_round_trips(tmp_path):
    from mk.quant import quantize

    cfg = from_hf_dict(TINY_GPT_OSS, "tiny-gpt-oss")
    params = quantize(random_params(cfg, seed=4), cfg, "int8")
    save_checkpoint(params, cfg, tmp_path)
    _, back = load_checkpoint(tmp_path)
    assert set(back) == set(params)
    for path, a in params.items():
        np.testing.assert_array_equal(np.asarray(back[path]), np.asarray(a), path)


def test_both_engines_take_gpt_oss_and_a_cache_its_chips_cannot_share_is_refused_by_name():
    """The reference and the megakernel run gpt-oss (tests/test_gpt_oss_kernel.py holds the kernel to it, its heads
    split over chips too); chips sharing a KV head's positions whose cache (a sliding window of 4: 4 slots) does not
    split into whole blocks among them are refused by name when the cache is laid out, not run wrong."""
    from mk.kernel_setup import WORKBOOK_KERNEL
    from mk.megakernel.pack import adopt_cache_chips
    from mk.reference import init_cache

    cfg = from_hf_dict(TINY_GPT_OSS, "tiny-gpt-oss")
    cfg.check_runnable()
    cfg.check_runnable("megakernel")
    with pytest.raises(ValueError, match="2 chips share each sliding KV head, but its cache of 4 slots does not"):
        adopt_cache_chips(cfg, init_cache(cfg, 1, 64), WORKBOOK_KERNEL.on(4))
