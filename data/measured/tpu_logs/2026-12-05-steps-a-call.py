"""Host wall time a token with N greedy steps in one compiled call (N = 1, 4, 16), on a TPU v5e, llama-3.2-1b, random
bf16 weights (seed 0): the megakernel's calls of N kernel steps (MegakernelEngine.greedy_steps) against XLA's reference
in a ``jax.lax.fori_loop`` of N steps (mk.measure.steps.greedy_steps_call), every call interleaved in one loop, each
call waited on (the host's time), and 5 calls dispatched back to back (the device's), medians with 95% intervals
(mk.measure.harness.time_engines). A call's times over N are a token's. Run once on 2026-12-05 at kernel revision 3;
its output: 2026-12-05-steps-a-call.csv and .txt beside this file.

    python data/measured/tpu_logs/2026-12-05-steps-a-call.py OUT.csv [MODEL [CONTEXT:BATCH ...]]
"""

import sys

import jax
import pandas as pd

from mk.engines import cache_multiple
from mk.measure.harness import TimedStep, provenance, spec_speed_of_light, time_engines
from mk.measure.on_chip import Case, CaseEngines, Cell
from mk.measure.steps import greedy_steps_call, settled
from mk.progress import Log
from mk.sol import bytes_per_token

STEPS_A_CALL = (1, 4, 16)
CELLS = (Cell(1024, 1), Cell(1024, 8))
BACK_TO_BACK, BUDGET_S, MIN_ROUNDS = 5, 20.0, 5


def steps_call(engines: CaseEngines, engine: str, cell: Cell, steps: int):
    with jax.default_device(engines.device):
        call = greedy_steps_call(engines.steps[engine], engines.weights[engine], engines.cfg, cell.context, cell.batch,
                                 "bf16", steps, cache_multiple(engine))  # fmt: skip

    def placed():
        with jax.default_device(engines.device):
            return call()

    return settled(placed)


def main(out: str, model: str = "llama-3.2-1b", *cells: str) -> None:
    log, device = Log(False), jax.devices()[0]
    cells = [Cell(*map(int, c.split(":"))) for c in cells] or CELLS
    engines = CaseEngines(Case(model), device, 0, log)
    for e in ("reference", "megakernel"):
        engines.build(e)
    rows = []
    for cell in cells:
        timed = [TimedStep(f"{e}[{n} a call]", steps_call(engines, e, cell, n), engine=e)
                 for n in STEPS_A_CALL for e in ("reference", "megakernel")]  # fmt: skip
        per_token = bytes_per_token(engines.cfg, cell.context, cell.batch, "bf16").total
        sol = spec_speed_of_light(per_token, device, 1, "tpu-v5e" if device.platform != "tpu" else None)
        run = dict(provenance(device), model=engines.cfg.name, dtype="bf16", context=cell.context, batch=cell.batch,
                   weights="random (seed 0)")  # fmt: skip
        _, got = time_engines(timed, sol, run, BUDGET_S, min_rounds=MIN_ROUNDS, steps_back_to_back=BACK_TO_BACK,
                              log=log)  # fmt: skip
        for e, r, n in zip(timed, got, [n for n in STEPS_A_CALL for _ in range(2)]):
            token = dict(host_token_ms=r["step_ms"] / n, device_token_ms=r["device_step_ms"] / n)
            rows.append(dict(r, variant=e.label, steps_a_call=n, **token))
            log(f"{cell} {e.label}: a token {token['host_token_ms']:.3f} ms host, {token['device_token_ms']:.3f} ms "
                f"device (host over device {token['host_token_ms'] / token['device_token_ms'] - 1:+.1%})")  # fmt: skip
        pd.DataFrame(rows).to_csv(out, index=False)
    engines.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
