"""Measuring a decode step, so a step time can be set against this device's own measured limit.

- ``compare``: the measurement method: variants interleaved in one run, medians with confidence
  intervals, differences from a baseline that say when they are noise (``interleaved``);
- ``hlo``: reading optimised HLO text (``parse_hlo``);
- ``kernels``: kernels per step in the compiled program, and what counts as a kernel (``count_kernels``);
- ``trace``: kernels per step in a profiler trace of the running program (``trace_kernels``);
- ``eager``: primitives dispatched one by one without ``jit`` (``count_eager_ops``);
- ``knockouts``: the step timed with each component switched off (``knockout_table``);
- ``bandwidth``: the memory bandwidth probes and the fraction of the speed of light (``probe_table``,
  ``gemv_probe``, ``sol_fraction``).
"""

from .bandwidth import (
    DEFAULT_PROBE_BYTES,
    device_name,
    gemv_probe,
    probe_table,
    sol_fraction,
)
from .compare import Comparison, Estimate, interleaved, median_interval
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
from .knockouts import knockout_table, with_seed_columns
from .trace import trace_kernels

__all__ = [
    "Comparison",
    "Estimate",
    "interleaved",
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
    "count_eager_ops",
    "knockout_table",
    "with_seed_columns",
    "DEFAULT_PROBE_BYTES",
    "gemv_probe",
    "probe_table",
    "device_name",
    "sol_fraction",
]
