"""2026-12-07 (session 30), one TPU v5e: each MoE one-user cell's kernel beside its copies alone
(mk.measure.copies_alone: every weight tile and KV tile the step moves, started and waited where the kernel does, no
compute), interleaved on the same packed weights, 16 steps a call, context 1024, one user, bf16, random weights
(seed 0); a dense model's for the contrast. Gemma 4 26B-A4B's first 7 layers also at 4 slots a weight buffer, kernel
and copies. Rows go to OUT_DIR through mk's own driver (part ``copies`` of tpu-measure).

    python data/measured/tpu_logs/2026-12-07-copies-alone.py OUT_DIR DEADLINE_S PART

PART ``a``: 26B-A4B[:7] (2 and 4 slots), gpt-oss-20b[:2], the 26B-A4B chip-of-8 stand-in (setup g); ``b``:
qwen3-30b-a3b[:8], the 26B-A4B sliding+full pair, llama-3.2-1b; ``k`` (written after ``a`` found every cell's copies
alone at the limit and the kernel 77-151 us a step above them): 26B-A4B[:7] whole and with its sliding attention,
experts, shared MLP, head and the route's wait (router with it) off in turn, kernel and copies alike, 10 calls back
to back. ``tiny``: tiny-moe on the CPU (interpret mode) to check the script.

Run on 2026-12-07: part a at commit fc984d4, part k at 3a21391, one device call each (logs:
2026-12-07-copies-alone-{a,k}.txt). Every row went to data/measured/tpu_copies.csv; part a's wrote no ``knockout``
column (added after it ran: blank, the whole step), and a knocked-out step's fraction of the limit, of the whole step's
bytes, was blanked there. Part b did not run (the session's device time went to 2026-12-07-kv-ahead).
"""

import shutil
import sys
import time
from pathlib import Path

from mk.chips import measured_limit
from mk.measure import copies_alone, tpu_runs
from mk.measure.on_chip import Case, Cell
from mk.plan import Tiles

out, deadline, part = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
tiny = part == "tiny"
out.mkdir(parents=True, exist_ok=True)
shutil.copy("data/measured/tpu_hbm.csv", out / "tpu_hbm.csv")  # each row's limit columns at the measured limit
cases = tpu_runs.COPIES_CASES
if tiny:
    cases = (Case("tiny-moe", cells=(Cell(64, 1),), steps_a_call=(2,), tiles=(Tiles(), Tiles(slots=4))),)
elif part == "a":
    first = cases[0]
    cases = (Case(first.model, first.layers, alone="megakernel", cells=first.cells, steps_a_call=first.steps_a_call,
                  tiles=(Tiles(), Tiles(slots=4))), *cases[1:3])  # fmt: skip
elif part == "k":
    limit = measured_limit("tpu-v5e", out / "tpu_hbm.csv")
    components = ("sliding_attention", "experts", "shared_mlp", "head", "route_wait")
    ends = time.perf_counter() + deadline
    rows, notes = copies_alone.measure(cases[:1], out / "tpu_copies.csv", limit, deadline=ends, steps_back_to_back=10,
                                       knockouts=components)  # fmt: skip
    print(len(rows), notes)
    sys.exit(0)
else:
    cases = cases[3:]
print(tpu_runs.run(("copies",), out, deadline, copies_cases=cases, require_tpu=not tiny, steps=2 if tiny else 20,
                   min_rounds=3 if tiny else 5, budget_s=1.0 if tiny else 8.0))  # fmt: skip
