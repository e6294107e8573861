"""A modelled timeline of one step on one chip, read off the plan's records and their own costs."""

from __future__ import annotations

from collections.abc import Callable

from .records import Load, Op, Start, Wait


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
    the token ids out). A cross-chip op's ``sent_bytes`` leave over one link (its ``wire_bytes``: the busiest link's
    share where it spreads them over a torus) at the chip's ICI bandwidth plus ``ici_latency_s`` per round while
    compute waits (lane "ici"); the weight DMAs already issued go on meanwhile (an all-reduce without overlap has none
    issued: mk.plan.schedule). ``load_bytes(load)``: the bytes a weight DMA moves (default ``load.nbytes``; mk.timing
    scales it for narrower weight types). ``distinct[layer]``: experts fetched per layer (default: the expected number
    under uniform routing, rounded). Rows: lane, stream (weights, kv cache, serial, compute), what, layer, component,
    start_s, end_s. A first-order model of one chip, not a measurement."""
    return _walk(
        plan, chip, distinct, op_overhead_s, dma_issue_s, ici_latency_s, compute_s, load_bytes, True, bandwidth
    )[0]


def step_end(plan, chip, distinct: dict[int, int] | None = None, **costs) -> float:
    """When :func:`timeline`'s step ends (seconds), without recording its rows."""
    return _walk(plan, chip, distinct, record=False, **costs)[1]


def _walk(
    plan,
    chip,
    distinct=None,
    op_overhead_s=0.0,
    dma_issue_s=0.0,
    ici_latency_s=0.0,
    compute_s=None,
    load_bytes=None,
    record=True,
    bandwidth=None,
) -> tuple[list[dict], float]:
    from ..chips import get_chip

    chip = get_chip(chip) if isinstance(chip, str) else chip
    if bandwidth is None:
        raise ValueError(
            "a timeline needs the HBM read rate it charges (bytes/s a chip: mk.timing.bandwidth.read_rate)"
        )
    bw, flops = bandwidth, chip.bf16_flops / chip.chips
    compute_s = compute_s or (lambda op: op.flops / flops)
    load_bytes = load_bytes or (lambda ld: ld.nbytes)
    if distinct is None:
        n = round(sum(k * p for k, p in plan.distinct_experts.items()))
        distinct = {i: n for i in range(plan.cfg.num_layers)}
    loads = {ld.id: ld for ld in plan.loads}

    def fetched(slot, layer) -> bool:  # expert slot j runs only when more than j experts were routed
        return slot is None or slot < distinct[layer]

    rows = []

    def row(lane, stream, what, op_or_load, start, end):
        if record:
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

    dma_free, compute_free, issued_at, arrive = 0.0, 0.0, 0.0, {}
    for it in plan.items:
        if isinstance(it, Start):
            ld = loads[it.load]
            if not fetched(ld.expert, ld.layer):
                continue
            issued_at += dma_issue_s(ld) if callable(dma_issue_s) else dma_issue_s  # the core issuing the DMA
            compute_free = max(compute_free, issued_at)
            s = max(dma_free, issued_at)
            dma_free = s + load_bytes(ld) / bw
            arrive[it.load] = dma_free
            row("dma", "weights", ld.tensor, ld, s, dma_free)
        elif isinstance(it, Wait):
            if it.load in arrive:
                compute_free = max(compute_free, arrive[it.load])
        else:
            op: Op = it
            if not fetched(op.expert, op.layer):  # its tile (same slot) was not fetched either
                continue
            s, streamed = compute_free, 0.0
            for lane, stream, nbytes in (("dma (serial)", "serial", op.serial_bytes), ("dma", "kv cache", op.kv_bytes)):
                if nbytes:
                    ks = max(dma_free, s)
                    dma_free = ks + nbytes / bw
                    row(lane, stream, f"{op.kind} {op.layer}", op, ks, dma_free)
                    if stream == "serial":
                        s = max(s, dma_free)
                    else:  # double-buffered tiles: each tile's compute runs while the next one streams
                        streamed = dma_free
            if op.sent_bytes:  # what crosses the links waits for the whole cache read
                s = max(s, streamed)
                e = s + op.rounds * ici_latency_s + op.wire_bytes / chip.ici_bandwidth
                row("ici", "collective", f"{op.kind} {op.layer}", op, s, e)
                s = e
            c = compute_s(op)
            # a user's last tile is computed after it arrives (the next user's first tile is not read ahead): its share
            # of the compute taken as the first tile's share of the bytes (the serial ones)
            tail = c * op.serial_bytes / (op.serial_bytes + op.kv_bytes) if streamed else 0.0
            compute_free = max(s + c, streamed + tail) + op_overhead_s
            issued_at = compute_free  # the next Start is issued after this op
            row("compute", "compute", op.kind, op, s, compute_free)
    return rows, max(dma_free, compute_free)


def memory_busy_fraction(rows: list[dict]) -> float:
    """Share of the modelled step during which the DMA engine is moving bytes."""
    end = max(r["end_s"] for r in rows)
    return sum(r["end_s"] - r["start_s"] for r in rows if r["lane"].startswith("dma")) / end
