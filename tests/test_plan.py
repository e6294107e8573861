"""The step plan: order, slots, expert dependencies, bytes, TPU-legal tiles and the VMEM budget."""

from dataclasses import replace
from pathlib import Path

import pytest

from mk.chips import get_chip
from mk.config import GEMMA4_26B_A4B, GEMMA4_31B, TINY_DENSE, TINY_MOE, get_config, with_layers
from mk.params import EXPERTS, KNOCKOUTS, param_specs
from mk.plan import (
    OP_KINDS,
    AllReduce,
    Attend,
    ExpertCombine,
    GatedAct,
    GatherBest,
    HeadTile,
    MatmulTile,
    NoHead,
    Op,
    Route,
    Start,
    Tiles,
    Wait,
    build_plan,
    head_groups,
    head_width,
    heads_lanes,
    layers_in_hbm,
)
from mk.routing import expected_distinct_experts
from mk.sol import bytes_per_token


def _positions(plan):
    start, wait, use, op_at = {}, {}, {}, {}
    for n, it in enumerate(plan.items):
        if isinstance(it, Start):
            start[it.load] = n
        elif isinstance(it, Wait):
            wait[it.load] = n
        else:
            op_at[id(it)] = n
            if it.load is not None:
                use[it.load] = n
    return start, wait, use


@pytest.mark.parametrize(
    "cfg,batch",
    [(TINY_DENSE, 1), (TINY_MOE, 4), (GEMMA4_26B_A4B.truncated(6), 2)],
    ids=lambda x: getattr(x, "name", str(x)),
)
def test_every_load_started_then_waited_then_used_and_slots_respected(cfg, batch):
    plan = build_plan(cfg, batch, 2048 if cfg.sliding_window > 16 else 64, weight_dtype="bfloat16", kv_dtype="bfloat16")
    start, wait, use = _positions(plan)
    assert set(start) == set(wait) == set(use) == {ld.id for ld in plan.loads}
    for ld in plan.loads:
        assert start[ld.id] < wait[ld.id] < use[ld.id]
    # a slot is reused only after the tile that held it was computed on
    by_buffer = {}
    for ld in plan.loads:
        by_buffer.setdefault(ld.buffer, []).append(ld)
    for loads in by_buffer.values():
        for k, ld in enumerate(loads):
            assert ld.slot == k % plan.tiles.slots
            if k >= plan.tiles.slots:
                assert use[loads[k - plan.tiles.slots].id] < start[ld.id]


def test_weight_dmas_stay_ahead_of_compute_across_layers():
    plan = build_plan(TINY_DENSE, 1, 64)
    start, _, use = _positions(plan)
    for i in range(TINY_DENSE.num_layers - 1):
        last_use = max(use[ld.id] for ld in plan.loads if ld.layer == i)
        first_next = min(start[ld.id] for ld in plan.loads if ld.layer == i + 1)
        assert first_next < last_use, f"layer {i + 1}'s first tile is not in flight before layer {i} ends"
    # and every compute but the first waits on a tile that was started before the previous compute
    ops = [n for n, it in enumerate(plan.items) if isinstance(it, Op) and it.load is not None]
    for a, b in zip(ops, ops[1:]):
        assert start[plan.items[b].load] < a


def test_expert_dmas_start_right_after_routing_and_only_then():
    plan = build_plan(TINY_MOE, 2, 64)
    route_at = {it.layer: n for n, it in enumerate(plan.items) if isinstance(it, Route)}
    start, _, _ = _positions(plan)
    for ld in plan.loads:
        if ld.component == EXPERTS:
            assert start[ld.id] > route_at[ld.layer]
    for layer, n in route_at.items():
        first = min(start[ld.id] for ld in plan.loads if ld.component == EXPERTS and ld.layer == layer)
        assert first == n + 1, "the first expert DMA is issued right after the route op"
    # min(B x k, E) expert slots, each fetching gate, up and down
    assert {ld.expert for ld in plan.loads if ld.component == EXPERTS} == set(range(2 * TINY_MOE.top_k))
    assert build_plan(TINY_MOE, 8, 64).expert_slots == TINY_MOE.num_experts


