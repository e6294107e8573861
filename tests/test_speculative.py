"""Speculative decoding's drafters."""

import numpy as np
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
    from mk.kernel_setup import KernelSetup
    from mk.plan import Attend, build_plan
    from mk.routing import distinct_experts_distribution

    def plan(batch, drafts=0):
        setup = KernelSetup(draft_tokens=drafts)
        return build_plan(GEMMA4_26B_A4B, batch, 4096, weight_dtype="bfloat16", kv_dtype="bfloat16", setup=setup)

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
    from mk.kernel_setup import VERIFYING_KERNEL
    from mk.timing import predict

    plain = predict(model, "tpu-v5e-8", 1024, batch, setup=VERIFYING_KERNEL)
    for k in (1, 3):
        drafts = VERIFYING_KERNEL.but(draft_tokens=k)
        none = predict(model, "tpu-v5e-8", 1024, batch, setup=drafts, acceptance=1)
        assert none.step_s >= plain.step_s and none.tokens_per_s <= plain.tokens_per_s
        some = predict(model, "tpu-v5e-8", 1024, batch, setup=drafts, acceptance=k + 1)
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


def _assistant_for_26b(folder, hidden: int = 1024):
    """An assistant config.json shaped to draft for 26B-A4B (its K/V heads and widths; 4 dense layers of an assumed
    width ``hidden``: a test's shape, not a released one), written by transformers."""
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    from mk.config import GEMMA4_26B_A4B, to_hf_dict
    from tests.conftest import assistant_text_config

    d = to_hf_dict(GEMMA4_26B_A4B)
    d.pop("model_type")
    text = dict(assistant_text_config(d), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=4,
                layer_types=["sliding_attention"] * 3 + ["full_attention"])  # fmt: skip
    config = Gemma4AssistantConfig(text_config=Gemma4TextConfig(**text), backbone_hidden_size=d["hidden_size"])
    config.save_pretrained(folder)
    return config


def test_an_assistant_costs_its_weights_once_per_draft(tmp_path, mk_json):
    """The assistant's bytes are transformers' count of its weights (2 bytes each, bf16); a round adds its K drafts'
    programs to the step, linear in K; tokens/s count a round's time."""
    import torch
    from transformers import Gemma4AssistantForCausalLM

    from mk.assistant_config import read_assistant_config
    from mk.kernel_setup import VERIFYING_KERNEL
    from mk.timing import predict

    config = _assistant_for_26b(tmp_path)
    with torch.device("meta"):
        model = Gemma4AssistantForCausalLM(config)
    # transformers keeps each layer's scalar as a buffer; the rest of its buffers are not weights (RoPE's)
    scalars = sum(b.numel() for n, b in model.named_buffers() if n.endswith("layer_scalar"))
    count = sum(p.numel() for p in model.parameters()) + scalars
    a = read_assistant_config(tmp_path)
    assert a.weight_bytes(2) == 2 * count
    one, three = (
        predict(
            "gemma4-26b-a4b", "tpu-v5e-8", 1024, setup=VERIFYING_KERNEL.but(draft_tokens=k), acceptance=1, assistant=a
        )
        for k in (1, 3)
    )
    assert one.drafter_s > 0 and three.drafter_s == pytest.approx(3 * one.drafter_s)
    assert three.tokens_per_s == pytest.approx(1 / (three.step_s + three.drafter_s))
    args = ["predict", "--model", "gemma4-26b-a4b", "--chip", "tpu-v5e-8", "--context", 1024, "--json"]
    d = mk_json(*args, "--speculate", 3, "--acceptance", 2.5, "--assistant", tmp_path)
    assert d["round_ms"] == pytest.approx(d["step_ms"] + d["drafter_ms"]) and d["drafter_ms"] > 0
    with pytest.raises(ValueError, match="does not draft for 'gemma4-31b'"):
        predict("gemma4-31b", "tpu-v5e-8", 1024, setup=VERIFYING_KERNEL.but(draft_tokens=3), acceptance=2, assistant=a)


# Gemma 4's assistant and speculative generation --------------------------------------------------------------
TARGETS = ("hf-snippet", "hf-odd-dense")  # MoE (window 8) and dense (window 7, odd widths)


@pytest.fixture(scope="module")
def pairs(hf_checkpoint, hf_assistant):
    """name -> (target cfg, target params, (assistant cfg, params), transformers' target, transformers' assistant)."""
    from mk.weights import load_assistant, load_checkpoint

    out = {}
    for name in TARGETS:
        folder, target = hf_checkpoint(name)
        a_folder, assistant = hf_assistant(name)
        cfg, params = load_checkpoint(folder)
        out[name] = cfg, params, load_assistant(a_folder, cfg), target, assistant
    return out


