"""The megakernel on the 4-bit formats on a TPU v5e, timed: gpt-oss-20b's first two layers (a sliding and a full
one) at full width, the kernel on MXFP4 experts (gpt-oss's release), on INT4 experts (Kimi K2 Thinking's) and on bf16
(three cases, one run), each interleaved with XLA's compiled reference on bf16 weights (random, seed 0), device time
beside the host's, medians with 95% intervals; context 1K, one user and eight (mk.measure.on_chip).

The formats' codes are drawn at random (mk.format_trees.random_codes: every 4-bit code equally likely, one scale a
matrix giving the float weights' RMS) rather than encoded from the drawn floats on the host, which ran a call's ten
minutes out on gpt-oss-20b's experts (tpu_logs/2026-12-06-four-bit-timed-out.txt); a step's cost does not depend on
the values. Parity on these formats is in tpu_parity.csv (tpu_logs/2026-12-06-four-bit.*).

Its one run on the v5e (at df92d25; log: 2026-12-06-four-bit-timed.txt) timed nothing: Mosaic refused the 4-bit
steps (a narrower last tile's 42 rows of scales sliced from a 48-row buffer, fixed at 9af9873 and compiled here ahead of
time since), and the bf16 case ran out of HBM beside the failed cases' weights, which JAX's caches held (released
between cases since). Compiled here ahead of time with the fix, gpt-oss-20b's two layers in MXFP4 did not finish
compiling in 15 minutes (4-bit tiles of 4.5 M weights widened in straight-line vector code); widened a block at a
time in a loop since (mk.megakernel.format_tiles.WIDEN_BLOCK), they compile here in 65 s (MXFP4) and 51 s (INT4), and
the script ran a second time (at b734e2f; 2026-12-06-four-bit-timed-2.csv and -ops.csv), its cases in the order
MXFP4, bf16, INT4: the call's ten minutes ran out after MXFP4 at one user (its log lost with the call). ``rest`` as
the second argument runs the other two cases at one user only, to fit a call (2026-12-06-four-bit-timed-3.*).

Run on 2026-12-06 as ``python data/measured/tpu_logs/2026-12-06-four-bit-timed.py OUT`` from the repository's root,
OUT holding a copy of data/measured/tpu_hbm.csv; ``tiny`` as the second argument runs the same on the CPU (tiny-moe,
interpret mode) to check the script.
"""

import sys
from pathlib import Path

from mk.measure import tpu_runs
from mk.measure.on_chip import Case, Cell

out, mode = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "all"
tiny, rest = mode == "tiny", mode == "rest"
model, layers = ("tiny-moe", None) if tiny else ("gpt-oss-20b", 2)
cells = (Cell(64, 1),) if tiny else (Cell(1024, 1),) if rest else (Cell(1024, 1), Cell(1024, 8))
dtypes = ("bf16", "int4") if rest else ("mxfp4", "bf16", "int4")
cases = tuple(Case(model, layers, cells=cells, dtype=d, random_codes=True) for d in dtypes)
done = tpu_runs.run(parts=("table",), out_dir=out, deadline_s=120 if tiny else 400 if rest else 540, cases=cases,
                    require_tpu=not tiny)  # fmt: skip
print(done)
