"""The commands that measure or report: bench (a CPU), measure-gpu, tpu-smoke (a TPU VM or slice), report."""

from __future__ import annotations

import sys
from pathlib import Path

from .common import (
    MODEL_HELP,
    RUNNABLE_HELP,
    add_quantize,
    positive,
    show,
)


# bench -------------------------------------------------------------------------------------------
def add_bench(sub) -> None:
    from ..dtypes import BASES
    from ..paths import BENCH_CSV

    p = sub.add_parser("bench", help="time the compiled decode step against this device's measured speed of light")
    p.add_argument(
        "--model", "--preset", dest="model", help=MODEL_HELP + RUNNABLE_HELP + " (random weights unless --checkpoint)"
    )
    p.add_argument("--checkpoint", help="a Hugging Face checkpoint folder or hub repo id (checked against --preset)")
    p.add_argument("--context", type=positive, required=True, help="positions in the KV cache")
    p.add_argument("--batch", type=positive, default=1, help="users decoded together (default 1)")
    p.add_argument(
        "--precision",
        type=float,
        default=0.02,
        help="stop once the fraction of the speed of light is known to +- this share of itself (95%% interval; "
        "default 0.02)",
    )
    p.add_argument("--budget", type=float, default=30.0, help="seconds of interleaved rounds at most (default 30)")
    p.add_argument(
        "--dtype",
        choices=list(BASES),
        default="f32",
        help="weights and KV cache data type (default f32: XLA:CPU runs f32 matvecs fastest)",
    )
    add_quantize(p)
    p.add_argument("--engine", default="reference", help="a registered decode engine (default reference)")
    p.add_argument("--csv", default=str(BENCH_CSV), help=f"CSV to append the row to (default {BENCH_CSV})")
    p.add_argument("--no-csv", action="store_true", help="do not append a row")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_bench)


def _run_bench(a) -> None:
    from ..config import get_config
    from ..engines import check_engine
    from ..measure.cpu import BenchWeights, append_row, run_bench
    from ..measure.harness import array_dtype
    from ..weights import load_checkpoint

    if not a.model and not a.checkpoint:
        raise ValueError("bench needs --model MODEL (random weights) or --checkpoint DIR")
    check_engine(a.engine)
    cfg = get_config(a.model) if a.model else None
    weights = BenchWeights(quantize=a.quantize)
    if a.checkpoint:
        cfg, params = load_checkpoint(a.checkpoint, cfg, dtype=array_dtype(a.dtype))
        weights = BenchWeights(params, str(a.checkpoint), quantize=a.quantize)
    if not 0 < a.precision < 1 or a.budget <= 0:
        raise ValueError(f"--precision must be in (0, 1) and --budget positive, got {a.precision} and {a.budget}")
    r = run_bench(
        cfg,
        a.context,
        a.batch,
        a.dtype,
        a.engine,
        weights,
        precision=a.precision,
        budget_s=a.budget,
    )
    row = r.row()
    if not a.no_csv:
        row["csv"] = str(append_row(row, a.csv))
    show(row, a.json, r.text() + (f"\n  appended to {row['csv']}" if "csv" in row else ""))


# report ------------------------------------------------------------------------------------------
def add_report(sub) -> None:
    p = sub.add_parser(
        "report", help="write figures/index.html: every exported figure and table by notebook, with provenance"
    )
    p.add_argument(
        "--figures", type=Path, help="the figures folder (default: $MK_FIGURES_DIR, else figures/ in the repository)"
    )
    p.set_defaults(run=_run_report)


def _run_report(a) -> None:
    from ..report import write_report

    print(write_report(a.figures))


# measure-gpu -------------------------------------------------------------------------------------
def add_measure(sub) -> None:
    from ..dtypes import BASES
    from ..measure.gpu import DEVICES, ENGINES
    from ..paths import GPU_CSV

    p = sub.add_parser(
        "measure-gpu",
        help="the reference's decode step and transformers' Gemma 4 timed interleaved on one device, with kernels "
        "per step, beside the speed of light",
    )
    p.add_argument(
        "--model", default="gemma4-26b-a4b", help="random bf16 weights for " + MODEL_HELP + " (default gemma4-26b-a4b)"
    )
    p.add_argument("--context", type=positive, default=1024, help="positions in the KV cache (default 1024)")
    p.add_argument("--batch", type=positive, default=1, help="users decoded together (default 1)")
    p.add_argument(
        "--budget-s", type=float, default=300.0, help="seconds for the whole run, weight init included (default 300)"
    )
    p.add_argument("--device", choices=DEVICES, default="gpu", help="where to run both engines (default gpu)")
    p.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help=f"comma-separated, some of {', '.join(ENGINES)} (default both, interleaved)",
    )
    p.add_argument("--dtype", choices=list(BASES), default="bf16", help="weights and KV cache (default bf16)")
    p.add_argument("--chip", default=None, help="the speed of light's chip (default: the device's, if a known chip)")
    p.add_argument("--out", default=str(GPU_CSV), help=f"CSV to append the rows to (default {GPU_CSV})")
    p.add_argument("--no-csv", action="store_true", help="do not append rows")
    p.set_defaults(run=_run_measure)