@pytest.mark.parametrize("name", TARGETS)
def test_assistant_step_matches_transformers_past_the_window(pairs, name):
    """One draft step from the target's prompt of 12 tokens (past the sliding window): the logits and the projected
    hidden state of transformers' assistant, fed the target's own hidden state, K/V and scaled embedding."""
    import jax.numpy as jnp
    import torch

    from mk.assistant import assistant_step
    from mk.reference import init_cache, prefill

    cfg, params, (a, ap), target, assistant = pairs[name]
    P = 12
    ids = np.arange(3, 3 + P)[None]
    with torch.no_grad():
        t_out = target(torch.tensor(ids), output_hidden_states=True, return_shared_kv_states=True, use_cache=False)
        h = t_out.hidden_states[-1][:, -1:]
        tok = t_out.logits[:, -1].argmax(-1, keepdim=True)
        emb = target.get_input_embeddings()(tok)
        want = assistant(inputs_embeds=torch.cat([emb, h], -1), position_ids=torch.tensor([[P]]),
                         shared_kv_states=t_out.shared_kv_states, attention_mask=None)  # fmt: skip
    logits, hidden, cache = prefill(params, cfg, ids, init_cache(cfg, 1, P + 4, draft_tokens=3), return_hidden=True)
    assert int(np.argmax(logits)) == tok.item()
    np.testing.assert_allclose(hidden, h[:, 0].numpy(), atol=1e-5, rtol=0)
    got_logits, got_hidden = assistant_step(ap, a, cfg, params["embed"], cache, jnp.asarray([tok.item()]), hidden,
                                            jnp.asarray([P]))  # fmt: skip
    np.testing.assert_allclose(got_logits, want.logits[:, 0].numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got_hidden, want.last_hidden_state[:, 0].numpy(), atol=1e-5, rtol=0)


RAGGED = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7, 6, 5, 4], [1, 2, 3], [4, 4, 4, 4, 4, 4]]


@pytest.mark.parametrize("name", TARGETS)
@pytest.mark.parametrize("drafter", ["ngram", "mtp"])
def test_speculative_generation_gives_greedy_tokens(pairs, name, drafter):
    """B = 4 ragged and B = 1, 3 drafts a round: the tokens of plain greedy decoding; each round emits its accepted
    drafts and one token of the target's, so a user's rounds and accepted drafts add up to its new tokens."""
    from mk.generate import generate, generate_speculative

    cfg, params, assistant, _, _ = pairs[name]
    N = 12
    for prompts in (RAGGED, RAGGED[1:2]):
        plain = generate(params, cfg, prompts, N)
        run = generate_speculative(
            params, cfg, prompts, N, drafter, 3, assistant=assistant if drafter == "mtp" else None
        )
        np.testing.assert_array_equal(run.tokens, plain)
        for b in range(len(prompts)):
            assert run.drafted[b] == 3 * run.rounds[b]
            assert run.rounds[b] + run.accepted[b] >= N - 1 >= run.rounds[b]
        if drafter == "ngram" and len(prompts) > 1:  # prompt lookup finds some of the repeated prompts' continuations
            assert sum(run.accepted) > 0


def test_a_drafter_that_is_the_target_has_every_draft_accepted(pairs):
    """Drafts that are the target's own greedy continuation (decoded beforehand) are always accepted: every round
    emits k + 1 tokens."""
    from mk.generate import generate, generate_speculative

    cfg, params, _, _, _ = pairs["hf-snippet"]
    N, K, prompts = 13, 3, RAGGED[:2]
    greedy = [p + t for p, t in zip(prompts, generate(params, cfg, prompts, N).tolist())]

    def the_target(history, k):
        whole = next(g for g in greedy if g[: len(history)] == history)
        return whole[len(history) : len(history) + k]

    run = generate_speculative(params, cfg, prompts, N, the_target, K)
    np.testing.assert_array_equal(run.tokens, [g[len(p) :] for g, p in zip(greedy, prompts)])
    assert run.rounds == [3, 3] and run.accepted == [9, 9]  # 12 tokens after the first: 3 rounds of 1 + 3


