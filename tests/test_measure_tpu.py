"""``python -m mk tpu-smoke`` (mk.measure.smoke): refused in one line without a TPU; the whole path run once over
simulated chips (the kernel in Pallas TPU interpret mode, races checked), its rows labelled as the CPU's; the command's
default run on one chip, which times both engines, and its run whose budget is spent, which says so and exits 1; which
engines are timed together; bad input refused."""

import csv
import dataclasses
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from mk.__main__ import main
from mk.chips import get_chip
from mk.config import FULL, TINY_MOE
from mk.measure import chip_parity, smoke
from mk.measure.harness import HBM_USE

ROOT = Path(__file__).resolve().parent.parent
# One full layer of the tiny MoE: the interpreted 8-chip step is the run's cost (~5 s a call on 2 cores).
ONE_LAYER = TINY_MOE.replace(name="tiny-moe-1-layer", layer_types=(FULL,))


def test_without_a_tpu_the_command_says_so_in_one_line_and_exits_2():
    out = subprocess.run(
        [sys.executable, "-m", "mk", "tpu-smoke"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "tpu-smoke: no TPU found (JAX backend: cpu); run it on a TPU VM or slice (pip install -r requirements-tpu.txt)"
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "gemma5"], "unknown model 'gemma5'"),
        (["--parity-model", "tiny"], "unknown model 'tiny'"),
        (["--chips", "3"], "whole placement puts E/G whole experts on each of G = 3 chips"),  # 128 experts, 3 chips
        (["--placements", "whole,diagonal"], "placements must be some of"),
        (["--budget-s", "0"], "budget_s must be positive"),
        (["--chip", "tpu-v9"], "unknown chip 'tpu-v9'"),
    ],
)
def test_bad_input_gets_one_line_and_exit_2(capsys, args, message):
    assert main(["tpu-smoke", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_engines_are_timed_together_where_they_fit_else_beside_the_reference_else_alone():
    gb = 1e9
    needs = {"reference": (6 * gb, 0), "megakernel[whole]": (7 * gb, 2 * gb), "megakernel[split]": (9 * gb, 2 * gb)}
    assert smoke.groups_that_fit(needs, None) == ([list(needs)], {})
    assert smoke.groups_that_fit(needs, 24 * gb) == ([list(needs)], {})
    pairs = [["reference", "megakernel[whole]"], ["reference", "megakernel[split]"]]
    assert smoke.groups_that_fit(needs, 17 * gb) == (pairs, {})
    assert smoke.groups_that_fit(needs, 13 * gb) == ([[e] for e in needs], {})
    groups, skipped = smoke.groups_that_fit(needs, 10 * gb)
    assert groups == [["reference"], ["megakernel[whole]"]]
    assert skipped == {"megakernel[split]": "needs 11.0 GB per chip, 10.0 GB usable"}


@pytest.mark.slow
def test_a_run_over_simulated_chips_checks_times_and_writes_rows_labelled_as_the_cpu(tmp_path):
    """The whole path once, over 2 simulated chips (8 run the same code, four times the interpreting; the
    8-chip kernel is held to transformers in tests/test_sharding.py): parity of the interpreted kernel (race
    detector on) with the reference for ragged users, then both steps timed interleaved (the reference split
    over the devices by GSPMD), rows appended to a CSV. The speed of light is a v5e-2's, given: the CPU is no
    chip in chips.csv."""
    out = tmp_path / "measured" / "tpu.csv"
    r = smoke.run(
        smoke.SmokeRun(
            ONE_LAYER,
            ONE_LAYER,
            context=32,
            placements=("whole",),
            chips=2,
            budget_s=600,
            out=out,
            require_tpu=False,
            chip="tpu-v5e",
            parity_tokens=2,
            min_rounds=3,
            max_rounds=3,
            quiet=True,
            families=(),  # every family's check on one chip: tests/test_tpu_runs.py
            formats=(),
            steps=2,
        )
    )
    assert not r.failed and not r.notes, r.notes
    (check,) = r.parity
    assert check["placement"] == "whole" and check["held"] and check["same_tokens"] and check["races"] is False

    assert os.listdir(out.parent) == ["tpu.csv"]  # no temporary file left beside it
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == smoke.COLUMNS
        rows = {row["engine"]: row for row in reader}
    assert set(rows) == {"reference", "megakernel"}
    ref, mk = rows["reference"], rows["megakernel"]
    assert mk["setup"] == "2 chips, whole experts" and ref["setup"] == "GSPMD over 2 chips"
    assert mk["interleaved_with"] == "reference, reference back to back"
    assert ref["interleaved_with"] == "megakernel[whole], megakernel[whole] back to back"
    assert "interpret mode" in mk["runs_as"] and "GSPMD over 2 chips" in ref["runs_as"]
    for row in rows.values():
        assert row["device"].startswith("cpu") and row["backend"] == "cpu" and row["chips"] == "2"
        assert row["libtpu_version"] == metadata.version("libtpu")
        assert re.fullmatch(r"[0-9a-f]{12}( \(with uncommitted changes\))?", row["commit"]), row["commit"]
        assert row["model"] == ONE_LAYER.name and row["dtype"] == "bf16" and row["context"] == "32"
        assert row["rounds"] == "3" and row["weights"] == "random (seed 0)"
        low, median, high = (float(row[k]) for k in ("step_low_ms", "step_ms", "step_high_ms"))
        assert 0 < low <= median <= high
        assert float(row["tokens_per_s"]) == pytest.approx(1e3 / median, rel=1e-3, abs=0.01)  # rounded to 0.01
        assert row["sol_source"].startswith("tpu-v5e-2 spec") and "given, the device is cpu" in row["sol_source"]
        assert row["chip"] == "tpu-v5e-2"  # the slice the timing model predicts the row for (mk.analysis.verdict)
        assert 0 < float(row["fraction_of_sol_low"]) <= float(row["fraction_of_sol"]) <= 1
        assert int(row["bytes_per_token"]) > 0
        assert row["steps_back_to_back"] == "2" and 0 < float(row["device_step_ms"])
        assert row["limit_GBps"] == "" and row["profile_source"] == "not profiled"  # no TPU measured on a CPU
    assert "tiny-moe-1-layer" in smoke.text(r) and "parity: whole held" in smoke.text(r)
    assert json.loads(json.dumps(r.to_dict()))["csv"] == str(out)  # what --json prints


# What the README's tpu-smoke line runs on one chip, cut to what a CPU interprets in seconds: a tiny dense model timed
# and checked at a short context; every other option the command's default.
ONE_CHIP = ["tpu-smoke", "--model", "tiny-dense", "--parity-model", "tiny-dense", "--chips", "1", "--context", "32"]


@pytest.fixture
def smoke_runs(monkeypatch):
    """``python -m mk tpu-smoke`` in this process on the CPU: the runs the command asks for, recorded, each run as
    asked but off a TPU (its interpreted kernel, its rows the CPU's) with the timing loop cut to 3 rounds of 2 steps
    back to back (the budget and every other choice the command's)."""
    asked, run = [], smoke.run

    def on_the_cpu(s: smoke.SmokeRun) -> smoke.Result:
        asked.append(s)
        return run(dataclasses.replace(s, require_tpu=False, min_rounds=3, max_rounds=3, steps=2))

    monkeypatch.setattr(smoke, "run", on_the_cpu)
    return asked


@pytest.fixture
def asked_runs(monkeypatch):
    """The runs ``python -m mk tpu-smoke`` asks for, recorded, each then stopped as if there were no TPU (exit 2)."""
    asked = []

    def stop(s: smoke.SmokeRun):
        asked.append(s)
        raise smoke.NoTPU("stopped")

    monkeypatch.setattr(smoke, "run", stop)
    return asked


@pytest.mark.slow
def test_the_default_run_on_one_chip_checks_the_parity_model_and_times_both_engines(tmp_path, capsys, smoke_runs):
    out = tmp_path / "tpu.csv"
    assert main([*ONE_CHIP, "--out", str(out)]) == 0
    (asked,) = smoke_runs
    assert asked.families == () and asked.formats == () and asked.budget_s == 300  # no family checks; 300 s to time
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("tiny-dense, bf16, context 32, batch 1 on 1 x cpu")
    assert [line.split()[0] for line in printed[1:3]] == ["reference", "megakernel"]  # both timed, a row each
    assert printed[3:] == ["  parity: one run held", f"  appended to {out}"]  # no note: nothing skipped
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["engine"] for r in rows] == ["reference", "megakernel"]
    assert {r["setup"] for r in rows} == {"one chip"} and {r["rounds"] for r in rows} == {"3"}


def test_a_run_whose_budget_is_spent_says_so_and_exits_1(tmp_path, capsys, smoke_runs):
    """The budget counts from the end of the checks: the parity model is checked all the same, then nothing is built
    or timed, the run says why and how to mend it, writes no row and fails."""
    out = tmp_path / "tpu.csv"
    with pytest.raises(SystemExit) as exit_:
        main([*ONE_CHIP, "--budget-s", "0.001", "--out", str(out)])
    assert exit_.value.code == 1
    r = capsys.readouterr()
    assert r.out.splitlines() == [
        "nothing was timed",
        "  parity: one run held",
        "  note: reference, megakernel: not timed, the 0.001 s budget for the builds and the timing was spent "
        "(a larger --budget-s)",
    ]
    assert "parity, no placement: held" in r.err and "compiled" not in r.err  # checked, then nothing built
    assert not out.exists()


def test_the_family_checks_run_only_when_asked(asked_runs):
    """--family-parity adds every family's tiny model and every format (mk.measure.chip_parity) before the parity
    model; without it none."""
    for args in (["tpu-smoke"], ["tpu-smoke", "--family-parity"]):
        with pytest.raises(SystemExit):
            main(args)
    default, family = asked_runs
    assert (default.families, default.formats) == ((), ())
    assert (family.families, family.formats) == (chip_parity.FAMILIES, chip_parity.FORMATS)
    assert len(chip_parity.checks(family.families, family.formats)) == 19  # 229 s on a v5e before they were asked


def test_the_text_says_how_many_family_checks_held_and_names_those_that_did_not():
    def row(model, dtype, held, quantize="none"):
        return dict(model=model, dtype=dtype, quantize=quantize, held=held)

    checks = [row("tiny-dense", "f32", True), row("tiny-moe", "bf16", False), row("tiny-moe", "f32", False, "int4")]
    parity = [dict(placement=smoke.NO_PLACEMENT, held=True)]
    lines = smoke.text(smoke.Result([], parity, [], True, family_checks=checks)).splitlines()
    assert lines[-1] == "  family parity: 1 of 3 held (FAILED: tiny-moe bf16, tiny-moe f32 int4)"
    assert "family parity" not in smoke.text(smoke.Result([], parity, [], True))


def test_the_readmes_line_is_the_default_run_and_both_engines_fit_one_v5e_together(asked_runs):
    """The README's "On a TPU VM" tpu-smoke line: the command's defaults but the model, whose two engines' arrays (as
    the run plans them before building) fit one v5e's usable HBM together, so one group times both (the budget then
    spent by nothing else)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### On a TPU VM") : text.index("### On a multi-host slice")]
    (line,) = [x for x in section.splitlines() if x.startswith(".venv/bin/python -m mk tpu-smoke")]
    args = line.split("#")[0].split()[3:]
    assert args == ["tpu-smoke", "--model", "llama-3.2-1b"]
    with pytest.raises(SystemExit):
        main(args)
    (asked,) = asked_runs
    defaults = smoke.SmokeRun()
    assert dataclasses.replace(asked, out=Path(asked.out)) == dataclasses.replace(defaults, model="llama-3.2-1b")
    engines = [smoke.EngineChoice("reference"), smoke.EngineChoice("megakernel")]
    assert smoke.placements_for(asked.cfg, 1, asked.placements) == (smoke.NO_PLACEMENT,)
    needs = {e.label: smoke.hbm_per_chip_needed(asked.cfg, e, 1, asked.context, asked.batch, asked.dtype)
             for e in engines}  # fmt: skip
    capacity = get_chip("tpu-v5e").hbm_bytes * HBM_USE
    assert smoke.groups_that_fit(needs, capacity) == ([["reference", "megakernel"]], {})
