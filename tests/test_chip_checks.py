"""The chip's own checks of the model (mk.measure.chip_knockouts, .chip_clock, .attention_anchor, several steps a
call in mk.measure.on_chip) and their tables (mk.analysis.chip_checks), run on the CPU with calls of known times."""

from types import SimpleNamespace

import jax.numpy as jnp
import pandas as pd
import pytest

from mk.analysis import chip_checks
from mk.chips import measured_limit
from mk.config import get_config
from mk.kernel_setup import SETUPS
from mk.measure import attention_anchor, chip_clock, chip_knockouts
from mk.measure.on_chip import Case, Cell, a_token
from mk.params import EXPERTS, FULL_ATTENTION, HEAD, NORMS, SHARED_MLP
from mk.timing import predict
from mk.timing.work import named_plan


def test_a_call_of_n_steps_reads_as_a_step():
    row = dict(step_ms=8.0, step_low_ms=7.6, step_high_ms=8.4, device_step_ms=6.0, device_step_low_ms=5.6,
               device_step_high_ms=6.4, tokens_per_s=125.0, tokens_per_s_total=250.0, fraction_of_sol=0.2,
               fraction_of_sol_low=0.19, fraction_of_sol_high=0.21, batch=2)  # fmt: skip
    got = a_token(row, 4)
    assert (got["step_ms"], got["device_step_ms"], got["device_step_high_ms"]) == (2.0, 1.5, 1.6)
    assert (got["tokens_per_s"], got["tokens_per_s_total"], got["fraction_of_sol"]) == (500.0, 1000.0, 0.8)
    assert a_token(row, 1) is row


MS = 2.0**-10  # about a millisecond, in binary: a fake clock's sums of these are exact
V5E, CPU = "tpu: TPU v5 lite", "cpu: a CPU"  # measured rows' devices


class _TimedEngines:
    """Stands for mk.measure.on_chip.CaseEngines: a step takes 3 ms on ``clock``, 1.5 ms less with the MLP knocked
    out, a call of several steps that many times as long; each call names its program as a digest of what it knocks
    out."""

    def __init__(self, clock):
        self.clock = clock

    def call(self, engine, cell, knockout=frozenset(), steps=1):
        assert engine == "megakernel" and cell == Cell(64, 1)
        call = self.clock.step(steps * (3 * MS - (1.5 * MS if SHARED_MLP in knockout else 0.0)))
        call.program_digest = lambda: "program without " + ",".join(sorted(knockout))
        return call, 0.0


@pytest.mark.parametrize("steps", [1, 4])
def test_knockouts_give_each_components_shrink_a_step_beside_its_bytes(fake_clock, steps):
    """Each knock-out's shrink a step, exactly (a clock its calls advance), beside its bytes at the limit, each row
    naming the program it timed; a case timed at several steps a call has its knock-outs timed so, a token's."""
    case, cell = Case("tiny-llama", cells=(Cell(64, 1),), steps_a_call=(1, steps)), Cell(64, 1)
    limit = SimpleNamespace(bandwidth=1e9)
    rows = chip_knockouts.measure_knockouts(case, cell, _TimedEngines(fake_clock), limit, 0.5, lambda _: None,
                                            clock=fake_clock)  # fmt: skip
    by = {r["component"]: r for r in rows}
    assert set(by) == {"(whole step)", FULL_ATTENTION, SHARED_MLP, NORMS, HEAD}
    ms = 1e3 * MS  # the rows' milliseconds of one MS
    mlp = by[SHARED_MLP]
    assert (mlp["shrink_low_ms"], mlp["shrink_ms"], mlp["shrink_high_ms"]) == (round(1.5 * ms, 4),) * 3
    assert by[HEAD]["shrink_ms"] == by[HEAD]["shrink_high_ms"] == 0 and by[HEAD]["verdict"].startswith("noise")
    assert by["(whole step)"]["whole_ms"] == round(3 * ms, 4)  # a step's, not STEPS_BACK_TO_BACK's
    assert {r["steps_a_call"] for r in rows} == {steps}
    assert by[SHARED_MLP]["program_digest"] == "program without " + SHARED_MLP
    assert by["(whole step)"]["program_digest"] == "program without "
    mlp_bytes = chip_knockouts.component_bytes(case, cell)[SHARED_MLP]
    assert by[SHARED_MLP]["bytes_at_limit_ms"] == pytest.approx(mlp_bytes / 1e9 * 1e3, rel=1e-3)


