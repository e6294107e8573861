"""The step plan: one decode step as an ordered list of small records, built in Python.

A plan holds the weight tiles a step streams from HBM (``Load``), the compute it does (``Op``),
and, placed by a small offline scheduler, when each tile's DMA is issued (``Start``) and when the
compute waits for it (``Wait``). The megakernel's Python trace walks ``plan.items`` and emits
exactly that code, so the kernel and the plan cannot drift; tests and the timing model read the
same records for bytes, FLOPs and order. ``fold`` finds the regular runs among the records (the
tiles of one matrix, MLP chunks, routed expert slots, the head) and the kernel emits each as one
loop (``Loop``), so its code, and Mosaic's compile time, do not grow with the tiles.

Weights stream through per-role VMEM buffers with ``Tiles.slots`` slots each (two: double
buffering). A tile's DMA is issued as soon as its slot is free (the tile that used the slot
before has been computed on) and, for experts, as soon as routing has picked the expert. So
the next tiles are always in flight while the current one is computed on, across layer
boundaries, and expert tiles start right after the router.

TPU layout rules applied here: every weight tile's last two dims are multiples of (8, 128)
(16 sublanes in bf16); dims that are not multiples of 128 are padded (the MLP and expert
intermediates, e.g. 704 -> 768, and the expert count of the router); users pad to 8 rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .config import FULL, SLIDING, Gemma4Config
from .params import (EXPERTS, FULL_ATTENTION, HEAD, NORMS, ROUTER, SHARED_MLP, SLIDING_ATTENTION,
                     attention_component, check_knockout, param_specs)

LANE = 128
ROWS = 8  # users pad to one f32 sublane tile
BLOCK = 16  # rows a DMA moves at a dynamic offset: one bf16 sublane tile (embedding rows, new K/V)
MIB = 2 ** 20
VREG_BYTES = 64 * 4096  # a TensorCore's vector register file: 64 registers of 8 x 128 x 4 bytes


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class Tiles:
    """Tile sizes: the largest weight tile and head tile (bytes), KV positions per tile, and slots per
    buffer. Bigger tiles mean fewer DMAs and less kernel code (compile time); the VMEM budget bounds them.
    The head gets its own size: it is one long run of identical tiles (262,144 vocabulary rows)."""

    weight_tile_bytes: int = 4 * MIB + 512 * 1024  # one whole 26B-A4B expert matrix (2816 x 768 bf16)
    head_tile_bytes: int = 8 * MIB
    kv_tile: int = 512
    slots: int = 2

    def __post_init__(self):
        if self.weight_tile_bytes < LANE * 4 * 16:
            raise ValueError(f"weight_tile_bytes={self.weight_tile_bytes} is below one (16, 128) tile")
        if self.kv_tile <= 0 or self.kv_tile % 16:
            raise ValueError(f"kv_tile={self.kv_tile} must be a positive multiple of 16 (bf16 sublanes)")
        if self.slots < 2:
            raise ValueError(f"slots={self.slots}: the weight stream needs at least 2 (double buffering)")


# Records ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Buffer:
    """A VMEM weight buffer: ``slots`` tiles of ``shape``."""

    name: str
    shape: tuple[int, int]
    itemsize: int
    slots: int

    @property
    def nbytes(self) -> int:
        return self.slots * self.shape[0] * self.shape[1] * self.itemsize


@dataclass(frozen=True)
class Load:
    """One weight tile's DMA, HBM -> VMEM: ``tensor[rows, cols]`` (of expert ``experts[j]`` when
    ``expert`` is the routed slot j) into ``buffer`` slot ``slot``."""

    id: int
    tensor: str
    layer: int          # -1 for the head
    component: str
    buffer: str
    slot: int
    rows: tuple[int, int]   # (start, size) in the padded tensor
    cols: tuple[int, int]
    nbytes: int
    expert: int | None = None


@dataclass(frozen=True)
class Start:
    load: int


@dataclass(frozen=True)
class Wait:
    load: int


@dataclass(frozen=True)
class Op:
    """One compute step. ``name`` picks the emitter; matmuls read ``load`` and write ``dst``.

    matmul modes: ``cols``: dst[:, dst_off:+n] = src @ tile; ``rows``: dst (+)= src[:, src_off:+n] @ tile
    (``accumulate`` False on the first tile); ``head``: logits[:, dst_off:+n] = softcap(src @ tile.T), sent
    straight to the HBM output.
    """

    name: str
    layer: int
    component: str
    flops: int = 0
    kv_bytes: int = 0     # KV cache bytes read at the plan's context (attention)
    load: int | None = None
    src: str = ""
    dst: str = ""
    mode: str = ""
    src_off: int = 0
    dst_off: int = 0
    n: int = 0
    accumulate: bool = False
    expert: int | None = None   # routed slot j (the op runs only if slot j holds a new expert)


Item = Start | Wait | Op


@dataclass(frozen=True)
class Loop:
    """Groups ``start .. start + period * count`` of ``StepPlan.groups`` as ``count`` repeats of a
    ``period``-group body. A group is one compute op with the Wait before it and the Starts issued
    after it. The compute (and its Wait) repeats with fixed strides (tile offsets, routed slot, FLOPs)
    and a buffer slot that steps modulo ``Tiles.slots``; a row-tile accumulation may begin on the second
    repeat. The Starts may change between repeats (the last tiles of a matrix start the next matrix's):
    a DMA start is a few instructions, a tile's matmul is most of the code. The kernel emits the run as
    one loop, so its code does not grow with the number of tiles."""

    start: int
    period: int
    count: int


LOOPABLE = ("matmul", "gelu_mul", "expert_combine")  # the ops a loop body may hold
MAX_PERIOD = 8  # longest body searched for, in groups (an expert slot is 5: gate, up, act, down, combine)


# Layout ----------------------------------------------------------------------------------------
def padded_shape(cfg: Gemma4Config, path: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a tensor has in the kernel's HBM layout (intermediates and expert count padded to 128)."""
    name = path.rsplit(".", 1)[-1]
    mi, ei, ep = round_up(cfg.mlp_intermediate, LANE), round_up(cfg.expert_intermediate, LANE), \
        round_up(max(cfg.num_experts, 1), LANE)
    if name in ("mlp_gate", "mlp_up"):
        return (shape[0], mi)
    if name == "mlp_down":
        return (mi, shape[1])
    if name in ("expert_gate", "expert_up"):
        return (shape[0], shape[1], ei)
    if name == "expert_down":
        return (shape[0], ei, shape[2])
    if name == "router_proj":
        return (shape[0], ep)
    return shape


def _even_width(total: int, other: int, itemsize: int, budget: int) -> int:
    """The widest multiple of 128 that divides ``total`` with other x width x itemsize <= budget."""
    units = total // LANE
    return max(d for d in range(1, units + 1) if units % d == 0 and (d == 1 or other * d * LANE * itemsize <= budget)) * LANE


def _spans(total: int, other: int, itemsize: int, budget: int) -> list[tuple[int, int]]:
    """Split ``total`` (a multiple of 128) into (start, size) tiles with other x width x itemsize <= budget:
    equal tiles (one loop in the kernel) if a multiple of 128 that divides ``total`` is at least half the
    widest that fits, else tiles of the widest with a narrower last one (it fills part of a slot)."""
    widest = max(1, min(total // LANE, budget // (other * LANE * itemsize))) * LANE
    even = _even_width(total, other, itemsize, budget)
    width = even if 2 * even >= widest else widest
    return [(s, min(width, total - s)) for s in range(0, total, width)]


# The plan --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepPlan:
    cfg: Gemma4Config
    batch: int
    max_len: int
    context: int
    weight_itemsize: int
    kv_itemsize: int
    tiles: Tiles
    knockout: frozenset
    buffers: dict[str, Buffer]
    loads: tuple[Load, ...]
    items: tuple[Item, ...]
    activations: dict[str, tuple[int, int]] = field(default_factory=dict)  # f32 VMEM scratch

    @property
    def rows(self) -> int:
        return round_up(self.batch, ROWS)

    @property
    def head_tile(self) -> int:
        """Vocabulary rows per head tile (they divide the vocabulary: the head runs as one loop)."""
        return _even_width(self.cfg.vocab_size, self.cfg.hidden_size, self.weight_itemsize,
                           self.tiles.head_tile_bytes)

    @cached_property
    def folded(self) -> tuple[int | Loop, ...]:
        """The items as the kernel emits them: an item index, or a ``Loop`` over a regular run."""
        return fold(self.items, {ld.id: ld for ld in self.loads}, self.tiles.slots)

    @cached_property
    def groups(self) -> tuple[tuple[int, int], ...]:
        return groups(self.items)

    @property
    def emitted_ops(self) -> int:
        """Compute ops the kernel writes code for (a loop's body once): what its code size follows."""
        return sum(s.period if isinstance(s, Loop) else int(any(isinstance(it, Op) for it in
                   self.items[slice(*self.groups[s])])) for s in self.folded)

    def loop_table(self) -> list[dict]:
        """The plan's loops as rows: layer, component, the tensors a repeat reads, repeats, ops per repeat."""
        loads = {ld.id: ld for ld in self.loads}
        rows = []
        for s in self.folded:
            if isinstance(s, Loop):
                ops = [it for g in self.groups[s.start:s.start + s.period] for it in self.items[slice(*g)]
                       if isinstance(it, Op)]
                rows.append(dict(layer=ops[0].layer, component=ops[0].component, repeats=s.count, ops_per_repeat=s.period,
                                 tensors=" ".join(dict.fromkeys(loads[o.load].tensor.rsplit(".", 1)[-1]
                                                                for o in ops if o.load is not None))))
        return rows

    @property
    def ops(self) -> list[Op]:
        return [i for i in self.items if isinstance(i, Op)]

    def kv_tile(self, layer_type: str) -> int:
        return kv_tile(self.cache_len(layer_type), self.tiles.kv_tile)

    def cache_len(self, layer_type: str) -> int:
        return self.cfg.sliding_window if layer_type == SLIDING else self.max_len

    @cached_property
    def weight_bytes(self) -> int:
        """Weight bytes streamed when every routed slot holds a distinct expert (the upper bound)."""
        return sum(ld.nbytes for ld in self.loads)

    @property
    def kv_bytes(self) -> int:
        return sum(op.kv_bytes for op in self.ops)

    @property
    def flops(self) -> int:
        return sum(op.flops for op in self.ops)

    def bytes_by_component(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ld in self.loads:
            out[ld.component] = out.get(ld.component, 0) + ld.nbytes
        return out

    # VMEM ------------------------------------------------------------------------------------
    def vmem_breakdown(self) -> dict[str, int]:
        """Bytes of VMEM the kernel allocates, by use (weight buffers, KV tiles, activations, ...)."""
        cfg, r = self.cfg, self.rows
        kv = 0
        for t in set(cfg.layer_types):
            # K and V tiles, double-buffered, all KV heads of one user
            kv = max(kv, 2 * 2 * cfg.kv_heads(t) * self.kv_tile(t) * cfg.head_dim(t) * self.kv_itemsize)
        # Attention's f32 copy of one K (or V) tile, all KV heads: past the vector registers (64 x 4 KiB)
        # Mosaic keeps it in its own scratch. The compiler's VMEM figure exceeds the explicit buffers by
        # this and it grows with kv_tile (v5e/v6e AOT, full-size steps); tiny tiles stay in registers.
        upcast = max(cfg.kv_heads(t) * self.kv_tile(t) * cfg.head_dim(t) * 4 for t in set(cfg.layer_types))
        upcast = upcast if upcast > VREG_BYTES else 0
        stage = 2 * max(self.batch * cfg.kv_heads(t) * BLOCK * cfg.head_dim(t) * self.kv_itemsize
                        for t in set(cfg.layer_types))
        vec_rows, vec_width = vector_table_shape(cfg)
        return {
            "weight buffers": sum(b.nbytes for b in self.buffers.values()),
            "kv tiles": kv,
            "f32 k/v tile (compiler scratch)": upcast,
            "new k/v staging": stage,
            "activations": sum(a * b * 4 for a, b in self.activations.values()),
            "norm and scale vectors": round_up(vec_rows, ROWS) * vec_width * 4,
            "embedding rows": self.batch * BLOCK * cfg.hidden_size * self.weight_itemsize,
            "logits staging": 2 * self.batch * ROWS * self.head_tile * 4,
        }

    @property
    def vmem_bytes(self) -> int:
        return sum(self.vmem_breakdown().values())

    def check_vmem(self, chip) -> int:
        """Raise if the plan's VMEM does not fit one core of ``chip`` (a Chip or a name)."""
        from .chips import get_chip
        chip = get_chip(chip) if isinstance(chip, str) else chip
        if chip.vmem_bytes != chip.vmem_bytes:  # NaN: not checked for this chip
            raise ValueError(f"{chip.name} has no checked VMEM size in data/chips.csv; check it with the "
                             "AOT compiler (mk.tpu) before budgeting a kernel for it")
        need = self.vmem_bytes
        if need > chip.vmem_bytes:
            parts = ", ".join(f"{k} {v / MIB:.1f}" for k, v in self.vmem_breakdown().items())
            raise ValueError(
                f"the step plan for {self.cfg.name} (batch {self.batch}, max_len {self.max_len}) needs "
                f"{need / MIB:.1f} MiB of VMEM ({parts} MiB) but {chip.name} has {chip.vmem_bytes / MIB:.0f} MiB "
                f"per core ({chip.source}); lower Tiles.weight_tile_bytes (now {self.tiles.weight_tile_bytes}) "
                f"or Tiles.kv_tile (now {self.tiles.kv_tile}), or the batch")
        return need

    def table(self) -> list[dict]:
        """The items as rows (for a DataFrame): item (dma start, dma wait, compute), layer, what, bytes, flops."""
        loads = {ld.id: ld for ld in self.loads}
        rows = []
        for i, it in enumerate(self.items):
            if isinstance(it, Op):
                rows.append(dict(step=i, item="compute", layer=it.layer, component=it.component,
                                 what=it.name + (f" {it.dst}" if it.dst else ""), bytes=it.kv_bytes,
                                 flops=it.flops, expert=it.expert))
            else:
                ld = loads[it.load]
                rows.append(dict(step=i, item="dma start" if isinstance(it, Start) else "dma wait",
                                 layer=ld.layer, component=ld.component,
                                 what=f"{ld.tensor}[{ld.rows[0]}:+{ld.rows[1]}, {ld.cols[0]}:+{ld.cols[1]}]",
                                 bytes=ld.nbytes if isinstance(it, Start) else 0, flops=0, expert=ld.expert))
        return rows


def groups(items) -> tuple[tuple[int, int], ...]:
    """Item ranges [a, b): each compute op with the Wait just before it and the Starts just after it
    (the Starts before the first op are a group of their own)."""
    cuts = [0] + [n for n, it in enumerate(items)
                  if n and (isinstance(it, Wait) or (isinstance(it, Op) and not isinstance(items[n - 1], Wait)))]
    return tuple(zip(cuts, cuts[1:] + [len(items)]))


def _varying(items, group, loads: dict):
    """A group's compute as (what must be equal between repeats, integers that may step by a stride,
    buffer slot, accumulate); ``None`` if no loop may hold it."""
    op = next((it for it in items[group[0]:group[1]] if isinstance(it, Op)), None)
    if op is None or op.name not in LOOPABLE:
        return None
    ld = loads[op.load] if op.load is not None else None
    key = (op.name, op.layer, op.component, op.src, op.dst, op.mode, op.n, op.kv_bytes, op.expert is None,
           ld and (ld.tensor, ld.layer, ld.component, ld.buffer, ld.rows[1], ld.cols[1], ld.nbytes, ld.expert is None))
    ints = (op.src_off, op.dst_off, op.expert or 0, op.flops) + (ld and (ld.rows[0], ld.cols[0], ld.expert or 0) or ())
    return key, ints, ld.slot if ld else 0, op.accumulate


def _repeats(v: list, a: int, period: int, slots: int) -> int:
    """How many times the ``period`` groups from ``a`` repeat with fixed strides (1 if not at all)."""
    n = 1
    while a + period * (n + 1) <= len(v):
        for k in range(period):
            first, second, this = v[a + k], v[a + k + period], v[a + k + period * n]
            if first is None or this is None or this[0] != first[0]:
                return n
            if any(x0 + (x1 - x0) * n != x for x0, x1, x in zip(first[1], second[1], this[1])):
                return n
            if this[2] != (first[2] + (second[2] - first[2]) % slots * n) % slots:
                return n
            if this[3] != first[3] and not (not first[3] and second[3]):  # equal, or off on the first repeat only
                return n
        n += 1
    return n


def fold(items, loads: dict, slots: int) -> tuple[int | Loop, ...]:
    """Cover the groups of ``items`` greedily with the longest regular runs (``Loop``); the rest stay
    single groups (their index)."""
    gs = groups(items)
    v = [_varying(items, g, loads) for g in gs]
    out: list[int | Loop] = []
    a = 0
    while a < len(gs):
        best = None
        if v[a] is not None:
            for period in range(1, min(MAX_PERIOD, (len(gs) - a) // 2) + 1):
                n = _repeats(v, a, period, slots)
                if n >= 2 and (best is None or period * n > best.period * best.count):
                    best = Loop(a, period, n)
        if best is None:
            out.append(a)
            a += 1
        else:
            out.append(best)
            a += best.period * best.count
    return tuple(out)


def start_runs(starts: list[list[Load]], slots: int) -> list[tuple[int, int, Load, Load | None]]:
    """The Starts of one body position over a loop's repeats (``starts[j]``: the loads started in
    repeat j) as runs (lo, hi, first load, second load or None): in repeats lo..hi-1 the load steps
    from the first by a fixed stride, like a loop body's compute."""
    def key(ld):
        return ld.tensor, ld.layer, ld.component, ld.buffer, ld.rows[1], ld.cols[1], ld.nbytes, ld.expert is None

    def ints(ld):
        return ld.rows[0], ld.cols[0], ld.expert or 0

    done: list = []
    open_: dict = {}
    for j, lds in enumerate(starts):
        still = {}
        for m, ld in enumerate(lds):
            r = open_.get(m)
            if r is not None and key(r[2]) == key(ld):
                lo, _, first, second = r
                step = j - lo
                if second is None or (all(a + (b - a) * step == c for a, b, c in zip(ints(first), ints(second), ints(ld)))
                                      and ld.slot == (first.slot + (second.slot - first.slot) % slots * step) % slots):
                    still[m] = (lo, j + 1, first, second or ld)
                    continue
            if r is not None:
                done.append(r)
            still[m] = (j, j + 1, ld, None)
        done += [r for m, r in open_.items() if m not in still]
        open_ = still
    return done + list(open_.values())


def kv_tile(positions: int, largest: int) -> int:
    """KV positions per tile: the largest multiple of BLOCK that divides ``positions`` and is <= ``largest``."""
    return max(t for t in range(BLOCK, min(positions, largest) + 1, BLOCK) if positions % t == 0)


def vector_table_shape(cfg: Gemma4Config) -> tuple[int, int]:
    """Rows and width of the packed table of norm weights and scales (one vector a row)."""
    n = 1 + len(vector_rows(cfg))
    width = round_up(max(cfg.hidden_size, cfg.full_head_dim, cfg.sliding_head_dim, cfg.num_experts, 1), LANE)
    return n, width


def vector_rows(cfg: Gemma4Config) -> dict[str, int]:
    """Row of each vector parameter in the packed table (``final_norm`` and every layer's norms/scales)."""
    out = {}
    for s in param_specs(cfg):
        if len(s.shape) == 1:
            out[s.path] = len(out)
    return out


class _Builder:
    def __init__(self, cfg, batch, max_len, context, weight_itemsize, kv_itemsize, tiles, knockout):
        self.cfg, self.batch, self.max_len, self.context = cfg, batch, max_len, context
        self.wb, self.kvb, self.tiles, self.ko = weight_itemsize, kv_itemsize, tiles, knockout
        self.shapes = {s.path: padded_shape(cfg, s.path, s.shape) for s in param_specs(cfg)}
        self.buffers: dict[str, Buffer] = {}
        self.loads: list[Load] = []
        self.ops: list[tuple[Op, int | None]] = []  # (op, index of the route op it waits for)
        self.acts: dict[str, tuple[int, int]] = {}
        self._slot_count: dict[str, int] = {}
        self.route_op: dict[int, int] = {}

    def act(self, name: str, width: int) -> str:
        self.acts[name] = (round_up(self.batch, ROWS), max(self.acts.get(name, (0, 0))[1], width))
        return name

    def load(self, tensor, layer, component, rows, cols, expert=None, slot_shape=None) -> int:
        shape = (rows[1], cols[1])
        slot_shape = slot_shape or shape
        # tiles of one shape share a buffer (q, k, v, gate, up, expert gate/up are all [H, w]):
        # fewer buffers, less VMEM, and still the next tile of each shape in flight
        buffer = f"{slot_shape[0]}x{slot_shape[1]}"
        b = self.buffers.get(buffer)
        if b is None:
            self.buffers[buffer] = Buffer(buffer, slot_shape, self.wb, self.tiles.slots)
        elif b.shape != slot_shape:
            raise AssertionError(f"buffer {buffer} holds {b.shape}, tile slot is {slot_shape}")
        n = self._slot_count.get(buffer, 0)
        self._slot_count[buffer] = n + 1
        ld = Load(len(self.loads), tensor, layer, component, buffer, n % self.tiles.slots, rows, cols,
                  shape[0] * shape[1] * self.wb, expert)
        self.loads.append(ld)
        return ld.id

    def op(self, name, layer, component, **kw) -> None:
        self.ops.append((Op(name, layer, component, **kw), None))

    # matmul helpers -----------------------------------------------------------------------------
    def proj_cols(self, tensor, layer, component, src, dst, expert=None, dst_base=0):
        """dst[:, c] = src @ W[:, c], W [K, N] streamed in column tiles."""
        k, n = self.shapes[tensor][-2:]
        spans = _spans(n, k, self.wb, self.tiles.weight_tile_bytes)
        for c, tn in spans:
            lid = self.load(tensor, layer, component, (0, k), (c, tn), expert, (k, spans[0][1]))
            self.op("matmul", layer, component, flops=2 * self.batch * k * tn, load=lid, src=src, dst=dst,
                    mode="cols", dst_off=dst_base + c, n=tn, expert=expert)

    def proj_rows(self, tensor, layer, component, src, dst, expert=None, accumulate=False):
        """dst (+)= src @ W, W [K, N] streamed in row tiles."""
        k, n = self.shapes[tensor][-2:]
        spans = _spans(k, n, self.wb, self.tiles.weight_tile_bytes)
        for r, tk in spans:
            lid = self.load(tensor, layer, component, (r, tk), (0, n), expert, (spans[0][1], n))
            self.op("matmul", layer, component, flops=2 * self.batch * tk * n, load=lid, src=src, dst=dst,
                    mode="rows", src_off=r, n=tk, accumulate=accumulate or r > 0, expert=expert)

    def mlp(self, prefix, layer, component, src, dst, names, expert=None):
        """A GeGLU MLP chunked over its (padded) intermediate: per chunk gate, up, act, down."""
        g, u, d = (prefix + n for n in names)
        h, inter = self.shapes[g][-2:]
        spans = _spans(inter, h, self.wb, self.tiles.weight_tile_bytes)
        w = spans[0][1]
        gate, up = self.act("gate", w), self.act("up", w)
        for c, tc in spans:
            for tensor, act_dst in ((g, gate), (u, up)):
                lid = self.load(tensor, layer, component, (0, h), (c, tc), expert, (h, w))
                self.op("matmul", layer, component, flops=2 * self.batch * h * tc, load=lid, src=src,
                        dst=act_dst, mode="cols", dst_off=0, n=tc, expert=expert)
            self.op("gelu_mul", layer, component, flops=10 * self.batch * tc, src=gate, dst=up, n=tc, expert=expert)
            lid = self.load(d, layer, component, (c, tc), (0, h), expert, (w, h))
            self.op("matmul", layer, component, flops=2 * self.batch * tc * h, load=lid, src=up, dst=dst,
                    mode="rows", src_off=0, n=tc, accumulate=c > 0, expert=expert)

    # the step ---------------------------------------------------------------------------------
    def build(self):
        cfg, B = self.cfg, self.batch
        H = cfg.hidden_size
        for name, w in (("x", H), ("xn", H), ("attn_out", H), ("ffn", H)):
            self.act(name, w)
        self.op("embed", -1, HEAD)
        for i, t in enumerate(cfg.layer_types):
            self.layer(i, t)
        self.op("final_norm", -1, NORMS, src="x", dst="xn")
        # The head: equal tiles (one loop in the kernel), each computed, soft-capped and sent to HBM.
        tv = _even_width(cfg.vocab_size, H, self.wb, self.tiles.head_tile_bytes)
        if HEAD not in self.ko:
            for r in range(0, cfg.vocab_size, tv):
                lid = self.load("embed", -1, HEAD, (r, tv), (0, H))
                self.op("matmul", -1, HEAD, flops=2 * B * tv * H + 3 * B * tv, load=lid, src="xn", mode="head",
                        dst_off=r, n=tv)
        else:
            self.op("zero_logits", -1, HEAD)

    def layer(self, i: int, t: str):
        cfg, B, p = self.cfg, self.batch, f"layers.{i}."
        H, hd, kv, nh = cfg.hidden_size, cfg.head_dim(t), cfg.kv_heads(t), cfg.num_heads
        att = attention_component(t)
        if att not in self.ko:
            self.op("input_norm", i, NORMS, src="x", dst="xn")
            q, k, v = self.act("q", nh * max(cfg.sliding_head_dim, cfg.full_head_dim)), \
                self.act("k", kv * hd), self.act("v", kv * hd)
            self.act("k", max(cfg.sliding_kv_heads * cfg.sliding_head_dim, cfg.full_kv_heads * cfg.full_head_dim))
            self.act("v", self.acts["k"][1])
            self.proj_cols(p + "q", i, att, "xn", q)
            self.proj_cols(p + "k", i, att, "xn", k)
            if cfg.has_v_proj(t):
                self.proj_cols(p + "v", i, att, "xn", v)
            self.op("qkv_norm_rope", i, att, flops=12 * B * (nh + 2 * kv) * hd)
            positions = cfg.cache_positions(t, self.context)
            self.op("attention", i, att, flops=4 * B * nh * hd * positions,
                    kv_bytes=2 * B * kv * hd * (positions - 1) * self.kvb)
            self.act("attn", nh * max(cfg.sliding_head_dim, cfg.full_head_dim))
            self.proj_rows(p + "o", i, att, "attn", "attn_out")
        self.op("post_attention", i, NORMS, flops=8 * B * H)
        if cfg.is_moe:
            # with the router knocked out, "route" only sets the fixed experts 0..k-1
            E = self.shapes[p + "router_proj"][1]
            self.act("router", E)
            self.act("moe", H)
            if ROUTER not in self.ko:
                self.proj_cols(p + "router_proj", i, ROUTER, "rin", "router")
            self.op("route", i, ROUTER, flops=0 if ROUTER in self.ko else (4 + 2 * cfg.top_k) * B * E)
            self.route_op[i] = len(self.ops) - 1
        if SHARED_MLP not in self.ko:
            self.mlp(p, i, SHARED_MLP, "xn", "ffn", ("mlp_gate", "mlp_up", "mlp_down"))
        if cfg.is_moe and EXPERTS not in self.ko:
            self.act("eo", H)
            for j in range(B * cfg.top_k):
                first = len(self.ops)
                self.mlp(p, i, EXPERTS, "x2", "eo", ("expert_gate", "expert_up", "expert_down"), expert=j)
                self.op("expert_combine", i, EXPERTS, flops=2 * B * H, expert=j)
                for n in range(first, len(self.ops)):
                    self.ops[n] = (self.ops[n][0], self.route_op[i])
        self.op("ffn_out", i, NORMS, flops=10 * B * H)

    def schedule(self) -> list[Item]:
        """Place Start/Wait around the ops: every load starts as early as its slot (and, for
        experts, the route) allows; a compute waits for its own load just before it runs."""
        slots = self.tiles.slots
        consumer = {}  # load id -> op index
        for n, (op, _) in enumerate(self.ops):
            if op.load is not None:
                consumer[op.load] = n
        by_buffer: dict[str, list[int]] = {}
        for ld in self.loads:
            by_buffer.setdefault(ld.buffer, []).append(ld.id)
        # a load may start once the op that consumed the previous user of its slot has run
        after_op = {}
        for ids in by_buffer.values():
            for k, lid in enumerate(ids):
                after_op[lid] = consumer[ids[k - slots]] if k >= slots else -1
        route_dep = {}
        for n, (op, route) in enumerate(self.ops):
            if op.load is not None and route is not None:
                route_dep[op.load] = route
        ready: dict[int, list[int]] = {}  # op index after which a load may start -> loads
        for ld in self.loads:
            ready.setdefault(max(after_op[ld.id], route_dep.get(ld.id, -1)), []).append(ld.id)
        started = [False] * len(self.loads)
        items: list[Item] = []

        def start_ready(done: int):
            for lid in ready.get(done, ()):
                started[lid] = True
                items.append(Start(lid))

        start_ready(-1)
        for n, (op, _) in enumerate(self.ops):
            if op.load is not None:
                assert started[op.load], "a load must be issued before its consumer"
                items.append(Wait(op.load))
            items.append(op)
            start_ready(n)
        assert all(started)
        return items


def build_plan(cfg: Gemma4Config, batch: int, max_len: int, context: int | None = None, *,
               weight_itemsize: int = 4, kv_itemsize: int = 4, tiles: Tiles = Tiles(),
               knockout=frozenset()) -> StepPlan:
    """The plan of one decode step for ``batch`` users with caches of ``max_len`` positions.

    ``context`` (positions in the cache after this step, default ``max_len``) only sets the KV bytes
    and attention FLOPs recorded for timing; the kernel itself reads the tiles the position needs.
    """
    for name, v in (("batch", batch), ("max_len", max_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    context = max_len if context is None else context
    if not 0 < context <= max_len:
        raise ValueError(f"context={context} must be in 1..max_len={max_len}")
    for t in set(cfg.layer_types):
        s = cfg.sliding_window if t == SLIDING else max_len
        if s % BLOCK:
            raise ValueError(f"the {t} layers' cache has {s} positions, not a multiple of {BLOCK}: the kernel reads "
                             f"and writes the cache in aligned blocks of {BLOCK}; make the cache with max_len a "
                             f"multiple of {BLOCK} (mk.generate rounds it up for engines that ask)")
    for t in set(cfg.layer_types):
        if cfg.head_dim(t) % LANE:
            raise ValueError(f"{t} head_dim {cfg.head_dim(t)} is not a multiple of {LANE}: the kernel keeps a "
                             "head in whole lanes")
    if cfg.hidden_size % LANE or cfg.vocab_size % LANE:
        raise ValueError(f"hidden_size ({cfg.hidden_size}) and vocab_size ({cfg.vocab_size}) must be multiples "
                         f"of {LANE} for the kernel's tiles")
    ko = check_knockout(knockout)
    b = _Builder(cfg, batch, max_len, context, weight_itemsize, kv_itemsize, tiles, ko)
    b.build()
    items = b.schedule()
    if cfg.is_moe:
        b.act("x2", cfg.hidden_size)
        b.act("rin", cfg.hidden_size)
    return StepPlan(cfg, batch, max_len, context, weight_itemsize, kv_itemsize, tiles, ko, dict(b.buffers),
                    tuple(b.loads), tuple(items), dict(b.acts))


__all__ = ["Tiles", "Buffer", "Load", "Start", "Wait", "Op", "Loop", "StepPlan", "build_plan", "fold", "groups", "start_runs", "padded_shape", "layers_in_hbm",
           "timeline", "memory_busy_fraction", "kv_tile",
           "vector_rows", "vector_table_shape", "round_up", "FULL", "SLIDING_ATTENTION", "FULL_ATTENTION"]


def layers_in_hbm(cfg: Gemma4Config, hbm_bytes: float, batch: int, max_len: int, itemsize: int = 2) -> int:
    """How many of ``cfg``'s first layers (every expert included), with the embedding/head and their
    KV caches, fit in ``hbm_bytes`` (one chip's HBM), in the kernel's padded layout (the compiler
    refused a 26B-A4B cut counted unpadded for v6e: its 704 -> 768 expert padding is ~9% of a layer)."""
    import math

    from .params import layer_param_specs
    used = cfg.vocab_size * cfg.hidden_size * itemsize
    for i, t in enumerate(cfg.layer_types):
        kv = 2 * batch * cfg.kv_heads(t) * (cfg.sliding_window if t == SLIDING else max_len) * cfg.head_dim(t)
        weights = sum(math.prod(padded_shape(cfg, s.path, s.shape)) for s in layer_param_specs(cfg, i))
        used += (weights + kv) * itemsize
        if used > hbm_bytes:
            return i
    return cfg.num_layers


def timeline(plan: StepPlan, chip) -> list[dict]:
    """A modelled timeline of one step on one chip: the DMA engine serves weight tiles in the order the
    plan issues them at the chip's HBM bandwidth; compute runs the ops in order, each waiting for its
    tile, at the chip's bf16 FLOP/s (attention also streams its KV tiles). Rows: lane ("dma" or
    "compute"), what, layer, component, start_s, end_s. A first-order model, not a measurement."""
    from .chips import get_chip
    chip = get_chip(chip) if isinstance(chip, str) else chip
    bw, flops = chip.per_chip_bandwidth, chip.bf16_flops / chip.chips
    loads = {ld.id: ld for ld in plan.loads}
    dma_free, compute_free, arrive, rows = 0.0, 0.0, {}, []
    issued_at = 0.0
    for it in plan.items:
        if isinstance(it, Start):
            ld = loads[it.load]
            s = max(dma_free, issued_at)
            dma_free = s + ld.nbytes / bw
            arrive[it.load] = dma_free
            rows.append(dict(lane="dma", what=ld.tensor, layer=ld.layer, component=ld.component, start_s=s,
                             end_s=dma_free))
        elif isinstance(it, Wait):
            compute_free = max(compute_free, arrive[it.load])
        else:
            s = compute_free
            if it.kv_bytes:  # the KV tiles share the DMA engine with the weight stream
                ks = max(dma_free, s)
                dma_free = ks + it.kv_bytes / bw
                rows.append(dict(lane="dma", what=f"kv cache {it.layer}", layer=it.layer, component=it.component,
                                 start_s=ks, end_s=dma_free))
                s = max(s, dma_free)
            compute_free = s + it.flops / flops
            issued_at = compute_free  # the next Start is issued after this op
            rows.append(dict(lane="compute", what=it.name, layer=it.layer, component=it.component, start_s=s,
                             end_s=compute_free))
    return rows


def memory_busy_fraction(rows: list[dict]) -> float:
    """Share of the modelled step during which the DMA engine is moving bytes."""
    end = max(r["end_s"] for r in rows)
    return sum(r["end_s"] - r["start_s"] for r in rows if r["lane"] == "dma") / end
