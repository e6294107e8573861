"""What the 26B-A4B chip-of-8 stand-in's step holds beyond its reads, on a TPU v5e: kernel revision 4 built five
ways, timed interleaved in one loop, one copy of the weights, context 1024, one user, random bf16 weights (seed 0),
device time (20 steps back to back) beside the host's, medians with 95% intervals (mk.measure.harness).

The stand-in is chip 0 of the workbook's v5e-8 step alone on one chip, each of its exchanges a local DMA of the bytes
the links would carry (mk.megakernel.collective._round, KernelSetup.loopback). Variants:

- ``base``: revision 4 as it is.
- ``fixed-route``: the router knocked out (every user takes experts 0..7, weight 1/8): at one user the same count of
  distinct experts, so the same bytes, and routing that no longer depends on the activations' values.
- ``fixed-route-no-exchanges`` (a probe, its logits wrong): the same with every exchange's local copies left out (no
  start, no wait); the receive buffers keep whatever they held, which with the route fixed changes no bytes read.
  Its step less fixed-route's is what the local copies (and the waits on them) cost the step.
- ``floor``: every component knocked out (mk.params.KNOCKOUTS): no weight tile, cache tile or op a component owns;
  what is left is the loop over layers, the route's table, the exchanges and the kernel's fixed cost.
- ``floor-no-exchanges`` (a probe): the floor with the exchanges' copies left out too.

Run on 2026-12-06 as ``python data/measured/tpu_logs/2026-12-06-exchanges.py OUT.csv`` from the repository's root
(output 2026-12-06-exchanges.csv and .txt beside this file). ``tiny`` as the second argument runs the same on the CPU
(tiny-moe's stand-in, interpret mode) to check the script.
"""

import contextlib
import sys
import time

import jax
import numpy as np
import pandas as pd

import mk.megakernel.collective as collective
from mk.measure.harness import TimedStep, provenance, spec_speed_of_light, time_engines
from mk.measure.on_chip import SLICE, Case, CaseEngines, Cell
from mk.params import KNOCKOUTS, ROUTER
from mk.progress import Log
from mk.sol import bytes_per_token

STEPS, BUDGET_S, MIN_ROUNDS = 20, 20.0, 5
VARIANTS = {  # name: (knock-out, exchanges' copies kept)
    "base": (frozenset(), True),
    "fixed-route": (frozenset({ROUTER}), True),
    "fixed-route-no-exchanges": (frozenset({ROUTER}), False),
    "floor": (frozenset(KNOCKOUTS), True),
    "floor-no-exchanges": (frozenset(KNOCKOUTS), False),
}

original_round = collective._round


def no_local_copies(k, sends, receives):
    """A probe: a stand-in's exchange round with its local copies left out."""
    if not k.plan.setup.loopback:
        raise ValueError("the no-exchanges probe is for a loopback stand-in only")


@contextlib.contextmanager
def exchanges(kept: bool):
    """The kernel's exchanges as built while a step is compiled: as they are, or with their copies left out."""
    collective._round = original_round if kept else no_local_copies
    try:
        yield
    finally:
        collective._round = original_round


def main(out: str, which: str = "stand-in") -> None:
    log, device, rows = Log(False), jax.devices()[0], []
    model = "tiny-moe" if which == "tiny" else "gemma4-26b-a4b"
    cell = Cell(64, 1) if which == "tiny" else Cell(1024, 1)
    t = time.perf_counter()
    engines = CaseEngines(Case(model, None, setup="workbook"), device, 0, log)
    engines.build("megakernel")
    log(f"engine built in {time.perf_counter() - t:.0f} s")
    if not engines.setup.loopback:
        raise ValueError(f"{model}'s workbook case on this machine is not a loopback stand-in")
    t = time.perf_counter()
    calls = {}
    for name, (knockout, kept) in VARIANTS.items():
        with exchanges(kept):
            calls[name] = engines.call("megakernel", cell, knockout)[0]  # compiled (and run twice) under its code
    logits = {v: np.asarray(jax.device_get(c()), np.float32) for v, c in calls.items()}
    log(f"{cell}: {len(calls)} steps compiled in {time.perf_counter() - t:.0f} s")
    per_token = bytes_per_token(engines.cfg, cell.context, cell.batch, "bf16").total
    sol = spec_speed_of_light(per_token, device, SLICE, "tpu-v5e" if device.platform != "tpu" else None)
    run = dict(provenance(device), model=engines.cfg.name, dtype="bf16", context=cell.context, batch=cell.batch,
               weights="random (seed 0)")  # fmt: skip
    timed = [TimedStep(v, calls[v], engine="megakernel") for v in VARIANTS]
    _, got = time_engines(timed, sol, run, BUDGET_S, min_rounds=MIN_ROUNDS, steps_back_to_back=STEPS, log=log)
    for v, r in zip(VARIANTS, got):
        knockout, kept = VARIANTS[v]
        finite = bool(np.isfinite(logits[v]).all())
        rows.append(dict(r, setup=engines.case.setup_label, variant=v, knockout=",".join(sorted(knockout)),
                         exchanges_kept=kept, logits_finite=finite,
                         max_logit_diff_vs_base=float(np.max(np.abs(logits[v] - logits["base"])))))  # fmt: skip
        log(f"{cell} {v}: device {r['device_step_ms']:.4f} ms [{r['device_step_low_ms']:.4f}, "
            f"{r['device_step_high_ms']:.4f}], host {r['step_ms']:.3f} ms, logits finite {finite}")  # fmt: skip
    pd.DataFrame(rows).to_csv(out, index=False)
    engines.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
