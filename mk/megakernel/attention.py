"""Decode attention inside the kernel: q/k/v norms and RoPE at each user's own position, then, per
user, an online softmax over the KV cache read in double-buffered tiles, and the new K/V written back
to the cache in HBM.

The new token's K/V seed the softmax (they are in VMEM already); cache tiles are read only up to the
tile holding the user's position, and a slot counts only where the position it holds (position p lives in slot
p mod the layer's slots, as in mk.reference) is before the user's and, on a sliding layer, inside its window.
Scores scaled by the model's score scale (folded into q: 1 for Gemma 4, 1/sqrt(head_dim) for the pre-norm
families), no softcap. gpt-oss: q/k/v biases added before RoPE, YaRN's factor on cos and sin, each head's sink logit
in its softmax's denominator (attention on every chip: heads split over chips are refused for it).

Heads narrower than 128 lanes share 128-lane groups (mk.plan.layout.head_groups): q, k, v and the cache hold a group's
heads side by side, and a group's KV heads are read with one product per tile, each query row holding its head in its
KV head's lanes and zeros elsewhere (:class:`QueryRows`), so no lane of the cache is read for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..config import SLIDING, YarnScaling
from ..plan import BLOCK, LANE, group_width, head_groups, heads_a_group, heads_lanes, kv_tiles_read, round_up
from ..sharding import first_kv_head
from . import mxu
from .collective import exchange_in_group
from .dense import NEG, rms
from .refs import POSITION


def head_at(head: int, w: int) -> tuple[slice, int]:
    """The lanes of the group holding head ``head`` of heads ``w`` lanes wide (mk.plan.layout.head_groups), and the
    head's first lane in the group."""
    W = group_width(w)
    group, lane = divmod(head * w, W)
    return slice(group * W, (group + 1) * W), lane


def moved(x, lane: int, to: int, w: int):
    """``x`` [rows, group lanes] with its head of ``w`` lanes at ``lane`` moved to lane ``to``, every other lane
    zero (a head as wide as the group: ``x`` itself)."""
    W = x.shape[-1]
    if w == W:
        return x
    if lane != to:
        x = pltpu.roll(x, (to - lane) % W, 1)
    at = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    return jnp.where((at >= to) & (at < to + w), x, 0.0)


def gathered_group(j: int, heads: int, w: int, head):
    """Group ``j`` of ``heads`` heads of ``w`` lanes: (its lanes, its value), head ``h`` taken from ``head(h)`` -> (x
    [rows, group lanes] holding it, its first lane in x)."""
    W, n = group_width(w), heads_a_group(w)
    parts = [moved(*head(h), (h % n) * w, w) for h in range(j * n, min(heads, (j + 1) * n))]
    return slice(j * W, (j + 1) * W), sum(parts[1:], parts[0])


def gathered_groups(heads: int, w: int, head):
    """Every group of ``heads`` heads of ``w`` lanes (``gathered_group``), one at a time."""
    for j in range(head_groups(heads, w)):
        yield gathered_group(j, heads, w, head)


def group_cols(heads: int, w: int) -> list[slice]:
    """The lanes of each group ``heads`` heads of ``w`` lanes take."""
    W = group_width(w)
    return [slice(j * W, (j + 1) * W) for j in range(head_groups(heads, w))]


def head_rms(x, eps, weight, on: bool, n: int, hd: int):
    """``rms`` of each head of a group ``x`` [rows, group lanes] of heads ``hd`` lanes wide, ``n`` of them a head's
    own: a product with a block-diagonal of ones gives each lane its head's sum of squares."""
    W = x.shape[-1]
    if hd == W or not on:
        return rms(x, eps, weight, on, n)
    same = jax.lax.broadcasted_iota(jnp.int32, (W, W), 0) // hd == jax.lax.broadcasted_iota(jnp.int32, (W, W), 1) // hd
    y = x * jax.lax.rsqrt(mxu.dot(x * x, same.astype(jnp.float32), dtype=jnp.float32) / n + eps)
    return y if weight is None else y * weight


