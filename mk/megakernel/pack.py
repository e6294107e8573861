"""The kernel's HBM layout, made from the reference's parameter tree and KV cache (and back).

Once per parameter tree (``pack``) and once per generation (``adopt_cache``), never per step:

- matrices padded with zeros to the kernel's layout (mk.plan.layout): hidden size, head dims and the
  vocabulary to whole lanes (a head's two RoPE halves at lanes 0 and 64 when hd < 128), the expert
  count to a multiple of 128, the gated MLPs as ``cfg.ffn_layout`` lays them out (gate and up transposed,
  the intermediate on rows); then each layer type's matrices stacked over its layers;
  INT8 matrices (mk.quant) as their codes, with their scales laid out as their output channels are; a shipped
  format's (mk.format_trees) as its codes and block scales (mk.megakernel.format_tiles);
- the vector table: every norm weight and scale a row (f32), head vectors in the same head lanes;
- the RoPE inverse frequencies, one row per layer type, in the same head lanes;
- the cache: per layer type, K and V stacked over its layers, head dims in the same lanes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..blocks import inv_freq
from ..config import ModelConfig
from ..format_trees import format_of, format_paths, fscale_path, get_format
from ..mla import inv_freq as mla_inv_freq
from ..params import scales_inputs
from ..plan import (
    BLOCK,
    ROWS,
    layout_config,
    padded_shape,
    round_up,
    stacked,
    type_index,
    vector_rows,
    vector_table_shape,
)
from ..plan.arrays import matrix_shapes, packed_arrays
from ..plan.layout import (
    EXPERT_BIASES,
    LATENT_MATRICES,
    expert_bias_shape,
    freq_width,
    head_groups,
    head_lanes,
    head_width,
    heads_a_group,
    latent_lanes,
    scale_rows,
    scale_width,
)
from ..plan.step import check_slots_shared
from ..quant import quantized_paths, scale_path, scheme_of
from ..sharding import attention_chips, cache_split_axis, chip_cache, chip_config, first_kv_head, position_share
from . import latent
from .format_tiles import to_layout as format_to_layout
from .refs import struct

HIDDEN, VOCAB = "hidden", "vocab"


def _axes(cfg: ModelConfig, path: str, ndim: int) -> tuple:
    """What each axis of a matrix is: HIDDEN, VOCAB, (heads, head_dim) or None (padded by padded_shape)."""
    name = path.rsplit(".", 1)[-1]
    if name in ("embed", "head"):  # an untied head [V, H], as the embedding
        return VOCAB, HIDDEN
    t = cfg.layer_types[int(path.split(".")[1])]
    heads = {
        "q": (cfg.num_heads, cfg.head_dim(t)),
        "k": (cfg.kv_heads(t), cfg.head_dim(t)),
        "v": (cfg.kv_heads(t), cfg.head_dim(t)),
        "o": (cfg.num_heads, cfg.head_dim(t)),
    }
    if name in ("q", "k", "v"):
        return HIDDEN, heads[name]
    if name == "o":
        return heads[name], HIDDEN
    if name in ("mlp_down", "expert_down"):
        return (None,) * (ndim - 1) + (HIDDEN,)
    return (None,) * (ndim - 2) + (HIDDEN, None)


def _spread_heads(a, axis: int, heads: int, hd: int):
    """Axis ``axis`` of ``a`` (heads x hd) as heads x head_width(hd), each head in ``head_lanes``."""
    lanes = head_lanes(hd)
    if lanes[-1] == hd - 1:  # hd is a head's width already
        return a
    a = jnp.moveaxis(a, axis, -1)
    split = a.reshape(*a.shape[:-1], heads, hd)
    out = jnp.zeros((*split.shape[:-1], head_width(hd)), a.dtype).at[..., lanes].set(split)
    return jnp.moveaxis(out.reshape(*a.shape[:-1], -1), -1, axis)


def _grouped(a, hd: int):
    """A cache [..., heads, slots, hd] in the kernel's head groups, [..., groups, slots, group lanes]: group j's
    lanes hold heads j * n .. j * n + n - 1 side by side (n = heads_a_group), each in its ``head_lanes``."""
    w = head_width(hd)
    n, a = heads_a_group(w), _spread_heads(a, a.ndim - 1, 1, hd)
    *lead, heads, S, _ = a.shape
    G = head_groups(heads, w)
    a = _pad_to(a, (*lead, G * n, S, w)).reshape(*lead, G, n, S, w)
    return jnp.swapaxes(a, -3, -2).reshape(*lead, G, S, n * w)


def _ungrouped(a, heads: int, hd: int):
    """``_grouped``'s inverse: [..., groups, slots, group lanes] -> [..., heads, slots, hd]."""
    w = head_width(hd)
    *lead, G, S, _ = a.shape
    a = jnp.swapaxes(a.reshape(*lead, G, S, heads_a_group(w), w), -3, -2).reshape(*lead, -1, S, w)
    return a[..., :heads, :, :][..., head_lanes(hd)]


