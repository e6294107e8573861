"""An exploration of the megakernel's loss at long contexts, run once on a TPU v5e on 2026-12-05: the
megakernel's KV tile (positions a tile) and weight-buffer slots (copies in flight), each variant of llama-3.2-1b's
step interleaved with XLA's compiled reference in one loop, one user, device time (20 steps dispatched back to back,
blocked once), medians with 95% intervals (mk.measure.harness.time_engines). The kernel's weights are packed once and
shared by every variant (packing does not depend on the tiles). Its output: 2026-12-05-kv-tiles.csv and .txt beside
this file; the second call's (MK_ATTENTION_OFF=1): 2026-12-05-attention-off.csv and .txt. Not a table the workbook
shows: what it finds is to become kernel revisions, measured by mk.measure.

    python data/measured/tpu_logs/2026-12-05-kv-tiles.py OUT.csv [MODEL] [CONTEXT ...]
    MK_ATTENTION_OFF=1 python data/measured/tpu_logs/2026-12-05-kv-tiles.py OUT.csv [MODEL] [CONTEXT ...]
"""

import os
import sys
import time

import jax
import pandas as pd

from mk.config import get_config
from mk.engines import cache_multiple
from mk.kernel_setup import ONE_CHIP
from mk.measure.harness import TimedStep, provenance, spec_speed_of_light, time_engines
from mk.measure.on_chip import Case, CaseEngines, Cell
from mk.measure.steps import decode_call, settled
from mk.megakernel.engine import make_step
from mk.plan import Tiles
from mk.progress import Log
from mk.sol import bytes_per_token

VARIANTS = {"kv512-slots2": Tiles(), "kv1024-slots2": Tiles(kv_tile=1024), "kv2048-slots2": Tiles(kv_tile=2048),
            "kv512-slots3": Tiles(slots=3)}  # fmt: skip
STEPS, BUDGET_S, MIN_ROUNDS = 20, 20.0, 5
# A second call (MK_ATTENTION_OFF=1) drops the KV tile variants but the default and times each engine with its
# attention knocked out beside its whole step (mk.params.KNOCKOUTS; llama's layers are all full attention).
ATTENTION_OFF = frozenset({"full_attention"}) if os.environ.get("MK_ATTENTION_OFF") else frozenset()
if ATTENTION_OFF:
    VARIANTS = {"kv512-slots2": Tiles()}


def variant_call(engines: CaseEngines, engine: str, context: int, tiles: Tiles | None = None, knockout=frozenset()):
    step = engines.steps[engine] if tiles is None else make_step(engines.cfg, ONE_CHIP, tiles=tiles)
    with jax.default_device(engines.device):
        call = decode_call(step, engines.weights[engine], engines.cfg, context, 1, "bf16", frozenset(knockout),
                           cache_multiple=cache_multiple(engine))  # fmt: skip

    def placed():
        with jax.default_device(engines.device):
            return call()

    return settled(placed)


def main(out: str, model: str = "llama-3.2-1b", *contexts: str) -> None:
    log, device = Log(False), jax.devices()[0]
    engines = CaseEngines(Case(model), device, 0, log)
    for e in ("reference", "megakernel"):
        engines.build(e)
    rows = []
    for context in [int(c) for c in contexts] or [32768, 8192]:
        t = time.perf_counter()
        timed = [TimedStep("reference", engines.call("reference", Cell(context, 1))[0])]
        timed += [TimedStep(f"megakernel[{name}]", variant_call(engines, "megakernel", context, tiles),
                            engine="megakernel") for name, tiles in VARIANTS.items()]  # fmt: skip
        if ATTENTION_OFF:  # the second call: how much of each engine's step its attention takes
            timed += [TimedStep(f"{e}[attention off]", variant_call(engines, e, context, knockout=ATTENTION_OFF),
                                engine=e) for e in ("reference", "megakernel")]  # fmt: skip
        log(f"context {context}: {len(timed)} steps compiled in {time.perf_counter() - t:.0f} s")
        per_token = bytes_per_token(engines.cfg, context, 1, "bf16").total
        sol = spec_speed_of_light(per_token, device, 1, "tpu-v5e" if device.platform != "tpu" else None)
        run = dict(provenance(device), model=engines.cfg.name, dtype="bf16", context=context, batch=1,
                   weights="random (seed 0)")  # fmt: skip
        _, got = time_engines(timed, sol, run, BUDGET_S, min_rounds=MIN_ROUNDS, steps_back_to_back=STEPS, log=log)
        for e, r in zip(timed, got):
            rows.append(dict(r, variant=e.label))
            log(f"{e.label}: device {r['device_step_ms']:.3f} ms [{r['device_step_low_ms']:.3f}, "
                f"{r['device_step_high_ms']:.3f}], host {r['step_ms']:.3f} ms")  # fmt: skip
        pd.DataFrame(rows).to_csv(out, index=False)
    engines.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