def rope(x, cos, sin, sign, hd: int | None = None):
    """Rotate-half RoPE on each head of ``x [rows, lanes]`` (heads ``hd`` lanes wide, default one head): x*cos +
    [-x2, x1]*sin, a lane roll by half a head; where heads share the lanes, a head's first half takes the lanes half
    a head on (a second roll, picked by ``sign``)."""
    W = x.shape[-1]
    if hd is None or hd == W:
        return x * cos + pltpu.roll(x, W // 2, 1) * sign * sin
    turned = jnp.where(sign < 0, pltpu.roll(x, W - hd // 2, 1), pltpu.roll(x, hd // 2, 1))
    return x * cos + turned * sign * sin


def rope_tables(k, t: str, hd: int):
    """cos, sin [rows, group lanes] at each user's position (the layer type's frequencies in each head of the group;
    YaRN's attention factor on both, as mk.blocks.rope) and the rotate-half's sign [1, group lanes]."""
    layout, s = k.layout, k.scratch
    W = group_width(hd)
    inv = s.inv_freq[0:1, :W] if t == SLIDING else s.inv_freq[1:2, :W]
    pos = s.users_vmem[:, POSITION : POSITION + 1].astype(jnp.float32)  # [rows, 1]
    ang = pos * inv
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    if isinstance(layout.rope_scaling, YarnScaling):  # YaRN's attention factor on cos and sin (mk.blocks.rope)
        factor = jnp.float32(layout.rope_scaling.attention_scale)
        cos, sin = cos * factor, sin * factor
    lane = jax.lax.broadcasted_iota(jnp.int32, (1, W), 1)
    sign = jnp.where((lane % hd if hd < W else lane) < hd // 2, -1.0, 1.0).astype(jnp.float32)
    return cos, sin, sign


def emit_qkv_norm_rope(k, op):
    """In place on the q, k, v activations of layer ``op.layer``: q/k norms (where the family has them) + RoPE at
    each user's position, v's weightless norm (Gemma 4; for K=V layers, v is the k projection before its norm).
    q is scaled by the model's score scale here, so the scores need none (MLA's: mk.megakernel.latent.emit_rope)."""
    layout, t, i, on = k.layout, op.layer_type, op.layer, k.norms_on
    hd, kv, nh, eps = layout.head_dim(t), layout.kv_heads(t), layout.num_heads, layout.rms_eps
    n = k.share.head_dim(t)  # the head's own dims (a padded head has zero lanes)
    s = k.scratch
    cos, sin, sign = rope_tables(k, t, hd)
    qk = layout.qk_norm
    W = group_width(hd)  # a group of heads at a time (their norms' weights in each head of it)
    qn, kn = (k.layer_vec(i, "q_norm", W), k.layer_vec(i, "k_norm", W)) if qk else (None, None)
    scale = k.share.score_scale(t)  # of the model's own head dim
    q, kr, vr = s.acts["q"], s.acts["k"], s.acts["v"]
    if layout.attention_bias:  # gpt-oss: the projections' biases (each head in its lanes, as their columns)
        for name, ref, heads in (("q", q, nh), ("k", kr, kv), ("v", vr, kv)):
            width = heads_lanes(heads, hd)
            ref[:, :width] = ref[:, :width] + k.layer_vec(i, f"{name}_bias", width)
    for c in group_cols(nh, hd):
        qh = rope(head_rms(q[:, c], eps, qn, on and qk, n, hd), cos, sin, sign, hd)
        q[:, c] = qh if scale == 1.0 else qh * jnp.float32(scale)
    for c in group_cols(kv, hd):
        kg = kr[:, c]
        vg = vr[:, c] if layout.has_v_proj(t) else kg
        vr[:, c] = head_rms(vg, eps, None, on and layout.v_norm, n, hd)
        kr[:, c] = rope(head_rms(kg, eps, kn, on and qk, n, hd), cos, sin, sign, hd)


def tile_copies(kc, vc, buf, T: int, b, tix, slot):
    """The DMAs of user ``b``'s KV tile ``tix`` (``T`` slots of every head group here) into slot ``slot`` of the
    buffer."""
    src = pl.ds(pl.multiple_of(tix * T, T), T)
    return (
        pltpu.make_async_copy(kc.at[b, :, src, :], buf.k.at[slot], buf.sem.at[0, slot]),
        pltpu.make_async_copy(vc.at[b, :, src, :], buf.v.at[slot], buf.sem.at[1, slot]),
    )


def next_tile(kc, vc, buf, T: int, b, tix, n_tiles):
    """Start tile ``tix`` + 1 into the other slot (if there is one), wait for tile ``tix``; its slot."""
    slot = tix % 2

    @pl.when(tix + 1 < n_tiles)
    def _():
        for c in tile_copies(kc, vc, buf, T, b, tix + 1, 1 - slot):
            c.start()

    for c in tile_copies(kc, vc, buf, T, b, tix, slot):
        c.wait()
    return slot


def start_first_tiles(kc, vc, buf, T: int, b, n_tiles) -> None:
    """Start user ``b``'s tiles 0 and, where it reads two or more, 1 into both slots: the loop that reads them two
    ahead (:func:`wait_tile`, :func:`refill`) waits for them."""
    for c in tile_copies(kc, vc, buf, T, b, 0, 0):
        c.start()

    @pl.when(n_tiles > 1)
    def _():
        for c in tile_copies(kc, vc, buf, T, b, 1, 1):
            c.start()


def wait_tile(kc, vc, buf, T: int, b, tix):
    """Wait for tile ``tix``, started two ahead into slot ``tix % 2``; its slot."""
    slot = tix % 2
    for c in tile_copies(kc, vc, buf, T, b, tix, slot):
        c.wait()
    return slot


def refill(kc, vc, buf, T: int, b, tix, n_tiles) -> None:
    """Once tile ``tix`` is read, start tile ``tix`` + 2 (if there is one) into its slot."""

    @pl.when(tix + 2 < n_tiles)
    def _():
        for c in tile_copies(kc, vc, buf, T, b, tix + 2, tix % 2):
            c.start()


def start_user_tiles(kc, vc, buf, T: int, b, n_tiles, ahead: bool) -> None:
    """Start user ``b``'s first tiles where its loop starts: tile 0 (each tile then starts the next), or, read two
    ahead, tiles 0 and 1 (user 0's were started at the layer's start: :func:`emit_read_ahead`)."""
    if not ahead:
        for c in tile_copies(kc, vc, buf, T, b, 0, 0):
            c.start()
    elif b:
        start_first_tiles(kc, vc, buf, T, b, n_tiles)


def read_tile(kc, vc, buf, T: int, b, tix, n_tiles, ahead: bool, use):
    """Tile ``tix`` of user ``b``'s loop, its slot given to ``use`` once it has landed: the next tile started before
    the wait, or, read two ahead, the tile two on started into its slot once ``use`` has read it. ``use``'s result."""
    if not ahead:
        return use(next_tile(kc, vc, buf, T, b, tix, n_tiles))
    out = use(wait_tile(kc, vc, buf, T, b, tix))
    refill(kc, vc, buf, T, b, tix, n_tiles)  # the slot's tile is read: the one two ahead takes its place
    return out


def _cache_of(k, op):
    """Layer ``op``'s K and V cache, its type's KV buffer, tile and slots."""
    t = op.layer_type
    kc, vc = k.outputs.cache[f"{t}.k"].at[op.index], k.outputs.cache[f"{t}.v"].at[op.index]
    return kc, vc, k.scratch.kv[t], k.plan.kv_tile(t), k.plan.cache_len(t)


def emit_read_ahead(k, op):
    """User 0's first KV tiles of layer ``op`` started at the layer's start (mk.plan.ReadAhead): its attention waits for
    them where it reads them."""
    kc, vc, buf, T, S = _cache_of(k, op)
    start_first_tiles(kc, vc, buf, T, 0, kv_tiles_read(k.position(0), T, S, xp=jnp))


def _fold_tile(state, qg, kt, vt, valid, dtype):
    """One KV tile folded into an online softmax state (running max, sum, weighted values) of the query rows
    ``qg``: masked slots count for nothing, also in a state still empty (max NEG). ``dtype``: the cache's (its
    products' precision, mk.megakernel.mxu)."""
    s = mxu.dot(qg, kt, mxu.ROWS_BY_ROWS, dtype)
    return fold_scores(state, s, vt, valid, dtype)


def fold_scores(state, s, vt, valid, dtype):
    """A tile's scores ``s`` [rows, T] and values ``vt`` [T, width] folded into an online softmax state (``dtype``:
    the cache's)."""
    m, l, acc = state
    s = jnp.where(valid, s, NEG)
    m2 = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    p = jnp.where(valid, jnp.exp(s - m2), 0.0)
    alpha = jnp.exp(m - m2)
    return (
        m2,
        l * alpha + jnp.sum(p, axis=1, keepdims=True),
        acc * alpha + mxu.dot(p, vt, dtype=dtype),
    )


def sees(s_idx, pos, slots: int, window: int | None, ahead=0):
    """Whether a query at ``pos + ahead`` reads slot ``s_idx`` of a cache of ``slots`` (position p in slot
    p % slots) that holds the positions before ``pos``: the slot's newest position before ``pos``
    (mk.reference.held_positions) is written and, on a sliding layer, inside the query's window. The remainder's
    operand is never negative (``s_idx < slots``)."""
    held = (pos - 1) - jax.lax.rem(pos - 1 - s_idx + slots, slots)
    return (held >= 0) if window is None else (held >= 0) & (held > pos + ahead - window)


def start_write_back(buf, kc, vc, knew, vnew, b, slot, groups: int, row=None) -> list:
    """User ``b``'s new K/V (``groups`` head groups; row ``row`` of ``knew``/``vnew``, default ``b``) into ``slot`` of
    its cache: a DMA may not cut a (16, 128) bf16 tile, so the aligned block of BLOCK slots around it is read, its row
    set, and written back; the writes to wait for. K and V may differ in width (MLA's latent and RoPE key)."""
    row = b if row is None else row
    blk = pl.ds(pl.multiple_of(slot // BLOCK * BLOCK, BLOCK), BLOCK)
    pairs = ((buf.stage_k, kc, knew), (buf.stage_v, vc, vnew))
    widths = dict.fromkeys(stage.shape[-1] for stage, _, _ in pairs)
    at = {hd: jax.lax.broadcasted_iota(jnp.int32, (BLOCK, hd), 0) == slot % BLOCK for hd in widths}
    reads = [
        pltpu.make_async_copy(cache.at[b, :, blk, :], stage.at[b], buf.stage_sem.at[n, b])
        for n, (stage, cache, _) in enumerate(pairs)
    ]
    for c in reads:
        c.start()
    for c in reads:
        c.wait()
    writes = []
    for n, (stage, cache, new) in enumerate(pairs):
        W = stage.shape[-1]
        for g in range(groups):
            block = stage[b, g].astype(jnp.float32)
            stage[b, g] = jnp.where(at[W], new[row : row + 1, g * W : (g + 1) * W], block).astype(stage.dtype)
        w = pltpu.make_async_copy(stage.at[b], cache.at[b, :, blk, :], buf.stage_sem.at[n, b])
        w.start()
        writes.append(w)
    return writes


def emit_attend(k, op):
    """attn[b, heads] for every user b, reading layer ``op.layer``'s cache in tiles; writes the new K/V (MLA's:
    mk.megakernel.latent.emit_attend)."""
    if op.positions_shared > 1:
        return emit_attend_shared(k, op)
    if op.users_split:
        return emit_attend_users(k, op)
    a, t = k.scratch.acts, op.layer_type
    heads = (k.layout.kv_heads(t), k.layout.num_heads)
    _attend(k, op, k.plan.users, k.position, a["q"], a["k"], a["v"], a["attn"], *heads, k.plan.draft_tokens + 1,
            ahead=k.plan.tiles.kv_ahead)  # fmt: skip


@dataclass(frozen=True)
class QueryRows:
    """Where a user's query heads sit in the query block read against each head group of its cache (``nh`` query and
    ``kv`` KV heads of ``hd`` lanes, ``R`` rows a user): group j's KV heads' query heads, head-major, each its R rows,
    each in its KV head's lanes of the group and zeros elsewhere."""

    hd: int
    kv: int
    nh: int
    R: int

    @property
    def per(self) -> int:  # KV heads a group
        return heads_a_group(self.hd)

    @property
    def rep(self) -> int:  # query heads a KV head
        return self.nh // self.kv

    def rows(self, j: int) -> int:
        return min(self.per, self.kv - j * self.per) * self.rep * self.R

    def heads(self, j: int) -> range:
        """Group j's query heads."""
        return range(j * self.per * self.rep, min(self.kv, (j + 1) * self.per) * self.rep)

    def place(self, h: int) -> tuple[int, int, int]:
        """Query head h's group, its first row there, and its KV head's first lane in the group."""
        g = h // self.rep
        return g // self.per, ((g % self.per) * self.rep + h % self.rep) * self.R, (g % self.per) * self.hd

    def fill(self, qblk, q, first: int, j: int) -> None:
        """Group j's query rows of the user whose rows start at ``first`` of ``q``, into ``qblk[j]``."""
        for h in self.heads(j):
            _, row, lane = self.place(h)
            cols, at = head_at(h, self.hd)
            x = moved(q[first : first + self.R, cols], at, lane, self.hd)
            qblk[j, row : row + self.R, : group_width(self.hd)] = x


def _seeded(qg, k0, v0, causal, dtype):
    """A group's softmax state before the cache: the new token's K/V (one row a user), or the user's rows, each seeing
    itself and the rows before it (speculative verification)."""
    if k0.shape[0] == 1:
        m = jnp.sum(qg * k0, axis=1, keepdims=True)
        return m, jnp.ones_like(m), jnp.broadcast_to(v0, qg.shape)
    empty = jnp.full((qg.shape[0], 1), NEG, jnp.float32)
    return _fold_tile((empty, jnp.zeros_like(empty), jnp.zeros_like(qg)), qg, k0, v0, causal, dtype)


def _attend(k, op, users: int, position, q, knew, vnew, out, kv: int, nh: int, per_user: int = 1, ahead=False):
    """Attention for ``users`` users (their rows of ``q``, ``knew``, ``vnew`` and ``out``, ``nh`` query and ``kv``
    KV heads, and their caches' rows; ``position(row)`` the position of a row) over layer ``op.layer``'s cache, in
    tiles; writes the new K/V. ``per_user`` rows a user (speculative verification: its last token and drafts, at
    consecutive positions; row j sees the rows before it and itself, and the cache's positions before the first).
    A head group's KV heads are read together: each of their query heads' rows holds the head in its KV head's lanes
    and zeros elsewhere, so one product over the group's lanes gives every row its own head's scores. ``ahead``: the
    tiles are read two ahead, user 0's first ones started at the layer's start (:func:`emit_read_ahead`)."""
    layout, t = k.layout, op.layer_type
    hd = layout.head_dim(t)
    W, G, R = group_width(hd), head_groups(kv, hd), per_user
    qr = QueryRows(hd, kv, nh, R)
    rows = [qr.rows(j) for j in range(G)]
    kc, vc, buf, T, S = _cache_of(k, op)
    window = layout.sliding_window if t == SLIDING else None
    qblk = k.scratch.qblk
    draft = jax.lax.broadcasted_iota(jnp.int32, (max(rows), 1), 0) % R  # each query row's place among the user's
    causal = jax.lax.broadcasted_iota(jnp.int32, (max(rows), R), 1) <= draft

    writes = []
    for b in range(users):
        first = b * R
        pos = position(first)
        n_tiles = kv_tiles_read(pos, T, S, xp=jnp)
        start_user_tiles(kc, vc, buf, T, b, n_tiles, ahead)
        state = []
        for j in range(G):
            qr.fill(qblk, q, first, j)
            qg = qblk[j, : rows[j], :W]
            new = [x[first : first + R, j * W : (j + 1) * W] for x in (knew, vnew)]
            state.append(_seeded(qg, *new, _first(causal, rows[j]), buf.k.dtype))

        def body(tix, carry, b=b, pos=pos, n_tiles=n_tiles):
            def fold(slot):
                s_idx = tix * T + jax.lax.broadcasted_iota(jnp.int32, (1, T), 1)
                valid = sees(s_idx, pos, S, window, draft if R > 1 else 0)
                return tuple(
                    _fold_tile(carry[j], qblk[j, : rows[j], :W], buf.k[slot, j].astype(jnp.float32),
                               buf.v[slot, j].astype(jnp.float32), _first(valid, rows[j]), buf.k.dtype)
                    for j in range(G)
                )  # fmt: skip

            return read_tile(kc, vc, buf, T, b, tix, n_tiles, ahead, fold)

        state = jax.lax.fori_loop(0, n_tiles, body, tuple(state))
        _store_outputs(k, op, qr, state, out, first)
        # every read of this user's cache is done: write its rows' K/V back (one block at a time: a later row may
        # share the block of an earlier one)
        for j in range(R):
            if j:
                for w in writes[-2:]:
                    w.wait()
                writes = writes[:-2]
            writes += start_write_back(buf, kc, vc, knew, vnew, b, (pos + j) % S, G, row=first + j)
    for w in writes:
        w.wait()


def _store_outputs(k, op, qr: QueryRows, state, out, first: int) -> None:
    """Each group's softmax state finished (each head's sink logit in its denominator, where the family has them) and
    its query heads' outputs into ``out``'s rows from ``first``, a group of ``out``'s lanes as soon as its heads are
    done."""
    outs, stored, R = [], 0, qr.R

    def head_out(h):
        j, row, lane = qr.place(h)
        return outs[j][row : row + R], lane

    for j, (m, l, acc) in enumerate(state):
        if k.layout.sinks:  # each head's sink logit in the denominator only (mk.blocks.softmax_sinks)
            l = l + jnp.exp(_head_sinks(k, op.layer, qr.heads(j).start, qr.rows(j) // R, R) - m)
        outs.append(acc / l)
        while stored < head_groups(qr.nh, qr.hd) and min(qr.nh, (stored + 1) * qr.per) <= qr.heads(j).stop:
            cols, x = gathered_group(stored, qr.nh, qr.hd, head_out)
            out[first : first + R, cols] = x
            stored += 1


def _first(mask, rows: int):
    """A mask's first ``rows`` rows (one row, or as many, broadcasts as it is)."""
    return mask if mask.shape[0] in (1, rows) else mask[:rows]


def _head_sinks(k, layer, first: int, rep: int, R: int):
    """[rep * R, 1]: the sink logits of query heads ``first`` .. ``first + rep - 1``, each on its R rows (head-major,
    as the query rows of one KV head)."""
    width = round_up(k.layout.num_heads, LANE)
    sinks = k.layer_vec(layer, "sinks", width)  # [1, width]: one head a lane
    lane = jax.lax.broadcasted_iota(jnp.int32, (rep * R, width), 1)
    head = first + jax.lax.broadcasted_iota(jnp.int32, (rep * R, width), 0) // R
    return jnp.sum(jnp.where(lane == head, sinks, 0.0), axis=1, keepdims=True)


def emit_attend_users(k, op):
    """``emit_attend`` where chip c owns users c * u .. (c + 1) * u - 1 (u = B / C) and their caches of every KV
    head: each chip's q, k, v heads of an owner's users go to that owner (one exchange among all chips), which
    assembles their whole q, k, v (a KV head several chips hold comes from the first of them), attends for its users
    over every head and writes their K/V; each chip's heads' outputs for every user come back (a second exchange)."""
    layout, model, t, C = k.layout, k.plan.model, op.layer_type, k.plan.chips
    hd, nh, kv = layout.head_dim(t), layout.num_heads, layout.kv_heads(t)  # this chip's heads
    u = k.plan.cache_users
    qw, kw = heads_lanes(nh, hd), heads_lanes(kv, hd)
    x = k.scratch.kv[t].users
    a = k.scratch.acts
    # 1. each owner's users' q, k, v of this chip's heads, to the owner
    for owner in range(C):
        rows = slice(owner * u, (owner + 1) * u)
        x.stage_in[owner, :u, :qw] = a["q"][rows, :qw]
        x.stage_in[owner, :u, qw : qw + kw] = a["k"][rows, :kw]
        x.stage_in[owner, :u, qw + kw : qw + 2 * kw] = a["v"][rows, :kw]
    x.recv_in[k.chip_index] = x.stage_in[k.chip_index]
    exchange_in_group(k, C, lambda m: x.stage_in.at[m, pl.ds(0, u)], lambda m: x.recv_in.at[m, pl.ds(0, u)],
                      x.sems.at[0])  # fmt: skip
    held = {}  # KV head -> (the first chip holding it, its place among that chip's)
    for c in range(C):
        for j in range(kv):
            held.setdefault(first_kv_head(model, t, C, c) + j, (c, j))

    def sent(c: int, head: int, base: int = 0):  # chip c's head ``head`` of what it sent, from lane ``base``
        cols, lane = head_at(head, hd)
        return x.recv_in[c, :u, base + cols.start : base + cols.stop], lane

    # whole heads: chip c's query heads in order, each KV head from its first holder
    for cols, val in gathered_groups(model.num_heads, hd, lambda h: sent(*divmod(h, nh))):
        x.q[:u, cols] = val
    for part, base in ((x.k, qw), (x.v, qw + kw)):
        for cols, val in gathered_groups(model.kv_heads(t), hd, lambda h, base=base: sent(*held[h], base)):
            part[:u, cols] = val
    # 2. this chip's users over every head
    _attend(
        k, op, u, lambda b: k.position(k.chip_index * u + b), x.q, x.k, x.v, x.out, model.kv_heads(t), model.num_heads
    )

    # 3. each chip's heads' outputs for this chip's users, back to it
    def attended(h: int):
        cols, lane = head_at(h, hd)
        return x.out[:u, cols], lane

    for c in range(C):
        for cols, val in gathered_groups(nh, hd, lambda h, c=c: attended(c * nh + h)):
            x.stage_out[c, :u, cols] = val
    x.recv_out[k.chip_index] = x.stage_out[k.chip_index]
    exchange_in_group(k, C, lambda m: x.stage_out.at[m, pl.ds(0, u)], lambda m: x.recv_out.at[m, pl.ds(0, u)],
                      x.sems.at[1])  # fmt: skip
    for owner in range(C):
        a["attn"][owner * u : (owner + 1) * u, :qw] = x.recv_out[owner, :u]


def emit_attend_shared(k, op):
    """``emit_attend`` where g = ``op.positions_shared`` chips share this chip's KV head (consecutive chips; this one
    is member ``chip % g``): each holds every g-th block of ``BLOCK`` slots of it. The members' query heads are
    gathered here; this chip attends over its own blocks for all of them (an online softmax whose state starts
    empty where another member holds the new position); each head's partial state (running max, sum and weighted
    values) goes to its member, which merges the g states exactly as the online softmax merges tiles. Only the
    member holding a user's new slot writes its K/V."""
    layout, t, B, g = k.layout, op.layer_type, k.plan.batch, op.positions_shared
    hd, nh = layout.head_dim(t), layout.num_heads  # one KV head here, nh of its query heads on each member
    W = group_width(hd)  # the KV head at lane 0 of its group
    heads = g * nh
    T, S = k.plan.kv_tile(t), k.plan.cache_len(t)  # this chip's slots
    slots = S * g  # of the head
    window = layout.sliding_window if t == SLIDING else None
    kc, vc = k.outputs.cache[f"{t}.k"].at[op.index], k.outputs.cache[f"{t}.v"].at[op.index]
    buf, qblk, a = k.scratch.kv[t], k.scratch.qblk, k.scratch.acts
    q, knew, vnew, out = a["q"], a["k"], a["v"], a["attn"]
    me = k.chip_index % g
    width = heads_lanes(nh, hd)
    # 1. every member's query heads, here
    buf.q_all[me] = q[:, :width]
    exchange_in_group(k, g, lambda _: q.at[:, pl.ds(0, width)], lambda m: buf.q_all.at[m], buf.share_sem.at[0])

    lane = jax.lax.broadcasted_iota(jnp.int32, (nh, LANE), 1)
    for b in range(B):
        pos = k.position(b)
        slot_new = pos % slots  # in the head's slots
        owner = (slot_new // BLOCK) % g
        n_tiles = kv_tiles_read(pos, T, S, g, me, jnp)

        @pl.when(n_tiles > 0)
        def _(b=b):
            for c in tile_copies(kc, vc, buf, T, b, 0, 0):
                c.start()

        for h in range(heads):
            cols, at = head_at(h % nh, hd)
            qblk[0, h : h + 1, :W] = moved(buf.q_all[h // nh, b : b + 1, cols], at, 0, hd)
        qg = qblk[0, :, :W]
        seeded = owner == me  # the new token's K/V seed the softmax on the member that holds its slot
        weight = jnp.where(seeded, 1.0, 0.0)
        m = jnp.where(seeded, jnp.sum(qg * knew[b : b + 1, :W], axis=1, keepdims=True), NEG)
        state = (m, weight * jnp.ones_like(m), jnp.broadcast_to(weight * vnew[b : b + 1, :W], qg.shape))

        def body(tix, carry, b=b, pos=pos, n_tiles=n_tiles, qg=qg):
            slot = next_tile(kc, vc, buf, T, b, tix, n_tiles)
            local = tix * T + jax.lax.broadcasted_iota(jnp.int32, (1, T), 1)
            s_idx = (local // BLOCK * g + me) * BLOCK + local % BLOCK  # the head's slot each local slot holds
            valid = sees(s_idx, pos, slots, window)
            kt, vt = buf.k[slot, 0].astype(jnp.float32), buf.v[slot, 0].astype(jnp.float32)
            return _fold_tile(carry, qg, kt, vt, valid, buf.k.dtype)

        m, l, acc = jax.lax.fori_loop(0, n_tiles, body, state)
        for member in range(g):  # each member's heads' partial states, max and sum in lanes W and W + 1
            rows = slice(member * nh, (member + 1) * nh)
            buf.state[member, b, :, :W] = acc[rows]
            ml = jnp.where(lane == 0, m[rows], jnp.where(lane == 1, l[rows], 0.0))
            buf.state[member, b, :, W : W + LANE] = ml

        # every read of this user's cache here is done: its holder writes the new position back
        @pl.when(seeded)
        def _(b=b, slot_new=slot_new):
            at = slot_new // BLOCK // g * BLOCK + slot_new % BLOCK  # its slot among this member's
            for w in start_write_back(buf, kc, vc, knew, vnew, b, at, 1):
                w.wait()

    # 2. each head's partial states to its member; merged here, for this chip's heads
    buf.state_in[me] = buf.state[me]
    exchange_in_group(k, g, lambda m: buf.state.at[m], lambda m: buf.state_in.at[m], buf.share_sem.at[1])
    sinks = _head_sinks(k, op.layer, 0, nh, 1) if layout.sinks else None  # this chip's heads'
    _merge_partial_states(buf, g, B, nh, hd, out, sinks)


def _merge_partial_states(buf, g: int, batch: int, nh: int, hd: int, out, sinks=None) -> None:
    """Each user's ``g`` members' partial softmax states of this chip's ``nh`` heads (weighted values in a group's W
    lanes, then max and sum in lanes W and W + 1) merged exactly as the online softmax merges tiles, each head's sink
    logit (``sinks`` [nh, 1], where the family has them) in the merged denominator once; the heads' outputs into
    ``out``."""
    W = group_width(hd)
    for b in range(batch):
        parts = [buf.state_in[member, b] for member in range(g)]  # [nh, W + LANE] each
        top = parts[0][:, W : W + 1]
        for x in parts[1:]:
            top = jnp.maximum(top, x[:, W : W + 1])
        total, acc = jnp.zeros_like(top), jnp.zeros((nh, W), jnp.float32)
        for x in parts:
            w = jnp.exp(x[:, W : W + 1] - top)
            total, acc = total + w * x[:, W + 1 : W + 2], acc + w * x[:, :W]
        if sinks is not None:
            total = total + jnp.exp(sinks - top)
        o = acc / total  # each head's output at lane 0
        for cols, val in gathered_groups(nh, hd, lambda h, o=o: (o[h : h + 1], 0)):
            out[b : b + 1, cols] = val