def test_a_known_route_holds_no_experts_tile_back():
    """The route's wait knocked out with the router on a chip that holds every expert: the experts (0..k-1) are known
    before the step, so the first layer's expert tiles start before its route (as their slots allow) and no Route
    lists a table; the router knocked out alone still routes (its experts' tiles wait, as the write-up's knock-out
    table has it), and experts placed whole over chips are still routed to a chip, so there every expert tile waits
    for its route. The route's wait alone is refused: without the router's knock-out the experts are not known."""
    from mk.kernel_setup import KernelSetup, Placement
    from mk.params import ROUTE_WAIT, ROUTER

    probe = {ROUTER, ROUTE_WAIT}
    known = build_plan(TINY_MOE, 1, 64, knockout=probe)
    assert known.route_known and not build_plan(TINY_MOE, 1, 64, knockout={ROUTER}).route_known
    with pytest.raises(ValueError, match="route_wait needs the router knocked out too"):
        build_plan(TINY_MOE, 1, 64, knockout={ROUTE_WAIT})
    route_at = {it.layer: n for n, it in enumerate(known.items) if isinstance(it, Route)}
    start, _, _ = _positions(known)
    first = min(start[ld.id] for ld in known.loads if ld.component == EXPERTS and ld.layer == 0)
    assert first < route_at[0]
    assert all(it.serial_bytes == 0 for it in known.items if isinstance(it, Route))
    whole = build_plan(TINY_MOE, 1, 64, knockout=probe, setup=KernelSetup(2, placement=Placement.WHOLE))
    assert not whole.route_known
    route_at = {it.layer: n for n, it in enumerate(whole.items) if isinstance(it, Route)}
    start, _, _ = _positions(whole)
    assert all(start[ld.id] > route_at[ld.layer] for ld in whole.loads if ld.component == EXPERTS)


def test_dense_plan_streams_every_matrix_once():
    plan = build_plan(TINY_DENSE, 1, 64, weight_dtype="bfloat16")
    matrices = sum(s.size for s in param_specs(TINY_DENSE) if len(s.shape) >= 2)
    assert plan.weight_bytes == plan.payload_bytes == matrices * 2


def test_knockout_drops_its_loads_and_context_sets_kv_bytes():
    full = build_plan(TINY_MOE, 1, 64)
    for c in KNOCKOUTS:
        ko = build_plan(TINY_MOE, 1, 64, knockout={c})
        assert all(ld.component != c for ld in ko.loads), c
        assert ko.weight_bytes < full.weight_bytes or c == "norms", c
    short, long_ = build_plan(TINY_DENSE, 1, 64, context=8), build_plan(TINY_DENSE, 1, 64, context=64)
    assert short.kv_bytes < long_.kv_bytes
    with pytest.raises(ValueError, match="unknown component"):
        build_plan(TINY_DENSE, 1, 64, knockout={"mlp"})


@pytest.mark.parametrize("cfg", [GEMMA4_26B_A4B, GEMMA4_31B], ids=lambda c: c.name)
def test_full_size_tiles_are_tpu_legal_and_fit_v5e(cfg):
    plan = build_plan(cfg.truncated(6), 1, 2048, weight_dtype="bfloat16", kv_dtype="bfloat16")
    for b in plan.buffers.values():
        assert b.shape[0] % 16 == 0 and b.shape[1] % 128 == 0, b
    for ld in plan.loads:
        assert ld.rows[1] % 16 == 0 and ld.cols[1] % 128 == 0, ld
    for chip in ("tpu-v5e", "tpu-v6e"):
        assert plan.check_vmem(chip) == plan.vmem_bytes <= get_chip(chip).vmem_bytes


def test_vmem_overflow_is_a_clear_error():
    plan = build_plan(
        GEMMA4_31B.truncated(6),
        1,
        2048,
        weight_dtype="bfloat16",
        kv_dtype="bfloat16",
        tiles=Tiles(weight_tile_bytes=64 * 2**20, head_tile_bytes=64 * 2**20),
    )
    with pytest.raises(ValueError, match=r"needs .* MiB of VMEM .* has 128 MiB .*weight_tile_bytes"):
        plan.check_vmem("tpu-v5e")
    with pytest.raises(ValueError, match="no checked VMEM"):
        plan.check_vmem("tpu-v7x")


def test_the_vmem_count_takes_in_the_cross_chip_buffers_and_the_limit_never_falls_below_it():
    """Over chips the plan's VMEM counts the exchanges' buffers (none on one chip); the limit the compiler is given is
    a setting of its own (the one the stored schedules were compiled under, mk.plan.vmem.vmem_limit), at least the
    count and at most the core's VMEM."""
    from mk.kernel_setup import WORKBOOK_KERNEL

    one, eight = build_plan(TINY_MOE, 8, 64), build_plan(TINY_MOE, 8, 64, setup=WORKBOOK_KERNEL.on(8))
    assert one.vmem_breakdown()["cross-chip buffers"] == 0 < eight.vmem_breakdown()["cross-chip buffers"]
    for plan, chip in ((one, "tpu-v5e"), (eight, "tpu-v5e-8")):
        assert plan.vmem_bytes <= plan.vmem_limit(chip) <= get_chip(chip).vmem_bytes


