"""data/independent.csv: published decode measurements (megakernels and general stacks, one to eight users) that the
timing model is held to. Every row names its page and quotes it; the loader (mk.published.independent_table) derives
the time per output token per user and refuses a malformed row, naming it."""

import csv
import math
import re

import pandas as pd
import pytest

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
        if r["config"]:
            assert (DATA_DIR / "configs" / r["config"] / "config.json").is_file(), r["key"]
        n = re.fullmatch(r".*-(\d+)", r["chip"])
        assert int(r["chips"]) == (int(n.group(1)) if n else 1), r["key"]


def test_no_point_is_fitted_to():
    with open(DATA_DIR / "timing.csv", newline="") as f:
        fitted = {r["fit_to"] for r in csv.DictReader(f) if r["fit_to"]}
    assert not fitted & set(RAW["key"])


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


def test_at_least_fifteen_points_are_predicted_and_the_rest_say_why(held):
    from mk.analysis.independent import TESTED

    tested = held[held.role == TESTED]
    assert len(tested) >= 15
    assert tested.error.to_numpy() == pytest.approx((tested.modelled_ms / tested.published_ms - 1).to_numpy())
    others = held[held.role != TESTED]
    assert others.modelled_ms.isna().all() and others.role.str.match(r"not modelled: \w").all()
    reasons = " ".join(others.role)
    assert "no config" in reasons and "nvfp4" in reasons and "link latency" in reasons


def test_the_implied_costs_meet_the_published_steps(held):
    """The cost per kernel (general stack) or per op (megakernel) a row reports, put into the model, gives the
    published step: what the model would have to charge, not a number fitted into it."""
    from mk.analysis.independent import TESTED
    from mk.paths import CONFIGS_DIR
    from mk.timing import predict

    for r in held[held.role == TESTED].itertuples():
        args = (str(CONFIGS_DIR / r.config), r.chip, r.context, r.batch, r.engine)
        if r.engine == "general":
            p = predict(*args, dtype=r.dtype, kernel_s=r.implied_kernel_us * 1e-6)
            assert p.step_s * 1e3 == pytest.approx(r.published_ms, rel=1e-9), r.key
        elif not math.isnan(r.implied_op_ns):
            p = predict(*args, dtype=r.dtype, op_overhead_s=r.implied_op_ns * 1e-9)
            assert p.step_s * 1e3 == pytest.approx(r.published_ms, rel=2e-3), r.key


def test_the_summary_and_the_misses_follow_the_errors(held):
    from mk.analysis.independent import MISS, TESTED, misses, summary

    tested = held[held.role == TESTED]
    s = summary(held)
    assert s["modelled"] == len(tested) and s["median_abs_error"] == pytest.approx(tested.error.abs().median())
    m = misses(held, 3.0)
    assert set(m.key) == set(tested[tested.error.abs() > MISS].key)
    assert m.why.str.len().gt(40).all()
