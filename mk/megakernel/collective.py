"""The cross-chip ops inside the kernel, over remote DMAs with semaphores (the switches: mk.kernel_setup.Collective;
the peers and bytes: mk.sharding.links): a barrier at kernel start, the all-reduce of partial sums, the gather of every
chip's running argmax, and the exchange within a group of chips that share a KV head's
positions (mk.megakernel.attention).

Every chip waits for what it receives and for its own sends before it goes on, and sums the chips'
partials in chip order, so all chips hold the same activations after every all-reduce. Receive buffers
and receive semaphores alternate between successive all-reduces (``AllReduce.seq``): a chip that has
finished one all-reduce may already send the next into a chip still waiting for this one, and its bytes
must neither land in the buffer being summed nor count towards the wait for this one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..plan import LANE
from ..sharding import chunk_width


def _peers(k):
    """(d, the chip d steps ahead of this one, the chip d steps behind): who I send to and hear from."""
    C, me = k.plan.chips, k.chip_index
    return [(d, (me + d) % C, (me - d) % C) for d in range(1, C)]


def _sem(k, i: int) -> int:
    """Where peer (or step) ``i``'s semaphore sits on a semaphore array's last axis: its own, or the one all peers
    share past mk.kernel_setup.PEER_SEMAPHORE_CHIPS (a DMA semaphore counts bytes, so a wait for one peer's copy
    is met by any peer's copy of the same size, and the waits for all of them by all of them)."""
    return i if k.plan.setup.peer_semaphores > 1 else 0


def _device(k, chip):
    return {k.plan.setup.axis: chip}


def barrier(k):
    """No chip writes into another's VMEM before that chip has entered the kernel (none to wait for where one chip
    stands in for the slice: KernelSetup.loopback)."""
    if k.plan.setup.loopback:
        return
    sem = pltpu.get_barrier_semaphore()
    for _, peer, _ in _peers(k):
        pl.semaphore_signal(sem, 1, device_id=_device(k, peer), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_wait(sem, k.plan.chips - 1)


def _round(k, sends, receives):
    """One round of remote copies: every send ``(src, dst on the peer, send semaphore, the peer's receive semaphore,
    peer)`` started, then every receive ``(the sender's src, what it sends this chip, dst here, its send semaphore,
    receive semaphore)`` waited for, then every send.

    Where one chip stands in for the slice (KernelSetup.loopback) each receive is a local copy of what the sender
    would send, taken from this chip's own buffers, into the same buffer on the same semaphore: the chip's own work,
    and a local DMA of the same bytes where the links would be. Its values are those of a slice whose chips all hold
    this chip's weights and inputs."""
    if k.plan.setup.loopback:
        local = [pltpu.make_async_copy(sent, dst, recv) for _, sent, dst, _, recv in receives]
        for c in local:
            c.start()
        for c in local:
            c.wait()
        return
    started = []
    for src, dst, send, recv, peer in sends:
        c = pltpu.make_async_remote_copy(src, dst, send, recv, device_id=_device(k, peer))
        c.start()
        started.append(c)
    for src, _, dst, send, recv in receives:
        pltpu.make_async_remote_copy(src, dst, send, recv, device_id=_device(k, k.chip_index)).wait_recv()
    for c in started:
        c.wait_send()


def _exchange(k, src, dst_at, round_: int, parity, ex):
    """Send ``src`` (a ref, or ``src(peer)``) to every peer's ``dst_at(me)``; wait until every peer's
    has arrived here in ``dst_at(sender)`` and this chip's sends are done."""
    recv = ex.recv_sem.at[round_, parity]
    at = src if callable(src) else (lambda _: src)
    send_sem = ex.send_sem.at[round_]
    _round(
        k,
        [
            (at(peer), dst_at(k.chip_index), send_sem.at[_sem(k, d)], recv.at[_sem(k, k.chip_index)], peer)
            for d, peer, _ in _peers(k)
        ],
        [
            (at(sender), at(k.chip_index), dst_at(sender), send_sem.at[_sem(k, d)], recv.at[_sem(k, sender)])
            for d, _, sender in _peers(k)
        ],
    )


def exchange_in_group(k, g: int, src, dst_at, sems, stride: int = 1):
    """Within this chip's group of ``g`` chips ``stride`` apart (member ``chip // stride % g``; consecutive chips by
    default, a torus dimension's otherwise): send ``src(member)`` (a ref) to every other member's ``dst_at(my
    member)``; wait until every other member's has arrived here in ``dst_at(sender)`` and this chip's sends are done.
    ``sems``: DMA [2 (send, receive), g]."""
    _exchange_in_group(k, g, stride, [(src, dst_at, sems)])


def _exchange_in_group(k, g: int, stride: int, transfers):
    """``exchange_in_group`` of each (src, dst_at, sems) of ``transfers`` in one round: all their sends started,
    then all their arrivals waited for."""
    if stride == 1:  # (the one-host kernel's code, unchanged)
        me = k.chip_index % g
        base = k.chip_index - me
    else:
        me = _member(k, g, stride)
        base = k.chip_index - me * stride
    sends, receives = [], []
    for src, dst_at, sems in transfers:
        for d in range(1, g):
            peer, sender = (me + d) % g, (me - d) % g
            chip = base + peer if stride == 1 else base + peer * stride
            sends.append((src(peer), dst_at(me), sems.at[0, _sem(k, d)], sems.at[1, _sem(k, me)], chip))
            receives.append((src(sender), src(me), dst_at(sender), sems.at[0, _sem(k, d)], sems.at[1, _sem(k, sender)]))
    _round(k, sends, receives)


def _member(k, g: int, stride: int):
    """This chip's place in its group of ``g`` chips ``stride`` apart (a torus dimension's: KernelSetup.torus_groups,
    laid out so by mk.sharding.mesh.torus_order)."""
    return k.chip_index // stride % g


def _total(buf, j: int):
    """Partial ``j`` summed over ``buf`` [members, n, rows, width] in f32, in member order (the same on every chip)."""
    out = buf[0, j].astype(jnp.float32)
    for p in range(1, buf.shape[0]):
        out = out + buf[p, j].astype(jnp.float32)
    return out


def _rows(buf, n: int, R: int):
    """``m -> buf[m]``'s first ``n`` partials, their first ``R`` rows: what travels."""
    return lambda m: buf.at[m, pl.ds(0, n), pl.ds(0, R)]


def _chunks(stage, n: int, R: int, w: int):
    """``m -> chunk m`` (``w`` lanes) of ``stage``'s first ``n`` partials, their first ``R`` rows."""
    return lambda m: stage.at[pl.ds(0, n), pl.ds(0, R), pl.ds(pl.multiple_of(m * w, LANE), w)]


def _zero_past(stage, width: int) -> None:
    """Zeros in ``stage``'s lanes past ``width`` (the padding its chunks take)."""
    if stage.shape[2] > width:
        stage[:, :, width:] = jnp.zeros((stage.shape[0], stage.shape[1], stage.shape[2] - width), stage.dtype)


def _stage(stage, j: int, act, width: int) -> None:
    """Partial ``j`` of ``stage``: ``act``'s first ``width`` lanes (zeros past a narrower act's: MLA's down-projections'
    sums travel in the hidden size's lanes)."""
    w = min(width, act.shape[1])
    stage[j, :, :w] = act[:, :w].astype(stage.dtype)
    if w < width:
        stage[j, :, w:width] = jnp.zeros((stage.shape[1], width - w), stage.dtype)


def _first_best(values, ids, count: int):
    """The largest of ``values[0..count)`` and its index, the first holding it winning: strictly greater replaces
    (an equal maximum on a later chip is a later token)."""
    best, best_id = values[0], ids[0]
    for p in range(1, count):
        better = values[p] > best
        best, best_id = jnp.where(better, values[p], best), jnp.where(better, ids[p], best_id)
    return best, best_id


def emit_all_reduce(k, op):
    """Each of ``op.acts`` summed over the chips, in place (all to all, or reduce-scatter then all-gather)."""
    if k.plan.setup.torus:
        return _all_reduce_over_torus(k, op)
    ex = k.scratch.collective.exchange[str(op.itemsize)]
    acts, C, n, R = k.scratch.acts, k.plan.chips, len(op.acts), op.rows
    W = k.layout.hidden_size
    parity = op.seq % 2
    stage, recv = ex.stage, ex.recv.at[parity]
    # only rows < R travel; the rest of each buffer holds whatever it held, and is never kept
    mine = jax.lax.broadcasted_iota(jnp.int32, stage.shape[1:], 0) < R

    def keep(name, lo, hi, value):  # lanes lo:hi of the sum, within the act's own
        hi = min(hi, acts[name].shape[1])
        if lo < hi:
            part = value if value.shape[1] == hi - lo else value[:, : hi - lo]
            acts[name][:, lo:hi] = jnp.where(mine[:, : hi - lo], part, acts[name][:, lo:hi])

    for j, name in enumerate(op.acts):
        _stage(stage, j, acts[name], W)
    if not k.plan.setup.collective.reduce_scatter:
        for j in range(n):
            recv[k.chip_index, j] = stage[j]  # this chip's own partial, rounded as the others receive it
        _exchange(k, stage.at[pl.ds(0, n), pl.ds(0, R)], _rows(recv, n, R), 0, parity, ex)
        for j, name in enumerate(op.acts):
            keep(name, 0, W, _total(recv, j))
        return
    w = chunk_width(W, C)
    _zero_past(stage, W)
    chunk = _chunks(stage, n, R, w)
    own = pltpu.make_async_copy(
        chunk(k.chip_index), _rows(recv, n, R)(k.chip_index), ex.recv_sem.at[1, parity, _sem(k, k.chip_index)]
    )
    own.start()
    own.wait()
    # reduce-scatter: chip c receives chunk c of every chip's partial and sums it
    _exchange(k, chunk, _rows(recv, n, R), 0, parity, ex)
    gathered = ex.gathered.at[parity]
    for j in range(n):
        gathered[k.chip_index, j] = _total(recv, j).astype(gathered.dtype)
    # all-gather: every chip's summed chunk to every chip
    _exchange(k, _rows(gathered, n, R)(k.chip_index), _rows(gathered, n, R), 1, parity, ex)
    for j, name in enumerate(op.acts):
        for p in range(C):
            lo, hi = p * w, min((p + 1) * w, W)
            if lo < W:
                keep(name, lo, hi, gathered[p, j, :, : hi - lo].astype(jnp.float32))


def _all_reduce_over_torus(k, op):
    """``emit_all_reduce`` over a torus, one dimension at a time (mk.sharding.links.torus_all_reduce prices it):
    reduce-scatter along the first dimension (this chip keeps the sum of its group's chunk ``me``), then along the
    next over that chunk, and so on; then all-gather back in reverse. Each dimension's buffers and semaphores are
    its own, so a chip already a dimension further on never lands its bytes in one still being read."""
    exs, acts, n, R = k.scratch.collective.exchange[str(op.itemsize)], k.scratch.acts, len(op.acts), op.rows
    W, parity = k.layout.hidden_size, op.seq % 2
    mine = jax.lax.broadcasted_iota(jnp.int32, exs[0].stage.shape[1:], 0) < R  # only rows < R travel
    groups = [(g, stride, _member(k, g, stride), ex) for (g, stride), ex in zip(k.plan.setup.torus_groups, exs)]
    first = exs[0].stage
    for j, name in enumerate(op.acts):
        _stage(first, j, acts[name], W)
    _zero_past(first, W)
    # reduce-scatter, dimension by dimension
    for i, (g, stride, me, ex) in enumerate(groups):
        w, recv = ex.recv.shape[-1], ex.recv.at[parity]
        chunk = _chunks(ex.stage, n, R, w)
        own = pltpu.make_async_copy(chunk(me), _rows(recv, n, R)(me), ex.sems.at[1, parity, 1, _sem(k, me)])
        own.start()
        own.wait()
        exchange_in_group(k, g, chunk, _rows(recv, n, R), ex.sems.at[0, parity], stride)
        # this chunk's sum: what the next dimension cuts, or (the last) where the all-gather starts
        out = groups[i + 1][3].stage if i + 1 < len(groups) else None
        for j in range(n):
            if out is None:
                ex.gathered[parity, me, j] = _total(recv, j).astype(ex.gathered.dtype)
            else:
                out[j, :, :w] = _total(recv, j).astype(out.dtype)
        if out is not None:
            _zero_past(out, w)
    # all-gather, back through the dimensions: each member's summed chunk, then the chunk they make up together
    for i in reversed(range(len(groups))):
        g, stride, me, ex = groups[i]
        w, gathered = ex.recv.shape[-1], ex.gathered.at[parity]
        rows = _rows(gathered, n, R)
        exchange_in_group(k, g, lambda _, rows=rows, me=me: rows(me), rows, ex.sems.at[1, parity], stride)
        width = W if i == 0 else groups[i - 1][3].recv.shape[-1]
        for j, name in enumerate(op.acts):
            for p in range(g):
                # the first dimension's chunks land in the act's own lanes (a narrower act: its first ones)
                lo, hi = p * w, min((p + 1) * w, width if i else min(width, acts[name].shape[1]))
                if lo >= hi:
                    continue
                part = gathered[p, j, :, : hi - lo]
                if i == 0:
                    acts[name][:, lo:hi] = jnp.where(mine[:, : hi - lo], part.astype(jnp.float32), acts[name][:, lo:hi])
                else:
                    _, _, up_me, up = groups[i - 1]
                    up.gathered[parity, up_me, j, :, lo:hi] = part


def emit_gather_best(k, op):
    """The greedy pick over the whole vocabulary: every chip's (maximum, first index) gathered, the
    first chip holding the largest wins (chips hold the vocabulary in order)."""
    if k.plan.setup.torus:
        return _best_over_torus(k)
    s, coll = k.scratch, k.scratch.collective
    coll.best[k.chip_index] = s.best[...]
    coll.best_id[k.chip_index] = s.best_id[...]
    pairs = list(enumerate(((s.best, coll.best), (s.best_id, coll.best_id))))
    _round(
        k,
        [
            (
                mine,
                all_.at[k.chip_index],
                coll.sems.at[0, n, _sem(k, d)],
                coll.sems.at[1, n, _sem(k, k.chip_index)],
                peer,
            )
            for d, peer, _ in _peers(k)
            for n, (mine, all_) in pairs
        ],
        [
            (mine, mine, all_.at[sender], coll.sems.at[0, n, _sem(k, d)], coll.sems.at[1, n, _sem(k, sender)])
            for d, _, sender in _peers(k)
            for n, (mine, all_) in pairs
        ],
    )
    s.best[...], s.best_id[...] = _first_best(coll.best, coll.best_id, k.plan.chips)


def _best_over_torus(k):
    """``emit_gather_best`` over a torus: the best of this chip's group along each dimension in turn (the value and
    its index sent together: one round a dimension), the first member holding the largest winning; first dimension
    first, so the first chip of all holding it wins."""
    s, coll = k.scratch, k.scratch.collective
    for i, (g, stride) in enumerate(k.plan.setup.torus_groups):
        me = _member(k, g, stride)
        values, ids = coll.best.at[i], coll.best_id.at[i]
        values[me], ids[me] = s.best[...], s.best_id[...]
        _exchange_in_group(k, g, stride, [
            (lambda _: s.best, lambda m: values.at[m], coll.sems.at[i, 0]),
            (lambda _: s.best_id, lambda m: ids.at[m], coll.sems.at[i, 1]),
        ])  # fmt: skip
        s.best[...], s.best_id[...] = _first_best(values, ids, g)
