"""The VMEM budget of a step plan: every buffer the kernel allocates, by use, checked against a chip."""

from __future__ import annotations

from ..chips import get_chip
from ..units import LANE, MIB, round_up
from .layout import (
    BLOCK,
    ROWS,
    VREG_BYTES,
    freq_width,
    group_width,
    head_groups,
    heads_a_group,
    latent_lanes,
    vector_table_shape,
)


def vmem_breakdown(plan, with_logits: bool = False) -> dict[str, int]:
    """Bytes of VMEM the kernel allocates, by use (weight buffers, KV tiles, activations, ...);
    ``with_logits``: the kernel also writes the logits (a staging buffer for them)."""
    cfg, r = plan.layout, plan.rows
    types = set(cfg.layer_types)
    # K and V tiles, double-buffered, all KV heads of one user; each layer type has its own, but the
    # compiler's VMEM figure counts only the larger type's (measured: full-size AOT, both models, v5e and
    # v6e, and the tiny presets), as if their lifetimes never overlap (they never do: one layer at a time)
    kv = max(2 * 2 * _groups(cfg, t) * plan.kv_tile(t) * _lanes(cfg, t) * plan.kv_itemsize for t in types)
    # Attention's f32 copy of one K (or V) tile, all KV heads: past the vector registers (64 x 4 KiB)
    # Mosaic keeps it in its own scratch. The compiler's VMEM figure exceeds the explicit buffers by
    # this and it grows with kv_tile (v5e/v6e AOT, full-size steps); tiny tiles stay in registers.
    upcast = max(_groups(cfg, t) * plan.kv_tile(t) * _lanes(cfg, t) * 4 for t in types)
    upcast = upcast if upcast > VREG_BYTES else 0
    stage = max(2 * plan.batch * _groups(cfg, t) * BLOCK * _lanes(cfg, t) * plan.kv_itemsize for t in types)
    vec_rows, vec_width = vector_table_shape(cfg)
    ep = round_up(max(cfg.num_experts, 1), LANE)
    rows = max(cfg.num_heads // cfg.kv_heads(t) * min(heads_a_group(cfg.head_dim(t)), cfg.kv_heads(t)) for t in types)
    hd = freq_width(cfg)
    out = {
        "weight buffers": sum(b.nbytes for b in plan.buffers.values()),
        "kv tiles": kv,
        "f32 k/v tile (compiler scratch)": upcast,
        "new k/v staging": stage,
        "activations": sum(a * b * 4 for a, b in plan.activations.values()),
        "query block": max(_groups(cfg, t) for t in types) * round_up(rows, ROWS) * hd * 4,
        "norm and scale vectors": round_up(vec_rows, ROWS) * vec_width * 4 + ROWS * hd * 4,
        "embedding rows": plan.batch * BLOCK * cfg.hidden_size * plan.weight_itemsize,
        "routing": r * ep * 4 * 2 + r * LANE * 4,
        "greedy pick and users": 3 * r * LANE * 4,
        "logits staging": 2 * plan.batch * ROWS * plan.head_tile * 4 if with_logits else 0,
    }
    if cfg.latent_attention is not None:
        out.update(_latent_vmem(plan))
    return out


def _groups(cfg, t: str) -> int:
    """Groups of 128 lanes the layer type's KV heads take (mk.plan.layout.head_groups)."""
    return head_groups(cfg.kv_heads(t), cfg.head_dim(t))


def _lanes(cfg, t: str) -> int:
    return group_width(cfg.head_dim(t))


def _latent_vmem(plan) -> dict[str, int]:
    """MLA's (mk.megakernel.refs.LatentScratch): latent and RoPE-key tiles, their write-back blocks, one user's
    queries in the latent space, and the layer's kv_b value columns kept for the output."""
    cfg = plan.layout
    _, Dr, Dv, L = latent_lanes(cfg)
    T = plan.kv_tile(cfg.layer_types[0])
    upcast = T * (L + Dr) * 4  # attention's f32 copy of a tile, as for K and V
    return {
        "kv tiles": 2 * T * (L + Dr) * plan.kv_itemsize,
        "f32 k/v tile (compiler scratch)": upcast if upcast > VREG_BYTES else 0,
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
    """The VMEM limit the compiler is given for ``plan`` on ``chip``: the plan's budget (checked to fit) plus a
    quarter and 8 MiB of headroom for Mosaic's own internal scratch, at most the core's VMEM."""
    chip = get_chip(chip)
    need = check_vmem(plan, chip)
    return int(min(chip.vmem_bytes, need + need // 4 + 8 * MIB))
