"""The in-kernel all-reduce's topology, pure Python: which peer each chip sends to, and the bytes it moves (its
switches: mk.kernel_setup.Collective). The kernel's code for it is mk.megakernel.collective.

Two algorithms over C chips, both with direct remote DMAs (a TPU slice's ICI routes any chip to any):

- all to all (default): every chip sends its whole partial sum [rows, width] to every other chip, then
  each sums the C partials in chip order: one round, (C - 1) x payload sent per chip;
- reduce-scatter then all-gather: the payload's lanes are cut in C chunks; chip j sums chunk j of every
  chip's partial and sends the sum back to all: two rounds, 2 (C - 1) / C x payload sent per chip.

Every chip sums in the same (chip) order, so all chips hold bit-identical activations after it.
"""

from __future__ import annotations

from ..kernel_setup import Collective
from ..units import LANE, ceil_div, round_up


def peers(chip: int, chips: int) -> list[int]:
    """The chips ``chip`` sends to, in order: the next one round the ring first (every chip's d-th send
    goes to a different chip, so no chip receives two at once)."""
    return [(chip + d) % chips for d in range(1, chips)]


def chunk_width(width: int, chips: int) -> int:
    """Lanes of one reduce-scatter chunk: ``width`` cut in ``chips`` equal whole-lane chunks (padded)."""
    return round_up(ceil_div(width, chips), LANE)


def sent_bytes(collective: Collective, rows: int, width: int, chips: int, itemsize: int | None = None) -> int:
    """Bytes one chip sends for one all-reduce of a [rows, width] partial sum."""
    if chips == 1:
        return 0
    itemsize = itemsize or collective.payload_itemsize()
    if collective.reduce_scatter:
        return 2 * (chips - 1) * rows * chunk_width(width, chips) * itemsize
    return (chips - 1) * rows * width * itemsize
