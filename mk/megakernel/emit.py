"""The emit function of each op kind of the step plan (mk.plan.records): one table, and MLA's own for its RoPE,
attention over the latent cache and absorbed matmuls (mk.megakernel.latent)."""

from __future__ import annotations

from ..config import ModelConfig
from ..plan import (
    AllReduce,
    Attend,
    AttentionResidual,
    Embed,
    EmitTokens,
    ExpertCombine,
    FfnResidual,
    GatedAct,
    GatherBest,
    HeadTile,
    MatmulMode,
    MatmulTile,
    NoHead,
    Norm,
    Prologue,
    QKVNormRope,
    ReadAhead,
    Route,
)
from . import attention, collective, dense, head, latent, moe

# One emit function per op kind: adding a kind means its record (mk.plan.records), an entry here, a test.
EMIT = {
    Prologue: dense.emit_prologue,
    Embed: dense.emit_embed,
    Norm: dense.emit_norm,
    MatmulTile: dense.emit_matmul,
    QKVNormRope: attention.emit_qkv_norm_rope,
    Attend: attention.emit_attend,
    ReadAhead: attention.emit_read_ahead,
    AttentionResidual: dense.emit_attention_residual,
    Route: moe.emit_route,
    GatedAct: moe.emit_gated_act,
    ExpertCombine: moe.emit_expert_combine,
    FfnResidual: dense.emit_ffn_residual,
    HeadTile: head.emit_head_tile,
    NoHead: head.emit_no_head,
    EmitTokens: head.emit_tokens,
    AllReduce: collective.emit_all_reduce,
    GatherBest: collective.emit_gather_best,
}
LATENT_EMIT = {QKVNormRope: latent.emit_rope, Attend: latent.emit_attend}  # MLA's own (mk.megakernel.latent)


def emitter(layout: ModelConfig, item):
    """The emit function of ``item``: MLA's for its RoPE, attention and absorbed matmuls, else ``EMIT``'s."""
    if isinstance(item, MatmulTile) and item.mode == MatmulMode.ABSORB:
        return latent.emit_absorb
    return (
        LATENT_EMIT[type(item)]
        if layout.latent_attention is not None and type(item) in LATENT_EMIT
        else EMIT[type(item)]
    )
