"""mk.measure.gpu and ``python -m mk measure-gpu`` on the CPU with a tiny model: real rows, CPU-labelled.

One run of the command (module-scoped, ~15 s) serves the row tests; the rounds are capped so the run ends
long before its budget, which is generous so that a slow machine never abandons the reference's compile.
"""

import csv
import importlib.util
import os
import re
import sys
import types
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from mk.__main__ import main
from mk.config import get_config
from mk.measure import gpu, loop
from mk.sol import speed_of_light


def _has_gemma4() -> bool:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        return False
    try:
        gpu.transformers_modules()
    except ValueError:
        return False
    return True


HAS_GEMMA4 = _has_gemma4()


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The rows ``measure-gpu --model tiny-moe --context 64 --device cpu`` appends, and the command's output."""
    out = tmp_path_factory.mktemp("gpu") / "gpu.csv"
    engines = "reference,transformers" if HAS_GEMMA4 else "reference"
    mp = pytest.MonkeyPatch()
    mp.setattr(loop, "MAX_ROUNDS", 40)
    mp.setattr(gpu, "PROBE_BYTES", 16 * 2**20)

    def no_exit(code):  # the command leaves with os._exit only when it abandoned a compile: fail instead
        raise AssertionError(f"measure-gpu abandoned the reference's compile (os._exit({code}))")

    mp.setattr(os, "_exit", no_exit)
    args = ["measure-gpu", "--model", "tiny-moe", "--context", "64", "--device", "cpu", "--budget-s", "60"]
    try:
        rc = main(args + ["--engines", engines, "--out", str(out)])
    finally:
        mp.undo()
    assert rc == 0
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, {r["engine"]: r for r in reader}


def _check_row(r, engine):
    assert r["engine"] == engine and r["model"] == "tiny-moe" and r["dtype"] == "bf16"
    assert r["context"] == "64" and r["batch"] == "1" and int(r["rounds"]) >= 7
    assert r["device"].startswith("cpu") and r["backend"] == "cpu" and r["jax_version"] == jax.__version__
    assert r["weights"] == "random (seed 0)" and r["date"].endswith("Z")
    assert float(r["step_low_ms"]) <= float(r["step_ms"]) <= float(r["step_high_ms"])
    assert float(r["fraction_of_sol_low"]) <= float(r["fraction_of_sol"]) <= float(r["fraction_of_sol_high"])
    assert 0 < float(r["fraction_of_sol"]) < 1.5
    assert r["sol_source"].startswith("measured: GEMV probe")  # a CPU is no chip of data/chips.csv
    step_s = float(r["step_ms"]) / 1e3
    assert float(r["tokens_per_s"]) == pytest.approx(1 / step_s, rel=1e-3, abs=0.005)  # written to 2 decimals
    assert float(r["kernels_per_step"]) > 10


def test_reference_row(measured):
    columns, rows = measured
    assert tuple(columns) == gpu.COLUMNS
    r = rows["reference"]
    _check_row(r, "reference")
    assert float(r["kernels_compiled"]) > 10 and float(r["compile_s"]) > 0
    assert r["kernels_counted_by"] in ("profiler trace", "compiled program")
    assert re.fullmatch("[0-9a-f]{16}", r["program_digest"])  # the compiled step's program, named


def test_transformers_row(measured):
    if not HAS_GEMMA4:
        pytest.skip("transformers with Gemma 4 (and torch) not importable: the transformers engine is not measured")
    _, rows = measured
    r = rows["transformers"]
    _check_row(r, "transformers")
    assert r["kernels_counted_by"].startswith("torch.profiler") and r["transformers_version"]
    assert r["program_digest"] == ""  # torch's step is no JAX program
    # measured in the same rounds, each beside the other
    assert r["rounds"] == rows["reference"]["rounds"]
    assert "reference" in r["interleaved_with"] and "transformers" in rows["reference"]["interleaved_with"]


def test_refuses_gpu_when_there_is_none(capsys):
    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("this machine has a GPU")
    assert main(["measure-gpu", "--model", "tiny-moe", "--device", "gpu", "--engines", "reference"]) == 2
    assert "JAX finds no GPU" in capsys.readouterr().err


def test_refuses_transformers_without_gemma4(monkeypatch, capsys):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch not installed")
    old = types.ModuleType("transformers")
    old.__version__ = "4.40.0"
    monkeypatch.setitem(sys.modules, "transformers", old)
    with pytest.raises(ValueError, match="transformers 4.40.0 has no Gemma 4"):
        gpu.transformers_modules()
    args = ["measure-gpu", "--model", "tiny-moe", "--context", "16", "--device", "cpu", "--engines", "transformers"]
    assert main(args) == 2
    assert "has no Gemma 4" in capsys.readouterr().err


def test_bad_engines_and_budget_are_refused(capsys):
    base = ["measure-gpu", "--model", "tiny-moe", "--device", "cpu"]
    assert main(base + ["--engines", "vllm"]) == 2
    assert "engines must be some of" in capsys.readouterr().err
    assert main(base + ["--budget-s", "0"]) == 2


def test_speed_of_light_of_a_known_chip():
    h200 = SimpleNamespace(platform="gpu", device_kind="NVIDIA H200")
    cfg = get_config("gemma4-26b-a4b")
    sol = gpu.speed_of_light_for(cfg, 1024, 1, "bf16", h200, None)
    want = speed_of_light(cfg, "h200", 1024, 1, "bf16")
    assert sol.bandwidth / sol.bytes_per_step == pytest.approx(want.tokens_per_s)
    assert sol.source.startswith("h200")


def test_append_rows_writes_the_header_once_and_checks_columns(tmp_path):
    path = tmp_path / "m" / "gpu.csv"
    row = {c: "x" for c in gpu.COLUMNS}
    gpu.append_rows([row], path)
    gpu.append_rows([dict(row, engine="y"), dict(row, kernels_per_step=None)], path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["engine"] for r in rows] == ["x", "y", "x"] and rows[2]["kernels_per_step"] == ""
    assert [p.name for p in path.parent.iterdir()] == ["gpu.csv"]  # no temporary file left behind
    with pytest.raises(ValueError, match="exactly the columns"):
        gpu.append_rows([{"date": "x"}], path)
    old = tmp_path / "old.csv"
    old.write_text("date,model\n1,a\n")
    with pytest.raises(ValueError, match="move the old file aside"):
        gpu.append_rows([row], old)


@pytest.mark.skipif(not HAS_GEMMA4, reason="transformers with Gemma 4 (and torch) not importable")
def test_transformers_step_decodes_the_last_position_every_time():
    """The timed step, after a real prefill of context - 1 positions, gives the logits of a forward of the
    whole sequence without a cache; repeated (its position counters set back each time) it gives them again,
    for a context as long as the sliding window (as 26B-A4B's 1024 at a 1K context)."""
    import inspect

    import torch

    cfg = get_config("tiny-moe")
    context, token = cfg.sliding_window, 7
    model = gpu.build_transformers(cfg, "f32", "cpu", seed=0)
    prompt = torch.tensor(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, context - 1)))
    step, reset = gpu.transformers_step(model, context, 1, token=token)
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        whole = model(input_ids=torch.cat([prompt, torch.tensor([[token]])], 1)).logits[0, -1]
        model(input_ids=prompt, use_cache=True, **{kw: step.cache})
    first = step()[0, -1]
    assert (first - whole).abs().max().item() <= 1e-4
    for _ in range(2):
        assert torch.equal(step()[0, -1], first)
    reset()
    assert step.cache.get_seq_length() == context - 1
