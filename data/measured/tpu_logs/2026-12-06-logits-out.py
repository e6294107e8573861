"""What writing the logits out costs a megakernel step, on a TPU v5e: every measured step (python -m mk tpu-measure,
decode_call) asks the kernel for each user's logits, which it sends to HBM tile by tile beside its greedy pick; a
serving loop that keeps its tokens on the chip asks for the picks alone (MegakernelStep.greedy: no logits written).
Kernel revision 4, for the 26B-A4B chip-of-8 stand-in and llama-3.2-1b on one chip, context 1024, one user: the
step with its logits and without, and the floor (every component knocked out, mk.params.KNOCKOUTS; the head's
knock-out still writes zero logits tile by tile when asked) with and without, all interleaved in one loop, random bf16
weights (seed 0), device time (20 steps back to back) beside the host's, medians with 95% intervals.

Run on 2026-12-06 as ``python data/measured/tpu_logs/2026-12-06-logits-out.py OUT.csv`` from the repository's root
(output 2026-12-06-logits-out.csv and .txt beside this file). ``tiny`` as the second argument runs the same on the
CPU (tiny-moe's stand-in and tiny-llama, interpret mode) to check the script.
"""

import sys
import time

import jax
import pandas as pd

from mk.measure.harness import TimedStep, provenance, spec_speed_of_light, time_engines
from mk.measure.on_chip import SLICE, Case, CaseEngines, Cell
from mk.measure.steps import _inputs, settled
from mk.params import KNOCKOUTS
from mk.progress import Log
from mk.sol import bytes_per_token

STEPS, BUDGET_S, MIN_ROUNDS = 20, 20.0, 5
FLOOR = frozenset(KNOCKOUTS)


def greedy_call(e: CaseEngines, cell: Cell, knockout):
    """``e``'s kernel step for ``cell`` as decode_call times it, but asking for the picks alone (no logits written)."""
    step = e.steps["megakernel"]
    with jax.default_device(e.device):
        params, tokens, cache = _inputs(step, e.weights["megakernel"], e.cfg, cell.context, cell.batch, "bf16", 1)
    pos, state = jax.numpy.asarray(cell.context - 1, jax.numpy.int32), {"cache": cache}

    def call():
        with jax.default_device(e.device):
            picks, state["cache"] = step.greedy(params, e.cfg, state["cache"], tokens, pos, knockout)
        return picks

    return settled(call)


def main(out: str, which: str = "chip") -> None:
    log, device, rows = Log(False), jax.devices()[0], []
    tiny = which == "tiny"
    cases = {
        "stand-in": Case("tiny-moe" if tiny else "gemma4-26b-a4b", None, setup="workbook"),
        "one chip": Case("tiny-llama" if tiny else "llama-3.2-1b", None),
    }
    cell = Cell(64, 1) if tiny else Cell(1024, 1)
    for label, case in cases.items():
        t = time.perf_counter()
        e = CaseEngines(case, device, 0, log)
        e.build("megakernel")
        calls = {}
        for name, knockout in (("step", frozenset()), ("floor", FLOOR)):
            calls[f"{name}, logits out"] = e.call("megakernel", cell, knockout)[0]
            calls[f"{name}, picks only"] = greedy_call(e, cell, knockout)
        log(f"{label}: {e.cfg.name} built and {len(calls)} steps compiled in {time.perf_counter() - t:.0f} s")
        per_token = bytes_per_token(e.cfg, cell.context, cell.batch, "bf16").total
        chips = SLICE if e.setup.loopback else 1
        sol = spec_speed_of_light(per_token, device, chips, "tpu-v5e" if device.platform != "tpu" else None)
        run = dict(provenance(device), model=e.cfg.name, dtype="bf16", context=cell.context, batch=cell.batch,
                   weights="random (seed 0)")  # fmt: skip
        timed = [TimedStep(v, c, engine="megakernel") for v, c in calls.items()]
        _, got = time_engines(timed, sol, run, BUDGET_S, min_rounds=MIN_ROUNDS, steps_back_to_back=STEPS, log=log)
        for v, r in zip(calls, got):
            rows.append(dict(r, setup=case.setup_label, variant=v))
            log(f"{label} {v}: device {r['device_step_ms']:.4f} ms [{r['device_step_low_ms']:.4f}, "
                f"{r['device_step_high_ms']:.4f}], host {r['step_ms']:.3f} ms")  # fmt: skip
        pd.DataFrame(rows).to_csv(out, index=False)
        e.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
