"""The megakernel against the reference, in Pallas TPU interpret mode on the CPU with race detection:
the dense preset at one user and the MoE preset at four, greedy steps past the sliding window, users at
their own positions, the KV cache read in many tiles, bf16, duplicate experts fetched once, every
knock-out, and generate through the CLI."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from mk.config import TINY_DENSE, TINY_MOE
from mk.megakernel.parity import compare_with_reference
from mk.params import KNOCKOUTS
from mk.plan import Tiles, build_plan
from mk.tpu import races_detected, reset_interpreter

PROMPT = 12  # the prompt fills positions 0..11; decode steps then run past the window of 16 at position 16
LOGIT_ATOL = 1e-4  # f32 throughout; the kernel sums in another order (logits seen: <= 4e-5; the cache, scaled: 2e-5)


@pytest.fixture(autouse=True)
def _fresh_interpreter():
    reset_interpreter()
    yield
    reset_interpreter()


def run_both(cfg, batch, steps, knockout=frozenset(), prompt_len=PROMPT, **kw):
    df = compare_with_reference(cfg, batch, steps, knockout, prompt_len=prompt_len, max_len=kw.pop("max_len", 32), **kw)
    assert df.kernel_pick_is_argmax.all(), "the kernel's greedy pick differs from the argmax of its own logits"
    return dict(
        diff=df.max_logit_diff.max(),
        # f32 rounds relative to a value's size: the cache's differences against its own scale (its largest
        # |value|, a few units for normalised K and V; the logits are about 1, so they take LOGIT_ATOL as it is)
        cache_diff=df.max_cache_diff.max() / max(1.0, df.max_cache.max()),
        races=bool(df.races.any()),
        ref=[np.array(t) for t in df.tokens_reference],
        mk=[np.array(t) for t in df.tokens_megakernel],
        step_s=list(df.step_s),
        df=df,
    )


# Each model and each batch once (a minute each in interpret mode with the race detector on), not every pair:
# the dense model at one user and the MoE model at four (its experts shared and distinct across users).
EACH_ONCE = [(TINY_DENSE, 1), (TINY_MOE, 4)]


def test_matches_reference_for_steps_past_the_window():
    """The default tiles: 8 steps after a 12-token prompt, the sliding ring of 16 slots wraps (positions 16-19
    overwrite its oldest). The MoE model at four users passes its window in the many-tiles test below."""
    r = run_both(TINY_DENSE, 1, 8)
    assert not r["races"], "the interpreter's race detector fired"
    np.testing.assert_array_equal(np.stack(r["mk"]), np.stack(r["ref"]))
    assert len({tuple(t) for t in r["ref"]}) > 1, "greedy tokens should vary (random weights not degenerate)"
    assert r["diff"] < LOGIT_ATOL, r["diff"]
    assert r["cache_diff"] < LOGIT_ATOL, r["cache_diff"]
    # CI budget: a warm interpret-mode step of a tiny preset well under 10 s
    assert min(r["step_s"]) < 10.0, r["step_s"]


# Every knock-out, in three kernels: a set that hides none of its own (the router knocked out still runs the experts
# it fixes; with both MLPs and the sliding layers out, the full layers and the head still carry every step), each
# component compared where it is out; the dense model's pair is in test_dense_attention_knockouts.
KNOCKOUT_PAIRS = [("sliding_attention", "shared_mlp", "experts"), ("full_attention", "head"), ("router", "norms")]
assert sorted(k for pair in KNOCKOUT_PAIRS for k in pair) == sorted(KNOCKOUTS)


@pytest.mark.parametrize("knockout", KNOCKOUT_PAIRS, ids="+".join)
def test_knocked_out_kernel_matches_knocked_out_reference(knockout):
    r = run_both(TINY_MOE, 2, 3, knockout=frozenset(knockout))
    assert not r["races"]
    assert r["diff"] < LOGIT_ATOL, (knockout, r["diff"])
    assert r["cache_diff"] < LOGIT_ATOL, (knockout, r["cache_diff"])
    np.testing.assert_array_equal(np.stack(r["mk"]), np.stack(r["ref"]))


@pytest.mark.parametrize(
    "cfg, slots",
    [(TINY_DENSE, 2), (TINY_MOE.replace(ffn_layout="lanes"), 3)],
    ids=["tiny-dense", "tiny-moe-3-slots-ffn-on-lanes"],
)
def test_small_tiles_many_dmas_per_tensor_and_a_looped_head(cfg, slots):
    """Tiles of 128 x 128: every matrix is several DMAs, the head a loop of 4 tiles sharing a buffer
    with other (128, 128) tiles, the KV cache read in 16-position tiles; the prefetch depth is a parameter
    (three slots per weight buffer for the MoE model, which lays out its MLPs the first way too: the intermediate
    on lanes)."""
    tiles = Tiles(weight_tile_bytes=128 * 128 * 4, head_tile_bytes=128 * 128 * 4, kv_tile=16, slots=slots)
    df = compare_with_reference(cfg, 2, 3, prompt_len=PROMPT, max_len=32, tiles=tiles)
    assert not df.races.any() and df.same_tokens.all()
    assert df.max_logit_diff.max() < LOGIT_ATOL


def test_a_head_with_a_narrower_last_tile():
    """A vocabulary of 11 lanes (prime) under a head budget of 5: tiles of 640, 640 and 128 rows (mk.plan.builder.
    head_spans), the last narrower than its slot; the logits of every tile reach HBM and the greedy picks are the
    reference's."""
    cfg = TINY_DENSE.replace(name="tiny-dense-v1408", vocab_size=11 * 128)
    tiles = Tiles(head_tile_bytes=5 * 128 * cfg.hidden_size * 4)
    plan = build_plan(cfg, 2, max_len=32, tiles=tiles)
    assert plan.head_spans == [(0, 640), (640, 640), (1280, 128)]
    df = compare_with_reference(cfg, 2, 2, prompt_len=PROMPT, max_len=32, tiles=tiles)
    assert not df.races.any() and df.same_tokens.all()
    assert df.max_logit_diff.max() < LOGIT_ATOL


