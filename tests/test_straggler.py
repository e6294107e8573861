"""mk.analysis.straggler: the busiest chip's exact distribution against brute-force enumeration and
sampling, its edge cases, the router-measured draws, the cost model, and ``python -m mk straggler``."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from mk.__main__ import main
from mk.analysis.straggler import (
    busiest_chip,
    crossing,
    measured_busiest,
    sample_busiest,
    zipf_weights,
)
from mk.config import TINY_MOE
from mk.reference import routed_experts
from mk.routing import busiest_chip_distribution, distinct_experts_distribution
from mk.weights import load_checkpoint, random_params

SIGMAS = 4  # sampled values must lie within this many standard errors of the exact ones


def enumerate_busiest(experts, chips, top_k, batch):
    """The busiest chip's distribution over every combination of the users' picks, as exact fractions."""
    picks = list(itertools.combinations(range(experts), top_k))
    counts = {}
    for users in itertools.product(picks, repeat=batch):
        touched = set().union(*users)
        busiest = max(sum(e // (experts // chips) == c for e in touched) for c in range(chips))
        counts[busiest] = counts.get(busiest, 0) + 1
    total = len(picks) ** batch
    return {m: Fraction(n, total) for m, n in sorted(counts.items())}


@pytest.mark.parametrize("experts,chips,top_k,batch", [(8, 4, 2, 1), (8, 4, 2, 2), (6, 3, 3, 2), (8, 2, 3, 2)])
def test_exact_distribution_matches_enumeration(experts, chips, top_k, batch):
    got = busiest_chip_distribution(experts, chips, top_k, batch)
    want = enumerate_busiest(experts, chips, top_k, batch)
    assert set(got) == set(want)
    for m, p in want.items():
        assert got[m] == pytest.approx(float(p), rel=1e-12)


@pytest.mark.parametrize("experts,chips,top_k,batch", [(128, 8, 8, 1), (128, 8, 8, 8), (128, 16, 8, 3), (16, 4, 4, 5)])
def test_distribution_sums_to_one(experts, chips, top_k, batch):
    dist = busiest_chip_distribution(experts, chips, top_k, batch)
    assert sum(dist.values()) == pytest.approx(1.0, abs=1e-12)
    assert min(dist) >= 1 and max(dist) <= min(experts // chips, top_k * batch)


def test_one_chip_loads_every_distinct_expert():
    s = busiest_chip(128, 1, 8, 4)
    want = distinct_experts_distribution(128, 8, 4)
    assert s.distribution.keys() == want.keys()
    assert all(s.distribution[n] == pytest.approx(p, rel=1e-9, abs=1e-300) for n, p in want.items())
    assert s.expected_max == pytest.approx(s.mean)


def test_one_expert_per_chip_is_never_a_straggler():
    s = busiest_chip(128, 128, 8, 8)
    assert s.distribution == {1: pytest.approx(1.0)}
    assert s.mean == pytest.approx(sum(n * p for n, p in distinct_experts_distribution(128, 8, 8).items()) / 128)


def test_published_case_more_users_and_more_chips():
    one = busiest_chip(128, 8, 8, 1)
    assert one.mean == 1.0  # one user's eight experts over eight chips
    assert 2 < one.expected_max < 3
    assert busiest_chip(128, 8, 8, 4).expected_max > one.expected_max  # more users: more experts to place
    assert busiest_chip(128, 16, 8, 1).expected_max < one.expected_max  # more chips: fewer land on each


@pytest.mark.parametrize("chips,batch", [(8, 1), (8, 3), (4, 2)])
def test_sampling_agrees_with_the_exact_distribution(chips, batch):
    exact = busiest_chip(128, chips, 8, batch)
    rounds = 40_000
    sampled = sample_busiest(128, chips, 8, batch, rounds, seed=1)
    assert abs(sampled.expected_max - exact.expected_max) <= SIGMAS * exact.std / math.sqrt(rounds)
    for m, p in exact.distribution.items():
        assert abs(sampled.distribution.get(m, 0.0) - p) <= SIGMAS * math.sqrt(p * (1 - p) / rounds) + 1e-9
    assert sampled.samples == rounds and sampled.standard_error > 0


def test_weighted_sampling_draws_without_replacement_in_proportion():
    """Two picks of six experts on three chips: the busiest chip holds both exactly when they share a chip;
    the chance of that under successive draws in proportion to the weights, by enumeration."""
    w = np.array([6.0, 1.0, 3.0, 2.0, 5.0, 4.0])
    w = w / w.sum()
    same_chip = sum(w[a] * w[b] / (1 - w[a]) for a in range(6) for b in range(6) if a != b and a // 2 == b // 2)
    rounds = 40_000
    s = sample_busiest(6, 3, 2, 1, rounds, seed=2, weights=w)
    assert abs(s.distribution[2] - same_chip) <= SIGMAS * math.sqrt(same_chip * (1 - same_chip) / rounds)


def test_zipf_weights():
    flat = zipf_weights(16, 0.0, seed=3)
    np.testing.assert_allclose(flat, np.full(16, 1 / 16))
    skewed = zipf_weights(16, 1.0, seed=3)
    assert skewed.sum() == pytest.approx(1.0) and skewed.max() / skewed.min() == pytest.approx(16)
    spread = zipf_weights(16, 1.0, spread_over=4)
    hottest = np.argsort(-spread)[:4]
    assert sorted(hottest // 4) == [0, 1, 2, 3]  # one of the four hottest experts on each chip
    # A skew this steep sends one user's picks to the four hottest, spread one per chip.
    assert sample_busiest(16, 4, 4, 1, 2000, seed=4, weights=zipf_weights(16, 60.0, spread_over=4)).expected_max == 1


def test_routed_experts_match_transformers_router(hf_checkpoint):
    """The experts transformers' own router picks (the top-k of its recorded probabilities), every layer;
    a position's routes do not depend on the tokens after it."""
    import torch

    folder, model = hf_checkpoint("tiny-moe")
    cfg, params = load_checkpoint(folder)
    tokens = np.random.default_rng(6).integers(0, cfg.vocab_size, (2, 24))  # past the sliding window
    with torch.no_grad():
        probs = model(torch.tensor(tokens), output_router_logits=True).router_logits
    want = np.stack([torch.topk(p, cfg.top_k, dim=-1).indices.numpy().reshape(2, 24, -1) for p in probs])
    got = routed_experts(params, cfg, tokens)
    assert got.shape == (cfg.num_layers, 2, 24, cfg.top_k)
    np.testing.assert_array_equal(np.sort(got, axis=-1), np.sort(want, axis=-1))
    np.testing.assert_array_equal(routed_experts(params, cfg, tokens[:, :9]), got[:, :, :9])


