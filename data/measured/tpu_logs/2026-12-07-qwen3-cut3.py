"""2026-12-07 (session 29), one TPU v5e: Qwen3-30B-A3B's first 3 layers at one user, 1K, bf16, random weights (seed
0), both engines interleaved at one and 16 steps a call (20 back to back), with kernel revision 5: the cell's newest
one-user rows were revision 4's (its head then read in 0.5 MiB tiles). Rows go to OUT_DIR through mk's own drivers.

    python data/measured/tpu_logs/2026-12-07-qwen3-cut3.py OUT_DIR DEADLINE_S [tiny]

``tiny``: tiny-moe on the CPU (interpret mode) to check the script.

Run on 2026-12-07 at commit a3dfe07 in one device call (log: 2026-12-07-qwen3-cut3.txt; rows also in
2026-12-07-qwen3-cut3.csv); every row went to data/measured/tpu.csv and the profiles to tpu_ops.csv.
"""

import shutil
import sys
from pathlib import Path

from mk.measure import tpu_runs
from mk.measure.on_chip import Case, Cell

out, deadline = Path(sys.argv[1]), float(sys.argv[2])
tiny = sys.argv[3:] == ["tiny"]
out.mkdir(parents=True, exist_ok=True)
shutil.copy("data/measured/tpu_hbm.csv", out / "tpu_hbm.csv")  # each row's limit columns at the measured limit
if tiny:
    cases = (Case("tiny-moe", cells=(Cell(64, 1),), steps_a_call=(1, 2)),)
else:
    cases = (Case("qwen3-30b-a3b", 3, cells=(Cell(1024, 1),), steps_a_call=(1, 16)),)
print(tpu_runs.run(("table",), out, deadline, cases=cases, require_tpu=not tiny, steps=2 if tiny else 20,
                   min_rounds=3 if tiny else 5, budget_s=1.0 if tiny else 8.0))  # fmt: skip