def test_copies_held_to_a_lookahead_window_leave_the_kernel_exact():
    """Tiles.lookahead_bytes holds weight copies back (mk.plan.schedule): the kernel starts them where the plan says,
    in and out of its loops over tiles and layers, with the same tokens, logits and cache as the reference."""
    tiles = Tiles(lookahead_bytes=round(build_plan(TINY_MOE, 2, max_len=32).weight_bytes_max / 8))
    r = run_both(TINY_MOE, 2, 2, tiles=tiles)
    assert not r["races"]
    np.testing.assert_array_equal(np.stack(r["mk"]), np.stack(r["ref"]))
    assert r["diff"] < LOGIT_ATOL and r["cache_diff"] < LOGIT_ATOL, (r["diff"], r["cache_diff"])


# A window of 32 and KV tiles of 8 positions: sliding layers read 4 tiles, full layers up to 6.
WIDE = {c.name: c.replace(name=c.name + "-w32", sliding_window=32) for c in (TINY_DENSE, TINY_MOE)}


@pytest.mark.parametrize("name, batch", [(c.name, b) for c, b in EACH_ONCE])
def test_kv_cache_in_many_tiles_users_at_their_own_positions(name, batch):
    """Contexts spanning 3 to 6 KV tiles of 8 positions on sliding and full layers (the tile prefetch, the
    slot alternation and the online softmax's rescaling across tiles), users at ragged positions: of four
    users, one decodes across the window of 32 (position 32 overwrites the ring's oldest slot) and one
    decodes in a ring that wrapped during prefill."""
    cfg = WIDE[name]
    lengths = [28, 17, 34, 9][:batch]
    r = run_both(cfg, batch, 6, prompt_len=lengths, max_len=48, tiles=Tiles(kv_tile=8))
    assert not r["races"], "the interpreter's race detector fired"
    np.testing.assert_array_equal(np.stack(r["mk"]), np.stack(r["ref"]))
    assert len({tuple(t) for t in r["ref"]}) > 1, "greedy tokens should vary (random weights not degenerate)"
    assert r["diff"] < LOGIT_ATOL and r["cache_diff"] < LOGIT_ATOL, (r["diff"], r["cache_diff"])
    assert r["df"].positions.iloc[-1] == [n + 5 for n in lengths]


# bf16 weights and KV cache as on a TPU, against the f32 reference fed the same tokens (teacher forced);
# where the kernel rounds is in compare_with_reference's docstring. Rounding alone moves these random models' logits
# (spread ~+-1.2) by tenths and changes around a tenth of their greedy picks (many near-ties). Criterion: the kernel
# costs at most 1.25x the logit error of the rounding alone and of a reference rounding where the kernel does, and
# changes at most 5 points more picks than that reference; a wiring error costs far more.
BF16_ERROR_RATIO = 1.25
BF16_PICKS_MARGIN = 0.05


