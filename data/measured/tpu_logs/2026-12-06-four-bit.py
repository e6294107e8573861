"""The megakernel streaming the 4-bit formats on a TPU v5e, now that libtpu compiles them (their codes two a byte by
chunks in the kernel's HBM, a chunk's halves in the low and high nibbles): INT4 groups of 32 with a BF16 scale (Kimi
K2 Thinking's release) and MXFP4 (gpt-oss's), each tile widened to bf16 in VMEM.

1. parity (mk.measure.chip_parity, f32 at HIGHEST): tiny-moe with INT4 experts and with MXFP4 experts against the
   reference on the dequantized weights;
2. table (mk.measure.on_chip): gpt-oss-20b's first two layers (a sliding and a full one) at full width, the kernel
   on MXFP4 experts and on bf16 (two cases, one run), each interleaved with XLA's compiled reference on bf16 weights
   (random, seed 0), device time beside the host's, medians with 95% intervals; context 1K, one user and eight.

Run on 2026-12-06 as ``python data/measured/tpu_logs/2026-12-06-four-bit.py OUT`` from the repository's root, OUT
holding a copy of data/measured/tpu_hbm.csv; ``tiny`` as the second argument runs the same on the CPU (tiny-moe,
interpret mode) to check the script. The first run on the chip ran its host out of memory (40 GiB) quantizing
gpt-oss-20b's experts to MXFP4 on the host; ``parity`` as the second argument runs the parity part alone.
"""

import sys
from pathlib import Path

from mk.measure import tpu_runs
from mk.measure.on_chip import Case, Cell

out, mode = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "all"
tiny = mode == "tiny"
model, layers = ("tiny-moe", None) if tiny else ("gpt-oss-20b", 2)
cells = (Cell(64, 1),) if tiny else (Cell(1024, 1), Cell(1024, 8))
cases = (Case(model, layers, cells=cells, dtype="mxfp4"), Case(model, layers, cells=cells))
parity = [("tiny-moe", "f32", "int4"), ("tiny-moe", "f32", "mxfp4")]
parts = ("parity",) if mode == "parity" else ("parity", "table")
done = tpu_runs.run(parts=parts, out_dir=out, deadline_s=60 if tiny else 480, cases=cases,
                    parity_checks=parity[:1] if tiny else parity, require_tpu=not tiny)  # fmt: skip
print(done)
