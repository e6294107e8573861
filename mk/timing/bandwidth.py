"""The HBM read rate the timing model charges a chip: the chip's own measured limit where one of its kind was measured
(mk.chips.measured_limit: data/measured/tpu_hbm.csv), else its data sheet's bandwidth times a stated, sourced fraction
(data/timing.csv's ``hbm_read_fraction``: a published figure for the chip where one exists, else the fraction measured
on the one chip measured here, assumed). Never the data sheet itself: no chip reads its HBM at 100% of its spec (a
v5e measured 91.3% here; TPU7x's own benchmark levels off near 87%). The speed of light stays the data sheet's
(mk.sol): it is the write-up's definition, and every fraction of it says which bandwidth it is a fraction of."""

from __future__ import annotations

from dataclasses import dataclass

from ..chips import Chip, measured_copy_latency, measured_limit
from .constants import chip_constant

MEASURED_CHIP = "tpu-v5e"  # the chip whose measured fraction of its spec stands in for chips with none of their own


@dataclass(frozen=True)
class ReadRate:
    """``per_chip`` bytes/s one chip reads its HBM at, ``kind`` measured, published or assumed, and where from."""

    per_chip: float
    fraction_of_spec: float
    kind: str
    source: str

    @property
    def label(self) -> str:
        share = f"{self.fraction_of_spec:.1%} of its spec"
        # a measured source says so itself ("measured on ..."): its kind is not written twice
        where = self.source if self.source.startswith(self.kind) else f"{self.kind}: {self.source}"
        return f"{self.per_chip / 1e9:.4g} GB/s a chip, {share} ({where})"


def read_rate(chip: Chip) -> ReadRate:
    """The HBM read rate one chip of ``chip`` (a chip or slice) is charged at (the module's docstring)."""
    spec = chip.per_chip_bandwidth
    limit = measured_limit(chip.base)
    if limit is not None:
        return ReadRate(limit.bandwidth, limit.bandwidth / spec, "measured", limit.source)
    c = chip_constant("hbm_read_fraction", chip)
    if c.value is not None:
        return ReadRate(spec * c.value, c.value, c.kind, c.source)
    measured = measured_limit(MEASURED_CHIP)
    if measured is None:
        raise ValueError(
            f"{chip.name}: no measured HBM read rate of {MEASURED_CHIP} to assume its fraction of the spec from "
            "(data/measured/tpu_hbm.csv, python -m mk tpu-measure --parts hbm on a TPU); give the chip a "
            "hbm_read_fraction row in data/timing.csv"
        )
    f = measured.fraction_of_spec
    return ReadRate(spec * f, f, "assumed", f"{c.source}: {measured.source}")


@dataclass(frozen=True)
class Latency:
    """``seconds`` a weight copy takes before its first byte where nothing else is in flight, ``kind`` measured or
    assumed, and where from."""

    seconds: float
    kind: str
    source: str

    @property
    def label(self) -> str:
        return f"{self.seconds * 1e6:.3g} us a copy ({self.kind}: {self.source})"


def copy_latency(chip: Chip) -> Latency:
    """The time a copy takes before its first byte on ``chip``: measured on one such chip
    (mk.chips.measured_copy_latency) where it was, else data/timing.csv's ``dma_latency_s`` (assumed)."""
    m = measured_copy_latency(chip.base)
    if m is not None:
        return Latency(m.seconds, "measured", f"one copy alone at {m.sizes} sizes on {m.device}, {m.date[:10]} "
                       "(data/measured/tpu_dma.csv)")  # fmt: skip
    c = chip_constant("dma_latency_s", chip)
    return Latency(c.value, c.kind, c.source)
