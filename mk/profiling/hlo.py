"""Reading optimised HLO text: its computations, their instructions, and the computations an
instruction calls."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMP_HEAD = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_ARRAY = re.compile(r"^\w+\[[\d,]*\]")


@dataclass(frozen=True)
class _Instr:
    name: str
    opcode: str
    rest: str
    type: str  # the result's: ``bf16[2816,704]{1,0:T(8,128)(2,1)}``, or a tuple's


def _split_type(s: str) -> str:
    """Drop the leading result type (which may be a parenthesised tuple) and return the remainder."""
    if s.startswith("("):
        depth = 0
        for i, ch in enumerate(s):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return s[i + 1 :].lstrip()
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
            comps[current].append(_Instr(m.group(1), opcode, rest, m.group(2)[: len(m.group(2)) - len(rest)].strip()))
    if entry is None:
        raise ValueError(
            "no ENTRY computation in this text: pass the optimised HLO of a compiled program "
            "(jax.jit(f).lower(*args).compile().as_text())"
        )
    return comps, entry


def callees(rest: str, attr: str) -> list[str]:
    """The computations an attribute names: ``body=%b`` or ``branch_computations={%a, %b}``."""
    m = re.search(r"\b" + attr + r"=(\{[^}]*\}|[^,\s]+)", rest)
    return [c.strip().lstrip("%") for c in m.group(1).strip("{}").split(",")] if m else []


def relayouts(text: str) -> dict[str, int]:
    """The arrays the ENTRY computation of an optimised HLO module copies, by type (``{"bf16[2816,704]": 256}``): on
    a TPU a copy there lays an input out anew (another tiling or minor dimension) at every run of the program."""
    comps, entry = parse_hlo(text)
    found = Counter(t.group(0) for i in comps[entry] if i.opcode == "copy" and (t := _ARRAY.match(i.type)))
    return dict(found)
