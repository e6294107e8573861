"""The kernel's refs as one named layout, built once from the plan and used by both the call builder
and the body: inputs, outputs and scratch are pytrees (NamedTuples of arrays and dicts), flattened
for ``pallas_call`` and unflattened in the body, so no ref is found by its position."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from ..plan import BLOCK, LANE, ROWS, Attend, StepPlan, round_up
from ..plan.arrays import Array
from ..plan.exchanges import all_reduce_buffers, best_shape, positions_shapes, users_shapes
from ..plan.layout import freq_width, group_width, latent_lanes

TOKEN, POSITION = 0, 1  # lanes of the users block: each user's token id and its position


class Inputs(NamedTuple):
    users: Any  # [rows, 128] int32, HBM: lane 0 the token of user b (row b), lane 1 its position
    vectors: Any  # [n_vectors, width] f32: every norm weight and scale, one a row
    inv_freq: Any  # [8, head_dim] f32: RoPE inverse frequencies, row 0 sliding, row 1 full
    weights: dict  # embed [V, H]; {type}.{name} -> [layers of the type, (E,) K, N]: padded, stacked; INT8 ones
    # with {type}.{name}_qscale [layers, experts (or 1) padded to 8, N] f32
    # {type}.k|v -> [layers of the type, B, kv_heads, slots, head_dim]: aliased to Outputs.cache (with the users
    # split: this chip's B / C users, every KV head)
    cache: dict
    acts: Any = None  # probe: name -> [rows, width] f32, the activations' values before the first op


class Outputs(NamedTuple):
    users: Any  # [rows, 128] int32: lane 0 each user's greedy token, lane 1 its next position
    cache: dict  # the KV cache with this step's K/V written in place
    logits: Any = None  # [B, V] f32, only when asked for (parity tests, notebooks)
    dma_counts: Any = None  # [1, 128] int32 in SMEM, only when asked for: [0, 0] expert tile DMAs issued
    acts: Any = None  # probe: the activations (and "gates") after the last op
    hidden: Any = None  # [rows, H] f32 with drafts: each row's final-normed hidden state (Gemma 4's assistant reads it)


class UsersSplit(NamedTuple):
    """One layer type's exchanges where each chip attends for its own u = B / C users (AttentionSplit.USERS);
    ``heads`` are this chip's query heads, ``kv`` its KV heads, ``hd`` the head dim, rows padded to 8."""

    stage_in: Any  # [C, rows(u), heads' + 2 x kv heads' lanes] f32: each owner's users' q, k, v of this chip's heads
    recv_in: Any  # [C, rows(u), heads' + 2 x kv heads' lanes] f32: what each chip sent of this chip's users
    q: Any  # [rows(u), every query head's lanes] f32: this chip's users' whole q, k and v
    k: Any  # [rows(u), every KV head's lanes] f32
    v: Any
    out: Any  # [rows(u), every query head's lanes] f32: their attention outputs
    stage_out: Any  # [C, rows(u), heads' lanes] f32: the outputs of each chip's heads, to go back to it
    recv_out: Any  # [C, rows(u), heads' lanes] f32: this chip's heads' outputs for each owner's users
    sems: Any  # DMA [2 (in, out), 2 (send, receive), C or 1 shared: KernelSetup.peer_semaphores]


class KV(NamedTuple):
    """One layer type's attention scratch (kv_heads: the heads of this chip's cache)."""

    k: Any  # [2, head groups, T, group lanes]: K tiles, double-buffered (mk.plan.layout.head_groups)
    v: Any  # [2, head groups, T, group lanes]
    sem: Any  # DMA [2 (k, v), 2 (slot)]
    stage_k: Any  # [users, head groups, 16, group lanes]: the block around each user's write-back slot
    stage_v: Any
    stage_sem: Any  # DMA [2 (k, v), users]
    # where g chips share a KV head's positions (StepPlan.position_share), else None:
    q_all: Any = None  # [g, rows, heads' lanes] f32: each member's query heads
    state: Any = None  # [g, B, heads, group lanes + 128] f32: partial states for each member's heads (max, sum: lanes)
    state_in: Any = None  # [g, B, heads, group lanes + 128] f32: each member's partial states of this chip's heads
    share_sem: Any = None  # DMA [2 (queries, states), 2 (send, receive), g or 1 shared]
    users: Any = None  # with the users split: UsersSplit


