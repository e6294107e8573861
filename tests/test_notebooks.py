"""Notebooks: committed without outputs, a tagged parameters cell first, checked parameters, the runner
writing only into the folders it is given (no partial copy, even of a failed notebook), and a full run of the
papermill runner with CI's parameters. Every run here writes into temporary folders: never into the
checkout's figures/ or build/, where the main job's results are."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from mk.notebook import check_parameters, not_like_for_like, op_cost_sources

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


def test_op_cost_words_name_the_sources_and_flag_steps_not_like_for_like():
    assert op_cost_sources(["assumed", "assumed"]) == "assumed"
    both = op_cost_sources(["compiler-scheduled", "-"], ("assumed",))  # "-": a row with no per-op costs
    assert both == "assumed and compiler-scheduled"
    assert op_cost_sources(["-", "-"]) == op_cost_sources() == "none"
    assert not_like_for_like({"whole": "assumed", "split": "assumed"}) == ""
    assert not_like_for_like({"whole": "assumed", "split": "compiler-scheduled"}) == (
        " (per-op costs whole assumed, split compiler-scheduled: not like for like)"
    )


def run_notebooks(out: Path, figures: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    """ci/run_notebooks.py writing executed notebooks into ``out``, figures, tables and the report into
    ``figures``."""
    cmd = [sys.executable, "ci/run_notebooks.py", "--out", str(out), "--figures", str(figures), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def run_runner_here(capfd, out: Path, figures: Path, *args: str) -> tuple[int, str, str]:
    """ci/run_notebooks.py's main in this process (each notebook still in a process of its own), as
    :func:`run_notebooks` runs it: its exit code, and what it and the notebooks' processes printed on stdout and on
    stderr."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "ci" / "run_notebooks.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    capfd.readouterr()
    code = runner.main(["--out", str(out), "--figures", str(figures), "--timeout", "120", *args])
    printed = capfd.readouterr()
    return code, printed.out, printed.err


def files_under(*folders: Path) -> dict[Path, tuple[int, int]]:
    """Every file under ``folders``, with its size and modification time (ns)."""
    return {f: (f.stat().st_size, f.stat().st_mtime_ns) for d in folders for f in d.rglob("*") if f.is_file()}


def two_small_notebooks(folder: Path) -> Path:
    """Two notebooks as the runner expects them (a heading, a parameters cell, its check), each writing a table,
    the first a figure too: the runner's mechanics in seconds rather than a real notebook's minute."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    folder.mkdir()
    body = {
        "01_first": "fig = go.Figure(go.Bar(x=['a', 'b'], y=[1, CONTEXT]), layout=dict(title='two bars'))\n"
        "save_figure(provenance(fig, 'modelled', 'none', 'a test'), '01_bars')",
        "02_second": "",
    }
    for name, figure in body.items():
        cells = [
            new_markdown_cell(f"# {name}"),
            new_code_cell("CONTEXT = 1024", metadata={"tags": ["parameters"]}),
            new_code_cell(
                "import pandas as pd\nimport plotly.graph_objects as go\n\n"
                "from mk.figures import provenance, save_figure\nfrom mk.notebook import check_parameters, show\n\n"
                "check_parameters(globals(), CONTEXT=int)"
            ),
            new_code_cell(
                f"show(pd.DataFrame({{'context': [CONTEXT]}}), kind='modelled', export='{name[:2]}_table',\n"
                f"     hardware='any chip', source='a test')\n{figure}"
            ),
        ]
        kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
        nbformat.write(new_notebook(cells=cells, metadata=kernel), folder / f"{name}.ipynb")
    return folder


def test_runner_writes_only_into_the_folders_it_is_given(tmp_path, capfd, monkeypatch):
    checkout = files_under(ROOT / "figures", ROOT / "build")
    books, out, figures = two_small_notebooks(tmp_path / "books"), tmp_path / "notebooks", tmp_path / "figures"
    # The report's claims table is the write-up's, whatever the notebooks (computed for 8 s): tests/test_report.py
    # holds it and its place on the page; here the report need only gather the notebooks the runner ran.
    monkeypatch.setattr("mk.report.claims_table", lambda: pd.DataFrame(columns=["key", "shown_in"]))
    code, stdout, stderr = run_runner_here(capfd, out, figures, "--notebooks", str(books), "--jobs", "2")
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    assert sorted(f.name for f in out.glob("*.ipynb")) == ["01_first.ipynb", "02_second.ipynb"]
    assert (figures / "01_bars.html").is_file() and (figures / "01_table.csv").is_file()
    assert (figures / "02_table.csv").is_file()
    page = (figures / "index.html").read_text()
    assert "01_first" in page and "02_second" in page  # the report gathers both, by notebook
    written = files_under(out)
    # A notebook failing (here in its parameter check) leaves its previous good copy as it was and nothing else.
    args = ["--notebooks", str(books), "--only", "01", "-p", "CONTEXT", '"1K"']
    code, stdout, stderr = run_runner_here(capfd, out, figures, *args)
    assert code == 1 and "CONTEXT must be int" in stderr, stdout[-3000:] + stderr[-3000:]
    named = re.search(r"executed copy with the traceback: (\S+\.ipynb)", stderr)
    assert named, f"the failure names no executed copy: {stderr[-3000:]}"
    kept = Path(named.group(1))
    try:
        assert kept.is_file() and not kept.is_relative_to(out) and not kept.is_relative_to(figures)
        assert files_under(out) == written
    finally:
        shutil.rmtree(kept.parent)
    assert not [f for f in tmp_path.rglob("*") if ".partial" in f.name]
    assert files_under(ROOT / "figures", ROOT / "build") == checkout, "the runner wrote into the checkout"


def saved_figure_names(nb) -> set[str]:
    """The names a notebook's ``save_figure(..., "NAME")`` calls give: the last string in each call."""
    names = set()
    for cell in nb.cells:
        src = cell.source
        for m in re.finditer(r"\bsave_figure\(", src):
            depth, i = 1, m.end()
            while depth and i < len(src):
                depth += {"(": 1, ")": -1}.get(src[i], 0)
                i += 1
            names.update(re.findall(r'"(\d\d_[a-z0-9_]+)"', src[m.end() : i])[-1:])
    return names