def test_bad_sizes_are_refused():
    # caches are padded to whole 16-slot blocks; KV tiles divide the padded cache
    assert build_plan(TINY_DENSE, 1, 40).cache_len("full") == 48
    assert build_plan(TINY_DENSE, 1, 48, tiles=Tiles(kv_tile=32)).kv_tile("full") == 24
    assert build_plan(TINY_DENSE, 1, 48, tiles=Tiles(kv_tile=8)).kv_tile("sliding") == 8
    with pytest.raises(ValueError, match="cuts a .16, 128. tile"):
        build_plan(TINY_DENSE, 1, 48, kv_dtype="bfloat16", tiles=Tiles(kv_tile=8))
    with pytest.raises(ValueError, match="batch"):
        build_plan(TINY_DENSE, 0, 64)
    with pytest.raises(ValueError, match="kv_tile"):
        Tiles(kv_tile=100)
    with pytest.raises(ValueError, match="slots"):
        Tiles(slots=1)


def test_layers_in_hbm_and_table():
    n = layers_in_hbm(GEMMA4_26B_A4B, get_chip("tpu-v5e").hbm_bytes, 1, 2048)
    assert 1 < n < GEMMA4_26B_A4B.num_layers
    assert layers_in_hbm(GEMMA4_31B, get_chip("tpu-v6e").hbm_bytes, 1, 2048) > layers_in_hbm(
        GEMMA4_31B, get_chip("tpu-v5e").hbm_bytes, 1, 2048
    )
    rows = build_plan(TINY_MOE, 1, 64).table()
    assert {r["item"] for r in rows} == {"dma start", "dma wait", "compute"}
    assert sum(r["bytes"] for r in rows if r["item"] == "dma start") == build_plan(TINY_MOE, 1, 64).weight_bytes


def _loop_ops(plan, loop):
    """The compute op of every group of ``loop``, as [repeat][body position]."""

    def op(g):
        return next(it for it in plan.items[slice(*plan.groups[g])] if isinstance(it, Op))

    return [[op(loop.start + k + loop.period * j) for k in range(loop.period)] for j in range(loop.count)]


@pytest.mark.parametrize(
    "cfg,tiles",
    [
        (TINY_MOE, Tiles(weight_tile_bytes=128 * 128 * 4, head_tile_bytes=128 * 128 * 4)),
        (GEMMA4_26B_A4B.truncated(6), Tiles()),
        (GEMMA4_31B.truncated(6), Tiles()),
    ],
    ids=["tiny-moe-small-tiles", "26b-a4b", "31b"],
)
def test_folded_plan_covers_every_item_once_and_loops_repeat_with_fixed_strides(cfg, tiles):
    from dataclasses import replace

    from mk.plan import Loop, start_runs

    plan = build_plan(
        cfg, 2, 2048 if cfg.sliding_window > 16 else 64, weight_dtype="bfloat16", kv_dtype="bfloat16", tiles=tiles
    )
    covered = []
    loads = {ld.id: ld for ld in plan.loads}
    for s in plan.folded:
        covered += list(range(s.start, s.start + s.period * s.count)) if isinstance(s, Loop) else [s]
    assert covered == list(range(len(plan.groups)))
    assert [n for g in plan.groups for n in range(*g)] == list(range(len(plan.items)))
    loops = [s for s in plan.folded if isinstance(s, Loop)]
    assert loops and {type(it) for s in loops for rep in _loop_ops(plan, s) for it in rep} <= {
        MatmulTile,
        GatedAct,
        ExpertCombine,
        HeadTile,
    }
    for s in loops:
        reps = _loop_ops(plan, s)
        for j, rep in enumerate(reps):
            for a, b, op in zip(reps[0], reps[1], rep):
                lin = {
                    f: getattr(a, f) + (getattr(b, f) - getattr(a, f)) * j
                    for f in a.STRIDED
                    if getattr(a, f) is not None and not isinstance(getattr(a, f), bool)
                }
                flags = {f: getattr(op, f) for f in a.STRIDED if isinstance(getattr(a, f), bool)}
                if a.load is not None:
                    lin["load"] = op.load
                assert replace(a, **lin, **flags) == op
                assert all(getattr(a, f) == v or (not getattr(a, f) and j >= 1 and v) for f, v in flags.items())
                if op.load is not None:
                    la, lb, lo = loads[a.load], loads[b.load], loads[op.load]
                    assert lo.slot == (la.slot + (lb.slot - la.slot) % plan.tiles.slots * j) % plan.tiles.slots
                    assert (
                        replace(
                            la,
                            id=lo.id,
                            slot=lo.slot,
                            rows=(la.rows[0] + (lb.rows[0] - la.rows[0]) * j, la.rows[1]),
                            cols=(la.cols[0] + (lb.cols[0] - la.cols[0]) * j, la.cols[1]),
                            expert=lo.expert,
                        )
                        == lo
                    )
        # the Starts of each body position, as runs, are exactly the plan's Starts
        for k in range(s.period):
            starts = [
                [
                    loads[it.load]
                    for it in plan.items[slice(*plan.groups[s.start + k + s.period * j])]
                    if isinstance(it, Start)
                ]
                for j in range(s.count)
            ]

            def where(ld):
                return ld.tensor, ld.rows, ld.cols, ld.slot, ld.expert

            got = []
            for lo, hi, a, b in start_runs(starts, plan.tiles.slots):
                assert b is not None or hi == lo + 1
                b = b or a
                got += [
                    (
                        j,
                        a.tensor,
                        (a.rows[0] + (b.rows[0] - a.rows[0]) * (j - lo), a.rows[1]),
                        (a.cols[0] + (b.cols[0] - a.cols[0]) * (j - lo), a.cols[1]),
                        (a.slot + (b.slot - a.slot) % plan.tiles.slots * (j - lo)) % plan.tiles.slots,
                        None if a.expert is None else a.expert + (b.expert - a.expert) * (j - lo),
                    )
                    for j in range(lo, hi)
                ]
            want = [(j, *where(ld)) for j, lds in enumerate(starts) for ld in lds]
            assert sorted(got, key=str) == sorted(want, key=str)


