"""mk.analysis.moe_one_user: the MoE cells at one user on the chip, at one and at several steps a call, each engine's
fraction of the measured limit from the bytes it reads, what a layer takes past its bytes, and the sentence the report
gives; mk.measure.on_chip.Case.weight_slots, the kernel variant its probe rows came from."""

import re

import pandas as pd
import pytest

from mk.analysis import moe_one_user as moe, on_tpu
from mk.analysis.on_tpu import measured_config
from mk.chips import measured_limit
from mk.measure.on_chip import Case, variant
from mk.paths import TPU_CSV
from mk.plan import Tiles
from mk.sol import speed_of_light
from mk.units import MIB


@pytest.fixture(scope="module")
def rows():
    return moe.moe_one_user_rows()


def newest(rows):
    """Each model's, setup's and engine's newest row at each steps a call (the rows keep older kernel revisions')."""
    newer = rows.sort_values(["date", "kernel_revision"], kind="stable")  # a day's rows: the later revision newer
    return newer.groupby(["model", "setup", "engine", "steps_a_call"]).tail(1)


def test_rows_are_the_moe_cells_at_one_user_and_their_fractions_are_of_their_bytes(rows):
    assert {1, moe.SEVERAL} <= set(rows.steps_a_call) and len(rows) > 0
    limit = measured_limit("tpu-v5e").bandwidth
    for r in rows[rows.setup == "one chip"].itertuples():
        layers = r.model.split("[")[1].rstrip("]").lstrip(":") if "[" in r.model else "all"
        cfg = measured_config(dict(base_model=r.model.split("[")[0], layers=layers))
        assert cfg.num_experts > 0
        nbytes = speed_of_light(cfg, "tpu-v5e", 1024, 1, "bf16").bytes_per_token
        seconds = r.device_ms / 1e3
        assert r.step_GB == pytest.approx(nbytes / 1e9, rel=1e-3)
        assert r.fraction_of_limit == pytest.approx(nbytes / seconds / limit, rel=1e-3)
        assert r.past_bytes_us == pytest.approx((seconds - nbytes / limit) * 1e6, rel=1e-3, abs=0.05)
        assert r.error == pytest.approx(r.modelled_ms / r.device_ms - 1, abs=2e-3)
    # the model charges a step its share of the call's measured fixed time: one step a call all of it, 16 a sixteenth
    k = rows[(rows.engine == "megakernel") & (rows.setup == "one chip")]
    k = newest(k).pivot(index="model", columns="steps_a_call")
    floor = on_tpu.call_floor("tpu-v5e") * 1e3
    assert floor > 0  # measured: data/measured/tpu_dma.csv
    both = k.modelled_ms.dropna()
    assert len(both) >= 3
    share = floor * (1 - 1 / moe.SEVERAL)
    assert (both[1] - both[moe.SEVERAL]).tolist() == pytest.approx([share] * len(both), abs=2e-3)
    # measured: the newest kernel's MoE rows at one user land within 5% of the model, at one step a call and at 16
    # (revision 6 builds revision 5's default program: the rows of either are this kernel's)
    current = newest(rows[rows.engine == "megakernel"])
    current = current[current.kernel_revision >= 5]
    assert len(current) >= 5 and (current.error.abs() < 0.05).all(), current[["model", "steps_a_call", "error"]]


