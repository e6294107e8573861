"""Notebook 06's sweeps: the engines and the speed of light by context, batch, placement and chip, the published
points read from data/published.csv (fractions drawn as fraction x the modelled speed of light), the KV read per
chip, the published points against the model, and figures whose every series can be seen."""

import os
import shutil

import pytest

from mk.analysis import sweeps
from mk.chips import get_chip
from mk.config import get_config
from mk.kernel_setup import WORKBOOK_KERNEL, WRITE_UP_KERNEL, AttentionSplit, Placement
from mk.published import published
from mk.routing import expected_distinct_experts
from mk.sol import speed_of_light
from mk.timing import MODELLED, predict
from mk.views import sweeps as views

TINY = ["tiny-moe", "tiny-dense"]
FULL = ["gemma4-26b-a4b", "gemma4-31b"]


@pytest.fixture(scope="module")
def tiny_table():
    return sweeps.engine_table(TINY, [16, 64], [1, 3])


def test_engine_table_has_every_series_context_and_batch(tiny_table):
    t = tiny_table
    assert len(t) == len(TINY) * 6 * 2 * 2
    roles = {"megakernel", sweeps.WORKBOOK, "general baseline", "general same chip", sweeps.SOL, sweeps.SOL_BASELINE}
    assert set(t.role) == roles
    on_the_baseline = t.role.isin(["general baseline", sweeps.SOL_BASELINE])  # each line beside its own bound
    assert set(t[on_the_baseline].chip) == {"h100"} and set(t[~on_the_baseline].chip) == {"tpu-v5e-8"}
    sol = t[t.engine == sweeps.SOL]
    assert (sol.fraction_of_sol == 1).all() and sol.kind.str.contains("mk.sol").all()
    engines = t[t.engine != sweeps.SOL]
    assert ((engines.fraction_of_sol > 0) & (engines.fraction_of_sol <= 1)).all()
    assert (engines.kind == MODELLED).all()
    assert t.tokens_per_s_total.to_numpy() == pytest.approx((t.tokens_per_s * t.batch).to_numpy())
    moe = t[t.model == "tiny-moe"]
    cfg = get_config("tiny-moe")
    assert (
        moe.expected_experts == moe.batch.map(lambda b: expected_distinct_experts(cfg.num_experts, cfg.top_k, b))
    ).all()
    assert t[t.model == "tiny-dense"].expected_experts.isna().all()  # no experts: blank, never "0 experts"
    assert (t[t.model == "tiny-dense"].placement == "-").all()  # a dense model has no experts to place


def test_engine_rows_are_the_timing_models_predictions(tiny_table):
    r = tiny_table.set_index(["model", "role", "context", "batch"]).loc[("tiny-moe", "megakernel", 64, 3)]
    p = predict("tiny-moe", "tpu-v5e-8", 64, 3, "megakernel", setup=WRITE_UP_KERNEL)  # as published
    assert r.tokens_per_s == pytest.approx(p.tokens_per_s) and r.setup == WRITE_UP_KERNEL.name
    w = tiny_table.set_index(["model", "role", "context", "batch"]).loc[("tiny-moe", sweeps.WORKBOOK, 64, 3)]
    assert w.setup == WORKBOOK_KERNEL.name and WORKBOOK_KERNEL.name in w.series  # every megakernel row names its setup
    s = tiny_table.set_index(["model", "role", "context", "batch"]).loc[("tiny-dense", sweeps.SOL, 16, 1)]
    assert s.tokens_per_s == pytest.approx(speed_of_light(get_config("tiny-dense"), "tpu-v5e-8", 16).tokens_per_s)
    # where each megakernel step's per-op costs came from is the prediction's; the others have none
    assert r.op_costs == p.op_costs and w.op_costs == predict("tiny-moe", "tpu-v5e-8", 64, 3).op_costs
    assert set(tiny_table[tiny_table.engine == "megakernel"].op_costs) <= {"assumed", "compiler-scheduled"}
    assert (tiny_table[tiny_table.engine != "megakernel"].op_costs == "-").all()


