"""Building the step plan: the weight tiles a decode step streams (``Load``) and its compute ops, in
order, from a config, a batch and the tile sizes; ``build_plan`` then schedules the DMAs (mk.plan.schedule).

Weights stream through VMEM buffers of ``Tiles.slots`` slots; tiles of one shape share a buffer. The
routed experts are emitted as ``min(B * k, E)`` expert slots: the kernel gathers the distinct experts
the batch routed to and runs slot j only when at least j + 1 distinct experts were picked, so the
plan's expected bytes use the expected number of distinct experts (exact under uniform routing).
"""

from __future__ import annotations

import math

import numpy as np

from ..config import ModelConfig
from ..dtypes import array_itemsize
from ..params import (
    EXPERTS,
    HEAD,
    NORMS,
    ROUTE_WAIT,
    ROUTER,
    SHARED_MLP,
    attention_component,
    param_specs,
    tile_rows_scaled,
)
from ..sharding import one_link_all_reduce, torus_all_reduce, torus_best, users_per_chip
from ..units import ceil_div, positive_int
from .flops import (
    attention_flops,
    attention_residual_flops,
    expert_combine_flops,
    ffn_residual_flops,
    gated_act_flops,
    head_tile_flops,
    latent_attention_flops,
    matmul_flops,
    norm_flops,
    qk_norm_rope_flops,
    route_flops,
)
from .layout import (
    BLOCK,
    LANE,
    NIBBLE_CHUNK,
    ROWS,
    format_scales_shape,
    group_width,
    heads_a_group,
    heads_lanes,
    latent_lanes,
    layout_config,
    layout_grid,
    packed_axis,
    padded_shape,
    round_up,
    scale_buffer,
    scales_shape,
    stacked,
    stored_shape,
    sublanes,
    type_index,
    vector_table_shape,
    whole_scales,
    widened_buffer,
)
from .records import (
    AllReduce,
    Attend,
    AttentionResidual,
    Buffer,
    Embed,
    EmitTokens,
    ExpertCombine,
    FfnResidual,
    FormatLoad,
    GatedAct,
    GatherBest,
    HeadTile,
    Load,
    MatmulMode,
    MatmulTile,
    NoHead,
    Norm,
    Op,
    Prologue,
    QKVNormRope,
    ReadAhead,
    Route,
    Tiles,
    format_scale_bytes,
    format_scales_buffer,
    scale_block_bytes,
    scale_lanes,
)


def even_width(total: int, other: int, itemsize: int, budget: int) -> int:
    """The widest multiple of 128 that divides ``total`` with other x width x itemsize <= budget."""
    units = total // LANE
    return (
        max(d for d in range(1, units + 1) if units % d == 0 and (d == 1 or other * d * LANE * itemsize <= budget))
        * LANE
    )