def test_a_cell_is_its_newest_rows_and_the_call_cost_only_within_one_run(rows, tmp_path):
    t = moe.moe_one_user(rows).set_index("model")
    q = newest(rows[(rows.model == "qwen3-30b-a3b[:8]") & (rows.engine == "megakernel")]).set_index("steps_a_call")
    assert t.loc["qwen3-30b-a3b[:8]", "megakernel_call_us"] == pytest.approx(
        (q.device_ms[1] - q.device_ms[moe.SEVERAL]) * 1e3
    )
    assert t.loc["qwen3-30b-a3b[:8]", "speedup_16"] > 1  # measured: the kernel ahead of XLA at 16 steps a call
    # a newer one-step row of the kernel, another day: it is the cell's, and the call's cost is no longer one run's
    stored = pd.read_csv(TPU_CSV)
    pick = (stored.model == "qwen3-30b-a3b[:8]") & (stored.engine == "megakernel") & (stored.steps_a_call == 1)
    later = stored[pick].assign(date="2099-01-01T00:00:00Z", device_step_ms=9.0)
    pd.concat([stored, later]).to_csv(tmp_path / "tpu.csv", index=False)
    again = moe.moe_one_user(moe.moe_one_user_rows(tmp_path / "tpu.csv")).set_index("model")
    assert again.loc["qwen3-30b-a3b[:8]", "megakernel_fraction_1"] < 0.5  # the newest row: 9 ms
    assert again.loc["qwen3-30b-a3b[:8]"].isna()["megakernel_call_us"]


def test_a_layer_past_its_bytes_is_the_difference_of_two_cuts_and_the_call_cancels(rows):
    got = moe.layers_past_bytes(rows).set_index(["model", "steps_a_call"])
    one = rows[(rows.engine == "megakernel") & (rows.setup == "one chip")]
    k = one.set_index(["model", "steps_a_call", "kernel_revision"]).past_bytes_us
    gemma = got.loc[("gemma4-26b-a4b", moe.SEVERAL)]
    assert gemma.layers == 5
    r = gemma.kernel_revision  # the newest revision that timed both cuts, whichever timed one of them since
    assert r == max(set(one[one.model == "gemma4-26b-a4b[:7]"].kernel_revision)
                    & set(one[one.model == "gemma4-26b-a4b[sliding+full]"].kernel_revision))  # fmt: skip
    assert gemma.us_a_layer == pytest.approx(
        (k[("gemma4-26b-a4b[:7]", moe.SEVERAL, r)] - k[("gemma4-26b-a4b[sliding+full]", moe.SEVERAL, r)]) / 5
    )
    # measured: the same layers at one step a call (another revision, days before) give nearly the same, what a call
    # adds to a step cancelling in the difference; and a model whose cuts ran on two revisions gives none
    assert got.loc[("gemma4-26b-a4b", 1)].us_a_layer == pytest.approx(gemma.us_a_layer, abs=1.0)
    q = got.loc[("qwen3-30b-a3b", moe.SEVERAL)]  # measured: both its cuts at 16 steps a call, one revision
    cut = {n: k[(f"qwen3-30b-a3b[:{n}]", moe.SEVERAL, q.kernel_revision)] for n in (3, 8)}
    assert q.layers == 5 and q.us_a_layer == pytest.approx((cut[8] - cut[3]) / 5)
    older = rows.assign(
        kernel_revision=[3 if m == "qwen3-30b-a3b[:3]" else r for m, r in zip(rows.model, rows.kernel_revision)]
    )
    assert "qwen3-30b-a3b" not in set(moe.layers_past_bytes(older).model)


def test_the_sentence_states_the_tables_own_ranges(rows):
    table = moe.moe_one_user(rows)
    layers = moe.layers_past_bytes(rows)
    text = moe.moe_sentence(table, layers)
    one = table[table.setup == "one chip"]
    said = re.search(r"reads ([\d.]+)-([\d.]+) of the measured limit at one step a call and ([\d.]+)-([\d.]+)", text)
    assert said, text
    lo1, hi1, lo16, hi16 = map(float, said.groups())
    assert (lo1, hi1) == (round(one.megakernel_fraction_1.min(), 3), round(one.megakernel_fraction_1.max(), 3))
    assert (lo16, hi16) == (round(one.megakernel_fraction_16.min(), 3), round(one.megakernel_fraction_16.max(), 3))
    assert f"({len(one)} cells, one chip)" in text
    gemma = layers[(layers.model == "gemma4-26b-a4b") & (layers.steps_a_call == moe.SEVERAL)].us_a_layer.iloc[0]
    assert f"gemma4-26b-a4b's {gemma:.1f} us (5 layers, 16 steps a call)" in text
    assert "No MoE cell" in moe.moe_sentence(table.iloc[0:0], layers.iloc[0:0])


