"""Chip and slice specs, read from ``data/chips.csv`` (every row names its source).

A slice is a base chip name with ``-N`` appended (``tpu-v5e-8``): N chips whose HBM, bandwidth
and FLOP/s add up. Interconnect bandwidth stays per link. ``data/slices.csv`` lists the slice shapes a TPU is
documented to come in (its torus dimensions, which of them wrap around, and hosts): :func:`slice_shapes`;
:func:`slice_shape` finds a slice's own.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .paths import CHIPS_CSV, SLICES_CSV, TPU_CLOCK_CSV, TPU_DMA_CSV, TPU_HBM_CSV
from .tpu import DEVICE_KINDS


@dataclass(frozen=True)
class Chip:
    """One chip, or a slice of ``chips`` identical chips."""

    name: str
    kind: str
    chips: int
    hbm_bytes: float
    hbm_bandwidth: float  # bytes/s, all chips together
    bf16_flops: float  # FLOP/s, all chips together
    ici_bandwidth: float  # bytes/s one way per link (NaN where unknown)
    vmem_bytes: float  # per core (NaN where not checked)
    source: str
    clock_hz: float = math.nan  # one core's clock (NaN where data/chips.csv derives none)
    clock_source: str = ""
    # the devices JAX sees in one chip (TPU v7x: two TensorCores, each its own device; libtpu's tpu7x topologies)
    devices_per_chip: int = 1
    # what a slice's name counts per chip: 1 (chips: v5e, v6e, GPUs) or 2 (TensorCores: v4 and v5p, as Google's
    # AcceleratorType names them: a v5p-32 is 16 chips)
    name_units_per_chip: int = 1

    @property
    def base(self) -> str:
        return self.name if self.chips == 1 else self.name.rsplit("-", 1)[0]

    @property
    def per_chip_bandwidth(self) -> float:
        return self.hbm_bandwidth / self.chips


def _float(s: str) -> float:
    return float(s) if s.strip() else math.nan


@lru_cache(maxsize=None)
def base_chips() -> dict[str, Chip]:
    with open(CHIPS_CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        r["name"]: Chip(
            name=r["name"],
            kind=r["kind"],
            chips=1,
            hbm_bytes=float(r["hbm_bytes"]),
            hbm_bandwidth=float(r["hbm_bandwidth_Bps"]),
            bf16_flops=float(r["bf16_flops"]),
            ici_bandwidth=_float(r["ici_bandwidth_Bps"]),
            vmem_bytes=_float(r["vmem_bytes"]),
            source=r["source"],
            clock_hz=_float(r["clock_hz"]),
            clock_source=r["clock_source"],
            devices_per_chip=int(r["devices_per_chip"]),
            name_units_per_chip=int(r["name_units_per_chip"]),
        )
        for r in rows
    }


def known_chips() -> list[str]:
    return list(base_chips())


def known_chip(device) -> str | None:
    """The chip of data/chips.csv a JAX device is (``NVIDIA H200`` -> ``h200``, a TPU's ``TPU v5 lite`` ->
    ``tpu-v5e``: mk.tpu.DEVICE_KINDS), or None."""
    if device.platform == "tpu":
        return DEVICE_KINDS.get(device.device_kind)
    kind = device.device_kind.lower().replace(" ", "")
    hits = [n for n, c in base_chips().items() if c.kind == device.platform and n.replace("-", "") in kind]
    return max(hits, key=len) if hits else None


def compile_target(device) -> str | None:
    """The chip Mosaic compiles a kernel for on ``device`` (its data/chips.csv name: ``tpu-v5e``), or None off a TPU,
    where the kernel runs in the interpreter. The engine's one way to its chip (an ahead-of-time compile names its
    own); a TPU generation data/chips.csv lacks is refused, as its VMEM limit is unknown, and so is a chip of several
    devices (:func:`check_one_device`: TPU v7x, whose device is one of its two TensorCores)."""
    if device.platform != "tpu":
        return None
    chip = known_chip(device)
    if chip is None:
        raise ValueError(
            f"the megakernel has no VMEM budget for a {device.device_kind!r}: add its chip to data/chips.csv (VMEM "
            "from mk.tpu.probe_vmem) and its device kind to mk.tpu.DEVICE_KINDS"
        )
    check_one_device(get_chip(chip))
    return chip


def get_chip(name: str | Chip) -> Chip:
    """A chip (``h100``) or a slice by name (a Chip is returned as it is): ``tpu-v5e-8`` is 8 chips, and a v4 or v5p
    slice is named by its TensorCores as Google names it (``tpu-v5p-8``: 4 chips; the chip's ``name_units_per_chip``).
    An unknown name lists the known ones."""
    if isinstance(name, Chip):
        return name
    chips = base_chips()
    key = name.strip().lower()
    if key in chips:
        return chips[key]
    m = re.fullmatch(r"(.+)-(\d+)", key)
    if m and m.group(1) in chips and int(m.group(2)) > 0:
        c, units = chips[m.group(1)], int(m.group(2))
        if units % c.name_units_per_chip or units == c.name_units_per_chip:
            raise ValueError(
                f"{key}: a {c.name} slice is named by its TensorCores, {c.name_units_per_chip} a chip (Google's "
                f"AcceleratorType: v5p-32 is 16 chips); give a multiple of {c.name_units_per_chip} above it, or "
                f"{c.name} for one chip"
            )
        n = units // c.name_units_per_chip
        return Chip(
            name=key,
            kind=c.kind,
            chips=n,
            hbm_bytes=c.hbm_bytes * n,
            hbm_bandwidth=c.hbm_bandwidth * n,
            bf16_flops=c.bf16_flops * n,
            ici_bandwidth=c.ici_bandwidth,
            vmem_bytes=c.vmem_bytes,
            source=c.source,
            clock_hz=c.clock_hz,
            clock_source=c.clock_source,
            devices_per_chip=c.devices_per_chip,
            name_units_per_chip=c.name_units_per_chip,
        )
    raise ValueError(
        f"unknown chip {name!r}; known chips: {', '.join(chips)} (append -N for a slice of N chips, e.g. tpu-v5e-8; "
        "of N TensorCores for v4 and v5p, e.g. tpu-v5p-8: 4 chips)"
    )


def slice_of(base: str, chips: int) -> Chip:
    """The slice of ``chips`` chips of ``base`` (a chip of data/chips.csv), under the name its users know it by."""
    c = get_chip(base)
    return c if chips == 1 else get_chip(f"{c.name}-{chips * c.name_units_per_chip}")


def check_one_device(chip: Chip) -> Chip:
    """``chip`` where each of its chips is one device, as mk's megakernel runs one program a chip; refused by name
    otherwise (TPU v7x: two TensorCores a chip, each its own device, which the kernel does not yet run as neighbours),
    so that no step of it is modelled or compiled as if it were one. Its speed of light (mk.sol) needs no kernel."""
    if chip.devices_per_chip != 1:
        raise ValueError(
            f"{chip.name}: each {chip.base} chip is {chip.devices_per_chip} devices (TensorCores, data/chips.csv "
            "devices_per_chip) and mk's megakernel runs one program a chip, so its step is not modelled, compiled or "
            "run there; its speed of light is (python -m mk sol), and the general stack's"
        )
    return chip


@dataclass(frozen=True)
class SliceShape:
    """A slice shape a TPU is documented to come in: its torus (``topology``, ``4x4`` or ``4x4x8``), chips, hosts
    (a fraction where one host's chips are split into several slices), which of its dimensions have wraparound links
    (``wraparound``, one flag a dimension) and where each is documented."""

    chip: str  # the base chip (data/chips.csv)
    topology: str
    chips: int
    hosts: float
    source: str
    wraparound: tuple[bool, ...] = ()
    wraparound_source: str = ""

    @property
    def name(self) -> str:
        """The slice's name as mk.chips.get_chip takes it (``tpu-v5e-16``; ``tpu-v5p-16`` for 8 v5p chips)."""
        return slice_of(self.chip, self.chips).name

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.topology.split("x"))

    @property
    def topology_name(self) -> str:
        """The topology as libtpu names it (``v5e:4x4``: jax.experimental.topologies.get_topology_desc)."""
        return f"{self.chip.removeprefix('tpu-')}:{self.topology}"

    @property
    def chips_per_host(self) -> int:
        """Chips one host (TPU VM) drives: the slice's chips over its hosts (a part-host slice: the host's whole)."""
        return round(self.chips / self.hosts)

    @property
    def torus(self) -> tuple[tuple[int, bool], ...]:
        """Each dimension of the torus with 2 or more chips: (its chips, whether it wraps around)."""
        return tuple((d, w) for d, w in zip(self.dims, self.wraparound) if d > 1)


@lru_cache(maxsize=None)
def slice_shapes() -> dict[str, tuple[SliceShape, ...]]:
    """data/slices.csv by base chip, smallest slice first."""
    with open(SLICES_CSV, newline="") as f:
        rows = [
            SliceShape(
                r["chip"],
                r["topology"],
                int(r["chips"]),
                float(r["hosts"]),
                r["source"],
                tuple(w == "1" for w in r["wraparound"].split("x")),
                r["wraparound_source"],
            )  # fmt: skip
            for r in csv.DictReader(f)
        ]
    out: dict[str, list[SliceShape]] = {}
    for r in rows:
        if r.chip not in base_chips():
            raise ValueError(f"data/slices.csv names {r.chip!r}, which data/chips.csv does not have")
        if len(r.wraparound) != len(r.dims):
            raise ValueError(f"data/slices.csv: {r.chip} {r.topology} needs one wraparound flag a dimension")
        if math.prod(r.dims) != r.chips:
            raise ValueError(f"data/slices.csv: {r.chip} {r.topology} is {math.prod(r.dims)} chips, not {r.chips}")
        out.setdefault(r.chip, []).append(r)
    return {c: tuple(sorted(v, key=lambda r: r.chips)) for c, v in out.items()}


def slice_shape(chip: Chip) -> SliceShape | None:
    """The documented shape (data/slices.csv) of the slice ``chip`` (``tpu-v5e-256``: 16x16), or None where its base
    chip has no documented shape of that many chips."""
    return next((s for s in slice_shapes().get(chip.base, ()) if s.chips == chip.chips), None)


# A chip's measured HBM read rate -------------------------------------------------------------------------------------
GIB = 2**30
LIMIT_MIN_BYTES = GIB  # the limit is read from probes of at least this size (smaller ones pay a launch's share)


@dataclass(frozen=True)
class MeasuredLimit:
    """A chip's measured HBM read rate: ``bandwidth`` (bytes/s, one chip) by ``method`` over ``nbytes`` on ``date``,
    on ``device``, against its data sheet's ``spec`` (bytes/s)."""

    chip: str
    bandwidth: float
    method: str
    nbytes: int
    date: str
    device: str
    spec: float

    @property
    def fraction_of_spec(self) -> float:
        return self.bandwidth / self.spec

    @property
    def source(self) -> str:
        device = self.device.partition(": ")[2] or self.device  # "tpu: TPU v5 lite": the chip's own name
        return (
            f"measured on a {device}, {self.date[:10]}: best sustained HBM read, {self.method} over "
            f"{self.nbytes / GIB:.3g} GiB, steps back to back, {self.fraction_of_spec:.1%} of the "
            f"{self.spec / 1e9:.0f} GB/s spec (data/measured/tpu_hbm.csv)"
        )


# How the measured CSVs' ``device`` column names a TPU (mk.measure.harness.provenance), and the chip it is
_MEASURED_DEVICES = {f"tpu: {k}": c for k, c in DEVICE_KINDS.items()}


def _device_names(base: str) -> set[str]:
    """The ``device`` column's names of a chip of ``base``."""
    return {d for d, c in _MEASURED_DEVICES.items() if c == base}


def measured_chip(device: str) -> str | None:
    """The TPU chip of data/chips.csv a measured CSV's ``device`` column names (``tpu: TPU v5 lite`` -> ``tpu-v5e``),
    as :func:`known_chip` reads a JAX device (mk.tpu.DEVICE_KINDS): None for a device that is no TPU (a CPU's
    interpreted rows, a GPU's); a TPU whose kind DEVICE_KINDS lacks is refused (its rows are some chip's, not to be
    taken for another's)."""
    if not str(device).startswith("tpu:"):
        return None
    if device not in _MEASURED_DEVICES:
        raise ValueError(f"measured on {device!r}, a device mk.tpu.DEVICE_KINDS does not name; add its kind there")
    return _MEASURED_DEVICES[device]


def measured_limit(chip: str, path=TPU_HBM_CSV) -> MeasuredLimit | None:
    """``chip``'s (a chip or slice of data/chips.csv) best sustained HBM read rate measured on one such chip
    (mk.measure.hbm writes ``path``): the largest device-time median over every method and probe of at least 1 GiB;
    None where none was measured."""
    base = get_chip(chip).base
    path = Path(path)
    if not path.exists():
        return None
    devices = _device_names(base)
    with open(path, newline="") as f:
        rows = [
            r
            for r in csv.DictReader(f)
            if r["device"] in devices and int(r["chips"]) == 1 and int(r["bytes"]) >= LIMIT_MIN_BYTES
        ]
    if not rows:
        return None
    r = max(rows, key=lambda r: float(r["device_GBps"]))
    spec = base_chips()[base].hbm_bandwidth
    return MeasuredLimit(
        base, float(r["device_GBps"]) * 1e9, r["method"], int(r["bytes"]), r["date"], r["device"], spec
    )


@dataclass(frozen=True)
class CopyLatency:
    """One copy's fixed time on a chip: the intercept of one copy's time alone against its size (mk.measure.dma_latency,
    the newest run), with the rate one copy alone reaches (the slope), where and when it was measured; and the fixed
    time of the Pallas call that made them (``call_seconds``): each call's device time less its copies', the median
    over the run's sizes."""

    seconds: float
    copy_rate: float  # bytes/s of one copy alone, past its fixed time
    sizes: int
    date: str
    device: str
    call_seconds: float = 0.0


def measured_copy_latency(chip: str, path=TPU_DMA_CSV) -> CopyLatency | None:
    """``chip``'s (a chip or slice of data/chips.csv) fixed time a copy from HBM takes where nothing else is in flight,
    from the newest run of mk.measure.dma_latency on one such chip (at least two sizes): a least-squares line of one
    copy's time against its bytes, its intercept (never below 0); None where none was measured."""
    path = Path(path)
    if not path.exists():
        return None
    devices = _device_names(get_chip(chip).base)
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["device"] in devices]  # each copy timed on one chip
    if not rows:
        return None
    newest = max(r["date"] for r in rows)
    run = [r for r in rows if r["date"] == newest]
    by_size = {int(r["nbytes"]): float(r["copy_us"]) * 1e-6 for r in run}
    if len(by_size) < 2:
        return None
    call = statistics.median(float(r["device_us"]) * 1e-6 - int(r["trips"]) * float(r["copy_us"]) * 1e-6 for r in run)
    x, y = list(by_size), list(by_size.values())
    mx, my = sum(x) / len(x), sum(y) / len(y)
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
    return CopyLatency(max(0.0, my - slope * mx), 1 / slope, len(by_size), newest, run[0]["device"], max(0.0, call))


