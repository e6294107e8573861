"""Which knock-out of the 26B-A4B chip-of-8 stand-in halts the core on the chip (each in its own process, so one
halt cannot poison the next): the workbook's kernel, loopback, context 1024, one user; the first N layers."""
import subprocess, sys, time

ONE = r'''
import sys, time, jax
from mk.measure.on_chip import Case, CaseEngines, Cell
layers, ko = int(sys.argv[1]), sys.argv[2]
case = Case("gemma4-26b-a4b", layers, setup="workbook", cells=(Cell(1024, 1),))
e = CaseEngines(case, jax.devices()[0], 0, lambda m: None)
e.build("megakernel")
t = time.perf_counter()
call, s = e.call("megakernel", Cell(1024, 1), frozenset() if ko == "whole" else frozenset({ko}))
print(f"OK layers={layers} {ko}: compiled and ran in {s:.1f} s", flush=True)
'''
ALL = ["whole", "sliding_attention", "full_attention", "shared_mlp", "experts", "router", "norms", "head"]
n, kos = sys.argv[1], sys.argv[2:] or ALL  # layers, knock-outs
if True:
    for ko in kos:
        t = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-c", ONE, n, ko], capture_output=True, text=True, timeout=150)
            tail = (p.stdout + p.stderr).strip().splitlines()
            ok = [l for l in tail if l.startswith("OK")]
            why = [l for l in tail if "halted" in l or "nonzero" in l or "Error" in l][:2]
            print(f"[{time.perf_counter() - t:6.1f} s] layers={n} {ko}: rc={p.returncode} {ok or why}", flush=True)
        except subprocess.TimeoutExpired:
            print(f"[{time.perf_counter() - t:6.1f} s] layers={n} {ko}: timeout", flush=True)
