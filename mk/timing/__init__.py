"""Predicted decode-step time on a chip or a slice, from the step plans (mk.plan), for two engines: the one
path in mk from a step plan to seconds.

- **megakernel** (``pace``): one kernel per step, set up as a mk.kernel_setup.KernelSetup says. Each chip follows
  its own plan: weight tiles stream at the chip's HBM read rate (``bandwidth``: its measured limit where one was
  measured, else a sourced fraction of its data sheet) while compute runs behind them (mk.plan.timeline),
  matrix work at the chip's FLOP/s with rows padded to what its matrix unit takes at once, all-reduces over one link
  at the ICI bandwidth plus a per-hop latency, and the step waits for the chip that sets the pace (the busiest chip
  under whole experts, exact under uniform routing).
- **general** (``general_stack``): the general stack, the same work split into many kernels: each kernel reads its
  bytes at the same read rate or does its matrix work, whichever is longer, with nothing in flight across kernel
  boundaries, plus a fixed cost per kernel.

Every constant comes from ``data/timing.csv`` (``constants``) or ``data/chips.csv``, each row naming its source and
its kind: ``cited`` (a public source), ``published`` (the write-up's own numbers), ``fitted`` (solved at run time so
the model meets one published number: the general stack's per-kernel cost, once for GPUs and once for TPUs, and the
megakernel's per-op cost on GPUs, fitted to one published GPU megakernel step (``fitted``); the published numbers they
are fitted to are not tests of the model) or ``assumed`` (a cost nothing public gives: the megakernel's per-DMA-issue
cost, and its per-op cost on TPUs, one default for the whole workbook; every notebook that shows a modelled megakernel
step shows them as a sensitivity too). ``work`` holds one chip's work as charged; ``predict`` puts it together.

Data types: the plan is built in BF16 (F32 for ``f32``); INT8 (``int8-experts``, ``int8``) is the plan's own
(mk.quant: the kernel streams the codes and their scales); FP8, which no kernel here streams, scales each weight
tile's bytes by its component's bytes per element (mk.dtypes.DTYPES).
"""

from .bandwidth import ReadRate, read_rate
from .constants import ASSUMED, MODELLED, assumed_costs, assumed_label, chip_constant, constant, constants
from .fitted import fitted_value, implied_op_cost, op_overhead_cost
from .general_stack import GENERAL_STACK, kernel_cost, kernels_per_plan_kernel, plan_kernels
from .pace import megakernel_costs, pace, pace_timeline, scheduled_pace
from .predict import DEFAULT_COSTS, ENGINES, GivenCosts, Prediction, drafter_seconds, predict, step_breakdown
from .scheduled import op_costs_label
from .work import compute_seconds, link_latency, load_bytes, named_plan, step_plan

__all__ = [
    "ASSUMED",
    "DEFAULT_COSTS",
    "ENGINES",
    "GENERAL_STACK",
    "GivenCosts",
    "MODELLED",
    "Prediction",
    "ReadRate",
    "assumed_costs",
    "assumed_label",
    "chip_constant",
    "compute_seconds",
    "constant",
    "constants",
    "drafter_seconds",
    "fitted_value",
    "implied_op_cost",
    "kernel_cost",
    "kernels_per_plan_kernel",
    "link_latency",
    "load_bytes",
    "megakernel_costs",
    "named_plan",
    "op_costs_label",
    "op_overhead_cost",
    "pace",
    "pace_timeline",
    "plan_kernels",
    "predict",
    "read_rate",
    "scheduled_pace",
    "step_breakdown",
    "step_plan",
]
