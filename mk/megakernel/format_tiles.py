"""The shipped formats (mk.format_trees) in the kernel: their HBM layout, their tiles' DMAs, and widening in VMEM.

A format matrix is laid out as its float matrix would be (mk.megakernel.pack.to_layout: padded, heads spread, transposed
where its outputs sit on rows), then stored as the format stores it: FP8 codes as they are, 4-bit codes two a byte along
the input axis (rows, or lanes where transposed) in chunks, a chunk's first half in the low nibbles and its second in
the high ones (mk.plan.layout.NIBBLE_CHUNK: a tile unpacks by whole tiles, which Mosaic lowers), and one scale per block
of the layout in its own dtype, ``{name}_fscale [layers, (E,) ceil(rows / gr), ceil(cols / gc)]`` with (gr, gc) the
format's block in the layout's orientation (FP8's padded to whole (8, 128) tiles). A layout that would put one block's
weights in two (a head dim that does not divide the block, spread to whole lanes) is refused by name. A tile brings its
codes and its blocks' scales; the kernel widens it in VMEM with mk.checkpoint_formats' arithmetic: codes to float32,
times the scale repeated over its block, rounded to the compute dtype: the numbers mk.format_trees.dequantize gives the
reference."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..checkpoint_formats import INT4_ZERO, e8m0_value, fp4_value, nibbles
from ..format_trees import INT4, MXFP4, Format, fscale_path, get_format, matrix_block
from ..plan.layout import (
    NIBBLE_CHUNK,
    format_scales_shape,
    layout_grid,
    packed_axis,
    scales_shape,
    stored_shape,
    widened_buffer,
)
from ..units import LANE


def _zero(fmt: Format) -> int:
    return INT4_ZERO if fmt.name == INT4 else 0


def to_layout(codes, scales, cfg, path: str, lay, fmt: Format, matrix_to_layout) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scales) of a format matrix (mk.format_trees' tree layout) in the kernel's layout ``lay``, where
    ``matrix_to_layout`` (mk.megakernel.pack.to_layout) lays a float matrix out."""
    c = np.asarray(codes)
    gi, go = matrix_block(c, scales, fmt.name)  # the format's, or the finer blocks a chip's cut left
    if fmt.nibbles:  # each code alone, as the signed offset from the format's zero, so padding is a zero weight
        c = nibbles(c, -2).astype(np.int8) - _zero(fmt)
    lay_c = np.asarray(matrix_to_layout(jnp.asarray(c), cfg, path, lay))
    # where each weight's block lands: 1 + its block's index, laid out as the weights are (0: padding)
    i, o = c.shape[-2:]
    blocks_out = math.ceil(o / go)
    ids = (np.arange(i)[:, None] // gi * blocks_out + np.arange(o)[None, :] // go + 1).astype(np.float32)
    ids = ids.reshape((1,) * (c.ndim - 2) + ids.shape)
    lay_ids = np.asarray(matrix_to_layout(jnp.asarray(ids), cfg, path, lay)).reshape(lay_c.shape[-2:])
    gr, gc = grid = layout_grid(lay, path, fmt)
    first = lay_ids[::gr, ::gc]
    spread = np.repeat(np.repeat(first, gr, 0), gc, 1)[: lay_ids.shape[0], : lay_ids.shape[1]]
    if np.any((lay_ids != 0) & (lay_ids != spread)):
        raise ValueError(
            f"{path}: the kernel's layout of it puts weights of one {fmt.name} block of {gi} x {go} into different "
            f"blocks of {gr} x {gc} (a head dim that does not divide {max(gi, go)}, spread to whole lanes?): "
            "use int8 weights for this model"
        )
    s = np.asarray(scales)
    flat = s.reshape(*s.shape[:-2], -1)
    pick = np.maximum(first.astype(np.int64) - 1, 0)
    lay_s = np.where(first > 0, flat[..., pick], 0).astype(fmt.scales)
    stored = format_scales_shape(lay_ids.shape, grid, fmt)
    lay_s = np.pad(lay_s, [(0, 0)] * (lay_s.ndim - 2) + [(0, n - k) for n, k in zip(stored, lay_s.shape[-2:])])
    axis = packed_axis(fmt, grid)
    if axis is not None:
        lay_c = pack_halves(lay_c, lay_c.ndim - 2 + axis, NIBBLE_CHUNK[axis], _zero(fmt))
    return lay_c, lay_s


def pack_halves(codes: np.ndarray, axis: int, chunk: int, zero: int) -> np.ndarray:
    """Signed 4-bit ``codes`` (offsets from the format's ``zero``) two a byte along ``axis``, padded with zero weights
    to whole ``chunk``s: each chunk's first half in the low nibbles, its second half in the high ones."""
    n = codes.shape[axis]
    pad = [(0, 0)] * codes.ndim
    pad[axis] = (0, -n % chunk)
    c = np.moveaxis((np.pad(codes, pad) + zero).astype(np.uint8), axis, -1)
    c = c.reshape(*c.shape[:-1], -1, 2, chunk // 2)
    return np.ascontiguousarray(np.moveaxis((c[..., 0, :] | (c[..., 1, :] << 4)).reshape(*c.shape[:-3], -1), -1, axis))


def unpack_halves(packed, axis: int, chunk: int):
    """:func:`pack_halves`' codes (offsets plus the zero) from ``packed`` [rows, lanes] int32: each chunk's halves by
    whole tiles, side by side."""
    half, parts = chunk // 2, []
    for k in range(packed.shape[axis] // half):
        part = packed[k * half : (k + 1) * half] if axis == 0 else packed[:, k * half : (k + 1) * half]
        parts += [part & 0x0F, part >> 4]
    return jnp.concatenate(parts, axis=axis)


def _stored(ld) -> list[tuple]:
    """Tile ``ld``'s codes as stored: (first, size) of their rows and of their columns (along a 4-bit format's input
    axis halved, in whole chunks: a tile starts at a chunk's edge)."""
    sizes = stored_shape((ld.rows[1], ld.cols[1]), get_format(ld.fmt), ld.grid)
    axis = packed_axis(get_format(ld.fmt), ld.grid)
    return [(first // 2 if a == axis else first, k) for a, ((first, _), k) in enumerate(zip((ld.rows, ld.cols), sizes))]


def copies(ld, src, hbm: dict, buffers: dict, sems: dict, expert_row) -> list:
    """The DMAs of format tile ``ld`` (``src``: its layer's, and expert's, codes in HBM): its codes, and its matrix's
    scales (FP8: all of them) or its blocks', each into the slot of its buffer."""
    (r0, nr), (c0, nc) = _stored(ld)
    dst = buffers[ld.buffer].at[ld.slot, pl.ds(0, nr), pl.ds(0, nc)]
    out = [pltpu.make_async_copy(src.at[pl.ds(r0, nr), pl.ds(c0, nc)], dst, sems[ld.buffer].at[ld.slot])]
    scales = hbm[fscale_path(ld.tensor)]
    if ld.index is not None:
        scales = scales.at[ld.index]
    if ld.expert is not None:
        scales = scales.at[expert_row]
    sb = ld.scales_buffer
    if ld.matrix_scales is not None:
        out.append(pltpu.make_async_copy(scales, buffers[sb].at[ld.slot], sems[sb].at[ld.slot]))
        return out
    sr, sc = scales_shape((ld.rows[1], ld.cols[1]), ld.grid)
    scales = scales.at[pl.ds(ld.rows[0] // ld.grid[0], sr), pl.ds(ld.cols[0] // ld.grid[1], sc)]
    out.append(pltpu.make_async_copy(scales, buffers[sb].at[ld.slot, pl.ds(0, sr), pl.ds(0, sc)], sems[sb].at[ld.slot]))
    return out


def _lane_scales(ld, buffers: dict):
    """Tile ``ld``'s scales as float32 [its blocks down, its columns]: each column's scale in each block of rows, from
    its slot: its own blocks', or picked from its matrix's whole scales, by one-hot products (exact at the highest
    precision; the tile's offsets may be traced in a loop)."""
    cols, (gr, gc) = ld.cols[1], ld.grid
    sr, sc = scales_shape((ld.rows[1], cols), ld.grid)
    exact = dict(precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    if ld.matrix_scales is None:
        own = buffers[ld.scales_buffer][ld.slot, :sr, :sc].astype(jnp.float32)
        return own if gc == 1 else jnp.dot(own, _one_hot((sc, cols), 0, gc), **exact)
    whole = buffers[ld.scales_buffer][ld.slot].astype(jnp.float32)
    R, C = ld.matrix_scales
    picked = jnp.dot(_one_hot((R, sr), ld.rows[0] // gr).T, whole, **exact)  # [its blocks down, the matrix's across]
    return jnp.dot(picked, _one_hot((C, cols), ld.cols[0] // gc, gc), **exact)


def _one_hot(shape: tuple[int, int], first, per: int = 1):
    """[N, n] float32: column j one at row ``first + j // per`` (``first`` may be traced)."""
    iota = functools.partial(jax.lax.broadcasted_iota, jnp.int32, shape)
    return (iota(0) == first + iota(1) // per).astype(jnp.float32)


# A 4-bit tile is widened a block at a time along the axis its codes are not packed on (lanes where they pack rows,
# rows where they pack lanes), each block into the tile's widened buffer: the kernel holds one block's code, not the
# tile's (a tile of 4.5 M weights widened in straight-line vector code kept libtpu compiling for over 15 minutes)
WIDEN_BLOCK = (LANE, 32)  # lanes a block takes where the codes pack rows; rows (a uint8 sublane tile) where lanes


def widen(ld, buffers: dict, dtype):
    """Tile ``ld`` from its slot, widened: codes to float32, times each block's scale, rounded to ``dtype``."""
    if ld.nibbles and _blocked(ld):
        return _widen_by_blocks(ld, buffers, dtype)
    rows, cols = ld.rows[1], ld.cols[1]
    (_, r), (_, c) = _stored(ld)
    codes = buffers[ld.buffer][ld.slot, :r, :c]
    if not ld.nibbles:
        vals = codes.astype(jnp.float32)
    else:
        axis = packed_axis(get_format(ld.fmt), ld.grid)
        vals = _four_bit_values(unpack_halves(codes.astype(jnp.int32), axis, NIBBLE_CHUNK[axis])[:rows, :cols], ld.fmt)
    s = _scale_values(_lane_scales(ld, buffers), ld.fmt)
    gr = ld.grid[0]
    if rows % gr:  # a partial block of rows
        return (vals * jnp.repeat(s, gr, axis=0)[:rows]).astype(dtype)
    # each block of rows times its row of scales, broadcast down it (a split of the rows at whole sublane tiles)
    return (vals.reshape(rows // gr, gr, cols) * s[:, None, :]).reshape(rows, cols).astype(dtype)


def _four_bit_values(q, fmt: str):
    """The float32 values of 4-bit codes ``q`` (int32): FP4's, or INT4's offsets from its zero."""
    return fp4_value(q, jnp) if fmt == MXFP4 else (q - INT4_ZERO).astype(jnp.float32)


def _scale_values(s, fmt: str):
    """The float32 factors of a tile's scales ``s`` (float32): MXFP4's E8M0 exponents as powers of two, else as they
    are."""
    return e8m0_value(s.astype(jnp.int32), jnp) if fmt == MXFP4 else s


def _blocked(ld) -> bool:
    """Whether 4-bit tile ``ld`` splits into whole blocks (:data:`WIDEN_BLOCK`) along the axis its codes do not pack
    (a 4-bit tile brings its own scales, one per group of the packed axis)."""
    axis = packed_axis(get_format(ld.fmt), ld.grid)
    return (ld.cols[1] if axis == 0 else ld.rows[1]) % WIDEN_BLOCK[axis] == 0


def _widen_by_blocks(ld, buffers: dict, dtype):
    """:func:`widen` for a 4-bit tile, a block at a time in a loop (:data:`WIDEN_BLOCK`), into its widened buffer."""
    rows, cols = ld.rows[1], ld.cols[1]
    axis = packed_axis(get_format(ld.fmt), ld.grid)
    (_, r), (_, c) = _stored(ld)
    (gr, gc), step = ld.grid, WIDEN_BLOCK[axis]
    sr, sc = scales_shape((rows, cols), ld.grid)
    codes, scales = buffers[ld.buffer].at[ld.slot], buffers[ld.scales_buffer].at[ld.slot]
    wide = buffers[widened_buffer(ld.buffer)].at[0]
    exact = dict(precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)

    def block(j, carry):
        at = pl.multiple_of(j * step, step)
        if axis == 0:  # codes packed along rows: all rows of ``step`` lanes, a scale per group of rows
            q = unpack_halves(codes[:r, pl.ds(at, step)].astype(jnp.int32), 0, NIBBLE_CHUNK[0])[:rows]
            s = scales[:sr, pl.ds(at, step)].astype(jnp.float32)
            s = jnp.repeat(s, gr, axis=0)[:rows]
        else:  # packed along lanes: ``step`` rows, a scale per group of lanes
            q = unpack_halves(codes[pl.ds(at, step), :c].astype(jnp.int32), 1, NIBBLE_CHUNK[1])[:, :cols]
            s = jnp.dot(scales[pl.ds(at, step), :sc].astype(jnp.float32), _one_hot((sc, cols), 0, gc), **exact)
        out = (_four_bit_values(q, ld.fmt) * _scale_values(s, ld.fmt)).astype(dtype)
        if axis == 0:
            wide[:rows, pl.ds(at, step)] = out
        else:
            wide[pl.ds(at, step), :cols] = out
        return carry

    jax.lax.fori_loop(0, (cols if axis == 0 else rows) // step, block, 0)
    return wide[:rows, :cols]
