"""Eight chips: what each chip holds (pure Python), the step plan of a chip, and the step over 8 simulated
chips against transformers' greedy tokens (the cross-chip ops one by one: tests/test_ops.py)."""

import itertools

import jax
import numpy as np
import pytest
from test_parity import hf_greedy

from mk.config import GEMMA4_26B_A4B, GEMMA4_31B, TINY_MOE, load_hf_config
from mk.kernel_setup import Collective, KernelSetup
from mk.params import EXPERTS
from mk.plan import AllReduce, Op, Start, build_plan
from mk.routing import chip_distinct_experts_distribution, distinct_experts_distribution
from mk.sharding import (
    chip_config,
    chip_params,
    heads_split,
    kv_replication,
    kv_replication_bytes,
    make_mesh,
    sent_bytes,
)
from mk.weights import random_params

CFG8 = TINY_MOE.replace(name="tiny-moe-8h", num_heads=8, sliding_kv_heads=2, full_kv_heads=1)


def test_heads_split_where_they_divide_and_kv_heads_are_replicated_where_fewer_than_chips():
    assert heads_split(GEMMA4_26B_A4B, 8) and heads_split(GEMMA4_31B, 8)
    # 26B-A4B: 8 sliding KV heads (one a chip), 2 full (each on 4 chips); 31B: 16 and 4
    assert kv_replication(GEMMA4_26B_A4B, 8) == {"sliding": 1, "full": 4}
    assert kv_replication(GEMMA4_31B, 8) == {"sliding": 1, "full": 2}
    assert not heads_split(TINY_MOE, 8)  # 2 query heads: attention replicated on every chip
    assert kv_replication(TINY_MOE, 8) == {"sliding": 8, "full": 8}
    # what the copies cost a chip: 26B-A4B's full layers' K projection (K = V) and cache, 3/8 of them more
    cfg, full = GEMMA4_26B_A4B, GEMMA4_26B_A4B.full_layers
    kv_bytes = len(full) * 2 * (cfg.hidden_size + 2 * 1024) * cfg.full_head_dim * 2
    extra = kv_replication_bytes(cfg, 8, 1024)
    assert extra == {"full": pytest.approx(kv_bytes * 3 / 8), "sliding": 0}