def test_a_stand_in_has_no_bytes_of_the_whole_model():
    stand_in = Case("tiny-moe", setup="workbook", cells=(Cell(64, 1),))
    assert chip_knockouts.component_bytes(stand_in, Cell(64, 1)) is None


def test_a_stand_ins_modelled_knockout_is_its_chips_share_without_links(tmp_path):
    one, stand_in = Case("tiny-moe"), Case("tiny-moe", setup="workbook")
    rows = [dict(model="tiny-moe", layers="all", setup=c.setup_label, dtype="bf16", context=64, batch=1,
                 component=comp, whole_ms=1.0, device_step_ms=0.5, shrink_ms=0.5, shrink_low_ms=0.4,
                 shrink_high_ms=0.6, bytes_at_limit_ms=None, verdict="resolved", device=V5E)
            for c in (one, stand_in) for comp in ("(whole step)", EXPERTS)]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / chip_checks.KNOCKOUTS_CSV, index=False)
    t = chip_checks.knockout_table(tmp_path).set_index("setup")
    assert list(t.component) == [EXPERTS, EXPERTS]
    assert t.loc[stand_in.setup_label, "what"].startswith("tiny-moe, chip 0 of a v5e-8")
    alone = SETUPS["workbook"].replace(loopback=True)  # chip 0 exchanges with itself: local copies, no link
    on_eight = [predict(get_config("tiny-moe"), "tpu-v5e-8", 64, 1, "megakernel", setup=alone, knockout=k)
                for k in ((), {EXPERTS})]  # fmt: skip
    whole, off = (p.step_s for p in on_eight)
    assert t.loc[stand_in.setup_label, "modelled_shrink_ms"] == pytest.approx((whole - off) * 1e3)
    # chip 0 holds an eighth of the experts: knocking them out saves it less than it saves one chip holding all
    assert 0 < t.loc[stand_in.setup_label, "modelled_shrink_ms"] < t.loc[one.setup_label, "modelled_shrink_ms"]
    # the stand-in's bytes, which its run could not count: what chip 0's plan streams of the experts at the limit
    plan = named_plan("tiny-moe", "tpu-v5e-8", 64, 1, "workbook")
    share = plan.bytes_by_component(payload=True)[EXPERTS]
    assert share < named_plan("tiny-moe", "tpu-v5e", 64, 1, "workbook").bytes_by_component(payload=True)[EXPERTS]
    assert t.loc[stand_in.setup_label, "bytes_at_limit_ms"] == pytest.approx(
        share / measured_limit("tpu-v5e").bandwidth * 1e3
    )
    assert t.loc[one.setup_label].isna()["bytes_at_limit_ms"]  # a one-chip row's bytes: as its run wrote them


def test_the_resident_kernel_computes_its_chain_and_refuses_other_work():
    x = jnp.full((chip_clock.ROWS, chip_clock.WIDTH), 2.0, jnp.float32)
    w = (jnp.eye(chip_clock.WIDTH) * 0.5).astype(jnp.bfloat16)
    assert float(chip_clock.resident_kernel("matmul", 3, interpret=True)(x, w)[0, 0]) == 2.0 * 0.25**3
    assert float(chip_clock.resident_kernel("elementwise", 2, interpret=True)(x, w)[0, 0]) == 2.0
    with pytest.raises(ValueError, match="kind must be one of"):
        chip_clock.resident_kernel("transpose", 2)


