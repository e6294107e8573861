"""Kernels per step counted in a profiler trace of the running program (a check on the count from the
compiled program)."""

from __future__ import annotations

import glob
import tempfile
from typing import Any, Callable

import jax


def trace_kernels(call: Callable[[], Any], calls: int, kernel_names: frozenset[str]) -> float | None:
    """Kernel executions per call of ``call()``, counted in a profiler trace of ``calls`` calls.

    On the CPU, XLA's runtime records one trace event per executed instruction, named after it;
    events whose name is in ``kernel_names`` (from ``count_kernels(...).names``) are counted. On a
    GPU, the device planes record one event per launched kernel on their stream lines. Returns
    None where the trace holds neither (a backend whose profiler records no per-kernel events).
    """
    jax.block_until_ready(call())  # compile outside the trace
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        try:
            for _ in range(calls):
                jax.block_until_ready(call())
        finally:
            jax.profiler.stop_trace()
        files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        if not files:
            return None
        data = jax.profiler.ProfileData.from_file(files[0])
        device, host = 0, 0
        for plane in data.planes:
            if plane.name.startswith("/device:") and "GPU" in plane.name:
                device += sum(len(list(l.events)) for l in plane.lines if l.name.startswith("Stream"))
            elif plane.name == "/host:CPU":
                host += sum(e.name in kernel_names for l in plane.lines if l.name != "python" for e in l.events)
    count = device or host
    return count / calls if count else None
