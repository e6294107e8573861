"""The step plan: one decode step described once, as data, read by the megakernel, the tests and the
timing model.

- ``records``: tile sizes, VMEM buffers, weight-tile DMAs and one record per kind of compute op;
- ``layout``: the kernel's padded, layer-stacked HBM layout, the vector table, KV tiles, layers that fit one chip;
- ``builder``: the loads and ops of a step in order;
- ``schedule``: when each DMA starts and is waited for; the regular runs (tiles, layers) the kernel loops over;
- ``step``: ``StepPlan`` and ``build_plan``;
- ``vmem``: the VMEM budget; ``timeline``: a modelled timeline on one chip.
"""

from ..units import LANE, MIB, round_up
from .layout import (
    BLOCK,
    ROWS,
    cache_slots,
    head_lanes,
    kv_tile,
    layers_in_hbm,
    layout_config,
    padded_shape,
    stacked,
    type_index,
    vector_rows,
    vector_stride,
    vector_table_shape,
)
from .records import (
    OP_KINDS,
    AllReduce,
    Attend,
    AttentionResidual,
    Buffer,
    Embed,
    EmitTokens,
    ExpertCombine,
    FfnResidual,
    GatedAct,
    GatherBest,
    HeadTile,
    LayerLoop,
    Load,
    Loop,
    MatmulMode,
    MatmulTile,
    NoHead,
    Norm,
    Op,
    Prologue,
    QKVNormRope,
    Route,
    Start,
    Tiles,
    Wait,
)
from .schedule import fold, groups, start_runs
from .step import StepPlan, build_plan
from .timeline import memory_busy_fraction, step_end, timeline

__all__ = [
    "BLOCK",
    "LANE",
    "MIB",
    "ROWS",
    "OP_KINDS",
    "AllReduce",
    "Attend",
    "AttentionResidual",
    "Buffer",
    "Embed",
    "EmitTokens",
    "ExpertCombine",
    "FfnResidual",
    "GatherBest",
    "GatedAct",
    "HeadTile",
    "LayerLoop",
    "Load",
    "Loop",
    "MatmulMode",
    "MatmulTile",
    "NoHead",
    "Norm",
    "Op",
    "Prologue",
    "QKVNormRope",
    "Route",
    "Start",
    "StepPlan",
    "Tiles",
    "Wait",
    "build_plan",
    "cache_slots",
    "fold",
    "groups",
    "head_lanes",
    "kv_tile",
    "layout_config",
    "layers_in_hbm",
    "memory_busy_fraction",
    "padded_shape",
    "round_up",
    "stacked",
    "start_runs",
    "step_end",
    "timeline",
    "type_index",
    "vector_rows",
    "vector_stride",
    "vector_table_shape",
]
