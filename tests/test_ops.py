"""One test per op kind: the kernel runs a plan cut to that op (after the prologue, with its weight tile's
DMA), from activations given to it (``build_call(probe=True)``), in interpret mode with race detection, and
its result is held to the reference's building block (mk.reference) on the same inputs."""

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mk import blocks, reference as R
from mk.config import TINY_MOE
from mk.kernel_setup import Collective, KernelSetup
from mk.megakernel.engine import MegakernelEngine, users_block
from mk.megakernel.kernel import build_call
from mk.megakernel.pack import adopt_cache, pack, reference_cache
from mk.plan import (
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
    Start,
    Tiles,
    Wait,
    build_plan,
)
from mk.tpu import interpret_params, races_detected, reset_interpreter
from mk.weights import random_params

CFG = TINY_MOE
B, MAX_LEN = 2, 32
PARAMS = random_params(CFG, 0)
TOKENS = np.array([5, 300], np.int32)
POSITIONS = np.array([21, 4], np.int32)  # users at their own positions; 21 is past the window of 16
ATOL = 2e-5
H = CFG.hidden_size


@pytest.fixture(autouse=True)
def _fresh_interpreter():
    reset_interpreter()
    yield
    assert not races_detected(), "the interpreter's race detector fired"
    reset_interpreter()


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def probe(ops, seeds, knockout=frozenset(), with_logits=False, cache=None, tiles=Tiles()):
    """Run the prologue then ``ops`` (each after its weight tile's DMA) from the activations ``seeds``
    (name -> [B, width]; the rest zero). Returns the kernel's Outputs (acts: every activation after)."""
    plan = build_plan(CFG, B, MAX_LEN, knockout=knockout, tiles=tiles)
    ops = [ops] if not isinstance(ops, list) else ops
    items = [Start(op.load) for op in ops if op.load is not None] + [plan.ops[0]]
    for op in ops:
        items += ([Wait(op.load)] if op.load is not None else []) + [op]
    cut = replace(plan, items=tuple(items))
    fn = build_call(
        cut,
        interpret=interpret_params(detect_races=True),
        with_logits=with_logits,
        probe=True,
    )
    acts = {}
    for name, (rows, width) in cut.activations.items():
        a = np.zeros((rows, width), np.float32)
        if name in seeds:
            a[:B, : seeds[name].shape[1]] = seeds[name]
        acts[name] = jnp.asarray(a)
    cache = cache if cache is not None else R.init_cache(CFG, B, MAX_LEN, multiple=16)
    return fn(pack(PARAMS, CFG), adopt_cache(CFG, cache), users_block(cut, TOKENS, POSITIONS), acts)


def plan_ops(kind, knockout=frozenset(), tiles=Tiles(), **where):
    plan = build_plan(CFG, B, MAX_LEN, knockout=knockout, tiles=tiles)
    return [op for op in plan.ops if isinstance(op, kind) and all(getattr(op, k) == v for k, v in where.items())]


def close(got, want, atol=ATOL):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=atol, rtol=0)


def test_prologue_and_emit_tokens():
    out = probe(plan_ops(EmitTokens), {})
    np.testing.assert_array_equal(np.asarray(out.users[:B, :2]), np.stack([[0, 0], POSITIONS + 1], 1))


def test_embed():
    out = probe(plan_ops(Embed), {})
    close(out.acts["x"][:B], blocks.embed(PARAMS, CFG, TOKENS))


def test_norm():
    x = _rand((B, H), 1)
    out = probe(plan_ops(Norm, layer=1), {"x": x})
    close(out.acts["xn"][:B], blocks.rms_norm(x, PARAMS["layers.1.input_norm"], CFG.rms_eps))


@pytest.mark.parametrize("mode", [MatmulMode.COLS, MatmulMode.ROWS])
def test_matmul_tile(mode):
    op = plan_ops(MatmulTile, layer=0, mode=mode, expert=None)[0]  # the first tile of q (cols) or o (rows)
    w = PARAMS[f"layers.0.{'q' if mode == MatmulMode.COLS else 'o'}"]
    src = _rand((B, w.shape[0]), 2)
    out = probe(op, {op.src: src})
    if mode == MatmulMode.COLS:
        close(out.acts[op.dst][:B, op.dst_off : op.dst_off + op.n], src @ w[:, op.dst_off : op.dst_off + op.n])
    else:
        close(out.acts[op.dst][:B, :H], src[:, op.src_off : op.src_off + op.n] @ w[op.src_off : op.src_off + op.n])


