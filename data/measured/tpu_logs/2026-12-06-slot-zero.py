"""Kernel revision 4 (a routed expert's slot 0 always runs, its index static or traced) against revision 3 (a traced
slot 0 guarded by the routed count), interleaved in one loop on a TPU v5e, with XLA's compiled reference beside them
where a case has one: the gemma4-26b-a4b layer pair (sliding + full, all 128 experts on the chip) at 1 and 8 users
and the chip-of-8 stand-in (the workbook's kernel, loopback) at one user; context 1024, random bf16 weights (seed 0),
device time (20 steps dispatched back to back, blocked once) beside the host's, medians with 95% intervals
(mk.measure.harness.time_engines). Run once on 2026-12-06; its output: 2026-12-06-slot-zero.csv and .txt beside this
file. Each revision builds its own weights with its own tree's code (the same seed, the same packing).

Revision 3 is mk at commit 13ea1f0, importable as ``mk_before`` from the repository's root:

    git archive 13ea1f0 mk | tar -x -C SCRATCH && mv SCRATCH/mk mk_before
    sed -i 's/"mk.generate", "mk.megakernel"/"mk_before.generate", "mk_before.megakernel"/' mk_before/engines.py
    python data/measured/tpu_logs/2026-12-06-slot-zero.py OUT.csv [pair|stand-in ...] [--share-weights]

Run as ``OUT.csv pair stand-in``, the stand-in's second copy of the weights did not fit the chip (the .txt's first
part); the stand-in was run again with ``--share-weights`` (both revisions' steps on one copy), at one user
(2026-12-06-slot-zero-stand-in.*) and at eight (``stand-in-8``: 2026-12-06-slot-zero-stand-in-8.*).
"""

import sys
import time

import jax
import pandas as pd

import mk_before.measure.on_chip as before
from mk.config import LAYER_PAIR
from mk.measure.harness import TimedStep, provenance, spec_speed_of_light, time_engines
from mk.measure.on_chip import SLICE, Case, CaseEngines, Cell
from mk.progress import Log
from mk.sol import bytes_per_token
from mk_before.megakernel import make_step as make_step_before

CASES = {
    "pair": (dict(model="gemma4-26b-a4b", layers=LAYER_PAIR), (Cell(1024, 1), Cell(1024, 8)), True),
    "stand-in": (dict(model="gemma4-26b-a4b", layers=None, setup="workbook"), (Cell(1024, 1),), False),
    "stand-in-8": (dict(model="gemma4-26b-a4b", layers=None, setup="workbook"), (Cell(1024, 8),), False),
}
STEPS, BUDGET_S, MIN_ROUNDS = 20, 15.0, 5


def measure(name: str, log, device, rows: list, out: str, share: bool) -> None:
    spec, cells, with_reference = CASES[name]
    t = time.perf_counter()
    now = CaseEngines(Case(**spec), device, 0, log)
    old = before.CaseEngines(before.Case(**spec), device, 0, log)
    for e in ("megakernel", "reference") if with_reference else ("megakernel",):
        now.build(e)
    if share:  # one copy of the weights for both revisions: their packing code is the same (mk/weights.py and
        # mk/megakernel/ differ only in kernel.py's guard), and two copies of the stand-in's do not fit the chip
        old.weights["megakernel"], old.steps["megakernel"] = (
            now.weights["megakernel"],
            make_step_before(old.cfg, old.setup),
        )
    else:
        old.build("megakernel")
    log(f"{name}: engines built in {time.perf_counter() - t:.0f} s")
    chips = SLICE if now.setup.loopback else 1
    for cell in cells:
        t = time.perf_counter()
        timed = [
            TimedStep("megakernel[r3]", old.call("megakernel", cell)[0], engine="megakernel"),
            TimedStep("megakernel[r4]", now.call("megakernel", cell)[0], engine="megakernel"),
        ]
        if with_reference:
            timed.insert(0, TimedStep("reference", now.call("reference", cell)[0]))
        log(f"{name} {cell}: {len(timed)} steps compiled in {time.perf_counter() - t:.0f} s")
        per_token = bytes_per_token(now.cfg, cell.context, cell.batch, "bf16").total
        sol = spec_speed_of_light(per_token, device, chips, "tpu-v5e" if device.platform != "tpu" else None)
        run = dict(provenance(device), model=now.cfg.name, dtype="bf16", context=cell.context, batch=cell.batch,
                   weights="random (seed 0)")  # fmt: skip
        _, got = time_engines(timed, sol, run, BUDGET_S, min_rounds=MIN_ROUNDS, steps_back_to_back=STEPS, log=log)
        for e, r in zip(timed, got):
            rows.append(dict(r, case=name, setup=now.case.setup_label, variant=e.label))
            log(f"{name} {cell} {e.label}: device {r['device_step_ms']:.3f} ms [{r['device_step_low_ms']:.3f}, "
                f"{r['device_step_high_ms']:.3f}], host {r['step_ms']:.3f} ms")  # fmt: skip
        pd.DataFrame(rows).to_csv(out, index=False)
    old.close()
    now.close()


def main(out: str, *names: str) -> None:
    log, device, rows = Log(False), jax.devices()[0], []
    share = "--share-weights" in names
    for name in [n for n in names if n != "--share-weights"] or tuple(CASES):
        measure(name, log, device, rows, out, share)


if __name__ == "__main__":
    main(*sys.argv[1:])
