"""Speculative decoding's drafters."""

import pytest

from mk.speculative import ngram_draft


def test_ngram_draft_proposes_what_followed_the_latest_match_of_the_longest_suffix():
    # "7 8" recurs twice; the latest earlier occurrence (at 5) is followed by 9, 4, 7
    history = [1, 7, 8, 2, 3, 7, 8, 9, 4, 7, 8]
    assert ngram_draft(history, 3, max_ngram=2) == [9, 4, 7]
    # the trigram "4 7 8" never recurs, so the bigram decides
    assert ngram_draft(history, 3, max_ngram=3) == [9, 4, 7]
    # a longer match wins over a later shorter one: "2 3 7" is followed by 8
    assert ngram_draft([2, 3, 7, 8, 5, 3, 7, 1, 2, 3, 7], 1, max_ngram=3) == [8]


def test_ngram_draft_is_short_near_the_end_and_empty_without_a_match():
    assert ngram_draft([5, 6, 5], 4) == [6, 5]  # "5" at 0 is followed by what is left
    assert ngram_draft([1, 2, 3, 4], 2) == []
    assert ngram_draft([9], 2) == []
    assert ngram_draft([3, 3, 3], 2, min_ngram=2) == [3]


def test_ngram_draft_refuses_bad_sizes():
    with pytest.raises(ValueError, match="k"):
        ngram_draft([1, 2], 0)
    with pytest.raises(ValueError, match="max_ngram"):
        ngram_draft([1, 2], 2, max_ngram=1, min_ngram=2)


def test_a_plan_verifying_drafts_streams_the_weights_once_for_every_row_and_reads_each_cache_once():
    """K = 3 drafted tokens per user: 4 rows per user through one weight pass (the plan's batch counts rows); the
    KV cache is read once per user, attention's products take 4 query rows per head, and the routed experts are
    those of 4 rows per user (exactly, as for a batch of rows)."""
    from mk.config import GEMMA4_26B_A4B
    from mk.plan import Attend, build_plan
    from mk.routing import distinct_experts_distribution

    def plan(batch, drafts=0):
        return build_plan(GEMMA4_26B_A4B, batch, 4096, weight_itemsize=2, kv_itemsize=2, draft_tokens=drafts)

    plain, spec = plan(2), plan(2, 3)
    assert (spec.batch, spec.users) == (8, 2) and plain.users == 2
    assert spec.kv_bytes == plain.kv_bytes and spec.weight_bytes_max == plan(8).weight_bytes_max
    attends = list(zip(*([op for op in p.ops if isinstance(op, Attend)] for p in (plain, spec))))
    assert attends and all(b.flops == 4 * a.flops and b.query_rows == 4 * a.query_rows for a, b in attends)
    assert spec.distinct_experts == distinct_experts_distribution(128, 8, 8)
    with pytest.raises(ValueError, match="0 or more"):
        plan(1, -1)


# the MoE model at 8 users is left out: its 32 rows' spread of distinct experts takes a minute of timelines here
@pytest.mark.parametrize("model, batch", [("gemma4-26b-a4b", 1), ("gemma4-31b", 1), ("gemma4-31b", 8)])
def test_predicted_speculation_is_never_faster_when_nothing_is_accepted(model, batch):
    """With no draft accepted a round emits the target's one token, after a weight pass over 1 + K rows a user: never
    faster than plain decoding. Tokens/s count emitted tokens: acceptance A gives A tokens per round."""
    from mk.timing import predict

    plain = predict(model, "tpu-v5e-8", 1024, batch)
    for k in (1, 3):
        none = predict(model, "tpu-v5e-8", 1024, batch, speculate=k, acceptance=1)
        assert none.step_s >= plain.step_s and none.tokens_per_s <= plain.tokens_per_s
        some = predict(model, "tpu-v5e-8", 1024, batch, speculate=k, acceptance=k + 1)
        assert some.tokens_per_s == pytest.approx((k + 1) / some.step_s)
        assert some.fraction_of_sol == pytest.approx((k + 1) * some.sol_step_s / some.step_s)


def test_predict_speculate_on_the_command_line(mk_json, capsys):
    from mk.__main__ import main

    args = ["predict", "--model", "gemma4-26b-a4b", "--chip", "tpu-v5e-8", "--context", 1024, "--json"]
    d = mk_json(*args, "--speculate", 3, "--acceptance", 2.5)
    assert d["draft_tokens"] == 3 and d["tokens_per_round"] == 2.5
    assert d["tokens_per_s"] == pytest.approx(2.5 / d["step_ms"] * 1e3)
    plain = mk_json(*args)
    assert mk_json(*args, "--speculate", 3, "--acceptance", 1)["tokens_per_s"] <= plain["tokens_per_s"]
    for bad, message in ((["--speculate", 3], "needs an acceptance"), (["--speculate", 3, "--acceptance", 5], "1 (no")):
        assert main([str(a) for a in args + bad]) == 2
        assert message in capsys.readouterr().err