def test_the_baseline_is_in_the_write_ups_data_type_per_model():
    series = {m: {s.role: s for s in sweeps.engine_series(m)} for m in FULL}
    assert series["gemma4-26b-a4b"]["general baseline"].dtype == "fp8"
    assert series["gemma4-31b"]["general baseline"].dtype == "bf16"
    baseline = ("general baseline", sweeps.SOL_BASELINE)  # the baseline and its bound, in its data type
    assert all(series[m][sweeps.SOL_BASELINE].dtype == series[m]["general baseline"].dtype for m in FULL)
    assert all(s.dtype == "bf16" for m in FULL for r, s in series[m].items() if r not in baseline)


def test_context_change_and_speedups(tiny_table):
    change = sweeps.context_change(tiny_table[tiny_table.batch == 1])
    assert len(change) == len(TINY) * 6
    assert (change.from_context == 16).all() and (change.to_context == 64).all()
    r = change.iloc[0]
    assert r.change == pytest.approx(r.to_tokens_per_s / r.from_tokens_per_s - 1)
    speed = sweeps.speedup_table(tiny_table)
    assert len(speed) == len(TINY) * 2 * 2
    assert (speed.over_general_baseline > 0).all() and speed.kind.str.contains("modelled").all()
    # the workbook's kernel is python -m mk predict's default (mk.kernel_setup.WORKBOOK_KERNEL), beside the write-up's
    r = speed.set_index(["model", "context", "batch"]).loc[("tiny-moe", 64, 3)]
    assert r.workbook_tokens_per_s == pytest.approx(predict("tiny-moe", "tpu-v5e-8", 64, 3).tokens_per_s)
    # each megakernel's per-op costs, carried from the engine table
    rows = tiny_table.set_index(["model", "role", "context", "batch"]).op_costs
    assert r.workbook_op_costs == rows[("tiny-moe", sweeps.WORKBOOK, 64, 3)]
    assert r.megakernel_op_costs == rows[("tiny-moe", "megakernel", 64, 3)]
    ends = change.set_index(["model", "series"]).loc[("tiny-moe", sweeps.engine_series("tiny-moe")[0].label)]
    assert (ends.from_op_costs, ends.to_op_costs) == (
        rows[("tiny-moe", "megakernel", 16, 1)],
        rows[("tiny-moe", "megakernel", 64, 1)],
    )


def test_published_points_are_read_and_fractions_scaled_by_the_modelled_speed_of_light():
    points = sweeps.published_points(FULL).set_index("key")
    assert list(points.index) == list(sweeps.PUBLISHED_POINTS)
    assert points.loc["mk_v5e8_moe_tps", "tokens_per_s"] == published("mk_v5e8_moe_tps")
    assert points.loc["vllm_h100_moe_tps", "chip"] == "h100"
    for key in ("mk_v5e8_dense_sol_fraction", "vllm_v5e8_dense_sol_fraction"):
        sol = speed_of_light(get_config("gemma4-31b"), "tpu-v5e-8", 1024)
        assert points.loc[key, "tokens_per_s"] == pytest.approx(published(key) * sol.tokens_per_s)
        assert points.loc[key, "how"] == sweeps.FRACTION_OF_SOL
        label = views.point_label(points.reset_index().set_index("key", drop=False).loc[key])
        assert "published fraction" in label and "modelled speed of light" in label
    assert points.source.str.startswith("data/published.csv").all()
    before = sweeps.published_points(FULL, (sweeps.BEFORE_FIXES_KEY,)).iloc[0]
    assert before.tokens_per_s == pytest.approx(1 / published(sweeps.BEFORE_FIXES_KEY))
    assert before.placement == "whole"
    assert sweeps.published_points(["gemma4-31b"]).model.eq("gemma4-31b").all()


