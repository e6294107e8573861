"""data/independent.csv: published decode measurements (megakernels and general stacks, one to eight users) that the
timing model is held to. Every row names its page and quotes it; the loader (mk.published.independent_table) derives
the time per output token per user and refuses a malformed row, naming it."""

import csv
import math
import re

import pandas as pd
import pytest
from conftest import PIN_STEP, Pin

from mk.config import PRESETS
from mk.paths import DATA_DIR, INDEPENDENT_CSV
from mk.published import (
    ENGINES,
    INDEPENDENT_COLUMNS,
    independent_table,
    quote_has_value,
    read_independent,
)

RAW = pd.read_csv(INDEPENDENT_CSV, dtype=str, keep_default_na=False)


def digits_in_quote(quote: str, value: str) -> bool:
    """The check of this test file, written apart from the loader's: the value's digits appear in the quote (thousands
    separators dropped on both sides), or a small whole number is spelt out."""
    q = re.sub(r"(?<=\d),(?=\d{3})", "", quote)
    v = value.replace(",", "")
    words = {"1": "one", "2": "two", "4": "four", "8": "eight"}
    return v in q or (v in words and words[v] in q.lower())


def test_the_file_has_at_least_fifteen_points_and_every_column():
    assert list(RAW.columns) == list(INDEPENDENT_COLUMNS)
    assert len(RAW) >= 15


def test_every_row_has_a_url_and_a_quote_that_contains_its_value():
    for r in RAW.to_dict("records"):
        assert r["url"].startswith(("https://", "http://")), r["key"]
        assert r["quote"].strip(), r["key"]
        assert digits_in_quote(r["quote"], r["value"]), (r["key"], r["value"], r["quote"])


