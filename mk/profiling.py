"""Measuring a decode step: a step timer, kernels per step, component knock-outs and a memory
bandwidth probe, so a step time can be set against this device's own measured limit.

What counts as a kernel. XLA compiles a jitted step into one program; its optimised HLO has an
entry computation whose top-level instructions are what the runtime launches one after another:
fusions (XLA's own generated kernels), custom calls (library or Pallas kernels), collectives, and
other unfused ops (on the CPU, ``dot`` and ``copy`` run as their own library calls). Parameters,
constants, tuples, ``get-tuple-element`` and bitcasts launch nothing. A ``while`` loop launches its
body's kernels once per iteration (XLA records the trip count in the loop's backend config) and a
``conditional`` one branch (the largest is counted). Run op by op (no ``jit``), every primitive of
the traced program is dispatched as its own small program: ``count_eager_ops`` counts those.
"""

from __future__ import annotations

import glob
import os
import re
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

# Timing ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of ``runs`` calls, each waited on until its results were ready."""

    times_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def iqr_s(self) -> float:
        """Interquartile range (75th minus 25th percentile): the spread, robust to one slow run."""
        q75, q25 = np.percentile(self.times_s, [75, 25])
        return float(q75 - q25)

    @property
    def spread(self) -> float:
        """The interquartile range as a fraction of the median."""
        return self.iqr_s / self.median_s

    def to_dict(self) -> dict:
        return {"median_s": self.median_s, "min_s": self.min_s, "iqr_s": self.iqr_s, "spread": self.spread,
                "runs": len(self.times_s)}


def time_call(call: Callable[[], Any], warmup: int = 2, runs: int = 10) -> Timing:
    """Time ``call()`` ``runs`` times after ``warmup`` untimed calls (compilation, caches).

    Each call is waited on with ``jax.block_until_ready`` so the time covers the device work, not
    just the dispatch. A call that must thread state (a donated KV cache) does so in its closure.
    """
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a positive integer, got {runs!r}")
    for _ in range(warmup):
        jax.block_until_ready(call())
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - t0)
    return Timing(tuple(times))


# Kernels per step from the compiled program ---------------------------------------------------------

FUSION = "fusion"
CUSTOM_CALL = "custom-call"
COLLECTIVE = "collective"
OTHER = "other"
KERNEL_KINDS = (FUSION, CUSTOM_CALL, COLLECTIVE, OTHER)
_COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                "collective-broadcast", "ragged-all-to-all"}
# Instructions that launch no work: values that already exist, views and bookkeeping.
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id",
         "replica-id", "add-dependency", "opt-barrier", "domain"}
_CONTROL = {"while", "conditional", "call"}

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMP_HEAD = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")


@dataclass(frozen=True)
class _Instr:
    name: str
    opcode: str
    rest: str


def _split_type(s: str) -> str:
    """Drop the leading result type (which may be a parenthesised tuple) and return the remainder."""
    if s.startswith("("):
        depth = 0
        for i, ch in enumerate(s):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return s[i + 1:].lstrip()
    return s.split(" ", 1)[1] if " " in s else ""


def parse_hlo(text: str) -> tuple[dict[str, list[_Instr]], str]:
    """The computations of an HLO module as ``{name: [instructions]}``, and the entry's name."""
    comps: dict[str, list[_Instr]] = {}
    entry, current = None, None
    for line in text.splitlines():
        if current is None:
            m = _COMP_HEAD.match(line)
            if m and not line.startswith(("HloModule", " ")):
                current = m.group(2)
                comps[current] = []
                if m.group(1):
                    entry = current
            continue
        if line.startswith("}"):
            current = None
            continue
        m = _INSTR.match(line)
        if m:
            rest = _split_type(m.group(2))
            opcode = rest.split("(", 1)[0].strip()
            comps[current].append(_Instr(m.group(1), opcode, rest))
    if entry is None:
        raise ValueError("no ENTRY computation in this text: pass the optimised HLO of a compiled program "
                         "(jax.jit(f).lower(*args).compile().as_text())")
    return comps, entry


def _kind(opcode: str) -> str | None:
    """The kernel kind of an opcode, or None for an instruction that launches nothing itself."""
    base = opcode.removesuffix("-start")
    if opcode in _FREE or opcode.endswith("-done") or opcode in _CONTROL:
        return None
    if opcode == "fusion":
        return FUSION
    if opcode == "custom-call":
        return CUSTOM_CALL
    if base in _COLLECTIVES:
        return COLLECTIVE
    return OTHER