# Each notebook a test of its own (one at a time through the runner, CI's parameters), so that the test workers
# share them out: the longest takes about a minute here, all ten about six.
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_notebook_runs_with_ci_parameters(tmp_path, path):
    out, figures = tmp_path / "notebooks", tmp_path / "figures"
    prefix = path.name[:2]
    r = run_notebooks(out, figures, "--params", "ci/parameters.json", "--only", prefix, "--no-report", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (out / path.name).is_file(), f"{path.name} has no executed copy"
    png = os.access("/usr/bin/chromium", os.X_OK)
    # Each figure the notebook saves is written as HTML, and as PNG where a Chromium exists (CI installs one).
    nb = nbformat.read(path, as_version=4)
    names = saved_figure_names(nb)
    # the names are read off the calls, or the notebook saves through a helper of its own (07, 08)
    assert names or any("save_figure(fig, name)" in c.source for c in nb.cells), f"no save_figure call in {path.name}"
    for name in names:
        for ext in ["html", "png"] if png else ["html"]:
            f = figures / f"{name}.{ext}"
            assert f.exists() and f.stat().st_size > 0, f"{f} was not written"
    # Every figure the run wrote can be read whole: save_figure lays each out in the Chromium that exports it and
    # refuses one that cannot (mk.figures.check_figure), so a written PNG is a checked figure; the test does not
    # start a second Chromium to lay them all out again. Tables' metadata are not figures.
    specs = [f for f in sorted(figures.glob("*.json")) if not f.name.endswith(".meta.json")]
    assert specs, f"{path.name} wrote no figure"
    if png:
        assert all(f.with_suffix(".png").is_file() for f in specs), [f.name for f in specs]
    # A healthy run is quiet: no output line looks like an error or a warning.
    noisy = []
    executed = nbformat.read(out / path.name, as_version=4)
    for i, cell in enumerate(executed.cells):
        for output in cell.get("outputs", []):
            text = output.get("text", "") if output.get("output_type") == "stream" else ""
            if output.get("output_type") == "error" or (output.get("name") == "stderr" and text.strip()):
                noisy.append((i, text[:200] or output.get("ename")))
            noisy += [(i, line[:200]) for line in text.splitlines() if NOISE.search(line)]
    assert not noisy, noisy


# What an error or warning line looks like (libtpu's E0000/W0000 logs, Python warnings, tracebacks).
NOISE = re.compile(r"\b(E|W)\d{4} |Traceback|Warning:|WARNING|ERROR|IProgress")
