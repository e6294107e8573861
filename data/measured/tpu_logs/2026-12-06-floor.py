"""What the 26B-A4B chip-of-8 stand-in's step holds beyond its reads, on a TPU v5e: kernel revision 4 built nine
ways (each its own step, so its own compile), timed interleaved in one loop, one copy of the weights, context 1024,
one user, random bf16 weights (seed 0), device time (20 steps back to back) beside the host's, medians with 95%
intervals (mk.measure.harness).

The stand-in is chip 0 of the workbook's v5e-8 step alone on one chip, each of its exchanges a local DMA of the bytes
the links would carry (mk.megakernel.collective._round, KernelSetup.loopback). A variant named a probe is not a
kernel: its logits are wrong, and it is built so that it reads the bytes its counterpart reads.

- ``base``: revision 4 as it is.
- ``fixed-route``: the router knocked out (every user takes experts 0..7, weight 1/8): at one user the same count of
  distinct experts, so the same bytes, and routing that no longer depends on the activations' values.
- ``fixed-route-no-exchanges`` (a probe): the same with every exchange's local copies left out (no start, no wait);
  the receive buffers keep whatever they held, which with the route fixed changes no byte read.
- ``floor``: every component knocked out (mk.params.KNOCKOUTS): no weight tile, cache tile or op a component owns;
  what is left is the loop over layers, the route's table, the residuals, the exchanges and the kernel's fixed cost.
- ``floor-no-exchanges`` (a probe): the floor with the exchanges' copies left out.
- ``floor-no-route`` (a probe): the floor with each layer's Route op emitting nothing (the fixed experts' table, its
  copy to SMEM and the wait on it).
- ``floor-route-no-smem-copy`` (a probe): the floor with Route as it is but its table's VMEM -> SMEM copy left out.
- ``floor-no-residuals`` (a probe): the floor with each layer's AttentionResidual and FfnResidual emitting nothing.
- ``floor-bare`` (a probe): the floor with no Route, no residuals and no exchanges' copies.

Run on 2026-12-06 as ``python data/measured/tpu_logs/2026-12-06-floor.py OUT.csv`` from the repository's root
(output 2026-12-06-floor.csv and .txt beside this file). ``tiny`` as the second argument runs the same on the CPU
(tiny-moe's stand-in, interpret mode) to check the script.
"""

import contextlib
import sys
import time
from types import SimpleNamespace

import jax
import numpy as np
import pandas as pd

import mk.megakernel.collective as collective
import mk.megakernel.emit as emit
import mk.megakernel.moe as moe
from mk.measure.harness import TimedStep, provenance, spec_speed_of_light, time_engines
from mk.measure.on_chip import SLICE, Case, CaseEngines, Cell
from mk.megakernel import make_step
from mk.params import KNOCKOUTS, ROUTER
from mk.plan import AttentionResidual, FfnResidual, Route
from mk.progress import Log
from mk.sol import bytes_per_token

STEPS, BUDGET_S, MIN_ROUNDS = 20, 20.0, 5
FLOOR = frozenset(KNOCKOUTS)
VARIANTS = {  # name: (knock-out, what the probe leaves out)
    "base": (frozenset(), ()),
    "fixed-route": (frozenset({ROUTER}), ()),
    "fixed-route-no-exchanges": (frozenset({ROUTER}), ("exchanges",)),
    "floor": (FLOOR, ()),
    "floor-no-exchanges": (FLOOR, ("exchanges",)),
    "floor-no-route": (FLOOR, ("route",)),
    "floor-route-no-smem-copy": (FLOOR, ("route's copy",)),
    "floor-no-residuals": (FLOOR, ("residuals",)),
    "floor-bare": (FLOOR, ("route", "residuals", "exchanges")),
}


def nothing(k, op):
    """A probe: the op emits no code."""


def no_local_copies(k, sends, receives):
    """A probe: a stand-in's exchange round with its local copies left out."""
    if not k.plan.setup.loopback:
        raise ValueError("the no-exchanges probe is for a loopback stand-in only")


class _NoCopy:
    def start(self):
        pass

    def wait(self):
        pass


@contextlib.contextmanager
def left_out(parts):
    """The kernel's code with ``parts`` left out, while a step is compiled."""
    saved = dict(emit.EMIT), moe.pltpu, collective._round
    if "route" in parts:
        emit.EMIT[Route] = nothing
    if "residuals" in parts:
        emit.EMIT[AttentionResidual] = emit.EMIT[FfnResidual] = nothing
    if "route's copy" in parts:  # moe's pltpu with make_async_copy left out (emit_route's one copy)
        moe.pltpu = SimpleNamespace(make_async_copy=lambda *a, **kw: _NoCopy())
    if "exchanges" in parts:
        collective._round = no_local_copies
    try:
        yield
    finally:
        emit.EMIT.clear()
        emit.EMIT.update(saved[0])
        moe.pltpu, collective._round = saved[1], saved[2]


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
    for name, (knockout, parts) in VARIANTS.items():
        engines.steps["megakernel"] = make_step(engines.cfg, engines.setup)  # its own jit: compiled under its code
        with left_out(parts):
            calls[name] = engines.call("megakernel", cell, knockout)[0]  # (compiled and run twice)
    logits = {v: np.asarray(jax.device_get(c()), np.float32) for v, c in calls.items()}
    log(f"{cell}: {len(calls)} steps compiled in {time.perf_counter() - t:.0f} s")
    per_token = bytes_per_token(engines.cfg, cell.context, cell.batch, "bf16").total
    sol = spec_speed_of_light(per_token, device, SLICE, "tpu-v5e" if device.platform != "tpu" else None)
    run = dict(provenance(device), model=engines.cfg.name, dtype="bf16", context=cell.context, batch=cell.batch,
               weights="random (seed 0)")  # fmt: skip
    timed = [TimedStep(v, calls[v], engine="megakernel") for v in VARIANTS]
    _, got = time_engines(timed, sol, run, BUDGET_S, min_rounds=MIN_ROUNDS, steps_back_to_back=STEPS, log=log)
    for v, r in zip(VARIANTS, got):
        knockout, parts = VARIANTS[v]
        rows.append(dict(r, setup=engines.case.setup_label, variant=v, knockout=",".join(sorted(knockout)),
                         left_out=",".join(parts), logits_finite=bool(np.isfinite(logits[v]).all()),
                         max_logit_diff_vs_base=float(np.max(np.abs(logits[v] - logits["base"]))),
                         max_logit_diff_vs_floor=float(np.max(np.abs(logits[v] - logits["floor"])))))  # fmt: skip
        log(f"{cell} {v}: device {r['device_step_ms']:.4f} ms [{r['device_step_low_ms']:.4f}, "
            f"{r['device_step_high_ms']:.4f}], host {r['step_ms']:.3f} ms")  # fmt: skip
    pd.DataFrame(rows).to_csv(out, index=False)
    engines.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
