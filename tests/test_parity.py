"""Parity of mk's reference with transformers (Gemma4ForCausalLM, LlamaForCausalLM, Qwen3MoeForCausalLM), an
implementation we did not write.

transformers builds and saves tiny random models (tests/conftest.py); mk loads the saved folder and must
give the same logits at every step and the same greedy tokens. The oracle is transformers' own
``generate(do_sample=False)`` with its own KV cache.

Tolerance: both sides run in float32, so the only expected difference is round-off from a different
order of the same sums (matmuls, softmax, RMSNorm's mean) through three layers: measured up to about
5e-5 on logits that spread over about +-0.25 here. LOGIT_ATOL = 1e-4 allows twice that; any wiring
error (a norm, a scale, a rotated pair, a mask off by one) moves logits by 1e-2 or more.
"""

import numpy as np
import pytest

from mk.config import TINY_LLAMA, TINY_MOE, TINY_QWEN3_MOE, from_hf_dict, load_hf_config, to_hf_dict
from mk.generate import generate
from mk.reference import init_cache, prefill
from mk.weights import load_checkpoint, random_params, save_checkpoint

LOGIT_ATOL = 1e-4
PROMPT_LEN = 24  # longer than every sliding window here (16, 8 and 7): the ring cache wraps
NEW_TOKENS = 32
RAGGED_NEW_TOKENS = 16


def hf_greedy(model, prompt: np.ndarray, n: int):
    """transformers' greedy tokens [B, n] and the logits [B, n, V] that chose them. Plain greedy: no end of
    sequence (with one, generate stops there, and min_new_tokens would instead forbid picking it)."""
    import copy

    import torch

    ids = torch.tensor(prompt, dtype=torch.long)
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id, config.pad_token_id = None, 0
    with torch.no_grad():
        # An explicit all-ones mask: otherwise generate masks every prompt token equal to pad_token_id (0).
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            generation_config=config,
            do_sample=False,
            max_new_tokens=n,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[:, prompt.shape[1] :].numpy(), torch.stack(out.logits, 1).float().numpy()


