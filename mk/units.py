"""What every layer of mk shares about sizes: the TPU's lane width, rounding up to a multiple, the one
check that a count is a positive integer (the error every entry point gives), numbers to the significant figures
a table keeps, and seconds shown as milliseconds."""

from __future__ import annotations

import math
import numbers

LANE = 128  # lanes of a TPU vector register: the last axis of every VMEM tile
MIB = 2**20
BLOCK = 16  # rows a DMA moves at a dynamic offset: one bf16 sublane tile (embedding rows, new K/V, cache positions)


def ceil_div(n: int, m: int) -> int:
    return -(-n // m)


def round_up(n: int, m: int) -> int:
    """``n`` rounded up to a multiple of ``m``."""
    return ceil_div(n, m) * m


def positive_int(name: str, value) -> int:
    """``value`` as an int if it is a positive integer (numpy integers too, never a bool); else a ValueError
    naming ``name`` and what was given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


SIGNIFICANT = 4  # figures an exported table's floats keep, and every number computed from one


def significant(x: float, figures: int = SIGNIFICANT) -> float:
    """``x`` rounded to ``figures`` significant figures (0.000123456 -> 0.0001235: never to 0; NaN and 0 kept)."""
    return x if not math.isfinite(x) or x == 0 else float(f"{x:.{figures}g}")


def ms_entry(key: str, value):
    """A seconds entry (``*_s``) as milliseconds (``*_ms``), anything else as it is: (key, value)."""
    return (key[:-2] + "_ms", value * 1e3) if key.endswith("_s") else (key, value)