def test_emitted_code_does_not_grow_with_the_tiles():
    """Halving the tiles doubles the DMAs and matmuls of a full-size step, not the ops the kernel writes
    code for (every regular run of tiles is one loop)."""
    cut = GEMMA4_31B.truncated(6)
    big, small = (
        build_plan(
            cut,
            1,
            2048,
            weight_dtype="bfloat16",
            kv_dtype="bfloat16",
            tiles=Tiles(weight_tile_bytes=b, head_tile_bytes=b),
        )
        for b in (4 * 2**20, 2 * 2**20)
    )
    assert len(small.ops) > 1.5 * len(big.ops)
    assert small.emitted_ops == big.emitted_ops < len(big.ops) / 10
    moe = build_plan(GEMMA4_26B_A4B.truncated(6), 4, 2048, weight_dtype="bfloat16", kv_dtype="bfloat16")
    experts = [r for r in moe.loop_table() if r["component"] == EXPERTS]
    assert len(experts) == 6 and all(r["repeats"] == 4 * GEMMA4_26B_A4B.top_k for r in experts)


def test_expert_bytes_count_the_distinct_experts_the_kernel_fetches():
    """The plan's expected expert bytes use the expected number of distinct experts (exact under uniform
    routing); at B = 8 the plan's real-weight bytes agree with mk.sol's within 1%."""
    cfg = GEMMA4_26B_A4B
    plan = build_plan(cfg, 8, 1024, weight_dtype="bfloat16", kv_dtype="bfloat16")
    sol = bytes_per_token(cfg, 1024, 8, "bf16")
    assert abs(plan.payload_bytes + plan.kv_bytes - sol.total) / sol.total < 0.01
    assert plan.bytes_by_component(payload=True)[EXPERTS] == pytest.approx(sol.by_component[EXPERTS], rel=1e-9)
    # the upper bound (every slot a distinct expert) overstates by the duplicates: ~27% at B = 8
    per_slot = sum(ld.nbytes for ld in plan.loads if ld.expert == 0)
    n = expected_distinct_experts(cfg.num_experts, cfg.top_k, 8)
    assert plan.weight_bytes_max - plan.weight_bytes == pytest.approx(per_slot * (plan.expert_slots - n), rel=1e-9)
    # a realised routing: 10 distinct experts in every layer
    realised = plan.weight_bytes_for({i: 10 for i in range(cfg.num_layers)})
    assert realised == plan.weight_bytes_max - per_slot * (plan.expert_slots - 10)


def test_every_op_kind_has_its_cost_and_an_emitter():
    from mk.megakernel.emit import EMIT
    from mk.plan import ReadAhead

    assert set(EMIT) == set(OP_KINDS)
    plan = build_plan(TINY_MOE, 2, 64, context=40)
    kinds = {type(op) for op in plan.ops}
    # the cross-chip ops: tests/test_sharding.py; a layer's KV tiles read ahead: Tiles.kv_ahead's own test below
    assert kinds == set(OP_KINDS) - {NoHead, AllReduce, GatherBest, ReadAhead}
    assert NoHead in {type(op) for op in build_plan(TINY_MOE, 2, 64, knockout={"head"}).ops}
    att = [op for op in plan.ops if isinstance(op, Attend)]
    assert all(op.kv_bytes + op.serial_bytes > 0 and op.flops > 0 for op in att)


