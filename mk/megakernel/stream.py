"""The weight stream: each plan ``Load`` as an asynchronous DMA from the HBM tensor into a slot of
its VMEM buffer. Start and wait build the same descriptor, so a wait always matches its start.
"""

from __future__ import annotations

from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..plan import Load


class WeightStream:
    def __init__(self, hbm: dict, buffers: dict, sems: dict, expert_id):
        """``hbm``: tensor path -> HBM ref; ``buffers``/``sems``: buffer name -> VMEM slots / DMA
        semaphores; ``expert_id(j)``: the expert routed slot j holds (a scalar)."""
        self.hbm, self.buffers, self.sems, self.expert_id = hbm, buffers, sems, expert_id

    def copy(self, ld: Load):
        src = self.hbm[ld.tensor]
        if ld.index is not None:  # the layer's place in a stacked tensor (traced in a loop over layers)
            src = src.at[ld.index]
        if ld.expert is not None:
            src = src.at[self.expert_id(ld.expert)]
        # offsets and slot may be traced (a loop over tiles)
        src = src.at[pl.ds(ld.rows[0], ld.rows[1]), pl.ds(ld.cols[0], ld.cols[1])]
        dst = self.buffers[ld.buffer].at[ld.slot, pl.ds(0, ld.rows[1]), pl.ds(0, ld.cols[1])]
        return pltpu.make_async_copy(src, dst, self.sems[ld.buffer].at[ld.slot])

    def tile(self, ld: Load):
        """The tile ``ld`` brought in, as a value (its slot may be larger than the tile)."""
        return self.buffers[ld.buffer][ld.slot, : ld.rows[1], : ld.cols[1]]
