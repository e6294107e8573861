"""A step's copies alone (mk.measure.copies_alone), run through on the CPU in interpret mode with races checked: it
moves the plan's tiles into the plan's slots and the cache's tiles at the plan's context, and its driver times it
beside the kernel on the same weights. The numbers it takes on a TPU are data/measured/tpu_copies.csv's."""

import jax
import numpy as np
import pandas as pd
import pytest

from mk.config import get_config
from mk.measure import copies_alone, tpu_runs
from mk.measure.on_chip import Case, CaseEngines, Cell
from mk.plan import Attend, build_plan
from mk.tpu import interpret_params, races_detected, reset_interpreter

CELL = Cell(64, 1)


@pytest.fixture(scope="module", params=["one chip", "workbook"])
def built(request):
    """tiny-moe's kernel weights packed on one chip, and as chip 0 of a v5e-8 stood in for by one (a loopback)."""
    case = Case("tiny-moe", cells=(CELL,), steps_a_call=(2,), setup=request.param)
    engines = CaseEngines(case, jax.devices()[0], 0, lambda _: None)
    engines.build("megakernel")
    yield engines
    engines.close()


def _tile(weights: dict, ld) -> np.ndarray:
    src = np.asarray(weights[ld.tensor], np.float32)
    src = src if ld.index is None else src[ld.index]
    src = src if ld.expert is None else src[ld.expert]  # routed slot j reads expert j
    return src[ld.rows[0] : ld.rows[0] + ld.rows[1], ld.cols[0] : ld.cols[0] + ld.cols[1]]


def test_the_copies_move_each_tile_into_its_slot_and_the_bytes_they_count(built):
    plan = copies_alone.step_plan_of(built.steps["megakernel"], CELL, "bf16")
    weights = built.weights["megakernel"]["weights"]
    reset_interpreter()
    call, moved = copies_alone.copies_alone_call(plan, weights, steps=3, interpret=interpret_params(True))
    out = np.asarray(call())
    assert not races_detected()
    first = next(iter(plan.buffers))
    last = [ld for ld in plan.loads if ld.buffer == first and ld.slot == 0][-1]  # what slot 0 holds at the end
    np.testing.assert_array_equal(out, 3 * _tile(weights, last)[:8, :128])  # three calls, each adding it once
    attends = [op for op in plan.ops if isinstance(op, Attend)]
    kv = sum(2 * np.prod(plan.arrays.cache[f"{op.layer_type}.k"].shape[2::2]) * plan.kv_tile(op.layer_type) * 2
             * plan.kv_tiles_read(op.layer_type) for op in attends)  # fmt: skip
    assert attends and moved == sum(ld.nbytes for ld in plan.loads) + kv
    assert moved > plan.weight_bytes_max  # what it moves covers every routed slot's tiles and the cache


def test_a_latent_cache_is_refused_by_name():
    plan = build_plan(get_config("tiny-deepseek-v3"), 1, 64, weight_dtype="bfloat16", kv_dtype="bfloat16")
    with pytest.raises(ValueError, match="latent cache is not covered"):
        copies_alone.copies_alone_call(plan, {}, interpret=interpret_params())


def test_the_part_times_the_kernel_beside_its_copies_whole_and_with_a_component_off(tmp_path):
    case = Case("tiny-moe", cells=(CELL,), steps_a_call=(2,))
    done = tpu_runs.run(("copies",), tmp_path, 600, copies_cases=(case,), copies_knockouts=("experts",),
                        require_tpu=False, quiet=True, steps=2, min_rounds=3, budget_s=0.5)  # fmt: skip
    rows = pd.read_csv(tmp_path / "tpu_copies.csv", keep_default_na=False)
    assert done["copies"] == 4 and list(rows.columns) == list(copies_alone.COLUMNS)
    assert set(rows.steps_a_call) == {2} and set(rows.setup) == {"one chip"} and set(rows.base_model) == {"tiny-moe"}
    assert (rows.device_step_ms > 0).all() and (rows.program_digest.str.len() == 16).all()
    got = {(r.engine, r.knockout): r for r in rows.itertuples()}
    assert set(got) == {(e, k) for e in ("megakernel", copies_alone.COPIES) for k in ("", "experts")}
    assert got["megakernel", "experts"].copies_bytes == got[copies_alone.COPIES, "experts"].copies_bytes
    assert got[copies_alone.COPIES, "experts"].copies_bytes < got[copies_alone.COPIES, ""].copies_bytes  # in HBM
    assert got["megakernel", ""].program_digest != got["megakernel", "experts"].program_digest


def _row(engine, ms, knockout="", setup="one chip", date="2026-12-07T00:00:00Z", fraction=None):
    return dict(date=date, device="tpu: TPU v5 lite", model="m[:2]", setup=setup, steps_a_call=16, engine=engine,
                knockout=knockout, device_step_ms=ms, kernel_revision=6,
                device_fraction_of_limit=fraction if engine == "megakernel" and not knockout else None)  # fmt: skip