def test_the_layer_pattern_is_one_loop_and_code_stops_growing_with_depth():
    """Repeats of the sliding/full pattern fold into one LayerLoop whose every repeat is the first stepped
    linearly; past the repeats the loop holds, more layers add no emitted code (loop_layers=False: they do)."""
    from mk.plan import LayerLoop

    pattern = TINY_MOE.layer_types
    emitted, unrolled = [], []
    for reps in (4, 8, 16):
        cfg = TINY_MOE.replace(name=f"x{reps}", layer_types=pattern * reps)
        plan = build_plan(cfg, 2, 64)
        ll = [s for s in plan.folded if isinstance(s, LayerLoop)]
        assert len(ll) == 1 and ll[0].count >= reps - 2
        emitted.append(plan.emitted_ops)
        unrolled.append(build_plan(cfg, 2, 64, loop_layers=False).emitted_ops)
    assert emitted[0] == emitted[1] == emitted[2]
    assert unrolled[0] < unrolled[1] < unrolled[2]
    # the real models: their layer patterns loop too
    for cfg in (GEMMA4_26B_A4B, GEMMA4_31B):
        plan = build_plan(cfg, 1, 2048, weight_dtype="bfloat16", kv_dtype="bfloat16")
        assert any(isinstance(s, LayerLoop) for s in plan.folded)
        assert (
            plan.emitted_ops
            < build_plan(cfg, 1, 2048, weight_dtype="bfloat16", kv_dtype="bfloat16", loop_layers=False).emitted_ops / 2
        )


def test_the_plan_start_in_phases_and_its_loops_said_once():
    plan = build_plan(GEMMA4_26B_A4B, 1, 1024, context=1024, weight_dtype="bfloat16", kv_dtype="bfloat16")
    phases = plan.phase_table(1)
    items = plan.table()
    first = next(r["step"] for r in items if r["item"] == "compute" and r["layer"] == 1)
    assert sum(p["dma_starts"] + p["dma_waits"] + p["ops"] for p in phases) == first  # every item up to layer 1
    assert phases[0]["component"] == "DMAs issued first" and phases[0]["ops"] == 0
    assert sum(p["MB"] for p in phases) == pytest.approx(sum(r["bytes"] for r in items[:first]) / 1e6)
    summary = plan.loop_summary()
    assert sum(s["loops"] for s in summary) == len(plan.loop_table()) and len(summary) < len(plan.loop_table()) / 3
    assert {"0-4", "24-28"} <= {s["layers"] for s in summary if s["component"] == "sliding_attention"}


CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"


@pytest.mark.parametrize("folder", sorted(p.name for p in CONFIGS.iterdir() if p.is_dir()))
@pytest.mark.parametrize("batch, context", [(1, 1024), (8, 1024), (1, 32768)])
def test_every_familys_plan_reads_the_bytes_of_mk_sol(folder, batch, context):
    """The plan of any config mk.config reads (MLA's latent cache, sinks and biases, untied heads, MoE without a shared
    expert, dense first layers) streams, of real weights and cache, the bytes mk.sol counts, within 1%; what the
    layout pads (a head dim under 128 lanes) is on top."""
    cfg = get_config(CONFIGS / folder)
    plan = build_plan(cfg, batch, context, weight_dtype="bfloat16", kv_dtype="bfloat16")
    sol = bytes_per_token(cfg, context, batch, "bf16")
    assert abs(plan.payload_bytes + plan.kv_payload_bytes - sol.total) / sol.total < 0.01
    assert plan.kv_bytes >= plan.kv_payload_bytes and plan.weight_bytes >= plan.payload_bytes


def test_dense_first_layers_and_the_latent_cache_in_the_plan():
    cfg = get_config(CONFIGS / "deepseek-v3")
    plan = build_plan(cfg, 1, 4096, weight_dtype="bfloat16", kv_dtype="bfloat16")
    routed = {ld.layer for ld in plan.loads if ld.component == EXPERTS}
    assert cfg.dense_layers == (0, 1, 2) and min(routed) == 3 and len(routed) == cfg.num_layers - 3
    attends = [op for op in plan.ops if isinstance(op, Attend)]
    assert len(attends) == cfg.num_layers
    # one latent (512) and one RoPE key (64) a position, bf16, whatever the 128 heads
    per_layer = (attends[0].kv_bytes + attends[0].serial_bytes) / (4096 - 1 + 16)
    assert per_layer == pytest.approx((512 + 64) * 2, rel=1e-9)