def test_keys_are_unique_and_snake_case():
    assert RAW["key"].is_unique
    assert all(re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", k) for k in RAW["key"])


def test_engines_batches_and_the_derived_step():
    t = independent_table()
    assert set(t["engine"]) == set(ENGINES)  # both kinds of stack are there
    assert t["batch"].between(1, 8).all()
    assert (t["step_ms"] > 0).all() and t["step_ms"].notna().all()
    assert (t["chips"] >= 1).all()


def test_each_quantity_converts_to_a_time_per_output_token():
    t = independent_table().set_index("key")
    for key, r in t.iterrows():
        if r["quantity"] == "tokens_per_s":
            assert r["step_ms"] == pytest.approx(1000 / r["value"]), key
        elif r["quantity"] == "request_latency":
            per = {"s": 1000, "ms": 1}[r["unit"]]
            assert r["step_ms"] == pytest.approx(r["value"] * per / r["output_tokens"]), key
        else:
            assert r["step_ms"] == pytest.approx(r["value"] * {"ms": 1, "us": 1e-3, "s": 1e3}[r["unit"]]), key
    # spot checks by hand: 680 us; 111 tok/s; 17.236 s for 2048 tokens
    assert t.loc["hazy_llama_3_2_1b_b200_megakernel", "step_ms"] == pytest.approx(0.68)
    assert t.loc["trtllm_deepseek_r1_b200x8_no_mtp", "step_ms"] == pytest.approx(9.009, rel=1e-3)
    assert t.loc["rocm_vllm_llama_3_1_70b_mi300x8_fp8_bs1", "step_ms"] == pytest.approx(8.416, rel=1e-3)


def test_named_configs_exist_and_slices_match_their_chip_count():
    for r in RAW.to_dict("records"):
        if r["config"]:  # a folder of data/configs, or a preset (Gemma 4's)
            assert r["config"] in PRESETS or (DATA_DIR / "configs" / r["config"] / "config.json").is_file(), r["key"]
        n = re.fullmatch(r".*-(\d+)", r["chip"])
        assert int(r["chips"]) == (int(n.group(1)) if n else 1), r["key"]


H100_MEGAKERNEL = "hazy_llama_3_2_1b_h100_megakernel"  # the one point a constant is fitted to (the GPU cost per op)


def test_only_the_h100_megakernel_point_is_fitted_to():
    with open(DATA_DIR / "timing.csv", newline="") as f:
        fitted = {r["fit_to"]: r for r in csv.DictReader(f) if r["fit_to"]}
    assert fitted.keys() & set(RAW["key"]) == {H100_MEGAKERNEL}
    row = fitted[H100_MEGAKERNEL]
    assert (row["name"], row["applies_to"], row["kind"], row["value"]) == ("op_overhead_s", "gpu", "fitted", "")


def test_the_quote_check_reads_the_pages_own_formatting():
    assert quote_has_value("| 8 | 4.46 | 1,793 | 4.86 |", "1793")
    assert quote_has_value("in under one millisecond on a GPU", "1")
    assert quote_has_value("Mean TPOT (ms): 7.28", "7.28")
    assert not quote_has_value("Mean TPOT (ms): 17.28", "7.28")  # not inside a longer number
    assert not quote_has_value("Mean TPOT (ms): 7.285", "7.28")
    assert not quote_has_value("a latency of 12 ms", "1.2")


GOOD = {
    "key": "a_point",
    "model": "Qwen/Qwen3-8B",
    "config": "qwen3-8b",
    "chip": "h100",
    "chips": "1",
    "engine": "general",
    "stack": "vLLM 0.11.0",
    "batch": "1",
    "prompt_tokens": "",
    "output_tokens": "",
    "dtype": "bf16",
    "quantity": "step_ms",
    "value": "7.28",
    "unit": "ms",
    "date": "",
    "url": "https://example.org/page",
    "quote": "Mean TPOT (ms): 7.28",
    "note": "",
}
BAD = {
    "unknown engine": {"engine": "tensorrt"},
    "unknown quantity": {"quantity": "throughput"},
    "unknown unit": {"unit": "tok/s"},
    "missing url": {"url": ""},
    "missing quote": {"quote": ""},
    "quote without the value": {"quote": "Mean TPOT (ms): 7.38"},
    "batch past eight": {"batch": "16"},
    "batch not a number": {"batch": "one"},
    "slice against its count": {"chip": "h100-8", "chips": "4"},
    "unknown config": {"config": "no-such-model"},
    "latency without output tokens": {"quantity": "request_latency", "unit": "s"},
    "key not snake_case": {"key": "A-Point"},
}


def write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=INDEPENDENT_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


def test_a_well_formed_file_reads(tmp_path):
    other = dict(GOOD, key="b_point", quantity="tokens_per_s", value="1,000", unit="tok/s", quote="1,000 tok/s")
    t = read_independent(write(tmp_path / "ok.csv", [GOOD, other]))
    assert list(t["step_ms"]) == pytest.approx([7.28, 1.0])


@pytest.mark.parametrize("what", BAD)
def test_the_loader_refuses_a_malformed_row_naming_it(tmp_path, what):
    bad = dict(GOOD, key="the_bad_one", **{k: v for k, v in BAD[what].items() if k != "key"})
    if "key" in BAD[what]:
        bad["key"] = BAD[what]["key"]
    path = write(tmp_path / "bad.csv", [dict(GOOD), bad])
    with pytest.raises(ValueError, match=rf"bad\.csv line 3 \(key '{re.escape(bad['key'])}'\)"):
        read_independent(path)


def test_the_loader_refuses_a_duplicate_key(tmp_path):
    path = write(tmp_path / "dup.csv", [GOOD, dict(GOOD)])
    with pytest.raises(ValueError, match=r"line 3 \(key 'a_point'\): duplicate key, first on line 2"):
        read_independent(path)


def test_the_loader_refuses_a_file_without_a_column(tmp_path):
    path = tmp_path / "short.csv"
    pd.DataFrame([GOOD]).drop(columns=["quote"]).to_csv(path, index=False)
    with pytest.raises(ValueError, match="quote"):
        read_independent(path)


# The timing model held to these points (mk.analysis.independent) --------------------------------------------------
@pytest.fixture(scope="module")
def held():
    from mk.analysis import independent

    return independent.predictions()


# Each point the model predicts (role TESTED) held to a band on its error (modelled / published - 1) or pinned to it.
# A general stack on a GPU: its bytes at the read rate (the data sheet times the v5e's measured 91%) plus its kernels at
# the cost fitted to vLLM's Gemma 4 step on an H100 (3.0 us), a quarter to a half of the modelled step. These steps
# imply 1.7-3.7 us a kernel (-42% to +23% of the fit): a fifth of a step whose kernels are half of it; the rate the
# stack streams at adds a few percent: within 25%.
GPU_GENERAL = (-0.25, 0.25)
# A GPU megakernel: its bytes at the read rate (91% of the spec, where the megakernels published stream at 74-78% of it:
# Hazy's H100, MPK's A100, the write-up's v5e), so the model up to a fifth fast; slower only by the per-op cost fitted
# to Hazy's H100 kernel, which another kernel on a step that is mostly bytes pays little of: within 20%.
GPU_MEGAKERNEL = (-0.20, 0.20)
BANDS = {
    "mpk_qwen3_8b_a100_megakernel": GPU_MEGAKERNEL,
    **dict.fromkeys(
        [
            "mpk_paper_vllm_sglang_qwen3_8b_a100",
            *(f"gpustack_vllm_qwen3_8b_h100_bs{b}" for b in (1, 2, 4, 8)),
            "gpustack_sglang_qwen3_8b_h100_bs4",
            "gpustack_trtllm_qwen3_8b_h100_bs4",
            "gpustack_sglang_qwen3_8b_fp8_h100_bs4",
            *(f"nim_llama_3_3_70b_h100x2_fp8_{c}" for c in ("c1_isl5000", "c5_isl5000", "c1_isl500")),
            # whole requests: their per-token time holds the prefill of a 32-token prompt, under 1% of 128 steps
            "vllm_ci_llama_3_8b_h200_bs8",
            "vllm_ci_llama_3_70b_h200x4_bs8",
            "vllm_ci_mixtral_8x7b_h200x2_bs8",
        ],
        GPU_GENERAL,
    ),
}
# The points the model misses (beyond mk.analysis.independent.MISS, mk.analysis.independent.misses says why in its
# numbers), each pinned to its error when pinned (again on 2026-12-07, the measured limit risen from 748.0 to 753.3
# GB/s), a whole step's tolerance (conftest.PIN_STEP), beside its reason.
PINS = {
    # the per-op cost fitted to the H100 is a fixed cost: a faster chip (the B200) feels it more
    "hazy_llama_3_2_1b_b200_megakernel": Pin(+0.3044, PIN_STEP),
    # plain JAX/XLA on a v5e-8 at 16K and 32K: slower than its bytes and the per-kernel cost fitted to vLLM's TPU step
    "yliu95_gemma4_31b_v5e8_bs1": Pin(-0.3325, PIN_STEP),
    "yliu95_gemma4_26b_a4b_v5e8_bs1_32k": Pin(-0.6346, PIN_STEP),
}
# The median |error| over every point predicted: at most 14%. It moves half a point for each 1% of the read rate (the
# GPUs' fraction of their spec is the v5e's measured one), so a change worth 4% at most points at once fails here,
# where the bands (a quarter a point) would not.
MEDIAN_CEILING = 0.14


def test_every_predicted_point_is_banded_or_pinned(held):
    from mk.analysis.independent import MISS, TESTED

    tested = set(held.key[held.role == TESTED])
    assert set(BANDS) | set(PINS) == tested and not set(BANDS) & set(PINS), "argue a band or pin for each new point"
    assert all(-MISS <= low and high <= MISS for low, high in BANDS.values())  # a banded point is one the model meets


def test_each_point_lands_in_its_band_or_holds_its_pin(held):
    error = held.set_index("key").error
    out = {
        k: f"{error[k]:+.1%} outside [{b[0]:+.0%}, {b[1]:+.0%}]"
        for k, b in BANDS.items()
        if not b[0] <= error[k] <= b[1]
    }
    out |= {k: p.against(error[k]) for k, p in PINS.items() if not p.holds(error[k])}
    assert not out, (
        f"the model moved at these independent points (a pin that moves: re-check why, then pin again): {out}"
    )


def test_the_median_error_stays_under_its_ceiling(held):
    from mk.analysis.independent import summary

    median = summary(held)["median_abs_error"]
    assert median <= MEDIAN_CEILING, (
        f"median |error| {median:.1%} over the independent points, ceiling {MEDIAN_CEILING:.0%}"
    )


def test_at_least_fifteen_points_are_predicted_and_the_rest_say_why(held):
    from mk.analysis.independent import TESTED

    tested = held[held.role == TESTED]
    assert len(tested) >= 15
    assert tested.error.to_numpy() == pytest.approx((tested.modelled_ms / tested.published_ms - 1).to_numpy())
    others = held[(held.role != TESTED) & (held.key != H100_MEGAKERNEL)]
    assert others.modelled_ms.isna().all() and others.role.str.match(r"not modelled: \w").all()
    reasons = " ".join(others.role)
    assert "no config" in reasons and "nvfp4" in reasons and "link latency" in reasons


def test_one_engines_points_are_those_rows_of_every_point(held):
    """Notebook 11 predicts the megakernels' points alone: the same rows as among every point's."""
    from mk.analysis import independent

    mega = independent.predictions(engine="megakernel")
    assert len(mega) and (mega.engine == "megakernel").all()
    every = held[held.engine == "megakernel"].reset_index(drop=True)
    pd.testing.assert_frame_equal(mega.reset_index(drop=True), every)


def test_the_implied_costs_meet_the_published_steps(held):
    """The cost per kernel (general stack) or per op (megakernel) a row reports, put into the model, gives the
    published step: what the model would have to charge, not a number fitted into it."""
    from mk.analysis.independent import TESTED
    from mk.timing import GivenCosts, predict

    for r in held[held.role == TESTED].itertuples():
        args = (r.config, r.chip, r.context, r.batch, r.engine)
        if r.engine == "general":
            p = predict(*args, dtype=r.dtype, costs=GivenCosts(kernel_s=r.implied_kernel_us * 1e-6))
            assert p.step_s * 1e3 == pytest.approx(r.published_ms, rel=1e-9), r.key
        elif not math.isnan(r.implied_op_ns):
            p = predict(*args, dtype=r.dtype, costs=GivenCosts(op_overhead_s=r.implied_op_ns * 1e-9))
            assert p.step_s * 1e3 == pytest.approx(r.published_ms, rel=2e-3), r.key


def test_the_summary_and_the_misses_follow_the_errors(held):
    from mk.analysis.independent import MISS, TESTED, misses, summary

    tested = held[held.role == TESTED]
    s = summary(held)
    assert s["modelled"] == len(tested) and s["median_abs_error"] == pytest.approx(tested.error.abs().median())
    m = misses(held, 3.0)
    assert set(m.key) == set(tested[tested.error.abs() > MISS].key)
    assert m.why.str.len().gt(40).all()


# The GPU megakernel's cost per op: fitted to the H100 point, tested on the others (mk.timing.fitted) ---------------
def test_the_fitted_op_cost_meets_the_h100_points_published_step():
    from mk.timing import GivenCosts, op_overhead_cost, predict
    from mk.timing.fitted import context_of, point_prediction

    row = independent_table().set_index("key", drop=False).loc[H100_MEGAKERNEL]
    cost = op_overhead_cost("gpu")
    assert cost > 0
    p = point_prediction(row)  # no cost given: the fitted one
    assert p.step_s * 1e3 == pytest.approx(row["step_ms"], rel=1e-3)
    assert p.constants["op_overhead_s"] == f"{cost:.3g} (fitted to {H100_MEGAKERNEL})"
    assert f"fitted to {H100_MEGAKERNEL}" in p.models
    # without it the model is well off the point, so meeting it is the fit's doing
    zero = predict(str(DATA_DIR / "configs" / row["config"]), row["chip"], context_of(row)[0], int(row["batch"]),
                   dtype=row["dtype"], costs=GivenCosts(0.0, 0.0))  # fmt: skip
    assert zero.step_s * 1e3 < 0.95 * row["step_ms"]
    assert (
        predict("llama-3.2-1b", "b200", 96, costs=GivenCosts(op_overhead_s=cost))
        .constants["op_overhead_s"]
        .endswith("(given)")
    )


def test_a_tpu_keeps_the_assumed_op_cost_and_a_gpu_gets_the_fitted_one():
    from mk.timing import assumed_costs, constant, op_overhead_cost

    assert assumed_costs("tpu") == {"op_overhead_s": 0.0, "dma_issue_s": 0.0}
    assert constant("op_overhead_s", "tpu").kind == "assumed"
    assert assumed_costs("gpu") == {"op_overhead_s": op_overhead_cost("gpu"), "dma_issue_s": 0.0}
    assert assumed_costs("gpu", op_overhead_s=1e-7)["op_overhead_s"] == 1e-7  # a given cost, not the fit


def test_the_fit_is_cached_and_does_not_call_itself():
    from mk.timing import op_overhead_cost

    first = op_overhead_cost("gpu")
    op_overhead_cost.cache_clear()
    assert op_overhead_cost("gpu") == first  # fitted afresh, without recursing into itself
    assert op_overhead_cost.cache_info().currsize == 1
    op_overhead_cost("gpu")
    assert op_overhead_cost.cache_info().hits >= 1


def test_the_h100_point_is_fitted_and_the_other_gpu_megakernels_test_it(held):
    from mk.analysis.independent import FITTED, TESTED, gpu_op_cost, summary

    roles = held.set_index("key").role
    assert roles[H100_MEGAKERNEL].startswith(FITTED)
    assert roles["hazy_llama_3_2_1b_b200_megakernel"] == roles["mpk_qwen3_8b_a100_megakernel"] == TESTED
    assert summary(held)["modelled"] == (held.role == TESTED).sum()  # the fitted point is not counted as a test
    table, s = gpu_op_cost(held)
    assert set(table.key) == {H100_MEGAKERNEL, "hazy_llama_3_2_1b_b200_megakernel", "mpk_qwen3_8b_a100_megakernel"}
    assert (s["points"], s["tests"], s["fit_to"]) == (3, 2, H100_MEGAKERNEL)
    assert table.set_index("key")["stack"].to_dict() == held.set_index("key").loc[table.key, "stack"].to_dict()
    fit = table.set_index("key").loc[H100_MEGAKERNEL]
    assert fit.error_after == pytest.approx(0.0, abs=1e-3) and fit.error_before < -0.05
    tests = table[table.role == TESTED]
    assert s["median_after"] == pytest.approx(tests.error_after.abs().median())
    assert s["median_after"] != pytest.approx(table.error_after.abs().median())  # the fitted point left out
    assert s["median_before"] == pytest.approx(table.error_before.abs().median())
    assert s["median_before_tests"] == pytest.approx(tests.error_before.abs().median())
    # before: no per-op or per-DMA cost; after: the fitted one, which only adds time
    assert (table.after_ms > table.before_ms).all()
    assert table.error_before.to_numpy() == pytest.approx((table.before_ms / table.published_ms - 1).to_numpy())


def test_the_after_median_counts_the_test_points_only():
    """On a made-up table: a fitted point with a large error would move the median if it were counted."""
    from mk.analysis.independent import FITTED, TESTED, gpu_op_cost

    def point(key, chip, role, published, before, after):
        err = after / published - 1
        return dict(key=key, chip=chip, stack="s", engine="megakernel", role=role, published_ms=published,
                    no_op_cost_ms=before, modelled_ms=after, error=err, implied_op_ns=1.0)  # fmt: skip

    t = pd.DataFrame(
        [
            point("fit", "h100", f"{FITTED}: op_overhead_s (gpu)", 1.0, 0.5, 3.0),
            point("a", "b200", TESTED, 1.0, 0.5, 1.1),
            point("b", "a100-40gb", TESTED, 1.0, 0.5, 1.3),
            point("tpu", "tpu-v5e-8", TESTED, 1.0, 0.1, 9.0),  # not a GPU: left out
            dict(point("gen", "h100", TESTED, 1.0, 0.5, 5.0), engine="general"),  # not a megakernel: left out
        ]
    )
    table, s = gpu_op_cost(t)
    assert list(table.key) == ["fit", "a", "b"]
    assert s["median_after"] == pytest.approx(0.2)  # |0.1| and |0.3|; with the fitted point it would be 0.3
    assert s["median_before"] == s["median_before_tests"] == pytest.approx(0.5)