class Scratch(NamedTuple):
    weights: dict  # buffer name -> [slots, rows, cols]: the weight stream's VMEM slots (INT8 ones: + ".scale")
    weight_sems: dict  # buffer name -> DMA [slots]
    acts: dict  # activation name -> [rows, width] f32
    kv: dict  # layer type -> KV
    qblk: Any  # [head groups, 8k, group lanes] f32: the query heads read against one head group of the cache
    embed_rows: Any  # [B, 16, H]: the aligned block of embedding rows around each user's token
    embed_sem: Any  # DMA [1]
    gates: Any  # [rows, E_pad] f32: each user's combine weight of every expert
    expert_table: Any  # [8, E_pad] int32: the routed-expert table (mk.megakernel.moe.expert_table), staged for SMEM
    experts: Any  # SMEM [8, E_pad] int32: row 0 the distinct routed experts, [1, 0] how many
    route_sem: Any  # DMA [1]
    users: Any  # SMEM [rows, 128] int32: the users block as scalars
    users_vmem: Any  # [rows, 128] int32: the users block as vectors
    vectors: Any  # VMEM copy of Inputs.vectors
    inv_freq: Any  # VMEM copy of Inputs.inv_freq
    prologue_sem: Any  # DMA [4]
    best: Any  # [rows, 128] f32: the running maximum of each user's logits
    best_id: Any  # [rows, 128] int32: where it is
    users_out: Any  # [rows, 128] int32: the next users block, staged for its DMA out
    out_sem: Any  # DMA [1]
    logits_stage: Any = None  # [2, B, 1, head_tile] f32: a head tile's logits on their way to HBM (if asked)
    logits_sem: Any = None  # DMA [2]
    collective: Any = None  # over several chips: CollectiveScratch scratch
    # gpt-oss: the aligned block of rows around an expert's biases, [8, width]; read ahead, a ring of them for each
    # bias tensor, [places, 2, 8, width] (mk.plan.StepPlan.expert_bias_buffer)
    expert_bias: Any = None
    expert_bias_sem: Any = None  # DMA [1]; read ahead, [places, 2]
    latent: Any = None  # MLA: LatentScratch


class LatentScratch(NamedTuple):
    """MLA's scratch (mk.megakernel.latent); heads padded to 8 rows, widths in whole lanes."""

    qlat: Any  # [heads, kv_lora_rank] f32: one user's queries in the latent space
    qrope: Any  # [heads, qk_rope_head_dim] f32: their RoPE parts
    stash: Any  # [kv_lora_rank, heads x v_head_dim]: the layer's kv_b value columns, until its attention's output


class Exchange(NamedTuple):
    """One payload type's all-reduce buffers (mk.megakernel.collective); C chips, n activations."""

    stage: Any  # [n, rows, width]: this chip's partial sums as sent (width: C chunks with reduce-scatter)
    recv: Any  # [2 (parity), C, n, rows, width or chunk]: what each chip sent here (own partial at [me])
    gathered: Any  # reduce-scatter: [2, C, n, rows, chunk], each chip's summed chunk; else None
    send_sem: Any  # DMA [2 (round), C or 1 shared: KernelSetup.peer_semaphores]
    # DMA [2 (round), 2 (parity), C or 1]: a fast chip's next all-reduce may land before this one's has: a
    # semaphore of its own keeps its bytes from counting for this one's
    recv_sem: Any


class TorusExchange(NamedTuple):
    """One torus dimension's all-reduce buffers (over a torus: mk.megakernel.collective._all_reduce_over_torus): its
    ``g`` chips each keep a chunk of ``w`` lanes of what came in, ``g * w`` lanes (padded) wide."""

    stage: Any  # [n, rows, g * w]: what this chip sends along the dimension (its partial, or the last one's chunk)
    recv: Any  # [2 (parity), g, n, rows, w]: each member's chunk for this chip (own at [me])
    gathered: Any  # [2, g, n, rows, w]: each member's summed chunk, gathered back
    sems: Any  # DMA [2 (reduce-scatter, all-gather), 2 (parity), 2 (send, receive), g or 1]


class CollectiveScratch(NamedTuple):
    """Scratch of the cross-chip ops: an Exchange per payload item size (over a torus: a TorusExchange per
    dimension), and the argmax gather (over a torus: [dimension, member] for ``C``)."""

    exchange: dict  # str(itemsize) -> Exchange, or a tuple of TorusExchange (one a torus dimension)
    best: Any  # [C, rows, 128] f32: every chip's running maximum
    best_id: Any  # [C, rows, 128] int32
    sems: Any  # DMA [2 (send, receive), 2 (best, best_id), C or 1]; over a torus [dims, 2 (best, id), 2, g or 1]


def struct(array: Array) -> jax.ShapeDtypeStruct:
    """A plan's HBM array (mk.plan.arrays) as JAX describes it."""
    return jax.ShapeDtypeStruct(array.shape, jnp.dtype(array.dtype))