@pytest.mark.parametrize("chip", ["tpu-v5e-8", "tpu-v6e-8"])
@pytest.mark.parametrize("cfg", [GEMMA4_26B_A4B, GEMMA4_31B], ids=lambda c: c.name)
@pytest.mark.parametrize("batch", [1, 8])
def test_intermediate_on_rows_moves_only_the_weights(cfg, chip, batch):
    """With the gated MLPs' intermediate on rows (the default layout) a chip's DMAs move within 3% of the real
    bytes of its share of the weights, split experts; the first layout, on lanes, pads a split 26B-A4B expert's
    704 / 8 = 88 columns to 128 lanes and the shared MLP's 264 to 384: over 20% more."""
    from mk.kernel_setup import KernelSetup
    from mk.timing import step_plan

    def plan(layout):
        return step_plan(cfg, get_chip(chip), 1024, batch, "bf16", KernelSetup(ffn_layout=layout))

    rows, lanes = plan("sublanes"), plan("lanes")
    assert rows.payload_bytes == pytest.approx(lanes.payload_bytes, rel=1e-12)  # the same weights either way
    assert rows.weight_bytes <= 1.03 * rows.payload_bytes
    if cfg is GEMMA4_26B_A4B:
        assert lanes.weight_bytes > 1.2 * lanes.payload_bytes


@pytest.mark.parametrize("chip", ["tpu-v5e-8", "tpu-v6e-8"])
@pytest.mark.parametrize("scheme", ["int8-experts", "int8"])
def test_int8_scales_cost_at_most_two_percent_of_their_codes(scheme, chip):
    """The scale blocks an INT8 step's DMAs move beside the codes (26B-A4B, split experts): at most 2% of the codes'
    bytes. A split expert's down projection is scaled per input channel, so a chip reads its own 88 rows' scales,
    not all 2816 output channels' for each expert (mk.params.INPUT_SCALED)."""
    from mk.kernel_setup import KernelSetup
    from mk.timing import step_plan

    plan = step_plan(GEMMA4_26B_A4B, get_chip(chip), 1024, 1, scheme, KernelSetup())
    scaled = [ld for ld in plan.loads if ld.scaled]
    codes = sum((ld.nbytes - ld.scale_bytes) * plan.fetch_probability(ld) for ld in scaled)
    scales = sum(ld.scale_bytes * plan.fetch_probability(ld) for ld in scaled)
    assert scaled and any(ld.row_scales for ld in scaled)
    assert scales <= 0.02 * codes, scales / codes


def test_positions_split_over_the_chips_sharing_a_kv_head():
    """26B-A4B over 8 chips: 2 full-layer KV heads, so 4 chips share each. Split, each holds a quarter of its slots,
    reads about a quarter of the full layers' cache at 128K (the sliding layers' 8 heads are not shared), and sends
    its query heads and partial states to the other 3 (two rounds a full layer); a cache that does not split into
    whole blocks on each chip is refused with what to use."""
    from mk.kernel_setup import KernelSetup

    def plan(split, max_len=131072):
        setup = KernelSetup(8, attention_split="positions" if split else "heads")
        return build_plan(GEMMA4_26B_A4B, 1, max_len, weight_dtype="bfloat16", kv_dtype="bfloat16", setup=setup)

    whole, split = plan(False), plan(True)
    assert (split.position_share("full"), split.position_share("sliding")) == (4, 1)
    assert split.cache_len("full") == whole.cache_len("full") // 4 and split.cache_len("sliding") == whole.cache_len(
        "sliding"
    )

    def kv(p, t):
        return sum(op.kv_bytes + op.serial_bytes for op in p.ops if isinstance(op, Attend) and op.layer_type == t)

    assert kv(split, "full") == pytest.approx(kv(whole, "full") / 4, rel=0.01)
    assert kv(split, "sliding") == kv(whole, "sliding")
    shared = [op for op in split.ops if isinstance(op, Attend) and op.positions_shared > 1]
    assert len(shared) == GEMMA4_26B_A4B.layer_types.count("full") and all(op.rounds == 2 for op in shared)
    assert all(op.sent_bytes > 0 for op in shared)
    with pytest.raises(ValueError, match="multiple of 64 slots"):
        plan(True, max_len=1000)


def _attend_kv(p, t):
    return sum(op.kv_bytes + op.serial_bytes for op in p.ops if isinstance(op, Attend) and op.layer_type == t)