# A core's measured issue rate ----------------------------------------------------------------------------------------
ISSUE_BOUND = 0.9  # the share of a call its trips must take for its device time to measure their issue


def trips_share(lo, hi) -> float:
    """The share of the longer call (``hi``) its trips take, from two calls of a clock check's kernel at
    ``lo`` and ``hi`` trips (rows of tpu_clock.csv): near 1 the kernel is issue-bound and gives a clock; far below,
    the call's fixed cost (its dispatch) hides the trips and their difference is noise."""
    lo_us, hi_us, lo_n, hi_n = (float(x) for x in (lo["device_us"], hi["device_us"], lo["trips"], hi["trips"]))
    return (hi_us - lo_us) / hi_us * hi_n / (hi_n - lo_n)


@lru_cache(maxsize=None)
def measured_issue_rates(chip: str, path=TPU_CLOCK_CSV) -> dict[str, float]:
    """``chip``'s (a chip or slice of data/chips.csv) scheduled bundles issued a second, measured on one such chip,
    by kind of work (mk.measure.chip_clock: a chain of that work resident in VMEM, the device time of its trips
    against the compiler's bundles for them): each kind's newest run whose trips dominate its call
    (:data:`ISSUE_BOUND`); {} where none was measured."""
    base, path = get_chip(chip).base, Path(path)
    if not path.exists():
        return {}
    devices = _device_names(base)
    runs: dict[tuple, list] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["device"] in devices:
                runs.setdefault((r["date"], r["kind"]), []).append(r)
    rates = {}
    for (_, kind), rows in sorted(runs.items()):
        lo, hi = min(rows, key=lambda r: int(r["trips"])), max(rows, key=lambda r: int(r["trips"]))
        if trips_share(lo, hi) > ISSUE_BOUND:
            rates[kind] = float(hi["clock_GHz"]) * 1e9
    return rates