def test_the_clock_table_says_which_kernels_give_a_clock(tmp_path):
    """Each kind's clock from a chip's rows; an interpreted run's rows on a CPU (the tests' own) are no chip's."""
    rows = [dict(date="d", device=device, kind=k, trips=n, bundles=b * n, device_us=us, clock_GHz=c, clock_low_GHz=c,
                 clock_high_GHz=c, assumed_clock_GHz=1.5) for k, b, c, runs, device in
            (("matmul", 150, 1.0, ((1000, 160.0), (10000, 1510.0)), V5E),
             ("elementwise", 8, 5.0, ((1000, 100.0), (10000, 114.0)), V5E),
             ("vector", 8, 0.001, ((1000, 1e6), (10000, 1e7)), CPU)) for n, us in runs]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / chip_checks.CLOCK_CSV, index=False)
    t = chip_checks.clock_table(tmp_path).set_index("work")
    assert sorted(t.index) == ["elementwise", "matmul"] and set(t.device) == {V5E}
    assert t.loc["matmul", "verdict"].startswith("issue-bound")
    assert t.loc["matmul", "device_ns_a_trip"] == pytest.approx(150.0)
    assert t.loc["matmul", "time_over_schedule"] == pytest.approx(1.5)
    assert t.loc["elementwise", "verdict"] == "the call's fixed cost hides the trips"


def test_the_anchors_cache_is_the_users_pages_of_one_layer_type():
    cfg = get_config("tiny-llama")
    q, pages, lens, indices, cu_q, seqs = attention_anchor.paged_inputs(cfg, 300, 2)
    per_user = -(-300 // attention_anchor.PAGE)
    hd = cfg.head_dim(cfg.layer_types[0])
    assert q.shape == (2, cfg.num_heads, hd) and len(pages) == cfg.num_layers
    assert pages[0].shape == (2 * per_user, attention_anchor.PAGE, 2 * cfg.kv_heads(cfg.layer_types[0]), hd)
    assert lens.tolist() == [300, 300] and indices[1, 0] == per_user and cu_q.tolist() == [0, 1, 2]
    assert seqs.tolist() == [2]
    assert attention_anchor.attention_only(cfg) == {SHARED_MLP, NORMS, HEAD}
    with pytest.raises(ValueError, match="one attention type"):
        attention_anchor.paged_inputs(get_config("tiny-dense"), 64, 1)  # sliding and full layers


def test_a_knocked_out_router_reads_the_first_k_experts_only():
    """As on the chip: the 26B-A4B pair's 8 users read 1.43 ms less with the router off (tpu_knockouts.csv)."""
    from mk.kernel_setup import ONE_CHIP
    from mk.params import ROUTER
    from mk.timing import named_plan

    off = named_plan("tiny-moe", "tpu-v5e", 64, 8, ONE_CHIP, knockout=(ROUTER,))
    on = named_plan("tiny-moe", "tpu-v5e", 64, 8, ONE_CHIP)
    assert off.distinct_experts == {2: 1.0} and sum(n * p for n, p in on.distinct_experts.items()) > 5


def test_a_rate_is_the_extra_work_over_the_extra_time_paired_by_round():
    from mk.measure.loop import Comparison

    raw = {"short": [1.0, 1.2, 1.0], "long": [3.0, 3.2, 3.5]}  # each time spans 10 calls
    c = Comparison("short", {}, {}, 0.95, 3, 0.0, (0.0, 0.0), raw=raw)
    assert c.rate("short", "long", 100.0, calls=10).median == pytest.approx(500.0)  # 100 a call over 2 s / 10


def test_a_resumed_knockout_run_skips_the_cells_this_kind_of_device_measured(tmp_path):
    from mk.timing.scheduled import kernel_revision

    base = dict.fromkeys(chip_knockouts.COLUMNS, "") | dict(
        kernel_revision=kernel_revision(), model="tiny-llama", setup="one chip", dtype="bf16", context=64, batch=1
    )
    rows = [base | dict(device=CPU), base | dict(device=V5E, context=128), base | dict(device=V5E, steps_a_call=16)]
    pd.DataFrame(rows).to_csv(tmp_path / "k.csv", index=False)
    # a row without steps a call (before the column) was one step a call
    assert chip_knockouts._done(tmp_path / "k.csv", "tpu") == {
        ("tiny-llama", "one chip", "bf16", 128, 1, 1),
        ("tiny-llama", "one chip", "bf16", 64, 1, 16),
    }


def test_a_revision_run_reads_as_the_change_between_its_kernels(tmp_path):
    ms = {"reference": 5.0, "megakernel[r2]": 4.0, "megakernel[r3]": 3.0}
    rows = [dict(date="2026-12-05T00:00:00Z", device=V5E, model="tiny-llama", context=64, batch=1, variant=v, rounds=9,
                 device_step_ms=m, device_step_low_ms=m - 0.01, device_step_high_ms=m + 0.01)
            for v, m in ms.items()]  # fmt: skip
    rows.append(dict(rows[-1], device=CPU, variant="megakernel[r4]", device_step_ms=900.0))  # interpreted: no chip's
    pd.DataFrame(rows).to_csv(tmp_path / "one.csv", index=False)
    stand_in = [dict(r, setup=Case("tiny-moe", setup="workbook").setup_label, model="tiny-moe") for r in rows[1:]]
    pd.DataFrame(stand_in).to_csv(tmp_path / "two.csv", index=False)
    t = chip_checks.revision_table(tmp_path, ("one.csv", "two.csv"))
    assert list(t.revisions) == ["2 -> 3", "2 -> 3"] and list(t.what)[0] == "tiny-llama"
    assert t.change.tolist() == pytest.approx([-0.25, -0.25]) and t.xla_over_after.iloc[0] == pytest.approx(5 / 3)
    assert t.what.iloc[1].startswith("tiny-moe, chip 0 of a v5e-8") and t.xla_ms.isna().iloc[1]
    # a run at one and 16 steps a call: a cell each, its revisions compared within it
    several = [dict(r, steps_a_call=n, device_step_ms=r["device_step_ms"] / n) for r in rows[:3] for n in (1, 16)]
    pd.DataFrame(several).to_csv(tmp_path / "three.csv", index=False)
    t = chip_checks.revision_table(tmp_path, ("three.csv",)).set_index("steps_a_call")
    assert list(t.index) == [1, 16] and t.change.tolist() == pytest.approx([-0.25, -0.25])
    assert t.after_ms[16] == pytest.approx(3.0 / 16)
    assert (chip_checks.revision_table(tmp_path, ("one.csv",)).steps_a_call == 1).all()  # a run without the column


def test_a_routed_models_router_and_norms_knockouts_are_not_like_for_like(tmp_path):
    rows = [dict(model=m, layers="all", setup="one chip", dtype="bf16", context=64, batch=1, component=c, whole_ms=1.0,
                 device_step_ms=0.5, shrink_ms=0.2, shrink_low_ms=0.1, shrink_high_ms=0.3, bytes_at_limit_ms=0.01,
                 verdict="resolved", device=V5E)
            for m in ("tiny-moe", "tiny-llama") for c in ("(whole step)", NORMS, SHARED_MLP)]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / chip_checks.KNOCKOUTS_CSV, index=False)
    t = chip_checks.knockout_table(tmp_path).set_index(["model", "component"]).verdict
    assert t["tiny-moe", NORMS].startswith("not like for like") and t["tiny-moe", SHARED_MLP] == "resolved"
    assert t["tiny-llama", NORMS] == "resolved"  # no routing to change


