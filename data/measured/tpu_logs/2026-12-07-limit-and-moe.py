"""2026-12-07, one TPU v5e: the further read-rate probes (mk.measure.hbm.further_probes: 12 GiB reads, four regions
streamed at once, the KV cache in the kernel's own tiles) before the best probe is called the limit, then the table's
Qwen3-30B-A3B case (three layers at full width, both engines interleaved, one and eight users), then llama-3.2-1b's
cells at the current kernel until the deadline. Rows go to data/measured/ through mk's own drivers (no module patched).

    python data/measured/tpu_logs/2026-12-07-limit-and-moe.py OUT_DIR DEADLINE_S
"""

import sys
import time

from mk.measure import hbm, tpu_runs

out, deadline = sys.argv[1], float(sys.argv[2])
start = time.perf_counter()
print(tpu_runs.run(("hbm", "table"), out, deadline, cases=tpu_runs.table_cases("qwen3-30b-a3b"),
                   hbm_probes=hbm.further_probes()))  # fmt: skip
left = deadline - (time.perf_counter() - start)
print(tpu_runs.run(("table",), out, left, cases=tpu_runs.table_cases("llama-3.2-1b")))
