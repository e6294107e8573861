"""A modelled timeline of one step on one chip, read off the plan's records and their own costs."""

from __future__ import annotations

from collections.abc import Callable

from ..chips import get_chip
from .records import Load, Op, ReadAhead, Start, Wait


def timeline(
    plan,
    chip,
    distinct: dict[int, int] | None = None,
    op_overhead_s: float = 0.0,
    dma_issue_s: float | Callable[[Load], float] = 0.0,
    ici_latency_s: float = 0.0,
    compute_s: Callable[[Op], float] | None = None,
    load_bytes: Callable[[Load], float] | None = None,
    bandwidth: float | None = None,
    dma_latency_s: float = 0.0,
) -> list[dict]:
    """The DMA engine serves weight tiles in the order the plan issues them at ``bandwidth`` (bytes/s a chip, the HBM
    read rate mk.timing.bandwidth charges the chip: required); compute runs the ops in order, each waiting for its
    tile, at the chip's bf16 FLOP/s plus a fixed ``op_overhead_s`` per op (loop step, semaphore wait, vector setup) and
    ``dma_issue_s`` per DMA it issues (a number, or a function of the load; with both zero the model has no cost but
    bytes and FLOPs). ``compute_s(op)``: an op's time on the core (default its FLOPs at the chip's rate; mk.timing
    gives the compiler's scheduled bundles where it has them). An op's ``kv_bytes`` share the DMA engine with the
    weights and stream behind its compute (the kernel's double-buffered cache tiles: the op ends when its compute is
    done and, after the last tile arrives, a tile's share of it); its ``serial_bytes`` are read while compute waits
    (lane "dma (serial)": the prologue, the first KV tile of each user and layer, the router ids, the write-back block,
    the token ids out). A ``ReadAhead`` issues its layer's first KV tiles into the engine's queue where it stands
    (mk.plan.Tiles.kv_ahead); the layer's Attend reads the rest, waiting for the first tile's arrival. A cross-chip
    op's ``sent_bytes`` leave over one link (its ``wire_bytes``: the busiest link's
    share where it spreads them over a torus) at the chip's ICI bandwidth plus ``ici_latency_s`` per round while
    compute waits (lane "ici"); the weight DMAs already issued go on meanwhile (an all-reduce without overlap has none
    issued: mk.plan.schedule). ``load_bytes(load)``: the bytes a weight DMA moves (default ``load.nbytes``; mk.timing
    scales it for narrower weight types). ``dma_latency_s``: the time a copy takes before its first byte, hidden behind
    the copies already moving and paid where the engine has run dry (a weight copy issued then, each serial read).
    ``distinct[layer]``: experts fetched per layer (default: the expected number under uniform routing, rounded).
    Rows: lane, stream (weights, kv cache, serial, compute), what, layer, component, start_s, end_s. A first-order
    model of one chip, not a measurement."""
    items = _resolved(plan, chip, op_overhead_s, dma_issue_s, ici_latency_s, compute_s, load_bytes, bandwidth)
    return _walk(plan, items, distinct, dma_latency_s=dma_latency_s)[0]


def step_ends(plan, chip, distincts: list[dict[int, int] | None], **costs) -> list[float]:
    """When :func:`timeline`'s step ends (seconds) for each of ``distincts`` (experts fetched per layer), without
    recording its rows: the plan's items and their costs resolved once, the walks that follow float arithmetic
    (mk.timing.pace walks one plan for several counts)."""
    latency = costs.pop("dma_latency_s", 0.0)
    items = _resolved(plan, chip, **costs)
    return [_walk(plan, items, distinct, record=False, dma_latency_s=latency)[1] for distinct in distincts]


def _resolved(
    plan,
    chip,
    op_overhead_s=0.0,
    dma_issue_s=0.0,
    ici_latency_s=0.0,
    compute_s=None,
    load_bytes=None,
    bandwidth=None,
) -> list[tuple]:
    """The plan's items with their costs in seconds, as :func:`_walk` reads them: a Start (0, load, slot, layer,
    issue, transfer, load), a Wait (1, load), an op (2, slot, layer, serial read, KV read, bytes sent, link latency,
    wire time, compute, its last tile's share of it, overhead, op), a ReadAhead (3, layer, its tiles' time, its
    first tile's, op)."""
    chip = get_chip(chip)
    if bandwidth is None:
        raise ValueError(
            "a timeline needs the HBM read rate it charges (bytes/s a chip: mk.timing.bandwidth.read_rate)"
        )
    bw, flops = bandwidth, chip.bf16_flops / chip.chips
    compute_s = compute_s or (lambda op: op.flops / flops)
    load_bytes = load_bytes or (lambda ld: ld.nbytes)
    issue_s = dma_issue_s if callable(dma_issue_s) else (lambda ld: dma_issue_s)
    loads = {ld.id: ld for ld in plan.loads}
    items = []
    for it in plan.items:
        if isinstance(it, Start):
            ld = loads[it.load]
            items.append((0, it.load, ld.expert, ld.layer, issue_s(ld), load_bytes(ld) / bw, ld))
        elif isinstance(it, Wait):
            items.append((1, it.load))
        elif isinstance(it, ReadAhead):
            items.append((3, it.layer, it.ahead_bytes / bw, it.first_bytes / bw, it))
        else:
            c = compute_s(it)
            # a user's last tile is computed after it arrives (the next user's first tile is not read ahead): its share
            # of the compute taken as the first tile's share of the bytes (the serial ones)
            tail = c * it.serial_bytes / (it.serial_bytes + it.kv_bytes) if it.kv_bytes else 0.0
            latency, wire = it.rounds * ici_latency_s, it.wire_bytes / chip.ici_bandwidth
            serial, kv = it.serial_bytes / bw, it.kv_bytes / bw
            items.append((2, it.expert, it.layer, serial, kv, it.sent_bytes, latency, wire, c, tail, op_overhead_s, it))
    return items


