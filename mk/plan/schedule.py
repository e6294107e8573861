"""Scheduling and folding: when each weight tile's DMA is issued and waited for, and which regular
runs of the resulting items the kernel emits as one loop.

``schedule`` places a ``Start`` for every load as early as its slot (and, for experts, the route)
allows, and a ``Wait`` just before the op that reads it, so the next tiles are always in flight while
the current one is computed on, across layer boundaries. ``fold`` finds the regular runs (the tiles
of one matrix, MLP chunks, expert slots, the head): runs of groups whose ops differ only in their
STRIDED fields, by a fixed stride.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import fields

from .records import Item, LayerLoop, Load, Loop, Op, Start, Wait

MAX_PERIOD = 8  # longest body searched for, in groups (an expert slot is 5: gate, up, act, down, combine)


def schedule(
    ops: list[Op],
    loads: list[Load],
    route_of: dict[int, int],
    slots: int,
    fences: tuple[int, ...] = (),
    lookahead: int = 0,
) -> list[Item]:
    """Place Start/Wait around the ops: every load starts as early as its slot (and, for experts, the
    route) allows; a compute waits for its own load just before it runs. No load an op after a fence
    (op index in ``fences``) reads starts before the fence has run (an all-reduce not overlapped with
    the weight stream). With a ``lookahead`` (bytes), no load starts either before the loads consumed ahead of it
    come within that many bytes of it (mk.plan.Tiles.lookahead_bytes)."""
    consumer = {op.load: n for n, op in enumerate(ops) if op.load is not None}
    by_buffer: dict[str, list[int]] = {}
    for ld in loads:
        by_buffer.setdefault(ld.buffer, []).append(ld.id)
    # a load may start once the op that consumed the previous user of its slot has run
    after_op = {}
    for ids in by_buffer.values():
        for k, lid in enumerate(ids):
            after_op[lid] = consumer[ids[k - slots]] if k >= slots else -1
    ready: dict[int, list[int]] = {}  # op index after which a load may start -> loads
    fence_before, last = [], -1
    for n in range(len(ops)):
        fence_before.append(last)
        if n in fences:
            last = n
    window = _window(ops, loads, lookahead) if lookahead else {}
    for ld in loads:
        n = consumer[ld.id]
        after = max(after_op[ld.id], route_of.get(n, -1), fence_before[n], window.get(ld.id, -1))
        ready.setdefault(after, []).append(ld.id)
    items: list[Item] = [Start(lid) for lid in ready.get(-1, ())]
    for n, op in enumerate(ops):
        if op.load is not None:
            items.append(Wait(op.load))
        items.append(op)
        items += [Start(lid) for lid in ready.get(n, ())]
    return items


def _window(ops: list[Op], loads: list[Load], lookahead: int) -> dict[int, int]:
    """Each load's op after which the bytes consumed so far are within ``lookahead`` of its own first byte, in the
    order the ops read their tiles (-1: before the first op)."""
    nbytes = {ld.id: ld.nbytes for ld in loads}
    consumed, first, total = [], {}, 0
    for op in ops:
        if op.load is not None:
            first[op.load] = total
            total += nbytes[op.load]
        consumed.append(total)
    return {lid: bisect_left(consumed, at - lookahead) if at > lookahead else -1 for lid, at in first.items()}


def groups(items) -> tuple[tuple[int, int], ...]:
    """Item ranges [a, b): each compute op with the Wait just before it and the Starts just after it
    (the Starts before the first op are a group of their own)."""
    cuts = [0] + [
        n
        for n, it in enumerate(items)
        if n and (isinstance(it, Wait) or (isinstance(it, Op) and not isinstance(items[n - 1], Wait)))
    ]
    return tuple(zip(cuts, cuts[1:] + [len(items)]))


def split_fields(op: Op) -> tuple[tuple, tuple[int, ...], tuple[bool, ...]]:
    """(what must be equal between repeats of a loop, the integers that may step by a stride, the flags
    that may turn on after the first repeat): from the op kind's STRIDED fields."""
    key, ints, flags = [type(op)], [], []
    for f in fields(op):
        v = getattr(op, f.name)
        if f.name == "load":  # the tile's own id: compared as a Load (load_key, load_ints)
            continue
        if f.name not in op.STRIDED:
            key.append(v)
        elif isinstance(v, bool):
            flags.append(v)
        else:
            key.append(v is None)
            if v is not None:
                ints.append(v)
    return tuple(key), tuple(ints), tuple(flags)


