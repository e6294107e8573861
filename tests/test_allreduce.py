"""The all-reduce's payloads and the modelled step after each fix (mk.analysis.allreduce, through mk.timing), on the
full-size plans (arithmetic only: nothing runs a kernel)."""

import math

import numpy as np
import pytest

from mk import timing
from mk.analysis import allreduce as ar
from mk.chips import get_chip
from mk.config import GEMMA4_26B_A4B, GEMMA4_31B
from mk.kernel_setup import BEFORE_FIXES, FIXES, WRITE_UP_KERNEL, Collective, KernelSetup
from mk.plan import timeline
from mk.published import published
from mk.routing import busiest_chip_distribution
from mk.views.allreduce import fix_figure, wrap
from mk.views.timeline import timeline_figure

CHIP = get_chip("tpu-v5e-8")
COSTS = dict(op_overhead_s=300e-9, dma_issue_s=300e-9)


def plan(placement, collective=Collective(), layout="sublanes"):
    setup = KernelSetup(placement=placement, collective=collective, ffn_layout=layout)
    return timing.step_plan(GEMMA4_26B_A4B, CHIP, 1024, 1, "bf16", setup)


@pytest.fixture(scope="module")
def payloads():
    return ar.payload_table(GEMMA4_26B_A4B, CHIP, [1, 8])


@pytest.fixture(scope="module")
def steps():
    return ar.fix_steps(GEMMA4_26B_A4B, CHIP, 1024, 1).set_index("fix")


def test_payloads_are_what_the_kernel_sends_the_users_rows(payloads):
    H, C = GEMMA4_26B_A4B.hidden_size, 8
    one = payloads[(payloads.batch == 1) & (payloads.algorithm == "all to all")].set_index(["payload", "reduces"])
    assert one.loc[("f32", "attention"), "sent_bytes"] == (C - 1) * 1 * H * 4
    assert one.loc[("f32", "shared MLP + experts"), "sent_bytes"] == 2 * (C - 1) * 1 * H * 4  # sent together
    assert one.loc[("bf16", "attention"), "sent_bytes"] == (C - 1) * 2 * H * 2  # two rows: a packed sublane word
    assert one.loc[("bf16", "embedding"), "wire"] == "f32"  # the embedding's sum stays exact
    rs = payloads[(payloads.batch == 1) & (payloads.algorithm != "all to all") & (payloads.payload == "f32")]
    assert rs.set_index("reduces").loc["attention", "sent_bytes"] == 2 * (C - 1) * 1 * 384 * 4  # 2816 / 8 -> 384 lanes
    assert rs.set_index("reduces").loc["attention", "rounds"] == 2
    # one embedding, one attention and one FFN all-reduce per layer, one gather of the head's argmax
    counts = one.xs("f32").per_step.to_dict()
    assert counts == {"embedding": 1, "attention": 30, "shared MLP + experts": 30, "head argmax (gather)": 1}
    # eight users send eight times one user's rows (the argmax gather sends its 8-row block either way)
    t = payloads[(payloads.algorithm == "all to all") & (payloads.payload == "f32")].set_index(["batch", "reduces"])
    assert t.loc[(8, "attention"), "sent_bytes"] == 8 * t.loc[(1, "attention"), "sent_bytes"]
    summed = ar.payloads_per_step(payloads).set_index(["batch", "algorithm", "payload"])
    f32, bf16 = summed.loc[(1, "all to all", "f32")], summed.loc[(1, "all to all", "bf16")]
    gather = t.loc[(1, "head argmax (gather)")]
    on_wire = gather.ici_ms_per_step - gather.rounds * timing.link_latency(CHIP) * 1e3  # its bytes' time
    assert f32.unpadded_ms_per_step == pytest.approx(f32.ici_ms_per_step - on_wire * 7 / 8)
    assert bf16.sent_MB_per_step == pytest.approx(f32.sent_MB_per_step)  # 2 bf16 rows weigh 1 f32 row
    # the link time is the bytes at one link's bandwidth plus the cited latency per round
    latency = f32.ops * timing.link_latency(CHIP) * 1e3
    assert f32.ici_ms_per_step == pytest.approx(f32.sent_MB_per_step * 1e6 / CHIP.ici_bandwidth * 1e3 + latency)