def test_measured_busiest_from_the_router():
    params = random_params(TINY_MOE, 0)
    s = measured_busiest(params, TINY_MOE, chips=4, batch=2, streams=2, prompt_len=6, new_tokens=5)
    assert s.samples == TINY_MOE.num_layers * 2 * 5
    assert sum(s.distribution.values()) == pytest.approx(1.0)
    assert set(s.distribution) <= {1, 2} and 1 <= s.expected_max <= 2
    assert 2 / 4 <= s.mean <= 4 / 4  # two users' two experts each: 2 to 4 distinct, over 4 chips
    assert s.kind.startswith("measured")


def test_crossing():
    assert crossing([0, 1, 2], [3.0, 2.0, 1.0], 2.5) == pytest.approx(0.5)
    assert crossing([0, 1, 2], [3.0, 2.0, 1.0], 2.0) == 1.0
    assert crossing([0, 1], [3.0, 2.0], 1.0) is None


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: busiest_chip_distribution(128, 6, 8), "whole placement needs E divisible by C.*split placement"),
        (lambda: busiest_chip_distribution(8, 4, 9), r"top_k \(9\) must not exceed experts \(8\)"),
        (lambda: busiest_chip_distribution(8, 0, 2), "chips must be a positive integer, got 0"),
        (lambda: busiest_chip_distribution(8, 4, 2, batch=-1), "batch must be a positive integer"),
        (lambda: sample_busiest(8, 4, 2, 1, 10, 0, weights=[1.0] * 7), "weights must be 8 non-negative"),
    ],
)
def test_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_cli_json_published_case(mk_json):
    d = mk_json("straggler", "--experts", 128, "--chips", 8, "--top-k", 8, "--json")
    assert d["expected_max"] == busiest_chip(128, 8, 8, 1).expected_max
    assert d["mean"] == 1.0
    assert sum(d["distribution"].values()) == pytest.approx(1.0)
    assert (d["experts"], d["chips"], d["top_k"], d["batch"]) == (128, 8, 8, 1)