def _walk(plan, items, distinct=None, record=True, dma_latency_s=0.0) -> tuple[list[dict], float]:
    if distinct is None:
        n = round(sum(k * p for k, p in plan.distinct_experts.items()))
        distinct = {i: n for i in range(plan.share.num_layers)}
    rows = []

    def row(lane, stream, what, op_or_load, start, end):
        rows.append(
            dict(
                lane=lane,
                stream=stream,
                what=what,
                layer=op_or_load.layer,
                component=op_or_load.component,
                start_s=start,
                end_s=end,
            )
        )

    dma_free, compute_free, issued_at, arrive, ahead = 0.0, 0.0, 0.0, {}, {}
    for it in items:
        if it[0] == 0:
            _, load, slot, layer, issue, transfer, ld = it
            if slot is not None and slot >= distinct[layer]:  # expert slot j runs only when more than j were routed
                continue
            issued_at += issue  # the core issuing the DMA
            # (conditionals, not max(): this loop runs once an item, hundreds of thousands a full-size step)
            compute_free = issued_at if issued_at > compute_free else compute_free
            first = issued_at + dma_latency_s  # its first byte, if the engine is free by then
            s = first if first > dma_free else dma_free
            dma_free = s + transfer
            arrive[load] = dma_free
            if record:
                row("dma", "weights", ld.tensor, ld, s, dma_free)
        elif it[0] == 1:
            if it[1] in arrive:
                a = arrive[it[1]]
                compute_free = a if a > compute_free else compute_free
        elif it[0] == 3:  # a layer's first KV tiles into the queue, not waited for here
            _, layer, moved, first_s, op = it
            first = compute_free + dma_latency_s
            ks = first if first > dma_free else dma_free
            dma_free = ks + moved
            ahead[layer] = (ks + first_s, dma_free, first_s, moved - first_s)
            if record:
                row("dma", "kv cache", f"{op.kind} {op.layer}", op, ks, dma_free)
        else:
            _, slot, layer, serial, kv, sent, latency, wire, c, tail, overhead, op = it
            if slot is not None and slot >= distinct[layer]:  # its tile (same slot) was not fetched either
                continue
            s, streamed = compute_free, 0.0
            if ahead and layer in ahead and op.kind == "Attend":  # its first tiles were read ahead: wait for one
                first_at, streamed, first_s, rest_s = ahead.pop(layer)
                serial, kv = max(0.0, serial - first_s), max(0.0, kv - rest_s)
                s = first_at if first_at > s else s
            if serial:  # read while compute waits
                first = s + dma_latency_s
                ks = first if first > dma_free else dma_free
                dma_free = s = ks + serial
                if record:
                    row("dma (serial)", "serial", f"{op.kind} {op.layer}", op, ks, dma_free)
            if kv:  # double-buffered tiles: each tile's compute runs while the next one streams
                ks = s if s > dma_free else dma_free
                dma_free = ks + kv
                streamed = dma_free if dma_free > streamed else streamed
                if record:
                    row("dma", "kv cache", f"{op.kind} {op.layer}", op, ks, dma_free)
            if sent:  # what crosses the links waits for the whole cache read
                s = streamed if streamed > s else s
                e = s + latency + wire
                if record:
                    row("ici", "collective", f"{op.kind} {op.layer}", op, s, e)
                s = e
            done, streamed_done = s + c, streamed + tail
            compute_free = (streamed_done if streamed_done > done else done) + overhead
            issued_at = compute_free  # the next Start is issued after this op
            if record:
                row("compute", "compute", op.kind, op, s, compute_free)
    return rows, max(dma_free, compute_free)


def memory_busy_fraction(rows: list[dict]) -> float:
    """Share of the modelled step during which the DMA engine is moving bytes."""
    end = max(r["end_s"] for r in rows)
    return sum(r["end_s"] - r["start_s"] for r in rows if r["lane"].startswith("dma")) / end
