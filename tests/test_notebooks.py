"""Notebooks: committed without outputs, a tagged parameters cell first, checked parameters, and a full run
of the papermill runner with CI's parameters."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from mk.notebook import check_parameters

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert any(nb.name.startswith("01_") for nb in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_is_tagged_parameters(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", []), f"{path.name}: first code cell is not tagged parameters"
    assert "check_parameters(" in code[1].source, f"{path.name}: second code cell should check the parameters"


def test_check_parameters_accepts_good_values():
    ns = dict(MODELS=["a"], CONTEXTS=[1024, 2048], DTYPE="bf16", SCALE=2, MAYBE=None)
    check_parameters(ns, MODELS=list[str], CONTEXTS=list[int], DTYPE=str, SCALE=float, MAYBE=int | None)


@pytest.mark.parametrize(
    "ns, expected, message",
    [
        (
            dict(CONTEXTS=[1024, "2K"]),
            dict(CONTEXTS=list[int]),
            r"CONTEXTS must be list\[int\], got \[1024, '2K'\] \(list\)",
        ),
        (dict(CONTEXT="1024"), dict(CONTEXT=int), r"CONTEXT must be int, got '1024' \(str\)"),
        (dict(CONTEXT=True), dict(CONTEXT=int), r"CONTEXT must be int, got True \(bool\)"),
        (dict(MODELS="gemma4-31b"), dict(MODELS=list[str]), r"MODELS must be list\[str\], got 'gemma4-31b' \(str\)"),
        (dict(MODELS=[]), dict(MODELS=list[str]), "MODELS must not be empty"),
        (dict(), dict(DTYPE=str), r"DTYPE is not set \(expected str\)"),
    ],
)
def test_check_parameters_names_parameter_type_and_value(ns, expected, message):
    with pytest.raises(TypeError, match=message):
        check_parameters(ns, **expected)


@pytest.mark.slow
def test_runner_runs_every_notebook_with_ci_parameters():
    start = time.time()
    r = subprocess.run(
        [sys.executable, "ci/run_notebooks.py", "--params", "ci/parameters.json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for nb in NOTEBOOKS:
        assert (ROOT / "build" / "notebooks" / nb.name).stat().st_mtime >= start
    # Notebook 01 writes each of its figures as HTML, and as PNG where a Chromium exists (CI installs one).
    nb = nbformat.read(ROOT / "notebooks" / "01_speed_of_light.ipynb", as_version=4)
    names = set(re.findall(r'"(01_[a-z_]+)"\)', "\n".join(c.source for c in nb.cells)))
    assert names, 'no save_figure(..., "01_...") calls found in notebook 01'
    kinds = ["html", "png"] if os.access("/usr/bin/chromium", os.X_OK) else ["html"]
    for name in names:
        for ext in kinds:
            f = ROOT / "figures" / f"{name}.{ext}"
            assert f.exists() and f.stat().st_mtime >= start and f.stat().st_size > 0, f"{f} was not written"
    # Every figure the run wrote can be read whole: legends clear of titles, a legend for several series,
    # every series with a visible mark, no line hidden under another (laid out by plotly in a Chromium).
    if "png" in kinds:
        import plotly.io as pio

        from mk.figures import check_figure

        specs = [
            f
            for f in sorted((ROOT / "figures").glob("*.json"))
            if f.stat().st_mtime >= start and not f.name.endswith(".meta.json")  # tables' metadata, not figures
        ]
        assert specs
        problems = {f.stem: check_figure(pio.read_json(f)) for f in specs}
        assert not any(problems.values()), {k: v for k, v in problems.items() if v}
    # A healthy run is quiet: no output line of any notebook looks like an error or a warning.
    noisy = []
    for path in NOTEBOOKS:
        executed = nbformat.read(ROOT / "build" / "notebooks" / path.name, as_version=4)
        for i, cell in enumerate(executed.cells):
            for out in cell.get("outputs", []):
                text = out.get("text", "") if out.get("output_type") == "stream" else ""
                if out.get("output_type") == "error" or (out.get("name") == "stderr" and text.strip()):
                    noisy.append((path.name, i, text[:200] or out.get("ename")))
                noisy += [(path.name, i, line[:200]) for line in text.splitlines() if NOISE.search(line)]
    assert not noisy, noisy


# What an error or warning line looks like (libtpu's E0000/W0000 logs, Python warnings, tracebacks).
NOISE = re.compile(r"\b(E|W)\d{4} |Traceback|Warning:|WARNING|ERROR|IProgress")