def _layout_shape(cfg: ModelConfig, path: str, shape: tuple, lay: ModelConfig) -> tuple:
    """The shape of a matrix of the reference tree in the kernel's layout ``lay`` (before stacking)."""
    axes = _axes(cfg, path, len(shape))
    sizes = {HIDDEN: lay.hidden_size, VOCAB: lay.vocab_size}
    spread = tuple(
        kind[0] * head_width(kind[1]) if isinstance(kind, tuple) else sizes.get(kind, n) for kind, n in zip(axes, shape)
    )
    return padded_shape(lay, path, spread)


def _pad_to(a, target):
    return a if tuple(target) == a.shape else jnp.pad(a, [(0, t - s) for s, t in zip(a.shape, target)])


def to_layout(a, cfg: ModelConfig, path: str, lay: ModelConfig):
    """One matrix of the reference tree in the kernel's layout ``lay`` (before stacking)."""
    target = _layout_shape(cfg, path, a.shape, lay)
    return _matrix_in_layout(a, _axes(cfg, path, a.ndim), lay.outputs_on_rows(path), target)


# One program for each kind of matrix (its axes, orientation and padded shape), shared by every layer of the kind:
# eager, each of its ops would compile on its own for each shape (hundreds of compiles for a small model).
@functools.partial(jax.jit, static_argnames=("axes", "on_rows", "target"))
def _matrix_in_layout(a, axes: tuple, on_rows: bool, target: tuple):
    for axis, kind in enumerate(axes):
        if isinstance(kind, tuple):
            a = _spread_heads(a, axis, *kind)
    if on_rows:
        a = jnp.swapaxes(a, -1, -2)
    return _pad_to(a, target)


def scales_to_layout(scale, cfg: ModelConfig, path: str, shape: tuple, lay: ModelConfig):
    """A quantized matrix's scales ([(E,) out], or [(E,) in] for a down projection: mk.quant) in the kernel's
    layout: their channels spread and padded as the matrix's are, as rows [experts or 1 padded to 8, lanes]
    (mk.plan.layout.scale_rows, scale_width)."""
    kind = _axes(cfg, path, len(shape))[-2 if scales_inputs(path) else -1]
    return _scales_in_layout(scale, kind, scale_width(lay, path, _layout_shape(cfg, path, shape, lay)))


@functools.partial(jax.jit, static_argnames=("kind", "width"))
def _scales_in_layout(scale, kind, width: int):
    s = scale.astype(jnp.float32)
    s = s.reshape(-1, s.shape[-1])
    if isinstance(kind, tuple):
        s = _spread_heads(s, 1, *kind)
    return _pad_to(s, (scale_rows(s.shape[0]), width))


