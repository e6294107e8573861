"""What a profiler trace of the running program says: kernels per step (a check on the count from the compiled
program), and on an accelerator the device's own time a step."""

from __future__ import annotations

import glob
import re
import tempfile
from dataclasses import dataclass
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


def _traced_planes(call: Callable[[], Any], calls: int):
    """The planes of a profiler trace of ``calls`` calls of ``call()`` dispatched back to back (compiled outside the
    trace), or None where the profiler wrote no trace."""
    jax.block_until_ready(call())
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
        # a list: ProfileData's planes are an iterator, and both the modules and the ops are read from them
        return list(jax.profiler.ProfileData.from_file(files[0]).planes) if files else None


@dataclass(frozen=True)
class DeviceProfile:
    """What one trace of a call's runs back to back says of the device: its program time a call (None where the trace
    has none), what that was read from (or why nothing was), and where the time went op by op (:func:`ops_seconds`)."""

    seconds: float | None
    source: str
    ops: tuple[dict, ...]


def device_profile(call: Callable[[], Any], calls: int) -> DeviceProfile:
    """``calls`` calls of ``call()`` dispatched back to back in one profiler trace: the device plane's "XLA Modules"
    events (one per program the device ran) summed over the calls, and its "XLA Ops" events op by op."""
    planes = _traced_planes(call, calls)
    if planes is None:
        return DeviceProfile(None, "the profiler wrote no trace", ())
    return DeviceProfile(*modules_seconds(planes, calls), tuple(ops_seconds(planes, calls)))


DEVICE_OPS_LINE = "XLA Ops"  # a TPU device plane's line with one event per instruction run
OP_STATS = ("hlo_category", "tf_op", "long_name")  # what an op's event says of it, where the trace has it


_HLO_TEXT = re.compile(r"%(?P<name>[^ ]+) = .*? (?P<opcode>[a-z][a-z0-9-]*)\(")
_FUSION_KIND = re.compile(r"kind=k(?P<kind>[A-Za-z]+)")


def hlo_op(event_name: str) -> tuple[str, str | None]:
    """An "XLA Ops" event's instruction name and category. The v5e's trace (libtpu 0.0.42) names each event by its
    whole HLO text (``%fusion.3 = bf16[8,128]{...} fusion(...), kind=kLoop, ...``) and gives no category stat: the
    name is the instruction's, the category its opcode (a fusion's with its kind, ``fusion kLoop``). A bare name
    (a trace that carries the category as a stat) is returned as is, with None."""
    m = _HLO_TEXT.match(event_name)
    if m is None:
        return event_name, None
    kind = _FUSION_KIND.search(event_name) if m["opcode"] == "fusion" else None
    return m["name"], m["opcode"] + ("" if kind is None else f" k{kind['kind']}")


def ops_seconds(planes, calls: int) -> list[dict]:
    """Where the device's time a call goes, op by op, in a trace's ``planes`` (ProfileData's) of ``calls`` calls: the
    first accelerator plane's "XLA Ops" events grouped by instruction name, each with its runs and seconds a call and
    the OP_STATS its events carry; the longest first. Empty where the trace has no such line (a CPU's)."""
    for plane in planes:
        if not plane.name.startswith("/device:") or "CPU" in plane.name:
            continue
        lines = {line.name: line for line in plane.lines}
        if DEVICE_OPS_LINE not in lines:
            continue
        ops: dict[str, dict] = {}
        for e in lines[DEVICE_OPS_LINE].events:
            name, category = hlo_op(e.name)
            op = ops.setdefault(
                name, dict(op=name, runs=0, seconds=0.0) | ({} if category is None else dict(hlo_category=category))
            )
            op["runs"] += 1
            op["seconds"] += e.duration_ns * 1e-9
            for k, v in e.stats:
                if k in OP_STATS and k not in op:
                    op[k] = str(v)
        rows = [dict(o, runs=o["runs"] / calls, seconds=o["seconds"] / calls) for o in ops.values()]
        return sorted(rows, key=lambda o: -o["seconds"])
    return []


def modules_seconds(planes, calls: int) -> tuple[float | None, str]:
    """:func:`device_profile`'s program time in a trace's ``planes`` (ProfileData's): the first accelerator plane's
    "XLA Modules" events, their durations summed, over ``calls``."""
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


def op_summary(ops: list[dict], top: int) -> list[dict]:
    """:func:`ops_seconds`'s ops as a short table: each ``hlo_category``'s total (``what`` "category"), then the
    ``top`` longest ops (``what`` "op"); each with its share of every op's time."""
    total = sum(o["seconds"] for o in ops) or 1.0
    categories: dict[str, dict] = {}
    for o in ops:
        c = categories.setdefault(o.get("hlo_category", ""), dict(runs=0.0, seconds=0.0))
        c["runs"] += o["runs"]
        c["seconds"] += o["seconds"]
    rows = [dict(what="category", name=k, hlo_category=k, **v) for k, v in categories.items()]
    rows = sorted(rows, key=lambda r: -r["seconds"]) + [dict(o, what="op", name=o["op"]) for o in ops[:top]]
    return [{k: v for k, v in r.items() if k != "op"} | dict(share=r["seconds"] / total) for r in rows]
