"""The all-reduce's payloads and the modelled step after each fix (mk.sharding.overlap), on the full-size
plans (arithmetic only: nothing runs a kernel)."""

import math

import numpy as np
import pytest

from mk.chips import get_chip
from mk.config import GEMMA4_26B_A4B, GEMMA4_31B
from mk.plan import timeline
from mk.published import published
from mk.sharding import Collective, overlap as ov
from mk.sharding.straggler import busiest_chip

CHIP = "tpu-v5e-8"
COSTS = dict(op_overhead_s=300e-9, dma_issue_s=300e-9, ici_latency_s=1e-6)


@pytest.fixture(scope="module")
def payloads():
    return ov.payload_table(GEMMA4_26B_A4B, CHIP, [1, 8])


@pytest.fixture(scope="module")
def steps():
    return ov.fix_steps(GEMMA4_26B_A4B, CHIP, 1024, 1, **COSTS).set_index("fix")


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
    summed = ov.per_step(payloads).set_index(["batch", "algorithm", "payload"])
    f32, bf16 = summed.loc[(1, "all to all", "f32")], summed.loc[(1, "all to all", "bf16")]
    gather = t.loc[(1, "head argmax (gather)"), "ici_ms_per_step"]
    assert f32.unpadded_ms_per_step == pytest.approx(f32.ici_ms_per_step - gather * 7 / 8)
    assert bf16.sent_MB_per_step == pytest.approx(f32.sent_MB_per_step)  # 2 bf16 rows weigh 1 f32 row
    assert f32.ici_ms_per_step == pytest.approx(f32.sent_MB_per_step * 1e6 / get_chip(CHIP).ici_bandwidth * 1e3)


def test_a_dense_model_all_reduces_its_mlp_alone():
    t = ov.payload_table(GEMMA4_31B, CHIP, [1])
    assert set(t.reduces) == {"embedding", "attention", "shared MLP", "head argmax (gather)"}


def test_the_pace_is_the_busiest_chip_under_whole_placement_and_every_chip_split():
    whole = ov.chip_plan(GEMMA4_26B_A4B, 1024, 1, "whole", Collective(overlap=False))
    p = ov.pace(whole, CHIP)
    assert p["experts_per_layer"] == pytest.approx(busiest_chip(128, 8, 8, 1).expected_max)
    split = ov.chip_plan(GEMMA4_26B_A4B, 1024, 1, "split")
    q = ov.pace(split, CHIP, **COSTS)
    assert q["experts_per_layer"] == 8  # one user: 8 distinct experts, 1/8 of each on every chip
    assert q["weight_GB"] == pytest.approx(split.weight_bytes / 1e9)
    assert q["weight_payload_GB"] == pytest.approx(split.payload_bytes / 1e9)
    assert q["step_s"] == pytest.approx(max(r["end_s"] for r in timeline(split, CHIP, None, **COSTS)))
    assert q["step_s"] > q["hbm_floor_s"] > q["payload_floor_s"]


def test_the_expected_step_matches_layers_drawn_one_by_one():
    """The step expected over the busiest chip's count with one count in every layer against layers drawn
    independently: layers add up, so the two agree within the draws' noise."""
    plan = ov.chip_plan(GEMMA4_26B_A4B, 1024, 1, "whole", Collective(overlap=False))
    dist = ov.pace_distribution(plan)
    counts, probs = np.array(list(dist)), np.array(list(dist.values()))
    rng = np.random.default_rng(0)
    ends = [
        max(
            r["end_s"]
            for r in timeline(plan, CHIP, dict(enumerate(rng.choice(counts, 30, p=probs / probs.sum()))), **COSTS)
        )
        for _ in range(40)
    ]
    assert ov.pace(plan, CHIP, **COSTS)["step_s"] == pytest.approx(np.mean(ends), rel=0.01)


def test_each_fix_shortens_the_step_and_published_numbers_sit_beside_their_own_case(steps):
    a, b, c, d, e = steps.step_ms
    # one user: a bf16 payload sends two rows of 2 bytes where f32 sends one of 4, so it saves nothing
    assert a > b > c and d == pytest.approx(c, rel=1e-3) and e < d
    before, after = steps.loc[ov.FIXES[0].name], steps.loc[ov.FIXES[3].name]
    assert before.published_ms == pytest.approx(published("mk_v5e8_moe_step_before") * 1e3)
    assert after.error == pytest.approx(after.step_ms / (published("mk_v5e8_moe_step") * 1e3) - 1)
    assert steps.published_ms.notna().sum() == 2
    # split experts move more bytes per chip than they hold (88 of 128 lanes), and overlap changes no bytes
    assert steps.loc[ov.FIXES[1].name, "weight_GB"] > steps.loc[ov.FIXES[1].name, "weight_payload_GB"] * 1.2
    assert steps.loc[ov.FIXES[1].name, "weight_GB"] == steps.loc[ov.FIXES[2].name, "weight_GB"]
    # another context than the published one has nothing to compare against
    other = ov.fix_steps(GEMMA4_26B_A4B, CHIP, 2048, 1, ov.FIXES[:1])
    assert math.isnan(other.published_ms[0]) and math.isnan(other.error[0])


def test_more_links_shorten_the_time_on_the_wire_only():
    wide = ov.sensitivity(GEMMA4_26B_A4B, CHIP, 1024, 1, [1, 4], ov.FIXES[3:4], **COSTS)
    one, four = (wide[(wide.links == n) & (wide.costs == "assumed")].iloc[0] for n in (1, 4))
    assert four.step_ms < one.step_ms and four.hbm_floor_ms == one.hbm_floor_ms
    assert wide[wide.costs == "bytes only"].step_ms.max() < one.step_ms
    with pytest.raises(ValueError, match="links must be a positive integer"):
        ov.with_links(CHIP, 0)


def test_padding_of_the_split_intermediate():
    t = ov.padding_table(GEMMA4_26B_A4B, 1024, 1).set_index(["placement", "component"])
    split, whole = t.loc[("split", "experts")], t.loc[("whole", "experts")]
    assert (split.intermediate_per_chip, split.laid_out) == (88, 128)
    assert split.padding == pytest.approx(128 / 88 - 1)
    assert whole.padding == pytest.approx(768 / 704 - 1)


def test_figures_keep_a_stream_one_colour_and_draw_published_beside_modelled(steps):
    runs = {
        f"overlap {s}": ov.pace_timeline(ov.chip_plan(GEMMA4_26B_A4B, 1024, 1, "split", Collective(overlap=o)), CHIP)
        for s, o in (("off", False), ("on", True))
    }
    fig = ov.timeline_figure(runs, 2, "t")
    colours = {}
    for trace in fig.data:
        assert colours.setdefault(trace.name, trace.marker.color) == trace.marker.color
    assert len(colours) == len(set(colours.values())) == 3  # DMA engine, link, compute
    assert sum(t.showlegend is not False for t in fig.data) == len(colours)
    bars = ov.fix_figure(steps.reset_index(), "t")
    assert len(bars.data[1].y) == 2  # the published bars: before and after


def test_no_timing_is_recorded_off_a_tpu_slice():
    with pytest.raises(RuntimeError, match="TPU slice"):
        ov.bench_slice(GEMMA4_26B_A4B, 1024, 1, ["split"])
