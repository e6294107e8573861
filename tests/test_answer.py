"""mk.analysis.answer: the measured answer, a row a cell both engines ran on the chip, each engine's fraction of the
measured limit from the bytes it reads, and the one sentence computed from the rows (the report opens with both)."""

import re

import pandas as pd
import pytest

from mk.analysis import answer, on_tpu
from mk.chips import measured_limit
from mk.sol import speed_of_light


@pytest.fixture(scope="module")
def steps():
    return on_tpu.tpu_steps()


@pytest.fixture(scope="module")
def table(steps):
    return answer.measured_answer(steps)


def test_a_row_a_cell_both_engines_ran_and_nothing_else(steps, table):
    one_chip = steps[steps.setup == "one chip"]
    both = one_chip.groupby(answer.CELL).engine.nunique()
    assert len(table) == int((both == 2).sum()) > 0
    assert not table.setup.str.endswith(on_tpu.STAND_IN).any()  # chip 0 of a slice has no XLA counterpart
    r = table.set_index(["model", "dtype", "context", "batch"]).loc[("llama-3.2-1b", "bf16", 1024, 1)]
    mk = one_chip[(one_chip.model == "llama-3.2-1b") & (one_chip.context == 1024) & (one_chip.batch == 1)]
    mk_ms, xla_ms = (mk[mk.engine == e].device_ms.iloc[0] for e in ("megakernel", "reference"))
    assert r.speedup == pytest.approx(xla_ms / mk_ms) and r.speedup_low <= r.speedup <= r.speedup_high


def test_each_engines_fraction_is_of_the_bytes_it_reads(table):
    """Like for like: XLA's INT8 rows are of the bf16 bytes it streams (it dequantized once), the kernel's of INT8's."""
    limit = measured_limit("tpu-v5e").bandwidth
    int8 = table[table.dtype == "bf16+int8-experts"].iloc[0]
    cfg = on_tpu.measured_config(int8)
    bf16 = speed_of_light(cfg, "tpu-v5e", int(int8.context), int(int8.batch), "bf16").bytes_per_token
    codes = speed_of_light(cfg, "tpu-v5e", int(int8.context), int(int8.batch), int8["dtype"]).bytes_per_token
    assert codes < bf16
    assert int8.xla_GB * 1e9 == pytest.approx(bf16) and int8.megakernel_GB * 1e9 == pytest.approx(codes)
    assert int8.xla_fraction_of_limit == pytest.approx(bf16 / (int8.xla_ms / 1e3) / limit)
    assert "dequantized" in int8.note
    # the same XLA step, the same fraction, in the bf16 cell and the INT8 cell (the issue: 0.804 against 0.642)
    same = table[(table.model == int8.model) & (table.context == int8.context) & (table.batch == int8.batch)]
    assert same.xla_fraction_of_limit.max() / same.xla_fraction_of_limit.min() == pytest.approx(
        same.xla_ms.max() / same.xla_ms.min(), rel=1e-9
    )


def test_a_fraction_past_the_limit_says_whether_its_interval_reaches_below_it():
    row = dict(device_fraction_of_limit=1.01, device_ms=10.0, device_high_ms=10.2)
    low = dict(device_fraction_of_limit=0.9, device_ms=10.0, device_high_ms=10.1)
    cell = dict(dtype="bf16", base_model="llama-3.2-1b", layers="all", model="llama-3.2-1b")

    def note(mk, xla):
        mk = pd.Series(dict(mk, device_low_ms=9.9, step_GB=1.0, date="2026-12-07", commit="x", kernel_revision=4,
                            kernel_digest="0123456789abcdef", base_model="llama-3.2-1b", layers="all"))  # fmt: skip
        xla = pd.Series(dict(xla, device_low_ms=9.9, step_GB=1.0, date="2026-12-07"))
        return answer._cell(cell, mk, xla)["note"]

    assert note(row, low) == f"megakernel: {answer.PAST_LIMIT[True]}"  # 1.01 x 10 / 10.2 < 1
    assert note(dict(row, device_high_ms=10.05), low) == f"megakernel: {answer.PAST_LIMIT[False]}"
    assert note(low, low) == ""


def test_the_sentence_is_computed_from_the_rows_it_states(table):
    text = answer.answer_sentence(table)
    groups = answer.answer_groups(table).set_index("group")
    for name in ("dense, one user, 1K", "eight users, 1K", "one user, 8K and longer", "MoE, one user, 1K"):
        r = groups.loc[name]
        assert f"{r.median_speedup:.2f}x ({r.min_speedup:.2f}-{r.max_speedup:.2f}x, {r.cells} cells)" in text, name
    # a changed measurement changes the sentence: no number in it is typed
    faster = table.assign(speedup=table.speedup * 1.5, speedup_low=table.speedup_low * 1.5)
    assert answer.answer_sentence(faster) != text
    dates = re.findall(r"\d{4}-\d\d-\d\d", text)
    assert dates and set(dates) <= set(table.date) | set(table.xla_date)
    assert answer.answer_sentence(table.iloc[:0]).startswith("No cell has been measured")


def test_the_sentence_compares_and_does_not_assert(table):
    """Whether the lead grows with users, and whether MoE's is less than dense's, is computed, not written."""
    grows = table.assign(speedup=[0.5 if b == 8 else s for b, s in zip(table.batch, table.speedup)])
    assert "with eight users it is 0.50x" in answer.answer_sentence(grows)
    assert "smaller than at one user and 1K" in answer.answer_sentence(grows)


def test_several_steps_a_call_come_from_the_run_that_timed_several(tmp_path):
    """A later run of the same cell at one step a call (the table's own grid) does not hide the run that timed it at
    several N side by side."""
    from mk.paths import TPU_CSV

    t = pd.read_csv(TPU_CSV)
    runs = on_tpu.steps_a_call()
    assert runs.steps_a_call.nunique() > 1
    later = t.loc[runs.index[:1]].assign(date="2099-01-01T00:00:00Z", steps_a_call=1)
    pd.concat([t, later]).to_csv(tmp_path / "tpu.csv", index=False)
    again = on_tpu.steps_a_call(tmp_path / "tpu.csv")
    assert again[["engine", "batch", "steps_a_call", "date"]].equals(runs[["engine", "batch", "steps_a_call", "date"]])