def test_the_floor_splits_a_step_past_its_bytes_into_its_copies_and_its_core(tmp_path):
    from mk.analysis.copies_floor import copies_floor, copies_rows, core_by_component, floor_sentence

    rows = [_row("megakernel", 2.0, fraction=0.9), _row(copies_alone.COPIES, 1.9),
            _row("megakernel", 1.5, "experts"), _row(copies_alone.COPIES, 1.42, "experts"),
            _row("megakernel", 2.2, date="2026-12-01T00:00:00Z", fraction=0.8),
            _row(copies_alone.COPIES, 1.95, date="2026-12-01T00:00:00Z")]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "c.csv", index=False)
    read = copies_rows(tmp_path / "c.csv")
    floor = copies_floor(read)
    assert len(floor) == 1  # the newest run of the cell
    r = floor.iloc[0]
    assert r.core_us == pytest.approx(100.0) and r.bytes_ms == pytest.approx(1.8)
    assert r.copies_past_bytes_us == pytest.approx(100.0) and r.copies_fraction == pytest.approx(1.8 / 1.9)
    parts = core_by_component(read)
    assert len(parts) == 1 and parts.iloc[0].core_us == pytest.approx(20.0)  # 500 us shrink against 480 of copies
    text = floor_sentence(floor, parts)
    assert "0.947 of the limit" in text and "100.0 us past its copies" in text and "experts 20.0" in text


def test_a_kernel_switch_is_set_against_the_default_kernel_of_its_run_and_left_out_of_the_cells(tmp_path):
    from dataclasses import fields, replace

    from mk.analysis.copies_floor import switch_effect, switch_sentence
    from mk.analysis.moe_one_user import moe_one_user_rows
    from mk.measure.on_chip import is_variant, tiles_words
    from mk.plan import Tiles
    from mk.views.answer import switch_figure

    default = Tiles()
    others = dict(weight_tile_bytes=2**20, head_tile_bytes=2**20, kv_tile=256, slots=4, lookahead_bytes=2**23,
                  kv_ahead=True, expert_bias_ahead=True, weight_priority=1, head_equal_share=0.0)  # fmt: skip
    assert set(others) == {f.name for f in fields(Tiles)}
    for name, value in others.items():  # every way a kernel variant's row says so, and the default's none
        assert is_variant("one chip" + tiles_words(replace(default, **{name: value}))), name
    assert not is_variant("one chip") and not is_variant("(g) the workbook's kernel: (f); loopback stand-in")
    base = dict(device="tpu: TPU v5 lite", model="gemma4-26b-a4b[:2]", engine="megakernel", steps_a_call=16,
                kernel_revision=6, date="2026-12-07T00:00:00Z", context=1024, batch=1)  # fmt: skip
    stand_in = dict(base, model="gemma4-26b-a4b")
    rows = [dict(base, setup="one chip", device_step_ms=2.0, device_fraction_of_limit=0.95),
            dict(base, setup="one chip; KV tiles read ahead", device_step_ms=1.98, device_fraction_of_limit=0.96),
            dict(base, setup="one chip; KV tiles read ahead", device_step_ms=1.9, device_fraction_of_limit=0.99,
                 date="2026-12-08T00:00:00Z"),
            dict(base, setup="one chip; KV tiles read ahead", device_step_ms=2.5, device_fraction_of_limit=0.9,
                 batch=8),
            dict(base, setup="one chip; expert biases read ahead", device_step_ms=1.95, device_fraction_of_limit=0.97),
            dict(base, setup="one chip; KV tiles read ahead; expert biases read ahead", device_step_ms=1.94,
                 device_fraction_of_limit=0.98),
            dict(stand_in, setup="(g) kernel; loopback stand-in", device_step_ms=1.5, device_fraction_of_limit=0.86),
            dict(stand_in, setup="(g) kernel; KV tiles read ahead; loopback stand-in", device_step_ms=1.46,
                 device_fraction_of_limit=0.88),
            dict(base, setup="one chip" + tiles_words(Tiles(weight_priority=1)), device_step_ms=1.99,
                 device_fraction_of_limit=0.955)]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "tpu.csv", index=False)
    got = switch_effect("KV tiles read ahead", tmp_path / "tpu.csv").set_index(["model", "setup"]).change_us
    # no default row in the other run, nor at the other batch; a switch's part in the middle of its setup; each
    # switch against the kernel with the other alone
    assert got.to_dict() == pytest.approx({("gemma4-26b-a4b[:2]", "one chip"): -20.0,
                                           ("gemma4-26b-a4b[:2]", "one chip; expert biases read ahead"): -10.0,
                                           ("gemma4-26b-a4b", "(g) kernel; loopback stand-in"): -40.0})  # fmt: skip
    both = switch_effect(path=tmp_path / "tpu.csv")  # every switch's rows, as tiles_words names each
    assert len(both) == 6 and set(both.switch) == {"KV tiles read ahead", "expert biases read ahead",
                                                   "weight copies at priority 1"}  # fmt: skip
    biases = both[both.switch == "expert biases read ahead"].set_index("setup").change_us
    assert biases.to_dict() == pytest.approx({"one chip": -50.0, "one chip; KV tiles read ahead": -40.0})
    said = switch_sentence(both)  # each switch: how many cells it sped up, by how much, where most
    assert (
        "With KV tiles read ahead, the kernel was faster in 3 of the 3 cells" in said and "(-40.0 to -10.0 us" in said
    )
    assert "most in gemma4-26b-a4b ((g) kernel; loopback stand-in, 1 user at 1,024): 1.5 -> 1.46 ms" in said
    assert "With expert biases read ahead, the kernel was faster in 2 of the 2 cells" in said
    assert (
        "With weight copies at priority 1, the kernel was faster in 1 of the 1 cell timed against it without (-10.0"
        in said
    )
    fig = switch_figure(both, "switches")  # a bar a switch row, the stand-in by its setup's name
    assert (
        sorted(len(b.y) for b in fig.data) == [1, 2, 3]
        and "gemma4-26b-a4b ((g) kernel, loopback stand-in), 1K, 1 user" in fig.data[0].y
    )
    full = pd.read_csv("data/measured/tpu.csv")
    assert full.setup.map(is_variant).any()  # the stored rows hold a variant, and the one-user cells leave it out
    assert not moe_one_user_rows().setup.map(is_variant).any()
