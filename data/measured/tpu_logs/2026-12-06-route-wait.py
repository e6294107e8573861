"""Whether the 26B-A4B chip-of-8 stand-in's weight stream waits on each layer's route, on a TPU v5e. In the kernel an
expert's tiles start loading only after the layer's Route op has listed the routed experts in SMEM (mk.plan.schedule:
``route_of``), so the copies in flight across a route are the shared MLP's alone. Kernel revision 4, routing fixed
(the router knocked out: every user takes experts 0..7, weight 1/8, the same count of distinct experts as real
routing at one user, so the same bytes), built two ways, timed interleaved in one loop with revision 4 as it is, one
copy of the weights, context 1024, one user, random bf16 weights (seed 0), device time (20 steps back to back) beside
the host's, medians with 95% intervals (mk.measure.harness).

- ``base``: revision 4 as it is.
- ``fixed-route``: the router knocked out.
- ``fixed-route-no-route-wait`` (a probe): the same, with each expert slot j's expert the static j (what the fixed
  route lists), every slot run unguarded (at one user all eight run anyway) and the expert tiles' loads free to
  start before the route, as early as their buffer slots allow. It reads what fixed-route reads and must give its
  logits bit for bit (checked, and written in the rows); its step less fixed-route's is what waiting on the route
  costs the stream.

Run on 2026-12-06 as ``python data/measured/tpu_logs/2026-12-06-route-wait.py OUT.csv`` from the repository's root
(output 2026-12-06-route-wait.csv and .txt beside this file). ``tiny`` as the second argument runs the same on the
CPU (tiny-moe's stand-in, interpret mode) to check the script.
"""

import contextlib
import sys
import time

import jax
import numpy as np
import pandas as pd

import mk.megakernel.kernel as kernel
import mk.plan.step as plan_step
from mk.measure.harness import TimedStep, provenance, spec_speed_of_light, time_engines
from mk.measure.on_chip import SLICE, Case, CaseEngines, Cell
from mk.megakernel import make_step
from mk.params import ROUTER
from mk.progress import Log
from mk.sol import bytes_per_token

STEPS, BUDGET_S, MIN_ROUNDS = 20, 15.0, 5
VARIANTS = {"base": frozenset(), "fixed-route": frozenset({ROUTER}), "fixed-route-no-route-wait": frozenset({ROUTER})}
original_schedule = plan_step.schedule


def schedule_no_route(ops, loads, route_of, slots, fences=()):
    """A probe: every load placed as its slot allows, experts' not held back for their route."""
    return original_schedule(ops, loads, {}, slots, fences)


def static_expert_id(self, slot):
    """A probe: slot j holds expert j (what the fixed route lists)."""
    return slot


def unguarded(self, slot, fn):
    """A probe: every expert slot runs."""
    return fn()


@contextlib.contextmanager
def no_route_wait(on: bool):
    """The kernel's plan and code with the experts' loads free of the route, while a step is compiled."""
    saved = plan_step.schedule, kernel.EmitContext.expert_id, kernel.EmitContext.guarded
    plan_step._built_plan.cache_clear()  # a plan built for another variant must not be reused
    if on:
        plan_step.schedule = schedule_no_route
        kernel.EmitContext.expert_id, kernel.EmitContext.guarded = static_expert_id, unguarded
    try:
        yield
    finally:
        plan_step.schedule, kernel.EmitContext.expert_id, kernel.EmitContext.guarded = saved
        plan_step._built_plan.cache_clear()


def main(out: str, which: str = "stand-in") -> None:
    log, device, rows = Log(False), jax.devices()[0], []
    model = "tiny-moe" if which == "tiny" else "gemma4-26b-a4b"
    cell = Cell(64, 1) if which == "tiny" else Cell(1024, 1)
    t = time.perf_counter()
    engines = CaseEngines(Case(model, None, setup="workbook"), device, 0, log)
    engines.build("megakernel")
    if not engines.setup.loopback:
        raise ValueError(f"{model}'s workbook case on this machine is not a loopback stand-in")
    if engines.cfg.top_k * cell.batch > 8:
        raise ValueError("the probe lists experts 0..7 statically: one user of a top-8 model at most")
    calls = {}
    for name, knockout in VARIANTS.items():
        engines.steps["megakernel"] = make_step(engines.cfg, engines.setup)  # its own jit: compiled under its code
        with no_route_wait(name.endswith("no-route-wait")):
            calls[name] = engines.call("megakernel", cell, knockout)[0]  # (compiled and run twice)
    logits = {v: np.asarray(jax.device_get(c()), np.float32) for v, c in calls.items()}
    log(f"{cell}: {len(calls)} steps built and compiled in {time.perf_counter() - t:.0f} s")
    per_token = bytes_per_token(engines.cfg, cell.context, cell.batch, "bf16").total
    sol = spec_speed_of_light(per_token, device, SLICE, "tpu-v5e" if device.platform != "tpu" else None)
    run = dict(provenance(device), model=engines.cfg.name, dtype="bf16", context=cell.context, batch=cell.batch,
               weights="random (seed 0)")  # fmt: skip
    timed = [TimedStep(v, calls[v], engine="megakernel") for v in VARIANTS]
    _, got = time_engines(timed, sol, run, BUDGET_S, min_rounds=MIN_ROUNDS, steps_back_to_back=STEPS, log=log)
    for v, r in zip(VARIANTS, got):
        same = bool(np.array_equal(logits[v], logits["fixed-route"]))
        rows.append(dict(r, setup=engines.case.setup_label, variant=v, knockout=",".join(sorted(VARIANTS[v])),
                         logits_equal_fixed_route=same))  # fmt: skip
        log(f"{cell} {v}: device {r['device_step_ms']:.4f} ms [{r['device_step_low_ms']:.4f}, "
            f"{r['device_step_high_ms']:.4f}], host {r['step_ms']:.3f} ms, same logits as fixed-route: {same}")
    pd.DataFrame(rows).to_csv(out, index=False)
    engines.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
