"""The commands that compile the megakernel ahead of time with libtpu (no TPU needed): schedule, compile."""

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
    from ..dtypes import DTYPES
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
    dtypes = [d for d in DTYPES if kernel_streams(d)]  # per-tensor FP8 is modelled by bytes: no schedule
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
                model = case[0] if isinstance(case[0], str) else case[0].name  # a name, or a config (a cut model)
                print(f"{(model, *case[1:])}: {bundles:,.0f} bundles", flush=True)
            return
        plan = named_plan(a.model, a.chip, a.context, a.batch, setup_of(a), a.dtype)
        s = cs.schedule_for(plan, a.chip, stored=a.stored, keep=a.store)
    except (RuntimeError, LookupError) as e:
        print(f"mk schedule: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    show(s.to_dict(), a.json, cs.text(s.to_dict()))


# compile -----------------------------------------------------------------------------------------
def add_compile(sub) -> None:
    from ..dtypes import DTYPES
    from ..timing.work import kernel_streams

    p = sub.add_parser(
        "compile",
        help="the megakernel's step compiled ahead of time for a TPU slice, past one host too: per-chip bytes (plan "
        "against the compiler), VMEM, Mosaic calls, seconds (compiles with libtpu, exit 2 without)",
    )
    p.add_argument("--model", required=True, help=MODEL_HELP + RUNNABLE_HELP)
    p.add_argument(
        "--chip", required=True,
        help="a TPU slice: one data/slices.csv documents (tpu-v5e-16, tpu-v5e-64, tpu-v5p-8), tpu-v5e, tpu-v6e, "
        "tpu-v6e-8, or a topology as libtpu names it (v6e:4x4)",
    )  # fmt: skip
    p.add_argument("--context", type=positive, default=1024, help="positions in the KV cache (default 1024)")
    p.add_argument("--batch", type=positive, default=1, help="users decoded together (default 1)")
    dtypes = [d for d in DTYPES if kernel_streams(d)]
    p.add_argument(
        "--dtype", default="bf16", choices=dtypes,
        help="the weights' data type as the kernel streams it (fp8-block, int4, mxfp4: as the releases ship them, "
        "codes and block scales)",
    )  # fmt: skip
    add_setup(p, "workbook")
    p.add_argument(
        "--no-vmem", action="store_true",
        help="skip the second compile (under half the plan's VMEM) that reads the compiler's own VMEM figure",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_compile)


def _run_compile(a) -> None:
    from ..chips import get_chip
    from ..config import get_config
    from ..dtypes import get_dtype
    from ..megakernel.aot import aot_target
    from ..megakernel.on_slice import compile_on_slice, text
    from ..plan import build_plan
    from ..sharding.pods import pod_setup
    from ..timing.work import plan_quantize

    chip, _ = aot_target(a.chip)
    arrays = get_dtype(a.dtype).arrays
    # the kernel as it runs over every chip of the slice: past one host, round the slice's torus, a split MoE's experts
    # whole over hosts (mk.sharding.pods.pod_setup)
    cfg = get_config(a.model)
    setup = pod_setup(setup_of(a), get_chip(chip), cfg, dtype=a.dtype)
    plan = build_plan(
        cfg, a.batch, a.context, weight_dtype=arrays, kv_dtype=arrays, setup=setup,
        quantize=plan_quantize(a.dtype),
    )  # fmt: skip
    try:
        s = compile_on_slice(plan, a.chip, vmem=not a.no_vmem)
    except RuntimeError as e:  # no libtpu, or libtpu refusing the step (its first line says why)
        print(f"mk compile: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    show(s.to_dict(), a.json, text(s))
