"""The VMEM buffers of the kernel's cross-chip exchanges, as shapes (f32 unless named): what the plan's VMEM budget
counts (mk.plan.vmem) and what the kernel allocates (mk.megakernel.refs), from one place.

- the all-reduce (mk.megakernel.collective), one set a payload item size: over one link a stage of this chip's
  partial sums, what each chip sent here (two, by parity) and, reduce-scattering, each chip's summed chunk; over a
  torus one such set a dimension, each cutting the last one's chunk;
- the greedy pick's gather of every chip's (or each dimension's members') best logit and its index;
- a layer type whose KV positions are shared by ``g`` chips: every sharer's queries, and their partial states out and
  in;
- attention split by users: each owner's users' q, k and v in, their outputs out, this chip's users' whole q, k, v.
"""

from __future__ import annotations

import math

from ..dtypes import ARRAY_DTYPES
from ..sharding import chunk_width
from ..units import LANE, round_up
from .layout import ROWS, group_width, heads_lanes
from .records import AllReduce

_PAYLOAD = {size: name for name, size in ARRAY_DTYPES.items()}  # an all-reduce's payload item size: its data type
_ITEMSIZE = dict(ARRAY_DTYPES, int32=4)  # and the greedy pick's indices


def all_reduce_buffers(plan) -> dict:
    """str(item size) -> the all-reduce's buffers for that payload, each (shape, dtype): over one link a dict of
    ``stage``, ``recv`` and ``gathered`` (None without reduce-scatter); over a torus a tuple of such dicts, one a
    dimension."""
    C, rows, width = plan.chips, plan.rows, plan.layout.hidden_size
    reduce_scatter, dims = plan.setup.collective.reduce_scatter, [g for g, _ in plan.setup.torus_groups]
    ops = [op for op in plan.ops if isinstance(op, AllReduce)]
    out = {}
    for itemsize in sorted({op.itemsize for op in ops}):
        n, dtype = max(len(op.acts) for op in ops if op.itemsize == itemsize), _PAYLOAD[itemsize]
        if dims:
            per, w = [], width
            for g in dims:
                w = chunk_width(w, g)
                shape = (2, g, n, rows, w)
                per.append(dict(stage=((n, rows, g * w), dtype), recv=(shape, dtype), gathered=(shape, dtype)))
            out[str(itemsize)] = tuple(per)
            continue
        chunk = chunk_width(width, C)
        out[str(itemsize)] = dict(
            stage=((n, rows, C * chunk if reduce_scatter else width), dtype),
            recv=((2, C, n, rows, chunk if reduce_scatter else width), dtype),
            gathered=((2, C, n, rows, chunk), dtype) if reduce_scatter else None,
        )
    return out


def best_shape(plan) -> tuple[int, ...]:
    """The greedy pick's best logits (f32) and their indices (int32), one row of lanes a chip: [C, rows, 128], or
    over a torus [dimensions, the largest dimension's chips, rows, 128]."""
    dims = [g for g, _ in plan.setup.torus_groups]
    return (len(dims), max(dims), plan.rows, LANE) if dims else (plan.chips, plan.rows, LANE)


def positions_shapes(plan, t: str) -> tuple[tuple[int, ...], ...]:
    """Where ``g`` > 1 chips share layer type ``t``'s positions of a KV head: every sharer's queries [g, rows, heads'
    lanes], and the partial states out and in [g, B, heads, group lanes + 128]; () otherwise."""
    g, cfg = plan.position_share(t), plan.layout
    if g == 1:
        return ()
    nh, hd = cfg.num_heads, cfg.head_dim(t)
    state = (g, plan.batch, nh, group_width(hd) + LANE)
    return (g, plan.rows, heads_lanes(nh, hd)), state, state


def users_shapes(plan, t: str) -> dict[str, tuple[int, ...]]:
    """Attention split by users, layer type ``t`` (mk.megakernel.refs.UsersSplit says what each holds)."""
    cfg, model, C = plan.layout, plan.model, plan.chips
    hd, heads, kv, rows = cfg.head_dim(t), cfg.num_heads, cfg.kv_heads(t), round_up(plan.cache_users, ROWS)
    width = heads_lanes(heads, hd) + 2 * heads_lanes(kv, hd)
    return dict(
        stage_in=(C, rows, width),
        recv_in=(C, rows, width),
        q=(rows, heads_lanes(model.num_heads, hd)),
        k=(rows, heads_lanes(model.kv_heads(t), hd)),
        v=(rows, heads_lanes(model.kv_heads(t), hd)),
        out=(rows, heads_lanes(model.num_heads, hd)),
        stage_out=(C, rows, heads_lanes(heads, hd)),
        recv_out=(C, rows, heads_lanes(heads, hd)),
    )


def exchange_bytes(plan) -> int:
    """Bytes of VMEM every cross-chip buffer above takes (0 on one chip)."""
    if plan.chips == 1:
        return 0
    sized = []
    for buffers in all_reduce_buffers(plan).values():
        for per in buffers if isinstance(buffers, tuple) else (buffers,):
            sized += [b for b in per.values() if b is not None]
    sized += [(best_shape(plan), "float32"), (best_shape(plan), "int32")]
    for t in sorted(set(plan.layout.layer_types)):
        sized += [(s, "float32") for s in positions_shapes(plan, t)]
        if plan.setup.users_split:
            sized += [(s, "float32") for s in users_shapes(plan, t).values()]
    return sum(math.prod(shape) * _ITEMSIZE[dtype] for shape, dtype in sized)
