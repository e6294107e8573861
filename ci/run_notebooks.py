"""Run every notebook in ``notebooks/`` through papermill, the longest first.

    python ci/run_notebooks.py                      # notebooks' own (CPU) defaults
    python ci/run_notebooks.py --params ci/parameters.json   # CI's smaller parameters
    python ci/run_notebooks.py --only 01 -p CONTEXTS '[1024, 8192]'
    python ci/run_notebooks.py --out /tmp/nb --figures /tmp/fig   # elsewhere (the tests: temporary folders)
    python ci/run_notebooks.py --notebooks my_notebooks/    # notebooks named NN_*.ipynb from another folder

Executed copies go to build/notebooks/ (``--out``; ignored by git); figures and exported tables to figures/
(``--figures``, given to the notebooks as $MK_FIGURES_DIR, see mk.paths.figures_dir), and after a successful
run the report page gathering them, index.html there. Each notebook runs in its own process under a timeout,
``--jobs`` of them at once (they share nothing but the figures folder, each under its own names); a failure
names the notebook and the failing cell's error.

A notebook is executed into a temporary folder and copied into the output folder (atomically) only when it ran
to the end: a failed or timed-out notebook leaves no partial copy there and the previous good copy stands.
The failed one's executed copy, with its traceback, is kept in the temporary folder, which the failure
message names; after a run without failures the temporary folder is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# jsonschema (nbformat's validator, under papermill) builds an RFC 3987 grammar at import where rfc3987_syntax is
# installed (jupyterlab's dependencies bring it): 1.2 s a process, and this runner starts one a notebook. A notebook's
# schema checks no IRI, so that format checker is left out.
sys.modules.setdefault("rfc3987_syntax", None)

from mk.files import write_atomic  # noqa: E402
from mk.paths import BUILD_DIR, FIGURES_ENV, NOTEBOOKS_DIR, ROOT, figures_dir  # noqa: E402

OUT = BUILD_DIR / "notebooks"
# Seconds each notebook took in its last run into an output folder (written there after every run), else in a
# main job measured on a 2-core machine (committed): the longest start first, so that no long notebook runs
# alone at the end.
SECONDS_HERE = "seconds.json"
SECONDS_MEASURED = ROOT / "ci" / "notebook_seconds.json"


def notebooks(only: list[str] | None = None, folder: Path = NOTEBOOKS_DIR) -> list[Path]:
    found = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if only:
        found = [nb for nb in found if any(nb.name.startswith(o) for o in only)]
    return found


def _seconds_key(params_file: Path | None) -> str:
    """Runs with different parameters take different times: their seconds are kept apart."""
    return params_file.name if params_file else "defaults"


def longest_first(nbs: list[Path], params_file: Path | None, out: Path) -> list[Path]:
    """``nbs`` ordered by the seconds each took last time with the same parameters file (unknown ones first)."""
    key = _seconds_key(params_file)
    seconds = {}
    for f in (SECONDS_MEASURED, out / SECONDS_HERE):  # this machine's record wins
        if f.exists():
            seconds.update(json.loads(f.read_text()).get(key, {}))
    return sorted(nbs, key=lambda nb: -seconds.get(nb.stem, float("inf")))


def record_seconds(params_file: Path | None, took: dict[str, float], out: Path) -> None:
    """Add this run's seconds per notebook to SECONDS_HERE in ``out``."""
    key = _seconds_key(params_file)
    path = out / SECONDS_HERE
    record = json.loads(path.read_text()) if path.exists() else {}
    record.setdefault(key, {}).update({k: round(v, 1) for k, v in took.items()})
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text))