@pytest.mark.slow
def test_bf16_weights_and_cache_as_on_a_tpu():
    cfg = WIDE["tiny-moe"]  # its shared MLP is the dense model's MLP, in bf16 too
    r = run_both(
        cfg,
        4,
        16,
        prompt_len=[20, 11, 30, 5],
        max_len=64,
        tiles=Tiles(kv_tile=16),
        dtype=jnp.bfloat16,
        teacher_forced=True,
    )
    df = r["df"]
    assert not r["races"]
    assert r["diff"] <= BF16_ERROR_RATIO * df.rounding_logit_diff.max(), (r["diff"], df.rounding_logit_diff.max())
    # a reference rounding each weight product's activations and attention's query and probabilities too (where the
    # kernel rounds) errs as much at its worst: the criterion the chip's parity check holds the kernel to
    # (mk.measure.chip_parity)
    like = df.kernel_rounding_logit_diff.max()
    assert r["diff"] <= BF16_ERROR_RATIO * like and like <= BF16_ERROR_RATIO * r["diff"], (r["diff"], like)
    picks = (np.stack(r["mk"]) == np.stack(r["ref"])).mean()
    like_picks = (np.stack(df.tokens_kernel_rounding.map(np.array)) == np.stack(r["ref"])).mean()
    assert picks >= like_picks - BF16_PICKS_MARGIN, (picks, like_picks)


@pytest.mark.slow
def test_duplicate_experts_are_fetched_once():
    """B = 8 users x top-2 = 16 routed slots over E = 8 experts: the kernel issues one set of tile DMAs per
    distinct expert routed (counted inside the kernel), not one per slot. With the router knocked out every
    user takes experts 0 and 1, so exactly 2 experts per layer are fetched; with routing, between k and E. Two of
    the model's layers: each routes on its own."""
    from mk.plan import build_plan

    cfg, B = TINY_MOE.truncated(2), 8
    plan = build_plan(cfg, B, 32)
    per_expert = sum(1 for ld in plan.loads if ld.expert == 0) // cfg.num_layers  # tile DMAs of one expert
    slots = sum(1 for ld in plan.loads if ld.expert is not None) // per_expert  # min(B x k, E) per layer, summed
    # one step counts the fixed routing's DMAs (every step's are the same); the routed run below takes two
    fixed = run_both(cfg, B, 1, knockout=frozenset({"router"}), prompt_len=[5, 9, 12, 3, 7, 11, 6, 10])
    assert not fixed["races"] and fixed["diff"] < LOGIT_ATOL
    assert fixed["df"].expert_dmas.tolist() == [cfg.num_layers * cfg.top_k * per_expert]
    r = run_both(cfg, B, 2, prompt_len=[5, 9, 12, 3, 7, 11, 6, 10], max_len=32)
    assert not r["races"] and r["diff"] < LOGIT_ATOL
    np.testing.assert_array_equal(np.stack(r["mk"]), np.stack(r["ref"]))
    for dmas in r["df"].expert_dmas:
        assert dmas % per_expert == 0 and cfg.num_layers * cfg.top_k <= dmas // per_expert <= slots


def test_the_route_known_before_the_step_gives_the_fixed_routes_tokens():
    """The route's wait knocked out with the router (mk.params.ROUTE_WAIT): slot j's expert is j with no table, its
    tiles loaded before the route; two users, two steps against the reference with the router knocked out, races
    checked, and exactly k experts' tiles fetched a layer."""
    from mk.plan import build_plan

    cfg = TINY_MOE.truncated(2)
    plan = build_plan(cfg, 2, 32)
    per_expert = sum(1 for ld in plan.loads if ld.expert == 0) // cfg.num_layers
    r = run_both(cfg, 2, 2, knockout=frozenset({"router", "route_wait"}))
    assert not r["races"] and r["diff"] < LOGIT_ATOL and r["cache_diff"] < LOGIT_ATOL
    np.testing.assert_array_equal(np.stack(r["mk"]), np.stack(r["ref"]))
    assert set(r["df"].expert_dmas) == {cfg.num_layers * cfg.top_k * per_expert}