def _callee(rest: str, attr: str) -> list[str]:
    """The computations an attribute names: ``body=%b`` or ``branch_computations={%a, %b}``."""
    m = re.search(r"\b" + attr + r"=(\{[^}]*\}|[^,\s]+)", rest)
    return [c.strip().lstrip("%") for c in m.group(1).strip("{}").split(",")] if m else []


@dataclass(frozen=True)
class KernelCount:
    """Kernels one execution of a compiled program launches, by kind and by opcode."""

    by_kind: dict[str, float]
    by_opcode: dict[str, float]
    unknown_trip_loops: int = 0  # while loops without a known trip count (their body counted once)
    names: frozenset[str] = field(default_factory=frozenset)  # instruction names that are kernels

    @property
    def total(self) -> float:
        return sum(self.by_kind.values())

    def to_dict(self) -> dict:
        return {"total": self.total, **self.by_kind, "unknown_trip_loops": self.unknown_trip_loops}


def count_kernels(hlo_text: str) -> KernelCount:
    """Count the kernels one run of an optimised HLO module launches (see the module docstring)."""
    comps, entry = parse_hlo(hlo_text)
    kinds: Counter = Counter()
    ops: Counter = Counter()
    names: set[str] = set()
    unknown = 0

    def walk(comp: str, times: float) -> None:
        nonlocal unknown
        for ins in comps[comp]:
            if ins.opcode == "while":
                m = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', ins.rest)
                if m is None and times:
                    unknown += 1
                for body in _callee(ins.rest, "body"):
                    walk(body, times * (int(m.group(1)) if m else 1))
            elif ins.opcode == "conditional":
                branches = _callee(ins.rest, "branch_computations") or (
                    _callee(ins.rest, "true_computation") + _callee(ins.rest, "false_computation"))
                largest = max(branches, key=lambda b: _flat_size(comps, b), default=None)
                for b in branches:  # every branch's kernels are named (a trace shows whichever ran)
                    walk(b, times if b == largest else 0)
            elif ins.opcode == "call":
                for c in _callee(ins.rest, "to_apply"):
                    walk(c, times)
            else:
                kind = _kind(ins.opcode)
                if kind is not None:
                    kinds[kind] += times
                    ops[ins.opcode] += times
                    names.add(ins.name)

    walk(entry, 1)
    return KernelCount({k: float(kinds.get(k, 0)) for k in KERNEL_KINDS},
                       {k: float(v) for k, v in ops.items() if v}, unknown, frozenset(names))


def _flat_size(comps: dict, comp: str) -> int:
    return sum(_kind(i.opcode) is not None for i in comps[comp])


def compile_text(fn: Callable, *args, **kwargs) -> str:
    """The optimised HLO of ``fn`` (jitted here if it is not already) for these arguments."""
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    return jitted.lower(*args, **kwargs).compile().as_text()


def compiled_kernels(fn: Callable, *args, **kwargs) -> KernelCount:
    """Kernels per call of the compiled ``fn`` on these arguments."""
    return count_kernels(compile_text(fn, *args, **kwargs))


# Kernels per step from a profiler trace ----------------------------------------------------------------


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


# Op-by-op dispatch --------------------------------------------------------------------------------------


def _sub_jaxprs(eqn) -> list:
    out = []
    for v in eqn.params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            j = getattr(x, "jaxpr", x)
            if hasattr(j, "eqns"):
                out.append(j)
    return out