def test_kv_per_chip_counts_the_copies_of_full_layer_heads():
    kv = sweeps.kv_table(["gemma4-26b-a4b"], [1024, 131072], "tpu-v5e-8").set_index(["layer_type", "context"])
    full, sliding = kv.loc[("full", 131072)], kv.loc[("sliding", 131072)]
    assert full.copies_per_head == 4 and sliding.copies_per_head == 1  # 2 KV heads, 8 KV heads, on 8 chips
    assert full.per_chip_GB == pytest.approx(4 * full.even_share_GB)
    assert sliding.positions_read == get_config("gemma4-26b-a4b").sliding_window
    assert sliding.kv_GB == kv.loc[("sliding", 1024), "kv_GB"]  # the window caps what a sliding layer reads
    share = sweeps.bytes_share(["gemma4-26b-a4b"], [1024, 131072])
    assert share.kv_share.is_monotonic_increasing and share.weights_GB.nunique() == 1


def test_whole_experts_wait_for_the_busiest_chip():
    t = sweeps.placement_table("tiny-moe", [1, 3], 64, "tpu-v5e-8")
    assert len(t) == 6 and set(t.role) == {"megakernel", "whole", "before fixes"}
    for _, g in t.groupby("batch"):
        r = g.set_index("role")
        assert r.vs_split["megakernel"] == 1
        assert r.experts_per_chip["whole"] >= r.experts_per_chip["megakernel"]
        assert r.step_ms["before fixes"] >= r.step_ms["whole"] * (1 - 1e-9)
        whole = predict(
            "tiny-moe", "tpu-v5e-8", 64, int(r.batch["whole"]), setup=WRITE_UP_KERNEL.but(placement=Placement.WHOLE)
        )
        assert r.op_costs["whole"] == whole.op_costs  # the prediction's, each row
    names = [views.placement_label(r) for r in t.drop_duplicates("role").itertuples()]
    assert [n.count("experts") for n in names] == [1, 1, 1] and all(n.startswith("modelled: ") for n in names)
    with pytest.raises(ValueError, match="MoE model on a slice"):
        sweeps.placement_table("tiny-dense", [1])
    with pytest.raises(ValueError, match="MoE model on a slice"):
        sweeps.placement_table("tiny-moe", [1], tpu_slice="tpu-v5e")


def test_chip_table_says_which_chips_the_weights_do_not_fit():
    t = sweeps.chip_table(["gemma4-26b-a4b"], ["tpu-v5e", "tpu-v5e-8"])
    assert len(t) == 2 * 3 and set(t.series) == {"megakernel", "general stack", sweeps.SOL}
    fits = t.drop_duplicates("chip").set_index("chip").fits_in_hbm
    assert not fits["tpu-v5e"] and fits["tpu-v5e-8"]  # about 50 GB of bf16 weights: 16 GB against 128 GB
    assert t.set_index(["chip", "series"]).hbm_GB[("tpu-v5e", "megakernel")] == get_chip("tpu-v5e").hbm_bytes / 1e9
    assert (t[t.engine != "megakernel"].op_costs == "-").all()  # the general stack and the speed of light have none
    assert set(t[t.engine == "megakernel"].op_costs) <= {"assumed", "compiler-scheduled"}
    fig = views.chip_figure(t, ["gemma4-26b-a4b"], "chips")
    bars = [d for d in fig.data if d.type == "bar" and d.x[0] is not None]
    assert all("/" in d.marker.pattern.shape[0] and d.text[0].endswith("does not fit") for d in bars)  # tpu-v5e first
    assert any("do not fit" in (d.name or "") for d in fig.data)


def test_validation_lists_the_published_points_with_errors_and_roles():
    v = sweeps.validation(FULL).set_index("key")
    assert set(v.index) == set(sweeps.PUBLISHED_POINTS) | {sweeps.BEFORE_FIXES_KEY}
    assert v.loc["vllm_h100_moe_tps", "role"] == "fitted (as vllm_h100_moe_step)"
    assert v.loc["mk_v5e8_moe_tps", "role"] == "test (as mk_v5e8_moe_step)"
    assert v.loc[sweeps.BEFORE_FIXES_KEY, "unit"] == "ms"
    assert v.loc[sweeps.BEFORE_FIXES_KEY, "published"] == pytest.approx(published(sweeps.BEFORE_FIXES_KEY) * 1e3)
    assert v.error.to_numpy() == pytest.approx((v.modelled / v.published - 1).to_numpy())
    assert len(sweeps.validation(["gemma4-31b"])) == 2


