"""mk.analysis.stacks: the two general stacks named apart, XLA's compiled step (measured on the chip) and the vLLM-like
serving stack (modelled), and the comparison of the two where the chip measured the same model."""

import pandas as pd
import pytest

from mk.analysis import answer, stacks, verdict as vd
from mk.chips import get_chip, measured_limit
from mk.timing import kernel_cost


@pytest.fixture(scope="module")
def table():
    return answer.measured_answer()


def test_the_modelled_stack_says_its_fitted_cost_and_the_measured_one_its_chip():
    words = stacks.vllm_like_words("tpu")
    assert "vLLM-like" in words and "modelled" in words and f"{kernel_cost('tpu') * 1e6:.2f} us" in words
    assert "measured" in stacks.XLA_STACK and "XLA" in stacks.XLA_STACK


def test_a_verdict_one_chip_measured_carries_its_point_against_xla(table):
    got = stacks.measured_verdicts(table).set_index("key")
    assert set(got.index) == set(stacks.MEASURABLE_VERDICTS)
    ver = vd.verdict_table(measured=got.reset_index()).set_index("key")
    for key, (model, layers, context, batch) in stacks.MEASURABLE_VERDICTS.items():
        cell = table[(table.base_model == model) & (table.layers == layers) & (table.context == context)
                     & (table.batch == batch) & (table.dtype == "bf16")].iloc[0]  # fmt: skip
        assert ver.measured[key] == cell.speedup and "not vLLM" in ver.measured_against[key]
    assert ver.measured.notna().sum() == len(stacks.MEASURABLE_VERDICTS)  # the others: nothing a chip measured


def test_both_stacks_on_one_denominator_and_the_sentence_says_where_the_model_lands(table):
    rule = vd.rule_of_thumb(["gemma4-31b"], [1024], [1])
    t = stacks.stacks_on_chip(rule, table)
    r, same = t.iloc[0], rule[rule.same_hardware].iloc[0]
    chip = same.general_on.split(" ")[0]
    to_limit = get_chip(chip).per_chip_bandwidth / measured_limit(chip).bandwidth
    assert r.vllm_like_fraction_of_limit == pytest.approx(same.general_fraction_of_sol * to_limit)
    cuts = table[(table.base_model == "gemma4-31b") & (table.context == 1024) & (table.batch == 1)
                 & (table.dtype == "bf16")]  # fmt: skip
    assert (r.measured_min_speedup, r.measured_max_speedup) == (cuts.speedup.min(), cuts.speedup.max())
    text = stacks.stacks_sentence(t)
    where = "above" if r.modelled_speedup > r.measured_max_speedup else "below"
    if r.measured_min_speedup <= r.modelled_speedup <= r.measured_max_speedup:
        where = "inside"
    assert f"the modelled win is {where} the measured range" in text
    inside = t.assign(modelled_speedup=(t.measured_min_speedup + t.measured_max_speedup) / 2)
    assert "the modelled win is inside the measured range" in stacks.stacks_sentence(inside)
    assert stacks.stacks_sentence(pd.DataFrame()) == "No case of the rule of thumb was measured on the chip."