def test_cli_speculate_gives_the_tokens_without_it(pairs, hf_checkpoint, hf_assistant, mk_json):
    name = "hf-snippet"
    folder, _ = hf_checkpoint(name)
    a_folder, _ = hf_assistant(name)
    args = ["generate", "--checkpoint", folder, "--prompt-ids", "5,6,7,5,6,7;1,2,3,4", "--new-tokens", 9, "--json"]
    plain = mk_json(*args)
    mtp = mk_json(*args, "--speculate", "mtp", "--assistant", a_folder, "--draft-tokens", 2)
    ngram = mk_json(*args, "--speculate", "ngram")
    for run, k in ((mtp, 2), (ngram, 3)):
        assert run["tokens"] == plain["tokens"] and run["draft_tokens"] == k
        assert [d // k for d in run["drafted"]] == run["rounds"] and len(run["accepted"]) == 2


def test_an_assistant_for_another_target_is_refused(pairs):
    from mk.assistant_config import AssistantConfig, check_pair

    cfg, _, (a, _), _, _ = pairs["hf-snippet"]
    with pytest.raises(ValueError, match=r"backbone_hidden_size is 96, the target's hidden size 64.*released"):
        check_pair(AssistantConfig(a.decoder, 96), cfg)
    other = pairs["hf-odd-dense"][0]
    with pytest.raises(ValueError, match="does not draft for"):
        check_pair(a, other)


def test_speculation_refuses_bad_requests(pairs):
    from mk.generate import generate_speculative

    cfg, params, assistant, _, _ = pairs["hf-snippet"]
    with pytest.raises(ValueError, match="pass its checkpoint"):
        generate_speculative(params, cfg, [[1, 2]], 4, "mtp", 2)
    with pytest.raises(ValueError, match="unknown drafter 'eagle'"):
        generate_speculative(params, cfg, [[1, 2]], 4, "eagle", 2)
    from mk.engines import register_engine, unregister_engine
    from mk.reference import decode_step

    register_engine("decode-only", lambda cfg: lambda *args, **kw: decode_step(*args, **kw))
    try:
        with pytest.raises(ValueError, match="'decode-only' has no speculative verification step"):
            generate_speculative(params, cfg, [[1, 2]], 4, "ngram", 2, engine="decode-only")
    finally:
        unregister_engine("decode-only")
    with pytest.raises(ValueError, match="needs 8 cache positions"):
        generate_speculative(params, cfg, [[1, 2]], 4, "ngram", 3, max_len=6)


@pytest.mark.slow
def test_cli_megakernel_speculation_gives_greedy_tokens(hf_checkpoint, hf_assistant, mk_json):
    """``generate --engine megakernel --speculate mtp`` with the race detector on: 3 drafts a user verified in one
    kernel call a round (experts split over 8 chips, attention by heads; the MoE's shared MLP is the dense model's
    MLP, so a dense model's verification runs here too), the tokens of plain greedy decoding (the reference's, which
    the parity tests hold to transformers'), users of ragged prompts accepting their own counts. One chip's
    verification of a dense model's ngram drafts: notebook 10's parity cell (run by tests/test_notebooks.py)."""
    from mk.generate import generate
    from mk.weights import load_checkpoint

    name, prompts, new = "hf-eight-heads", RAGGED, 3
    folder, _ = hf_checkpoint(name)
    cfg, params = load_checkpoint(folder)
    plain = generate(params, cfg, prompts, new).tolist()
    got = mk_json("generate", "--checkpoint", folder, "--prompt-ids", ";".join(",".join(map(str, p)) for p in prompts),
                  "--new-tokens", new, "--engine", "megakernel", "--chips", 8, "--detect-races", "--json",
                  "--speculate", "mtp", "--draft-tokens", 3, "--assistant", hf_assistant(name)[0])  # fmt: skip
    assert got["tokens"] == plain and got["races"] is False
    assert all(r + a >= new - 1 for r, a in zip(got["rounds"], got["accepted"]))


def test_emitted_per_round_runs_from_one_to_k_plus_one():
    from mk.speculative import emitted_per_round

    assert emitted_per_round(0.0, 3) == 1 and emitted_per_round(1.0, 3) == 4
    assert emitted_per_round(0.5, 2) == pytest.approx(1.75)
    with pytest.raises(ValueError, match="probability"):
        emitted_per_round(1.5, 2)


def test_speculation_table_and_figure():
    """At acceptance 0 a round emits one token and is never faster than plain decoding; the MoE model's rows route to
    more distinct experts as K grows, so its step grows more than the dense model's; one line per case and rate."""
    from mk.analysis.sweeps import speculation_table
    from mk.figures import check_figure, provenance
    from mk.views.sweeps import speculation_figure

    models = ["gemma4-26b-a4b", "gemma4-31b"]
    t = speculation_table(models, ["tpu-v5e-8"], [1], [1, 3], [0.0, 0.9])
    assert (t[t.accept_rate == 0].speedup <= 1).all() and (t[t.accept_rate == 0.9].speedup > 1).all()
    moe, dense = (t[(t.model == m) & (t.draft_tokens == 3)].step_vs_plain.iloc[0] for m in models)
    assert moe > dense >= 1
    assert t[t.model == "gemma4-26b-a4b"].distinct_experts.is_monotonic_increasing
    fig = speculation_figure(t, models, "speculation")
    # checked as exported: the provenance footer placed and the legend hung below the title, as the notebook does
    assert len(fig.data) == 2 * 2 and not check_figure(provenance(fig, "modelled", "tpu-v5e-8", "mk.timing"))


def test_the_kernel_refuses_drafts_with_attention_split_by_positions_or_users():

    from mk.config import TINY_MOE
    from mk.kernel_setup import KernelSetup
    from mk.megakernel import build_call
    from mk.plan import build_plan

    # a window of 59: with 3 drafts its ring of 59 + 4 slots is one block of 16 for each of the 4 chips sharing a head
    cfg = TINY_MOE.replace(name="tiny-moe-8h-w59", num_heads=8, sliding_kv_heads=2, full_kv_heads=1, sliding_window=59)
    for split, batch in (("positions", 1), ("users", 8)):
        plan = build_plan(cfg, batch, 256, setup=KernelSetup(8, "split", attention_split=split, draft_tokens=3))
        with pytest.raises(ValueError, match=f"split by heads only, not by {split}"):
            build_call(plan)