def test_qkv_norm_rope():
    op = plan_ops(QKVNormRope, layer=0)[0]
    t, hd, nh, kv = op.layer_type, CFG.head_dim(op.layer_type), CFG.num_heads, CFG.kv_heads(op.layer_type)
    q, k, v = _rand((B, nh * hd), 3), _rand((B, kv * hd), 4), _rand((B, kv * hd), 5)
    out = probe(op, {"q": q, "k": k, "v": v})
    p = {n: PARAMS[f"layers.0.{n}"] for n in ("q_norm", "k_norm")}
    pos = jnp.asarray(POSITIONS)[:, None]
    want_q = blocks.rope(blocks.rms_norm(q.reshape(B, 1, nh, hd), p["q_norm"], CFG.rms_eps), pos, CFG, t)
    want_k = blocks.rope(blocks.rms_norm(k.reshape(B, 1, kv, hd), p["k_norm"], CFG.rms_eps), pos, CFG, t)
    close(out.acts["q"][:B, : nh * hd], want_q.reshape(B, -1))
    close(out.acts["k"][:B, : kv * hd], want_k.reshape(B, -1))
    close(out.acts["v"][:B, : kv * hd], blocks.rms_norm(v, None, CFG.rms_eps))


@pytest.mark.parametrize("layer", [0, 2], ids=["sliding", "full"])
def test_attend(layer):
    _attend_against_the_reference(layer)


@pytest.mark.parametrize("layer", [0, 2], ids=["sliding", "full"])
def test_read_ahead_then_attend(layer):
    """Tiles.kv_ahead: user 0's first KV tiles started by ReadAhead, the rest read two ahead by Attend (KV tiles of 8
    positions: user 0 at 21 reads three on a full layer, user 1 at 4 reads one)."""
    tiles = Tiles(kv_tile=8, kv_ahead=True)
    ahead = plan_ops(ReadAhead, tiles=tiles, layer=layer)
    assert len(ahead) == 1
    _attend_against_the_reference(layer, tiles, ahead)


def _attend_against_the_reference(layer, tiles=Tiles(), before=()):
    op = plan_ops(Attend, tiles=tiles, layer=layer)[0]
    t, hd, nh, kv = op.layer_type, CFG.head_dim(op.layer_type), CFG.num_heads, CFG.kv_heads(op.layer_type)
    cache = R.init_cache(CFG, B, MAX_LEN, multiple=16)
    cache = {n: jnp.asarray(_rand(c.shape, 6 + i)) for i, (n, c) in enumerate(cache.items())}
    q, k, v = _rand((B, nh * hd), 7), _rand((B, kv * hd), 8), _rand((B, kv * hd), 9)
    out = probe([*before, op], {"q": q, "k": k, "v": v}, cache=cache, tiles=tiles)
    # the reference: the new K/V written at each user's slot, then attention over slots <= position
    slot = POSITIONS % CFG.sliding_window if t == "sliding" else POSITIONS
    kc, vc = (np.array(cache[f"layers.{layer}.{n}"]) for n in ("k", "v"))
    for b in range(B):
        kc[b, :, slot[b]] = k[b].reshape(kv, hd)
        vc[b, :, slot[b]] = v[b].reshape(kv, hd)
    S = kc.shape[2]
    mask = (np.arange(S)[None] <= POSITIONS[:, None]) & (
        np.arange(S)[None] < (CFG.sliding_window if t == "sliding" else S)
    )
    want = blocks.attend_one(jnp.asarray(q.reshape(B, 1, nh, hd)), jnp.asarray(kc), jnp.asarray(vc), jnp.asarray(mask))
    close(out.acts["attn"][:B, : nh * hd], want.reshape(B, -1))
    written = reference_cache(CFG, out.cache)
    close(written[f"layers.{layer}.k"], kc)
    close(written[f"layers.{layer}.v"], vc)


def _residual_inputs(seed):
    return _rand((B, H), seed), _rand((B, H), seed + 1)


