"""2026-12-07, one TPU v5e: the MoE one-user cells (context 1024, one user, bf16, random weights, seed 0), each engine
at one and 16 greedy steps a call, the kernel also with 4 slots a weight buffer (mk.plan.Tiles.slots: a deeper
prefetch, through mk.measure.on_chip.Case.tiles), all interleaved where both engines fit and each engine alone
where they do not. Rows go to data/measured/ through mk's own drivers (no module patched). It ran at commits
c145c92, f57eba5 and e927f8d, when the switch was ``Case.weight_slots=(2, 4)``; it is written here in today's terms
(the same kernels, the same setup labels).

    python data/measured/tpu_logs/2026-12-07-moe-one-user.py OUT_DIR DEADLINE_S PART

PART ``a``: Gemma 4 26B-A4B's sliding+full pair and its first 7 layers (each engine alone), 5 steps back to back for
the device's time (its time ran out before the 7 layers' reference and Qwen3-30B-A3B's first 8); ``b``: Qwen3-30B-A3B's
first 8 layers (each engine alone), chip 0 of the workbook's v5e-8 step (the stand-in); ``c``: the 7 layers'
reference, gpt-oss-20b's first 2 layers, the stand-in at 2 and 4 slots a weight buffer (16 steps a call), Mixtral
8x7B's first 2 layers; b and c with 20 steps back to back, as the table's rows
before them. ``tiny``: tiny-moe on the CPU (interpret mode) to check the script.

Run on 2026-12-07 as parts a, b and c, one device call each (logs: 2026-12-07-moe-one-user-{a,b,c}.txt). Every row they
wrote is in 2026-12-07-moe-one-user.csv (column ``part``); the runs' output folders held no HBM rows, so each row's
limit columns were filled afterwards by mk.measure.on_chip.limit_columns at data/measured/tpu_hbm.csv's measured limit
(753.3 GB/s). data/measured/tpu.csv took every row but the 4-slot variants (their setup is not one the table's
analysis knows; they stay in the log) and part a's one-step rows (5 steps back to back, where the table's one-step
cells are timed 20: the first step's dispatch is spread over 5 and they read 0.2 ms slower than the table's 20; they
too stay in the log). tpu_ops.csv took the profiles of the rows tpu.csv took.
"""

import sys

from mk.config import LAYER_PAIR
from mk.measure import tpu_runs
from mk.measure.on_chip import Case, Cell
from mk.plan import Tiles

ONE = (Cell(1024, 1),)
BOTH = dict(cells=ONE, steps_a_call=(1, 16), tiles=(Tiles(), Tiles(slots=4)))
ONE_DEPTH = dict(cells=ONE, steps_a_call=(1, 16))  # part a found 4 slots no faster: b and c time the default alone
PARTS = {
    "a": (
        Case("gemma4-26b-a4b", LAYER_PAIR, **BOTH),
        Case("gemma4-26b-a4b", 7, alone="megakernel", **BOTH),
        Case("gemma4-26b-a4b", 7, alone="reference", **BOTH),
        Case("qwen3-30b-a3b", 8, alone="megakernel", **BOTH),
        Case("qwen3-30b-a3b", 8, alone="reference", **BOTH),
    ),
    "b": (
        Case("qwen3-30b-a3b", 8, alone="megakernel", **ONE_DEPTH),
        Case("qwen3-30b-a3b", 8, alone="reference", **ONE_DEPTH),
        Case("gemma4-26b-a4b", None, setup="workbook", **ONE_DEPTH),
    ),
    "c": (
        Case("gemma4-26b-a4b", 7, alone="reference", **ONE_DEPTH),
        Case("gpt-oss-20b", 2, **ONE_DEPTH),
        # the stand-in's expert tiles are small (88 rows a chip): does a deeper prefetch keep its stream fed?
        Case("gemma4-26b-a4b", None, setup="workbook", cells=ONE, steps_a_call=(16,), tiles=(Tiles(), Tiles(slots=4))),
        Case("mixtral-8x7b", 2, **ONE_DEPTH),
    ),
    "tiny": (Case("tiny-moe", cells=(Cell(64, 1),), steps_a_call=(1, 2), tiles=(Tiles(), Tiles(slots=3))),),
}

out, deadline, part = sys.argv[1], float(sys.argv[2]), sys.argv[3]
tiny = part == "tiny"
back_to_back = 2 if tiny else (5 if part == "a" else 20)
print(tpu_runs.run(("table",), out, deadline, cases=PARTS[part], require_tpu=not tiny, steps=back_to_back,
                   min_rounds=3 if tiny else 5, budget_s=1.0 if tiny else 8.0))  # fmt: skip
