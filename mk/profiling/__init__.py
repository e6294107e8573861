"""Instruments for a decode step that know no model (timing them is mk.measure's):

- ``stats``: medians with distribution-free confidence intervals (``Estimate``, ``median_interval``);
- ``hlo``: reading optimised HLO text (``parse_hlo``);
- ``kernels``: kernels per step in the compiled program, and what counts as a kernel (``count_kernels``);
- ``trace``: kernels per step in a profiler trace of the running program (``trace_kernels``), and on an accelerator
  the device's time a step, op by op too (``device_profile``);
- ``eager``: primitives dispatched one by one without ``jit`` (``count_eager_ops``);
- ``bandwidth``: the memory bandwidth probes and the fraction of the speed of light (``probe_calls``,
  ``gemv_probe``, ``fraction_of_sol``), the device's name.
"""

from .bandwidth import (
    DEFAULT_PROBE_BYTES,
    cache_tiles_call,
    device_name,
    dma_stream_call,
    fraction_of_sol,
    gemv_probe,
    probe_calls,
)
from .eager import count_eager_ops
from .hlo import parse_hlo
from .kernels import (
    COLLECTIVE,
    CUSTOM_CALL,
    FUSION,
    KERNEL_KINDS,
    OTHER,
    KernelCount,
    compile_text,
    compiled_kernels,
    count_kernels,
)
from .stats import Estimate, median_interval
from .trace import DeviceProfile, device_profile, modules_seconds, op_summary, ops_seconds, trace_kernels

__all__ = [
    "Estimate",
    "median_interval",
    "parse_hlo",
    "FUSION",
    "CUSTOM_CALL",
    "COLLECTIVE",
    "OTHER",
    "KERNEL_KINDS",
    "KernelCount",
    "count_kernels",
    "compile_text",
    "compiled_kernels",
    "trace_kernels",
    "DeviceProfile",
    "device_profile",
    "op_summary",
    "ops_seconds",
    "modules_seconds",
    "count_eager_ops",
    "DEFAULT_PROBE_BYTES",
    "gemv_probe",
    "probe_calls",
    "dma_stream_call",
    "cache_tiles_call",
    "device_name",
    "fraction_of_sol",
]