def test_context_figure_draws_every_series_and_labels_the_published_points(tiny_table):
    points = sweeps.published_points(FULL)
    t = sweeps.engine_table(FULL, [1024, 131072], [1])
    fig = views.context_figure(t, points, FULL, "context")
    names = [d.name for d in fig.data if d.showlegend is not False]
    assert len(names) == len(set(names)) == 6 + 1  # one entry per series, one for every published point
    assert any(WRITE_UP_KERNEL.name in n for n in names) and any(WORKBOOK_KERNEL.name in n for n in names)
    assert any("fp8 MoE, bf16 dense" in n for n in names)
    assert sum("fraction x modelled speed of light" in n for n in names) == 1
    assert sum(d.name.startswith("published fraction") for d in fig.data) == 2  # each point says so on hover
    assert any(a.text == views.BOUND for a in fig.layout.annotations)  # the bound says so on the plot
    assert fig.layout.xaxis.ticktext == ("1K", "2K", "8K", "32K", "128K")  # not just the two contexts run
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "context (positions)" in fig.layout.xaxis.title.text and "tokens/s per user" in fig.layout.yaxis.title.text
    batch = views.batch_figure(tiny_table[tiny_table.context == 16], None, TINY, "batch", total=True)
    assert "all users" in batch.layout.yaxis.title.text
    assert batch.layout.xaxis.tickvals == (1, 2, 3)  # the powers of two and the ends
    assert batch.layout.xaxis.ticktext[2] == "3<br>(4.6)" and batch.layout.xaxis2.ticktext[2] == "3"  # 8 (1 - (6/8)^3)
    assert "distinct experts" in batch.layout.xaxis.title.text and "experts" not in batch.layout.xaxis2.title.text
    if os.access("/usr/bin/chromium", os.X_OK) or shutil.which("chromium") or os.environ.get("BROWSER_PATH"):
        from mk.figures import check_figure, provenance

        provenance(fig, "published + modelled", "tpu-v5e-8, h100", "a test")
        assert check_figure(fig) == []


def test_attention_split_table_compares_the_three_splits_where_they_run(capsys):
    """Heads, positions and users at 1 and 8 users on the v5e-8: the users split is left out at one user (it cannot
    run there; predict refuses it, naming the batch to use), and at 8 users it reads the positions split's KV bytes
    (an even share) while by heads each chip reads the full layers' heads whole; the figure draws a bar per row."""
    from mk.__main__ import main

    t = sweeps.attention_split_table(["gemma4-26b-a4b"], [131072], [1, 8])
    assert set(t[t.batch == 1].attention_split) == {"heads", "positions"}
    assert (t.setup == WORKBOOK_KERNEL.name).all() and WORKBOOK_KERNEL.name in t.kind[0]  # the setup it varies, named
    eight = t[t.batch == 8].set_index("attention_split")
    assert set(eight.index) == {"heads", "positions", "users"}
    assert eight.kv_GB["users"] == pytest.approx(eight.kv_GB["positions"], rel=0.01)
    assert eight.kv_GB["heads"] > 3 * eight.kv_GB["users"]
    assert eight.vs_positions["positions"] == 1 and eight.sent_MB["users"] > eight.sent_MB["heads"]
    by_users = WORKBOOK_KERNEL.but(attention_split=AttentionSplit.USERS)
    users = predict("gemma4-26b-a4b", "tpu-v5e-8", 131072, 8, setup=by_users)
    assert eight.op_costs["users"] == users.op_costs  # the prediction's
    fig = views.attention_split_figure(t, ["gemma4-26b-a4b"], "splits")
    assert sum(len(tr.y) for tr in fig.data) == len(t) and {tr.name for tr in fig.data} == {
        "split by heads", "split by positions", "split by users"
    }  # fmt: skip
    args = ["predict", "--model", "gemma4-26b-a4b", "--chip", "tpu-v5e-8", "--context", "1024"]
    assert main([*args, "--attention-split", "users"]) == 2
    assert "multiple of 8" in capsys.readouterr().err
