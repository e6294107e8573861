"""Kernels per step, counted in the optimised HLO of the compiled program.

What counts as a kernel. XLA compiles a jitted step into one program; its optimised HLO has an
entry computation whose top-level instructions are what the runtime launches one after another:
fusions (XLA's own generated kernels), custom calls (library or Pallas kernels), collectives, and
other unfused ops (on the CPU, ``dot`` and ``copy`` run as their own library calls). Parameters,
constants, tuples, ``get-tuple-element`` and bitcasts launch nothing. A ``while`` loop launches its
body's kernels once per iteration (XLA records the trip count in the loop's backend config) and a
``conditional`` one branch (the largest is counted). Run op by op (no ``jit``), every primitive of
the traced program is dispatched as its own small program: ``count_eager_ops`` in
mk.profiling.eager counts those; ``trace_kernels`` in mk.profiling.trace checks this count against
a profiler trace of the running program.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import jax

from .hlo import callees, parse_hlo

FUSION = "fusion"
CUSTOM_CALL = "custom-call"
COLLECTIVE = "collective"
OTHER = "other"
KERNEL_KINDS = (FUSION, CUSTOM_CALL, COLLECTIVE, OTHER)
_COLLECTIVES = {
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
}
# Instructions that launch no work: values that already exist, views and bookkeeping.
_FREE = {
    "parameter",
    "constant",
    "tuple",
    "get-tuple-element",
    "bitcast",
    "after-all",
    "partition-id",
    "replica-id",
    "add-dependency",
    "opt-barrier",
    "domain",
}
_CONTROL = {"while", "conditional", "call"}


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
                for body in callees(ins.rest, "body"):
                    walk(body, times * (int(m.group(1)) if m else 1))
            elif ins.opcode == "conditional":
                branches = callees(ins.rest, "branch_computations") or (
                    callees(ins.rest, "true_computation") + callees(ins.rest, "false_computation")
                )
                largest = max(branches, key=lambda b: _flat_size(comps, b), default=None)
                for b in branches:  # every branch's kernels are named (a trace shows whichever ran)
                    walk(b, times if b == largest else 0)
            elif ins.opcode == "call":
                for c in callees(ins.rest, "to_apply"):
                    walk(c, times)
            else:
                kind = _kind(ins.opcode)
                if kind is not None:
                    kinds[kind] += times
                    ops[ins.opcode] += times
                    names.add(ins.name)

    walk(entry, 1)
    return KernelCount(
        {k: float(kinds.get(k, 0)) for k in KERNEL_KINDS},
        {k: float(v) for k, v in ops.items() if v},
        unknown,
        frozenset(names),
    )


def _flat_size(comps: dict, comp: str) -> int:
    return sum(_kind(i.opcode) is not None for i in comps[comp])


def compile_text(fn: Callable, *args, **kwargs) -> str:
    """The optimised HLO of ``fn`` (jitted here if it is not already) for these arguments."""
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    return jitted.lower(*args, **kwargs).compile().as_text()


def compiled_kernels(fn: Callable, *args, **kwargs) -> KernelCount:
    """Kernels per call of the compiled ``fn`` on these arguments."""
    return count_kernels(compile_text(fn, *args, **kwargs))