def test_users_split_over_the_chips():
    """26B-A4B, 16 users over 8 chips, 32K: with the users split a chip holds and reads 2 users' caches of every KV
    head, which is an even 1/C share of the cache for both layer types (by heads the full layers' 2 heads are read
    whole by 4 chips each), attends for all 16 query heads, and sends its heads' q, k, v out and the outputs back in
    every layer (two rounds); a batch the chips do not divide, and a model whose heads are not split, are refused."""
    from mk.kernel_setup import KernelSetup

    def plan(split, batch=16, cfg=GEMMA4_26B_A4B):
        setup = KernelSetup(8, attention_split=split)
        return build_plan(cfg, batch, 32768, weight_dtype="bfloat16", kv_dtype="bfloat16", setup=setup)

    heads, users = plan("heads"), plan("users")
    assert users.cache_users == 2 and users.cache_heads("full") == 2 and users.cache_heads("sliding") == 8
    one = build_plan(GEMMA4_26B_A4B, 16, 32768, weight_dtype="bfloat16", kv_dtype="bfloat16")
    for t in ("sliding", "full"):
        assert _attend_kv(users, t) == pytest.approx(_attend_kv(one, t) / 8, rel=1e-6)
    assert _attend_kv(users, "sliding") == pytest.approx(_attend_kv(heads, "sliding"), rel=1e-6)
    assert _attend_kv(users, "full") == pytest.approx(_attend_kv(heads, "full") / 4, rel=1e-6)
    attends = [op for op in users.ops if isinstance(op, Attend)]
    assert all(op.users_split and op.rounds == 2 and op.sent_bytes > 0 for op in attends)
    assert {op.query_rows for op in attends} == {16 // 8, 16 // 2}
    with pytest.raises(ValueError, match="multiple of 8"):
        plan("users", batch=4)
    with pytest.raises(ValueError, match="not split"):
        plan("users", cfg=GEMMA4_26B_A4B.replace(num_heads=4, sliding_kv_heads=4))


def test_narrow_heads_share_a_group_of_lanes_and_move_no_padding():
    """A head under 128 lanes takes the next power of two of lanes and shares a 128-lane group with its neighbours
    (kernel revision 3): llama-3.2-1b's 64-wide heads move their projections' and cache's own bytes, no padding; a
    48-wide head pads to 64 and three of them take two groups: their cache's payload is 3 x 48 of the 256 lanes."""
    assert [head_width(d) for d in (0, 16, 48, 64, 96, 128, 256)] == [0, 16, 64, 64, 128, 128, 256]
    llama = get_config("llama-3.2-1b")
    plan = build_plan(llama, 1, 8192)
    assert plan.kv_payload_bytes == plan.kv_bytes
    q = [ld for ld in plan.loads if ld.tensor == "full.q" and ld.layer == 0]
    moved = sum(ld.nbytes for ld in q)
    assert moved == sum(ld.payload_bytes for ld in q)
    assert moved == llama.hidden_size * llama.num_heads * llama.full_head_dim * plan.weight_itemsize
    odd = TINY_DENSE.replace(name="odd", num_heads=3, sliding_kv_heads=3, full_kv_heads=3, sliding_head_dim=48,
                             full_head_dim=48)  # fmt: skip
    plan = build_plan(odd, 1, 1024)
    assert plan.kv_payload_bytes == pytest.approx(3 * 48 / 256 * plan.kv_bytes)
    assert [head_groups(3, head_width(48)), heads_lanes(3, head_width(48))] == [2, 256]


def test_head_tiles_are_equal_unless_they_would_be_small():
    """Llama's 1,002 vocabulary lanes divide into equal 3 MiB tiles (kept: one loop); Qwen3's 1,187 lanes are prime,
    so equal tiles would be 128 rows (0.5 MiB): its head takes the widest tiles under the budget, the last narrower."""
    qwen = build_plan(with_layers("qwen3-30b-a3b", 1), 1, 1024, weight_dtype="bfloat16")
    assert qwen.head_tile == 2048 and len(qwen.head_spans) == 75
    assert qwen.head_spans[-1] == (74 * 2048, 151936 - 74 * 2048)
    assert [r for r, _ in qwen.head_spans] == list(range(0, 151936, 2048))
    llama = build_plan(with_layers("llama-3.2-1b", 1), 1, 1024, weight_dtype="bfloat16")
    assert set(llama.head_spans) == {(r, 768) for r in range(0, 128256, 768)}
    # the kernel's earlier head (revisions before 5): equal tiles at any size, a knob for timing one beside the other
    old = build_plan(with_layers("qwen3-30b-a3b", 1), 1, 1024, weight_dtype="bfloat16", tiles=Tiles(head_equal_share=0))
    assert set(old.head_spans) == {(r, 128) for r in range(0, 151936, 128)}


def test_a_lookahead_window_holds_copies_back_to_within_its_bytes_and_never_past_their_use():
    """With Tiles.lookahead_bytes a tile's copy starts no earlier than the default schedule's and no earlier than when
    the tiles consumed before it come within the window of its first byte; it still starts before its wait, and a window
    wider than the step's bytes is the default schedule."""
    small = Tiles()  # each matrix a tile, in buffers by shape: most copies start a layer or more ahead
    base = build_plan(TINY_MOE, 2, 64, tiles=small)
    window = round(base.weight_bytes_max / 8)
    held = build_plan(TINY_MOE, 2, 64, tiles=replace(small, lookahead_bytes=window))
    assert [ld for ld in held.loads] == [ld for ld in base.loads]
    s0, _, use0 = _positions(base)
    s1, w1, use1 = _positions(held)
    ops0 = [it for it in base.items if isinstance(it, Op)]
    consumed, first, total = [], {}, 0  # the bytes the ops read before each tile, in order
    for op in ops0:
        if op.load is not None:
            first[op.load] = total
            total += next(ld.nbytes for ld in base.loads if ld.id == op.load)
        consumed.append(total)
    op_index = {n: k for k, n in enumerate(n for n, it in enumerate(held.items) if isinstance(it, Op))}
    later = 0
    for ld in held.loads:
        assert s1[ld.id] < w1[ld.id] < use1[ld.id]
        ops_before = sum(1 for n in range(s1[ld.id]) if n in op_index)  # ops run before the copy starts
        ops_before_default = sum(1 for n in range(s0[ld.id]) if isinstance(base.items[n], Op))
        assert ops_before >= ops_before_default
        if first[ld.id] > window:  # not before the bytes consumed come within the window
            assert ops_before >= 1 and consumed[ops_before - 1] >= first[ld.id] - window
        later += ops_before > ops_before_default
    assert later > 0, "a window of an eighth of the step holds some copies back"
    wide = build_plan(TINY_MOE, 2, 64, tiles=replace(small, lookahead_bytes=10 * total))
    assert wide.items == base.items


def test_kv_tiles_read_ahead_start_at_the_layers_start_and_the_timeline_queues_them_there():
    """Tiles.kv_ahead: each layer's first KV tiles (two at 1K, of 512 positions each) are a ReadAhead before its q
    projection; the plan's KV bytes stay its Attends'; the timeline moves the same bytes on the DMA lane, queued where
    the layer starts, and the layer's Attend waits for them there rather than reading its first tile itself."""
    from mk.plan import MatmulTile, ReadAhead
    from mk.timing import pace_timeline

    cfg = with_layers("gemma4-26b-a4b", 2)
    plans = {on: build_plan(cfg, 1, 1024, weight_dtype="bfloat16", kv_dtype="bfloat16", tiles=Tiles(kv_ahead=on))
             for on in (False, True)}  # fmt: skip
    ahead = plans[True]
    ops = list(ahead.ops)
    reads = [n for n, op in enumerate(ops) if isinstance(op, ReadAhead)]
    assert len(reads) == 2 and not any(isinstance(op, ReadAhead) for op in plans[False].ops)
    for n in reads:  # right before the layer's first projection, both tiles of its cache at 1K
        nxt = ops[n + 1]
        assert isinstance(nxt, MatmulTile) and nxt.layer == ops[n].layer
        assert 0 < ops[n].first_bytes < ops[n].ahead_bytes <= 2 * ops[n].first_bytes  # the positions before this one
    assert ahead.kv_bytes == plans[False].kv_bytes
    chip = get_chip("tpu-v5e")
    rows = {on: pace_timeline(p, chip) for on, p in plans.items()}  # the costs the model charges (mk.timing.pace)
    moved = {on: sum(r["end_s"] - r["start_s"] for r in t if r["lane"].startswith("dma")) for on, t in rows.items()}
    assert moved[True] == pytest.approx(moved[False], rel=1e-9)
    for layer in (0, 1):  # queued before the layer's projections ran, waited for by its Attend
        read = next(r for r in rows[True] if r["what"] == f"ReadAhead {layer}")
        qkv = next(r for r in rows[True] if r["what"] == "QKVNormRope" and r["layer"] == layer)
        attend = next(r for r in rows[True] if r["what"] == "Attend" and r["layer"] == layer)
        assert read["start_s"] < qkv["start_s"] and attend["start_s"] >= read["start_s"]
