"""Written 2026-12-08 (session 31) for the next session's TPU v5e: kernel revision 9's switch
mk.plan.Tiles.weight_priority (the weight tiles' copies at DMA priority 1, every other copy at 0) beside the kernel
without it, both with the KV tiles and expert biases read ahead (revisions 6 and 8, each faster on every cell it was
timed on: 2026-12-07-bias-ahead), on the cells whose core waits on small copies behind the weight stream: Gemma 4
26B-A4B's first 7 layers (the route's table), the 26B-A4B chip-of-8 stand-in (setup g: its loopback exchanges),
gpt-oss-20b[:2] (its bias rows); and the copies alone of 26B-A4B[:7] at each priority. 16 steps a call, context 1024,
one user, bf16, random weights (seed 0). Rows go to OUT_DIR through mk's own drivers (parts ``table`` and ``copies``
of tpu-measure).

    python data/measured/tpu_logs/2026-12-08-weight-priority.py OUT_DIR DEADLINE_S PART

PART ``a``: 26B-A4B[:7] and gpt-oss-20b[:2]; ``s``: the stand-in; ``c``: the copies alone of 26B-A4B[:7];
``tiny``: tiny-moe on the CPU (interpret mode) to check the script.
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
AHEAD = Tiles(kv_ahead=True, expert_bias_ahead=True)
PRIORITY = dict(steps_a_call=(16,), cells=(Cell(1024, 1),), alone="megakernel",
                tiles=(AHEAD, Tiles(kv_ahead=True, expert_bias_ahead=True, weight_priority=1)))  # fmt: skip
parts, copies = ("table",), ()
if tiny:
    cases = (Case("tiny-moe", **(PRIORITY | dict(cells=(Cell(64, 1),), steps_a_call=(2,)))),)
    parts, copies = ("table", "copies"), cases
elif part == "a":
    cases = (Case("gemma4-26b-a4b", 7, **PRIORITY), Case("gpt-oss-20b", 2, **PRIORITY))
elif part == "s":
    cases = (Case("gemma4-26b-a4b", None, setup="workbook", **PRIORITY),)
else:
    cases, parts, copies = (), ("copies",), (Case("gemma4-26b-a4b", 7, **PRIORITY),)
print(tpu_runs.run(parts, out, deadline, cases=cases, copies_cases=copies, require_tpu=not tiny,
                   steps=2 if tiny else 20, min_rounds=3 if tiny else 5, budget_s=1.0 if tiny else 8.0))  # fmt: skip
