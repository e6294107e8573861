"""DeepSeek-V3 (and Kimi K2, the same architecture) in the reference: multi-head latent attention (mk.mla), grouped
sigmoid routing with its correction bias, a dense first layer and a shared expert, held to transformers'
DeepseekV3ForCausalLM on tiny random checkpoints it saves itself (tests/conftest.py: deepseek-v3 with a query
bottleneck and interleaved RoPE, deepseek-v3-no-q-lora with q_proj, rotate-half RoPE, four groups of which two are
kept, weights not renormalised; each again with YaRN RoPE scaling, its frequencies, cos/sin factor and softmax mscale).
The megakernel runs it too (tests/test_mla_kernel.py)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_parity import LOGIT_ATOL, hf_greedy

from mk import mla
from mk.config import YarnScaling, from_hf_dict, load_hf_config, to_hf_dict
from mk.generate import generate
from mk.reference import init_cache, prefill, prepare
from mk.weights import load_checkpoint, random_params, save_checkpoint

NAMES = ("deepseek-v3", "deepseek-v3-no-q-lora")
YARN_NAMES = ("deepseek-v3-yarn", "deepseek-v3-no-q-lora-yarn")  # original_max_position_embeddings 64
NEW_TOKENS = 8


@pytest.mark.parametrize("name", NAMES + YARN_NAMES)
def test_ragged_greedy_parity_with_transformers(hf_checkpoint, name):
    """Users with prompts of 5 and 13 tokens (and with YaRN one of 70, past its original 64 positions) decoded
    together, prefill then absorbed decode: each gets transformers' greedy tokens (and logits) for its prompt run
    alone."""
    folder, model = hf_checkpoint(name)
    cfg, params = load_checkpoint(folder)
    assert cfg.latent_attention is not None and cfg.dense_layers == (0,) and cfg.router == "sigmoid_grouped"
    assert (name in YARN_NAMES) == isinstance(cfg.rope_scaling, YarnScaling)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (5, 13, 70)[: 3 if cfg.rope_scaling else 2]]
    tokens, logits = generate(params, cfg, prompts, NEW_TOKENS, return_logits=True)
    for b, prompt in enumerate(prompts):
        want_tokens, want_logits = hf_greedy(model, np.array([prompt]), NEW_TOKENS)
        diff = np.abs(logits[b] - want_logits[0]).max()
        assert diff <= LOGIT_ATOL, f"user {b}: max logit difference {diff:.2e}"
        np.testing.assert_array_equal(tokens[b], want_tokens[0], f"user {b}")
    assert all(len(set(row)) >= NEW_TOKENS // 4 for row in tokens.tolist())  # the tokens vary: equal means something


@pytest.mark.parametrize("name", NAMES)
def test_the_correction_bias_changes_the_picks(hf_checkpoint, name):
    """The routing bias is wide enough in these checkpoints that dropping it changes the greedy tokens' logits: the
    parity test would see a router that ignored it."""
    folder, _ = hf_checkpoint(name)
    cfg, params = load_checkpoint(folder)
    prompt = np.random.default_rng(3).integers(0, cfg.vocab_size, (1, 13))
    unbiased = {k: jnp.zeros_like(v) if k.endswith("router_bias") else v for k, v in params.items()}
    got = [np.asarray(prefill(p, cfg, prompt, init_cache(cfg, 1, 13))[0]) for p in (params, unbiased)]
    assert np.abs(got[0] - got[1]).max() > 100 * LOGIT_ATOL


@pytest.mark.parametrize("name", NAMES + YARN_NAMES)
def test_absorbed_decode_attention_equals_the_expanded_form(hf_checkpoint, name):
    """Decode's absorbed attention (the query taken into the latent space, the latents summed, then kv_b's value
    half) equals transformers' form (every latent expanded into per-head keys and values) to float32 round-off, on
    mk's tree and on the decode layout (kv_b transposed), with a ragged mask."""
    folder, _ = hf_checkpoint(name)
    cfg, params = load_checkpoint(folder)
    p = {k.removeprefix("layers.1."): v for k, v in params.items() if k.startswith("layers.1.")}
    B, T, S = 2, 3, 11
    k1, k2 = jax.random.split(jax.random.key(0))
    h = jax.random.normal(k1, (B, T, cfg.hidden_size))
    q, _ = mla.project(p, cfg, h, jnp.array([[4, 5, 6], [8, 9, 10]]), frozenset())
    cache_h = jax.random.normal(k2, (B, S, cfg.hidden_size))
    _, kv = mla.project(p, cfg, cache_h, jnp.arange(S), frozenset())
    mask = (jnp.arange(S)[None, None, :] <= jnp.array([[4, 5, 6], [8, 9, 10]])[:, :, None])[:, None]  # [B, 1, T, S]
    want = mla.attend_expanded(p, cfg, q, kv["latent"], kv["rope_k"], mask)
    got = mla.attend_absorbed(p, cfg, q, kv["latent"], kv["rope_k"], mask)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    t = {k.removeprefix("layers.1."): v for k, v in prepare(params, cfg).items() if k.startswith("layers.1.")}
    got_t = mla.attend_absorbed(t, cfg, q, kv["latent"], kv["rope_k"], mask, mla.matmul_t)
    np.testing.assert_allclose(got_t, want, rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(want)).max() > 0.1  # not vanishing


