"""2026-12-07 (session 31), one TPU v5e: kernel revision 8's switch mk.plan.Tiles.expert_bias_ahead (each routed
expert's bias rows started as soon as the route lists it, into a ring the expert's first chunk waits for) beside the
default kernel on gpt-oss-20b's first 2 layers, with revision 6's KV read-ahead on top; and revision 6's switch
mk.plan.Tiles.kv_ahead beside the default kernel on the MoE one-user cells it was not timed on (the 26B-A4B chip-of-8
stand-in, setup g; the 26B-A4B sliding+full pair; qwen3-30b-a3b's first 8 layers) and on a dense model
(llama-3.2-1b). Each case's kernels interleaved, 16 steps a call, context 1024, one user, bf16, random weights (seed
0). Rows go to OUT_DIR through mk's own driver (part ``table`` of tpu-measure).

    python data/measured/tpu_logs/2026-12-07-bias-ahead.py OUT_DIR DEADLINE_S PART

PART ``g``: gpt-oss-20b[:2] (three kernels) and the stand-in; ``p``: the pair and qwen3-30b-a3b[:8]; ``d``:
llama-3.2-1b; ``e`` (written after g, p and d found every switch faster at one user, 1K): llama-3.2-1b at eight users
and at 32K, gpt-oss-20b[:2] and qwen3-30b-a3b[:8] at eight users. ``tiny``: tiny-gpt-oss on the CPU (interpret
mode) to check the script.

Run on 2026-12-07: parts g (commit ce4f8ec), p and d (ce4f8ec, one device call), e (f58f72b) and q (9c2bc65), four
device calls, kernel revision 8 (logs: 2026-12-07-bias-ahead-{g,p,d,e,q}.txt). Part e timed llama-3.2-1b's two cells,
then reached the end of its call while gpt-oss-20b[:2]'s eight-user kernels compiled (221 s and 158 s each), so
gpt-oss at eight users was not timed; part q then timed qwen3-30b-a3b[:8] at eight users. Every timed row went to
data/measured/tpu.csv.
"""

import shutil
import sys
from pathlib import Path

from mk.config import LAYER_PAIR
from mk.measure import tpu_runs
from mk.measure.on_chip import Case, Cell
from mk.plan import Tiles

out, deadline, part = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
tiny = part == "tiny"
out.mkdir(parents=True, exist_ok=True)
shutil.copy("data/measured/tpu_hbm.csv", out / "tpu_hbm.csv")  # each row's limit columns at the measured limit
ONE = dict(steps_a_call=(16,), cells=(Cell(1024, 1),), alone="megakernel")
KV = dict(ONE, tiles=(Tiles(), Tiles(kv_ahead=True)))
BIASES = dict(ONE, tiles=(Tiles(), Tiles(expert_bias_ahead=True), Tiles(expert_bias_ahead=True, kv_ahead=True)))
if tiny:
    cases = (Case("tiny-gpt-oss", **(BIASES | dict(cells=(Cell(64, 1),), steps_a_call=(2,)))),)
elif part == "g":
    cases = (Case("gpt-oss-20b", 2, **BIASES), Case("gemma4-26b-a4b", None, setup="workbook", **KV))
elif part == "e":  # the switches at eight users and at a long context
    eight = dict(cells=(Cell(1024, 8),))
    cases = (Case("llama-3.2-1b", None, **(KV | dict(cells=(Cell(1024, 8), Cell(32768, 1))))),
             Case("gpt-oss-20b", 2, **(BIASES | eight)), Case("qwen3-30b-a3b", 8, **(KV | eight)))  # fmt: skip
elif part == "q":  # part e's last case alone (e ran out of its call while gpt-oss's eight-user kernels compiled)
    cases = (Case("qwen3-30b-a3b", 8, **(KV | dict(cells=(Cell(1024, 8),)))),)
elif part == "p":
    cases = (Case("gemma4-26b-a4b", LAYER_PAIR, **KV), Case("qwen3-30b-a3b", 8, **KV))
else:
    cases = (Case("llama-3.2-1b", None, **KV),)
print(tpu_runs.run(("table",), out, deadline, cases=cases, require_tpu=not tiny, steps=2 if tiny else 20,
                   min_rounds=3 if tiny else 5, budget_s=1.0 if tiny else 8.0))  # fmt: skip