def load_key(ld: Load):
    return ld.tensor, ld.component, ld.buffer, ld.rows[1], ld.cols[1], ld.nbytes, ld.expert is None, ld.index is None


def load_ints(ld: Load) -> tuple[int, ...]:
    return ld.layer, ld.index or 0, ld.rows[0], ld.cols[0], ld.expert or 0


def _varying(items, group, loads: dict):
    """A group's compute as (equal part, strided integers, buffer slot, flags); None if no loop may hold it."""
    op = next((it for it in items[group[0] : group[1]] if isinstance(it, Op)), None)
    if op is None or not op.LOOPABLE:
        return None
    key, ints, flags = split_fields(op)
    if op.load is not None:
        ld = loads[op.load]
        key, ints = key + load_key(ld), ints + load_ints(ld)
    return key, ints, loads[op.load].slot if op.load is not None else 0, flags


def _repeats(v: list, a: int, period: int, slots: int) -> int:
    """How many times the ``period`` groups from ``a`` repeat with fixed strides (1 if not at all)."""
    n = 1
    while a + period * (n + 1) <= len(v):
        for k in range(period):
            first, second, this = v[a + k], v[a + k + period], v[a + k + period * n]
            if first is None or this is None or this[0] != first[0]:
                return n
            if any(x0 + (x1 - x0) * n != x for x0, x1, x in zip(first[1], second[1], this[1])):
                return n
            if this[2] != (first[2] + (second[2] - first[2]) % slots * n) % slots:
                return n
            # each flag: equal throughout, or off on the first repeat only
            if any(f != f0 and not (not f0 and f1) for f0, f1, f in zip(first[3], second[3], this[3])):
                return n
        n += 1
    return n


