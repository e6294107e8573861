import csv
import json

import pytest

from mk import profiling
from mk.__main__ import main
from mk.config import FULL, get_config
from mk.kernel_setup import KernelSetup
from mk.measure import cpu


def _row(**over):
    row = {c: "x" for c in cpu.COLUMNS}
    row.update(over)
    return row


def test_append_row_writes_header_then_appends(tmp_path):
    path = tmp_path / "m" / "bench.csv"
    cpu.append_row(_row(model="a"), path)
    cpu.append_row(_row(model="b"), path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["model"] for r in rows] == ["a", "b"]
    assert list(rows[0]) == list(cpu.COLUMNS)
    assert [p.name for p in path.parent.iterdir()] == ["bench.csv"]  # no temporary file left behind


def test_append_row_leaves_the_old_file_whole_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "bench.csv"
    cpu.append_row(_row(model="a"), path)
    before = path.read_bytes()

    def boom(self, rows):
        raise OSError("disk full")

    monkeypatch.setattr(csv.DictWriter, "writerows", boom)
    with pytest.raises(OSError, match="disk full"):
        cpu.append_row(_row(model="b"), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["bench.csv"]


def test_append_row_checks_columns(tmp_path):
    with pytest.raises(ValueError, match="missing \\['date'\\]"):
        cpu.append_row({k: v for k, v in _row().items() if k != "date"}, tmp_path / "b.csv")
    old = tmp_path / "old.csv"
    old.write_text("date,model\n1,a\n")
    with pytest.raises(ValueError, match="move the old file aside"):
        cpu.append_row(_row(), old)


def test_run_bench_on_a_tiny_moe():
    cfg = get_config("tiny-moe")
    r = cpu.run_bench(cfg, context=32, batch=2, budget_s=3, probe_bytes=8 * 2**20)
    row = r.row()
    assert set(row) == set(cpu.COLUMNS)
    assert row["model"] == "tiny-moe" and row["batch"] == 2 and row["rounds"] >= 7 and row["dtype"] == "f32"
    assert row["kernels_per_step"] > 10 and r.kernels.unknown_trip_loops == 0
    for what, low, high in (
        ("step_ms", "step_low_ms", "step_high_ms"),
        ("sol_bandwidth_GBps", "sol_bandwidth_low_GBps", "sol_bandwidth_high_GBps"),
        ("fraction_of_sol", "fraction_of_sol_low", "fraction_of_sol_high"),
    ):
        assert row[low] <= row[what] <= row[high], what
    # each round's fraction is the speed of light's step (bytes / that round's probe bandwidth) over its step
    assert r.bytes_per_token / r.bandwidth.high / r.step.high <= r.fraction_of_sol * 1.5
    # the speed of light's step: the bytes over the bandwidth, its median and interval; the row's tokens/s its inverse
    assert r.sol_step.n == row["rounds"] and r.sol_step.low <= r.sol_step.median <= r.sol_step.high
    assert 1 / r.sol_step.median == pytest.approx(row["sol_tokens_per_s"], rel=1e-3)
    assert r.sol_step.low == pytest.approx(r.bytes_per_token / r.bandwidth.high)
    assert r.sol_step.high == pytest.approx(r.bytes_per_token / r.bandwidth.low)
    assert row["tokens_per_s_total"] == pytest.approx(2 * row["tokens_per_s"], rel=1e-3)
    assert row["load_before"] >= 0 and "speed of light" in r.text() and "95% interval" in r.text()


def test_run_bench_rejects_bad_arguments():
    cfg = get_config("tiny-moe")
    with pytest.raises(ValueError, match="context must be a positive integer"):
        cpu.run_bench(cfg, context=0)
    with pytest.raises(ValueError, match="dtype must be one of"):
        cpu.run_bench(cfg, context=8, dtype="fp8")


def test_bench_cli_prints_json_and_appends_a_row(tmp_path, monkeypatch, capsys):
    out = tmp_path / "bench.csv"
    rc = main(
        [
            "bench",
            "--model",
            "tiny-dense",
            "--context",
            "16",
            "--batch",
            "1",
            "--budget",
            "2",
            "--json",
            "--csv",
            str(out),
        ]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"] == "tiny-dense" and d["csv"] == str(out) and d["engine"] == "reference"
    with open(out, newline="") as f:
        assert [r["model"] for r in csv.DictReader(f)] == ["tiny-dense"]


def test_bench_cli_needs_a_model(capsys):
    assert main(["bench", "--context", "16"]) == 2
    assert "--model" in capsys.readouterr().err


def test_the_benchs_interval_holds_what_it_promises():
    """Two halves of one run (its even and its odd rounds, interleaved, so both see the same machine) are two
    measurements of the same fraction of the speed of light: their 95% intervals overlap. Runs at different
    times need not agree within any fixed band: a 2-core machine's load moves between runs more than within
    one, so the bench says where a run stands by its interval, measured in its own rounds."""
    r = cpu.run_bench(get_config("tiny-moe"), context=64, budget_s=3, precision=0.0, probe_bytes=2**22)
    rounds = r.round_fractions
    assert len(rounds) == r.method["rounds"] >= 12
    even, odd = (profiling.Estimate.of(rounds[i::2], 0.95) for i in (0, 1))
    assert even.low <= odd.high and odd.low <= even.high, (even, odd)
    assert r.fraction.low <= r.fraction_of_sol <= r.fraction.high


def test_run_bench_over_several_chips_runs_the_sharded_megakernel():
    """The path a TPU slice takes (notebook 05), here over 2 simulated chips in interpret mode (its timings
    and kernel count are the interpreter's, not a TPU's): the row names the engine's options, and the speed
    of light counts both chips' bandwidth."""
    # one layer of the tiny MoE: what is checked does not depend on the layers, and each is seconds interpreted
    cfg = get_config("tiny-moe").replace(name="tiny-moe-1-layer", layer_types=(FULL,))
    options = dict(setup=KernelSetup(2, "whole"))
    r = cpu.run_bench(cfg, 32, 1, engine="megakernel", engine_options=options, budget_s=1, probe_bytes=2**20)
    row = r.row()
    assert row["engine"] == "megakernel[chips=2,placement=whole]"
    fraction = r.bytes_per_token / (2 * r.bandwidth.median) / r.step.median
    assert r.fraction.low <= fraction * 1.5 and r.fraction.high >= fraction / 1.5
