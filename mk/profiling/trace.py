"""What a profiler trace of the running program says: kernels per step (a check on the count from the compiled
program), and on an accelerator the device's own time a step."""

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


DEVICE_MODULES_LINE = "XLA Modules"  # a TPU device plane's line with one event per program run


def device_seconds_per_call(call: Callable[[], Any], calls: int) -> tuple[float | None, str]:
    """The device's time a call of ``call()`` by its profiler: ``calls`` calls dispatched back to back in a trace, the
    events of the device plane's "XLA Modules" line (one per program the device ran) summed over the calls. Returns
    (seconds or None, what was read: the plane and line, or why nothing was: the lines a trace had instead)."""
    jax.block_until_ready(call())  # compile outside the trace
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        try:
            out = None
            for _ in range(calls):
                out = call()
            jax.block_until_ready(out)
        finally:
            jax.profiler.stop_trace()
        files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        if not files:
            return None, "the profiler wrote no trace"
        return modules_seconds(jax.profiler.ProfileData.from_file(files[0]).planes, calls)


def modules_seconds(planes, calls: int) -> tuple[float | None, str]:
    """:func:`device_seconds_per_call`'s reading of a trace's ``planes`` (ProfileData's): the first accelerator
    plane's "XLA Modules" events, their durations summed, over ``calls``."""
    seen = []
    for plane in planes:
        if not plane.name.startswith("/device:") or "CPU" in plane.name:
            continue
        lines = {line.name: line for line in plane.lines}
        seen.append(f"{plane.name}: {', '.join(lines) or 'no lines'}")
        if DEVICE_MODULES_LINE in lines:
            events = list(lines[DEVICE_MODULES_LINE].events)
            if events:
                total = sum(e.duration_ns for e in events) * 1e-9
                return total / calls, f"profiler: {plane.name} {DEVICE_MODULES_LINE}, {len(events)} programs"
    return None, "no device plane with XLA modules (" + ("; ".join(seen) or "no device planes") + ")"