def _probe_rows(variants: dict, **cell):
    return [dict(date="2026-12-06T00:00:00Z", device=V5E, model="tiny-moe", context=64, batch=1, variant=v,
                 device_step_ms=m, device_step_low_ms=m - 0.001, device_step_high_ms=m + 0.001, **cell)
            for v, m in variants.items()]  # fmt: skip


def test_a_probe_reads_as_its_change_against_the_kernel_it_differs_from(tmp_path):
    stand_in = Case("tiny-moe", setup="workbook").setup_label
    pd.DataFrame(_probe_rows({"base": 1.0, "fixed-route": 0.9, "fixed-route-no-route-wait": 0.8995},
                             setup=stand_in)).to_csv(tmp_path / "a.csv", index=False)  # fmt: skip
    depths = pd.DataFrame(_probe_rows({"deep": 0.3, "shallow": 0.25})).drop(columns="variant").assign(layers=[30, 1])
    depths.to_csv(tmp_path / "b.csv", index=False)
    probes = (("a.csv", "fixed-route", "base", "x"), ("a.csv", "fixed-route-no-route-wait", "fixed-route", "y"),
              ("b.csv", "1 layers", "30 layers", "z"), ("a.csv", "not run", "base", "w"))  # fmt: skip
    t = chip_checks.probe_table(tmp_path, probes)
    assert list(t.probe) == ["fixed-route", "fixed-route-no-route-wait", "1 layers"]
    assert t.difference_ms.tolist() == pytest.approx([-0.1, -0.0005, -0.05])
    assert t.beyond_both_intervals.tolist() == [True, False, True]
    assert t.what.iloc[0].startswith("tiny-moe, chip 0 of a v5e-8") and t.what.iloc[2] == "tiny-moe"


