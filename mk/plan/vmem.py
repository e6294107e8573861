"""The VMEM budget of a step plan: every buffer the kernel allocates, by use, checked against a chip."""

from __future__ import annotations

import math

from ..chips import get_chip
from ..dtypes import array_itemsize
from ..units import LANE, MIB, round_up
from .exchanges import exchange_bytes
from .layout import (
    BLOCK,
    ROWS,
    freq_width,
    group_width,
    head_groups,
    heads_a_group,
    latent_lanes,
    vector_table_shape,
)

VREG_BYTES = 64 * 4096  # a TensorCore's vector register file: 64 registers of 8 x 128 x 4 bytes


def vmem_breakdown(plan, with_logits: bool = False) -> dict[str, int]:
    """Bytes of VMEM the kernel allocates, by use (weight buffers, KV tiles, activations, ...);
    ``with_logits``: the kernel also writes the logits (a staging buffer for them)."""
    cfg, r = plan.layout, plan.rows
    types = set(cfg.layer_types)
    # K and V tiles, double-buffered, all KV heads of one user: each layer type its own. The compiler's figure is
    # the kernel's scratch and a little (libtpu 0.0.42.1, v5e and v6e: the tiny presets, one and 8 to 64 chips;
    # gemma4's full-size sliding and full pair), with no f32 copy of a tile beside it
    kv = sum(_kv_tiles(plan, t) for t in types)
    # each layer type's new K and V blocks for every user, staged for their write-back (the compiler counts both)
    stage = sum(_staging(plan, t) for t in types)
    vec_rows, vec_width = vector_table_shape(cfg)
    ep = round_up(max(cfg.num_experts, 1), LANE)
    rows = max(cfg.num_heads // cfg.kv_heads(t) * min(heads_a_group(cfg.head_dim(t)), cfg.kv_heads(t)) for t in types)
    hd = freq_width(cfg)
    out = {
        "weight buffers": sum(b.nbytes for b in plan.buffers.values()),
        "kv tiles": kv,
        "new k/v staging": stage,
        "activations": sum(a * b * 4 for a, b in plan.activations.values()),
        "query block": max(_groups(cfg, t) for t in types) * round_up(rows, ROWS) * hd * 4,
        "norm and scale vectors": round_up(vec_rows, ROWS) * vec_width * 4 + ROWS * hd * 4,
        "embedding rows": plan.batch * BLOCK * cfg.hidden_size * plan.weight_itemsize,
        "routing": r * ep * 4 * 2 + r * LANE * 4,
        "greedy pick and users": 3 * r * LANE * 4,
        "logits staging": 2 * plan.batch * ROWS * plan.head_tile * 4 if with_logits else 0,
        "cross-chip buffers": exchange_bytes(plan),
        "expert biases": _expert_bias_bytes(plan),
    }
    if cfg.latent_attention is not None:
        out.update(_latent_vmem(plan))
    return out


def _expert_bias_bytes(plan) -> int:
    buffer = plan.expert_bias_buffer
    return 0 if buffer is None else math.prod(buffer[0]) * array_itemsize(buffer[1])


def _groups(cfg, t: str) -> int:
    """Groups of 128 lanes the layer type's KV heads take (mk.plan.layout.head_groups)."""
    return head_groups(cfg.kv_heads(t), cfg.head_dim(t))


def _lanes(cfg, t: str) -> int:
    return group_width(cfg.head_dim(t))


def _kv_tiles(plan, t: str) -> int:
    """The layer type's K and V tiles, double-buffered, all KV heads of one user."""
    cfg = plan.layout
    return 2 * 2 * _groups(cfg, t) * plan.kv_tile(t) * _lanes(cfg, t) * plan.kv_itemsize


def _staging(plan, t: str) -> int:
    """The layer type's new K and V blocks for every user, staged for their write-back."""
    cfg = plan.layout
    return 2 * plan.batch * _groups(cfg, t) * BLOCK * _lanes(cfg, t) * plan.kv_itemsize


def _latent_vmem(plan) -> dict[str, int]:
    """MLA's (mk.megakernel.refs.LatentScratch): latent and RoPE-key tiles, their write-back blocks, one user's
    queries in the latent space, and the layer's kv_b value columns kept for the output."""
    cfg = plan.layout
    _, Dr, Dv, L = latent_lanes(cfg)
    T = plan.kv_tile(cfg.layer_types[0])
    return {
        "kv tiles": 2 * T * (L + Dr) * plan.kv_itemsize,
        "new k/v staging": plan.cache_users * BLOCK * (L + Dr) * plan.kv_itemsize,
        "query block": round_up(cfg.num_heads, ROWS) * (L + Dr) * 4,
        "kv_b value columns": L * cfg.num_heads * Dv * plan.weight_itemsize,
    }


def check_vmem(plan, chip) -> int:
    """Raise if the plan's VMEM does not fit one core of ``chip`` (a Chip or a name)."""
    chip = get_chip(chip)
    if chip.vmem_bytes != chip.vmem_bytes:  # NaN: not checked for this chip
        raise ValueError(
            f"{chip.name} has no checked VMEM size in data/chips.csv; check it with the "
            "AOT compiler (mk.tpu) before budgeting a kernel for it"
        )
    need = plan.vmem_bytes
    if need > chip.vmem_bytes:
        parts = ", ".join(f"{k} {v / MIB:.1f}" for k, v in plan.vmem_breakdown().items())
        raise ValueError(
            f"the step plan for {plan.share.name} (batch {plan.batch}, max_len {plan.max_len}) needs "
            f"{need / MIB:.1f} MiB of VMEM ({parts} MiB) but {chip.name} has {chip.vmem_bytes / MIB:.0f} MiB "
            f"per core ({chip.source}); lower Tiles.weight_tile_bytes (now {plan.tiles.weight_tile_bytes}) "
            f"or Tiles.kv_tile (now {plan.tiles.kv_tile}), or the batch"
        )
    return need


def vmem_limit(plan, chip) -> int:
    """The VMEM limit the compiler is given for ``plan`` on ``chip``: a compile setting, not a count. The plan's
    budget is checked to fit; the limit is :func:`_limit_basis` plus a quarter and 8 MiB of headroom for Mosaic's own
    scratch, at most the core's VMEM, and never below the budget. libtpu schedules the same kernel differently under
    another limit (the write-up's v5e-8 step took about a tenth more bundles under one 5 MiB larger), so the limit
    stays the one data/schedule's stored schedules were compiled under; changing it means compiling them again
    (``python -m mk schedule --refresh``)."""
    chip = get_chip(chip)
    need = check_vmem(plan, chip)
    basis = _limit_basis(plan)
    return int(min(chip.vmem_bytes, max(need, basis + basis // 4 + 8 * MIB)))


def _limit_basis(plan) -> int:
    """The budget :func:`vmem_limit` is taken from: the plan's VMEM as it was counted when the stored schedules were
    compiled. It differs from the count in four ways: the larger layer type's KV tiles and write-back staging in place
    of every type's, an f32 copy of the largest K or V tile (of the latent tile, MLA's) where it passes the vector
    registers, no cross-chip buffers, and no block for experts' biases."""
    cfg, types = plan.layout, set(plan.layout.layer_types)
    parts = vmem_breakdown(plan)
    parts["cross-chip buffers"] = parts["expert biases"] = 0
    if cfg.latent_attention is None:
        parts["kv tiles"] = max(_kv_tiles(plan, t) for t in types)
        parts["new k/v staging"] = max(_staging(plan, t) for t in types)
        upcast = max(_groups(cfg, t) * plan.kv_tile(t) * _lanes(cfg, t) * 4 for t in types)
    else:
        _, Dr, _, L = latent_lanes(cfg)
        upcast = plan.kv_tile(cfg.layer_types[0]) * (L + Dr) * 4
    return sum(parts.values()) + (upcast if upcast > VREG_BYTES else 0)
