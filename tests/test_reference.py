"""The reference model's own behaviour: cache layout, decode against prefill, MoE paths, knock-outs,
one program per step, the engine registry, users at their own positions (ragged prompts, padded caches),
the generate CLI and bad input. Parity with transformers lives in test_parity.py."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mk import generate as gen
from mk.__main__ import main
from mk.blocks import experts_dense, experts_gathered, route
from mk.config import TINY_DENSE, TINY_MOE
from mk.engines import engine_names, register_engine, unregister_engine
from mk.params import KNOCKOUTS, layer_params
from mk.reference import _prefill, decode_step, init_cache, prefill, prepare
from mk.weights import random_params

# Decode and prefill compute the same f32 sums in a different order (one position against a
# masked block): round-off only, well under the 1e-2 a wiring error would make.
STEP_ATOL = 1e-5
# Most tests share these shapes so the jitted prefill/decode compile once per config (compiles dominate).
B, T, NEW = 2, 20, 16
MAX_LEN = T + NEW - 1  # what generate allocates for T + NEW
# Odd shapes: a window of 7 (not a multiple of a 16-slot block), head dims 48 / 64, 6 experts.
ODD_MOE = TINY_MOE.replace(
    name="odd-moe",
    vocab_size=500,
    hidden_size=96,
    sliding_head_dim=48,
    full_head_dim=64,
    sliding_window=7,
    mlp_intermediate=80,
    num_experts=6,
    top_k=2,
    expert_intermediate=40,
)
ODD_DENSE = ODD_MOE.replace(name="odd-dense", num_experts=0, top_k=0, expert_intermediate=0)
LENGTHS = (3, 17, 9)  # ragged prompts: shorter than, over twice and about the window of 7


@pytest.fixture(scope="module")
def moe_params():
    return random_params(TINY_MOE, seed=0)


def test_cache_layout(tiny_cfg):
    c = init_cache(tiny_cfg, batch=3, max_len=40)
    assert c["layers.0.k"].shape == (3, 1, tiny_cfg.sliding_window, 128)  # a ring of the window
    assert c["layers.2.v"].shape == (3, 1, 40, 256)  # full layer: every position
    assert set(c) == {f"layers.{i}.{kv}" for i in range(3) for kv in "kv"}


def test_decode_continues_prefill(tiny_cfg):
    """Prefill T tokens then decode k more gives the logits of prefilling all T+k at once, past the window."""
    p = random_params(tiny_cfg, seed=1)
    toks = np.random.default_rng(0).integers(0, tiny_cfg.vocab_size, (B, T + 3))
    want, _ = prefill(p, tiny_cfg, toks, init_cache(tiny_cfg, B, MAX_LEN))
    logits, cache = prefill(p, tiny_cfg, toks[:, :T], init_cache(tiny_cfg, B, MAX_LEN))
    for pos in range(T, T + 3):
        logits, cache = decode_step(p, tiny_cfg, cache, toks[:, pos], pos)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want), atol=STEP_ATOL, rtol=0)


def test_moe_gathered_equals_dense(moe_params):
    """Decode gathers only the B*k selected experts; prefill runs all experts with zero weights off the top-k."""
    p = layer_params(moe_params, 1)
    x = jax.random.normal(jax.random.key(0), (5, TINY_MOE.hidden_size))
    w, ids = route(p, TINY_MOE, x, frozenset())
    assert ids.shape == (5, TINY_MOE.top_k)
    # Renormalised to 1 before the per-expert scale: undo the scale to check.
    np.testing.assert_allclose(np.sum(w / p["expert_scale"][ids], -1), 1.0, rtol=1e-6)
    gathered, dense = experts_gathered(p, TINY_MOE, x, w, ids), experts_dense(p, TINY_MOE, x, w, ids)
    np.testing.assert_allclose(gathered, dense, atol=1e-5)


@pytest.mark.parametrize("experts", ["split", "stacked"])
def test_prepared_layout(moe_params, experts):
    """Decode runs on a layout made once per tree (matrices [out, in], every expert matrix [intermediate, hidden]: the
    down matrices as stored), the experts split into their own arrays (a CPU's) or kept stacked (a TPU's, read by
    dynamic slices); a plain tree, a prepared one and a plain one traced by an outer jit give the same logits."""
    cfg, p = TINY_MOE, moe_params
    pp = prepare(p, cfg, experts)
    assert prepare(pp, cfg) is pp
    assert pp["layers.0.q"].shape == p["layers.0.q"].shape[::-1] and pp["embed"] is p["embed"]
    assert len(pp["layers.1.expert_down"]) == cfg.num_experts
    assert isinstance(pp["layers.1.expert_down"], tuple) == (experts == "split")
    np.testing.assert_array_equal(pp["layers.1.expert_gate"][3], p["layers.1.expert_gate"][3].T)
    np.testing.assert_array_equal(pp["layers.1.expert_down"][3], p["layers.1.expert_down"][3])
    toks = np.array([3] * B)
    want, _ = decode_step(p, cfg, init_cache(cfg, B, 8), toks, 0)
    got, _ = decode_step(pp, cfg, init_cache(cfg, B, 8), toks, 0)
    np.testing.assert_array_equal(got, want)
    traced = jax.jit(lambda q, c: decode_step(q, cfg, c, jnp.asarray(toks), 0)[0])(p, init_cache(cfg, B, 8))
    np.testing.assert_allclose(traced, want, atol=STEP_ATOL, rtol=0)


def test_knockouts(moe_params):
    cfg, p = TINY_MOE, moe_params
    toks = np.random.default_rng(0).integers(0, cfg.vocab_size, (B, T))
    _, cache = prefill(p, cfg, toks, init_cache(cfg, B, MAX_LEN))
    base, _ = decode_step(p, cfg, jax.tree.map(jnp.copy, cache), toks[:, -1], T)
    for ko in KNOCKOUTS:
        c = jax.tree.map(jnp.copy, cache)
        logits, c2 = decode_step(p, cfg, c, toks[:, -1], T, knockout={ko})
        logits = np.asarray(logits)
        assert np.isfinite(logits).all(), ko
        if ko == "head":
            assert not logits.any()
        else:
            assert np.abs(logits - np.asarray(base)).max() > 1e-3, f"knocking out {ko} changed nothing"
        if ko == "full_attention":  # a skipped attention block writes nothing to its cache
            np.testing.assert_array_equal(c2["layers.2.k"], cache["layers.2.k"])
    # A dense model has no experts: knocking them out changes nothing.
    pd = random_params(TINY_DENSE, seed=0)
    _, cd = prefill(pd, TINY_DENSE, toks, init_cache(TINY_DENSE, B, MAX_LEN))
    a, _ = decode_step(pd, TINY_DENSE, jax.tree.map(jnp.copy, cd), toks[:, -1], T)
    b, _ = decode_step(pd, TINY_DENSE, cd, toks[:, -1], T, knockout={"experts", "router"})
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="unknown component"):
        decode_step(p, cfg, cache, toks[:, -1], T, knockout={"attention"})


def test_one_program_per_step(moe_params):
    """Every position reuses the one compiled program of the first step (pos is traced, not static)."""
    cfg = TINY_MOE
    cache = init_cache(cfg, B, 8)
    _, cache = decode_step(moe_params, cfg, cache, np.array([1] * B), 0)
    on_device = jnp.array([5, 7])  # made before listening: its own conversion is not the step's
    compiles = []

    def listener(name, secs, **kw):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for pos in range(1, 4):
            _, cache = decode_step(moe_params, cfg, cache, np.array([pos + 1] * B), pos)
        # each user at its own position: the same program (pos is always a [B] vector inside)
        _, cache = decode_step(moe_params, cfg, cache, np.array([1] * B), np.array([4, 6]))
        _, cache = decode_step(moe_params, cfg, cache, np.array([1] * B), on_device)
        jax.block_until_ready(cache)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []


def test_engine_registry(moe_params):
    calls = []

    def make_step(cfg):
        def step(params, cfg, cache, tokens, pos, knockout=frozenset()):
            calls.append(pos)
            return decode_step(params, cfg, cache, tokens, pos, knockout)

        return step

    def make_blocked_step(cfg):
        def step(params, cfg, cache, tokens, pos, knockout=frozenset()):
            assert cache["layers.2.k"].shape[2] == 16  # 6 positions needed, rounded up to the block
            assert cache.pop("adopted")  # the engine's own layout, from adopt_cache
            out = decode_step(params, cfg, cache, tokens, pos, knockout)
            return out[0], {**out[1], "adopted": True}

        step.adopt_cache = lambda cache: calls.append("adopt") or {**cache, "adopted": True}
        return step

    register_engine("counting", make_step)
    register_engine("blocked", make_blocked_step, cache_multiple=16)
    try:
        prompt = np.array([[1, 2, 3], [4, 5, 6]])
        want = gen.generate(moe_params, TINY_MOE, prompt, 4)
        got = gen.generate(moe_params, TINY_MOE, prompt, 4, engine="counting")
        np.testing.assert_array_equal(got, want)
        # prefill gives the first token; the engine decodes the rest, given each user's position
        assert [np.asarray(p).tolist() for p in calls] == [[3, 3], [4, 4], [5, 5]]
        np.testing.assert_array_equal(gen.generate(moe_params, TINY_MOE, prompt, 4, engine="blocked"), want)
        assert calls[3:] == ["adopt"]  # once, after prefill
        assert "counting" in engine_names() and "reference" in engine_names()
    finally:
        unregister_engine("counting"), unregister_engine("blocked")
    with pytest.raises(ValueError, match="registered engines: .*reference"):  # the megakernel's too, once imported
        gen.generate(moe_params, TINY_MOE, prompt, 5, engine="nope")


def test_bad_input(moe_params):
    cfg, p = TINY_MOE, moe_params
    with pytest.raises(ValueError, match="longer than the cache"):
        prefill(p, cfg, np.ones((1, 10), int), init_cache(cfg, 1, 8))
    with pytest.raises(ValueError, match=r"prompt of 10 tokens for user 0 is longer than the cache \(8 positions\)"):
        gen.generate(p, cfg, np.ones((1, 10), int), 3, max_len=8)
    with pytest.raises(ValueError, match="a prompt of 7 tokens plus 3 new tokens needs 9 cache positions"):
        gen.generate(p, cfg, np.ones((1, 7), int), 3, max_len=8)
    with pytest.raises(ValueError, match=r"\[512\] outside the vocabulary 0..511"):
        gen.generate(p, cfg, [[1, 512]], 3)
    with pytest.raises(ValueError, match=r"\[-1\] outside the vocabulary"):
        decode_step(p, cfg, init_cache(cfg, 1, 8), [-1], 0)
    with pytest.raises(ValueError, match="outside the cache"):
        decode_step(p, cfg, init_cache(cfg, 1, 8), [1], 8)
    with pytest.raises(ValueError, match=r"position -1 of user 1 is outside the cache \(0..7\)"):
        decode_step(p, cfg, init_cache(cfg, 2, 8), [1, 1], np.array([0, -1]))
    with pytest.raises(ValueError, match=r"position 8 of user 1 is outside the cache \(0..7\)"):
        decode_step(p, cfg, init_cache(cfg, 2, 8), [1, 1], [7, 8])
    with pytest.raises(ValueError, match=r"one position or one per user \(2 users\), got shape \(3,\)"):
        decode_step(p, cfg, init_cache(cfg, 2, 8), [1, 1], [1, 2, 3])
    with pytest.raises(ValueError, match="multiple must be a positive"):
        init_cache(cfg, 1, 8, multiple=0)
    with pytest.raises(ValueError, match="batch must be a positive"):
        init_cache(cfg, 0, 8)
    with pytest.raises(ValueError, match="batch >= 1"):
        gen.generate(p, cfg, np.zeros((0, 4), int), 3)
    with pytest.raises(ValueError, match="new_tokens"):
        gen.generate(p, cfg, [[1, 2]], 0)


def test_generate_varies_and_users_are_independent(moe_params):
    prompt = np.random.default_rng(5).integers(0, TINY_MOE.vocab_size, (B, T))
    out = gen.generate(moe_params, TINY_MOE, prompt, NEW)
    assert out.shape == (B, NEW) and out.dtype == np.int32
    assert all(len(set(row)) >= NEW // 4 for row in out.tolist())
    # Swapping the users swaps their outputs: nothing leaks between rows of the batch.
    np.testing.assert_array_equal(out[::-1], gen.generate(moe_params, TINY_MOE, prompt[::-1], NEW))


# CLI ------------------------------------------------------------------------------------------------
def test_cli_generate_json(capsys):
    assert (
        main(
            [
                "generate",
                "--model",
                "tiny-moe",
                "--seed",
                "0",
                "--prompt-ids",
                "1,2,3",
                "--new-tokens",
                "4",
                "--batch",
                "2",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "reference" and out["batch"] == 2 and out["prompt_ids"] == [[1, 2, 3]] * 2
    assert len(out["tokens"]) == 2 and out["tokens"][0] == out["tokens"][1] and len(out["tokens"][0]) == 4
    want = gen.generate(random_params(TINY_MOE, 0), TINY_MOE, [[1, 2, 3]] * 2, 4)
    assert out["tokens"] == want.tolist()
    assert main(["generate", "--model", "tiny-moe", "--prompt-ids", "1,2,3;4,5,6", "--new-tokens", "4", "--json"]) == 0
    assert (
        json.loads(capsys.readouterr().out)["tokens"]
        == gen.generate(random_params(TINY_MOE, 0), TINY_MOE, [[1, 2, 3], [4, 5, 6]], 4).tolist()
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--prompt-ids", "1,2,600"], "outside the vocabulary"),
        (["--prompt-ids", "1,x"], "must be integers"),
        (
            ["--prompt-ids", "1,2;3,4,5,6,7", "--max-len", "4"],
            "prompt of 5 tokens for user 1 is longer than the cache (4 positions)",
        ),
        (["--prompt-ids", "1,2;3,4", "--batch", "3"], "does not match"),
        (["--prompt-ids", "1,2", "--engine", "nope"], "unknown engine"),
    ],
)
def test_cli_generate_errors(capsys, args, message):
    assert main(["generate", "--model", "tiny-moe", "--new-tokens", "2", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_cli_batch_zero(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--model", "tiny-moe", "--prompt-ids", "1", "--new-tokens", "2", "--batch", "0"])
    assert "positive integer" in capsys.readouterr().err


def test_cli_generate_ragged_json_equals_each_user_alone(capsys, mk_json):
    """``--prompt-ids`` with prompts of different lengths (one past the window of 16): each user's tokens
    are those of its prompt run alone."""
    prompts = ["5,9,2", ",".join(str(i * 7 % 512) for i in range(1, 21))]
    ragged = mk_json("generate", "--model", "tiny-moe", "--prompt-ids", ";".join(prompts), "--new-tokens", 6, "--json")
    assert ragged["batch"] == 2 and [len(q) for q in ragged["prompt_ids"]] == [3, 20]
    for b, prompt in enumerate(prompts):
        assert main(["generate", "--model", "tiny-moe", "--prompt-ids", prompt, "--new-tokens", "6", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["tokens"] == [ragged["tokens"][b]]


# Users at their own positions ------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [ODD_DENSE, ODD_MOE], ids=lambda c: c.name)
def test_ragged_generate_equals_each_user_alone(cfg):
    """Prompts of different lengths (past the window of 7) decoded together: every user's tokens are
    those it gets decoded alone."""
    p = random_params(cfg, seed=4)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in LENGTHS]
    out = gen.generate(p, cfg, prompts, NEW)
    assert out.shape == (len(LENGTHS), NEW)
    max_len = max(LENGTHS) + NEW - 1  # the same cache alone: one decode program for the three solo runs
    for b, prompt in enumerate(prompts):
        np.testing.assert_array_equal(out[b], gen.generate(p, cfg, [prompt], NEW, max_len=max_len)[0], f"user {b}")
    assert len({tuple(r) for r in out.tolist()}) == len(LENGTHS)
    assert all(len(set(row)) >= NEW // 4 for row in out.tolist())


def test_padded_cache_changes_nothing():
    """Every layer's cache rounded up to 16 slots (a sliding ring of 16 slots for a window of 7, 23 positions in
    32): prefill and decode at each user's own position give the tokens of the unpadded cache and its logits up to
    the order of the softmax's sums (the ring keeps a position in slot p % 16, not p % 7), and every position a
    window still sees is held with the same K. generate with an engine that reads 16-slot blocks gets those caches."""
    cfg = ODD_MOE
    p = random_params(cfg, seed=4)
    lengths = np.array([10, 4])
    toks = np.random.default_rng(4).integers(0, cfg.vocab_size, (2, 22))
    runs = {}
    for m in (1, 16):
        cache = init_cache(cfg, 2, 23, multiple=m)
        assert (cache["layers.0.k"].shape[2], cache["layers.2.k"].shape[2]) == ((7, 23) if m == 1 else (16, 32))
        logits, cache = prefill(p, cfg, toks[:, :10], cache, lengths)
        steps = [logits]
        for n in range(12):  # past the window and the end of the 16-slot ring for both users
            pos = lengths + n
            logits, cache = decode_step(p, cfg, cache, toks[np.arange(2), pos], pos)
            steps.append(logits)
        runs[m] = np.stack(steps), cache
    np.testing.assert_array_equal(runs[16][0].argmax(-1), runs[1][0].argmax(-1))
    # f32 sums in another order, and their round-off carried to the next layers' K/V: tens of ulps, no more
    np.testing.assert_allclose(runs[16][0], runs[1][0], atol=1e-5, rtol=0)
    newest = lengths + 11
    for i in range(cfg.num_layers):
        padded, plain = np.asarray(runs[16][1][f"layers.{i}.k"]), np.asarray(runs[1][1][f"layers.{i}.k"])
        for b in range(2):
            seen = (
                range(newest[b] - cfg.sliding_window + 1, newest[b] + 1)
                if i in cfg.sliding_layers
                else range(newest[b] + 1)
            )
            for x in seen:
                np.testing.assert_allclose(padded[b, :, x % padded.shape[2]], plain[b, :, x % plain.shape[2]],
                                           atol=1e-5, rtol=0)  # fmt: skip

    def make_step(cfg):
        def step(params, cfg, cache, tokens, pos, knockout=frozenset()):
            assert cache["layers.0.k"].shape[2] == 16 and cache["layers.2.k"].shape[2] % 16 == 0
            assert pos.shape == (3,) and pos.dtype == jnp.int32
            return decode_step(params, cfg, cache, tokens, pos, knockout)

        return step

    register_engine("blocked16", make_step, cache_multiple=16)
    try:
        prompts = [toks[0, :n].tolist() for n in LENGTHS]
        np.testing.assert_array_equal(
            gen.generate(p, cfg, prompts, 8, engine="blocked16"), gen.generate(p, cfg, prompts, 8)
        )
    finally:
        unregister_engine("blocked16")


def test_ragged_prefill():
    """Right-padded prompts: each user's logits and cache are those of its prompt alone (the sliding
    ring holds its own last 7 positions, none of the padding); the padding ids change nothing."""
    cfg = ODD_MOE
    p = random_params(cfg, seed=5)
    lengths = np.array([3, 12, 9])
    toks = np.random.default_rng(5).integers(0, cfg.vocab_size, (3, 12))
    logits, cache = prefill(p, cfg, toks, init_cache(cfg, 3, 16), lengths)
    for b, n in enumerate(lengths):
        want, alone = prefill(p, cfg, toks[b : b + 1, :n], init_cache(cfg, 1, 16))
        np.testing.assert_allclose(logits[b], want[0], atol=STEP_ATOL, rtol=0)
        for name, c in alone.items():
            np.testing.assert_allclose(cache[name][b], c[0], atol=STEP_ATOL, rtol=0, err_msg=f"user {b} {name}")
    # Other padding ids (even outside the vocabulary: they are not read) change nothing.
    padded = np.where(np.arange(12) < lengths[:, None], toks, -1)
    logits2, cache2 = prefill(p, cfg, padded, init_cache(cfg, 3, 16), lengths)
    np.testing.assert_array_equal(logits2, logits)
    # ... nor inside the compiled prefill, which sees them: masked, never written.
    other = np.where(np.arange(12) < lengths[:, None], toks, (toks + 17) % cfg.vocab_size)
    logits3, _, cache3 = _prefill(
        p, cfg, jnp.asarray(other, jnp.int32), jnp.asarray(lengths, jnp.int32), init_cache(cfg, 3, 16)
    )
    np.testing.assert_array_equal(logits3, logits)
    for name in cache:
        np.testing.assert_array_equal(cache3[name], cache[name])
        np.testing.assert_array_equal(cache2[name], cache[name])
    # Columns past every prompt are dropped: a 12-column block with prompts of <= 8 fits a cache of 8.
    short, _ = prefill(p, cfg, toks, init_cache(cfg, 3, 8), [3, 8, 5])
    assert np.isfinite(short).all()


@pytest.mark.parametrize(
    "lengths,message",
    [
        ([0, 12], r"length 0 of user 0 is outside 1..12"),
        ([3, 13], r"length 13 of user 1 is outside 1..12"),
        ([3], r"lengths must be 2 integers"),
        ([3, 12.0], r"lengths must be 2 integers"),
        (
            [3, 9],
            r"prompt of 9 tokens for user 1 is longer than the cache \(8 positions\); make the cache "
            r"with a larger max_len",
        ),
    ],
)
def test_ragged_prefill_errors(moe_params, lengths, message):
    toks = np.ones((2, 12), int)
    with pytest.raises(ValueError, match=message):
        prefill(moe_params, TINY_MOE, toks, init_cache(TINY_MOE, 2, 8), lengths)


def test_ragged_generate_errors(moe_params):
    with pytest.raises(ValueError, match=r"prompt of 9 tokens for user 1 is longer than the cache \(8 positions\)"):
        gen.generate(moe_params, TINY_MOE, [[1, 2], [1] * 9], 3, max_len=8)
    with pytest.raises(ValueError, match=r"a prompt of 7 tokens \(user 1\) plus 3 new tokens needs 9"):
        gen.generate(moe_params, TINY_MOE, [[1, 2], [1] * 7], 3, max_len=8)
    with pytest.raises(ValueError, match="the prompt of user 1 must be a list of >= 1 token ids"):
        gen.generate(moe_params, TINY_MOE, [[1, 2], []], 3)
    with pytest.raises(ValueError, match=r"\[512\] outside the vocabulary"):
        gen.generate(moe_params, TINY_MOE, [[1, 2], [3, 512, 4]], 3)


def test_a_fresh_process_finds_every_engine():
    """mk.engines imports the modules that register engines before it reads its registry, so the command line sees
    the reference and the megakernel whatever was imported first."""
    import subprocess
    import sys

    code = "from mk.engines import engine_names; print(sorted(engine_names()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['megakernel', 'reference']"
