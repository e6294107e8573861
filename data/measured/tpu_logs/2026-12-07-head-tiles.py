"""2026-12-07 (session 28), one TPU v5e: kernel revision 5's head (mk.plan.builder.head_spans: the widest tiles under
the budget, a narrower last one, where equal tiles would be small) timed interleaved with revision 4's (equal tiles at
any size: mk.plan.Tiles(head_equal_share=0), the same program as revision 4 built) on the models whose vocabulary lane
count is prime (Qwen3's 151,936 rows, gpt-oss's 201,088), context 1024, bf16, random weights (seed 0), 20 steps back
to back; both engines where both fit, each alone where not. Rows go to OUT_DIR through mk's own drivers.

    python data/measured/tpu_logs/2026-12-07-head-tiles.py OUT_DIR DEADLINE_S [tiny]

``tiny``: a tiny dense model with a vocabulary of 11 lanes on the CPU (interpret mode), to check the script.

Run on 2026-12-07 at commit 7bb3179 (kernel revision 5; log: 2026-12-07-head-tiles.txt): its time ran out before
Qwen3-8B's eight users and the last case, Qwen3-30B-A3B's first 3 layers at eight users, which ran right after in a
call of its own with the same drivers (log: 2026-12-07-head-tiles-eight-users.txt). Every row is in
2026-12-07-head-tiles.csv (column ``part``); data/measured/tpu.csv took the default kernel's and the reference's rows
(the variant with revision 4's head stays in the log), with limit columns filled at data/measured/tpu_hbm.csv's
measured limit by mk.measure.on_chip.limit_columns, and tpu_ops.csv their profiles. 2026-12-07-head-tiles-r4-r5.csv
holds the 16-step rows again as a revision run (mk.analysis.chip_checks.REVISION_RUNS): the variant with revision 4's
head named ``megakernel[r4]``, checked to have the program digest revision 4's own 16-step rows in tpu.csv have, the
default ``megakernel[r5]``, XLA's ``reference``; setup "one chip".
"""

import sys

from mk.config import TINY_DENSE
from mk.measure import tpu_runs
from mk.measure.on_chip import Case, Cell
from mk.plan import Tiles

out, deadline = sys.argv[1], float(sys.argv[2])
tiny = sys.argv[3:] == ["tiny"]
BOTH = (Tiles(), Tiles(head_equal_share=0))  # revision 5's head beside revision 4's
ONE = (Cell(1024, 1),)
if tiny:
    cfg = TINY_DENSE.replace(name="tiny-dense-v1408", vocab_size=11 * 128)
    cases = (Case(cfg, cells=(Cell(64, 1),), steps_a_call=(1, 2),
                  tiles=(Tiles(head_tile_bytes=5 * 128 * 128 * 2), Tiles(head_tile_bytes=5 * 128 * 128 * 2,
                                                                        head_equal_share=0))),)  # fmt: skip
else:
    cases = (
        Case("qwen3-30b-a3b", 8, alone="megakernel", cells=ONE, steps_a_call=(1, 16), tiles=BOTH),
        Case("gpt-oss-20b", 2, cells=ONE, steps_a_call=(1, 16), tiles=BOTH),
        Case("qwen3-8b", 8, cells=(Cell(1024, 1), Cell(1024, 8)), tiles=BOTH),
        Case("qwen3-30b-a3b", 3, cells=(Cell(1024, 8),), steps_a_call=(1, 16)),  # eight users at 16 steps a call
    )
print(tpu_runs.run(("table",), out, deadline, cases=cases, require_tpu=not tiny, steps=2 if tiny else 20,
                   min_rounds=3 if tiny else 5, budget_s=1.0 if tiny else 8.0))  # fmt: skip