def kernel_manager_class():
    """Jupyter's kernel manager with the kernel on local IPC sockets rather than TCP: the kernel then has no
    unencrypted network port to warn about, and its socket files live in the temporary directory. A notebook that
    ran to its end is shut down without the interrupt jupyter_client sends first (to stop running code: nothing
    runs), which the idle kernel logs as an error ("KeyboardInterrupt caught in kernel")."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class IPCKernelManager(AsyncKernelManager):
        @default("transport")
        def _transport_default(self):
            return "ipc"

        @default("ip")
        def _ip_default(self):
            return os.path.join(tempfile.gettempdir(), f"mk-kernel-{os.getpid()}")

        async def _async_interrupt_kernel(self):
            if not getattr(self, "shutting_down", False):  # a timeout's interrupt still reaches running code
                await super()._async_interrupt_kernel()

    return IPCKernelManager


def claims_into(out: dict) -> None:
    """The report's claims table (mk.report.claims_table, seconds of the timing model) into ``out["table"]``: run in a
    thread from when the last notebook starts, so that it fills the cores the last notebooks leave (the shorter of the
    last two ends first, and the longer would run alone), not after them. Its error, if any, into ``out["error"]``,
    raised where the report is written."""
    try:
        from mk import report

        out["table"] = report.claims_table()
    except Exception as e:
        out["error"] = e


def run_one(nb: Path, parameters: dict, executed: Path) -> None:
    """Execute ``nb`` in this process, writing its executed copy to ``executed`` (in the run's temporary folder:
    papermill rewrites it after every cell)."""
    import papermill as pm

    try:
        pm.execute_notebook(
            str(nb),
            str(executed),
            parameters=parameters,
            kernel_name="python3",
            cwd=str(ROOT),
            progress_bar=False,
            log_output=False,
            kernel_manager_class=kernel_manager_class(),
        )
    except pm.PapermillExecutionError as e:
        raise SystemExit(
            f"notebook {nb.name} failed in cell {e.exec_count}: {e.ename}: {e.evalue}\n"
            f"(executed copy with the traceback: {executed})"
        ) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=Path, help="JSON file: {notebook-name-prefix: {PARAM: value}}")
    ap.add_argument("--only", nargs="*", help="run only notebooks whose name starts with one of these")
    ap.add_argument(
        "--notebooks", type=Path, default=NOTEBOOKS_DIR, help=f"folder of NN_*.ipynb to run (default: {NOTEBOOKS_DIR})"
    )
    ap.add_argument(
        "-p",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "JSON"),
        help="override one parameter (value parsed as JSON) in every notebook run",
    )
    ap.add_argument("--out", type=Path, default=OUT, help=f"folder for the executed notebooks (default: {OUT})")
    ap.add_argument(
        "--figures",
        type=Path,
        default=figures_dir(),
        help=f"folder for figures, tables and the report (default: ${FIGURES_ENV}, else {figures_dir()})",
    )
    ap.add_argument(
        "--no-report", action="store_true", help="skip the report page (index.html), e.g. for one notebook at a time"
    )
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per notebook (default 1800)")
    ap.add_argument(
        "--jobs", type=int, default=min(2, os.cpu_count() or 1), help="notebooks run at once (default: 2, or 1 core)"
    )
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--one-params", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--one-executed", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.one:  # child mode: one notebook in this process
        run_one(a.one, json.loads(a.one_params), a.one_executed)
        return 0

    table = json.loads(a.params.read_text()) if a.params else {}
    overrides = {name: json.loads(v) for name, v in a.p}
    nbs = notebooks(a.only, a.notebooks)
    if not nbs:
        print(f"no notebooks matched in {a.notebooks}", file=sys.stderr)
        return 1
    # absolute: the notebooks run in ROOT, not in the caller's directory
    out, figures = a.out.resolve(), a.figures.resolve()
    env = dict(os.environ)
    env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    env[FIGURES_ENV] = str(figures)  # the kernels' save_figure and export_table write there
    work = Path(tempfile.mkdtemp(prefix="mk-notebooks-"))  # executed copies until they ran to the end
    pending = longest_first(nbs, a.params, out)
    running: dict[Path, tuple[subprocess.Popen, float]] = {}
    failed = []
    took: dict[str, float] = {}
    claims: dict = {}
    claims_thread = None
    while pending or running:
        if not (pending or failed or a.no_report or claims_thread):
            # every notebook has started: the report's claims table meanwhile, beside the last ones
            claims_thread = threading.Thread(target=claims_into, args=(claims,), daemon=True)
            claims_thread.start()
        while pending and len(running) < max(1, a.jobs) and not failed:
            nb = pending.pop(0)
            params = {}
            for prefix, p in table.items():
                if nb.name.startswith(prefix):
                    params.update(p)
            params.update(overrides)
            print(f"[{nb.name}] running{' with ' + json.dumps(params) if params else ''}", flush=True)
            cmd = [sys.executable, __file__, "--one", str(nb), "--one-params", json.dumps(params)]
            cmd += ["--one-executed", str(work / nb.name)]
            running[nb] = (subprocess.Popen(cmd, env=env, cwd=ROOT), time.time())
        if failed:
            pending.clear()
        time.sleep(0.1)  # a notebook that ended is replaced within a tenth of a second
        for nb, (proc, t0) in list(running.items()):
            if proc.poll() is None and time.time() - t0 > a.timeout:
                proc.kill()
                proc.wait()
                print(
                    f"[{nb.name}] FAILED: timed out after {a.timeout} s (executed so far: {work / nb.name})",
                    file=sys.stderr,
                )
                failed.append(nb)
                del running[nb]
            elif proc.poll() is not None:
                del running[nb]
                if proc.returncode:
                    print(f"[{nb.name}] FAILED", file=sys.stderr)
                    failed.append(nb)
                else:
                    took[nb.stem] = time.time() - t0
                    executed = work / nb.name
                    # copied, not renamed: the temporary folder may be on another file system
                    write_atomic(out / nb.name, lambda tmp: shutil.copyfile(executed, tmp))
                    executed.unlink()
                    print(f"[{nb.name}] ok in {took[nb.stem]:.0f} s -> {out / nb.name}", flush=True)
    if took:
        record_seconds(a.params, took, out)
    if failed:
        print(f"executed copies of the failed notebooks, for diagnosis: {work}", file=sys.stderr)
        return 1
    shutil.rmtree(work)
    if not a.no_report:
        from mk.report import write_report

        if claims_thread is not None:
            claims_thread.join()
            if "error" in claims:
                raise claims["error"]
        page = write_report(figures, a.notebooks, claims=claims.get("table", True))
        print(f"report: {page}", flush=True)  # every figure and table there, by notebook
    return 0


if __name__ == "__main__":
    sys.exit(main())
