"""The output head inside the kernel: softcapped logits tile by tile, folded into a running argmax per
user (the greedy pick), sent to HBM only when the caller asks for logits; then the step's output, each
user's token and next position."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..plan import LANE
from . import mxu
from .dense import NEG
from .refs import POSITION, TOKEN


def emit_head_tile(k, op):
    """y = softcap(xn @ tile.T) for vocabulary rows row_off..+n; best/best_id keep the first maximum."""
    s, layout = k.scratch, k.layout
    w = k.weight_tile()
    x = s.acts[op.src][...]
    y = mxu.dot(x.astype(w.dtype), w, mxu.ROWS_BY_ROWS)
    if layout.final_softcap:
        y = layout.final_softcap * jnp.tanh(y / layout.final_softcap)
    if k.outputs.logits is not None:
        send_logits(k, y, op.row_off, op.n)
    ids = k.vocab_base + op.row_off + jax.lax.broadcasted_iota(jnp.int32, y.shape, 1)
    if k.vocab != k.plan.chips * layout.vocab_size:  # padded vocabulary rows are no tokens
        y = jnp.where(ids < k.vocab, y, NEG)
    m = jnp.max(y, axis=1, keepdims=True)
    at = jnp.min(jnp.where(y == m, ids, jnp.iinfo(jnp.int32).max), axis=1, keepdims=True)
    better = m > s.best[...]  # strictly: an equal maximum in a later tile is not the first
    s.best[...] = jnp.where(better, m, s.best[...])
    s.best_id[...] = jnp.where(better, at, s.best_id[...])


def emit_no_head(k, op):
    """The head knocked out: every logit is zero, so every user's greedy pick is token 0."""
    k.scratch.best_id[...] = jnp.zeros(k.scratch.best_id.shape, jnp.int32)
    if k.outputs.logits is not None:
        for row_off, n in k.plan.head_spans:
            send_logits(k, jnp.zeros((k.plan.rows, n), jnp.float32), row_off, n)


def emit_tokens(k, op):
    """The next users block (lane 0 the greedy token, lane 1 the position + 1) to HBM."""
    s = k.scratch
    if k.outputs.logits is not None:
        drain_logits(k)
    lane = jax.lax.broadcasted_iota(jnp.int32, s.users_out.shape, 1)
    users = s.users_vmem[...]
    s.users_out[...] = jnp.where(lane == TOKEN, s.best_id[...], jnp.where(lane == POSITION, users + 1, users))
    copies = [pltpu.make_async_copy(s.users_out, k.outputs.users, s.out_sem.at[0])]
    if k.outputs.hidden is not None:  # with drafts: the rows' hidden states, for the assistant's next round
        copies.append(pltpu.make_async_copy(s.acts["xn"], k.outputs.hidden, s.out_sem.at[0]))
    for c in copies:
        c.start()
    for c in copies:
        c.wait()


def _logits_copy(k, row_off, n, b):
    """User ``b``'s logits of the ``n`` vocabulary rows from ``row_off`` (a head tile), from its stage to HBM; the
    stage's slot alternates tile by tile (every tile but a narrower last one is ``plan.head_tile`` rows)."""
    s, tv = k.scratch, k.plan.head_tile
    slot = row_off // tv % 2
    return pltpu.make_async_copy(
        s.logits_stage.at[slot, b, :, pl.ds(0, n)],
        k.outputs.logits.at[pl.ds(b, 1), pl.ds(pl.multiple_of(row_off, LANE), n)],
        s.logits_sem.at[slot],
    )


def send_logits(k, y, row_off, n):
    """Logits [rows, n] of the head tile from ``row_off`` to HBM through a double-buffered [1, head_tile] stage per
    user (a DMA may not cut a sublane tile); waits for the DMAs that used the stage two tiles ago (full tiles)."""
    stage, B, tv = k.scratch.logits_stage, k.plan.batch, k.plan.head_tile
    slot = row_off // tv % 2

    def wait_previous():
        for b in range(B):
            _logits_copy(k, row_off - 2 * tv, tv, b).wait()

    if isinstance(row_off, int):
        if row_off >= 2 * tv:
            wait_previous()
    else:
        pl.when(row_off >= 2 * tv)(wait_previous)
    for b in range(B):
        stage[slot, b, :, pl.ds(0, n)] = y[b : b + 1]
        _logits_copy(k, row_off, n, b).start()


def drain_logits(k):
    for row_off, n in k.plan.head_spans[-2:]:
        for b in range(k.plan.batch):
            _logits_copy(k, row_off, n, b).wait()
