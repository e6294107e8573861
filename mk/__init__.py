"""mk: a research workbook on decode megakernels for Gemma 4."""

from .tpu import quiet_libtpu as _quiet_libtpu

__version__ = "0.1.0"

# Before anything loads libtpu: on a machine without a TPU, keep its start-up warnings off stderr.
_quiet_libtpu()