def test_both_engines_take_it(hf_checkpoint):
    """The reference and the megakernel (tests/test_mla_kernel.py holds it to the reference) both run it."""
    cfg = load_hf_config(hf_checkpoint("deepseek-v3")[0])
    cfg.check_runnable("reference")
    cfg.check_runnable("megakernel")
    assert cfg.runnable
    cfg.check_runnable("megakernel")


@pytest.mark.parametrize("name", YARN_NAMES)
def test_each_part_of_yarn_is_needed_for_parity(hf_checkpoint, monkeypatch, name):
    """Prefill's logits (a prompt past the original 64 positions) miss transformers' by far more than the parity
    tolerance when YaRN's frequencies, its softmax mscale^2 or (with unequal mscales) its cos/sin factor is dropped:
    the parity test would see each."""
    import torch

    folder, model = hf_checkpoint(name)
    cfg, params = load_checkpoint(folder)
    prompt = np.random.default_rng(4).integers(0, cfg.vocab_size, (1, 70))
    with torch.no_grad():
        want = model(torch.tensor(prompt, dtype=torch.long)).logits[:, -1].float().numpy()

    def miss(c):
        return np.abs(np.asarray(prefill(params, c, prompt, init_cache(c, 1, 70))[0]) - want).max()

    assert miss(cfg) <= LOGIT_ATOL
    assert cfg.rope_scaling.score_factor > 1.3
    assert miss(cfg.replace(rope_scaling=None)) > 100 * LOGIT_ATOL  # plain RoPE, no mscale
    y = cfg.rope_scaling
    unscaled = y.__class__(
        y.factor,
        y.original_max_position_embeddings,
        y.beta_fast,
        y.beta_slow,
        y.truncate,
        attention_factor=y.attention_scale,
    )  # same frequencies and cos/sin, no mscale_all_dim
    assert unscaled.score_factor == 1.0 and miss(cfg.replace(rope_scaling=unscaled)) > 100 * LOGIT_ATOL
    if y.attention_scale != 1.0:  # cos and sin unscaled, the rest kept
        monkeypatch.setattr(YarnScaling, "attention_scale", property(lambda self: 1.0))
        assert miss(cfg.replace(name="cos-sin-unscaled")) > 100 * LOGIT_ATOL  # (another name: not jit's cached step)


def test_a_rope_scaling_other_than_yarn_is_refused_by_the_reference_by_name(hf_checkpoint):
    """Another RoPE scaling (linear ...) is described, not run: such a config is refused, not run wrong."""
    from mk import reference as R

    d = to_hf_dict(load_hf_config(hf_checkpoint("deepseek-v3")[0]))
    d["rope_parameters"] = dict(rope_type="linear", rope_theta=1e4, factor=4.0)
    cfg = from_hf_dict(d, "linear")
    assert not cfg.runnable and cfg.rope_scaling is None
    with pytest.raises(ValueError, match="linear is a deepseek_v3 model with .*linear RoPE scaling.*: mk plans and"):
        R.prefill({}, cfg, [[1, 2]], {})


@pytest.mark.parametrize("name", NAMES + YARN_NAMES)
def test_config_and_checkpoint_round_trip_and_load_in_transformers(hf_checkpoint, tmp_path, name):
    """The config transformers saved reads back from mk's to_hf_dict; mk's save_checkpoint of random weights loads
    in transformers (every tensor, nothing missing) and gives the reference's logits; a kimi_k2 config.json of the
    same folder is the same model."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = load_hf_config(hf_checkpoint(name)[0])
    assert from_hf_dict(to_hf_dict(cfg), cfg.name) == cfg
    params = random_params(cfg, seed=2)
    save_checkpoint(params, cfg, tmp_path)
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 9))
    with torch.no_grad():
        want = model.eval()(torch.tensor(prompt, dtype=torch.long)).logits[:, -1].float().numpy()
    got, _ = prefill(params, cfg, prompt, init_cache(cfg, 2, 9))
    assert np.abs(np.asarray(got) - want).max() <= LOGIT_ATOL
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(hf, model_type="kimi_k2")))
    kimi, loaded = load_checkpoint(tmp_path)
    assert kimi.family == "kimi_k2" and kimi.replace(family=cfg.family, name=cfg.name) == cfg
    assert all(np.array_equal(loaded[k], params[k]) for k in params)


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2"])
def test_the_published_configs_yarn_matches_transformers(name):
    """The published DeepSeek-V3 and Kimi K2 configs (64 RoPE dims, factor 40 / 32, their betas): mk.mla's
    inverse frequencies and cos/sin factor are transformers' ``_compute_yarn_parameters``'s for DeepseekV3Config, the
    softmax scale DeepseekV3Attention's (``yarn_apply_mscale``)."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    from mk.config import get_config
    from mk.paths import CONFIGS_DIR

    d = json.loads((CONFIGS_DIR / name / "config.json").read_text())
    hf = AutoConfig.for_model("deepseek_v3", **{k: v for k, v in d.items() if k not in ("model_type", "auto_map")})
    want_f, want_scale = ROPE_INIT_FUNCTIONS["yarn"](hf)
    cfg = get_config(name)
    np.testing.assert_allclose(mla.inv_freq(cfg), want_f.numpy(), rtol=1e-6, atol=0)
    assert cfg.rope_scaling.attention_scale == pytest.approx(want_scale, rel=1e-12)
    want_softmax = yarn_apply_mscale(hf.rope_parameters, hf.qk_head_dim**-0.5)
    assert cfg.score_scale("full") == pytest.approx(want_softmax, rel=1e-12) and want_softmax > 1.5 * 192**-0.5