def test_what_the_gap_was_and_is_sets_the_newest_revision_beside_the_one_before(rows):
    changes = moe.revision_changes(rows).set_index("model")
    k = rows[(rows.engine == "megakernel") & (rows.steps_a_call == moe.SEVERAL) & (rows.setup == "one chip")]
    for model, r in changes.iterrows():  # the newest program beside the one before, each by the revision that built it
        mine = k[k.model == model].sort_values(["kernel_revision", "date"])
        now = mine.iloc[-1]
        was = mine[mine.program_digest != now.program_digest].iloc[-1]

        def built(row, mine=mine):
            return mine[mine.program_digest == row.program_digest].kernel_revision.min()

        assert (r.revision_was, r.revision_is, r.timed_under) == (built(was), built(now), now.kernel_revision)
        assert (r.fraction_was, r.fraction_is) == (was.fraction_of_limit, now.fraction_of_limit)
    # measured: revision 8 left qwen3-30b-a3b[:8]'s program as revision 5 built it, and timed it again
    q = k[k.model == "qwen3-30b-a3b[:8]"].set_index("kernel_revision").program_digest
    assert q[8] == q[5] != q[4] and changes.loc["qwen3-30b-a3b[:8]", "timed_under"] == 8
    # measured: revision 5 left the 26B-A4B's program as revision 4 built it; its rows under both are no change
    same = k[k.model == "gemma4-26b-a4b[:7]"]
    assert same.kernel_revision.nunique() > 1 == same.program_digest.nunique()
    assert "gemma4-26b-a4b[:7]" not in changes.index
    # measured: revision 5's head (no 0.5 MiB tiles) took Qwen3-30B-A3B's first 8 layers past 0.97 of the limit
    q = changes.loc["qwen3-30b-a3b[:8]"]
    assert (q.revision_was, q.revision_is) == (4, 5) and q.fraction_was < 0.95 < 0.97 < q.fraction_is
    text = moe.moe_sentence(moe.moe_one_user(rows), moe.layers_past_bytes(rows), moe.revision_changes(rows))
    said = f"qwen3-30b-a3b[:8] from {q.fraction_was:.3f} (revision 4) to {q.fraction_is:.3f} (revision 5, timed again"
    assert said + " under 8)" in text
    # the cell's table takes its newest rows
    t = moe.moe_one_user(rows).set_index("model")
    assert t.loc["qwen3-30b-a3b[:8]", "megakernel_fraction_16"] == q.fraction_is


def test_the_report_gives_the_sentence_only_from_an_export(rows, tmp_path):
    from mk.report import MOE, _moe_html

    assert _moe_html(tmp_path) == ""
    rows.to_csv(tmp_path / f"{MOE}.csv", index=False)
    html = _moe_html(tmp_path)
    assert "of the measured limit at one step a call" in html and f"{MOE}.csv" in html
    assert "newest revision moved" in html and "gpt-oss-20b[:2] from" in html and "qwen3-30b-a3b[:8] from" in html


def test_a_kernel_variant_says_its_tiles_and_the_default_says_nothing():
    deeper, smaller = Tiles(slots=4), Tiles(weight_tile_bytes=MIB, slots=3)
    case = Case("tiny-moe", tiles=(Tiles(), deeper, smaller))
    assert case.setup_label == case.setup_label_at(Tiles()) == case.setup_label_at(None) == "one chip"
    assert case.setup_label_at(deeper) == "one chip; 4 slots a weight buffer"
    assert case.setup_label_at(smaller) == "one chip; 3 slots a weight buffer; weight tiles of 1 MiB"
    assert case.timed() == (
        ("reference", None),
        ("megakernel", Tiles()),
        ("megakernel", deeper),
        ("megakernel", smaller),
    )
    assert variant("megakernel", Tiles()) == variant("megakernel", None) == "megakernel"
    assert variant("megakernel", deeper) == "megakernel[4 slots a weight buffer]"
    stand_in = Case("tiny-moe", setup="workbook")
    assert stand_in.setup_label_at(deeper).endswith("; 4 slots a weight buffer; loopback stand-in")
