"""The weight stream: each plan ``Load`` as asynchronous DMAs from the HBM tensor into a slot of its VMEM
buffer. Start and wait build the same descriptors, so a wait always matches its start.

An INT8 tile (``Load.scaled``) brings its scales along: the aligned block of ``ROWS`` rows of its scale
tensor holding its expert's row (row 0 for a layer's matrix), for the tile's columns (or its rows,
where the tile has a scale per row), into the same slot of the buffer's scale
buffer. The tile is dequantized in VMEM when an op reads it, exactly as mk.quant does: codes as float32
times the scales of their output channel, rounded to the plan's weight dtype. The matrix unit then
multiplies BF16 (or F32) weights as it does for an unquantized model: decode streams weights, and the
matrix unit is idle most of the step, so an INT8 matmul (which would also need INT8 activations) would
save nothing the stream does not already hide. A shipped format's tile (``FormatLoad``): mk.megakernel.format_tiles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..plan import ROWS, Load
from ..plan.layout import scale_buffer
from ..plan.records import FormatLoad
from ..quant import scale_path
from . import format_tiles


class WeightStream:
    def __init__(self, hbm: dict, buffers: dict, sems: dict, expert_id, priority: int = 0):
        """``hbm``: tensor path -> HBM ref; ``buffers``/``sems``: buffer name -> VMEM slots / DMA
        semaphores; ``expert_id(j)``: the expert routed slot j holds (a scalar); ``priority``: the DMA priority its
        copies start at (mk.plan.Tiles.weight_priority)."""
        self.hbm, self.buffers, self.sems, self.expert_id = hbm, buffers, sems, expert_id
        self.priority = priority
        self.dtype = hbm["embed"].dtype  # the float weight dtype INT8 tiles are dequantized to

    def _row(self, ld: Load):
        """The row of ``ld``'s scale tensor (its expert among this chip's, or 0) and its aligned block's start."""
        row = 0 if ld.expert is None else self.expert_id(ld.expert)
        return row, (row // ROWS) * ROWS if ld.expert is not None else 0

    def copies(self, ld: Load) -> list:
        src = self.hbm[ld.tensor]
        if ld.index is not None:  # the layer's place in a stacked tensor (traced in a loop over layers)
            src = src.at[ld.index]
        if ld.expert is not None:
            src = src.at[self.expert_id(ld.expert)]
        if isinstance(ld, FormatLoad):
            row = None if ld.expert is None else self.expert_id(ld.expert)
            return format_tiles.copies(ld, src, self.hbm, self.buffers, self.sems, row)
        # offsets and slot may be traced (a loop over tiles)
        src = src.at[pl.ds(ld.rows[0], ld.rows[1]), pl.ds(ld.cols[0], ld.cols[1])]
        dst = self.buffers[ld.buffer].at[ld.slot, pl.ds(0, ld.rows[1]), pl.ds(0, ld.cols[1])]
        out = [pltpu.make_async_copy(src, dst, self.sems[ld.buffer].at[ld.slot])]
        if ld.scaled:
            scales = self.hbm[scale_path(ld.tensor)].at[ld.index]
            _, start = self._row(ld)
            start = start if isinstance(start, int) else pl.multiple_of(start, ROWS)
            first, n = ld.rows[0] if ld.row_scales else ld.cols[0], ld.scale_lanes
            src = scales.at[pl.ds(start, ROWS), pl.ds(first, n)]
            sb = scale_buffer(ld.buffer)
            dst = self.buffers[sb].at[ld.slot, :, pl.ds(0, n)]
            out.append(pltpu.make_async_copy(src, dst, self.sems[sb].at[ld.slot]))
        return out

    def start(self, ld: Load):
        for c in self.copies(ld):
            c.start(priority=self.priority)

    def wait(self, ld: Load):
        for c in self.copies(ld):
            c.wait()

    def tile(self, ld: Load):
        """The tile ``ld`` brought in, as a value (its slot may be larger than the tile); dequantized if INT8."""
        if isinstance(ld, FormatLoad):
            return format_tiles.widen(ld, self.buffers, self.dtype)
        w = self.buffers[ld.buffer][ld.slot, : ld.rows[1], : ld.cols[1]]
        if not ld.scaled:
            return w
        row, start = self._row(ld)
        if ld.row_scales:  # a scale per row of the tile: its row of the block, turned into a column
            block = self.buffers[scale_buffer(ld.buffer)][ld.slot, :, : ld.scale_lanes].T  # [lanes, ROWS]
            pick = jax.lax.broadcasted_iota(jnp.int32, block.shape, 1) == row - start
            scale = jnp.sum(jnp.where(pick, block, 0.0), axis=1, keepdims=True)[: ld.rows[1]]
        else:
            block = self.buffers[scale_buffer(ld.buffer)][ld.slot, :, : ld.cols[1]]  # [ROWS, cols] f32
            pick = jax.lax.broadcasted_iota(jnp.int32, block.shape, 0) == row - start
            scale = jnp.sum(jnp.where(pick, block, 0.0), axis=0, keepdims=True)
        return (w.astype(jnp.float32) * scale).astype(self.dtype)