def test_attention_residual():
    x, attn_out = _residual_inputs(10)
    out = probe(plan_ops(AttentionResidual, layer=1), {"x": x, "attn_out": attn_out})
    p, eps = {k[len("layers.1.") :]: v for k, v in PARAMS.items() if k.startswith("layers.1.")}, CFG.rms_eps
    x2 = x + blocks.rms_norm(attn_out, p["post_attn_norm"], eps)
    close(out.acts["x"][:B], x2)
    close(out.acts["xn"][:B], blocks.rms_norm(x2, p["pre_ffn_norm"], eps))
    close(out.acts["x2"][:B], blocks.rms_norm(x2, p["pre_ffn_norm_2"], eps))
    close(out.acts["rin"][:B], blocks.rms_norm(x2, None, eps) * p["router_scale"] * H**-0.5)


def test_route_and_expert_combine():
    """The router's input, its projection tile, routing and two expert slots' combine: gates equal
    mk.blocks.route's weights at its ids, and slots 0 and 1 are the two lowest routed experts."""
    x, eo = _rand((B, H), 12), _rand((B, H), 13)
    ops = (
        plan_ops(AttentionResidual, layer=0)
        + plan_ops(MatmulTile, layer=0, component="router")
        + plan_ops(Route, layer=0)
        + plan_ops(ExpertCombine, layer=0)[:2]
    )
    out = probe(ops, {"x": x, "attn_out": np.zeros((B, H), np.float32), "eo": eo})
    p = {k[len("layers.0.") :]: v for k, v in PARAMS.items() if k.startswith("layers.0.")}
    w, ids = blocks.route(p, CFG, jnp.asarray(x), frozenset())
    gates = np.zeros((B, CFG.num_experts), np.float32)
    for b in range(B):
        gates[b, np.asarray(ids[b])] = np.asarray(w[b])
    close(out.acts["gates"][:B, : CFG.num_experts], gates)
    first_two = sorted(set(np.asarray(ids).ravel().tolist()))[:2]
    close(out.acts["moe"][:B], gates[:, first_two].sum(1, keepdims=True) * eo)


def test_gated_act():
    op = plan_ops(GatedAct, layer=0, component="shared_mlp")[0]
    gate, up = _rand((B, op.n), 14), _rand((B, op.n), 15)
    out = probe(op, {"gate": gate, "up": up})
    close(out.acts["up"][:B, : op.n], jax.nn.gelu(gate, approximate=True) * up)


def test_ffn_residual():
    x, ffn = _residual_inputs(16)
    moe = _rand((B, H), 18)
    out = probe(plan_ops(FfnResidual, layer=2), {"x": x, "ffn": ffn, "moe": moe})
    p, eps = {k[len("layers.2.") :]: v for k, v in PARAMS.items() if k.startswith("layers.2.")}, CFG.rms_eps
    h = blocks.rms_norm(ffn, p["post_ffn_norm_1"], eps) + blocks.rms_norm(moe, p["post_ffn_norm_2"], eps)
    close(out.acts["x"][:B], (x + blocks.rms_norm(h, p["post_ffn_norm"], eps)) * p["layer_scalar"])


def test_head_tiles_and_the_greedy_pick():
    xn = _rand((B, H), 19)
    out = probe(plan_ops(HeadTile) + plan_ops(EmitTokens), {"xn": xn}, with_logits=True)
    want = CFG.final_softcap * jnp.tanh((xn @ PARAMS["embed"].T) / CFG.final_softcap)
    close(out.logits, want)
    np.testing.assert_array_equal(np.asarray(out.users[:B, 0]), np.argmax(np.asarray(want), -1))


def test_no_head():
    ops = plan_ops(NoHead, knockout={"head"}) + plan_ops(EmitTokens, knockout={"head"})
    out = probe(ops, {}, knockout={"head"}, with_logits=True)
    np.testing.assert_array_equal(np.asarray(out.logits), 0)
    np.testing.assert_array_equal(np.asarray(out.users[:B, 0]), 0)


# The cross-chip ops, on 8 simulated chips: a model whose 8 query heads split over them.
CFG8 = TINY_MOE.replace(name="tiny-moe-8h", num_heads=8, sliding_kv_heads=2, full_kv_heads=1)
CHIPS = 8
PARAMS8 = random_params(CFG8, 1)