@pytest.mark.parametrize("chips,batch", [(8, 4), (16, 1)])
def test_cli_batch_and_chips(capsys, chips, batch):
    args = ["straggler", "--experts", "128", "--chips", str(chips), "--top-k", "8", "--batch", str(batch), "--json"]
    assert main(args) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    s = busiest_chip(128, chips, 8, batch)
    assert d["expected_max"] == pytest.approx(s.expected_max) and d["mean"] == pytest.approx(s.mean)
    assert {int(m): p for m, p in d["distribution"].items()} == pytest.approx(s.distribution)


def test_cli_text_and_errors(capsys):
    assert main(["straggler", "--experts", "8", "--chips", "4", "--top-k", "2"]) == 0
    assert "expected busiest chip" in capsys.readouterr().out
    assert main(["straggler", "--experts", "128", "--chips", "6", "--top-k", "8"]) == 2
    assert "use split placement" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["straggler", "--experts", "8", "--chips", "0", "--top-k", "2"])
    assert e.value.code == 2


def test_whole_against_split_is_one_setup_placed_each_way_in_04_and_06_and_05s_first_fix_apart():
    from mk.analysis.straggler import straggler_cost, whole_against_split
    from mk.kernel_setup import BEFORE_FIXES, FIXES, WRITE_UP_KERNEL, Placement
    from mk.timing import predict

    t = whole_against_split(TINY_MOE, "tpu-v5e-8", 64, 1).set_index("notebook")
    assert list(t.index) == ["04", "06", "05"]
    assert t.whole_ms["04"] == pytest.approx(t.whole_ms["06"], rel=1e-12)
    assert t.split_ms["04"] == pytest.approx(t.split_ms["06"], rel=1e-12)
    assert t.split_setup["04"] == t.split_setup["06"] == WRITE_UP_KERNEL.name
    assert "whole experts" in t.whole_setup["04"] and t.whole_setup["04"].startswith(WRITE_UP_KERNEL.name)
    assert (t.whole_setup["05"], t.split_setup["05"]) == (BEFORE_FIXES.name, FIXES[1].name)
    assert not t.overlap["05"] and t.payload["05"] == "f32" and t.overlap["04"] and t.payload["04"] == "bf16"
    assert t.split_saves_ms.to_numpy() == pytest.approx((t.whole_ms - t.split_ms).to_numpy())
    c = straggler_cost(TINY_MOE, "tpu-v5e-8", 64, 1)
    assert c["whole_step_s"] * 1e3 == pytest.approx(t.whole_ms["04"])
    # each step's per-op costs are the prediction's of its setup (bf16)
    named = {s.name: s for s in (*FIXES, WRITE_UP_KERNEL.but(placement=Placement.WHOLE))}
    for side in ("whole", "split"):
        expected = [predict(TINY_MOE, "tpu-v5e-8", 64, 1, setup=named[n]).op_costs for n in t[f"{side}_setup"]]
        assert t[f"{side}_op_costs"].tolist() == expected
    assert (c["whole_op_costs"], c["split_op_costs"]) == (t.whole_op_costs["04"], t.split_op_costs["04"])
    # padding: the lanes layout of (d) pads a split expert's narrow slice; on rows ((g)) nothing at this size
    assert c["ffn_layout"] == "lanes" and c["split_padding"] >= c["whole_padding"] >= 0
