"""2026-12-07 (session 29), one TPU v5e: what a copy costs on its own and what a tile's size costs the stream (parts
``dma`` and ``hbm`` with mk.measure.hbm.tile_size_probes at 2, 4 and 8 copies in flight), then the MoE one-user cells
that miss their target with the weight stream held to a window (mk.plan.Tiles.lookahead_bytes: no load starts before
the loads ahead of it come within that many bytes) and with 4 slots a buffer, beside the default kernel, interleaved,
16 steps a call, context 1024, one user, bf16, random weights (seed 0). Rows go to OUT_DIR through mk's own drivers.

    python data/measured/tpu_logs/2026-12-07-stream-window.py OUT_DIR DEADLINE_S PART

PART ``m``: the copy and tile-size probes, then the 26B-A4B chip-of-8 stand-in (setup g) in the four kernels; ``s``
(written after ``m`` found the windows slower and 4 slots faster on the stand-in): Gemma 4 26B-A4B's first 7 layers at
2, 3 and 4 slots a weight buffer, gpt-oss-20b's first 2 layers at 2 and 4 (the kernel alone in both).
``tiny``: tiny-moe on the CPU (interpret mode) to check the script.

Run on 2026-12-07: part m at commit fea6f51, part s at 957a78c, one device call each (logs:
2026-12-07-stream-window-{m,s}.txt; every table row in 2026-12-07-stream-window.csv, column ``part``). tpu_dma.csv took
the copy rows, tpu_hbm.csv the nine tile-size probes, tpu.csv the default kernel's rows (the variants stay in the log:
no analysis reads their setups). The out folder held a copy of data/measured/tpu_hbm.csv, so each row's limit columns
are at its measured limit.
"""

import shutil
import sys
from pathlib import Path

from mk.measure import hbm, tpu_runs
from mk.measure.on_chip import Case, Cell
from mk.plan import Tiles
from mk.units import MIB

out, deadline, part = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
tiny = part == "tiny"
out.mkdir(parents=True, exist_ok=True)
shutil.copy("data/measured/tpu_hbm.csv", out / "tpu_hbm.csv")  # each row's limit columns at the measured limit
SIXTEEN = dict(cells=(Cell(1024, 1),), steps_a_call=(16,))
VARIANTS = (Tiles(), Tiles(lookahead_bytes=8 * MIB), Tiles(lookahead_bytes=24 * MIB), Tiles(slots=4))
if tiny:
    parts = ("dma", "hbm", "table")
    probes = hbm.tile_size_probes(nbytes=MIB, chunks=(2**16,), depths=(2,))
    cases = (Case("tiny-moe", cells=(Cell(64, 1),), steps_a_call=(2,),
                  tiles=(Tiles(), Tiles(lookahead_bytes=MIB // 64))),)  # fmt: skip
elif part == "m":
    parts, probes = ("dma", "hbm", "table"), hbm.tile_size_probes(nbytes=4 * 2**30, depths=(2, 4, 8))
    cases = (Case("gemma4-26b-a4b", None, setup="workbook", tiles=VARIANTS, **SIXTEEN),)
else:
    parts, probes = ("table",), None
    cases = (
        Case("gemma4-26b-a4b", 7, alone="megakernel", tiles=(Tiles(), Tiles(slots=3), Tiles(slots=4)), **SIXTEEN),
        Case("gpt-oss-20b", 2, alone="megakernel", tiles=(Tiles(), Tiles(slots=4)), **SIXTEEN),
    )
print(tpu_runs.run(parts, out, deadline, cases=cases, hbm_probes=probes, require_tpu=not tiny,
                   steps=2 if tiny else 20, min_rounds=3 if tiny else 5, budget_s=1.0 if tiny else 8.0,
                   probe_budget_s=1.0 if tiny else 3.0))  # fmt: skip
