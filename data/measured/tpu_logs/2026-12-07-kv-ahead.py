"""2026-12-07 (session 30), one TPU v5e: kernel revision 6's switch mk.plan.Tiles.kv_ahead (a layer's first KV tiles
started at the layer's start, every user's read two ahead) beside the default kernel, interleaved, on the MoE one-user
cells the copies alone placed (2026-12-07-copies-alone: sliding attention the largest of what the core adds past its
copies on Gemma 4 26B-A4B's first 7 layers): 26B-A4B[:7] and gpt-oss-20b[:2] (the kernel alone), the 26B-A4B
chip-of-8 stand-in (setup g); 16 steps a call, context 1024, one user, bf16, random weights (seed 0). Rows go to
OUT_DIR through mk's own drivers (part ``table`` of tpu-measure).

    python data/measured/tpu_logs/2026-12-07-kv-ahead.py OUT_DIR DEADLINE_S PART

PART ``r``: the three cells; ``tiny``: tiny-moe on the CPU (interpret mode) to check the script.

Run on 2026-12-07 at commit 319d386, one device call (log: 2026-12-07-kv-ahead-r.txt). The call reached the end of
the session's device time while gpt-oss-20b[:2]'s kernels compiled. Only 26B-A4B[:7]'s two rows were timed, and they
went to data/measured/tpu.csv.
"""

import shutil
import sys
from pathlib import Path

from mk.measure import tpu_runs
from mk.measure.on_chip import Case, Cell
from mk.plan import Tiles

out, deadline, part = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
tiny = part == "tiny"
out.mkdir(parents=True, exist_ok=True)
shutil.copy("data/measured/tpu_hbm.csv", out / "tpu_hbm.csv")  # each row's limit columns at the measured limit
BOTH = dict(tiles=(Tiles(), Tiles(kv_ahead=True)), steps_a_call=(16,), cells=(Cell(1024, 1),))
if tiny:
    cases = (Case("tiny-moe", alone="megakernel", **(BOTH | dict(cells=(Cell(64, 1),), steps_a_call=(2,)))),)
else:
    cases = (
        Case("gemma4-26b-a4b", 7, alone="megakernel", **BOTH),
        Case("gpt-oss-20b", 2, alone="megakernel", **BOTH),
        Case("gemma4-26b-a4b", None, setup="workbook", **BOTH),
    )
print(tpu_runs.run(("table",), out, deadline, cases=cases, require_tpu=not tiny, steps=2 if tiny else 20,
                   min_rounds=3 if tiny else 5, budget_s=1.0 if tiny else 8.0))  # fmt: skip