def spans(total: int, other: int, itemsize: int, budget: int) -> list[tuple[int, int]]:
    """Split ``total`` (a multiple of 128) into (start, size) tiles with other x width x itemsize <= budget:
    equal tiles (one loop in the kernel) if a multiple of 128 that divides ``total`` is at least half the
    widest that fits, else tiles of the widest with a narrower last one (it fills part of a slot)."""
    widest = max(1, min(total // LANE, budget // (other * LANE * itemsize))) * LANE
    even = even_width(total, other, itemsize, budget)
    width = even if 2 * even >= widest else widest
    return [(s, min(width, total - s)) for s in range(0, total, width)]


def head_spans(vocab: int, other: int, itemsize: int, budget: int, equal_share: float) -> list[tuple[int, int]]:
    """The head's (start, rows) tiles: equal tiles of the widest multiple of 128 rows dividing ``vocab`` (one loop in
    the kernel) while each is at least ``equal_share`` of ``budget`` (mk.plan.Tiles.head_equal_share); else tiles of
    the widest that fits with a narrower last one. A vocabulary whose lane count is prime (Qwen3's 151,936 rows:
    1,187 lanes; gpt-oss's 201,088: 1,571) divides only into 128-row tiles, which the chip reads past their bytes
    where Llama's 3 MiB tiles hide under them (the head's knock-outs in data/measured/tpu_knockouts.csv)."""
    even = even_width(vocab, other, itemsize, budget)
    if even * other * itemsize >= equal_share * budget or even == vocab:
        return [(r, even) for r in range(0, vocab, even)]
    widest = max(1, min(vocab // LANE, budget // (other * LANE * itemsize))) * LANE
    return [(r, min(widest, vocab - r)) for r in range(0, vocab, widest)]


def route_known(knockout, experts_held: int, layout: ModelConfig) -> bool:
    """Whether a step's routed experts are known before it runs: the route's wait knocked out with the router
    (mk.params.ROUTE_WAIT: every user takes experts 0..k-1, weight 1/k) on a chip that holds every expert (one chip,
    or each expert split over the chips). Then no expert's tile waits for a route (mk.plan.schedule), and the kernel
    names slot j's expert j without a table."""
    return ROUTE_WAIT in knockout and layout.is_moe and experts_held == layout.num_experts


def expert_slots(cfg: ModelConfig, batch: int, held: int | None = None) -> int:
    """Expert slots per layer: at most B x k distinct experts are routed, and never more than the
    ``held`` experts a chip holds (default all E)."""
    return min(batch * cfg.top_k, cfg.num_experts if held is None else held)


class Builder:
    """Appends loads and ops in step order; ``route_of[n]`` is the route op an expert op waits for.
    ``share`` is the part of the model one chip computes (mk.sharding.chip_config; the model itself on one chip),
    ``model`` the whole model; ``layout`` the share at the sizes the kernel lays out (the model's own sizes give the
    payload bytes)."""

    def __init__(
        self,
        request,  # mk.plan.step.PlanRequest: the step, its data types, tiles, knock-outs and kernel setup
        model: ModelConfig,  # laid out as the setup says (its FFN layout)
        share: ModelConfig,
        rows: int,  # the users' rows: with speculative verification each user's token and its drafts
        experts_held: int,
        split_heads: bool,
        quantized: frozenset,  # matrices streamed as INT8 codes with their scales (mk.quant), or as ``fmt``'s
        position_shares: dict[str, int],  # layer type -> chips sharing a KV head's positions
        fmt=None,  # the shipped format (mk.format_trees.Format) the ``quantized`` matrices stream in, or INT8
    ):
        self.fmt, self.quantized, self.position_shares = fmt, quantized, position_shares
        self.setup, self.experts_held, self.split_heads = request.setup, experts_held, split_heads
        self.model = model  # the whole model (its heads: each chip attends over all of them for its users)
        # speculative verification: each user's rows go through one weight pass and attend over the user's one cache
        self.rows_per_user = request.setup.draft_tokens + 1
        self.layout = layout_config(share)  # the shapes the kernel moves; the share's own for payload bytes
        self.batch, self.max_len, self.context = rows, request.max_len, request.context
        self.weight_itemsize = array_itemsize(request.weight_dtype)
        self.kv_itemsize = array_itemsize(request.kv_dtype)
        self.tiles, self.knockout = request.tiles, request.knockout
        self.route_known = route_known(self.knockout, experts_held, self.layout)
        self.specs = {s.path: s for s in param_specs(share)}
        self.shapes = {s.path: padded_shape(self.layout, s.path, s.shape) for s in param_specs(self.layout)}
        self.buffers: dict[str, Buffer] = {}
        self.loads: list[Load] = []
        self.ops: list[Op] = []
        self.route_of: dict[int, int] = {}
        self.acts: dict[str, tuple[int, int]] = {}
        self._slot_count: dict[str, int] = {}
        self._stacked: dict[str, tuple[str, int | None]] = {}  # tensor -> its HBM tensor and index (_stacked_of)
        self._route: int | None = None
        self._all_reduces = 0  # emitted so far: the next one's ``seq``

    def act(self, name: str, width: int) -> str:
        """An f32 VMEM activation of at least ``width`` lanes (users padded to 8 rows)."""
        self.acts[name] = (round_up(self.batch, ROWS), max(self.acts.get(name, (0, 0))[1], width))
        return name

    def all_reduce(self, layer: int, acts: list[str], itemsize: int) -> None:
        """Sum ``acts`` over the chips (nothing on one chip, or with nothing to sum)."""
        if not self.setup.sharded or not acts:
            return
        coll, width = self.setup.collective, self.layout.hidden_size
        # only the users' rows travel: whole rows of a packed (sublane) word, 1 in f32, 2 in bf16
        rows = min(round_up(self.batch, 4 // itemsize), round_up(self.batch, ROWS))
        if self.setup.torus:  # past one host: dimension by dimension over the slice's torus (mk.megakernel.collective)
            ex = torus_all_reduce(len(acts) * rows, width, itemsize, self.setup.torus)
        else:
            ex = one_link_all_reduce(coll, len(acts) * rows, width, self.setup.chips, itemsize)
        self.op(
            AllReduce(
                layer,
                "collectives",
                len(acts) * self.setup.chips * rows * width,  # the sum's adds
                acts=tuple(acts),
                rows=rows,
                width=width,
                itemsize=itemsize,
                seq=self._all_reduces,
                sent_bytes=ex.sent_bytes,
                rounds=ex.rounds,
                link_bytes=ex.link_bytes if self.setup.torus else 0,
            )
        )
        self._all_reduces += 1

    def op(self, op: Op) -> None:
        if getattr(op, "expert", None) is not None and not self.route_known:
            self.route_of[len(self.ops)] = self._route
        self.ops.append(op)

    def itemsize(self, tensor: str) -> int:
        """Bytes per element of ``tensor``'s tiles: 1 for INT8 codes, else the plan's weight item size."""
        return 1 if tensor in self.quantized else self.weight_itemsize

    def _stacked_of(self, tensor: str) -> tuple[str, int | None]:
        """mk.plan.layout.stacked's answer for ``tensor``, worked out once (a full-size step loads a tensor many
        times over)."""
        if tensor not in self._stacked:
            self._stacked[tensor] = stacked(self.layout, tensor)
        return self._stacked[tensor]

    def load(self, tensor, layer, component, rows, cols, expert=None, slot_shape=None) -> int:
        shape = (rows[1], cols[1])
        slot_shape = slot_shape or shape
        if self.fmt is not None and tensor in self.quantized:
            return self._format_load(tensor, layer, component, rows, cols, expert, slot_shape)
        scaled = tensor in self.quantized
        itemsize = self.itemsize(tensor)
        # tiles of one shape (and type) share a buffer (q, k, v, gate, up, expert gate/up are all [H, w]):
        # fewer buffers, less VMEM, and still the next tile of each shape in flight
        row_scales = scaled and tile_rows_scaled(self.layout, tensor)
        buffer = f"{slot_shape[0]}x{slot_shape[1]}" + ("i8" if scaled else "") + ("r" if row_scales else "")
        if buffer not in self.buffers:
            self.buffers[buffer] = Buffer(buffer, slot_shape, itemsize, self.tiles.slots, "int8" if scaled else None)
            if scaled:  # each slot's scales: the aligned f32 block holding its expert's (or matrix's) row of them
                sb = scale_buffer(buffer)
                lanes = scale_lanes(*slot_shape, row_scales)
                self.buffers[sb] = Buffer(sb, (ROWS, lanes), 4, self.tiles.slots, "float32")
        real_rows, real_cols = self._real_extent(tensor, rows, cols)
        payload = real_rows * real_cols * itemsize
        if row_scales:  # the scale block moves with every tile, its rows' scales real bytes once
            payload += real_rows * 4 if cols[0] == 0 else 0
        elif scaled:  # a matrix's column scales are real bytes once, however many row tiles it has
            payload += real_cols * 4 if rows[0] == 0 else 0
        name, index = self._stacked_of(tensor)
        ld = Load(
            len(self.loads),
            name,
            index,
            layer,
            component,
            buffer,
            self._next_slot(buffer),
            rows,
            cols,
            shape[0] * shape[1] * itemsize + (scale_block_bytes(*shape, row_scales) if scaled else 0),
            payload,
            expert,
            scaled,
            row_scales,
        )
        self.loads.append(ld)
        return ld.id

    def _next_slot(self, buffer: str) -> int:
        """The slot of ``buffer`` the next tile of its shape goes to: its tiles take the slots in turn."""
        n = self._slot_count.get(buffer, 0)
        self._slot_count[buffer] = n + 1
        return n % self.tiles.slots

    def _real_extent(self, tensor: str, rows: tuple[int, int], cols: tuple[int, int]) -> tuple[int, int]:
        """The rows and columns of a tile (``rows``, ``cols``: start and count in the layout) that hold weights of
        the unpadded matrix."""
        real = self.specs[tensor].shape[-2:]
        if self.layout.outputs_on_rows(tensor):
            real = real[::-1]
        return max(0, min(rows[1], real[0] - rows[0])), max(0, min(cols[1], real[1] - cols[0]))

    def _format_load(self, tensor, layer, component, rows, cols, expert, slot_shape) -> int:
        """A tile of a matrix in a shipped format: its codes, and the scales of its whole blocks (one that would
        split a block is refused by name)."""
        fmt = self.fmt
        grid = layout_grid(self.layout, tensor, fmt)
        align = list(grid)  # a tile starts at a block's edge, and a 4-bit one at a chunk's (NIBBLE_CHUNK)
        axis = packed_axis(fmt, grid)
        if axis is not None:
            align[axis] = max(align[axis], NIBBLE_CHUNK[axis])
        for (start, n), block, total, what in zip((rows, cols), align, self.shapes[tensor][-2:], ("rows", "columns")):
            if start % block or (n % block and start + n != total):
                raise ValueError(
                    f"a tile of {tensor}'s {what} {start}..{start + n} splits {fmt.name}'s blocks of {block}: "
                    "use tiles (mk.plan.Tiles) whose widths are multiples of the block"
                )
        codes = stored_shape(slot_shape, fmt, grid)
        whole = format_scales_shape(self.shapes[tensor][-2:], grid, fmt) if whole_scales(fmt) else None
        buffer = f"{codes[0]}x{codes[1]}{fmt.name}{grid[0]}.{grid[1]}"
        if buffer not in self.buffers:
            self.buffers[buffer] = Buffer(buffer, codes, 1, self.tiles.slots, np.dtype(fmt.codes).name)
            if fmt.nibbles:  # the tile widened to the compute dtype, a block at a time, before its matmul
                wide = widened_buffer(buffer)
                self.buffers[wide] = Buffer(wide, tuple(slot_shape), self.weight_itemsize, 1)
        own, slot = scales_shape((rows[1], cols[1]), grid), scales_shape(slot_shape, grid)
        narrower = own if whole is None and own != slot else None
        sb = format_scales_buffer(buffer, whole or narrower)
        if sb not in self.buffers:
            scales = whole or narrower or slot
            self.buffers[sb] = Buffer(sb, scales, fmt.scale_itemsize, self.tiles.slots, np.dtype(fmt.scales).name)
        real_rows, real_cols = self._real_extent(tensor, rows, cols)
        per_code = 0.5 if fmt.nibbles else 1
        payload = real_rows * real_cols * per_code + format_scale_bytes(real_rows, real_cols, grid, fmt.name)
        moved = int(rows[1] * cols[1] * per_code) + math.prod(whole or own) * fmt.scale_itemsize  # its DMAs' bytes
        name, index = self._stacked_of(tensor)
        ld = FormatLoad(
            len(self.loads), name, index, layer, component, buffer, self._next_slot(buffer), rows, cols, moved,
            int(payload), expert, fmt=fmt.name, grid=grid, matrix_scales=whole, tile_scales=narrower,
        )  # fmt: skip
        self.loads.append(ld)
        return ld.id

    # matmul helpers -----------------------------------------------------------------------------
    def project(self, tensor, layer, component, src, dst, mode: MatmulMode, expert=None, chip_rows=0):
        """dst = src @ W, W [K, N] streamed in tiles: column tiles (``COLS``: dst[:, c] = src @ W[:, c]) or row tiles
        summed into dst (``ROWS``; ``chip_rows``: W is the chip's block of that many rows, src all of them)."""
        k, n = self.shapes[tensor][-2:]
        on_cols = mode == MatmulMode.COLS
        split, other = (n, k) if on_cols else (k, n)
        sp = spans(split, other, self.itemsize(tensor), self.tiles.weight_tile_bytes)
        for start, width in sp:
            if on_cols:
                lid = self.load(tensor, layer, component, (0, k), (start, width), expert, (k, sp[0][1]))
                at = dict(dst_off=start)
            else:
                lid = self.load(tensor, layer, component, (start, width), (0, n), expert, (sp[0][1], n))
                at = dict(src_off=start, accumulate=start > 0, chip_rows=chip_rows)
            flops = matmul_flops(self.batch, *((k, width) if on_cols else (width, n)))
            self.op(MatmulTile(layer, component, flops, load=lid, src=src, dst=dst, mode=mode, n=width, expert=expert,
                               **at))  # fmt: skip

    def mlp(self, prefix, layer, component, src, dst, names, expert=None):
        """A gated MLP chunked over its (padded) intermediate: per chunk gate, up, act, down. With the
        intermediate on rows (ffn_layout "sublanes") a chunk is whole lanes of it but the last, which ends
        where the intermediate does (a multiple of 8): chunk offsets stay lane-aligned in the activations."""
        gate_w, up_w, down_w = (prefix + n for n in names)
        on_rows = self.layout.outputs_on_rows(gate_w)
        inter, h = self.shapes[gate_w][-2:] if on_rows else self.shapes[gate_w][-2:][::-1]
        sp = spans(round_up(inter, LANE), h, self.itemsize(gate_w), self.tiles.weight_tile_bytes)
        sp = [(c, min(tc, inter - c)) for c, tc in sp]
        w = sp[0][1]
        gate, up = self.act("gate", w), self.act("up", w)
        B = self.batch
        for c, tc in sp:
            for tensor, act_dst in ((gate_w, gate), (up_w, up)):
                if on_rows:
                    lid = self.load(tensor, layer, component, (c, tc), (0, h), expert, (w, h))
                else:
                    lid = self.load(tensor, layer, component, (0, h), (c, tc), expert, (h, w))
                mode = MatmulMode.COLS_T if on_rows else MatmulMode.COLS
                self.op(MatmulTile(layer, component, matmul_flops(B, h, tc), load=lid, src=src, dst=act_dst, mode=mode,
                                   n=tc, expert=expert))  # fmt: skip
            biased = {}
            if self.layout.expert_bias and expert is not None:  # gpt-oss's: the chunk's gate and up biases
                biased = dict(off=c, index=type_index(self.layout, layer), layer_type=self.layout.layer_types[layer])
            self.op(GatedAct(layer, component, gated_act_flops(B, tc), src=gate, dst=up, n=tc, expert=expert, **biased))
            lid = self.load(down_w, layer, component, (c, tc), (0, h), expert, (w, h))
            self.op(MatmulTile(layer, component, matmul_flops(B, tc, h), load=lid, src=up, dst=dst,
                               mode=MatmulMode.ROWS, n=tc, accumulate=c > 0, expert=expert))  # fmt: skip

    # the step ---------------------------------------------------------------------------------
    def build(self):
        layout, B, H = self.layout, self.batch, self.layout.hidden_size
        for name in ("x", "xn", "attn_out", "ffn"):
            self.act(name, H)
        if layout.is_moe:
            self.act("moe", H)
        if layout.is_moe and layout.router == "gemma4":  # Gemma 4's experts and router read their own norms of x
            for name in ("x2", "rin"):
                self.act(name, H)
        vec_rows, vec_width = vector_table_shape(layout)
        self.op(Prologue(-1, NORMS, 0, serial_bytes=round_up(vec_rows, ROWS) * vec_width * 4))
        self.op(Embed(-1, HEAD, 0, serial_bytes=B * BLOCK * H * self.weight_itemsize))
        self.all_reduce(-1, ["x"], 4)  # each chip looked up the tokens in its vocabulary rows (exact in f32)
        for i, t in enumerate(layout.layer_types):
            self.layer(i, t)
        self.op(Norm(-1, NORMS, norm_flops(B, H), src="x", dst="xn", vector="final_norm"))
        # The head: its tiles (one loop, and a narrower last one where equal tiles would be small), each softcapped and
        # folded into the running argmax.
        if HEAD not in self.knockout:
            head = "embed" if layout.tied_embeddings else "head"  # [V, H] either way
            for r, n in head_spans(
                layout.vocab_size, H, self.weight_itemsize, self.tiles.head_tile_bytes, self.tiles.head_equal_share
            ):
                lid = self.load(head, -1, HEAD, (r, n), (0, H))
                self.op(HeadTile(-1, HEAD, head_tile_flops(B, n, H), load=lid, src="xn", row_off=r, n=n))
        else:
            self.op(NoHead(-1, HEAD, 0))
        if self.setup.sharded:
            C, block = self.setup.chips, 2 * ROWS * LANE * 4  # each chip's best value and its index
            if self.setup.torus:  # the best of each dimension's group in turn over the slice's torus
                ex = torus_best(block, self.setup.torus)
                best = GatherBest(-1, "collectives", C * ROWS * LANE, ex.sent_bytes, ex.rounds, ex.link_bytes)
            else:
                best = GatherBest(-1, "collectives", C * ROWS * LANE, sent_bytes=(C - 1) * block)
            self.op(best)
        self.op(EmitTokens(-1, HEAD, 0, serial_bytes=ROWS * LANE * 4))

    def attention(self, i: int, t: str):
        """Grouped-query attention: q, k, v projections, their norms and RoPE, attention over the KV cache."""
        layout, B, p = self.layout, self.batch, f"layers.{i}."
        hd, kv, nh = layout.head_dim(t), layout.kv_heads(t), layout.num_heads
        W = group_width(hd)  # the lanes attention's products take a head group (mk.plan.layout.head_groups)
        att = attention_component(t)
        q, k, v = (
            self.act("q", heads_lanes(nh, hd)),
            self.act("k", heads_lanes(kv, hd)),
            self.act("v", heads_lanes(kv, hd)),
        )
        positions = layout.cache_positions(t, self.context)
        T = min(self.tiles.kv_tile, round_up(positions, BLOCK))
        shared = self.position_shares.get(t, 1)  # chips that share this layer type's positions of a KV head
        per_pos = 2 * heads_lanes(kv, hd) * self.kv_itemsize  # K and V, whole head groups (this chip's own heads)
        if self.tiles.kv_ahead and shared == 1 and not self.setup.users_split:
            first, ahead = (per_pos * min(n, positions - 1) for n in (T, 2 * T))
            self.op(ReadAhead(i, att, 0, layer_type=t, index=type_index(layout, i), ahead_bytes=ahead,
                              first_bytes=first))  # fmt: skip
        self.project(p + "q", i, att, "xn", q, MatmulMode.COLS)
        self.project(p + "k", i, att, "xn", k, MatmulMode.COLS)
        if layout.has_v_proj(t):
            self.project(p + "v", i, att, "xn", v, MatmulMode.COLS)
        self.op(QKVNormRope(i, att, qk_norm_rope_flops(B, nh + 2 * kv, hd), layer_type=t))
        R = self.rows_per_user
        # whose caches, of how many query and KV heads, this chip attends over
        users, heads, cache_kv = users_per_chip(self.model, self.setup, B // R), nh, kv
        if shared > 1:  # this chip's share of the positions, for the chips' query heads: q in, partial states out
            positions, heads = ceil_div(positions, shared), shared * nh
            state = B * nh * (W + LANE) * 4  # each head's weighted values, running max and sum, f32, per user
            sent, rounds = (shared - 1) * (B * heads_lanes(nh, hd) * 4 + state), 2
        elif self.setup.users_split:  # this chip's users over every head: their q, k, v in, their outputs out
            C = self.setup.chips
            heads, cache_kv = self.model.num_heads, self.model.kv_heads(t)
            sent, rounds = (C - 1) * users * R * (2 * heads_lanes(nh, hd) + 2 * heads_lanes(kv, hd)) * 4, 2
        else:
            sent, rounds = 0, 0
        per_pos = 2 * heads_lanes(cache_kv, hd) * self.kv_itemsize  # K and V, whole head groups
        self.op(
            Attend(
                i,
                att,
                attention_flops(users * R, heads, W, positions),  # a group's products over all its lanes
                layer_type=t,
                index=type_index(layout, i),
                kv_bytes=users * per_pos * max(0, positions - 1 - T),
                serial_bytes=users * per_pos * (min(T, positions - 1) + BLOCK),
                query_rows=heads // cache_kv * min(heads_a_group(hd), cache_kv) * R,  # a head group's
                positions_shared=shared,
                users_split=self.setup.users_split,
                sent_bytes=sent,
                rounds=rounds,
            )
        )
        self.act("attn", heads_lanes(nh, hd))

    def latent_attention(self, i: int, t: str):
        """DeepSeek's MLA as the kernel decodes it (mk.megakernel.latent): the query through its bottleneck, the
        position's latent (normed) and RoPE key, then ``kv_b`` streamed once in tiles of whole heads (their key
        columns absorb the no-RoPE queries into the latent space, their value columns are kept for the output: the
        flops of both products), attention over the latent cache."""
        layout, B, p, mla = self.layout, self.batch, f"layers.{i}.", self.layout.latent_attention
        nh, att = layout.num_heads, attention_component(t)
        lat, rope = mla.kv_lora_rank, mla.qk_rope_head_dim
        D, Dr, Dv, L = latent_lanes(layout)
        q, kva = self.act("q", nh * (D + Dr)), self.act("kva", L + Dr)
        # split over the chips, the down-projections' row blocks give partial sums, summed before the latent's norm
        down = mla.down_rows
        mode = MatmulMode.ROWS if down else MatmulMode.COLS
        if mla.q_lora_rank:
            qa = self.act("qa", round_up(mla.q_lora_rank, LANE))
            self.project(p + "q_a", i, att, "xn", qa, mode, chip_rows=down)
        else:
            self.project(p + "q", i, att, "xn", q, MatmulMode.COLS)
        if down:
            self.project(p + "kv_a", i, att, "xn", kva, mode, chip_rows=down)
            self.all_reduce(i, ["qa", kva] if mla.q_lora_rank else [kva], self.setup.collective.payload_itemsize())
        if mla.q_lora_rank:
            r = mla.q_lora_rank
            self.op(Norm(i, NORMS, norm_flops(B, r), src=qa, dst=qa, vector="q_a_norm", width=r))
            self.project(p + "q_b", i, att, qa, q, MatmulMode.COLS)
        if not down:
            self.project(p + "kv_a", i, att, "xn", kva, MatmulMode.COLS)
        self.act("latent", L)
        self.act("rope_k", Dr)
        self.op(QKVNormRope(i, att, norm_flops(B, lat) + qk_norm_rope_flops(B, nh + 1, rope), layer_type=t))
        w, qlat = D + Dv, self.act("qlat", nh * L)
        budget = self.tiles.weight_tile_bytes // (L * w * self.itemsize(p + "kv_b"))
        per = max([n for n in range(1, nh + 1) if nh % n == 0 and n <= budget] or [1])
        for h in range(0, nh, per):
            lid = self.load(p + "kv_b", i, att, (0, L), (h * w, per * w))
            flops = matmul_flops(B, lat, per * (mla.qk_nope_head_dim + mla.v_head_dim))
            self.op(MatmulTile(i, att, flops, load=lid, src=q, dst=qlat, mode=MatmulMode.ABSORB, dst_off=h * w,
                               n=per * w))  # fmt: skip
        positions = layout.cache_positions(t, self.context)
        T = min(self.tiles.kv_tile, round_up(positions, BLOCK))
        per_pos = (lat + rope) * self.kv_itemsize  # one latent and one RoPE key a position, read by every head
        self.op(
            Attend(
                i,
                att,
                latent_attention_flops(B, nh, lat, rope, positions),
                layer_type=t,
                index=type_index(layout, i),
                kv_bytes=B * per_pos * max(0, positions - 1 - T),
                serial_bytes=B * per_pos * (min(T, positions - 1) + BLOCK),
                query_rows=nh,  # every head reads the one latent
            )
        )
        self.act("olat", nh * L)
        self.act("attn", nh * Dv)

    def layer(self, i: int, t: str):
        layout, B, p = self.layout, self.batch, f"layers.{i}."
        H = layout.hidden_size
        att = attention_component(t)
        if att not in self.knockout:
            self.op(Norm(i, NORMS, norm_flops(B, H), src="x", dst="xn", vector="input_norm"))
            if layout.latent_attention is not None:
                self.latent_attention(i, t)
            else:
                self.attention(i, t)
            self.project(p + "o", i, att, "attn", "attn_out", MatmulMode.ROWS)
            if self.split_heads:  # each chip computed its heads' share of the output projection
                self.all_reduce(i, ["attn_out"], self.setup.collective.payload_itemsize())
        self.op(AttentionResidual(i, NORMS, attention_residual_flops(B, H), attention_on=att not in self.knockout))
        # Gemma 4's router and experts read their own norms of x; a pre-norm family's the FFN's input, xn
        rin, x2 = ("rin", "x2") if layout.router == "gemma4" else ("xn", "xn")
        moe = layout.is_moe_layer(i)  # an MoE model's dense first layers (DeepSeek-V3) route to none
        if moe:
            E = self.shapes[p + "router_proj"][1]
            self.act("router", E)
            if ROUTER not in self.knockout:
                self.project(p + "router_proj", i, ROUTER, rin, "router", MatmulMode.COLS)
            self._route = len(self.ops)
            # with the router knocked out, Route only sets the fixed experts 0..k-1 (and, with the route's wait knocked
            # out too where the chip holds them all, lists nothing: they are known before the step, route_known)
            self.op(
                Route(
                    i,
                    ROUTER,
                    0 if ROUTER in self.knockout else route_flops(B, E, layout.top_k),
                    router_on=ROUTER not in self.knockout,
                    serial_bytes=0 if self.route_known else 2 * ROWS * E * 4,
                    **(dict(index=type_index(layout, i), layer_type=t) if layout.expert_bias else {}),
                )
            )
        shared = layout.mlp_width(i) > 0 and SHARED_MLP not in self.knockout
        if shared:
            self.mlp(p, i, SHARED_MLP, "xn", "ffn", ("mlp_gate", "mlp_up", "mlp_down"))
        if moe and EXPERTS not in self.knockout:
            self.act("eo", H)
            for j in range(expert_slots(layout, B, self.experts_held)):
                self.mlp(p, i, EXPERTS, x2, "eo", ("expert_gate", "expert_up", "expert_down"), expert=j)
                biased = dict(index=type_index(layout, i), layer_type=t) if layout.expert_bias else {}
                self.op(ExpertCombine(i, EXPERTS, expert_combine_flops(B, H), expert=j, **biased))
        partial_sums = [a for a, on in (("ffn", shared), ("moe", moe and EXPERTS not in self.knockout)) if on]
        self.all_reduce(i, partial_sums, self.setup.collective.payload_itemsize())
        self.op(
            FfnResidual(i, NORMS, ffn_residual_flops(B, H), **({} if moe or not layout.is_moe else dict(routed=False)))
        )


def check_shapes(cfg: ModelConfig, batch: int, max_len: int, context: int, kv_itemsize: int, tiles: Tiles):
    positive_int("batch", batch)
    positive_int("max_len", max_len)
    if not 0 < context <= max_len:
        raise ValueError(f"context={context} must be in 1..max_len={max_len}")
    if tiles.kv_tile % sublanes(kv_itemsize):
        raise ValueError(
            f"kv_tile={tiles.kv_tile} cuts a ({sublanes(kv_itemsize)}, 128) tile of a "
            f"{kv_itemsize}-byte KV cache; use a multiple of {sublanes(kv_itemsize)}"
        )