@pytest.mark.parametrize(
    "name,batch",
    [("tiny-dense", 3), ("tiny-moe", 1), ("tiny-moe", 3), ("hf-snippet", 2), ("tiny-llama", 2), ("tiny-qwen3-moe", 3)],
)
def test_greedy_parity(hf_checkpoint, name, batch):
    folder, model = hf_checkpoint(name)
    cfg, params = load_checkpoint(folder)
    prompt = np.random.default_rng(batch).integers(0, cfg.vocab_size, (batch, PROMPT_LEN))
    want_tokens, want_logits = hf_greedy(model, prompt, NEW_TOKENS)
    tokens, logits = generate(params, cfg, prompt, NEW_TOKENS, return_logits=True)
    diff = np.abs(logits - want_logits).max()
    assert diff <= LOGIT_ATOL, f"max logit difference {diff:.2e} over {NEW_TOKENS} steps"
    np.testing.assert_array_equal(tokens, want_tokens)
    # Non-degenerate: each user's greedy tokens really vary, so equal tokens mean something.
    assert all(len(set(row)) >= NEW_TOKENS // 4 for row in tokens.tolist())
    if batch > 1:
        assert len({tuple(row) for row in tokens.tolist()}) == batch  # users decode independently


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-dense", "hf-odd", "hf-odd-dense", "llama-odd", "qwen3-moe-odd"])
def test_ragged_greedy_parity(hf_checkpoint, name):
    """Prompts of different lengths (shorter than and past the sliding window) generated together: each
    user gets transformers' greedy tokens (and logits) for its prompt run alone. hf-odd: a window of 7,
    head dims 48 / 64, widths and expert counts that are not powers of two."""
    folder, model = hf_checkpoint(name)
    cfg, params = load_checkpoint(folder)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (5, PROMPT_LEN, 11)]
    tokens, logits = generate(params, cfg, prompts, RAGGED_NEW_TOKENS, return_logits=True)
    for b, prompt in enumerate(prompts):
        want_tokens, want_logits = hf_greedy(model, np.array([prompt]), RAGGED_NEW_TOKENS)
        diff = np.abs(logits[b] - want_logits[0]).max()
        assert diff <= LOGIT_ATOL, f"user {b}: max logit difference {diff:.2e}"
        np.testing.assert_array_equal(tokens[b], want_tokens[0], f"user {b}")
    assert all(len(set(row)) >= RAGGED_NEW_TOKENS // 4 for row in tokens.tolist())


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe", "hf-snippet", "hf-odd"])
def test_config_round_trips_through_transformers(hf_checkpoint, name):
    """The config transformers writes (per_layer_config for full layers) reads back to the config it came from."""
    folder, _ = hf_checkpoint(name)
    cfg = load_hf_config(folder)
    assert from_hf_dict(to_hf_dict(cfg), name=cfg.name) == cfg
    if name == "tiny-moe":
        assert cfg == TINY_MOE.replace(name=cfg.name)
    if name == "hf-snippet":
        assert (cfg.sliding_kv_heads, cfg.full_kv_heads, cfg.sliding_head_dim, cfg.full_head_dim) == (2, 1, 16, 32)


@pytest.mark.parametrize("cfg", [TINY_MOE, TINY_LLAMA, TINY_QWEN3_MOE], ids=lambda c: c.name)
def test_mk_save_loads_in_transformers(tmp_path, cfg):
    """mk's save_checkpoint is a real Hugging Face checkpoint: transformers loads every tensor and agrees."""
    import torch
    from transformers import AutoModelForCausalLM

    params = random_params(cfg, seed=3)
    save_checkpoint(params, cfg, tmp_path)
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 20))
    with torch.no_grad():
        want = model.eval()(torch.tensor(prompt, dtype=torch.long)).logits[:, -1].float().numpy()
    got, _ = prefill(params, cfg, prompt, init_cache(cfg, 2, 20))
    assert np.abs(np.asarray(got) - want).max() <= LOGIT_ATOL


@pytest.mark.parametrize(
    "engine, name",
    [("reference", n) for n in ("tiny-moe", "tiny-dense", "hf-odd", "hf-odd-dense", "llama-odd", "qwen3-moe-odd")]
    # the kernel on the odd shapes, whose every width is padded (a minute each in interpret mode); on the tiny
    # presets it is held to the reference in tests/test_megakernel.py
    + [("megakernel", n) for n in ("hf-odd", "hf-odd-dense", "llama-odd", "qwen3-moe-odd")],
)
def test_cli_generate_ragged_on_a_transformers_checkpoint_gives_its_greedy_tokens(hf_checkpoint, mk_json, engine, name):
    """``python -m mk generate --checkpoint`` on the folder transformers saved, prompts of different lengths
    (one past the window) in one batch, the megakernel reading the KV cache in tiles of 8 positions with
    the race detector on: each user gets transformers' own greedy tokens for its prompt alone. hf-odd: a
    window of 7, head dims 48 / 64, hidden 96, vocabulary 500 (none a multiple of the kernel's tiles)."""
    folder, model = hf_checkpoint(name)
    cfg = load_hf_config(folder)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (PROMPT_LEN, 3, 9)]
    extra = ["--kv-tile", "8", "--detect-races"] if engine == "megakernel" else []
    got = mk_json(
        "generate",
        "--checkpoint",
        folder,
        "--prompt-ids",
        ";".join(",".join(map(str, p)) for p in prompts),
        "--new-tokens",
        10,
        "--engine",
        engine,
        "--json",
        *extra,
    )
    assert got["engine"] == engine and not got.get("races")
    for b, prompt in enumerate(prompts):
        want, _ = hf_greedy(model, np.array([prompt]), 10)
        assert got["tokens"][b] == want[0].tolist(), f"user {b}"
