"""2026-12-07 (session 29), one TPU v5e: Gemma 4 26B-A4B's sliding+full pair at long contexts again (8K, 32K and 128K
at one user, 32K at eight), both engines interleaved, one step a call, 20 steps back to back, bf16, random weights
(seed 0), with kernel revision 5: its cells were last timed with revision 2 (issue 71: long contexts measured again,
no cell slower than its last row). Rows go to OUT_DIR through mk's own drivers.

    python data/measured/tpu_logs/2026-12-07-long-context.py OUT_DIR DEADLINE_S [tiny]

``tiny``: tiny-moe on the CPU (interpret mode) to check the script.

Run on 2026-12-07 at commit 3600314 in one device call (log: 2026-12-07-long-context.txt; rows also in
2026-12-07-long-context.csv). Every row went to data/measured/tpu.csv and its profiles to tpu_ops.csv. Against the
same cells' bf16 rows of revision 2 (2026-12-04 13:12), the kernel's step moved +0.16% (8K), +0.11% (32K), +0.21%
(128K) and XLA's +0.14%, -0.01%, +0.24%: both engines alike, the chip's own drift, no cell slower for the kernel.
"""

import shutil
import sys
from pathlib import Path

from mk.config import LAYER_PAIR
from mk.measure import tpu_runs
from mk.measure.on_chip import Case, Cell

out, deadline = Path(sys.argv[1]), float(sys.argv[2])
tiny = sys.argv[3:] == ["tiny"]
out.mkdir(parents=True, exist_ok=True)
shutil.copy("data/measured/tpu_hbm.csv", out / "tpu_hbm.csv")  # each row's limit columns at the measured limit
if tiny:
    cases = (Case("tiny-moe", cells=(Cell(256, 1), Cell(512, 2))),)
else:
    cells = (Cell(8192, 1), Cell(32768, 1), Cell(131072, 1), Cell(32768, 8))
    cases = (Case("gemma4-26b-a4b", LAYER_PAIR, cells=cells),)
print(tpu_runs.run(("table",), out, deadline, cases=cases, require_tpu=not tiny, steps=2 if tiny else 20,
                   min_rounds=3 if tiny else 5, budget_s=1.0 if tiny else 8.0))  # fmt: skip
