"""An item of a loop's repeat r, from the loop's first two repeats: the megakernel emits a regular run of tiles or
layers once, as a ``fori_loop`` body whose loads' offsets, buffer slots and layer indices and whose ops' strided
fields are the first repeat's stepped r times by their difference to the second (mk.plan.Loop, LayerLoop)."""

from __future__ import annotations

from dataclasses import fields, replace

from jax.experimental import pallas as pl

from ..plan import BLOCK, LANE, Load, Op


def when(cond, fn):
    """Run ``fn`` where ``cond`` holds: now or not at all where it is a Python bool (made of fields the same in every
    repeat), under ``pl.when`` where it is traced (a field stepped in a loop)."""
    if isinstance(cond, bool):
        return fn() if cond else None
    pl.when(cond)(fn)


def _static(*xs) -> bool:
    return all(isinstance(x, int) for x in xs)


def _lin(a, b, r, align=1):
    """a + (b - a) * r: kept static when a == b; ``align`` is a hint for the compiler (static a, b)."""
    if _static(a, b):
        return a if a == b else pl.multiple_of(a + (b - a) * r, align)
    return a + (b - a) * r


def _at_slot(a, b, r, slots):
    if _static(a, b) and a == b:
        return a
    return (a + (b - a) % slots * r) % slots


def at_load(a: Load, b: Load, r, slots) -> Load:
    """Load ``a`` in repeat r of a loop whose next repeat holds ``b``."""
    return replace(
        a,
        rows=(_lin(a.rows[0], b.rows[0], r, BLOCK), a.rows[1]),
        cols=(_lin(a.cols[0], b.cols[0], r, LANE), a.cols[1]),
        slot=_at_slot(a.slot, b.slot, r, slots),
        layer=_lin(a.layer, b.layer, r),
        index=None if a.index is None else _lin(a.index, b.index, r),
        expert=None if a.expert is None else _lin(a.expert, b.expert, r),
    )


def at_op(a: Op, b: Op, r) -> Op:
    """Op ``a`` in repeat r of a loop over tiles: STRIDED integers stepped, STRIDED flags on after repeat 0."""
    changes = {}
    for f in fields(a):
        if f.name not in a.STRIDED:
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, bool):
            changes[f.name] = x if x == y else r >= 1
        elif x is not None:
            changes[f.name] = _lin(x, y, r, LANE if f.name.endswith("_off") else 1)
    return replace(a, **changes)


def shift_op(a: Op, b: Op, r) -> Op:
    """Op ``a`` in repeat r of a loop over layers: every integer field but its load stepped."""
    changes = {
        f.name: _lin(getattr(a, f.name), getattr(b, f.name), r)
        for f in fields(a)
        if f.name != "load" and isinstance(getattr(a, f.name), int) and not isinstance(getattr(a, f.name), bool)
    }
    return replace(a, **changes)