def test_the_stand_ins_share_parts_add_up_to_its_step_past_its_bytes():
    from mk.analysis.on_tpu import cell_words

    stand_in = Case("tiny-moe", setup="workbook").setup_label
    rows = (("a", 9.0, 0.5), ("b", 2.0, 0.8))  # (date, device ms, fraction of the limit)
    steps = pd.DataFrame([dict(model="tiny-moe", setup=stand_in, context=1024, batch=1, engine="megakernel", date=d,
                               device_ms=ms, device_fraction_of_limit=f) for d, ms, f in rows])  # fmt: skip
    what = cell_words("tiny-moe", stand_in, "bf16")
    probes = pd.DataFrame([dict(what=what, batch=1, context=1024, probe=p, difference_ms=d, source="s")
                           for p, d in (("fixed-route-no-route-wait", -0.1), ("step, picks only", 0.01),
                                        ("fixed-route", -0.3))])  # fmt: skip
    t = chip_checks.stand_in_share_parts(steps, probes).set_index("part")
    assert t.ms.iloc[0] == pytest.approx(0.4) and t.step_ms.iloc[0] == 2.0  # the newest row: 2 ms at 0.8 of the limit
    assert t.loc["the experts' loads held back for their route", "share_of_past"] == pytest.approx(0.25)
    assert t.loc["writing the logits out", "ms"] == pytest.approx(-0.01)  # a probe that costs shows, placing nothing
    assert t.loc["not placed by these probes", "ms"] == pytest.approx(0.3)  # the router's knock-out is not a part


def test_a_format_run_reads_as_its_kernel_against_the_same_kernel_on_bf16(tmp_path):
    """Each cell: the kernel on the format and on bf16, XLA's step in each kernel's own loop, the speed-ups and the
    bytes ratio from the rows' own device times and bytes."""
    cell = dict(date="2026-12-06T00:00:00Z", device=V5E, model="tiny-dense", context=64, batch=1, chip="tpu-v5e")
    rows = [("reference", "fp8-block", 3.0, 100, 0.5), ("megakernel", "fp8-block", 2.0, 60, 0.8),
            ("reference", "bf16", 3.2, 110, 0.9), ("megakernel", "bf16", 3.0, 110, 0.95)]  # fmt: skip
    pd.DataFrame([dict(cell, engine=e, dtype=d, device_step_ms=ms, device_step_low_ms=ms - 0.01,
                       device_step_high_ms=ms + 0.01, bytes_per_token=b, device_fraction_of_limit=f)
                  for e, d, ms, b, f in rows]).to_csv(tmp_path / "f.csv", index=False)  # fmt: skip
    t = chip_checks.format_table(tmp_path, (("f.csv", "fp8-block"),))
    r = t.iloc[0]
    assert (r.format_ms, r.bf16_ms, r.xla_bf16_ms) == (2.0, 3.0, 3.2)
    assert r.speedup_over_bf16 == pytest.approx(1.5) and r.bytes_over_bf16 == pytest.approx(60 / 110)
    # each kernel's fraction of the limit from its own bytes and time, over the chip's measured limit now (the rows'
    # stored fractions were of their day's limit)
    limit = measured_limit("tpu-v5e").bandwidth
    assert r.format_fraction_of_limit == pytest.approx(60 / 2e-3 / limit)
    assert r.bf16_fraction_of_limit == pytest.approx(110 / 3e-3 / limit)
    assert r.xla_ms == 3.0 and r.speedup_over_xla == pytest.approx(1.5)  # XLA in the format kernel's own loop
    # a run that timed the format alone: against XLA only, the bf16 columns empty
    pd.read_csv(tmp_path / "f.csv").iloc[:2].to_csv(tmp_path / "g.csv", index=False)
    alone = chip_checks.format_table(tmp_path, (("g.csv", "fp8-block"),)).iloc[0]
    assert alone.speedup_over_xla == pytest.approx(1.5) and pd.isna(alone.get("bf16_ms"))
