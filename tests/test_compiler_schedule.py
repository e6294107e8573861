"""The megakernel's step as libtpu schedules it (mk.measure.compiler_schedule, mk.timing.scheduled): the stored rows
of a small case are what the compiler gives today, and a step's counted bundles grow with its context and its users
as the plan says they should."""

import importlib.util

import pandas as pd
import pytest

from mk.chips import get_chip
from mk.measure.compiler_schedule import STORED_CASES, compile_schedule, schedule_for
from mk.megakernel.aot import program_digest
from mk.paths import SCHEDULE_DIR
from mk.timing import named_plan
from mk.timing.scheduled import (
    KV_TILES,
    PLAIN,
    SCOPED,
    evaluate,
    factor_values,
    kernel_revision,
    kernel_revisions,
    scheduled_step,
    stored_rows,
)

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="the schedule needs libtpu")
ROW = ["compile", "scope", "factors", "bundles"]


def _sorted(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[ROW].sort_values(ROW[:3]).reset_index(drop=True)


def test_every_stored_case_has_rows_and_they_add_up():
    """data/schedule holds each case the refresh command compiles: the scoped rows' total within 10% of the step's
    (the marks keep neighbouring items apart, which costs or saves the scheduler a little), each item kind named by the
    plan, and the step's time is its bundles as the timing model charges them: every one a cycle of the clock without
    the measured stalls, and with them (a v5e's matrix and norm work measured slower) each scope's at its own rate."""
    from dataclasses import replace

    from mk.timing.scheduled import seconds_a_bundle

    for case in STORED_CASES:
        plan = named_plan(*case)
        rows = stored_rows(plan)
        assert rows is not None, f"{case} has no stored rows: python -m mk schedule --refresh"
        chip = get_chip(case[1])
        s = scheduled_step(plan, chip, rows)
        assert abs(s.scoped_overhead) < 0.10
        assert set(s.by_scope) - {"other"} <= set(s.counts)
        at_clock = replace(s, stalls=False)
        assert at_clock.compute_s == pytest.approx(s.bundles / 1.97e14 * (4 * 128 * 128 * 2))
        charged = seconds_a_bundle(chip)
        assert s.compute_s == pytest.approx(sum(b * charged(scope) for scope, b in s.by_scope.items()))
        assert s.compute_s > at_clock.compute_s  # the v5e's matrix tiles and norms issue under one bundle a cycle


def test_each_stored_schedule_names_a_kernel_revision_and_its_file_says_which():
    """data/kernel_revisions.csv numbers the kernel's revisions 1, 2, ... each with what changed; every stored file is
    keyed by one of them and its rows say the same revision."""
    revs = kernel_revisions()
    assert list(revs.revision) == list(range(1, len(revs) + 1)) and revs.change.str.len().min() > 40
    assert kernel_revision() == len(revs)
    files = sorted(SCHEDULE_DIR.glob("*.csv"))
    assert files
    for f in files:
        rev = int(f.name.split("_")[1].removeprefix("k"))
        assert 1 <= rev <= len(revs), f
        assert set(pd.read_csv(f, usecols=["revision"]).revision) == {rev}, f


def test_revision_two_lists_the_routed_experts_in_fewer_bundles_and_a_shorter_step():
    """The change data/kernel_revisions.csv records for revision 2 (the routed experts listed by vector work, not a
    scalar loop over the chip's 128 experts) issues fewer bundles per route in libtpu's schedule, and the modelled step
    of the workbook's kernel for gemma4-26b-a4b on a v5e-8 shortens with it (both revisions' rows are kept). Revision 3
    (heads under 128 lanes packed) leaves its 256- and 512-lane heads' kernel as it was: the same schedule. Revision 4
    (a routed slot 0 runs whatever its index) adds a few bundles to each guarded expert tile and moves the step by
    less than 0.1%. Revision 5 (a head in small equal tiles widened) leaves Gemma's head, in 5.5 MiB tiles, as it
    was; revisions 6, 8 and 9 (switches, off by default) and 7 and 10 (code moved into helpers) leave the default
    kernel as it was."""
    from mk.analysis.compiler_clock import revision_effect
    from mk.kernel_setup import WORKBOOK_KERNEL

    t = revision_effect("gemma4-26b-a4b", "tpu-v5e-8", [(1024, 1)], WORKBOOK_KERNEL).set_index("revision")
    assert list(t.index) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert t.loc[5, "bundles_per_step"] == t.loc[4, "bundles_per_step"] and t.loc[5, "step_ms"] == t.loc[4, "step_ms"]
    for r in (6, 7, 8, 9, 10):  # the default kernel as revision 5 built it
        assert t.loc[r, "bundles_per_step"] == t.loc[5, "bundles_per_step"]
        assert t.loc[r, "step_ms"] == t.loc[5, "step_ms"]
    assert t.loc[3, "bundles_per_step"] == t.loc[2, "bundles_per_step"] and t.loc[3, "step_ms"] == t.loc[2, "step_ms"]
    assert t.loc[4, "bundles_per_step"] > t.loc[3, "bundles_per_step"]
    assert t.loc[4, "step_ms"] == pytest.approx(t.loc[3, "step_ms"], rel=1e-3)
    assert t.loc[2, "Route bundles each"] < t.loc[1, "Route bundles each"] / 2
    assert t.loc[2, "step_ms"] < t.loc[1, "step_ms"] and t.loc[2, "step_saved_ms"] > 0
    assert t.loc[2, "fraction_of_sol"] > t.loc[1, "fraction_of_sol"]


@needs_libtpu
def test_the_tiny_stored_cases_name_the_program_this_tree_traces():
    """A stored schedule names the digest of the program it was compiled from (or carried over to a later kernel
    revision unchanged): the tiny cases' are the kernel this tree traces, so changed kernel code is never charged the
    old code's schedule."""
    for case in STORED_CASES[:3]:
        plan = named_plan(*case)
        assert set(stored_rows(plan)["program"]) == {program_digest(plan, case[1])}, case


@needs_libtpu
def test_the_stored_small_case_is_what_the_compiler_gives_today():
    case = STORED_CASES[0]
    plan = named_plan(*case)
    today = compile_schedule(plan, case[1])
    pd.testing.assert_frame_equal(_sorted(today), _sorted(stored_rows(plan)))
    # it has work that runs per KV tile and per routed expert slot, and the rows of both compiles
    assert {f for f in today["factors"] if f} >= {KV_TILES + "sliding", KV_TILES + "full", "Routed"}
    assert set(today["compile"]) == {PLAIN, SCOPED}


@needs_libtpu
def test_a_steps_bundles_grow_with_context_and_users():
    """The same kernel at twice the context runs each full-attention layer's loop over KV tiles twice as often: the
    step's counted bundles grow by exactly those loops' bundles times the extra tiles. Two users issue more than one."""
    counted, rows = {}, {}
    for context, users in ((1024, 1), (2048, 1), (1024, 2)):
        plan = named_plan("tiny-dense", "tpu-v5e", context, users, "workbook")
        rows[context, users] = r = compile_schedule(plan, "tpu-v5e", plain=False)
        counted[context, users] = (evaluate(r, factor_values(plan)).sum(), factor_values(plan))
    (short, at_short), (long, at_long) = counted[1024, 1], counted[2048, 1]
    per_tile = rows[1024, 1].groupby("factors")["bundles"].sum()
    extra = sum(per_tile[f] * (at_long[f] - at_short[f]) for f in at_short)
    assert at_long[KV_TILES + "full"] > at_short[KV_TILES + "full"] and extra > 0
    assert long - short == extra
    assert counted[1024, 2][0] > short


def test_without_libtpu_or_stored_rows_one_line_says_what_is_missing(monkeypatch, tmp_path, capsys):
    import importlib.util as iu

    from mk.__main__ import main

    real = iu.find_spec
    monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        main(["schedule", "--model", "tiny-dense", "--chip", "tpu-v5e"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "needs libtpu" in err
    with pytest.raises(SystemExit, match="--refresh / --missing"):  # every kept case, or one plan: not both
        main(["schedule", "--refresh", "--model", "tiny-dense"])
    with pytest.raises(LookupError, match="no stored schedule"):
        schedule_for(named_plan("tiny-dense", "tpu-v5e", 64, 1, "workbook"), "tpu-v5e", stored=True, folder=tmp_path)


def test_predict_takes_the_cores_costs_from_the_stored_schedule(capsys):
    """The workbook's headline case reads its op costs from data/schedule and says so; an assumed cost given sets the
    schedule aside (a sensitivity), and a plan with no stored schedule says its costs are assumed."""
    import json

    from mk.__main__ import main
    from mk.timing import GivenCosts, predict

    assert main(["predict", "--model", "gemma4-26b-a4b", "--chip", "tpu-v5e-8", "--context", "1024", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["op_costs"] == "compiler-scheduled" and "libtpu" in d["constants"]["op_costs"]
    scheduled = predict("gemma4-26b-a4b", "tpu-v5e-8", 1024)
    assumed = predict("gemma4-26b-a4b", "tpu-v5e-8", 1024, costs=GivenCosts(0.0, 0.0))
    assert assumed.op_costs == "assumed" and scheduled.step_s > assumed.step_s  # issuing costs the core time
    assert predict("gemma4-26b-a4b", "tpu-v5e-8", 4096, 2).op_costs == "assumed"  # no schedule kept for it


def test_bundles_waiting_on_a_unit_take_the_measured_issue_rate(tmp_path):
    """A clock check's issue-bound kinds (trips most of their call) give the rates the model charges a matrix
    product's and a norm's bundles at; a kind whose dispatch hides its trips gives none; other scopes, and every scope
    with ``stalls`` off, one cycle of the chip's clock."""
    from mk.chips import measured_issue_rates
    from mk.timing import GivenCosts, predict
    from mk.timing.scheduled import OTHER, seconds_a_bundle

    rows = [("matmul", 2000, 420.0, 0.96), ("matmul", 20000, 3700.0, 0.96),  # issue-bound: trips 100% of the call
            ("elementwise", 2000, 137.0, 5.6), ("elementwise", 20000, 158.0, 5.6)]  # fmt: skip
    path = tmp_path / "clock.csv"
    pd.DataFrame(
        [dict(date="d", device="tpu: TPU v5 lite", kind=k, trips=n, device_us=us, clock_GHz=g) for k, n, us, g in rows]
        + [dict(date="d", device="tpu: TPU v4", kind="vector", trips=n, device_us=n, clock_GHz=0.3) for n in (1, 9)]
    ).to_csv(path, index=False)
    assert measured_issue_rates("tpu-v5e-8", path) == {"matmul": 0.96e9}
    v5e = get_chip("tpu-v5e")
    bundle_s = seconds_a_bundle(v5e)  # the stored tpu_clock.csv: both kinds measured issue-bound
    assert bundle_s("MatmulTile.experts") == bundle_s("HeadTile") == pytest.approx(1 / 0.9595e9, rel=0.01)
    assert bundle_s("Norm") == pytest.approx(1 / 0.2947e9, rel=0.01)
    assert bundle_s("Attend.full") == bundle_s(OTHER) == seconds_a_bundle(v5e, stalls=False)("Norm") == 1 / v5e.clock_hz
    stalled, at_clock = (predict("llama-3.2-1b", "tpu-v5e", 1024, costs=GivenCosts(stalls=s)) for s in (True, False))
    assert stalled.op_costs == at_clock.op_costs == "compiler-scheduled" and "tpu_clock.csv" in stalled.op_cost_words
    assert stalled.step_s > at_clock.step_s and "tpu_clock.csv" not in at_clock.op_cost_words