def input_shapes(plan: StepPlan) -> Inputs:
    """``jax.ShapeDtypeStruct``s of the kernel's inputs, without any weights: the plan's HBM arrays."""
    arrays = plan.arrays
    return Inputs(
        users=jax.ShapeDtypeStruct((plan.rows, LANE), jnp.int32),
        vectors=struct(arrays.vectors),
        inv_freq=struct(arrays.inv_freq),
        weights={name: struct(a) for name, a in arrays.weights.items()},
        cache={name: struct(a) for name, a in arrays.cache.items()},
    )


def activation_shapes(plan: StepPlan) -> dict:
    return {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in plan.activations.items()}


def output_shapes(plan: StepPlan, inputs: Inputs, with_logits: bool, count_dmas: bool, probe: bool = False) -> Outputs:
    ep = round_up(max(plan.share.num_experts, 1), LANE)
    return Outputs(
        acts={**activation_shapes(plan), "gates": jax.ShapeDtypeStruct((plan.rows, ep), jnp.float32)}
        if probe
        else None,
        users=inputs.users,
        cache=dict(inputs.cache),
        logits=jax.ShapeDtypeStruct((plan.batch, plan.layout.vocab_size), jnp.float32) if with_logits else None,
        dma_counts=jax.ShapeDtypeStruct((1, LANE), jnp.int32) if count_dmas else None,
        hidden=jax.ShapeDtypeStruct(plan.activations["xn"], jnp.float32) if plan.draft_tokens else None,
    )


def scratch_shapes(plan: StepPlan, with_logits: bool) -> Scratch:
    cfg, B, rows, U = plan.layout, plan.batch, plan.rows, plan.cache_users
    weight_dtype, kv_dtype = jnp.dtype(plan.weight_dtype), jnp.dtype(plan.kv_dtype)
    types = sorted(set(cfg.layer_types))
    kv = {}
    for t in types:
        hd, T, g = cfg.head_dim(t), plan.kv_tile(t), plan.position_share(t)
        groups, W = plan.cache_groups(t), group_width(hd)
        if cfg.latent_attention is not None:
            kv[t] = latent_kv_shapes(plan, t, kv_dtype)
            continue
        kv[t] = KV(
            pltpu.VMEM((2, groups, T, W), kv_dtype),
            pltpu.VMEM((2, groups, T, W), kv_dtype),
            pltpu.SemaphoreType.DMA((2, 2)),
            pltpu.VMEM((U, groups, BLOCK, W), kv_dtype),
            pltpu.VMEM((U, groups, BLOCK, W), kv_dtype),
            pltpu.SemaphoreType.DMA((2, U)),
            *(
                (
                    *(pltpu.VMEM(shape, jnp.float32) for shape in positions_shapes(plan, t)),
                    pltpu.SemaphoreType.DMA((2, 2, min(g, plan.setup.peer_semaphores))),
                )
                if g > 1
                else ()
            ),
            users=users_split_shapes(plan, t) if plan.setup is not None and plan.setup.users_split else None,
        )
    # the query heads read against one head group: this chip's, or every sharing chip's where they split its
    # positions, or the model's where each chip attends over every head for its users
    rep = max((op.query_rows for op in plan.ops if isinstance(op, Attend)), default=1)
    groups = max(plan.cache_groups(t) for t in types)
    ep = round_up(max(cfg.num_experts, 1), LANE)
    shapes = input_shapes(plan)
    return Scratch(
        weights={b.name: pltpu.VMEM((b.slots, *b.shape), b.dtype or weight_dtype) for b in plan.buffers.values()},
        weight_sems={b.name: pltpu.SemaphoreType.DMA((b.slots,)) for b in plan.buffers.values()},
        acts={name: pltpu.VMEM(shape, jnp.float32) for name, shape in plan.activations.items()},
        kv=kv,
        qblk=pltpu.VMEM((groups, round_up(rep, ROWS), freq_width(cfg)), jnp.float32),
        embed_rows=pltpu.VMEM((B, BLOCK, cfg.hidden_size), weight_dtype),
        embed_sem=pltpu.SemaphoreType.DMA((1,)),
        gates=pltpu.VMEM((rows, ep), jnp.float32),
        expert_table=pltpu.VMEM((ROWS, ep), jnp.int32),
        experts=pltpu.SMEM((ROWS, ep), jnp.int32),
        route_sem=pltpu.SemaphoreType.DMA((1,)),
        users=pltpu.SMEM((rows, LANE), jnp.int32),
        users_vmem=pltpu.VMEM((rows, LANE), jnp.int32),
        vectors=pltpu.VMEM(shapes.vectors.shape, jnp.float32),
        inv_freq=pltpu.VMEM(shapes.inv_freq.shape, jnp.float32),
        prologue_sem=pltpu.SemaphoreType.DMA((4,)),
        best=pltpu.VMEM((rows, LANE), jnp.float32),
        best_id=pltpu.VMEM((rows, LANE), jnp.int32),
        users_out=pltpu.VMEM((rows, LANE), jnp.int32),
        out_sem=pltpu.SemaphoreType.DMA((1,)),
        logits_stage=pltpu.VMEM((2, B, 1, plan.head_tile), jnp.float32) if with_logits else None,
        logits_sem=pltpu.SemaphoreType.DMA((2,)) if with_logits else None,
        collective=collective_shapes(plan) if plan.chips > 1 else None,
        **expert_bias_shapes(plan),
        latent=latent_shapes(plan, weight_dtype) if cfg.latent_attention is not None else None,
    )