def test_a_dense_model_all_reduces_its_mlp_alone():
    t = ar.payload_table(GEMMA4_31B, CHIP, [1])
    assert set(t.reduces) == {"embedding", "attention", "shared MLP", "head argmax (gather)"}


def test_the_pace_is_the_busiest_chip_under_whole_placement_and_every_chip_split():
    whole = plan("whole", Collective(overlap=False))
    p = timing.pace(whole, CHIP)
    busiest = busiest_chip_distribution(128, 8, 8, 1)
    assert p.experts_per_layer == pytest.approx(sum(m * q for m, q in busiest.items()))
    assert p.expert_share == 1
    split = plan("split")
    q = timing.pace(split, CHIP, **COSTS)
    assert q.experts_per_layer == 8 and q.expert_share == 1 / 8  # one user: 1/8 of each of 8 experts
    assert q.weight_bytes == pytest.approx(split.weight_bytes)
    assert q.weight_payload_bytes == pytest.approx(split.payload_bytes)
    costs = timing.megakernel_costs(split, CHIP, **COSTS)
    assert q.step_s == pytest.approx(max(r["end_s"] for r in timeline(split, CHIP, None, **costs)))
    assert q.step_s > q.hbm_floor_s == pytest.approx(q.payload_floor_s)  # the MLPs on rows: no padding
    lanes = timing.pace(plan("split", layout="lanes"), CHIP, **COSTS)
    assert lanes.step_s > lanes.hbm_floor_s > lanes.payload_floor_s  # the first layout pads to lanes


def test_the_expected_step_matches_layers_drawn_one_by_one():
    """The step expected over the busiest chip's count with one count in every layer against layers drawn
    independently: layers add up, so the two agree within the draws' noise."""
    whole = plan("whole", Collective(overlap=False))
    dist = whole.pacing_experts
    counts, probs = np.array(list(dist)), np.array(list(dist.values()))
    rng = np.random.default_rng(0)
    costs = timing.megakernel_costs(whole, CHIP, **COSTS)
    ends = [
        max(
            r["end_s"]
            for r in timeline(whole, CHIP, dict(enumerate(rng.choice(counts, 30, p=probs / probs.sum()))), **costs)
        )
        for _ in range(40)
    ]
    assert timing.pace(whole, CHIP, **COSTS).step_s == pytest.approx(np.mean(ends), rel=0.01)


def test_each_fix_is_the_timing_models_prediction_and_published_numbers_sit_beside_their_own_case(steps):
    a, b, c, d, e, f, g = steps.step_ms
    # one user: a bf16 payload sends two rows of 2 bytes where f32 sends one of 4, so it saves nothing; at 1K
    # positions splitting them over the chips that share a KV head costs its two rounds of exchange, no more
    assert a > b > c and d == pytest.approx(c, rel=1e-3) and f < e < d and f < g < f * 1.01
    for fix in FIXES:  # one value: the table's step is python -m mk predict's for that setup
        p = timing.predict(GEMMA4_26B_A4B, CHIP, 1024, 1, setup=fix)
        assert steps.loc[fix.name, "step_ms"] == pytest.approx(p.step_s * 1e3, rel=1e-12)
    assert steps.step_ms.iloc[-1] == pytest.approx(timing.predict(GEMMA4_26B_A4B, CHIP, 1024).step_s * 1e3)
    before, after = steps.loc[BEFORE_FIXES.name], steps.loc[WRITE_UP_KERNEL.name]
    assert before.published_ms == pytest.approx(published("mk_v5e8_moe_step_before") * 1e3)
    assert after.error == pytest.approx(after.step_ms / (published("mk_v5e8_moe_step") * 1e3) - 1)
    assert steps.published_ms.notna().sum() == 2
    # whole experts' worth per chip: the busiest chip's 2.5 whole experts against 1/8 of 8 experts split
    assert steps.loc[BEFORE_FIXES.name, "whole_experts_worth"] > 2.5
    assert steps.loc[WRITE_UP_KERNEL.name, "whole_experts_worth"] == pytest.approx(1.0)
    # split experts move more bytes per chip than they hold (88 of 128 lanes), and overlap changes no bytes
    fb, fc = FIXES[1].name, FIXES[2].name
    assert steps.loc[fb, "weight_GB"] > steps.loc[fb, "weight_payload_GB"] * 1.2
    assert steps.loc[fb, "weight_GB"] == steps.loc[fc, "weight_GB"]
    last = FIXES[-1].name  # the intermediate on rows: a chip moves only what holds weights
    assert steps.loc[last, "weight_GB"] == pytest.approx(steps.loc[last, "weight_payload_GB"])
    # where each step's per-op costs came from: the prediction's
    assert [steps.op_costs[f.name] for f in FIXES] == [
        timing.predict(GEMMA4_26B_A4B, CHIP, 1024, 1, setup=f).op_costs for f in FIXES
    ]
    # another context than the published one has nothing to compare against
    other = ar.fix_steps(GEMMA4_26B_A4B, CHIP, 2048, 1, FIXES[:1])
    assert math.isnan(other.published_ms[0]) and math.isnan(other.error[0])


