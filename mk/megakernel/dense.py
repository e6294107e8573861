"""Emitters of the ops around the matmuls: the prologue, the embedding lookup, RMSNorms, the weight
tiles' matmuls and the residual wiring of a layer."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..params import EXPERTS, NORMS, SHARED_MLP
from ..plan import BLOCK, LANE, MatmulMode
from . import mxu

NEG = -1e30  # a finite "minus infinity": exp(NEG - m) is exactly 0 and never NaN
SET, ADD = False, True


def rms(x, eps, w=None, on=True, n=None):
    """RMSNorm in float32, weight as a plain multiply (Gemma 4); ``on=False`` passes ``x`` through. ``n``:
    the vector's own width when ``x`` carries zero padding (the mean is over the real dims)."""
    if not on:
        return x
    ms = jnp.mean(x * x, axis=-1, keepdims=True) if n is None else jnp.sum(x * x, axis=-1, keepdims=True) / n
    y = x * jax.lax.rsqrt(ms + eps)
    return y if w is None else y * w


def emit_prologue(k, op):
    """Users block, vector table and RoPE frequencies in; the running argmax reset."""
    s = k.scratch
    copies = [
        pltpu.make_async_copy(src, dst, s.prologue_sem.at[n])
        for n, (src, dst) in enumerate(
            (
                (k.inputs.users, s.users),
                (k.inputs.users, s.users_vmem),
                (k.inputs.vectors, s.vectors),
                (k.inputs.inv_freq, s.inv_freq),
            )
        )
    ]
    for c in copies:
        c.start()
    for c in copies:
        c.wait()
    s.best[...] = jnp.full(s.best.shape, NEG, jnp.float32)
    s.best_id[...] = jnp.zeros(s.best_id.shape, jnp.int32)
    s.qblk[...] = jnp.zeros(s.qblk.shape, jnp.float32)
    if k.outputs.dma_counts is not None:
        for n in range(k.outputs.dma_counts.shape[1]):
            k.outputs.dma_counts[0, n] = 0


