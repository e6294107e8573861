"""The megakernel streaming FP8 blocks (DeepSeek-V3's and Kimi K2's release format: FP8 e4m3 codes, an F32 scale a
128 x 128 block, every matrix but the embedding and head) on a TPU v5e, which has no FP8 arithmetic: each tile widened
in VMEM to bf16 (codes to f32, times its block's scale, picked from its matrix's whole scales by one-hot products).

1. parity (mk.measure.chip_parity, f32 at HIGHEST): tiny-dense and tiny-deepseek-v3 (MLA's latent projections in FP8
   too) in FP8 blocks against the reference on the dequantized weights; tiny-deepseek-v3 in f32 unquantized beside;
2. table (mk.measure.on_chip): llama-3.2-1b, the kernel on FP8 blocks and on bf16 (two cases, one run), each
   interleaved with XLA's compiled reference on bf16 weights (random, seed 0), device time beside the host's,
   medians with 95% intervals; context 1K and 8K at one user, 1K at eight.

Run on 2026-12-06 as ``python data/measured/tpu_logs/2026-12-06-fp8-block.py OUT`` from the repository's root, OUT
holding a copy of data/measured/tpu_hbm.csv (the chip's measured limit); ``tiny`` as the second argument runs the
same on the CPU (tiny-dense, interpret mode) to check the script.
"""

import sys
from pathlib import Path

from mk.measure import tpu_runs
from mk.measure.on_chip import Case, Cell

out, tiny = Path(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == "tiny"
model = "tiny-dense" if tiny else "llama-3.2-1b"
cells = (Cell(64, 1),) if tiny else (Cell(1024, 1), Cell(8192, 1), Cell(1024, 8))
cases = (Case(model, cells=cells, dtype="fp8-block"), Case(model, cells=cells))
parity = [
    ("tiny-dense", "f32", "fp8-block"),
    ("tiny-deepseek-v3", "f32", "fp8-block"),
    ("tiny-deepseek-v3", "f32", "none"),
]
done = tpu_runs.run(parts=("parity", "table"), out_dir=out, deadline_s=60 if tiny else 500, cases=cases,
                    parity_checks=parity[:1] if tiny else parity, require_tpu=not tiny)  # fmt: skip
print(done)
