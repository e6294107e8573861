"""Kernel revision 3 (heads narrower than 128 lanes packed two, four, ... to a 128-lane group) against revision 2 (each
head padded to 128 lanes), interleaved with XLA's compiled reference in one loop, on a TPU v5e, llama-3.2-1b (head
dim 64), random bf16 weights (seed 0), device time (20 steps dispatched back to back, blocked once) beside the host's,
medians with 95% intervals (mk.measure.harness.time_engines). Run once on 2026-12-05; its output: 2026-12-05-packed-
heads.csv and .txt beside this file. Not a table the workbook shows: the table's rows come from
``python -m mk tpu-measure`` at each revision.

Revision 2 is mk at commit 8e467e0, importable as ``mk_before`` from the repository's root:

    git archive 8e467e0 mk | tar -x && mv mk mk_before   # in a scratch folder, then move mk_before to the root
    sed -i 's/"mk.generate", "mk.megakernel"/"mk_before.generate", "mk_before.megakernel"/' mk_before/engines.py
    python data/measured/tpu_logs/2026-12-05-packed-heads.py OUT.csv [MODEL [CONTEXT:BATCH ...]]
"""

import sys
import time

import jax
import numpy as np
import pandas as pd

import mk_before.config
import mk_before.engines
import mk_before.kernel_setup
import mk_before.measure.steps
import mk_before.megakernel.engine
from mk.config import get_config
from mk.measure.harness import TimedStep, provenance, spec_speed_of_light, time_engines
from mk.measure.on_chip import Case, CaseEngines, Cell
from mk.measure.steps import settled
from mk.megakernel import make_step
from mk.progress import Log
from mk.sol import bytes_per_token
from mk.weights import random_tensors

CELLS = (Cell(1024, 1), Cell(8192, 1), Cell(32768, 1), Cell(1024, 4), Cell(1024, 8), Cell(8192, 4))
STEPS, BUDGET_S, MIN_ROUNDS = 20, 15.0, 5


def on(device, fn):
    """``fn`` run under ``device`` (every call alike: a jit keyed alike, compiled once)."""

    def placed():
        with jax.default_device(device):
            return fn()

    return settled(placed)


def revision_2(device, host: dict, model: str):
    """The kernel at revision 2 (mk_before), its weights packed on the chip: (a function of a cell giving its call)."""
    cfg = mk_before.config.get_config(model)
    with jax.default_device(device):
        step = mk_before.megakernel.engine.make_step(cfg, mk_before.kernel_setup.ONE_CHIP)
        weights = step.packed(host)
        jax.block_until_ready(weights)

    def call(cell: Cell):
        with jax.default_device(device):
            multiple = mk_before.engines.cache_multiple("megakernel")
            c = mk_before.measure.steps.decode_call(step, weights, cfg, cell.context, cell.batch, "bf16",
                                                    cache_multiple=multiple)  # fmt: skip
        return on(device, c)

    return call


def main(out: str, model: str = "llama-3.2-1b", *cells: str) -> None:
    log, device = Log(False), jax.devices()[0]
    cells = [Cell(*map(int, c.split(":"))) for c in cells] or CELLS
    engines = CaseEngines(Case(model), device, 0, log)
    engines.build("reference")
    t = time.perf_counter()
    host = {p: np.asarray(x) for p, x in random_tensors(get_config(model), 0, jax.numpy.bfloat16, device)}
    with jax.default_device(device):
        engines.steps["megakernel"] = step = make_step(engines.cfg, engines.setup)
        engines.weights["megakernel"] = step.packed(host)
        jax.block_until_ready(engines.weights["megakernel"])
    before = revision_2(device, host, model)
    del host
    log(f"both kernels' weights on the chip in {time.perf_counter() - t:.1f} s")
    rows = []
    for cell in cells:
        t = time.perf_counter()
        timed = [
            TimedStep("reference", engines.call("reference", cell)[0]),
            TimedStep("megakernel[r2]", before(cell), engine="megakernel"),
            TimedStep("megakernel[r3]", engines.call("megakernel", cell)[0], engine="megakernel"),
        ]
        log(f"{cell}: {len(timed)} steps compiled in {time.perf_counter() - t:.0f} s")
        per_token = bytes_per_token(engines.cfg, cell.context, cell.batch, "bf16").total
        sol = spec_speed_of_light(per_token, device, 1, "tpu-v5e" if device.platform != "tpu" else None)
        run = dict(provenance(device), model=engines.cfg.name, dtype="bf16", context=cell.context, batch=cell.batch,
                   weights="random (seed 0)")  # fmt: skip
        _, got = time_engines(timed, sol, run, BUDGET_S, min_rounds=MIN_ROUNDS, steps_back_to_back=STEPS, log=log)
        for e, r in zip(timed, got):
            rows.append(dict(r, variant=e.label))
            log(f"{e.label}: device {r['device_step_ms']:.3f} ms [{r['device_step_low_ms']:.3f}, "
                f"{r['device_step_high_ms']:.3f}], host {r['step_ms']:.3f} ms")  # fmt: skip
        pd.DataFrame(rows).to_csv(out, index=False)
        del timed, got
    engines.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