def emit_embed(k, op):
    """x = embed[token] (times sqrt(H) where the family scales it). A DMA may not cut a (16, 128) bf16 tile: fetch the
    aligned block of
    rows holding each user's token and pick the row out in VMEM. Over several chips each holds a range
    of the vocabulary: a token outside this chip's gives zeros (the all-reduce after it sums the rows)."""
    s, B, H = k.scratch, k.plan.batch, k.layout.hidden_size
    rows = k.layout.vocab_size
    local = [k.token(b) - k.vocab_base for b in range(B)]
    mine = [(t >= 0) & (t < rows) for t in local]
    toks = [jnp.clip(t, 0, rows - 1) for t in local]
    copies = [
        pltpu.make_async_copy(
            k.inputs.weights["embed"].at[pl.ds(pl.multiple_of(toks[b] // BLOCK * BLOCK, BLOCK), BLOCK), :],
            s.embed_rows.at[b],
            s.embed_sem.at[0],
        )
        for b in range(B)
    ]
    for c in copies:
        c.start()
    for c in copies:
        c.wait()
    # rounded as the reference does
    scale = float(np.asarray(k.share.hidden_size**0.5, s.embed_rows.dtype)) if k.layout.scale_embeddings else 1.0
    x = k.scratch.acts["x"]
    x[...] = jnp.zeros(x.shape, jnp.float32)
    row = jax.lax.broadcasted_iota(jnp.int32, (BLOCK, H), 0)
    for b in range(B):
        e = jnp.sum(
            jnp.where((row == toks[b] % BLOCK) & mine[b], s.embed_rows[b].astype(jnp.float32), 0.0),
            axis=0,
            keepdims=True,
        )
        x[b : b + 1, :] = (e * scale).astype(s.embed_rows.dtype).astype(jnp.float32)


def emit_norm(k, op):
    a = k.scratch.acts
    if op.width:  # over its own dims (MLA's query bottleneck)
        w = k.layer_vec(op.layer, op.vector, a[op.src].shape[1])
        a[op.dst][...] = rms(a[op.src][...], k.layout.rms_eps, w, k.norms_on, op.width)
        return
    final = isinstance(op.layer, int) and op.layer < 0  # the final norm (a layer's may be traced)
    w = k.vec(op.vector, k.layout.hidden_size) if final else k.layer_vec(op.layer, op.vector)
    a[op.dst][...] = rms(a[op.src][...], k.layout.rms_eps, w, k.norms_on, k.share.hidden_size)


def emit_matmul(k, op):
    """dst[:, off:+n] = src @ tile (COLS) or src @ tile.T (COLS_T), or dst (+)= src[:, off:+n] @ tile (ROWS)."""
    a = k.scratch.acts
    w = k.weight_tile()
    if op.mode in (MatmulMode.COLS, MatmulMode.COLS_T):
        x = a[op.src][...].astype(w.dtype)
        if op.mode == MatmulMode.COLS:
            y = mxu.dot(x, w)
        else:  # contract both on lanes: the tile's rows are output channels
            y = mxu.dot(x, w, mxu.ROWS_BY_ROWS)
        a[op.dst][:, pl.ds(op.dst_off, op.n)] = y
        return
    x = _chip_block(a[op.src], k.chip_index, op) if op.chip_rows else a[op.src][:, pl.ds(op.src_off, op.n)]
    y = mxu.dot(x.astype(w.dtype), w)
    dst = a[op.dst]
    if op.accumulate is ADD:
        dst[...] += y
    elif op.accumulate is SET:
        dst[...] = y
    else:  # in a loop: the first repeat sets, the others add
        pl.when(op.accumulate)(lambda: dst.__setitem__(Ellipsis, dst[...] + y))
        pl.when(jnp.logical_not(op.accumulate))(lambda: dst.__setitem__(Ellipsis, y))


def _chip_block(src, chip, op):
    """Lanes ``op.src_off:+op.n`` of chip ``chip``'s block of ``op.chip_rows`` lanes of ``src`` (zeros past the last
    block): the chip is traced, so each block is sliced where it lies and the chip's picked."""
    x = jnp.zeros((src.shape[0], op.n), src.dtype)
    for b in range(src.shape[1] // op.chip_rows):
        start = b * op.chip_rows + op.src_off  # traced in a loop over tiles (whole lanes)
        start = start if isinstance(start, int) else pl.multiple_of(start, LANE)
        x = jnp.where(chip == b, src[:, pl.ds(start, op.n)], x)
    return x


def emit_attention_residual(k, op):
    """x += attention's output (Gemma: normed first); the FFN's input norm xn, and Gemma 4's router and expert norms."""
    a, layout, i = k.scratch.acts, k.layout, op.layer
    norm = partial(rms, eps=layout.rms_eps, on=k.norms_on, n=k.share.hidden_size)
    x = a["x"][...]
    if op.attention_on:
        out = a["attn_out"][...]
        if layout.attention_bias:  # gpt-oss's o bias: once, after the heads' partial sums meet
            out = out + k.layer_vec(i, "o_bias")
        x = x + (norm(out, w=k.layer_vec(i, "post_attn_norm")) if layout.sandwich_norms else out)
        a["x"][...] = x
    a["xn"][...] = norm(x, w=k.layer_vec(i, "pre_ffn_norm"))
    if layout.is_moe and layout.router == "gemma4":
        a["x2"][...] = norm(x, w=k.layer_vec(i, "pre_ffn_norm_2"))
        a["rin"][...] = norm(x) * k.layer_vec(i, "router_scale") * jnp.float32(k.share.hidden_size**-0.5)


def emit_ffn_residual(k, op):
    """x += the FFN: Gemma's shared MLP and experts each normed, their sum normed, times the layer scalar; a pre-norm
    family's plain sum."""
    a, layout, i, knockout = k.scratch.acts, k.layout, op.layer, k.plan.knockout
    norm = partial(rms, eps=layout.rms_eps, on=k.norms_on, n=k.share.hidden_size)
    x = a["x"][...]
    h = a["ffn"][...] if layout.has_shared_mlp and SHARED_MLP not in knockout else jnp.zeros_like(x)
    if not layout.sandwich_norms:
        if layout.is_moe and op.routed and EXPERTS not in knockout:  # an MoE model's dense layer routes to none
            h = h + a["moe"][...]
        a["x"][...] = x + h
        return
    if layout.is_moe:
        m = a["moe"][...] if EXPERTS not in knockout else jnp.zeros_like(x)
        h = norm(h, w=k.layer_vec(i, "post_ffn_norm_1")) + norm(m, w=k.layer_vec(i, "post_ffn_norm_2"))
    x = x + norm(h, w=k.layer_vec(i, "post_ffn_norm"))
    if NORMS not in knockout:
        x = x * k.layer_vec(i, "layer_scalar")
    a["x"][...] = x
