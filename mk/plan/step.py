"""The step plan: one decode step as an ordered list of small records, and ``build_plan``.

A plan holds the weight tiles a step streams from HBM (``Load``), its compute ops (mk.plan.records),
and, placed by the scheduler, when each tile's DMA is issued (``Start``) and waited for (``Wait``).
The megakernel's Python trace walks the plan and emits exactly that code, so the kernel and the plan
cannot drift; tests and the timing model read the same records for bytes, FLOPs and order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache

from ..config import ModelConfig
from ..dtypes import array_itemsize
from ..format_trees import FORMAT_SCHEMES, format_paths
from ..kernel_setup import ONE_CHIP, KernelSetup
from ..params import EXPERTS, ROUTER, check_knockout, quantized_paths
from ..routing import busiest_chip_distribution, chip_distinct_experts_distribution, distinct_experts_distribution
from ..sharding import attention_chips, chip_config, expert_groups, experts_per_chip, position_share, users_per_chip
from ..units import round_up
from .arrays import Array, HbmArrays, cache_shapes, packed_arrays
from .builder import Builder, check_shapes, expert_slots, head_spans, route_known
from .layout import (
    BLOCK,
    EXPERT_BIASES,
    ROWS,
    cache_slots,
    head_groups,
    heads_lanes,
    kv_tile,
    kv_tiles_read,
    layout_config,
)
from .records import AllReduce, Attend, Buffer, Item, LayerLoop, Load, Loop, Op, Start, Tiles
from .schedule import fold_step, groups, pattern_period, schedule
from .vmem import check_vmem, vmem_breakdown, vmem_limit

BIAS_RING = 4  # routed slots whose expert biases are in flight at once, read ahead (StepPlan.expert_bias_ring)


@dataclass(frozen=True)
class StepPlan:
    """One decode step of one chip as the kernel runs it. ``share``: the part of the model this chip computes
    (mk.sharding.chip_config; the model itself on one chip); ``model``: the whole model; ``layout``: the share at the
    sizes the kernel lays out (mk.plan.layout.layout_config); ``chip_index``: whose plan this is among the setup's
    chips (``setup`` None: one chip)."""

    share: ModelConfig
    batch: int
    max_len: int
    context: int
    weight_dtype: str  # the float weights' element type (mk.dtypes.ARRAY_DTYPES); INT8 or format codes: ``quantize``
    kv_dtype: str  # the KV cache's
    tiles: Tiles
    knockout: frozenset
    buffers: dict[str, Buffer]
    loads: tuple[Load, ...]
    items: tuple[Item, ...]
    activations: dict[str, tuple[int, int]] = field(default_factory=dict)  # f32 VMEM scratch
    loop_layers: bool = True  # emit repeats of the layer pattern as one loop (False: every layer's own code)
    model: ModelConfig | None = None  # None: the share (one chip)
    setup: object = None
    chip_index: int = 0
    experts_held: int = 0  # routed experts (or expert slices) this chip holds
    quantize: str = "none"  # mk.quant scheme: which matrices stream as INT8 codes with their scales
    # speculative verification: each user's token and its drafts are rows of one weight pass (``batch`` counts rows)
    draft_tokens: int = 0

    def __post_init__(self):
        if self.model is None:
            object.__setattr__(self, "model", self.share)

    @property
    def weight_itemsize(self) -> int:
        return array_itemsize(self.weight_dtype)

    @property
    def kv_itemsize(self) -> int:
        return array_itemsize(self.kv_dtype)

    @property
    def users(self) -> int:
        """Users decoded: ``batch`` rows of 1 + ``draft_tokens`` each."""
        return self.batch // (self.draft_tokens + 1)

    @property
    def chips(self) -> int:
        return 1 if self.setup is None else self.setup.chips

    @property
    def rows(self) -> int:
        return round_up(self.batch, ROWS)

    @cached_property
    def layout(self) -> ModelConfig:
        """The model with the sizes the kernel lays out (mk.plan.layout.layout_config)."""
        return layout_config(self.share)

    @cached_property
    def arrays(self) -> HbmArrays:
        """The kernel's inputs in HBM (mk.plan.arrays): this chip's weights in the plan's types, and its KV cache."""
        packed = packed_arrays(self.layout, self.weight_dtype, self.quantize, self.experts_held or None)
        cache = cache_shapes(self.layout, self.cache_users, self.cache_len, self.cache_heads)
        return replace(packed, cache={name: Array(shape, self.kv_dtype) for name, shape in cache.items()})

    @property
    def head_spans(self) -> list[tuple[int, int]]:
        """The head's tiles as (first vocabulary row, rows) (mk.plan.builder.head_spans)."""
        t = self.tiles
        return head_spans(
            self.layout.vocab_size, self.layout.hidden_size, self.weight_itemsize, t.head_tile_bytes, t.head_equal_share
        )

    @property
    def head_tile(self) -> int:
        """Vocabulary rows of the head's widest tile (every tile but a narrower last one)."""
        return self.head_spans[0][1]

    @property
    def expert_slots(self) -> int:
        on = self.share.is_moe and EXPERTS not in self.knockout
        return expert_slots(self.share, self.batch, self.experts_held) if on else 0

    @property
    def expert_bias_ring(self) -> int:
        """Routed slots whose expert biases are in flight at once (mk.plan.Tiles.expert_bias_ahead); 0: each chunk's
        read where it is used."""
        on = self.tiles.expert_bias_ahead and self.layout.expert_bias
        return min(self.expert_slots, BIAS_RING) if on else 0

    @property
    def expert_bias_buffer(self) -> tuple[tuple[int, ...], str] | None:
        """The VMEM that experts' biases (gpt-oss's) are read into, as (shape, dtype); None without them. Read ahead, a
        ring [places, 2 (gate and up, down), ROWS, width]; else one [ROWS, width] block either tensor's rows fit."""
        if not (self.layout.expert_bias and self.layout.is_moe):
            return None
        biases = [a for name, a in self.arrays.weights.items() if name.rsplit(".", 1)[-1] in EXPERT_BIASES]
        width = max(a.shape[-1] for a in biases)
        ring = self.expert_bias_ring
        return ((ring, len(EXPERT_BIASES), ROWS, width) if ring else (ROWS, width)), biases[0].dtype

    @property
    def route_known(self) -> bool:
        """The routed experts known before the step (mk.plan.builder.route_known): the router knocked out on a chip
        that holds every expert."""
        return route_known(self.knockout, self.experts_held, self.layout)

    @cached_property
    def folded(self) -> tuple[int | Loop | LayerLoop, ...]:
        """The items as the kernel emits them: a group index, a ``Loop`` over a regular run of tiles, or
        a ``LayerLoop`` over repeats of the layer pattern (whose body holds groups and Loops)."""
        return fold_step(
            self.items,
            {ld.id: ld for ld in self.loads},
            self.tiles.slots,
            self.share.num_layers,
            pattern_period(self.share.layer_types) if self.loop_layers else 0,
        )

    @cached_property
    def groups(self) -> tuple[tuple[int, int], ...]:
        return groups(self.items)

    def _emitted(self, segments, base: int = 0) -> int:
        n = 0
        for s in segments:
            if isinstance(s, LayerLoop):
                n += self._emitted(s.body, base + s.start)
            elif isinstance(s, Loop):
                n += s.period
            else:
                n += int(any(isinstance(it, Op) for it in self.items[slice(*self.groups[base + s])]))
        return n

    @property
    def emitted_ops(self) -> int:
        """Compute ops the kernel writes code for (a loop's body once): what its code size follows."""
        return self._emitted(self.folded)

    def loop_table(self) -> list[dict]:
        """The plan's loops as rows: layer, component, the tensors a repeat reads, repeats, ops per repeat
        (a loop inside the loop over layers is listed for its first repeat, ``in_layer_loop``)."""
        loads = {ld.id: ld for ld in self.loads}
        rows = []

        def add(segments, base, inside):
            for s in segments:
                if isinstance(s, LayerLoop):
                    rows.append(
                        dict(
                            layer=f"0..{s.count * len(self._layers(s)) - 1}",
                            component="layers",
                            repeats=s.count,
                            ops_per_repeat=self._emitted(s.body, s.start),
                            tensors="",
                            in_layer_loop=False,
                        )
                    )
                    add(s.body, base + s.start, True)
                elif isinstance(s, Loop):
                    ops = [
                        it
                        for g in self.groups[base + s.start : base + s.start + s.period]
                        for it in self.items[slice(*g)]
                        if isinstance(it, Op)
                    ]
                    rows.append(
                        dict(
                            layer=ops[0].layer,
                            component=ops[0].component,
                            repeats=s.count,
                            ops_per_repeat=s.period,
                            in_layer_loop=inside,
                            tensors=" ".join(
                                dict.fromkeys(
                                    loads[o.load].tensor.rsplit(".", 1)[-1] for o in ops if o.load is not None
                                )
                            ),
                        )
                    )

        add(self.folded, 0, False)
        return rows

    def _layers(self, ll: LayerLoop) -> set[int]:
        """The layers of a LayerLoop's first repeat."""
        return {
            it.layer
            for g in self.groups[ll.start : ll.start + ll.period]
            for it in self.items[slice(*g)]
            if isinstance(it, Op)
        }

    @property
    def ops(self) -> list[Op]:
        return [i for i in self.items if isinstance(i, Op)]

    def position_share(self, layer_type: str) -> int:
        """Chips sharing the positions of one of the layer type's KV heads (mk.sharding.position_share; 1: none)."""
        return position_share(self.model, layer_type, self.setup)

    @property
    def cache_users(self) -> int:
        """The users whose caches this chip holds and attends over (mk.sharding.users_per_chip)."""
        return users_per_chip(self.model, self.setup, self.users)

    def cache_heads(self, layer_type: str) -> int:
        """The layer type's KV heads in this chip's cache: its own, or every one with the users split."""
        split = self.setup is not None and self.setup.users_split
        return (self.model if split else self.share).kv_heads(layer_type)

    def cache_groups(self, layer_type: str) -> int:
        """Groups of 128 lanes the layer type's KV heads in this chip's cache take (mk.plan.layout.head_groups)."""
        return head_groups(self.cache_heads(layer_type), self.layout.head_dim(layer_type))

    def cache_len(self, layer_type: str) -> int:
        """Slots of the layer type's KV cache this chip holds in the kernel's layout (padded to whole blocks; its
        share of them where chips share a KV head's positions)."""
        return cache_slots(self.share, layer_type, self.max_len, self.draft_tokens) // self.position_share(layer_type)

    def kv_tile(self, layer_type: str) -> int:
        return kv_tile(self.cache_len(layer_type), self.tiles.kv_tile, 8 * 4 // self.kv_itemsize)

    @cached_property
    def code_fingerprint(self) -> str:
        """16 hex digits that change with anything the kernel's code is made from (the model, the sizes, the setup's
        switches, the items and loads in order, the KV tile of each layer type), but not with the context, which only
        sets how often each user's loop over KV tiles runs, nor with the setup's name: the key of the compiled
        schedule's rows (mk.timing.scheduled)."""
        skip = ("knockout", "buffers", "items", "max_len", "context", "setup")
        # one chip's plan keys its rows as it did when its whole model was not repeated beside its share
        # and its data types by their item sizes, as they were keyed before the plan named them
        named = {"model": None if self.setup is None else self.model, "weight_dtype": self.weight_itemsize}
        named["kv_dtype"] = self.kv_itemsize
        fields_ = [named[f] if f in named else getattr(self, f) for f in self.__dataclass_fields__ if f not in skip]
        # a setup's name and published key only label it
        fields_.append(self.setup and replace(self.setup, name="", published=None))
        if self.setup is not None and self.setup.torus:  # past one host (out of the setup's repr)
            fields_.append((self.setup.torus, self.setup.host_chips) + (("repeat_heads",) * self.setup.repeat_heads))
        items = [
            replace(it, flops=0, kv_bytes=0, serial_bytes=0) if isinstance(it, Attend) else it for it in self.items
        ]
        tiles = [(t, self.kv_tile(t)) for t in sorted(set(self.share.layer_types))]
        canon = repr((fields_, sorted(self.knockout), sorted(self.buffers.items()), items, tiles))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    def kv_tiles_read(self, layer_type: str) -> int:
        """KV tiles one user's attention loop reads in a layer of ``layer_type`` at the plan's context (this chip's,
        member 0 where chips share a head's positions): the trips of that loop in the kernel."""
        position = self.context - (self.draft_tokens + 1)  # the user's first row, the cache full after the step
        share = self.position_share(layer_type)
        return int(kv_tiles_read(position, self.kv_tile(layer_type), self.cache_len(layer_type), share))

    # Bytes -------------------------------------------------------------------------------------
    @property
    def expert_groups(self) -> int:
        """The chips (whole experts) or groups of a host's chips (placement ``hosts``) the routed experts are spread
        over whole (mk.sharding.expert_groups; 1: every expert on, or split over, every chip)."""
        return 1 if self.setup is None else expert_groups(self.model, self.setup)

    @property
    def expert_share(self) -> float:
        """The share of each fetched routed expert's bytes this chip holds: 1 whole, 1/C split over all chips, 1/h
        split over a host's h chips."""
        return self.share.expert_intermediate / self.model.expert_intermediate if self.share.is_moe else 1.0

    @cached_property
    def distinct_experts(self) -> dict[int, float]:
        """Distribution of the distinct experts this chip fetches in a layer, uniform routing (exact):
        of all E (one chip, or every expert split over the chips), or of the E/G its chip or group holds."""
        E, k = self.share.num_experts, self.share.top_k
        if self.share.is_moe and self.experts_held < E:
            return chip_distinct_experts_distribution(E, self.expert_groups, k, self.batch)
        if ROUTER in self.knockout:  # the kernel's knock-out routes every user to experts 0..k-1: k distinct, always
            return {k: 1.0}
        return distinct_experts_distribution(E, k, self.batch)

    @cached_property
    def pacing_experts(self) -> dict[int, float]:
        """Distribution of the distinct experts per layer the chip that sets the pace fetches, count -> probability
        (exact, uniform routing): the busiest chip's or group's where experts are placed whole, this chip's (every
        chip's) otherwise."""
        E = self.share.num_experts
        if self.share.is_moe and self.experts_held < E:
            return busiest_chip_distribution(E, self.expert_groups, self.share.top_k, self.batch)
        return self.distinct_experts

    def fetch_probability(self, ld: Load) -> float:
        """Probability that the kernel issues ``ld``: 1, or for routed slot j, P(more than j distinct experts)."""
        if ld.expert is None:
            return 1.0
        return sum(p for n, p in self.distinct_experts.items() if n > ld.expert)

    def _bytes(self, attr: str, distinct: dict[int, int] | None = None) -> int | float:
        if distinct is None:
            return sum(getattr(ld, attr) * self.fetch_probability(ld) for ld in self.loads)
        return sum(getattr(ld, attr) for ld in self.loads if ld.expert is None or ld.expert < distinct[ld.layer])

    @cached_property
    def weight_bytes(self) -> float:
        """Weight bytes the DMAs move in one step, expected under uniform routing (padding included)."""
        return self._bytes("nbytes")

    @cached_property
    def payload_bytes(self) -> float:
        """Of ``weight_bytes``, the bytes that hold real weights (the rest is the layout's padding)."""
        return self._bytes("payload_bytes")

    @cached_property
    def weight_bytes_max(self) -> int:
        """Weight bytes when every expert slot holds a distinct expert (the upper bound)."""
        return sum(ld.nbytes for ld in self.loads)

    def weight_bytes_for(self, distinct: dict[int, int]) -> int:
        """Weight bytes the DMAs move for a given routing: ``distinct[layer]`` experts fetched per layer."""
        return self._bytes("nbytes", distinct)

    @property
    def kv_bytes(self) -> int:
        return sum(op.kv_bytes + (op.serial_bytes if op.kind == "Attend" else 0) for op in self.ops)

    @property
    def kv_payload_bytes(self) -> float:
        """Of ``kv_bytes``, the bytes that hold the cache's values (:meth:`kv_payload`)."""
        return sum(self.kv_payload(op) for op in self.ops if op.kind == "Attend")

    def kv_payload(self, op) -> float:
        """The cache bytes attention ``op`` moves, without the layout's padding: the layout pads a head dim to its
        ``head_width`` (48 -> 64, 96 -> 128: each head's K and V), an MLA latent is read as it is."""
        moved = op.kv_bytes + op.serial_bytes
        if self.share.latent_attention is None:  # of a group's lanes, its heads' own dims
            t = op.layer_type
            heads = self.cache_heads(t)
            moved *= heads * self.share.head_dim(t) / heads_lanes(heads, self.layout.head_dim(t))
        return moved

    @property
    def flops(self) -> int:
        return sum(op.flops for op in self.ops)

    def bytes_by_component(self, payload: bool = False) -> dict[str, float]:
        """Expected weight bytes by component (``payload``: without the layout's padding)."""
        out: dict[str, float] = {}
        for ld in self.loads:
            out[ld.component] = out.get(ld.component, 0) + (
                ld.payload_bytes if payload else ld.nbytes
            ) * self.fetch_probability(ld)
        return out

    # VMEM (mk.plan.vmem) -------------------------------------------------------------------------
    def vmem_breakdown(self, with_logits: bool = False) -> dict[str, int]:
        return vmem_breakdown(self, with_logits)

    @property
    def vmem_bytes(self) -> int:
        return sum(self.vmem_breakdown().values())

    def check_vmem(self, chip) -> int:
        return check_vmem(self, chip)

    def vmem_limit(self, chip) -> int:
        """The VMEM limit a compile of this plan for ``chip`` is given (mk.plan.vmem.vmem_limit)."""
        return vmem_limit(self, chip)

    def table(self) -> list[dict]:
        """The items as rows (for a DataFrame): item (dma start, dma wait, compute), layer, what, bytes, flops."""
        loads = {ld.id: ld for ld in self.loads}
        rows = []
        for i, it in enumerate(self.items):
            if isinstance(it, Op):
                rows.append(
                    dict(
                        step=i,
                        item="compute",
                        layer=it.layer,
                        component=it.component,
                        what=it.kind,
                        bytes=it.kv_bytes + it.serial_bytes,
                        flops=it.flops,
                        expert=it.expert,
                    )
                )
            else:
                ld = loads[it.load]
                rows.append(
                    dict(
                        step=i,
                        item="dma start" if isinstance(it, Start) else "dma wait",
                        layer=ld.layer,
                        component=ld.component,
                        what=f"{ld.tensor}[{ld.rows[0]}:+{ld.rows[1]}, {ld.cols[0]}:+{ld.cols[1]}]",
                        bytes=ld.nbytes if isinstance(it, Start) else 0,
                        flops=0,
                        expert=ld.expert,
                    )
                )
        return rows

    def loop_summary(self) -> list[dict]:
        """:meth:`loop_table` with the loops that repeat layer after layer said once (for a DataFrame): each
        kind of loop (component, tensors, repeats, ops per repeat, inside the loop over layers or not) with the
        layers it runs in (``0-4, 24-28``) and how many of it the kernel writes."""
        groups: dict[tuple, list] = {}
        for r in self.loop_table():
            key = (r["component"], r["tensors"], r["repeats"], r["ops_per_repeat"], r["in_layer_loop"])
            groups.setdefault(key, []).append(r["layer"])
        return [
            dict(
                component=c,
                tensors=t,
                repeats=n,
                ops_per_repeat=o,
                in_layer_loop=inside,
                loops=len(layers),
                layers=_ranges(layers),
            )  # fmt: skip
            for (c, t, n, o, inside), layers in groups.items()
        ]

    def phase_table(self, layers: int = 1) -> list[dict]:
        """The start of the plan, up to the first op of layer ``layers``, in phases (for a DataFrame): each run
        of items whose op or wait is for one component of one layer, with the DMAs it issues meanwhile (tiles
        of later phases among them), its waits and ops, the bytes they move and their FLOPs. The DMAs issued
        before the first op are a phase of their own; layer -1 is what runs before (and after) the layers."""
        rows, phase = [], None
        for r in self.table():
            if r["item"] == "compute" and r["layer"] == layers:
                break
            key = (r["layer"], r["component"]) if r["item"] != "dma start" else phase or (-1, "DMAs issued first")
            if key != phase:
                phase = key
                rows.append(dict(first_step=r["step"], last_step=r["step"], layer=key[0], component=key[1],
                                 dma_starts=0, dma_waits=0, ops=0, MB=0.0, MFLOP=0.0, op_kinds=[]))  # fmt: skip
            row = rows[-1]
            row["last_step"] = r["step"]
            row[{"dma start": "dma_starts", "dma wait": "dma_waits", "compute": "ops"}[r["item"]]] += 1
            row["MB"] += r["bytes"] / 1e6
            row["MFLOP"] += r["flops"] / 1e6
            if r["item"] == "compute" and r["what"] not in row["op_kinds"]:
                row["op_kinds"].append(r["what"])
        return [dict(r, op_kinds=", ".join(r["op_kinds"])) for r in rows]


def _ranges(layers) -> str:
    """Layer indices as runs (``[0, 1, 2, 5]`` -> ``"0-2, 5"``); a label that is not an index (``"0..23"``) as is."""
    out, run = [], []
    for x in layers:
        if isinstance(x, int) and run and x == run[-1] + 1:
            run.append(x)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [x] if isinstance(x, int) else []
        if not isinstance(x, int):
            out.append(str(x))
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def build_plan(
    cfg: ModelConfig,
    batch: int,
    max_len: int,
    context: int | None = None,
    *,
    weight_dtype: str = "float32",
    kv_dtype: str = "float32",
    tiles: Tiles = Tiles(),
    knockout=frozenset(),
    loop_layers: bool = True,
    setup: KernelSetup = ONE_CHIP,
    chip_index: int = 0,
    quantize: str = "none",
) -> StepPlan:
    """The plan of one decode step for ``batch`` users with caches of ``max_len`` positions, on one chip or, with
    ``setup`` (mk.kernel_setup.KernelSetup) over several chips, chip ``chip_index``'s share of it, the gated MLPs laid
    out as the setup says.

    ``context`` (positions in the cache after this step, default ``max_len``) only sets the KV bytes
    and attention FLOPs recorded for timing; the kernel itself reads the tiles each user's position needs.
    ``weight_dtype``, ``kv_dtype``: the float weights' and the KV cache's element types (mk.dtypes.ARRAY_DTYPES).
    ``quantize`` (mk.params.SCHEMES): the matrices that stream as INT8 codes, each tile with its scales; or a shipped
    format (mk.format_trees.FORMAT_SCHEMES): its matrices stream as its codes, each tile with its blocks' scales.
    ``setup.draft_tokens``: speculative verification of that many drafted tokens per user: each user's 1 + k rows go
    through one weight pass (the plan's ``batch`` counts rows) and attend over the user's cache.

    A plan is a pure function of its arguments and is not changed after it is made: the last plans built are
    kept and handed out again (the timing model, the kernel builder and the tables ask for the same ones often).
    """
    request = PlanRequest(
        cfg, batch, max_len, max_len if context is None else context, weight_dtype, kv_dtype, tiles,
        check_knockout(knockout), loop_layers, setup, chip_index, quantize,
    )  # fmt: skip
    return _built_plan(request)


@dataclass(frozen=True)
class PlanRequest:
    """What a plan is built from (:func:`build_plan`'s arguments, the context given): one record, the key its cache
    keeps the plan under, and what the builder reads."""

    cfg: ModelConfig
    batch: int
    max_len: int
    context: int
    weight_dtype: str
    kv_dtype: str
    tiles: Tiles
    knockout: frozenset
    loop_layers: bool
    setup: KernelSetup
    chip_index: int
    quantize: str


def check_positions_split(cfg: ModelConfig, setup, max_len: int) -> dict:
    """How many chips share each layer type's KV head's positions (mk.sharding.position_share), refusing a cache that
    does not split into that many whole blocks of BLOCK slots."""
    shares = {t: position_share(cfg, t, setup) for t in set(cfg.layer_types)}
    for t, g in shares.items():
        check_slots_shared(t, g, cache_slots(cfg, t, max_len, setup.draft_tokens))
    return shares


def check_slots_shared(layer_type: str, g: int, slots: int) -> None:
    """Refuse a ``layer_type`` KV head's cache of ``slots`` that ``g`` chips sharing its positions cannot split into
    whole blocks of BLOCK."""
    if slots % (g * BLOCK):
        raise ValueError(
            f"attention split by positions: {g} chips share each {layer_type} KV head, but its cache of {slots} slots "
            f"does not split into {g} whole blocks of {BLOCK}; use a max_len (and a sliding window) that rounds to a "
            f"multiple of {g * BLOCK} slots, or attention_split='heads'"
        )


@lru_cache(maxsize=64)
def _built_plan(request: PlanRequest) -> StepPlan:
    r, setup = request, request.setup
    cfg, draft_tokens = setup.laid_out(r.cfg), setup.draft_tokens
    if not 0 <= r.chip_index < setup.chips:
        raise ValueError(f"chip {r.chip_index} is not one of the {setup.chips} chips (0..{setup.chips - 1})")
    check_shapes(cfg, r.batch, r.max_len, r.context, array_itemsize(r.kv_dtype), r.tiles)
    users_per_chip(cfg, setup, r.batch)  # refuses a users split the batch or the heads cannot take
    rows = r.batch * (draft_tokens + 1)
    shares = check_positions_split(cfg, setup, r.max_len)
    local, held = chip_config(cfg, setup), experts_per_chip(cfg, setup)
    split = attention_chips(cfg, setup) > 1
    fmt = FORMAT_SCHEMES.get(r.quantize)
    quantized = frozenset(format_paths(local, r.quantize) if fmt else quantized_paths(local, r.quantize))
    b = Builder(request, cfg, local, rows, held, split, quantized, shares, fmt)
    b.build()
    # without overlap, no weight DMA is in flight across an all-reduce
    fences = () if setup.collective.overlap else {n for n, op in enumerate(b.ops) if isinstance(op, AllReduce)}
    items = schedule(b.ops, b.loads, b.route_of, r.tiles.slots, fences, r.tiles.lookahead_bytes)
    return StepPlan(
        local, rows, r.max_len, r.context, r.weight_dtype, r.kv_dtype, r.tiles, r.knockout, dict(b.buffers),
        tuple(b.loads), tuple(items), dict(b.acts), r.loop_layers, cfg if setup.sharded else None,
        setup if setup.sharded else None, r.chip_index, held, r.quantize, draft_tokens,
    )  # fmt: skip
