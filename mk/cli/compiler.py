"""The commands that compile the megakernel ahead of time with libtpu (no TPU needed): schedule."""

from __future__ import annotations

import sys

from .common import (
    MODEL_HELP,
    RUNNABLE_HELP,
    add_setup,
    positive,
    setup_of,
    show,
)


# schedule ----------------------------------------------------------------------------------------
def add_schedule(sub) -> None:
    from ..sol import DTYPES
    from ..timing.work import kernel_streams

    p = sub.add_parser(
        "schedule",
        help="the megakernel's step as libtpu's compiler schedules it: bundles by op kind, compute time beside the "
        "HBM time (compiles with libtpu, exit 2 without; --stored reads data/schedule)",
    )
    p.add_argument("--model", help=MODEL_HELP + RUNNABLE_HELP + " (not with --refresh, --missing)")
    p.add_argument("--chip", help="a TPU (tpu-v5e) or a slice of one (tpu-v5e-8) (not with --refresh, --missing)")
    p.add_argument("--context", type=positive, default=1024, help="positions in the KV cache (default 1024)")
    p.add_argument("--batch", type=positive, default=1, help="users decoded together (default 1)")
    dtypes = [d for d in DTYPES if kernel_streams(d)]  # FP8 and the 4-bit formats are modelled by bytes: no schedule
    p.add_argument("--dtype", default="bf16", choices=dtypes, help="the weights' data type as the kernel streams it")
    add_setup(p, "workbook")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--stored", action="store_true", help="read the rows kept in data/schedule; compile nothing")
    g.add_argument("--store", action="store_true", help="keep the compiled rows in data/schedule")
    g.add_argument("--refresh", action="store_true", help="compile and store every case data/schedule keeps")
    g.add_argument("--missing", action="store_true", help="compile and store the kept cases data/schedule lacks")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_schedule)


def _run_schedule(a) -> None:
    from ..measure import compiler_schedule as cs
    from ..timing import named_plan

    whole = a.refresh or a.missing  # every kept case: no plan named
    if whole and (a.model or a.chip) or not whole and not (a.model and a.chip):
        raise SystemExit(
            "mk schedule: give --model and --chip for one plan, or --refresh / --missing (no --model, --chip) for "
            "every case data/schedule keeps"
        )
    try:
        if whole:
            for case, bundles in cs.refresh(missing=a.missing):
                print(f"{case}: {bundles:,.0f} bundles", flush=True)
            return
        plan = named_plan(a.model, a.chip, a.context, a.batch, setup_of(a), a.dtype)
        s = cs.schedule_for(plan, a.chip, stored=a.stored, keep=a.store)
    except (RuntimeError, LookupError) as e:
        print(f"mk schedule: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    show(s.to_dict(), a.json, cs.text(s.to_dict()))
