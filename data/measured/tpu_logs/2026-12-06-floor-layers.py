"""The 26B-A4B chip-of-8 stand-in's floor (its step with every component knocked out, mk.params.KNOCKOUTS) against
its depth, on a TPU v5e: the stand-in of the whole model and of its first 10 and 1 layers, each its own engine
and weights, timed interleaved in one loop, context 1024, one user, random bf16 weights (seed 0), device time (20
steps back to back) beside the host's, medians with 95% intervals (mk.measure.harness). The floor's time a layer is
the slope over depth; what does not grow with depth is the intercept.

Run on 2026-12-06 as ``python data/measured/tpu_logs/2026-12-06-floor-layers.py OUT.csv`` from the repository's
root (output 2026-12-06-floor-layers.csv and .txt beside this file). ``tiny`` as the second argument runs the same on
the CPU (tiny-moe's stand-in, interpret mode, its whole depth and its first layer) to check the script.
"""

import sys
import time

import jax
import pandas as pd

from mk.measure.harness import TimedStep, provenance, spec_speed_of_light, time_engines
from mk.measure.on_chip import SLICE, Case, CaseEngines, Cell
from mk.params import KNOCKOUTS
from mk.progress import Log
from mk.sol import bytes_per_token

STEPS, BUDGET_S, MIN_ROUNDS = 20, 20.0, 5


def main(out: str, which: str = "stand-in") -> None:
    log, device, rows = Log(False), jax.devices()[0], []
    model = "tiny-moe" if which == "tiny" else "gemma4-26b-a4b"
    depths = (None, 1) if which == "tiny" else (None, 10, 1)
    cell = Cell(64, 1) if which == "tiny" else Cell(1024, 1)
    engines, calls = {}, {}
    for layers in depths:
        t = time.perf_counter()
        e = engines[layers] = CaseEngines(Case(model, layers, setup="workbook"), device, 0, log)
        if not e.setup.loopback:
            raise ValueError(f"{model}'s workbook case on this machine is not a loopback stand-in")
        e.build("megakernel")
        calls[e.cfg.num_layers] = e.call("megakernel", cell, frozenset(KNOCKOUTS))[0]
        log(f"{e.cfg.name} ({e.cfg.num_layers} layers): built and compiled in {time.perf_counter() - t:.0f} s")
    whole = engines[None]
    per_token = bytes_per_token(whole.cfg, cell.context, cell.batch, "bf16").total
    sol = spec_speed_of_light(per_token, device, SLICE, "tpu-v5e" if device.platform != "tpu" else None)
    run = dict(provenance(device), model=whole.cfg.name, dtype="bf16", context=cell.context, batch=cell.batch,
               weights="random (seed 0)")  # fmt: skip
    timed = [TimedStep(f"{n} layers", c, engine="megakernel") for n, c in calls.items()]
    _, got = time_engines(timed, sol, run, BUDGET_S, min_rounds=MIN_ROUNDS, steps_back_to_back=STEPS, log=log)
    for n, r in zip(calls, got):
        rows.append(dict(r, setup=whole.case.setup_label, layers=n, knockout=",".join(sorted(KNOCKOUTS))))
        log(f"{cell} floor, {n} layers: device {r['device_step_ms']:.4f} ms [{r['device_step_low_ms']:.4f}, "
            f"{r['device_step_high_ms']:.4f}], host {r['step_ms']:.3f} ms")  # fmt: skip
    pd.DataFrame(rows).to_csv(out, index=False)
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