@pytest.mark.parametrize("placement", ["whole", "split"])
def test_the_chips_slices_put_together_give_the_model_back(placement):
    params = {k: np.asarray(v) for k, v in random_params(CFG8, 0).items()}
    setup = KernelSetup(8, placement)
    parts = [chip_params(params, CFG8, setup, c) for c in range(8)]
    cat = lambda name, axis: np.concatenate([p[name] for p in parts], axis)  # noqa: E731
    np.testing.assert_array_equal(cat("embed", 0)[: CFG8.vocab_size], params["embed"])
    np.testing.assert_array_equal(cat("layers.0.q", 1), params["layers.0.q"])
    np.testing.assert_array_equal(cat("layers.0.o", 0), params["layers.0.o"])
    np.testing.assert_array_equal(cat("layers.0.mlp_gate", 1)[:, : CFG8.mlp_intermediate], params["layers.0.mlp_gate"])
    np.testing.assert_array_equal(cat("layers.0.mlp_down", 0)[: CFG8.mlp_intermediate], params["layers.0.mlp_down"])
    if placement == "whole":
        np.testing.assert_array_equal(cat("layers.0.expert_up", 0), params["layers.0.expert_up"])
    else:
        ei = CFG8.expert_intermediate
        np.testing.assert_array_equal(cat("layers.0.expert_up", 2)[..., :ei], params["layers.0.expert_up"])
        np.testing.assert_array_equal(cat("layers.0.expert_down", 1)[:, :ei], params["layers.0.expert_down"])
    # 2 sliding KV heads for 8 chips: chips 0-3 hold KV head 0, chips 4-7 head 1 (the one their query head reads)
    hd = CFG8.sliding_head_dim
    for c in range(8):
        np.testing.assert_array_equal(parts[c]["layers.0.k"], params["layers.0.k"][:, c // 4 * hd : (c // 4 + 1) * hd])
    assert parts[3]["layers.0.router_proj"] is params["layers.0.router_proj"]  # replicated


@pytest.mark.parametrize("placement", ["whole", "split"])
def test_each_chip_packs_and_holds_its_own_slice(placement):
    """The engine packs chip c's slice of the model on chip c (mk.megakernel.pack of mk.sharding.chip_params):
    every weight is one array over the mesh whose part on chip c is that slice, and nothing more (a full-size
    model packed on one device would not fit one chip of a slice)."""
    from mk.megakernel import make_step, pack

    params = random_params(CFG8, 1)
    step = make_step(CFG8, KernelSetup(8, placement))
    packed = step.packed(params)
    setup = KernelSetup(8, placement)
    for c, dev in enumerate(step.mesh.devices.flat):
        want = pack(chip_params(params, CFG8, setup, c), chip_config(CFG8, setup))["weights"]
        assert packed["weights"].keys() == want.keys()
        for name, a in packed["weights"].items():
            (held,) = [s.data for s in a.addressable_shards if s.device == dev]
            np.testing.assert_array_equal(np.asarray(held), np.asarray(want[name]), err_msg=f"chip {c}: {name}")


def test_clear_errors_for_placements_and_meshes_that_do_not_fit():
    with pytest.raises(ValueError, match="placement 'split'"):
        chip_config(TINY_MOE.replace(num_experts=6), KernelSetup(4, "whole"))
    with pytest.raises(ValueError, match="unknown expert placement"):
        KernelSetup(8, "scattered")
    with pytest.raises(ValueError, match="needs 4 devices, but 2"):
        make_mesh(4, jax.devices()[:2])
    assert make_mesh(8).shape == {"x": 8}
    with pytest.raises(ValueError, match="chip 8 is not one of the 8 chips"):
        build_plan(CFG8, 1, 64, setup=KernelSetup(8), chip_index=8)


def test_busiest_share_of_a_chip_is_hypergeometric_over_the_distinct_experts():
    """One chip of 4 holding 2 of 8 experts, 2 users of top-2: the distribution of the distinct experts it
    loads, against counting every pair of picks."""
    E, C, k, B = 8, 4, 2, 2
    counts: dict[int, int] = {}
    picks = list(itertools.combinations(range(E), k))
    for users in itertools.product(picks, repeat=B):
        m = len({e for u in users for e in u if e < E // C})
        counts[m] = counts.get(m, 0) + 1
    total = len(picks) ** B
    got = chip_distinct_experts_distribution(E, C, k, B)
    assert got == pytest.approx({m: n / total for m, n in counts.items()}, abs=1e-12)
    mean = sum(n * p for n, p in distinct_experts_distribution(E, k, B).items()) / C
    assert sum(m * p for m, p in got.items()) == pytest.approx(mean, rel=1e-12)


@pytest.mark.parametrize("placement", ["whole", "split"])
def test_a_chips_plan_carries_its_share_of_the_bytes_and_the_all_reduces(placement):
    """26B-A4B over 8 chips: a chip's expected expert bytes are 1/8 of one chip's (exactly, as real weights);
    one all-reduce after the embedding, two per layer, each with the payload mk.sharding.sent_bytes gives."""
    cfg = GEMMA4_26B_A4B
    one = build_plan(cfg, 1, 1024, weight_dtype="bfloat16", kv_dtype="bfloat16")
    plan = build_plan(cfg, 1, 1024, weight_dtype="bfloat16", kv_dtype="bfloat16", setup=KernelSetup(8, placement))
    want = one.bytes_by_component(payload=True)[EXPERTS] / 8
    assert plan.bytes_by_component(payload=True)[EXPERTS] == pytest.approx(want, rel=1e-9)
    ars = [op for op in plan.ops if isinstance(op, AllReduce)]
    assert len(ars) == 1 + 2 * cfg.num_layers
    assert [op.seq for op in ars] == list(range(len(ars)))
    ffn = ars[2]
    assert ffn.acts == ("ffn", "moe") and ffn.sent_bytes == 7 * 2 * cfg.hidden_size * 4  # one user's rows
    rs = Collective(reduce_scatter=True, bf16_payload=True)
    assert sent_bytes(rs, 16, cfg.hidden_size, 8) == 2 * 7 * 16 * 384 * 2  # 2816 lanes: 8 chunks of 384
    # the head's rows are split: a chip streams 1/8 of the vocabulary
    assert plan.bytes_by_component()["head"] == pytest.approx(one.bytes_by_component()["head"] / 8, rel=1e-9)


def test_without_overlap_no_weight_dma_is_in_flight_across_an_all_reduce():
    def crossing(plan):
        """Starts issued before an all-reduce for a tile read after it."""
        consumer = {it.load: n for n, it in enumerate(plan.items) if isinstance(it, Op) and it.load is not None}
        ars = [n for n, it in enumerate(plan.items) if isinstance(it, AllReduce)]
        return [
            (n, a) for n, it in enumerate(plan.items) if isinstance(it, Start) for a in ars if n < a < consumer[it.load]
        ]

    on = build_plan(CFG8, 2, 64, setup=KernelSetup(8))
    off = build_plan(CFG8, 2, 64, setup=KernelSetup(8, collective=Collective(overlap=False)))
    assert len(crossing(on)) > 0 and crossing(off) == []
    assert {ld.id for ld in on.loads} == {ld.id for ld in off.loads}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, placement, prompts, new, switches",
    [
        ("hf-eight-heads-dense", "split", (9, 3, 12, 5), 2, ["--no-overlap"]),
        ("hf-snippet-pair", "split", (9,), 2, []),
        ("llama-eight-heads", "split", (9, 3), 2, []),
        ("qwen3-moe-eight-heads", "whole", (9, 3), 2, []),
        ("qwen3-moe-eight-heads", "split", (9,), 2, ["--reduce-scatter"]),
    ],
    ids=[
        "dense-b4-no-overlap",
        "moe-split-4-heads-replicated-b1",
        "llama-b2",
        "qwen3-moe-whole-b2",
        "qwen3-moe-split-b1-reduce-scatter",
    ],
)
def test_cli_generate_on_8_chips_gives_transformers_greedy_tokens(
    hf_checkpoint, mk_json, name, placement, prompts, new, switches
):
    """``python -m mk generate --engine megakernel --chips 8`` on checkpoints transformers saved, the race
    detector on: 8 query heads split over the chips with 2 and 1 KV heads (each kept on 4 and 8 chips), or
    4 query heads (attention replicated); experts whole (one a chip) or split in 8; prompts of different
    lengths (one past the window); each user gets transformers' greedy tokens for its prompt alone. The first
    token is the prefill's, so ``new`` - 1 = 1 kernel step runs. Gemma 4's MoE with whole experts, the all-reduce
    as reduce-scatter and two kernel steps (the second reading the cache the first wrote) run in the users-split
    test below. (A bf16 payload rounds the partial sums, so it is held to a tolerance instead: the test after it.)"""
    folder, model = hf_checkpoint(name)
    cfg = load_hf_config(folder)
    rng = np.random.default_rng(11)
    ids = [rng.integers(0, cfg.vocab_size, n).tolist() for n in prompts]
    got = mk_json(
        "generate",
        "--checkpoint",
        folder,
        "--prompt-ids",
        ";".join(",".join(map(str, p)) for p in ids),
        "--new-tokens",
        new,
        "--engine",
        "megakernel",
        "--chips",
        8,
        "--placement",
        placement,
        "--detect-races",
        "--json",
        *switches,
    )
    assert not got["races"]
    for b, prompt in enumerate(ids):
        want, _ = hf_greedy(model, np.array([prompt]), new)
        assert got["tokens"][b] == want[0].tolist(), f"user {b}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, placement, split, prompts, max_len, new, switches",
    [
        ("hf-eight-heads-w64-dense", "split", "positions", (270, 261, 252, 243, 234, 225, 216, 207), 384, 2, []),
        ("hf-eight-heads", "whole", "users", (60, 34, 57, 40, 51, 46, 38, 62), 64, 3, ["--reduce-scatter"]),
    ],
    ids=["positions-dense-b8-ragged", "users-moe-whole-b8-ragged"],
)
def test_cli_generate_with_attention_split_over_chips_gives_transformers_greedy_tokens(
    hf_checkpoint, mk_json, name, placement, split, prompts, max_len, new, switches
):
    """``--attention-split`` over 8 chips, the race detector on; each user gets transformers' greedy tokens for its
    prompt alone. ``positions``: the 4 chips sharing a sliding KV head and the 8 sharing the full one each hold every
    4th / 8th block of 16 of its slots, attend over them for all the group's query heads, and merge the partial
    states over remote DMAs; with 384 slots a chip holds 48 of the full layer's (3 KV tiles of 16), and the prompts
    reach past 2 tiles on every chip. ``users``: chip c owns user c's cache of every head (64 slots: 4 tiles of 16,
    which the ragged prompts reach 3 and 4 of); each chip's q, k, v head goes to each user's chip, and the outputs
    come back, over remote DMAs; two kernel steps (the second reads the K/V the first wrote on each user's chip) and
    the all-reduce as reduce-scatter then all-gather. Positions split with a MoE's experts split, and users split with
    the plain all-reduce: the peers-sharing-semaphores test below (the MoE's shared MLP is the dense model's MLP)."""
    folder, model = hf_checkpoint(name)
    cfg = load_hf_config(folder)
    rng = np.random.default_rng(12)
    ids = [rng.integers(0, cfg.vocab_size, n).tolist() for n in prompts]
    got = mk_json(
        "generate", "--checkpoint", folder, "--prompt-ids", ";".join(",".join(map(str, p)) for p in ids),
        "--new-tokens", new, "--engine", "megakernel", "--chips", 8, "--placement", placement,
        "--attention-split", split, "--max-len", max_len, "--kv-tile", 16, "--detect-races", "--json", *switches,
    )  # fmt: skip
    assert not got["races"]
    for b, prompt in enumerate(ids):
        want, _ = hf_greedy(model, np.array([prompt]), new)
        assert got["tokens"][b] == want[0].tolist(), f"user {b}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, setup, prompts, max_len",
    [
        ("hf-eight-heads-w64", KernelSetup(8, "split", Collective(reduce_scatter=True), "positions"), (70, 41), 128),
        ("hf-eight-heads", KernelSetup(8, "whole", attention_split="users"), (30, 17, 25, 9, 12, 28, 21, 5), 48),
    ],
    ids=["reduce-scatter-positions-split", "users-split"],
)
def test_peers_sharing_their_semaphores_give_transformers_greedy_tokens(
    hf_checkpoint, monkeypatch, name, setup, prompts, max_len
):
    """Past mk.kernel_setup.PEER_SEMAPHORE_CHIPS chips the cross-chip ops' peers share one DMA semaphore a direction
    (what lets the step compile past 16 chips: tests/test_compile.py); the limit lowered to 4 here so 8 simulated
    chips take that path, the race detector on: the all-reduce as reduce-scatter then all-gather, the greedy pick's
    gather, and the exchanges of attention split by positions and by users give transformers' greedy tokens."""
    import mk.kernel_setup
    from mk.generate import generate
    from mk.megakernel.refs import collective_shapes
    from mk.tpu import races_detected
    from mk.weights import load_checkpoint

    monkeypatch.setattr(mk.kernel_setup, "PEER_SEMAPHORE_CHIPS", 4)
    folder, model = hf_checkpoint(name)
    cfg, params = load_checkpoint(folder)
    plan = build_plan(cfg, len(prompts), max_len, setup=setup)
    assert setup.peer_semaphores == 1
    assert all(ex.send_sem.shape[-1] == 1 for ex in collective_shapes(plan).exchange.values())
    rng = np.random.default_rng(13)
    ids = [rng.integers(0, cfg.vocab_size, n).tolist() for n in prompts]
    got = generate(params, cfg, ids, 2, engine="megakernel", max_len=max_len,
                   engine_options=dict(setup=setup, kv_tile=16, detect_races=True))  # fmt: skip
    assert not races_detected()
    for b, prompt in enumerate(ids):
        want, _ = hf_greedy(model, np.array([prompt]), 2)
        assert got[b].tolist() == want[0].tolist(), f"user {b}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, setup",
    [
        ("hf-eight-heads", KernelSetup(8, "split", torus=((2, False), (4, True)))),
        ("hf-eight-heads", KernelSetup(8, "whole", torus=((2, False), (2, False), (2, True)))),
        ("hf-snippet-pair", KernelSetup(8, "hosts", torus=((4, False), (2, True)), host_chips=4, repeat_heads=True)),
    ],
    ids=["2x4-split", "2x2x2-whole", "4x2-hosts-heads-repeated"],
)
def test_the_all_reduce_over_a_torus_gives_transformers_greedy_tokens(hf_checkpoint, name, setup):
    """Past one host the kernel sums partials over the slice's torus one dimension at a time (reduce-scatter along
    each, all-gather back) and picks the greedy token the same way (mk.megakernel.collective): 8 simulated chips laid
    out as a 2x4 and a 2x2x2 torus, ragged prompts, the race detector on, give transformers' greedy tokens; the
    chips along a dimension's group are the ones the plan prices (mk.sharding.links.torus_all_reduce). With placement
    ``hosts`` and 4 query heads repeated over the two groups of 4 chips (what mk.sharding.pods places past one host,
    timed and run) each group of 4 chips holds half the experts whole, each split over its 4 chips, and computes every
    head, the second group's output projection zero."""
    from mk.generate import generate
    from mk.tpu import races_detected
    from mk.weights import load_checkpoint

    folder, model = hf_checkpoint(name)
    cfg, params = load_checkpoint(folder)
    plan = build_plan(cfg, 3, 64, setup=setup)
    ar = next(op for op in plan.ops if isinstance(op, AllReduce))
    assert ar.rounds == sum(2 * (n // 2 if wraps else n - 1) for n, wraps in setup.torus)
    rng = np.random.default_rng(14)
    ids = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (21, 9, 14)]
    got = generate(params, cfg, ids, 2, engine="megakernel", engine_options=dict(setup=setup, detect_races=True))
    assert not races_detected()
    for b, prompt in enumerate(ids):
        want, _ = hf_greedy(model, np.array([prompt]), 2)
        assert got[b].tolist() == want[0].tolist(), f"user {b}"


def test_a_bf16_payload_moves_logits_by_its_rounding_only():
    """One step of 4 users at ragged positions over a random cache, on 2 chips (tests/test_ops.py holds the
    8-chip all-reduce to the sum of the rounded partials). An f32 payload gives the reference's logits up to
    summation order (2e-6 measured on 8 chips; exact tokens: the test above). A bf16 payload rounds each
    partial sum to 8 significant bits (relative 2^-9): it moved logits by 5e-3 to 7e-3 on 8 chips (both
    placements, with and without reduce-scatter), so 2e-2 is the bound; the greedy pick is the reference's
    wherever the reference's two best logits are further apart than twice that."""
    import jax.numpy as jnp
    from conftest import HF_EIGHT_HEADS

    from mk.config import from_hf_dict
    from mk.megakernel import make_step
    from mk.reference import decode_step, init_cache

    cfg = from_hf_dict(HF_EIGHT_HEADS)
    params = random_params(cfg, 3)
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, 4), jnp.int32)
    pos = jnp.asarray([9, 3, 12, 5], jnp.int32)
    cache = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in init_cache(cfg, 4, 32, multiple=16).items()}
    want, _ = decode_step(params, cfg, {k: jnp.asarray(v) for k, v in cache.items()}, tokens, pos)
    want = np.asarray(want)
    top2 = np.sort(want, axis=-1)[:, -2:]
    atol = 2e-2
    step = make_step(cfg, KernelSetup(2, "whole", Collective(bf16_payload=True, reduce_scatter=True)))
    got = np.asarray(step.run(params, cfg, step.adopt_cache(cache), tokens, pos).logits)
    assert 0 < np.abs(got - want).max() <= atol  # rounded, but no further than that
    clear = top2[:, 1] - top2[:, 0] > 2 * atol
    np.testing.assert_array_equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