def latent_kv_shapes(plan: StepPlan, t: str, kv_dtype) -> KV:
    """MLA's tiles of the latent cache (K: the latents, V: the RoPE keys; one "KV head") and their write-back."""
    _, Dr, _, L = latent_lanes(plan.layout)
    T, U = plan.kv_tile(t), plan.cache_users
    return KV(
        pltpu.VMEM((2, 1, T, L), kv_dtype),
        pltpu.VMEM((2, 1, T, Dr), kv_dtype),
        pltpu.SemaphoreType.DMA((2, 2)),
        pltpu.VMEM((U, 1, BLOCK, L), kv_dtype),
        pltpu.VMEM((U, 1, BLOCK, Dr), kv_dtype),
        pltpu.SemaphoreType.DMA((2, U)),
    )


def latent_shapes(plan: StepPlan, weight_dtype) -> LatentScratch:
    cfg = plan.layout
    _, Dr, Dv, L = latent_lanes(cfg)
    rows = round_up(cfg.num_heads, ROWS)
    return LatentScratch(
        qlat=pltpu.VMEM((rows, L), jnp.float32),
        qrope=pltpu.VMEM((rows, Dr), jnp.float32),
        stash=pltpu.VMEM((L, cfg.num_heads * Dv), weight_dtype),
    )


def expert_bias_shapes(plan: StepPlan) -> dict:
    """gpt-oss's expert biases: the VMEM they are read into (mk.plan.StepPlan.expert_bias_buffer), a DMA semaphore for
    each block of it."""
    buffer = plan.expert_bias_buffer
    if buffer is None:
        return {}
    shape, dtype = buffer
    sems = shape[:2] if plan.expert_bias_ring else (1,)
    return dict(expert_bias=pltpu.VMEM(shape, jnp.dtype(dtype)), expert_bias_sem=pltpu.SemaphoreType.DMA(sems))


def users_split_shapes(plan: StepPlan, t: str) -> UsersSplit:
    buffers = {name: pltpu.VMEM(shape, jnp.float32) for name, shape in users_shapes(plan, t).items()}
    return UsersSplit(**buffers, sems=pltpu.SemaphoreType.DMA((2, 2, plan.setup.peer_semaphores)))


def _vmem(buffer):
    """A (shape, dtype name) of mk.plan.exchanges as a VMEM buffer (None stays None)."""
    return None if buffer is None else pltpu.VMEM(buffer[0], jnp.dtype(buffer[1]))


def collective_shapes(plan: StepPlan) -> CollectiveScratch:
    """The all-reduce's and the greedy pick's buffers (their shapes: mk.plan.exchanges), with their semaphores; over a
    torus a TorusExchange a dimension, each cutting the last one's chunk into its chips' whole-lane chunks
    (mk.sharding.links.torus_all_reduce prices them)."""
    peers, dims = plan.setup.peer_semaphores, [g for g, _ in plan.setup.torus_groups]
    exchange = {}
    for itemsize, buffers in all_reduce_buffers(plan).items():
        if dims:
            sems = [pltpu.SemaphoreType.DMA((2, 2, 2, min(g, peers))) for g in dims]
            exchange[itemsize] = tuple(
                TorusExchange(**{k: _vmem(b) for k, b in per.items()}, sems=sem) for per, sem in zip(buffers, sems)
            )
            continue
        exchange[itemsize] = Exchange(
            **{k: _vmem(b) for k, b in buffers.items()},
            send_sem=pltpu.SemaphoreType.DMA((2, peers)),
            recv_sem=pltpu.SemaphoreType.DMA((2, 2, peers)),
        )
    best = best_shape(plan)
    sems = pltpu.SemaphoreType.DMA((len(dims), 2, 2, min(max(dims), peers)) if dims else (2, 2, peers))
    return CollectiveScratch(
        exchange=exchange, best=pltpu.VMEM(best, jnp.float32), best_id=pltpu.VMEM(best, jnp.int32), sems=sems
    )
