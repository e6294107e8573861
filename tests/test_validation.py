"""The timing model held to the published numbers it is tested against (mk.analysis.verdict.points_table): each point's
error (modelled / published - 1) as recorded when the model last changed on purpose. A change that moves a
prediction fails here instead of quietly changing a notebook; if the change is meant, record the new errors
(and say why in the commit). Fitted points, inputs and what holds by construction are not tests and are not
pinned; a step, its tokens/s and its fraction of the speed of light are one point."""

import pytest

from mk.analysis import verdict as vd

# key: error recorded on 2026-12-01 (mk.timing with data/timing.csv's constants; assumed costs 0)
RECORDED = {
    "mk_v5e8_moe_step": 0.0606,
    "mk_v5e8_moe_step_before": -0.3253,
    "mk_v5e8_moe_int8_tps": -0.0374,  # a down projection scaled per input channel (was -0.0548 per output)
    "mk_v5e8_dense_sol_fraction": 0.1009,
    "ko_vllm_experts": -0.1105,
    "ko_vllm_sliding_attention": 0.0437,
    "ko_vllm_norms": -0.1859,
    "ko_vllm_shared_mlp": 1.0603,
    "ko_vllm_head": -0.4934,
    "ko_vllm_full_attention": -0.4013,
    "ko_vllm_router": 1.8693,
    "ko_mk_experts": 0.4568,
    "ko_mk_sliding_attention": 2.7841,
    "ko_mk_norms": -1.0,
    "ko_mk_head": 74.268,
    "ko_mk_full_attention": 2.3246,
    "ko_mk_router": -0.9545,
    "verdict_moe_eight_users": -0.0893,
    "verdict_long_prompt": -0.2437,
    "verdict_dense_h100": 0.0207,
    "verdict_small_model": 0.1147,
}
BAND = dict(abs=0.005, rel=0.005)  # half a percentage point of error, or half a percent of a large one


@pytest.fixture(scope="module")
def points():
    return vd.points_table().set_index("key")


def test_each_tested_point_stays_in_its_recorded_band(points):
    tests = points[points.role.map(vd.is_test)]
    assert set(tests.index) == set(RECORDED), "tested points changed: record the new set"
    moved = {
        k: f"{tests.loc[k, 'error']:+.4f} (recorded {e:+.4f})"
        for k, e in RECORDED.items()
        if tests.loc[k, "error"] != pytest.approx(e, **BAND)
    }
    assert not moved, f"the model moved these published points' errors: {moved}"


def test_each_published_point_counts_once(points):
    v = vd.validation_table()
    # the write-up's 640 tok/s, 1.56 ms and 77% are one point, tested once
    same = v[v.point == "mk_v5e8_moe_step"]
    assert set(same.key) == {"mk_v5e8_moe_step", "mk_v5e8_moe_tps", "mk_v5e8_moe_sol_fraction"}
    assert (same.set_index("key").role.drop("mk_v5e8_moe_step") == "same point as mk_v5e8_moe_step").all()
    assert points.index.is_unique and "mk_v5e8_moe_tps" not in points.index
    # a verdict that divides two published points is derived from them, not a third test
    d = vd.verdict_table().set_index("key")
    assert d.loc["verdict_moe_one_user", "role"] == "derived: mk_v5e8_moe_step / vllm_h100_moe_step"
    assert d.loc["verdict_dense_same_tpu", "role"].startswith("derived: mk_v5e8_dense_sol_fraction")
    assert "verdict_moe_one_user" not in points.index


def test_fitted_points_are_marked_and_not_tests(points):
    assert points.loc["vllm_h100_moe_step", "role"] == "fitted"
    assert points.loc["vllm_v5e8_dense_sol_fraction", "role"] == "fitted"
    assert points.loc["mk_v5e8_kernels", "role"] == "by construction"
    assert points.loc["vllm_h100_moe_kernels", "role"] == "input"


def test_measured_tpu_rows_are_shown_beside_the_model(tmp_path):
    """A row python -m mk tpu-smoke appends on a TPU slice is set beside mk.timing's step for the same
    configuration; rows from elsewhere (interpret mode on a CPU) are left out."""
    import csv

    from mk import timing
    from mk.measure.tpu import COLUMNS

    path = tmp_path / "tpu.csv"
    base = dict.fromkeys(COLUMNS, "")
    rows = [
        base | dict(engine="megakernel", backend="tpu", chip="tpu-v5e-8", placement="split", model="gemma4-26b-a4b",
                    dtype="bf16", context=1024, batch=1, step_ms=2.0, step_low_ms=1.9, step_high_ms=2.1, parity="held"),
        base | dict(engine="megakernel", backend="cpu", chip="tpu-v5e-8", placement="split", model="tiny-moe",
                    dtype="bf16", context=32, batch=1, step_ms=900.0, step_low_ms=800, step_high_ms=1000),
    ]  # fmt: skip
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    t = vd.measured_megakernel(path)
    assert len(t) == 1 and t.iloc[0].measured_ms == 2.0
    want = timing.predict("gemma4-26b-a4b", "tpu-v5e-8", 1024, 1).step_s * 1e3  # the workbook's kernel, split
    assert t.iloc[0].modelled_ms == pytest.approx(want) and t.iloc[0].error == pytest.approx(want / 2.0 - 1)
    assert vd.measured_megakernel(tmp_path / "none.csv").empty
