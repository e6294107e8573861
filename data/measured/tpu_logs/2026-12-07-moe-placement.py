"""2026-12-07 (session 28), one TPU v5e: where an MoE layer's time past its bytes goes, at one user, 1K, bf16, random
weights (seed 0). Rows go to OUT_DIR through mk's own drivers (no module patched).

    python data/measured/tpu_logs/2026-12-07-moe-placement.py OUT_DIR DEADLINE_S PART

PART ``k``: the knock-outs of Qwen3-30B-A3B's first 8 layers and Gemma 4 26B-A4B's sliding+full pair at 16 steps a
call (mk.measure.chip_knockouts.CASES[3:]: every component, and the route's wait beside the router's,
mk.params.ROUTE_WAIT). PART ``t``: Mixtral 8x7B's first 2 layers (both engines, 1 and 16 steps a call, 20 back to
back), then Qwen3-30B-A3B's first 8 layers at 1 MiB weight tiles beside the default (mk.plan.Tiles, kernel alone, 16
steps a call). ``tiny``: both on tiny-moe on the CPU (interpret mode) to check the script.

Run on 2026-12-07 at commit dec1994 (kernel revision 4), one device call a part (logs: 2026-12-07-moe-placement-k.txt,
-t.txt). The knock-out rows went to data/measured/tpu_knockouts.csv; part t's rows to 2026-12-07-moe-placement.csv
(column ``part``), and its Mixtral rows to data/measured/tpu.csv (the 1 MiB variant stays in the log: no analysis
reads its setup). The out folder held a copy of data/measured/tpu_hbm.csv, so each row's limit columns are at its
measured limit.
"""

import shutil
import sys
from pathlib import Path

from mk.measure import chip_knockouts, tpu_runs
from mk.measure.on_chip import Case, Cell
from mk.plan import Tiles
from mk.units import MIB

out, deadline, part = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
tiny = part == "tiny"
ONE = (Cell(64, 1),) if tiny else (Cell(1024, 1),)
# the measured limit the knock-outs set each component's bytes against (the out folder starts empty)
out.mkdir(parents=True, exist_ok=True)
shutil.copy("data/measured/tpu_hbm.csv", out / "tpu_hbm.csv")
if tiny:
    knockouts = (Case("tiny-moe", cells=ONE, steps_a_call=(2,)),)
    table = (Case("tiny-moe", cells=ONE, steps_a_call=(1, 2), tiles=(Tiles(), Tiles(weight_tile_bytes=MIB // 8))),)
else:
    knockouts = chip_knockouts.CASES[3:]
    table = (
        Case("mixtral-8x7b", 2, cells=ONE, steps_a_call=(1, 16)),
        Case("qwen3-30b-a3b", 8, alone="megakernel", cells=ONE, steps_a_call=(16,),
             tiles=(Tiles(), Tiles(weight_tile_bytes=MIB))),
    )  # fmt: skip
parts = {"k": ("knockouts",), "t": ("table",)}.get(part, ("knockouts", "table"))
done = tpu_runs.run(parts, out, deadline, cases=table, knockout_cases=knockouts,
                    require_tpu=not tiny, steps=2 if tiny else 20, min_rounds=3 if tiny else 5,
                    budget_s=1.0 if tiny else 8.0)  # fmt: skip
print(done)