def test_a_layer_that_routes_to_no_expert_waits_on_every_tile_it_started(capfd):
    """Routing on non-finite logits picks no expert (as on a chip holding none of the routed experts whole): the
    count is 0, yet slot 0 always runs. Its index is traced where the expert slots run as a loop (16 experts, top
    8): kernel revision 3 guarded that slot 0 by the count, so a tile's start (outside the loop) and its wait (inside)
    disagreed, a DMA was left unwaited, and the v5e's core halted (the 26B-A4B stand-in with its norms knocked out).
    The interpreter, DMAs run when started (mk.tpu.interpret_params), reports such a semaphore at the kernel's exit."""
    from mk.config import with_layers
    from mk.megakernel import make_step
    from mk.reference import init_cache
    from mk.tpu import semaphores_left
    from mk.weights import random_params

    cfg = with_layers("gemma4-26b-a4b", 1).replace(
        name="one-layer-16-experts", hidden_size=128, num_experts=16, vocab_size=256, mlp_intermediate=128,
        expert_intermediate=128, num_heads=2, sliding_kv_heads=1, sliding_head_dim=128,
    )  # fmt: skip
    params = random_params(cfg, 0)
    params["layers.0.router_proj"] = jnp.full_like(params["layers.0.router_proj"], jnp.nan)
    step = make_step(cfg, detect_races=True)
    out = step.run(step.packed(params), cfg, step.adopt_cache(init_cache(cfg, 1, 64, jnp.float32)), jnp.asarray([7]), 9)
    assert np.isfinite(np.asarray(out.logits)).all()  # the expert slot's combine weight is 0 on a NaN route
    jax.effects_barrier()
    assert semaphores_left(capfd.readouterr().out) == [] and not races_detected()


def test_dense_attention_knockouts():
    r = run_both(TINY_DENSE, 1, 3, knockout=frozenset({"sliding_attention", "norms"}))
    assert not r["races"] and r["diff"] < LOGIT_ATOL


def test_cli_generate_megakernel_json_equals_reference(mk_json):
    def run(engine):
        return mk_json(
            "generate",
            "--model",
            "tiny-dense",
            "--prompt-ids",
            "5,9,2;7,1,3",
            "--new-tokens",
            4,
            "--engine",
            engine,
            "--json",
        )

    ref, mk = run("reference"), run("megakernel")
    assert mk.pop("engine") == "megakernel" and ref.pop("engine") == "reference"
    assert mk == ref


def test_race_detector_catches_a_read_before_the_dma_wait():
    """The detector the tests rely on is live: reading a buffer a DMA is still writing is flagged."""

    def kernel(x_hbm, o_ref, buf, sem):
        c = pltpu.make_async_copy(x_hbm, buf, sem.at[0])
        c.start()
        o_ref[...] = buf[...]  # no wait: races with the DMA
        c.wait()

    x = jnp.ones((8, 128), jnp.float32)
    pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA((1,))],
        interpret=pltpu.InterpretParams(detect_races=True),
    )(x).block_until_ready()
    assert races_detected()


@pytest.mark.slow
def test_twelve_layers_through_the_loop_over_layers():
    """The layer pattern repeated 4 times: the middle repeats run as one loop over stacked layers (layer
    index, stacked index and buffer slots from the loop index), exact against the reference."""
    from mk.plan import LayerLoop, build_plan

    # the MoE model: the loop over layers is the same for a dense model's layers
    cfg = TINY_MOE.replace(name="tiny-moe-x4", layer_types=TINY_MOE.layer_types * 4)
    assert any(isinstance(s, LayerLoop) for s in build_plan(cfg, 2, 32).folded)
    r = run_both(cfg, 2, 2, prompt_len=[12, 7], max_len=32)  # the second step reads what the first wrote
    assert not r["races"] and r["diff"] < LOGIT_ATOL and r["cache_diff"] < LOGIT_ATOL
    np.testing.assert_array_equal(np.stack(r["mk"]), np.stack(r["ref"]))


@pytest.mark.parametrize("ep, base, held", [(128, 0, 128), (128, 32, 32), (256, 0, 256), (384, 96, 48)])
def test_expert_table_lists_the_routed_experts_in_order(ep, base, held):
    """The kernel's routed-expert table (vector work, no scalar loop), compiled for the TPU in interpret mode: row 0
    the flagged experts among this chip's, in expert order, as indices among them, then its last expert; row 1 how
    many; for no expert, one, all, and random flags."""
    from mk.megakernel.moe import COUNT, expert_table

    rng = np.random.default_rng(ep + base)
    cases = [np.zeros(ep, np.int32), np.eye(1, ep, base + held - 1, dtype=np.int32)[0], np.ones(ep, np.int32)]
    cases += [(rng.random(ep) < p).astype(np.int32) for p in (0.05, 0.5)]

    def body(used_ref, out_ref):
        out_ref[...] = expert_table(used_ref[...], base, held, out_ref.shape)

    table = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((8, ep), jnp.int32), interpret=pltpu.InterpretParams())
    for used in cases:
        got = np.asarray(table(jnp.asarray(used[None, :])))
        want = np.flatnonzero(used[base : base + held])
        assert got[COUNT, 0] == len(want)
        np.testing.assert_array_equal(got[0, : len(want)], want)
        assert (got[0, len(want) :] == held - 1).all()  # past the count: the chip's last expert (slot 0 may run)