def _run_measure(a) -> None:
    import os

    from ..config import get_config
    from ..measure import gpu

    cfg = get_config(a.model)
    engines = tuple(e.strip() for e in a.engines.split(",") if e.strip())
    if not a.budget_s > 0:
        raise ValueError(f"--budget-s must be positive, got {a.budget_s}")
    table = gpu.run(
        cfg,
        a.context,
        a.batch,
        a.budget_s,
        a.device,
        engines=engines,
        dtype=a.dtype,
        out=None if a.no_csv else a.out,
        chip=a.chip,
    )
    print(gpu.text(table) + ("" if a.no_csv or not len(table) else f"\n  appended to {a.out}"), flush=True)
    code = 0 if len(table) else 1  # nothing measured: the reference alone ran out of time compiling
    if gpu.unfinished():  # an abandoned XLA compile is still running in a thread: do not wait for it
        sys.stderr.flush()
        os._exit(code)
    if code:
        raise SystemExit(code)


# tpu-smoke ---------------------------------------------------------------------------------------
def add_tpu_smoke(sub) -> None:
    from ..measure.chip_parity import checks
    from ..measure.smoke import PLACEMENTS
    from ..paths import TPU_CSV

    p = sub.add_parser(
        "tpu-smoke",
        help="on a TPU VM or slice: the megakernel's greedy tokens against the reference's on its chips, then both "
        "decode steps timed interleaved beside the speed of light (exit 2 without a TPU)",
    )
    p.add_argument("--model", default="gemma4-26b-a4b", help="the timed model, random weights (default gemma4-26b-a4b)")
    p.add_argument(
        "--parity-model", default="cpu-moe", help="the model the tokens are checked on, f32 (default cpu-moe)"
    )
    p.add_argument(
        "--family-parity",
        action="store_true",
        help=f"first check every family's tiny model and every format on one chip too ({len(checks())} checks, about "
        "four minutes on a v5e; tpu-measure --parts parity keeps their rows)",
    )
    p.add_argument("--context", type=positive, default=1024, help="positions in the KV cache (default 1024)")
    p.add_argument("--batch", type=positive, default=1, help="users decoded together (default 1)")
    p.add_argument(
        "--placements",
        default=",".join(PLACEMENTS),
        help=f"expert placements to check and time, comma-separated, some of {', '.join(PLACEMENTS)} (default both)",
    )
    p.add_argument("--chips", type=positive, default=None, help="the first N chips (default: all found)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=300.0,
        help="seconds for the engines' builds and timing, counted after the parity checks (default 300)",
    )
    p.add_argument(
        "--chip", default=None, help="the speed of light's chip (default: the device's, where data/chips.csv has it)"
    )
    p.add_argument("--out", default=str(TPU_CSV), help=f"CSV to append the rows to (default {TPU_CSV})")
    p.add_argument("--no-csv", action="store_true", help="do not append rows")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_tpu_smoke)


def _run_tpu_smoke(a) -> None:
    from ..measure import smoke

    placements = tuple(p.strip() for p in a.placements.split(",") if p.strip())
    try:
        r = smoke.run(
            smoke.SmokeRun(
                a.model,
                a.parity_model,
                a.context,
                a.batch,
                placements,
                a.chips,
                a.budget_s,
                None if a.no_csv else a.out,
                chip=a.chip,
                **(smoke.FAMILY_PARITY if a.family_parity else {}),
            )
        )
    except smoke.NoTPU as e:
        print(e, file=sys.stderr)
        raise SystemExit(2) from None
    show(r.to_dict(), a.json, smoke.text(r))
    if r.failed:  # parity did not hold, an engine failed, or nothing was timed
        raise SystemExit(1)


# tpu-measure ---------------------------------------------------------------------------------------
def add_tpu_measure(sub) -> None:
    from ..measure.tpu_runs import PARTS
    from ..paths import MEASURED_DIR

    p = sub.add_parser(
        "tpu-measure",
        help="on a TPU chip: the kernel's parity for every family and format, the chip's HBM read rate, the table "
        "of both engines' steps (host and device times) over models, contexts and batches, the core's clock and each "
        "component's knock-out in device time; resumable (exit 2 without a TPU)",
    )
    p.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated, some of {', '.join(PARTS)} (default all)"
    )
    p.add_argument("--out-dir", default=str(MEASURED_DIR), help=f"where the CSVs go (default {MEASURED_DIR})")
    p.add_argument(
        "--deadline-s", type=float, default=540.0, help="start no work after this many seconds (default 540)"
    )
    p.add_argument(
        "--models",
        default=None,
        help="the table's and the knock-outs' cases of these models only, comma-separated (default every case)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_tpu_measure)


def _run_tpu_measure(a) -> None:
    from ..measure import tpu_runs

    parts = tuple(x.strip() for x in a.parts.split(",") if x.strip())
    try:
        done = tpu_runs.run(
            parts, a.out_dir, a.deadline_s, cases=tpu_runs.table_cases(a.models),
            knockout_cases=tpu_runs.table_cases(a.models, tpu_runs.chip_knockouts.CASES, strict=False),
        )  # fmt: skip
    except tpu_runs.NoTPU as e:
        print(e, file=sys.stderr)
        raise SystemExit(2) from None
    lines = [f"{k}: {v}" for k, v in done.items() if k != "notes"] + [f"note: {n}" for n in done["notes"]]
    show(done, a.json, "\n".join(lines))
    if done["parity_held"] is False:
        raise SystemExit(1)