def probe_chips(setup, ops_of, seeds, with_logits=False):
    """``probe`` over the chips of ``setup``: ``seeds`` name -> [C, B, width], each chip's own activations;
    the Outputs' acts hold each chip's after the ops, one block of rows per chip."""
    plan = build_plan(CFG8, B, MAX_LEN, setup=setup)
    ops = ops_of(plan)
    items = [Start(op.load) for op in ops if op.load is not None] + [plan.ops[0]]
    for op in ops:
        items += ([Wait(op.load)] if op.load is not None else []) + [op]
    cut = replace(plan, items=tuple(items))
    engine = MegakernelEngine(CFG8, setup=setup)
    fn = build_call(
        cut,
        interpret=interpret_params(detect_races=True),
        with_logits=with_logits,
        probe=True,
        mesh=engine.mesh,
    )
    acts = {}
    for name, (rows, width) in cut.activations.items():
        a = np.zeros((CHIPS, rows, width), np.float32)
        if name in seeds:
            a[:, :B, : seeds[name].shape[2]] = seeds[name]
        acts[name] = jnp.asarray(a.reshape(CHIPS * rows, width))
    cache = engine.adopt_cache(R.init_cache(CFG8, B, MAX_LEN, multiple=16))
    out = fn(engine.packed(PARAMS8), cache, users_block(cut, TOKENS, POSITIONS), acts)
    return out, cut.rows


def _bf16(a):
    return np.asarray(jnp.asarray(a).astype(jnp.bfloat16).astype(jnp.float32))


@pytest.mark.parametrize(
    "collective",
    [Collective(), Collective(reduce_scatter=True), Collective(bf16_payload=True), Collective(False, True, True)],
    ids=["all-to-all", "reduce-scatter", "bf16", "reduce-scatter-bf16"],
)
def test_all_reduce(collective):
    """Attention's partial output projections summed over 8 chips: every chip holds the sum of all the
    chips' partials (rounded to bf16 on the wire when asked; reduce-scatter rounds the sum again), and all
    chips hold exactly the same values."""
    setup = KernelSetup(CHIPS, collective=collective)
    parts = np.stack([_rand((B, H), 40 + c) for c in range(CHIPS)])

    def ops_of(plan):
        return [op for op in plan.ops if isinstance(op, AllReduce) and op.acts == ("attn_out",) and op.layer == 0]

    out, rows = probe_chips(setup, ops_of, {"attn_out": parts})
    got = np.asarray(out.acts["attn_out"]).reshape(CHIPS, rows, -1)[:, :B, :H]
    want = (_bf16(parts) if collective.bf16_payload else parts).sum(0)
    if collective.bf16_payload and collective.reduce_scatter:
        want = _bf16(want)
    close(got[0], want, atol=1e-5)
    assert all(np.array_equal(got[0], got[c]) for c in range(CHIPS))


def test_gather_best():
    """Each chip's head tiles cover its 1/8 of the vocabulary; the gathered pick is the argmax over all."""
    setup = KernelSetup(CHIPS)
    xn = _rand((B, H), 21)

    def ops_of(plan):
        return [op for op in plan.ops if isinstance(op, (HeadTile, GatherBest, EmitTokens))]

    out, _ = probe_chips(setup, ops_of, {"xn": np.broadcast_to(xn, (CHIPS, B, H))}, with_logits=True)
    want = CFG8.final_softcap * jnp.tanh((xn @ PARAMS8["embed"].T) / CFG8.final_softcap)
    close(out.logits, want)
    np.testing.assert_array_equal(np.asarray(out.users[:B, 0]), np.argmax(np.asarray(want), -1))


def test_every_op_kind_has_a_test_here():
    from mk.plan import OP_KINDS

    tested = {
        Prologue,
        EmitTokens,
        Embed,
        Norm,
        MatmulTile,
        QKVNormRope,
        ReadAhead,
        Attend,
        AttentionResidual,
        Route,
        ExpertCombine,
        GatedAct,
        FfnResidual,
        HeadTile,
        NoHead,
        AllReduce,
        GatherBest,
    }
    assert tested == set(OP_KINDS)