def test_a_cache_of_narrow_heads_packs_into_groups_and_back():
    """Three 48-wide KV heads take two 128-lane groups in the kernel's cache (two heads, then one beside zeros), each
    head's RoPE halves half its 64 lanes apart, and the reference's cache comes back from it exactly."""
    from mk.megakernel.pack import adopt_cache, reference_cache
    from mk.reference import init_cache

    cfg = TINY_DENSE.replace(name="odd", num_heads=3, sliding_kv_heads=3, full_kv_heads=3, sliding_head_dim=48,
                             full_head_dim=48)  # fmt: skip
    empty = init_cache(cfg, 2, 32)
    cache = {k: jax.random.normal(jax.random.key(n), v.shape) for n, (k, v) in enumerate(empty.items())}
    packed = adopt_cache(cfg, cache)
    k = packed["full.k"]
    assert k.shape[2:] == (2, 32, 128)
    assert not np.asarray(k[:, :, 1, :, 64:]).any() and not np.asarray(k[:, :, :, :, 24:32]).any()
    np.testing.assert_array_equal(k[0, :, 0, :, 64 + 32 : 64 + 56], cache["layers.2.k"][:, 1, :, 24:])
    back = reference_cache(cfg, packed)
    for name, x in cache.items():
        np.testing.assert_array_equal(back[name], x)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-moe"])
def test_steps_in_one_call_give_the_tokens_of_single_steps(model):
    """``greedy_steps``: two greedy steps in one compiled call, each step's picks fed to the next on the chip, two
    users at their own positions, give the tokens and cache of two single steps (races checked); an MoE's routing too,
    each step's experts from its own tokens."""
    from mk.config import get_config
    from mk.megakernel import make_step
    from mk.reference import init_cache
    from mk.weights import random_params

    cfg = get_config(model)
    step = make_step(cfg, detect_races=True)
    params = step.packed(random_params(cfg, 5))
    tokens, pos = jnp.asarray([3, 17]), jnp.asarray([4, 9])
    cache = step.adopt_cache(init_cache(cfg, 2, 32, multiple=16))
    picks, looped = step.greedy_steps(params, cfg, jax.tree.map(jnp.copy, cache), tokens, pos, 2)
    singles = []
    for i in range(2):
        tokens, cache = step.greedy(params, cfg, cache, tokens, pos + i)
        singles.append(np.asarray(tokens))
    assert not races_detected()
    np.testing.assert_array_equal(np.asarray(picks), np.stack(singles))
    for name in cache:  # interpreted, the loop is one XLA program on the CPU: f32 sums fused in another order
        np.testing.assert_allclose(np.asarray(looped[name]), np.asarray(cache[name]), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="steps must be at least 1"):
        step.greedy_steps(params, cfg, cache, tokens, pos, 0)


def test_kv_tiles_read_ahead_leave_the_kernel_exact():
    """Tiles.kv_ahead: user 0's first two KV tiles of a layer start at the layer's start and every user's tiles are
    read two ahead (mk.megakernel.attention.emit_read_ahead); over 1 to 4 tiles of 8 positions, users at ragged
    positions, in and out of the loop over layers, the same tokens, logits and cache as the reference."""
    from mk.plan import LayerLoop, ReadAhead

    cfg = WIDE["tiny-moe"].replace(name="tiny-moe-w32-x4", layer_types=TINY_MOE.layer_types * 4)
    tiles = Tiles(kv_tile=8, kv_ahead=True)
    plan = build_plan(cfg, 2, 48, tiles=tiles)
    assert any(isinstance(s, LayerLoop) for s in plan.folded)
    assert sum(isinstance(op, ReadAhead) for op in plan.ops) == cfg.num_layers
    r = run_both(cfg, 2, 2, prompt_len=[28, 5], max_len=48, tiles=tiles)  # user 1's tiles read at its turn
    assert not r["races"], "the interpreter's race detector fired"
    np.testing.assert_array_equal(np.stack(r["mk"]), np.stack(r["ref"]))
    assert r["diff"] < LOGIT_ATOL and r["cache_diff"] < LOGIT_ATOL, (r["diff"], r["cache_diff"])