def pack(params: dict, cfg: ModelConfig) -> dict:
    """The kernel's inputs from the reference parameter tree: stacked matrices in the kernel's layout
    (their own dtype), the vector table (f32) and the RoPE inverse frequencies (f32)."""
    lay = layout_config(cfg)
    fmt = format_of(params)
    quantized = set(format_paths(cfg, fmt) if fmt else quantized_paths(cfg, scheme_of(params, cfg)))
    mla = cfg.latent_attention is not None
    if mla and not fmt and any(p.rsplit(".", 1)[-1] in LATENT_MATRICES for p in quantized):
        raise ValueError(
            f"{cfg.name}: the megakernel streams MLA's projections as shipped (FP8 blocks) or unquantized, not as INT8 "
            "(quantize the experts only: int8-experts)"
        )
    stacks = _Stacks(cfg)
    for path, shape in matrix_shapes(cfg).items():
        latent_matrix = mla and path.rsplit(".", 1)[-1] in LATENT_MATRICES
        if path.rsplit(".", 1)[-1] in EXPERT_BIASES:
            stacks.put(path, expert_bias_to_layout(params[path], path, lay))
        elif fmt and path in quantized:
            codes, scales = format_to_layout(
                params[path], params[fscale_path(path)], cfg, path, lay, get_format(fmt),
                latent.to_layout if latent_matrix else to_layout,
            )  # fmt: skip
            stacks.put(path, jnp.asarray(codes))
            stacks.put(path, jnp.asarray(scales), fscale_path)
        elif latent_matrix:
            stacks.put(path, latent.to_layout(params[path], cfg, path, lay))
        else:
            stacks.put(path, to_layout(params[path], cfg, path, lay))
            if path in quantized:
                stacks.put(path, scales_to_layout(params[scale_path(path)], cfg, path, shape, lay), scale_path)
    weights = stacks.out
    n, width = vector_table_shape(lay)
    table = np.zeros((round_up(n, ROWS), width), np.float32)
    for path, row in vector_rows(cfg).items():
        if path not in params:  # a vector other layers have (an MoE model's dense layer: the router's bias)
            continue
        v = np.asarray(params[path], np.float32).reshape(-1)
        name = path.rsplit(".", 1)[-1]
        if name == "layer_scalar":
            table[row, :] = v[0]  # broadcast, so x * row multiplies every lane
        elif name in ("q_norm", "k_norm"):  # in each head of a group (the norm runs on a group at once)
            lanes, values = _in_each_head(v)
            table[row, lanes] = values
        elif name in ("q_bias", "k_bias", "v_bias"):  # each head's in its lanes, as the projection's columns
            hd = cfg.head_dim(cfg.layer_types[int(path.split(".")[1])])
            table[row, _heads_lanes(hd, v.size // hd)] = v
        else:
            table[row, : v.size] = v
    freqs = np.zeros((ROWS, freq_width(lay)), np.float32)
    for r, t in enumerate(("sliding", "full")):
        if t not in cfg.layer_types:
            continue
        if mla:  # over its RoPE key's dims, in whole lanes
            f = mla_inv_freq(cfg)
            freqs[r, head_lanes(2 * f.size, latent_lanes(cfg)[1])] = np.concatenate([f, f])
        else:  # in each head of a group
            lanes, values = _in_each_head(np.concatenate([inv_freq(cfg, t)] * 2))
            freqs[r, lanes] = values
    return dict(vectors=jnp.asarray(table), inv_freq=jnp.asarray(freqs), weights=weights)


def _in_each_head(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A head's vector ``v`` (its norm's weights, its RoPE frequencies) in each head of a 128-lane group: (the lanes,
    the values), for a row of the vector table or the frequency table."""
    n = heads_a_group(head_width(v.size))
    return _heads_lanes(v.size, n), np.tile(v, n)


def _heads_lanes(hd: int, heads: int) -> np.ndarray:
    """The lanes of ``heads`` heads of ``hd`` dims side by side, each in its ``head_lanes``."""
    return (np.arange(heads)[:, None] * head_width(hd) + head_lanes(hd)[None, :]).reshape(-1)


class _Stacks:
    """The kernel's stacked tensors filled layer by layer, in place: each allocated (zeros, on the default device) when
    its first layer arrives, every layer written into its slot by a donated update. The device holds the packed
    weights and one layer in flight, never a list of layers beside their stack: a model that fits a chip for the
    reference fits for the kernel. ``embed`` and an untied ``head`` are not stacked."""

    def __init__(self, cfg: ModelConfig):
        self.cfg, self.out = cfg, {}
        self.layers: dict[str, int] = {}  # each stacked tensor's layers
        for path in matrix_shapes(cfg):
            name, index = stacked(cfg, path)
            if index is not None:
                self.layers[name] = max(self.layers.get(name, 0), index + 1)

    def put(self, path: str, a, named=lambda name: name) -> None:
        """``a`` (``path``'s layer in the kernel's layout, or its scales: ``named`` gives their tensor's name from the
        matrix's) into its stacked tensor."""
        name, index = stacked(self.cfg, path)
        if index is None:
            self.out[named(name)] = a
            return
        name, layers = named(name), self.layers[name]
        if name not in self.out:
            self.out[name] = jnp.zeros((layers, *a.shape), a.dtype)
        self.out[name] = _set_layer(self.out[name], index, a)


@functools.partial(jax.jit, donate_argnums=0)
def _set_layer(stack, index, a):
    return stack.at[index].set(a)


def expert_bias_to_layout(a, path: str, lay: ModelConfig):
    """gpt-oss's expert bias ``[E, 2I]`` (the gate's I, then the up's) or ``[E, H]`` in the kernel's layout
    (mk.plan.layout.expert_bias_shape): a row an expert; the gate's and the up's each from a whole lane."""
    name = path.rsplit(".", 1)[-1]
    rows, width = expert_bias_shape(lay, name, a.shape[0])
    out = jnp.zeros((rows, width), a.dtype)
    if name == "expert_gate_up_bias":
        inter = a.shape[1] // 2
        return (
            out.at[: a.shape[0], :inter]
            .set(a[:, :inter])
            .at[: a.shape[0], width // 2 : width // 2 + inter]
            .set(a[:, inter:])
        )
    return out.at[: a.shape[0], : a.shape[1]].set(a)


def packed_shapes(cfg: ModelConfig, weight_dtype: str, quantize: str = "none") -> dict:
    """``jax.ShapeDtypeStruct``s of ``pack``'s output, without any weights (``weight_dtype``: the float weights' element
    type, mk.dtypes.ARRAY_DTYPES)."""
    arrays = packed_arrays(layout_config(cfg), weight_dtype, quantize)
    weights = {name: struct(a) for name, a in arrays.weights.items()}
    return dict(vectors=struct(arrays.vectors), inv_freq=struct(arrays.inv_freq), weights=weights)


def adopt_cache(cfg: ModelConfig, cache: dict) -> dict:
    """The kernel's cache from the reference's (mk.reference.init_cache with every layer's slots a
    multiple of the kernel's block): head dims in the kernel's lanes, each layer type's K and V stacked (MLA's
    latent and RoPE key: mk.megakernel.latent)."""
    if cfg.latent_attention is not None:
        return latent.adopt_cache(cfg, cache)
    out = {}
    for t in sorted(set(cfg.layer_types)):
        for n in ("k", "v"):
            layers = [
                _grouped(cache[f"layers.{i}.{n}"], cfg.head_dim(t)) for i, u in enumerate(cfg.layer_types) if u == t
            ]
            out[f"{t}.{n}"] = jnp.stack(layers)
    return out


def reference_cache(cfg: ModelConfig, cache: dict) -> dict:
    """The reference's cache layout from the kernel's (to compare them)."""
    if cfg.latent_attention is not None:
        return latent.reference_cache(cfg, cache)
    return {
        f"layers.{i}.{n}": _ungrouped(cache[f"{t}.{n}"][type_index(cfg, i)], cfg.kv_heads(t), cfg.head_dim(t))
        for i, t in enumerate(cfg.layer_types)
        for n in ("k", "v")
    }


# Over several chips: each chip's cache laid out as above, joined on the axis split over the chips (the weights:
# each chip's slice packed on that chip, mk.megakernel.engine.MegakernelEngine.packed).
def _join_caches(parts: list[dict], cfg: ModelConfig, setup) -> dict:
    axis = cache_split_axis(cfg, setup)
    return {n: parts[0][n] if axis is None else jnp.concatenate([p[n] for p in parts], axis) for n in parts[0]}


def _blocks_of(a, member: int, g: int):
    """Of ``a``'s slots (axis -2), the blocks of ``BLOCK`` that member ``member`` of ``g`` chips sharing them holds:
    blocks member, member + g, ... (mk.megakernel.attention.emit_attend_shared)."""
    *lead, S, hd = a.shape
    return a.reshape(*lead, S // BLOCK // g, g, BLOCK, hd)[..., member, :, :].reshape(*lead, S // g, hd)


def _interleave_blocks(parts: list):
    """The slots of ``parts`` (each member's blocks, in member order) as the head's: ``_blocks_of``'s inverse."""
    *lead, s, hd = parts[0].shape
    x = jnp.stack([p.reshape(*lead, s // BLOCK, BLOCK, hd) for p in parts], axis=-3)
    return x.reshape(*lead, s * len(parts), hd)


def adopt_cache_chips(cfg: ModelConfig, cache: dict, setup) -> dict:
    """``adopt_cache`` over several chips: each chip's KV heads (mk.sharding.chip_cache) side by side; where chips
    share a KV head's positions (mk.sharding.position_share), each chip's blocks of its slots only. With the users
    split, the whole cache: its users axis is the one split (chip c's users are rows c * B/C ..). Where one chip stands
    in for the slice (``setup.loopback``), chip 0's part alone."""
    if not setup.sharded or setup.users_split:
        return adopt_cache(cfg, cache)
    local = chip_config(cfg, setup)
    parts = []
    for c in range(1 if setup.loopback else setup.chips):
        mine = chip_cache(cache, cfg, setup, c)
        for path in mine:
            t = cfg.layer_types[int(path.split(".")[1])]
            g = position_share(cfg, t, setup)
            check_slots_shared(t, g, mine[path].shape[-2])
            mine[path] = _blocks_of(mine[path], c % g, g) if g > 1 else mine[path]
        parts.append(adopt_cache(local, mine))
    return _join_caches(parts, cfg, setup)


def reference_cache_chips(cfg: ModelConfig, cache: dict, setup) -> dict:
    """The reference's cache from ``adopt_cache_chips``'s layout (a KV head kept on several chips is
    the same on each: the first copy is taken; heads repeated over groups of chips: the first group's)."""
    D = attention_chips(cfg, setup)
    if setup.users_split or D == 1 or cfg.latent_attention is not None:
        return reference_cache(cfg, cache)
    local, C = chip_config(cfg, setup), setup.chips
    out = {}
    for i, t in enumerate(cfg.layer_types):
        kv, g = local.kv_heads(t), position_share(cfg, t, setup)
        for n in ("k", "v"):
            a = cache[f"{t}.{n}"][type_index(cfg, i)]  # [B, C * groups, S, lanes]: each chip's groups
            a = _ungrouped(a.reshape(a.shape[0], C, -1, *a.shape[2:]), kv, cfg.head_dim(t))
            a = a.reshape(a.shape[0], C * kv, *a.shape[3:])  # [B, C * kv, S, hd]
            heads = {}
            for c in range(0, D, g):  # where g chips share a head's positions: its g members' blocks, in order
                for h in range(kv):
                    members = [a[:, (c + j) * kv + h] for j in range(g)]
                    heads.setdefault(
                        first_kv_head(cfg, t, D, c) + h, members[0] if g == 1 else _interleave_blocks(members)
                    )
            out[f"layers.{i}.{n}"] = jnp.stack([heads[h] for h in range(cfg.kv_heads(t))], axis=1)
    return out
