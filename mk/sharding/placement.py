"""How one decode step is cut over C chips: which slice of the model each chip holds and computes.

Every chip runs the same kernel on its own slice (tensor parallel):

- the vocabulary (embedding and head) is split in C equal row ranges; the embedding lookup is a
  masked local lookup whose sum over chips is the embedding, the head a local argmax gathered over chips;
- attention heads are split where they divide the chips: chip c computes query heads
  ``c * nh/C ..``; the KV heads those query heads read are the chip's own (a model with fewer KV heads
  than chips, e.g. 2 or 4 on 8 chips, keeps each KV head's projection and cache on C/kv chips: the
  replication ``kv_replication`` reports). Where heads do not divide the chips, attention is
  replicated: every chip computes all heads and no all-reduce follows it; or, with ``repeat_heads`` (past one
  host: mk.sharding.pods), split over the most chips D that take whole heads, chip c computing member c % D's heads,
  each group of D chips all of them, and only the first group's output projection counting (the others' rows zero:
  their partial sums would count each head C / D times in the all-reduce);
- MLA's down-projections (q_a, kv_a) by rows, in whole-lane blocks of the hidden size (``latent_down_rows``): each
  chip multiplies its block of the normed input, and the partial sums meet in an all-reduce before the latent's norm;
- the shared MLP's intermediate is split in C equal parts (zero-padded to equal);
- the routed experts: ``whole`` places E/C whole experts on each chip (a chip loads the distinct experts
  routed to it: the busiest chip is the straggler), ``split`` cuts every expert's intermediate over all
  chips (every chip loads 1/C of every routed expert);
- the router, norms and scales are replicated (the routing is the same on every chip).

Past one host mk.sharding.pods says what changes: placement ``hosts`` (whole experts over groups of a host's chips,
each split within its group: ``experts_per_chip``, ``expert_groups``) and, where the heads do not divide the chips,
heads split over the most chips that take whole ones, repeated over groups of chips (``attention_chips``); the kernel
runs both as they are timed.

Partial sums (after MLA's down-projections, attention's output projection, the FFN, and the embedding) are all-reduced
inside the kernel (mk.megakernel.collective; its peers and bytes: mk.sharding.links). ``chip_config`` is the slice
one chip computes, as a config; ``chip_params`` cuts a parameter tree to it; ``SPLIT_AXES`` says which axis of each
of the kernel's HBM tensors is split over the chips, so packing, ``shard_map`` specs and the AOT shapes agree.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..config import LAYER_TYPES, ModelConfig
from ..format_trees import FSCALE_SUFFIX, format_cuts, fscale_path
from ..kernel_setup import AttentionSplit, KernelSetup, Placement
from ..params import SCALE_SUFFIX, scales_inputs, tile_rows_scaled
from ..units import BLOCK, LANE, ceil_div, round_up


def heads_split(cfg: ModelConfig, chips: int) -> bool:
    """Whether attention heads are split over ``chips``: the query heads divide the chips, and each chip's
    query heads read whole KV heads of its own (kv divides the chips, or one KV head serves them all)."""
    if chips == 1 or cfg.num_heads % chips:
        return False
    per_chip = cfg.num_heads // chips
    for t in set(cfg.layer_types):
        kv = cfg.kv_heads(t)
        group = cfg.num_heads // kv  # query heads per KV head
        if kv % chips and group % per_chip:
            return False
    return True


def attention_chips(cfg: ModelConfig, setup: KernelSetup | None) -> int:
    """The chips attention heads are split over: all C where ``heads_split``; where they are not, with
    ``repeat_heads`` (past one host: mk.sharding.pods), the most chips D dividing C that take whole heads (each
    head's chips repeated C / D times: chip c takes member c % D's heads); else 1 (attention replicated)."""
    if setup is None or not setup.sharded:
        return 1
    C = setup.chips
    if heads_split(cfg, C):
        return C
    if setup.repeat_heads:
        return max((d for d in range(2, C) if C % d == 0 and heads_split(cfg, d)), default=1)
    return 1


def expert_groups(cfg: ModelConfig, setup: KernelSetup) -> int:
    """The groups of chips the routed experts are spread over whole: C with whole experts, C / host_chips with
    placement ``hosts``, 1 with every expert split over all chips (or one chip)."""
    if not cfg.is_moe or not setup.sharded or setup.placement == Placement.SPLIT:
        return 1
    return setup.chips if setup.placement == Placement.WHOLE else setup.chips // setup.host_chips


def expert_group_member(setup: KernelSetup, chip):
    """(the group whose whole experts chip ``chip`` holds, its place among that group's chips): with placement
    ``hosts`` (chip // host_chips, chip % host_chips), else (chip, chip). ``chip`` may be traced (the kernel's)."""
    if setup.placement == Placement.HOSTS:
        return chip // setup.host_chips, chip % setup.host_chips
    return chip, chip


def repeated_copy(cfg: ModelConfig, setup: KernelSetup, chip: int) -> bool:
    """Whether chip ``chip`` computes a repeat of heads another chip computes too (``repeat_heads``: chips D and up),
    whose output projection then holds zeros so that each head's partial sum counts once in the all-reduce."""
    return setup.sharded and chip >= attention_chips(cfg, setup) > 1


def position_share(cfg: ModelConfig, layer_type: str, setup: "KernelSetup | None") -> int:
    """How many chips share the positions of one KV head of ``layer_type`` (1: a chip holds and reads all of them):
    with the positions split (AttentionSplit.POSITIONS), where the heads are split and the layer type has fewer KV
    heads than chips, the g = C / kv chips whose query heads read one KV head (consecutive chips: chip c is member
    c % g of group c // g) each hold every g-th KV tile of it, and attend over those for all the group's query heads."""
    split = setup is not None and setup.sharded and setup.attention_split == AttentionSplit.POSITIONS
    if not (split and heads_split(cfg, setup.chips)):
        return 1
    kv = cfg.kv_heads(layer_type)
    return setup.chips // kv if kv < setup.chips else 1


def allocated_positions(cfg: ModelConfig, context: int, setup: KernelSetup) -> int:
    """The cache positions a step of ``context`` positions is planned with: ``context``, rounded up where the
    positions of a KV head are split over g chips (:func:`position_share`) to g whole blocks, as a deployment would
    allocate it (128 chips sharing DeepSeek-V3's one latent head at 1K: 2,048 slots, 16 a chip); the step still
    reads ``context`` positions."""
    multiple = max(position_share(cfg, t, setup) for t in set(cfg.layer_types)) * BLOCK
    return context if multiple == BLOCK else round_up(context, multiple)


def kv_heads_per_chip(cfg: ModelConfig, layer_type: str, chips: int) -> int:
    kv = cfg.kv_heads(layer_type)
    return kv // chips if kv % chips == 0 else 1


def first_kv_head(cfg: ModelConfig, layer_type: str, chips: int, chip: int) -> int:
    """The first KV head chip ``chip``'s query heads read."""
    return chip * (cfg.num_heads // chips) // (cfg.num_heads // cfg.kv_heads(layer_type))


def kv_replication(cfg: ModelConfig, chips: int) -> dict[str, int]:
    """Copies of each KV head (its k/v projections and cache) over the chips, by layer type: 1 when the
    KV heads divide the chips, C/kv when fewer KV heads than chips, C when attention is replicated."""
    if not heads_split(cfg, chips):
        return {str(t): chips for t in LAYER_TYPES}
    return {str(t): chips * kv_heads_per_chip(cfg, t, chips) // cfg.kv_heads(t) for t in LAYER_TYPES}


def kv_replication_bytes(cfg: ModelConfig, chips: int, context: int, batch: int = 1, itemsize: int = 2) -> dict:
    """Bytes one chip reads per step beyond an even 1/C share because its KV heads are kept on several
    chips (``kv_replication``): their k/v projections and KV cache, by layer type."""
    out = {}
    for t in sorted(set(cfg.layer_types)):
        hd, kv = cfg.head_dim(t), cfg.kv_heads(t)
        weights = (2 if cfg.has_v_proj(t) else 1) * cfg.hidden_size * hd
        cache = 2 * batch * cfg.cache_positions(t, context) * hd
        total = cfg.layer_types.count(t) * kv * (weights + cache) * itemsize
        out[str(t)] = total * (kv_replication(cfg, chips)[str(t)] - 1) / chips
    return out


def vocab_per_chip(cfg: ModelConfig, chips: int) -> int:
    """Vocabulary rows each chip holds: the vocabulary padded to C whole-lane blocks, divided."""
    return round_up(cfg.vocab_size, LANE * chips) // chips if chips > 1 else cfg.vocab_size


def experts_per_chip(cfg: ModelConfig, setup: KernelSetup) -> int:
    """Routed experts whose weights (or slices) one chip holds."""
    if not cfg.is_moe or setup.placement == Placement.SPLIT or not setup.sharded:
        return cfg.num_experts
    groups = expert_groups(cfg, setup)
    if cfg.num_experts % groups:
        raise ValueError(
            f"{setup.placement} placement puts E/G whole experts on each of G = {groups} chips or groups, but "
            f"{cfg.name} has {cfg.num_experts} experts; use placement 'split' or a count that divides {cfg.num_experts}"
        )
    return cfg.num_experts // groups


def latent_down_rows(cfg: ModelConfig, setup: KernelSetup) -> int:
    """Rows of MLA's down-projections (q_a, kv_a) each chip holds, where splitting them reads fewer bytes a chip:
    the hidden size's lanes cut in the smallest equal whole-lane blocks that are at most one a chip (chip c takes
    block c, chips past the last hold zeros), each chip's partial sums meeting in an all-reduce in the hidden size's
    lanes; 0 (whole on every chip) on one chip, where one block is the whole, where the sums are wider than the hidden
    size, or where the setup keeps them whole (``latent_down``)."""
    mla = cfg.latent_attention
    if mla is None or not setup.sharded or setup.latent_down == "whole":
        return 0
    lanes = round_up(cfg.hidden_size, LANE) // LANE
    sums = max(round_up(mla.q_lora_rank, LANE), round_up(mla.kv_lora_rank, LANE) + round_up(mla.qk_rope_head_dim, LANE))
    if sums > lanes * LANE:
        return 0
    block = min(d for d in range(1, lanes + 1) if lanes % d == 0 and lanes // d <= setup.chips)
    return block * LANE if block < lanes else 0


def chip_config(cfg: ModelConfig, setup: KernelSetup) -> ModelConfig:
    """The slice of ``cfg`` one chip computes, as a config (``cfg`` itself on one chip). Its expert count
    stays the model's (the router is replicated); ``experts_per_chip`` says how many a chip holds."""
    if not setup.sharded:
        return cfg
    C = setup.chips
    experts_per_chip(cfg, setup)  # refuses a whole placement that does not divide
    changes = dict(
        name=f"{cfg.name}-chip-of-{C}",
        vocab_size=vocab_per_chip(cfg, C),
        mlp_intermediate=ceil_div(cfg.mlp_intermediate, C),
    )
    if cfg.dense_layers:  # an MoE model's dense layers' MLPs are split like the shared one
        changes["dense_intermediate"] = ceil_div(cfg.dense_intermediate, C)
    D = attention_chips(cfg, setup)
    if D > 1:
        changes.update(
            num_heads=cfg.num_heads // D,
            sliding_kv_heads=kv_heads_per_chip(cfg, "sliding", D),
            full_kv_heads=kv_heads_per_chip(cfg, "full", D),
        )
    if down := latent_down_rows(cfg, setup):
        changes["latent_attention"] = dataclasses.replace(cfg.latent_attention, down_rows=down)
    if cfg.is_moe and setup.placement != Placement.WHOLE:  # each expert cut over all chips, or a host's
        over = C if setup.placement == Placement.SPLIT else setup.host_chips
        changes["expert_intermediate"] = round_up(ceil_div(cfg.expert_intermediate, over), setup.expert_rows)
    return cfg.replace(**changes)


def _cut(a, axis: int, start: int, size: int):
    """``a[start:start+size]`` along ``axis``, zero-padded where it runs past the end: on the host (a traced array, in
    the program tracing it)."""
    xp = jnp if isinstance(a, jax.core.Tracer) else np
    a = a if xp is jnp else np.asarray(a)
    end = max(start, min(start + size, a.shape[axis]))
    part = xp.take(a, xp.arange(start, end), axis=axis)
    if end - start < size:
        pad = [(0, 0)] * a.ndim
        pad[axis] = (0, size - (end - start))
        part = xp.pad(part, pad)
    return part


# Which axis of a reference matrix (mk.params names) holds what a chip takes a slice of.
_HEAD_AXIS = {"q": 1, "k": 1, "v": 1, "o": 0}
_LATENT_HEAD_AXIS = {"q": 1, "q_b": 1, "kv_b": 1, "o": 0}  # MLA's per-head matrices (q_a and kv_a: every head's)
_LATENT_DOWN = ("q_a", "kv_a")  # MLA's down-projections, split by rows (latent_down_rows)
# A head's own vectors (axis 0), cut as the heads of the matrix named: the o bias, added once after the all-reduce,
# stays whole
_HEAD_VECTORS = {"q_bias": "q", "k_bias": "k", "v_bias": "v", "sinks": "q"}
_MLP_AXIS = {"mlp_gate": 1, "mlp_up": 1, "mlp_down": 0}
_EXPERT_INTER_AXIS = {"expert_gate": 2, "expert_up": 2, "expert_down": 1}


def _matrix_cuts(cfg: ModelConfig, setup: KernelSetup, chip: int, path: str) -> tuple[tuple[int, int, int], ...]:
    """The cuts (axis, start, size) of matrix ``path`` of the reference tree chip ``chip`` takes, in turn (none: all
    of it): one, or with placement ``hosts`` its group's experts and then its share of each."""
    cut = _matrix_cut(cfg, setup, chip, path)
    if cut is None:
        return ()
    name = path.rsplit(".", 1)[-1]
    if name in _EXPERT_INTER_AXIS and setup.placement == Placement.HOSTS:
        member, width = expert_group_member(setup, chip)[1], chip_config(cfg, setup).expert_intermediate
        return cut, (_EXPERT_INTER_AXIS[name], member * width, width)
    return (cut,)


def _matrix_cut(cfg: ModelConfig, setup: KernelSetup, chip: int, path: str) -> tuple[int, int, int] | None:
    """The (axis, start, size) of matrix ``path`` of the reference tree chip ``chip`` takes (None: all of it); with
    placement ``hosts``, its group's experts (:func:`_matrix_cuts` adds its share of each)."""
    local = chip_config(cfg, setup)
    name = path.rsplit(".", 1)[-1]
    if name in ("embed", "head"):
        return 0, chip * local.vocab_size, local.vocab_size
    if not path.startswith("layers."):
        return None
    t = cfg.layer_types[int(path.split(".")[1])]
    if name in _LATENT_DOWN and local.latent_attention.down_rows:  # the chip's block of rows (zeros past the end)
        rows = local.latent_attention.down_rows
        return 0, chip * rows, rows
    D = attention_chips(cfg, setup)
    member = chip % D  # the chip's place among the D its heads are cut over (repeated past them: repeat_heads)
    if cfg.latent_attention is not None and name in _LATENT_HEAD_AXIS:  # MLA: each chip its heads' columns or rows
        if D == 1:
            return None
        mla = cfg.latent_attention
        width = mla.v_head_dim if name == "o" else mla.qk_nope_head_dim + mla.qk_rope_head_dim
        width = mla.qk_nope_head_dim + mla.v_head_dim if name == "kv_b" else width
        return _LATENT_HEAD_AXIS[name], member * local.num_heads * width, local.num_heads * width
    if (name in _HEAD_AXIS or name in _HEAD_VECTORS) and D > 1:  # the chip's heads' (gpt-oss: vectors)
        if _HEAD_VECTORS.get(name, name) in ("q", "o"):
            first, n = member * local.num_heads, local.num_heads
        else:
            first, n = first_kv_head(cfg, t, D, member), local.kv_heads(t)
        width = 1 if name == "sinks" else cfg.head_dim(t)
        return _HEAD_AXIS.get(name, 0), first * width, n * width
    if name in _MLP_AXIS:  # the dense or shared MLP (an MoE model's dense layers: their own width)
        n = local.mlp_width(int(path.split(".")[1]))
        return _MLP_AXIS[name], chip * n, n
    if name in _EXPERT_INTER_AXIS and setup.placement == Placement.SPLIT:
        return _EXPERT_INTER_AXIS[name], chip * local.expert_intermediate, local.expert_intermediate
    if name in _EXPERT_INTER_AXIS:
        n = experts_per_chip(cfg, setup)
        return 0, expert_group_member(setup, chip)[0] * n, n
    return None


def chip_params(params: dict, cfg: ModelConfig, setup: KernelSetup, chip: int) -> dict:
    """Chip ``chip``'s slice of the reference parameter tree: the parameters of ``chip_config`` (with
    E/C experts for a whole placement). An INT8 matrix's scales (mk.quant: [..., out], or [..., in] for a down
    projection) follow its cut: sliced with the channels they run along or its experts, whole where the other
    axis is cut. A chip repeating heads another computes (:func:`repeated_copy`) holds its output projection as
    zeros."""
    if not setup.sharded:
        return params
    out = {}
    for path, a in params.items():
        if path.endswith(("expert_gate_up_bias", "expert_down_bias")):
            out[path] = _expert_bias_cut(a, cfg, setup, chip, path)
            continue
        matrix = path.removesuffix(FSCALE_SUFFIX)
        if fscale_path(matrix) in params:  # a shipped format's codes and block scales (mk.format_trees), together
            if path == matrix:
                out[path], out[fscale_path(path)] = _format_matrix_cut(params, cfg, setup, chip, path)
            continue
        matrix = path.removesuffix(SCALE_SUFFIX)
        for cut in _matrix_cuts(cfg, setup, chip, matrix):
            if matrix != path:  # scales: one of the matrix's last two axes is gone
                ndim, along = a.ndim + 1, a.ndim - 1 if scales_inputs(matrix) else a.ndim  # the axis they run along
                axis = cut[0] if cut[0] < ndim - 2 else (a.ndim - 1 if cut[0] == along else None)
                if axis is None:
                    continue
                cut = (axis, *cut[1:])
            a = _cut(a, *cut)
        out[path] = a
    if repeated_copy(cfg, setup, chip):  # its heads' partial sums count on the first group of chips only
        for path in out:
            if path.startswith("layers.") and path.rsplit(".", 1)[-1] == "o":
                out[path] = np.zeros_like(np.asarray(out[path]))
    return out


def _format_matrix_cut(params: dict, cfg: ModelConfig, setup: KernelSetup, chip: int, path: str) -> tuple:
    """Chip ``chip``'s (codes, scales) of format matrix ``path``: a cut may split FP8 blocks, its scales then repeated
    over the finer blocks it leaves (mk.format_trees.format_cuts)."""
    codes, scales = params[path], params[fscale_path(path)]
    for cut in _matrix_cuts(cfg, setup, chip, path):
        scales, codes_cut, scales_cut = format_cuts(codes, scales, path, cut)
        codes, scales = _cut(codes, *codes_cut), _cut(scales, *scales_cut)
    return codes, scales


def _expert_bias_cut(a, cfg: ModelConfig, setup: KernelSetup, chip: int, path: str):
    """gpt-oss's expert biases on chip ``chip``: its experts' (whole placement); split, its slice of the gate's and
    of the up's biases ([E, 2I]: the gate's I first), and the down projection's bias on chip 0 only (zeros
    elsewhere: the experts' partial sums meet in the all-reduce); placement ``hosts``, its group's experts, then
    split as over the group's chips."""
    group, member = expert_group_member(setup, chip)
    if setup.placement != Placement.SPLIT:
        n = experts_per_chip(cfg, setup)
        a = _cut(a, 0, group * n, n)
        if setup.placement == Placement.WHOLE:
            return a
    a = np.asarray(a)
    if path.endswith("expert_down_bias"):
        return a if member == 0 else np.zeros_like(a)
    inter, n = a.shape[1] // 2, chip_config(cfg, setup).expert_intermediate
    return np.concatenate([_cut(a[:, :inter], 1, member * n, n), _cut(a[:, inter:], 1, member * n, n)], axis=1)


def chip_cache(cache: dict, cfg: ModelConfig, setup: KernelSetup, chip: int) -> dict:
    """Chip ``chip``'s KV heads of a reference cache (``layers.{i}.k|v`` [B, kv, slots, hd]); MLA's latent cache,
    which every head reads, whole."""
    D = attention_chips(cfg, setup)
    if D == 1 or cfg.latent_attention is not None:
        return cache
    local = chip_config(cfg, setup)
    out = {}
    for path, a in cache.items():
        t = cfg.layer_types[int(path.split(".")[1])]
        out[path] = _cut(a, 1, first_kv_head(cfg, t, D, chip % D), local.kv_heads(t))
    return out


def users_per_chip(cfg: ModelConfig, setup: KernelSetup | None, batch: int) -> int:
    """The users whose caches one chip holds and attends over: all ``batch`` of them, or B / C with the users split
    (AttentionSplit.USERS), which needs the heads split (the q, k, v heads each user's owner gathers) and a batch
    the chips divide."""
    if setup is None or not setup.users_split:
        return batch
    if cfg.latent_attention is not None:
        raise ValueError(
            f"attention split by users: {cfg.name}'s latent attention is not cut by users here; use "
            "attention_split='heads'"
        )
    if not heads_split(cfg, setup.chips):
        raise ValueError(
            f"attention split by users: {cfg.name}'s {cfg.num_heads} query heads are not split over {setup.chips} "
            "chips (its attention is replicated), so there are no heads to gather to each user's chip; use "
            "attention_split='heads'"
        )
    if batch % setup.chips:
        raise ValueError(
            f"attention split by users: each of the {setup.chips} chips owns B / C users, but B = {batch}; use a "
            f"batch that is a multiple of {setup.chips}, or attention_split='heads'"
        )
    return batch // setup.chips


def cache_split_axis(cfg: ModelConfig, setup: KernelSetup) -> int | None:
    """The axis of the kernel's KV caches ([layers, B, kv, slots, hd]) split over the chips: the users with the users
    split, the KV heads where heads are split, else none (attention replicated; MLA's latent cache, on every chip)."""
    if not setup.sharded:
        return None
    if setup.users_split:
        return 1
    return 2 if attention_chips(cfg, setup) > 1 and cfg.latent_attention is None else None


def vectors_split(cfg: ModelConfig, setup: KernelSetup) -> bool:
    """Whether each chip's vector table (mk.megakernel.pack) is its own: where heads are split and the model has
    vectors a head owns (gpt-oss's q/k/v biases and sinks), each chip's holds its heads' (the tables stacked on their
    rows over the chips); elsewhere every chip's is the same, held whole on each."""
    return attention_chips(cfg, setup) > 1 and bool(cfg.sinks or cfg.attention_bias)


def split_axis(cfg: ModelConfig, setup: KernelSetup, tensor: str) -> int | None:
    """The axis of the kernel's HBM weight ``tensor`` (``embed``, ``sliding.q``, ``vectors``, ...) that is split
    over the chips (None: every chip holds all of it); the caches' is ``cache_split_axis``. The kernel's
    tensors are layer-stacked (mk.plan.layout.stacked): matrices [layers, (E,) K, N]."""
    if not setup.sharded:
        return None
    if tensor.endswith(FSCALE_SUFFIX):  # a shipped format's block scales, laid out as its codes (format_tiles)
        return split_axis(cfg, setup, tensor.removesuffix(FSCALE_SUFFIX))
    if tensor.endswith(SCALE_SUFFIX):  # an INT8 matrix's scales [layers, rows, N]: split as its N or experts
        matrix = tensor.removesuffix(SCALE_SUFFIX)
        name = matrix.split(".", 1)[1]
        axis, ndim = split_axis(cfg, setup, matrix), 4 if name.startswith("expert_") else 3
        along = ndim - 2 if tile_rows_scaled(cfg, name) else ndim - 1  # the matrix's axis its scales run along
        if axis == along:
            return 2
        return 1 if axis == 1 and ndim == 4 else None  # whole experts: the scales' expert rows
    if tensor in ("embed", "head"):
        return 0
    if "." not in tensor:
        return None
    _, name = tensor.split(".", 1)
    heads = attention_chips(cfg, setup) > 1
    if name in ("q", "k", "v", "q_b", "kv_b"):  # [layers, H, heads x hd] (MLA's: [layers, rank, heads x width])
        return 2 if heads else None
    if name == "o":
        return 1 if heads else None
    if name in _LATENT_DOWN:  # [layers, H, N]: each chip its block of rows
        return 1 if latent_down_rows(cfg, setup) else None
    if name in ("expert_gate_up_bias", "expert_down_bias"):  # [layers, experts padded to 8, width]: each chip's own
        return 2 if setup.placement == Placement.SPLIT and name == "expert_gate_up_bias" else 1
    rows = cfg.ffn_layout == "sublanes"  # the intermediate on rows: [layers, (E,) I, H] (mk.plan.layout)
    if name in ("mlp_gate", "mlp_up"):
        return 1 if rows else 2
    if name == "mlp_down":
        return 1
    if name in _EXPERT_INTER_AXIS:
        if setup.placement != Placement.SPLIT:  # whole experts, or a group's (hosts): each chip's own experts
            return 1
        return 2 if rows or name == "expert_down" else 3
    return None
