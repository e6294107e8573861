"""The TPU compiler's own schedule of a Pallas kernel, read without a TPU.

A TPU TensorCore is statically scheduled: libtpu's compiler decides every VLIW bundle the core issues, and apart
from waits on DMAs and semaphores the bundles issued are the core's time. With ``LIBTPU_INIT_ARGS=--xla_jf_dump_to=DIR``
an ahead-of-time compile writes the kernel's final bundles to ``DIR`` (``...-<kernel>.N-NN-final_bundles.txt``): one
line starts each bundle (``0x1a  :  { op ;; op ;; ... }``), ``LB:`` marks a loop body's first bundle and a comment
names the control regions that start there (``/* Start region 731 */``); a branch names its target region
(``sbr.rel (!%p5) target = $region731``) and is followed by ``DELAY_SLOTS`` bundles that issue whether it is taken or
not. A loop is its first bundle to its back branch and the delay slots after it; the compare that sets the predicate
its back branch tests (``%p5 = scmp.ge.s32... %s3, 37``, ``%s3`` its counter) names its bound where that is a
constant. A forward branch skips the code up to its target: a ``pl.when`` the predicate may turn off.

With ``--xla_enable_custom_call_region_trace=true`` as well, the kernel's named scopes (``jax.named_scope`` in a
Pallas body) stay in the code as trace marks (``vtrace ... /* TraceMeStart(name) [ */``): :func:`scope_stacks` says
which scopes each bundle was emitted in. The marks are bundles of their own, which the real schedule does not have
(:attr:`Bundle.is_mark`), and they keep the compiler from overlapping neighbouring scopes a little.

The flags are read once, when libtpu starts in a process, so :func:`final_bundles` compiles in a child process with
them set, into a temporary folder removed afterwards. :func:`issued` counts the bundles one call issues as a polynomial
in the trip counts and shares the code cannot know (a loop over a user's KV tiles, code that runs for a routed expert
slot only): each bundle once per trip of every loop around it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DELAY_SLOTS = 4  # bundles after a branch that issue either way (libtpu pads them with empty bundles when it must)

# "   0x6 LB: > { ..." / "     0   :  { ...": address, an optional control-target mark, ':', loop depth marks, '{'
_BUNDLE = re.compile(r"^\s*(0x[0-9a-fA-F]+|\d+)\s+(?:([A-Z]{2}):|:)\s*((?:>\s*)*)\{")
_BRANCH = re.compile(r"sbr\.rel\s*(?:\(!?(%p\w+)\))?\s*target\s*=\s*\$region(\d+)")
_REGION_START = re.compile(r"(?:Start|Start/End empty) region (\d+)\b")
_TRACE = re.compile(r"TraceMe(Start|End)\(([^)]*)\)")
_OPS = re.compile(r"\{(.*)\}", re.S)


@dataclass(frozen=True)
class Bundle:
    """One VLIW bundle: its address, its loop depth (the ``>`` marks), its control-target mark, its text."""

    address: int
    depth: int
    mark: str | None
    text: str

    @property
    def branch_target(self) -> int | None:
        """The control region a branch in this bundle goes to."""
        m = _BRANCH.search(self.text)
        return int(m.group(2)) if m else None

    @property
    def branch_predicate(self) -> str | None:
        """The predicate register a conditional branch in this bundle tests (``%p572_p9``)."""
        m = _BRANCH.search(self.text)
        return m.group(1) if m else None

    @property
    def starts_regions(self) -> set[int]:
        return {int(n) for n in _REGION_START.findall(self.text)}

    @property
    def is_mark(self) -> bool:
        """A bundle holding trace marks only: it exists only in a compile that keeps the named scopes."""
        m = _OPS.search(self.text)
        ops = [op for op in (m.group(1) if m else "").split(";;") if op.strip()]
        return bool(ops) and all("= vtrace" in op for op in ops)


@dataclass
class Loop:
    """A loop: bundles ``start`` (its ``LB``) to ``end`` (the delay slots after its back branch), indices, inclusive;
    the loops nested in it; its trip count where its exit test names a constant bound (``None``: the caller says)."""

    start: int
    end: int
    trips: int | None
    inner: list[Loop] = field(default_factory=list)

    @property
    def bundles(self) -> int:
        return self.end - self.start + 1


@dataclass(frozen=True)
class Skip:
    """Code a forward branch jumps over (bundles ``start`` to ``end``, after its delay slots and before its target):
    it issues only when the branch is not taken."""

    branch: int
    start: int
    end: int


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


def _branches(bundles: list[Bundle]) -> list[tuple[int, int]]:
    """(branch, target) bundle indices of every branch, its target found by the region it names."""
    starts: dict[int, int] = {}
    for i, b in enumerate(bundles):
        for n in b.starts_regions:
            starts.setdefault(n, i)
    out = []
    for i, b in enumerate(bundles):
        n = b.branch_target
        if n is None:
            continue
        if n not in starts:
            raise ValueError(f"the branch at bundle {b.address:#x} goes to region {n}, which no bundle starts")
        out.append((i, starts[n]))
    return out


def _exit_bound(bundles: list[Bundle], start: int, branch: int) -> int | None:
    """The constant a loop's back branch tests its counter against: the predicate it branches on is set by comparing
    a counter the loop steps by one with a constant (``%p9 = scmp.ge.s32.totalorder (%p6), %s2, 15`` and ``%s2 =
    sadd.s32 1, ...``: a ``fori_loop``'s, marked ``/* loop exit test */``, or a copy loop the compiler made), which
    may sit in an inner loop's last bundles. Counters start at 0."""
    pred = bundles[branch].branch_predicate
    if pred is None:
        return None
    test = re.compile(re.escape(pred) + r" = scmp\.ge\.s32\.\w+\s+(?:\(!?%p\w+\),\s*)?(%s\w+),\s*(\d+)\b(.*)")
    text = "\n".join(b.text for b in bundles[start : branch + 1])
    m = test.search(text)
    if m is None:
        return None
    marked = re.match(r"\s*/\*\s*loop exit test", m.group(3))  # a fori_loop's (its counter may be spilled)
    stepped = re.search(re.escape(m.group(1)) + r" = sadd\.s32\s+(?:\(!?%p\w+\),\s*)?1, ", text)
    return int(m.group(2)) if marked or stepped else None


def find_loops(bundles: list[Bundle]) -> list[Loop]:
    """The outermost loops, each with the loops nested in it: every backward branch closes the loop from its target
    (an ``LB`` bundle) to its own delay slots."""
    spans = sorted(
        ((t, min(i + DELAY_SLOTS, len(bundles) - 1), i) for i, t in _branches(bundles) if t <= i),
        key=lambda s: (s[0], -s[1]),
    )
    for t, _, _ in spans:
        if bundles[t].mark != "LB":
            raise ValueError(f"a back branch goes to bundle {bundles[t].address:#x}, which is not a loop body's first")

    def build(todo: list[tuple[int, int, int]]) -> list[Loop]:
        loops = []
        while todo:
            s, e, branch = todo.pop(0)
            inner = []
            while todo and todo[0][0] <= e:
                inner.append(todo.pop(0))
            loops.append(Loop(s, e, _exit_bound(bundles, s, branch), build(inner)))
        return loops

    return build(spans)


def find_skips(bundles: list[Bundle]) -> list[Skip]:
    """The code every forward branch jumps over (empty where its target is within its delay slots)."""
    return [
        Skip(i, i + DELAY_SLOTS + 1, t - 1) for i, t in _branches(bundles) if t > i and t - 1 >= i + DELAY_SLOTS + 1
    ]


def scope_stacks(bundles: list[Bundle]) -> list[tuple[str, ...]]:
    """The named scopes (trace marks) open at each bundle, outermost first: empty for a compile without marks."""
    stack: list[str] = []
    out = []
    for b in bundles:
        ends = 0
        for kind, name in _TRACE.findall(b.text):
            if kind == "Start":
                stack.append(name)
            else:
                ends += 1
        out.append(tuple(stack))
        for _ in range(ends):
            if not stack:
                raise ValueError(f"a trace mark at bundle {b.address:#x} ends a scope that was never started")
            stack.pop()
    return out


# How often one call issues a bundle: a coefficient times named factors (the trips of loops without a constant bound,
# the shares of skippable code that runs), e.g. (3.0, ("kv_tiles.full",)).
Count = tuple[float, tuple[str, ...]]


def issued(
    bundles: list[Bundle],
    trips: Callable[[Loop], int | str | None] | None = None,
    share: Callable[[Skip], float | str | None] | None = None,
) -> list[Count]:
    """How many times one call issues each bundle: once, times every enclosing loop's trips (``trips(loop)``: a
    number, a factor's name, or ``None`` for the loop's own constant bound), times every enclosing skippable stretch's
    share (``share(skip)``: the fraction of calls it runs, a factor's name, or ``None``: counted as run). A trace mark
    issues 0 times. A loop whose trips are neither given nor constant is refused by address."""
    counts: list[list] = [[0.0 if b.is_mark else 1.0, []] for b in bundles]

    def scale(lo: int, hi: int, by):
        for c in counts[lo : hi + 1]:
            if isinstance(by, str):
                c[1].append(by)
            else:
                c[0] *= by

    def walk(loops: list[Loop]):
        for lp in loops:
            n = trips(lp) if trips else None
            n = lp.trips if n is None else n
            if n is None:
                raise ValueError(
                    f"the loop at bundle {bundles[lp.start].address:#x} has no constant bound; give its trip count"
                )
            scale(lp.start, lp.end, n)
            walk(lp.inner)

    walk(find_loops(bundles))
    for sk in find_skips(bundles):
        s = share(sk) if share else None
        if s is not None:
            scale(sk.start, sk.end, s)
    return [(c, tuple(sorted(f))) for c, f in counts]


def issued_bundles(bundles: list[Bundle], trips: dict[int, int] | None = None) -> float:
    """Bundles one call issues, every loop counted at its constant bound or at ``trips[address of its LB bundle]``, and
    all skippable code counted as run."""
    given = trips or {}
    return sum(c for c, _ in issued(bundles, lambda lp: given.get(bundles[lp.start].address)))


def final_bundles(code: str, kernel: str, env: dict | None = None, scopes: bool = False, timeout: int = 1800) -> str:
    """Run ``code`` (Python that compiles a Pallas kernel named ``kernel`` ahead of time, e.g. with mk.tpu.aot_compile)
    in a child process with libtpu's dump of the final bundles switched on, and return that kernel's; ``scopes``: with
    its named scopes kept as trace marks. The dump lives in a temporary folder, removed afterwards. Raises
    RuntimeError naming what is missing (no libtpu, a compile that failed, a libtpu that writes no final bundles)."""
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        raise RuntimeError("the compiler's schedule needs libtpu (pip install -r requirements-tpu.txt)")
    with tempfile.TemporaryDirectory(prefix="mk-schedule-") as d:
        child = dict(os.environ, **(env or {}))
        # only the final bundles: the other passes' dumps are most of a GB for a whole model, and of the compile's time
        flags = f"--xla_jf_dump_to={d} --xla_jf_dump_llo_pass_label_regex=final_bundles"
        flags += " --xla_enable_custom_call_region_trace=true" if scopes else ""
        child["LIBTPU_INIT_ARGS"] = f"{child.get('LIBTPU_INIT_ARGS', '')} {flags}".strip()
        child.setdefault("JAX_PLATFORMS", "cpu")
        r = subprocess.run([sys.executable, "-c", code], env=child, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"the compile for the schedule failed: {r.stderr.strip().splitlines()[-1:]}")
        names = sorted(p for p in Path(d).iterdir() if p.name.endswith("final_bundles.txt") and f"-{kernel}." in p.name)
        names = [p for p in names if "schedule-analysis" not in p.name]
        if not names:
            raise RuntimeError(f"libtpu wrote no final bundles for kernel {kernel!r} (its dump's format may differ)")
        return names[-1].read_text()