def fold(items, loads: dict, slots: int) -> tuple[int | Loop, ...]:
    """Cover the groups of ``items`` greedily with the longest regular runs (``Loop``); the rest stay
    single groups (their index)."""
    gs = groups(items)
    v = [_varying(items, g, loads) for g in gs]
    out: list[int | Loop] = []
    a = 0
    while a < len(gs):
        best = None
        if v[a] is not None:
            for period in range(1, min(MAX_PERIOD, (len(gs) - a) // 2) + 1):
                n = _repeats(v, a, period, slots)
                if n >= 2 and (best is None or period * n > best.period * best.count):
                    best = Loop(a, period, n)
        if best is None:
            out.append(a)
            a += 1
        else:
            out.append(best)
            a += best.period * best.count
    return tuple(out)


def start_runs(starts: list[list[Load]], slots: int) -> list[tuple[int, int, Load, Load | None]]:
    """The Starts of one body position over a loop's repeats (``starts[j]``: the loads started in
    repeat j) as runs (lo, hi, first load, second load or None): in repeats lo..hi-1 the load steps
    from the first by a fixed stride, like a loop body's compute."""
    done: list = []
    open_: dict = {}
    for j, lds in enumerate(starts):
        still = {}
        for m, ld in enumerate(lds):
            r = open_.get(m)
            if r is not None and load_key(r[2]) == load_key(ld):
                lo, _, first, second = r
                step = j - lo
                if second is None or (
                    all(a + (b - a) * step == c for a, b, c in zip(load_ints(first), load_ints(second), load_ints(ld)))
                    and ld.slot == (first.slot + (second.slot - first.slot) % slots * step) % slots
                ):
                    still[m] = (lo, j + 1, first, second or ld)
                    continue
            if r is not None:
                done.append(r)
            still[m] = (j, j + 1, ld, None)
        done += [r for m, r in open_.items() if m not in still]
        open_ = still
    return done + list(open_.values())


def _item_shape(item, loads: dict):
    """An item as (equal part, integers, buffer slot) for comparing whole layers: every integer field
    (layer, stacked index, offsets, expert slot) may step between repeats; flags and names may not."""
    if isinstance(item, (Start, Wait)):
        ld = loads[item.load]
        return (type(item),) + load_key(ld), load_ints(ld), ld.slot
    key, ints = [type(item)], []
    for f in fields(item):
        v = getattr(item, f.name)
        if f.name == "load":
            continue
        if isinstance(v, int) and not isinstance(v, bool):
            ints.append(v)
        else:
            key.append(v)
    if item.load is not None:
        ld = loads[item.load]
        return tuple(key) + load_key(ld), tuple(ints) + load_ints(ld), ld.slot
    return tuple(key), tuple(ints), 0


def layer_loop(items, loads: dict, slots: int, layers: int, period: int) -> LayerLoop | None:
    """The longest run of at least two whole ``period``-layer repeats whose items step linearly, as a
    LayerLoop with its body folded; None if there is none. The first period issues some of its DMAs
    before the step's first op and the last prefetches the head's tiles, so the run often starts at the
    second period and ends before the last."""
    if period <= 0 or layers < 2 * period:
        return None
    gs = groups(items)
    first = {}
    for n, (a, b) in enumerate(gs):
        op = next((it for it in items[a:b] if isinstance(it, Op)), None)
        if op is not None and op.layer >= 0:
            first.setdefault(op.layer, n)
    shapes = [_item_shape(it, loads) for it in items]
    best = None
    for p0 in range(layers // period - 1):
        if p0 * period not in first or (p0 + 1) * period not in first:
            continue
        start, per = first[p0 * period], first[(p0 + 1) * period] - first[p0 * period]
        lo, width = gs[start][0], gs[start + per][0] - gs[start][0]
        count = 1
        while (
            p0 + count < layers // period
            and lo + width * (count + 1) <= len(items)
            and first.get((p0 + count) * period) == start + per * count
            and _linear(shapes, lo, width, count, slots)
        ):
            count += 1
        if count >= 2 and (best is None or count > best[2]):
            best = (start, per, count, lo, width)
    if best is None:
        return None
    start, per, count, lo, width = best
    return LayerLoop(start, per, count, fold(items[lo : lo + width], loads, slots))


def _linear(shapes, lo: int, width: int, n: int, slots: int) -> bool:
    """Whether repeat n of the ``width`` items from ``lo`` steps linearly from repeats 0 and 1."""
    for m in range(width):
        a, b, c = shapes[lo + m], shapes[lo + width + m], shapes[lo + width * n + m]
        if (
            c[0] != a[0]
            or any(x0 + (x1 - x0) * n != x for x0, x1, x in zip(a[1], b[1], c[1]))
            or c[2] != (a[2] + (b[2] - a[2]) % slots * n) % slots
        ):
            return False
    return True


def fold_step(items, loads: dict, slots: int, layers: int, period: int) -> tuple:
    """``fold``, with the repeats of whole layer periods (``layer_loop``) as one LayerLoop."""
    ll = layer_loop(items, loads, slots, layers, period)
    if ll is None:
        return fold(items, loads, slots)
    gs = groups(items)
    before = fold(items[: gs[ll.start][0]], loads, slots)
    end = ll.start + ll.period * ll.count
    after = fold(items[gs[end][0] :], loads, slots) if end < len(gs) else ()
    return before + (ll,) + tuple(_shift(s, end) for s in after)


def _shift(seg, by: int):
    return seg + by if isinstance(seg, int) else Loop(seg.start + by, seg.period, seg.count)


def pattern_period(layer_types: tuple[str, ...]) -> int:
    """The shortest period of the layer-type pattern that repeats at least twice (0 if none)."""
    n = len(layer_types)
    for p in range(1, n // 2 + 1):
        if all(layer_types[i] == layer_types[i + p] for i in range(n - p)):
            return p
    return 0
