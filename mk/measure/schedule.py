"""The TPU compiler's own schedule of a Pallas kernel, read without a TPU.

A TPU TensorCore is statically scheduled: libtpu's compiler decides every VLIW bundle the core issues, and apart
from waits on DMAs and semaphores the bundles issued are the core's time. With ``LIBTPU_INIT_ARGS=--xla_jf_dump_to=DIR``
an ahead-of-time compile writes the kernel's final bundles to ``DIR`` (``...-<kernel>.N-NN-final_bundles.txt``): one
line starts each bundle (``0x1a  :  { op ;; op ;; ... }``), prefixed by ``>`` once per enclosing loop, ``LB:`` at a loop
body's first bundle; a loop's exit test (``scmp... %s, 37 /* loop exit test */``) names its bound when it is a constant.

The flag is read once, when libtpu starts in a process, so :func:`final_bundles` compiles in a child process with it
set, into a temporary folder removed afterwards. :func:`parse_bundles` and :func:`issued_bundles` read the text: the
bundles one call of the kernel issues, each loop body counted as many times as its loop runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# "   0x6 LB: > { ..." / "     0   :  { ...": address, an optional control-target mark, ':', one '>' per loop, '{'
_BUNDLE = re.compile(r"^\s*(0x[0-9a-fA-F]+|\d+)\s+(?:([A-Z]{2}):|:)\s*((?:>\s*)*)\{")
_EXIT_BOUND = re.compile(r"scmp\.[a-z]+\.s32[^,]*,\s*(\d+)\s*/\*\s*loop exit test")


@dataclass(frozen=True)
class Bundle:
    """One VLIW bundle: its address, its loop depth (the ``>`` marks), its control-target mark, its text."""

    address: int
    depth: int
    mark: str | None
    text: str

    @property
    def branches(self) -> bool:
        return "sbr.rel" in self.text


@dataclass
class Loop:
    """A loop body: bundles ``start`` to ``end`` (indices, inclusive) at ``depth``, the loops nested in it, and its
    trip count where its exit test names a constant bound (``None``: the caller must say)."""

    start: int
    end: int
    depth: int
    trips: int | None
    inner: list[Loop] = field(default_factory=list)

    @property
    def bundles(self) -> int:
        return self.end - self.start + 1


def parse_bundles(text: str) -> list[Bundle]:
    """The bundles of a ``final_bundles.txt``, in order (a bundle's text runs over the lines until the next one)."""
    out: list[Bundle] = []
    lines: list[str] = []
    head = None
    for line in text.splitlines():
        m = _BUNDLE.match(line)
        if m:
            if head is not None:
                out.append(Bundle(*head, "\n".join(lines)))
            head, lines = (int(m.group(1), 0), m.group(3).count(">"), m.group(2)), [line]
        elif head is not None:
            lines.append(line)
    if head is not None:
        out.append(Bundle(*head, "\n".join(lines)))
    if not out:
        raise ValueError("no bundles found: not a libtpu final_bundles.txt (or its format changed)")
    return out


def find_loops(bundles: list[Bundle], start: int = 0, end: int | None = None, depth: int = 1) -> list[Loop]:
    """The loops at ``depth`` between bundles ``start`` and ``end``: each from its ``LB`` bundle to the last bundle
    still inside it. The back branch itself carries no ``>`` in libtpu's dump, so a branch bundle does not end a
    loop; the first other bundle shallower than the loop does."""
    end = len(bundles) - 1 if end is None else end
    loops, i = [], start
    while i <= end:
        b = bundles[i]
        if b.mark == "LB" and b.depth == depth:
            j = i
            while j + 1 <= end and (bundles[j + 1].depth >= depth or bundles[j + 1].branches):
                if bundles[j + 1].mark == "LB" and bundles[j + 1].depth == depth:
                    break  # the next loop at this depth
                j += 1
            while bundles[j].depth < depth:  # a trailing branch bundle belongs to the loop only before a '>' one
                j -= 1
            inner = find_loops(bundles, i, j, depth + 1)
            own = [k for k in range(i, j + 1) if not any(lp.start <= k <= lp.end for lp in inner)]
            bounds = {int(m.group(1)) for k in own for m in _EXIT_BOUND.finditer(bundles[k].text)}
            loops.append(Loop(i, j, depth, bounds.pop() if len(bounds) == 1 else None, inner))
            i = j + 1
        else:
            i += 1
    return loops


def issued_bundles(bundles: list[Bundle], trips: dict[int, int] | None = None) -> int:
    """Bundles one call issues: every bundle once, each loop's body ``trips`` times (its own constant bound, or
    ``trips[address of its LB bundle]``). A loop whose count is unknown is refused by address."""
    trips = trips or {}

    def count(lo: int, hi: int, loops: list[Loop]) -> int:
        total = hi - lo + 1
        for lp in loops:
            n = trips.get(bundles[lp.start].address, lp.trips)
            if n is None:
                raise ValueError(
                    f"the loop at bundle {bundles[lp.start].address:#x} has no constant bound; pass its trip count"
                )
            total += -lp.bundles + n * count(lp.start, lp.end, lp.inner)
        return total

    return count(0, len(bundles) - 1, find_loops(bundles))


def final_bundles(code: str, kernel: str, env: dict | None = None, timeout: int = 900) -> str:
    """Run ``code`` (Python that compiles a Pallas kernel named ``kernel`` ahead of time, e.g. with mk.tpu.aot_compile)
    in a child process with libtpu's dump switched on, and return that kernel's final bundles. The dump (hundreds of
    MB for a whole model) lives in a temporary folder, removed afterwards. Raises RuntimeError naming what is missing
    (no libtpu, a compile that failed, a libtpu that writes no final bundles)."""
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        raise RuntimeError("the compiler's schedule needs libtpu (pip install -r requirements-tpu.txt)")
    with tempfile.TemporaryDirectory(prefix="mk-schedule-") as d:
        child = dict(os.environ, **(env or {}))
        child["LIBTPU_INIT_ARGS"] = f"{child.get('LIBTPU_INIT_ARGS', '')} --xla_jf_dump_to={d}".strip()
        child.setdefault("JAX_PLATFORMS", "cpu")
        r = subprocess.run([sys.executable, "-c", code], env=child, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"the compile for the schedule failed: {r.stderr.strip().splitlines()[-1:]}")
        names = sorted(p for p in Path(d).iterdir() if p.name.endswith("final_bundles.txt") and f"-{kernel}." in p.name)
        names = [p for p in names if "schedule-analysis" not in p.name]
        if not names:
            raise RuntimeError(f"libtpu wrote no final bundles for kernel {kernel!r} (its dump's format may differ)")
        return names[-1].read_text()
