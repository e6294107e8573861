"""The step plan's records: tile sizes, VMEM buffers, weight-tile DMAs (``Load``, ``Start``, ``Wait``)
and one small frozen record per kind of compute op.

Each op kind carries what it costs (``flops``; the bytes it reads beside its weight tile: ``kv_bytes``
streamed behind compute, ``serial_bytes`` read while compute waits) and names the fields that may
change between the repeats of a loop (``STRIDED``: integers that step by a fixed stride, booleans that
turn on after the first repeat). The kernel emits an op through one table from its type to an emit
function (mk.megakernel.emit.EMIT); the timeline reads each op's own cost. A new kind of op is a new
record here, its emit function, and its test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import ClassVar

from ..format_trees import get_format
from ..units import LANE, MIB, round_up
from .layout import ROWS, scale_buffer, scales_shape


@dataclass(frozen=True)
class Tiles:
    """Tile sizes: the largest weight tile and head tile (bytes), KV positions per tile, and slots per
    weight buffer (the prefetch depth: 2 is double buffering). Bigger tiles mean fewer DMAs and less
    kernel code; the VMEM budget bounds them. The head gets its own size: it is one long run of
    identical tiles (262,144 vocabulary rows)."""

    weight_tile_bytes: int = 4 * MIB + 512 * 1024  # one whole 26B-A4B expert matrix (2816 x 768 bf16)
    head_tile_bytes: int = 8 * MIB
    kv_tile: int = 512
    slots: int = 2
    # the head's tiles are equal (one loop) while each is at least this share of head_tile_bytes, else the widest with
    # a narrower last one (mk.plan.builder.head_spans); 0: always equal, as the kernel's revisions before 5 were
    head_equal_share: float = 0.25
    # 0: a weight tile's copy starts as early as its slot (and, for an expert, the route) allows; else no earlier than
    # when the tiles consumed before it come within this many bytes of it (mk.plan.schedule): a window over the stream
    # that holds copies back to be in flight where the stream would otherwise run dry (a layer's start, the route)
    lookahead_bytes: int = 0
    # True: user 0's first two KV tiles of a layer (both slots of its type's KV buffer) start at the layer's start,
    # before its q/k/v projections (mk.plan.records.ReadAhead), and its attention reads the rest two tiles ahead: the
    # weight copies issued meanwhile queue behind them and stream while the core attends, where they had all landed
    # before the cache's first tile and left the stream idle during attention's compute
    kv_ahead: bool = False
    # True (experts with biases, gpt-oss): each routed expert's bias rows start when the route has listed it (the first
    # BIAS_RING slots at the route, slot j + BIAS_RING at slot j's combine) into a ring of VMEM blocks, waited at its
    # first chunk; False: each chunk's and combine's biases read while the core waits, queued behind the weight copies
    # in flight (mk.megakernel.moe)
    expert_bias_ahead: bool = False
    # the priority the weight tiles' copies start at (Mosaic's DMA priority; every other copy starts at 0): 1 sets the
    # weight stream apart from the small copies the core waits for (the route's table, KV tiles, biases, exchanges),
    # which may otherwise queue behind the weight tiles in flight. What a chip does with it is measured, not documented
    weight_priority: int = 0

    def __post_init__(self):
        if self.weight_tile_bytes < LANE * 4 * 16:
            raise ValueError(f"weight_tile_bytes={self.weight_tile_bytes} is below one (16, 128) tile")
        if self.kv_tile <= 0 or self.kv_tile % 8:
            raise ValueError(
                f"kv_tile={self.kv_tile} must be a positive multiple of 8 (f32 sublanes; 16 for a bf16 cache)"
            )
        if not 0 <= self.head_equal_share <= 1:
            raise ValueError(f"head_equal_share={self.head_equal_share} must be a share of the head budget, 0 to 1")
        if self.slots < 2:
            raise ValueError(f"slots={self.slots}: the weight stream needs at least 2 (double buffering)")
        if self.weight_priority not in (0, 1):
            raise ValueError(f"weight_priority={self.weight_priority}: give 0 (every copy's) or 1 (weight tiles apart)")
        if self.lookahead_bytes < 0:
            raise ValueError(f"lookahead_bytes={self.lookahead_bytes}: give 0 (as early as slots allow) or a window")

    def __repr__(self) -> str:
        # the fields added after the stored schedules were keyed (_LATER) unsaid at their defaults: a plan's code
        # fingerprint (mk.plan.StepPlan.code_fingerprint) keys them as before; what they change is in the plan's loads
        # and items
        said = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if f.name not in _LATER or getattr(self, f.name) != f.default
        ]
        return f"Tiles({', '.join(said)})"


_LATER = ("head_equal_share", "lookahead_bytes", "kv_ahead", "expert_bias_ahead", "weight_priority")


@dataclass(frozen=True)
class Buffer:
    """A VMEM weight buffer: ``slots`` tiles of ``shape``, in the plan's weight dtype or, for INT8 tiles and
    their scales, ``int8`` / ``float32`` (``dtype``)."""

    name: str
    shape: tuple[int, int]
    itemsize: int
    slots: int
    dtype: str | None = None  # None: the plan's float weight dtype

    @property
    def nbytes(self) -> int:
        return self.slots * self.shape[0] * self.shape[1] * self.itemsize


@dataclass(frozen=True)
class Load:
    """One weight tile's DMA, HBM -> VMEM: ``tensor[index][rows, cols]`` (of the expert in routed slot
    ``expert``, when set) into ``buffer`` slot ``slot``. ``nbytes`` is what the DMA moves (padding
    included), ``payload_bytes`` the part that holds real weights. A ``scaled`` (INT8) tile brings the
    aligned block of its scales along (lanes for its columns, or for its rows where ``row_scales``),
    into ``scale_buffer(buffer)``: its bytes are
    counted in both (a matrix's scales once in ``payload_bytes``, however many row tiles it has)."""

    id: int
    tensor: str  # the kernel's HBM tensor (mk.plan.layout.stacked): ``sliding.q``, ``embed``, ...
    index: int | None  # the layer's place in the stacked tensor (None: not stacked)
    layer: int  # -1 for the head
    component: str
    buffer: str
    slot: int
    rows: tuple[int, int]  # (start, size) in the padded tensor
    cols: tuple[int, int]
    nbytes: int
    payload_bytes: int
    expert: int | None = None
    scaled: bool = False  # an INT8 tile: the block of its scales comes with it (mk.plan.layout.scale_rows)
    row_scales: bool = False  # an INT8 tile with a scale per row (mk.params.tile_rows_scaled)

    @property
    def scale_lanes(self) -> int:
        return scale_lanes(self.rows[1], self.cols[1], self.row_scales)

    @property
    def scale_bytes(self) -> int:
        return scale_block_bytes(self.rows[1], self.cols[1], self.row_scales) if self.scaled else 0


@dataclass(frozen=True)
class FormatLoad(Load):
    """A tile of a matrix in a shipped format (mk.format_trees): its codes, then the scales of its blocks, into
    ``scales_buffer`` (a class of its own: a Load's fields, and so the plans' fingerprints, stay as they were for
    float and INT8 models). An FP8 tile brings its matrix's whole scales (``matrix_scales``, a few KiB): a slice of
    them a tile wide would not be whole (8, 128) tiles of HBM, which Mosaic's DMAs move."""

    fmt: str = ""
    grid: tuple[int, int] = (1, 1)  # the rows and lanes one of its scales covers (mk.megakernel.format_tiles)
    matrix_scales: tuple[int, int] | None = None  # (rows, lanes) of its matrix's scales, where it brings them all
    # (rows, lanes) of its own scales where they are fewer than its slot's (a narrower last tile of a 4-bit matrix's
    # rows): a buffer of their shape, so its DMA fills whole slots (Mosaic lowers no slice of a VMEM buffer that
    # splits a sublane tile: gpt-oss-20b's down projections, 42 of 48 rows of scales); out of the repr, so plans
    # without one keep their fingerprints (the buffer it names is in a plan's buffers)
    tile_scales: tuple[int, int] | None = field(default=None, repr=False)

    @property
    def nibbles(self) -> bool:
        return get_format(self.fmt).nibbles

    @property
    def scales_buffer(self) -> str:
        return format_scales_buffer(self.buffer, self.matrix_scales or self.tile_scales)

    @property
    def scale_bytes(self) -> int:
        """The scale bytes its DMAs move."""
        if self.matrix_scales is not None:
            return math.prod(self.matrix_scales) * get_format(self.fmt).scale_itemsize
        return format_scale_bytes(self.rows[1], self.cols[1], self.grid, self.fmt)


def format_scales_buffer(buffer: str, matrix_scales: tuple[int, int] | None) -> str:
    """The VMEM buffer of a format tile's scales: beside its codes' ``buffer``, one a shape of whole scales (or of a
    narrower tile's own)."""
    return scale_buffer(buffer) + ("" if matrix_scales is None else "{}x{}".format(*matrix_scales))


def format_scale_bytes(rows: int, cols: int, grid: tuple[int, int], fmt: str) -> int:
    """Bytes of the scales of a ``rows`` x ``cols`` tile in shipped format ``fmt``: one a block of ``grid``."""
    return math.prod(scales_shape((rows, cols), grid)) * get_format(fmt).scale_itemsize


def scale_lanes(rows: int, cols: int, row_scales: bool) -> int:
    """Lanes of the scale block an INT8 tile of ``rows`` x ``cols`` brings: its columns, or (a scale per row) its
    rows padded to whole lanes, so they turn into a column in VMEM."""
    return round_up(rows, LANE) if row_scales else cols


def scale_block_bytes(rows: int, cols: int, row_scales: bool) -> int:
    """Bytes of that scale block: the ``ROWS`` f32 rows holding the row of the tile's expert (or matrix)."""
    return ROWS * scale_lanes(rows, cols, row_scales) * 4


@dataclass(frozen=True)
class Start:
    load: int


@dataclass(frozen=True)
class Wait:
    load: int


class MatmulMode(StrEnum):
    """How a weight tile meets the activations."""

    COLS = "cols"  # dst[:, dst_off:+n] = src @ tile (a column tile of W [K, N])
    COLS_T = "cols_t"  # dst[:, dst_off:+n] = src @ tile.T (a row tile of W stored transposed, [N, K])
    ROWS = "rows"  # dst (+)= src[:, src_off:+n] @ tile (a row tile of W [K, N], summed over tiles)
    # MLA's kv_b tile of whole heads from column dst_off: their queries taken into the latent space, their value
    # columns kept for the output (mk.megakernel.latent.emit_absorb)
    ABSORB = "absorb"


@dataclass(frozen=True)
class Op:
    """One compute step. Subclasses are the op kinds; ``layer`` is -1 outside the layers."""

    layer: int
    component: str
    flops: int

    STRIDED: ClassVar[tuple[str, ...]] = ()  # fields that may change between repeats of a loop
    LOOPABLE: ClassVar[bool] = False  # may be the body of a loop over tiles
    load: ClassVar[int | None] = None  # the weight tile it reads (matmul kinds set it)
    expert: ClassVar[int | None] = None  # routed slot j: runs only if slot j holds a new expert
    kv_bytes: ClassVar[int] = 0  # bytes it streams besides its weight tile (KV cache)
    serial_bytes: ClassVar[int] = 0  # bytes it reads while the compute waits for them
    sent_bytes: ClassVar[int] = 0  # bytes it sends to other chips (over ICI or NVLink)
    rounds: ClassVar[int] = 0  # rounds of remote DMAs it waits for (each pays the link latency)
    # bytes its busiest link carries one way, in sequence, where its sends spread over a torus's links
    # (mk.sharding.links.Exchange); 0: all of ``sent_bytes`` over one link
    link_bytes: ClassVar[int] = 0

    @property
    def kind(self) -> str:
        return type(self).__name__

    @property
    def wire_bytes(self) -> int:
        """The bytes whose time on the link the op waits for: ``link_bytes`` over a torus, else ``sent_bytes``."""
        return self.link_bytes or self.sent_bytes


@dataclass(frozen=True)
class Prologue(Op):
    """Token ids, positions, the vector table and RoPE frequencies, HBM -> VMEM/SMEM before anything."""

    serial_bytes: int = 0


@dataclass(frozen=True)
class Embed(Op):
    """x = embed[token] * sqrt(H) for every user (one aligned block of rows per user)."""

    serial_bytes: int = 0


@dataclass(frozen=True)
class Norm(Op):
    """dst = rms_norm(src) * weight (``vector``: the weight's name, in the layer or, at layer -1, the model); over the
    hidden size, or ``width`` dims (MLA's query bottleneck)."""

    src: str = ""
    dst: str = ""
    vector: str = ""
    width: int = field(default=0, repr=False)


@dataclass(frozen=True)
class MatmulTile(Op):
    """A weight tile times the activations (see MatmulMode); ``accumulate`` False sets dst. ``chip_rows`` (ROWS): src
    is cut in blocks of that many lanes, and the chip multiplies its own (block c on chip c: MLA's down-projections
    split over the chips, mk.sharding.latent_down_rows); 0 otherwise. Out of the code fingerprint: the chip's config
    (its ``down_rows``) is in it."""

    load: int = 0
    src: str = ""
    dst: str = ""
    mode: MatmulMode = MatmulMode.COLS
    src_off: int = 0
    dst_off: int = 0
    n: int = 0
    accumulate: bool = False
    expert: int | None = None
    chip_rows: int = field(default=0, repr=False)

    STRIDED: ClassVar = ("src_off", "dst_off", "accumulate", "expert")
    LOOPABLE: ClassVar = True


@dataclass(frozen=True)
class GatedAct(Op):
    """dst[:, :n] = act(src[:, :n]) * dst[:, :n]: the gated activation (GeGLU, SwiGLU, gpt-oss's clamped SwiGLU: the
    model's ``activation``) of one MLP (or expert) chunk. With expert biases (gpt-oss) the chunk's gate and up
    biases are added first: the chunk starts at ``off`` of the intermediate, ``index`` is the layer's place in its
    type's stacked bias tensor, ``layer_type`` its type (unset and out of the code fingerprint otherwise)."""

    src: str = ""
    dst: str = ""
    n: int = 0
    expert: int | None = None
    off: int = field(default=0, repr=False)
    index: int = field(default=0, repr=False)
    layer_type: str = field(default="", repr=False)

    STRIDED: ClassVar = ("expert", "off")
    LOOPABLE: ClassVar = True


@dataclass(frozen=True)
class ExpertCombine(Op):
    """moe += gate[:, e] * expert_out for the expert in routed slot ``expert`` (its down projection's bias added to
    its output first, where experts have biases: ``index`` the layer's place in its ``layer_type``'s stacked bias
    tensor)."""

    expert: int = 0
    index: int = field(default=0, repr=False)
    layer_type: str = field(default="", repr=False)

    STRIDED: ClassVar = ("expert",)
    LOOPABLE: ClassVar = True


@dataclass(frozen=True)
class QKVNormRope(Op):
    """q/k norms and RoPE at each user's position, v's weightless norm, in place."""

    layer_type: str = ""


@dataclass(frozen=True)
class Attend(Op):
    """Per user: online softmax over the KV cache in tiles, then the new K/V written back in place.
    ``kv_bytes``: the cache read at the plan's context; ``serial_bytes``: the first tile of every user
    and the block read around the write-back position, which compute waits for; ``sent_bytes`` and
    ``rounds``: what goes between chips where they share the positions or split the users."""

    layer_type: str = ""
    index: int = 0  # the layer's place in its type's stacked cache
    kv_bytes: int = 0
    serial_bytes: int = 0
    query_rows: int = 1  # query heads read against one KV head's tile (the rows of its matrix products)
    # chips sharing the positions of this chip's KV head (mk.sharding.position_share): they exchange their query
    # heads, attend over their own KV tiles, and send each head's partial state to its chip (two rounds)
    positions_shared: int = 1
    # the users split over the chips (mk.kernel_setup.AttentionSplit.USERS): each chip's q, k, v heads go to each user's
    # chip, which attends for its users over every head, and the outputs go back to the heads' chips (two rounds)
    users_split: bool = False
    sent_bytes: int = 0
    rounds: int = 0


@dataclass(frozen=True)
class ReadAhead(Op):
    """User 0's first KV tiles of layer ``index`` of ``layer_type`` (two where the context has two, into both slots of
    the type's KV buffer) started at the layer's start, not waited for (mk.plan.Tiles.kv_ahead): its Attend waits for
    them. ``ahead_bytes`` the tiles' bytes, ``first_bytes`` the first one's; the Attend's own bytes still count them
    (the plan's KV bytes are its Attends'), the timeline moves them here."""

    layer_type: str = ""
    index: int = 0
    ahead_bytes: int = 0
    first_bytes: int = 0


@dataclass(frozen=True)
class AttentionResidual(Op):
    """x += post_attn_norm(attn_out); the FFN inputs (pre_ffn_norm(x); for MoE also the experts' and
    the router's normed inputs)."""

    attention_on: bool = True


@dataclass(frozen=True)
class Route(Op):
    """Router softmax and top-k in VMEM; ids to SMEM (a serial DMA: expert DMAs address by them); flags
    for routed slots whose expert an earlier slot already holds (fetched once). Where experts have biases, ``index``
    and ``layer_type`` name the layer's bias rows (read ahead from here with mk.plan.Tiles.expert_bias_ahead)."""

    router_on: bool = True
    serial_bytes: int = 0
    index: int = field(default=0, repr=False)
    layer_type: str = field(default="", repr=False)


@dataclass(frozen=True)
class FfnResidual(Op):
    """x = (x + post_ffn_norm(mlp [+ experts])) * layer_scalar; an MoE model's dense layer adds no experts
    (``routed`` False)."""

    routed: bool = field(default=True, repr=False)


@dataclass(frozen=True)
class HeadTile(Op):
    """Softcapped logits of ``n`` vocabulary rows from ``row_off``, folded into a running argmax per user;
    sent to HBM only when the kernel writes logits."""

    load: int = 0
    src: str = ""
    row_off: int = 0
    n: int = 0

    STRIDED: ClassVar = ("row_off",)
    LOOPABLE: ClassVar = True


@dataclass(frozen=True)
class NoHead(Op):
    """The head knocked out: logits are zeros, so every user's greedy pick is token 0."""


@dataclass(frozen=True)
class EmitTokens(Op):
    """Write each user's greedy token and next position to HBM (the step's output)."""

    serial_bytes: int = 0


@dataclass(frozen=True)
class AllReduce(Op):
    """Sum the partial activations ``acts`` (f32, [users padded to 8, width] each) over the chips, in place,
    inside the kernel (mk.megakernel.collective; the peers: mk.sharding.links; the switches:
    mk.kernel_setup.Collective).
    ``rows``: the rows of each that travel (the users', rounded to whole packed rows of the payload type).
    ``itemsize``: bytes per element on the wire; ``seq``: this step's n-th all-reduce (its receive
    buffers alternate, so a fast chip's next all-reduce never lands in a buffer still being summed)."""

    acts: tuple[str, ...] = ()
    rows: int = 0
    width: int = 0
    itemsize: int = 4
    seq: int = 0
    sent_bytes: int = 0
    rounds: int = 1
    link_bytes: int = field(default=0, repr=False)  # timing only: out of the code fingerprint


@dataclass(frozen=True)
class GatherBest(Op):
    """Each chip's running argmax over its vocabulary rows, gathered from every chip: the first
    maximum over chips (in chip order, which is vocabulary order) is the greedy pick."""

    sent_bytes: int = 0
    rounds: int = 1
    link_bytes: int = field(default=0, repr=False)  # timing only: out of the code fingerprint


OP_KINDS = (
    Prologue,
    Embed,
    Norm,
    MatmulTile,
    GatedAct,
    ExpertCombine,
    QKVNormRope,
    ReadAhead,
    Attend,
    AttentionResidual,
    Route,
    FfnResidual,
    HeadTile,
    NoHead,
    EmitTokens,
    AllReduce,
    GatherBest,
)

Item = Start | Wait | Op

ROUTED = "Routed"  # the kernel's named scope around code that runs only for an expert slot some user routed to


def item_scope(item: Item, load: Load | None = None) -> str:
    """The named scope the kernel emits an item's code in: its kind; a weight tile's DMA start or wait and its matrix
    product with the tile's component (``MatmulTile.experts``); an attention op with its layer type (its loop over KV
    tiles runs as often as that type's cache is long). ``load``: a Start's or Wait's tile."""
    if isinstance(item, Attend):
        return f"Attend.{item.layer_type}"
    if isinstance(item, (Start, Wait)):
        return f"{type(item).__name__}.{load.component}"
    if isinstance(item, MatmulTile):
        return f"MatmulTile.{item.component}"
    return type(item).__name__


@dataclass(frozen=True)
class LayerLoop:
    """Groups ``start .. start + period * count`` as ``count`` repeats of a run of whole layers (one
    period of the sliding/full pattern): every item of repeat r is the item of repeat 0 with its
    integers (layer, stacked index, buffer slot modulo ``Tiles.slots``, ...) stepped r times by their
    difference to repeat 1. ``body`` folds repeat 0 (group indices relative to ``start``). The kernel
    emits it as one loop, so its code and compile time do not grow with the layers."""

    start: int
    period: int
    count: int
    body: tuple


@dataclass(frozen=True)
class Loop:
    """Groups ``start .. start + period * count`` of ``StepPlan.groups`` as ``count`` repeats of a
    ``period``-group body. A group is one compute op with the Wait before it and the Starts issued
    after it. The compute (and its Wait) repeats with fixed strides (its STRIDED fields, tile offsets)
    and a buffer slot that steps modulo ``Tiles.slots``. The Starts may change between repeats (the last
    tiles of a matrix start the next matrix's): a DMA start is a few instructions, a tile's matmul is
    most of the code. The kernel emits the run as one loop, so its code does not grow with the tiles."""

    start: int
    period: int
    count: int