def _count_eqns(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        subs = _sub_jaxprs(eqn)
        if not subs:
            n += 1
        elif eqn.primitive.name == "scan":
            n += eqn.params["length"] * sum(_count_eqns(s) for s in subs)
        elif eqn.primitive.name == "cond":
            n += max(_count_eqns(s) for s in subs)
        else:  # jit, custom_jvp/vjp calls, while (body and condition once: trip count unknown)
            n += sum(_count_eqns(s) for s in subs)
    return n


def count_eager_ops(fn: Callable, *args, **kwargs) -> int:
    """Primitives ``fn`` dispatches one by one when run without ``jit`` (each its own small program)."""
    return _count_eqns(jax.make_jaxpr(fn)(*args, **kwargs).jaxpr)


# Component knock-outs --------------------------------------------------------------------------------


def knockout_table(time_for: Callable[[frozenset[str]], Timing], components) -> pd.DataFrame:
    """Time the step whole and with each component switched off in turn.

    ``time_for(knockout)`` times the step with the components in ``knockout`` off. The shrink is
    how much faster the step gets without the component, as in the seed's megakernel column: it
    is not that component's share of the step, and the rows need not add up to it.
    """
    whole = time_for(frozenset())
    rows = [{"component": "(whole step)", "step_s": whole.median_s, "spread": whole.spread, "shrink_s": 0.0}]
    for c in tqdm(components, desc="knock-outs", leave=False):
        t = time_for(frozenset({c}))
        rows.append({"component": c, "step_s": t.median_s, "spread": t.spread, "shrink_s": whole.median_s - t.median_s})
    df = pd.DataFrame(rows)
    df["shrink_fraction"] = df["shrink_s"] / whole.median_s
    return df


def with_seed_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Add the seed's published component table (vLLM H100 kernel time, megakernel v5e-8 shrink)."""
    from .published import published, published_table
    pub = published_table()
    pub = pub[pub["quantity"] == "knockout_time"]
    out = table.copy()
    for prefix, col in (("ko_vllm_", "seed_vllm_h100_s"), ("ko_mk_", "seed_megakernel_v5e8_s")):
        vals = {k[len(prefix):]: v for k, v in zip(pub["key"], pub["value"]) if k.startswith(prefix)}
        out[col] = out["component"].map(vals)
    whole = table.loc[table["component"] == "(whole step)"].index
    out.loc[whole, "seed_vllm_h100_s"] = published("vllm_h100_moe_step")
    out.loc[whole, "seed_megakernel_v5e8_s"] = published("mk_v5e8_moe_step")
    return out


# Memory bandwidth probe ------------------------------------------------------------------------------

DEFAULT_PROBE_BYTES = 512 * 2**20  # far beyond any CPU cache, small beside an accelerator's memory


@dataclass(frozen=True)
class Bandwidth:
    """Read bandwidth measured on one device: the best of several kernels that stream an array once."""

    device: str
    nbytes: int
    by_probe: dict[str, float]  # bytes/s, best run of each probe

    @property
    def best(self) -> float:
        return max(self.by_probe.values())

    @property
    def best_probe(self) -> str:
        return max(self.by_probe, key=self.by_probe.get)

    def to_dict(self) -> dict:
        return {"device": self.device, "nbytes": self.nbytes, "bandwidth_Bps": self.best,
                "best_probe": self.best_probe, "by_probe_Bps": dict(self.by_probe),
                "kind": "measured (best of runs of each probe)"}


def measure_bandwidth(nbytes: int = DEFAULT_PROBE_BYTES, runs: int = 5, device=None,
                      dtype=jnp.float32) -> Bandwidth:
    """Measure how fast this device reads memory, in bytes/s.

    Two read-only kernels over an array of ``nbytes`` (f32 by default): a full sum (XLA's reduction) and a
    matrix-vector product (the library GEMV a decode step's weight reads use). Each probe's best
    run counts, and the better probe is the device's measured limit: taking the best keeps the
    fraction of the speed of light computed against it honest (never flattered by a slow probe).
    Another ``dtype`` measures how fast the device streams that type through the same kernels
    (XLA:CPU's BF16 GEMV is far slower than its F32 one: the way to choose a CPU data type).
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 2**20:
        raise ValueError(f"nbytes must be an integer of at least 1 MiB (use hundreds of MiB so the array "
                         f"does not fit in a cache), got {nbytes!r}")
    device = device or jax.devices()[0]
    cols = 4096
    rows = max(1, nbytes // (jnp.dtype(dtype).itemsize * cols))
    x = jax.device_put(jnp.ones((rows, cols), dtype), device)
    v = jax.device_put(jnp.ones((cols,), dtype), device)
    probes = {"reduce_sum": (jax.jit(jnp.sum), (x,)), "matvec": (jax.jit(jnp.matmul), (x, v))}
    by_probe = {}
    for name, (f, args) in probes.items():
        t = time_call(lambda: f(*args), warmup=1, runs=runs)
        by_probe[name] = x.nbytes / t.min_s
    return Bandwidth(device_name(device), int(x.nbytes), by_probe)


def device_name(device=None) -> str:
    """A readable name for a device; for a CPU, the processor model and its core count."""
    device = device or jax.devices()[0]
    if device.platform != "cpu":
        return f"{device.platform}: {device.device_kind}"
    model = "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu: {model} ({os.cpu_count()} cores)"


def sol_fraction(step_s: float, bytes_per_step: float, bandwidth: float) -> float:
    """The speed of light's step time (bytes / bandwidth) over the measured step time."""
    if step_s <= 0 or bytes_per_step <= 0 or bandwidth <= 0:
        raise ValueError(f"step_s, bytes_per_step and bandwidth must be positive, got "
                         f"{step_s}, {bytes_per_step}, {bandwidth}")
    return bytes_per_step / bandwidth / step_s
