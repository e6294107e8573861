"""The kernel's memory layout rules: TPU tile sizes, the padded HBM shapes of the weights, the packed
table of small vectors, KV tiles, and how many layers fit one chip's HBM.

Layers of one type are stacked: the kernel's HBM holds ``sliding.q`` [n_sliding, H, nh * hd] rather
than one ``layers.{i}.q`` per layer, and the cache ``sliding.k`` [n_sliding, B, head groups, slots, lanes], so
one loop over the layers can address layer i's weights and cache with an index.

TPU layout rules applied here: a weight tile's last dim is whole lanes (128) and its rows whole
sublanes (8); dims that are not are padded with zeros (the router's expert count, head dims, and
the hidden size), which leaves every result exact; users pad to 8 rows. Heads narrower than 128 lanes are
packed, not padded to 128: a head takes the next power of two of lanes (64 for 64, 64 for 48), and 128 / that many
heads share a 128-lane group (``head_width``, ``head_groups``), in the projections' columns and in the KV cache
([n, B, groups, slots, 128]), so a 64-wide head's K and V are read once, not beside 64 lanes of zeros. The gated
MLPs' intermediate (a chip's slice of it, when split) sits on rows, padded only to 8 (ModelConfig.ffn_layout
"sublanes": gate and up stored transposed, [I, H]; down as it is, [I, H]): a split 26B-A4B expert's
88 columns a chip would pad to 128 lanes are 88 rows. The "lanes" layout keeps the intermediate on
lanes (gate and up [H, I], padded to 128: 704 -> 768), as the kernel first did.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..config import GATED_OUT, ModelConfig
from ..kv_slots import cache_len
from ..params import layer_param_specs, param_specs, tile_rows_scaled
from ..units import BLOCK, LANE, round_up

ROWS = 8  # users pad to one f32 sublane tile


def layout_config(cfg: ModelConfig) -> ModelConfig:
    """The model as the kernel lays it out: hidden size and vocabulary rounded up to whole lanes, head dims to
    ``head_width``. The padding is zeros, so every product is exact; where it would count (a norm's mean, the
    greedy pick over the vocabulary) the kernel uses the model's own sizes. A head keeps its two RoPE halves half its
    width apart (``head_lanes``), so the rotate-half is a roll by half within the head."""
    padded = dict(
        hidden_size=round_up(cfg.hidden_size, LANE),
        vocab_size=round_up(cfg.vocab_size, LANE),
        sliding_head_dim=head_width(cfg.sliding_head_dim),
        full_head_dim=head_width(cfg.full_head_dim),
    )
    if all(getattr(cfg, k) == v for k, v in padded.items()):
        return cfg
    return cfg.replace(**padded)


def head_width(hd: int) -> int:
    """The lanes a head of ``hd`` dims takes in the layout: under 128, the next power of two (it divides 128, so whole
    heads share a 128-lane group and none straddles a group's edge); else whole lanes (0 for no heads)."""
    return round_up(hd, LANE) if hd >= LANE or hd == 0 else 1 << (hd - 1).bit_length()


def group_width(w: int) -> int:
    """Lanes of a head group of heads ``w`` lanes wide: 128 lanes holding 128 // w heads, or one head of w >= 128."""
    return max(w, LANE)


def heads_a_group(w: int) -> int:
    """Heads of width ``w`` one group holds."""
    return group_width(w) // w


def head_groups(heads: int, w: int) -> int:
    """Groups ``heads`` heads of width ``w`` take (the last one part empty where they do not fill it)."""
    return -(-heads * w // group_width(w))


def heads_lanes(heads: int, w: int) -> int:
    """Lanes ``heads`` heads of width ``w`` take: whole groups (a projection's columns, an activation's width)."""
    return head_groups(heads, w) * group_width(w)


def freq_width(cfg: ModelConfig) -> int:
    """Lanes of the RoPE frequency table: a group of either layer type (a head's frequencies in each of its heads)."""
    return max(group_width(cfg.sliding_head_dim), group_width(cfg.full_head_dim))


def head_lanes(hd: int, width: int | None = None) -> np.ndarray:
    """Where each of a head's ``hd`` dims sits in its ``width`` lanes (default ``head_width(hd)``): the first half
    from lane 0, the second half from the middle lane (the pairs RoPE rotates stay half a head apart)."""
    half, mid = hd // 2, (width or head_width(hd)) // 2
    return np.concatenate([np.arange(half), mid + np.arange(hd - half)])


def kv_tiles_read(position, tile: int, slots: int, shared: int = 1, member: int = 0, xp=np):
    """KV tiles of ``tile`` slots a user's attention loop reads when its first row is at ``position``, from this
    chip's ``slots`` slots of a KV head; where ``shared`` chips hold a head's positions, every ``shared``-th block of
    ``BLOCK`` slots each, this chip is member ``member``. ``xp``: ``jax.numpy`` for the kernel's traced position."""
    if shared == 1:
        return xp.minimum(position // tile + 1, slots // tile)
    blocks = xp.minimum(position // BLOCK + 1, slots * shared // BLOCK)  # the head's blocks the user reads
    mine = xp.maximum(0, (blocks - member + shared - 1) // shared)  # of them, every shared-th from this member's
    return (mine * BLOCK + tile - 1) // tile


def scale_buffer(buffer: str) -> str:
    """The VMEM buffer of an INT8 weight buffer's scales."""
    return buffer + ".scale"


def widened_buffer(buffer: str) -> str:
    """The VMEM buffer a 4-bit tile of ``buffer`` is widened into, a block at a time (mk.megakernel.format_tiles)."""
    return buffer + ".widened"


def scale_width(cfg: ModelConfig, path: str, padded: tuple[int, ...]) -> int:
    """Lanes of matrix ``path``'s scale rows, given its padded shape: its columns, or where a tile has one
    scale per row (mk.params.tile_rows_scaled) its rows, padded to whole lanes so a tile's scales
    turn into a column by an (8, 128)-tiled transpose."""
    return round_up(padded[-2], LANE) if tile_rows_scaled(cfg, path) else padded[-1]


# A shipped format's blocks in the layout (mk.megakernel.format_tiles) ---------------------------------------------
def layout_grid(lay, path: str, fmt) -> tuple[int, int]:
    """The (rows, lanes) one scale covers in the kernel's layout of matrix ``path``: along each axis the format's
    block, or where the matrix's length there is not a multiple of it (a chip's cut of an intermediate or a head,
    which may start inside a block: mk.format_trees.format_cuts), the largest common divisor of the two; for an
    MLA projection, cells of that whose weights come from one block of the source (``latent_grid``)."""
    name = path.rsplit(".", 1)[-1]
    if lay.latent_attention is not None and name in LATENT_MATRICES:
        return latent_grid(lay, name, fmt.block)
    gi, go = (math.gcd(b, n) for b, n in zip(fmt.block, _matrix_shapes(lay)[path][-2:]))
    return (go, gi) if lay.outputs_on_rows(path) else (gi, go)


@functools.lru_cache(maxsize=64)
def _matrix_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    return {s.path: s.shape for s in param_specs(cfg)}


def packed_axis(fmt, grid: tuple[int, int]) -> int | None:
    """The tile axis two 4-bit codes share a byte along (the input's, the one its groups run along), or None."""
    return None if not fmt.nibbles else 0 if grid[0] > 1 else 1


# 4-bit codes in the kernel's HBM, two a byte in chunks along the packed axis: a chunk's first half in the low nibbles,
# its second half in the high ones, so a tile unpacks by whole (sublane or lane) tiles, no interleave (which Mosaic
# does not lower). A chunk: 64 rows (32 bytes' rows, 4 int32 sublane tiles a half) or 256 lanes (a lane tile a half).
NIBBLE_CHUNK = (64, 256)


def stored_shape(shape: tuple[int, ...], fmt, grid: tuple[int, int]) -> tuple[int, ...]:
    """The codes' shape of a tile or matrix of ``shape`` (its last two axes in the layout): a 4-bit format's packed
    axis in whole chunks (:data:`NIBBLE_CHUNK`), halved."""
    axis = packed_axis(fmt, grid)
    if axis is None:
        return tuple(shape)
    return tuple(round_up(n, NIBBLE_CHUNK[axis]) // 2 if i == len(shape) - 2 + axis else n for i, n in enumerate(shape))


def scales_shape(shape: tuple[int, ...], grid: tuple[int, int]) -> tuple[int, ...]:
    return (*shape[:-2], math.ceil(shape[-2] / grid[0]), math.ceil(shape[-1] / grid[1]))


def whole_scales(fmt) -> bool:
    """Whether a tile of format ``fmt`` brings its matrix's whole scales: FP8's, a scale per 128 x 128 weights (a slice
    of them a tile wide would not be whole (8, 128) tiles of HBM, which Mosaic's DMAs move); a 4-bit format's, one
    per 32 inputs of each column, come a tile's columns at a time."""
    return not fmt.nibbles


def format_scales_shape(shape: tuple[int, ...], grid: tuple[int, int], fmt) -> tuple[int, ...]:
    """The HBM shape of the scales of a format matrix of ``shape`` (its last two axes in the layout): a scale a block
    of ``grid``; whole scales (:func:`whole_scales`) padded to whole (8, 128) tiles, so the compiler pads nothing."""
    out = scales_shape(shape, grid)
    if not whole_scales(fmt):
        return out
    return (*out[:-2], round_up(out[-2], sublanes(np.dtype(fmt.scales).itemsize)), round_up(out[-1], LANE))


def scale_rows(rows: int) -> int:
    """Rows of a stacked scale tensor in the kernel's HBM: one per expert (or one for a layer's matrix),
    padded to whole f32 sublane tiles: a DMA takes the aligned block of ``ROWS`` holding a row."""
    return round_up(rows, ROWS)


def sublanes(itemsize: int) -> int:
    """Rows of one (sublane, 128) tile for this item size: 8 in f32, 16 in bf16, 32 in int8."""
    return 8 * 4 // itemsize


def laid_out_intermediate(cfg: ModelConfig, width: int) -> int:
    """What a gated MLP's intermediate of ``width`` (a chip's slice of it) takes in the layout: whole rows of 8
    (ffn_layout "sublanes") or whole lanes of 128 ("lanes")."""
    return round_up(width, ROWS if cfg.ffn_layout == "sublanes" else LANE)


def padded_shape(cfg: ModelConfig, path: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a tensor has in the kernel's HBM layout (mk.params' shape in; expert count padded to 128;
    the intermediates as ``cfg.ffn_layout`` says)."""
    name = path.rsplit(".", 1)[-1]
    if name in EXPERT_BIASES:  # [E, width] as rows of whole lanes, the experts padded to 8 (a DMA takes 8 rows)
        return expert_bias_shape(cfg, name, shape[0])
    if cfg.outputs_on_rows(path):
        return (*shape[:-2], laid_out_intermediate(cfg, shape[-1]), shape[-2])
    if cfg.ffn_layout == "sublanes" and name in GATED_OUT:
        return (*shape[:-2], laid_out_intermediate(cfg, shape[-2]), shape[-1])
    if name in ("mlp_gate", "mlp_up", "router_proj"):
        return (shape[0], round_up(shape[1], LANE))
    if name == "mlp_down":
        return (round_up(shape[0], LANE), shape[1])
    if name in ("expert_gate", "expert_up"):
        return (shape[0], shape[1], round_up(shape[2], LANE))
    if name == "expert_down":
        return (shape[0], round_up(shape[1], LANE), shape[2])
    if cfg.latent_attention is not None and name in LATENT_MATRICES:
        return latent_shape(cfg, name, shape)
    if name in HEAD_MATRICES:  # the heads' columns (q, k, v) or rows (o) in whole groups
        axis = 0 if name == "o" else len(shape) - 1
        return tuple(round_up(n, LANE) if a == axis else n for a, n in enumerate(shape))
    return shape


HEAD_MATRICES = ("q", "k", "v", "o")


LATENT_MATRICES = ("q", "q_a", "q_b", "kv_a", "kv_b", "o")


def latent_lanes(cfg: ModelConfig) -> tuple[int, int, int, int]:
    """MLA's widths in the kernel's lanes: a head's no-RoPE query / key part, its RoPE part, its value, the latent
    (each padded to whole lanes, so the kernel slices only at lane-tile edges)."""
    mla = cfg.latent_attention
    dims = (mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.kv_lora_rank)
    return tuple(round_up(d, LANE) for d in dims)


def latent_rope_order(cfg: ModelConfig) -> np.ndarray:
    """The RoPE dims in the order the kernel's rotate-half pairs them: evens then odds where they are interleaved."""
    dr = cfg.latent_attention.qk_rope_head_dim
    if cfg.latent_attention.rope_interleave:
        return np.concatenate([np.arange(0, dr, 2), np.arange(1, dr, 2)])
    return np.arange(dr)


def latent_placement(cfg: ModelConfig, name: str, n: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(source index, kernel index) of each of an MLA matrix's ``n`` entries along ``axis`` (the rest keep their
    place): each head's parts from a lane-tile edge (``latent_shape``), the RoPE dims in ``latent_rope_order``."""
    mla, nh = cfg.latent_attention, cfg.num_heads
    dn, dr, dv, lat = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.kv_lora_rank
    D, Dr, Dv, L = latent_lanes(cfg)
    heads = np.arange(nh)[:, None]
    order = latent_rope_order(cfg)
    if axis == 1 and name in ("q", "q_b"):  # per head: its no-RoPE part, then its RoPE part
        src = np.concatenate([heads * (dn + dr) + np.arange(dn), heads * (dn + dr) + dn + order], 1)
        dst = np.concatenate([heads * (D + Dr) + np.arange(dn), heads * (D + Dr) + D + head_lanes(dr, Dr)], 1)
    elif axis == 1 and name == "kv_a":  # the latent, then the RoPE key
        src = np.concatenate([np.arange(lat), lat + order])
        dst = np.concatenate([np.arange(lat), L + head_lanes(dr, Dr)])
    elif axis == 1 and name == "kv_b":  # per head: its key columns, then its value columns
        src = heads * (dn + dv) + np.arange(dn + dv)
        dst = np.concatenate([heads * (D + Dv) + np.arange(dn), heads * (D + Dv) + D + np.arange(dv)], 1)
    elif axis == 0 and name == "o":  # per head: its value rows
        src, dst = heads * dv + np.arange(dv), heads * Dv + np.arange(dv)
    else:
        src = dst = np.arange(n)
    return src.reshape(-1), dst.reshape(-1)


@functools.lru_cache(maxsize=256)
def latent_grid(cfg: ModelConfig, name: str, block: tuple[int, int]) -> tuple[int, int]:
    """The cells one scale covers in the kernel's layout of MLA matrix ``name`` stored in ``block``s: along each axis
    the largest power of two dividing the block such that a cell's weights come from one block of the source, where
    a chip's cut may start inside a block (mk.format_trees.format_cuts: its blocks are then ``gcd(block, length)``):
    DeepSeek-V3's q_b, each head's 192 columns from lane-tile edges, takes cells of 128 x 64."""
    shape = _matrix_shapes(cfg)[f"layers.0.{name}"]
    laid_out = latent_shape(cfg, name, shape)
    grid = []
    for axis, (n, b) in enumerate(zip(shape, block)):
        src, dst = latent_placement(cfg, name, n, axis)
        of = np.full(round_up(laid_out[axis], b), -1)
        of[dst] = src // math.gcd(b, n)  # each weight's block (-1: padding)
        g = b
        while g > 1 and not _cells_whole(of, g):
            g //= 2
        grid.append(g)
    return tuple(grid)


def _cells_whole(block_of: np.ndarray, g: int) -> bool:
    """Whether each cell of ``g`` entries holds weights of one block (or padding, -1)."""
    cells = block_of.reshape(-1, g)
    top = cells.max(axis=1, keepdims=True)
    return bool(np.all((cells == top) | (cells < 0)))


def latent_shape(cfg: ModelConfig, name: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """An MLA matrix in the kernel's layout (mk.megakernel.latent.to_layout): ranks and the hidden size in whole
    lanes; each head's query (no-RoPE part, then RoPE part), its kv_b key and value columns and its o rows each
    from a lane-tile edge."""
    D, Dr, Dv, L = latent_lanes(cfg)
    nh = cfg.num_heads
    cols = {"q": nh * (D + Dr), "q_b": nh * (D + Dr), "kv_a": L + Dr, "kv_b": nh * (D + Dv)}
    return (nh * Dv if name == "o" else round_up(shape[0], LANE)), cols.get(name, round_up(shape[1], LANE))


EXPERT_BIASES = ("expert_gate_up_bias", "expert_down_bias")  # gpt-oss's, read a row (one expert's) at a time


def expert_bias_shape(cfg: ModelConfig, name: str, experts: int) -> tuple[int, int]:
    """The kernel's layout of an expert bias of ``experts`` experts: a row an expert, padded to whole sublane tiles;
    the gate's and the up's biases each in ``round_up(I, 128)`` lanes (the gate's first), the down's in the hidden
    size's."""
    width = 2 * round_up(cfg.expert_intermediate, LANE) if name == "expert_gate_up_bias" else cfg.hidden_size
    return round_up(experts, ROWS), round_up(width, LANE)


def type_index(cfg: ModelConfig, i: int) -> int:
    """Layer i's place among the layers of its type (its index in the stacked tensors)."""
    return cfg.layer_types[:i].count(cfg.layer_types[i])


def stacked(cfg: ModelConfig, path: str) -> tuple[str, int | None]:
    """The kernel's HBM tensor holding ``path`` and the index in it: ``layers.{i}.{name}`` lives at
    ``{layer type}.{name}[type_index(i)]``; ``embed`` is not stacked (index None).
    An MoE model's dense layers (``cfg.dense_layers``) stack their MLP apart, as ``dense.{name}`` (its intermediate
    differs from the shared expert's), and the FFN tensors of the other layers count those layers only."""
    if not path.startswith("layers."):
        return path, None
    _, i, name = path.split(".", 2)
    i = int(i)
    t = cfg.layer_types[i]
    if cfg.dense_layers and name in FFN_MATRICES:
        dense = i in cfg.dense_layers
        kin = [j for j in range(i) if (j in cfg.dense_layers) == dense and (dense or cfg.layer_types[j] == t)]
        return f"{'dense' if dense else t}.{name}", len(kin)
    return f"{t}.{name}", type_index(cfg, i)


FFN_MATRICES = ("mlp_gate", "mlp_up", "mlp_down", "router_proj", "expert_gate", "expert_up", "expert_down")


def cache_slots(cfg: ModelConfig, layer_type: str, max_len: int, draft_tokens: int = 0) -> int:
    """Slots of a layer's KV cache in the kernel's layout: mk.kv_slots.cache_len's in whole ``BLOCK``s (a sliding
    ring of the window, longer with drafts: mk.kv_slots.ring_slots; ``max_len`` for full layers)."""
    return cache_len(cfg, layer_type, max_len, BLOCK, draft_tokens)


def kv_tile(positions: int, largest: int, multiple: int = BLOCK) -> int:
    """KV positions per tile: the largest multiple of ``multiple`` that divides ``positions`` and is <= ``largest``."""
    return max(t for t in range(multiple, min(positions, largest) + 1, multiple) if positions % t == 0)


def vector_rows(cfg: ModelConfig) -> dict[str, int]:
    """Row of each vector parameter in the packed table (``final_norm`` and every layer's norms/scales). Where layers
    differ in their vectors (an MoE model's dense layers lack the router's bias), every layer gets a row for each
    vector any layer has (zeros where it has none), so layer i's rows are layer 0's plus i strides."""
    paths = [s.path for s in param_specs(cfg) if len(s.shape) == 1]
    if cfg.dense_layers:
        names = dict.fromkeys(p.split(".", 2)[2] for p in paths if p.startswith("layers."))
        paths = [p for p in paths if not p.startswith("layers.")]
        paths += [f"layers.{i}.{n}" for i in range(cfg.num_layers) for n in names]
    return {p: n for n, p in enumerate(paths)}


def vector_stride(cfg: ModelConfig) -> int:
    """Rows between a vector of layer i and the same vector of layer i + 1 (every layer has the same vectors)."""
    rows = vector_rows(cfg)
    return rows["layers.1.input_norm"] - rows["layers.0.input_norm"] if cfg.num_layers > 1 else 0


def vector_table_shape(cfg: ModelConfig) -> tuple[int, int]:
    """Rows and width of the packed table of norm weights and scales (one vector a row)."""
    n = 1 + len(vector_rows(cfg))
    width = max(cfg.hidden_size, cfg.full_head_dim, cfg.sliding_head_dim, cfg.num_experts, 1)
    if cfg.attention_bias:  # q's bias over every query head, each head in its lanes (mk.megakernel.pack)
        width = max(width, heads_lanes(cfg.num_heads, max(cfg.full_head_dim, cfg.sliding_head_dim)))
    return n, round_up(width, LANE)


def layers_in_hbm(cfg: ModelConfig, hbm_bytes: float, batch: int, max_len: int, itemsize: int = 2) -> int:
    """How many of ``cfg``'s first layers (every expert included), with the embedding/head and their
    KV caches, fit in ``hbm_bytes`` (one chip's HBM), in the kernel's padded layout (the compiler
    refused a 26B-A4B cut counted unpadded for v6e: its 704 -> 768 expert padding is ~9% of a layer)."""
    used = cfg.vocab_size * cfg.hidden_size * itemsize * (1 if cfg.tied_embeddings else 2)
    for i, t in enumerate(cfg.layer_types):
        kv = 2 * batch * cfg.kv_heads(t) * cache_slots(cfg, t, max_len) * cfg.head_dim(t)
        weights = sum(math.prod(padded_shape(cfg, s.path, s.shape)) for s in layer_param_specs(cfg, i))
        used += (weights + kv) * itemsize
        if used > hbm_bytes:
            return i
    return cfg.num_layers
