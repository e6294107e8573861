"""mk.analysis.stream_waits: the moments of a modelled step when the weight stream moves nothing, placed on what the
core (or the links) does then, and a measured MoE row's time past its bytes placed on padding, the call's fixed time
and those waits, with what none of them holds said."""

import pytest

from mk.analysis import moe_one_user as moe, stream_waits as sw
from mk.chips import get_chip, measured_limit
from mk.config import with_layers
from mk.timing.pace import pace_timeline
from mk.timing.work import named_plan


def _row(lane, start, end, what="", component="", stream="weights"):
    return dict(lane=lane, stream=stream, what=what, layer=0, component=component, start_s=start, end_s=end)


def test_a_wait_goes_to_the_links_first_then_the_core_and_else_between_ops():
    rows = [
        _row("dma", 0.0, 1.0), _row("dma", 0.5, 1.0), _row("dma", 2.0, 3.0),  # busy 0-1 (overlapping copies), 2-3
        _row("compute", 0.5, 2.5, "Attend", "sliding_attention"),
        _row("compute", 0.9, 1.1, "ExpertCombine", "experts"),
        _row("ici", 1.2, 1.6, "AllReduce", "collectives", "collective"),
        _row("compute", 3.5, 3.6, "Route", "router"),
    ]  # fmt: skip
    waits, end = sw.waits_by_phase(rows)
    assert end == 3.6 and sum(waits.values()) == pytest.approx(end - 2.0)  # the step less the engine's busy time
    # 1-2: the links' 0.4 s, then the core's 1.1 s of ops scaled into the 0.6 s left; 3-3.6: 0.1 s routing, 0.5 none
    assert waits[sw.EXCHANGES] == pytest.approx(0.4)
    assert waits["sliding_attention"] == pytest.approx(0.6 * 1.0 / 1.1)
    assert waits[sw.COMBINE] == pytest.approx(0.6 * 0.1 / 1.1)
    assert waits["router"] == pytest.approx(0.1) and waits[sw.BETWEEN] == pytest.approx(0.5)


def test_a_steps_waits_are_its_time_less_its_bytes_by_phase():
    cfg = with_layers("gemma4-26b-a4b", 7)
    t = sw.stream_waits(cfg)
    plan = named_plan(cfg, "tpu-v5e", 1024, 1, "workbook", "bf16", ())
    rows = pace_timeline(plan, get_chip("tpu-v5e"))
    busy = sum(e - s for s, e in sw._busy(rows))
    assert t.wait_us.sum() == pytest.approx(t.step_us.iloc[0] - busy * 1e6)
    assert list(t.wait_us) == sorted(t.wait_us, reverse=True) and set(t.phase) <= {
        "sliding_attention", "full_attention", "experts", "shared_mlp", "router", "norms", "head", sw.COMBINE,
        sw.BETWEEN}  # fmt: skip
    assert t.wait_us_a_layer.tolist() == pytest.approx((t.wait_us / 7).tolist())


def test_a_measured_rows_time_past_its_bytes_is_placed_and_the_rest_said():
    table, phases = sw.gap_placed(moe.moe_one_user_rows())
    t = table.set_index("model")
    assert t.unplaced_us.tolist() == pytest.approx(
        (t.past_bytes_us - t.uncounted_us - t.call_share_us - t.waits_us).tolist()
    )
    assert phases.sum(axis=1).reindex(t.index).tolist() == pytest.approx(t.waits_us.tolist())
    # measured: gpt-oss-20b's hidden size (2,880, laid out in 2,944 lanes) is most of what its padding costs
    oss = t.loc["gpt-oss-20b[:2]"]
    plan = named_plan(with_layers("gpt-oss-20b", 2), "tpu-v5e", 1024, 1, "workbook", "bf16", ())
    pad = sum(ld.nbytes - ld.payload_bytes for ld in plan.loads) / measured_limit("tpu-v5e").bandwidth * 1e6
    assert oss.uncounted_us == pytest.approx(pad, rel=0.05) and oss.uncounted_us > 40
    assert oss.call_share_us == pytest.approx(t.loc["gemma4-26b-a4b[:7]"].call_share_us)  # both at 16 steps a call
    # the write-up's chip 0 of a v5e-8, stood in for by one chip: it reads the router whole where its slice splits the
    # rest (bytes past its share of the slice's), and its exchanges, local copies, are a phase of their own
    stand_in = t.loc["gemma4-26b-a4b, chip 0 of a v5e-8, setup (g)"]
    plan = named_plan("gemma4-26b-a4b", "tpu-v5e-8", 1024, 1, "workbook", "bf16", ())
    router = plan.bytes_by_component()["router"] / measured_limit("tpu-v5e").bandwidth * 1e6
    assert stand_in.uncounted_us > router > 0
    assert phases.loc["gemma4-26b-a4b, chip 0 of a v5e-8, setup (g)", sw.EXCHANGES] > 0


def test_the_figure_stacks_each_cells_parts_to_what_it_took_past_its_bytes():
    from mk.views.answer import gap_placed_figure

    table, phases = sw.gap_placed(moe.moe_one_user_rows())
    fig = gap_placed_figure(table, phases, "placed")
    bars = [tr for tr in fig.data if tr.type == "bar"]
    totals = [sum(tr.x[i] for tr in bars) for i in range(len(table))]
    assert totals == pytest.approx(table.past_bytes_us.tolist()) and fig.layout.barmode == "relative"
    mark = next(tr for tr in fig.data if tr.type == "scatter")
    assert list(mark.x) == pytest.approx(table.past_bytes_us.tolist())