def test_more_links_and_assumed_costs_move_the_step_as_they_should():
    wide = ar.sensitivity(GEMMA4_26B_A4B, CHIP, 1024, 1, [1, 4], [0.0, 300e-9])
    fix = WRITE_UP_KERNEL.name
    at = wide[wide.fix == fix].set_index(["links", "overhead_ns"]).step_ms
    assert at[(4, 0.0)] < at[(1, 0.0)] < at[(1, 300.0)]
    assert wide[wide.timing_csv].fix.tolist() == [f.name for f in FIXES]  # data/timing.csv's value is one of the cases
    assert (wide.op_costs == "assumed").all()  # every case charges its assumed cost to every op
    grid = ar.sensitivity_grid(wide)
    marked = [c for c in grid.columns if c.endswith("(data/timing.csv)")]
    assert len(marked) == 1 and marked[0].startswith("1 link, ") and not any("default" in c for c in grid.columns)
    with pytest.raises(ValueError, match="links must be a positive integer"):
        ar.with_links(CHIP, 0)


def test_padding_of_the_split_intermediate():
    t = ar.padding_table(GEMMA4_26B_A4B, CHIP, 1024, 1).set_index(["ffn_layout", "placement", "component"])
    split, whole = t.loc[("lanes", "split", "experts")], t.loc[("lanes", "whole", "experts")]
    assert (split.intermediate_per_chip, split.laid_out) == (88, 128)
    assert split.padding == pytest.approx(128 / 88 - 1)
    assert whole.padding == pytest.approx(768 / 704 - 1)
    rows = t.loc["sublanes"]  # the intermediate on rows: 88 rows are 88 rows, nothing padded
    assert rows.loc[("split", "experts"), "laid_out"] == 88 and (rows.padding.abs() < 1e-12).all()


def test_figures_keep_a_stream_one_colour_and_draw_published_beside_modelled(steps):
    runs = {
        f"overlap {s}": timing.pace_timeline(plan("split", Collective(overlap=o)), CHIP)
        for s, o in (("off", False), ("on", True))
    }
    fig = timeline_figure(runs, 2, "t")
    colours = {}
    for trace in fig.data:
        assert colours.setdefault(trace.name, trace.marker.color) == trace.marker.color
    assert len(colours) == len(set(colours.values())) == 3  # DMA engine, link, compute
    assert sum(t.showlegend is not False for t in fig.data) == len(colours)
    bars = fix_figure(steps.reset_index(), "t")
    assert len(bars.data[1].y) == 2  # the published bars: before and after
    assert list(bars.data[0].x) == [wrap(f.name) for f in FIXES]  # each setup by its name, wrapped
    assert all(len(line) <= 18 for label in bars.data[0].x for line in label.split("<br>"))
