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
the script ran a second time (2026-12-06-four-bit-timed-2.*), its cases in the order MXFP4, bf16, INT4.

Run on 2026-12-06 as ``python data/measured/tpu_logs/2026-12-06-four-bit-timed.py OUT`` from the repository's root,
OUT holding a copy of data/measured/tpu_hbm.csv; ``tiny`` as the second argument runs the same on the CPU (tiny-moe,
interpret mode) to check the script.
"""

import sys
from pathlib import Path

from mk.measure import tpu_runs
from mk.measure.on_chip import Case, Cell

out, tiny = Path(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == "tiny"
model, layers = ("tiny-moe", None) if tiny else ("gpt-oss-20b", 2)
cells = (Cell(64, 1),) if tiny else (Cell(1024, 1), Cell(1024, 8))
cases = tuple(Case(model, layers, cells=cells, dtype=d, random_codes=True) for d in ("mxfp4", "bf16", "int4"))
done = tpu_runs.run(parts=("table",), out_dir=out, deadline_s=120 if tiny else 540, cases=cases,
                    require_tpu=not tiny)  # fmt: skip
print(done)
