"""The chip's own limit: how fast it reads its HBM, measured by several methods at several sizes, so a decode step is
set against what the chip can do as well as against its data sheet.

- **Methods**: a decode-shaped matrix-vector product in XLA (bf16 weights [rows, 4096] times a vector: what a general
  stack's weight reads compile to), and a Pallas kernel streaming the array through VMEM with copies in flight (as the
  megakernel streams its weights: mk.profiling.bandwidth.dma_stream_call), at a few chunk sizes and depths.
- **Sizes**: 0.25 to 8 GiB (the DMA stream at the sizes that fit beside nothing else), one array at a time, freed
  before the next.
- **Times**: each probe timed alone in mk.measure.loop's one loop, a call waited on (the host's time) interleaved with
  ``steps`` calls dispatched back to back and waited on once (the device's), medians with 95% intervals.
- **Further probes** (:func:`further_probes`): larger reads, several regions streamed at once, and the KV cache read
  in the megakernel's own tiles, each a method of its own, so the limit is the best any of them reached.
- **The limit**: the best sustained read rate, the largest device-time median over every method and size of at least
  1 GiB (mk.chips.measured_limit), kept with its method, size and date: a measurement, not a fitted constant.

Rows go to data/measured/tpu_hbm.csv (mk.paths.TPU_HBM_CSV) with mk.measure.harness's provenance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..chips import GIB, get_chip, known_chip
from ..files import append_csv_rows
from ..paths import TPU_HBM_CSV
from ..profiling import Estimate, cache_tiles_call, dma_stream_call, probe_calls
from ..progress import Log
from .harness import PROVENANCE, provenance, release_device_memory
from .loop import back_to_back, interleaved

SIZES = (GIB // 4, GIB // 2, GIB, 2 * GIB, 4 * GIB, 8 * GIB)
# (chunk bytes, copies in flight) of the DMA stream: the megakernel's weight tiles are 1-4 MiB, two to four deep
DMA_STREAMS = ((2**20, 2), (4 * 2**20, 2), (4 * 2**20, 4), (8 * 2**20, 4))
DMA_SIZES = (GIB, 4 * GIB)
STEPS = 10
COLUMNS = PROVENANCE + (
    "method",
    "bytes",
    "chunk_bytes",
    "in_flight",
    "rounds",
    "steps_back_to_back",
    "host_GBps",
    "device_GBps",
    "device_low_GBps",
    "device_high_GBps",
    "spec_GBps",
    "device_fraction_of_spec",
)


# Further probes before the best of these is called the limit: larger reads (a call's fixed cost shrinks beside them),
# several far-apart regions streamed at once, and the KV cache read as the megakernel's attention reads it (K and V
# tiles of 8 head groups x 512 positions x 128 lanes, two deep). Each its own method, so tpu_hbm.csv's columns stay.
LARGER = (12 * GIB,)
REGIONS = 4
CACHE_TILES = (8, 512)  # head groups, positions a tile (the kernel's KV tiles of a Qwen3 8B or a Llama 3)


CACHE = "pallas cache tiles"
# What a tile's size costs the stream alone: the megakernel read Qwen3's head in 0.5 MiB tiles before kernel revision 5,
# and the 26B-A4B stand-in's expert tiles are 0.47 MiB (each expert split over 8 chips); both read past their bytes.
TILE_SIZES = (2**18, 2**19, 2**20)


@dataclass(frozen=True)
class Probe:
    """One way to read ``nbytes``: ``method`` "xla matvec", "pallas dma stream" (with its chunk and depth, from
    ``regions`` far-apart regions at once) or :data:`CACHE` (the KV cache in :data:`CACHE_TILES`' tiles)."""

    method: str
    nbytes: int
    chunk_bytes: int = 0
    in_flight: int = 0
    regions: int = 1

    @property
    def label(self) -> str:
        """The method as tpu_hbm.csv's ``method`` column names it, its regions or its tiles said."""
        if self.method == CACHE:
            return f"{CACHE} ({CACHE_TILES[0]} groups x {CACHE_TILES[1]} positions)"
        return self.method + (f", {self.regions} regions" if self.regions > 1 else "")

    def call(self, device, interpret=None):
        if self.method == "pallas dma stream":
            return dma_stream_call(self.nbytes, self.chunk_bytes, self.in_flight, device, interpret, self.regions)
        if self.method == CACHE:
            groups, tile = CACHE_TILES
            return cache_tiles_call(self.nbytes, groups, tile, self.in_flight, device, interpret)
        import jax.numpy as jnp

        calls, size = probe_calls(self.nbytes, jnp.bfloat16, device)
        return calls["matvec"], size


def probes(sizes=SIZES, dma_sizes=DMA_SIZES, streams=DMA_STREAMS) -> list[Probe]:
    """The matrix-vector product at every size, the DMA stream at ``dma_sizes`` for each (chunk, depth)."""
    out = [Probe("xla matvec", n) for n in sizes]
    return out + [Probe("pallas dma stream", n, c, d) for n in dma_sizes for c, d in streams]


def further_probes(larger=LARGER) -> list[Probe]:
    """:data:`LARGER` reads by each method (the DMA stream at 4 MiB x 4, the megakernel's tiles), at 8 GiB and
    :data:`LARGER` the stream in :data:`REGIONS` regions at once, and the cache read in the kernel's tiles (8 GiB and
    :data:`LARGER`): what a probe must beat before the best of :func:`probes` is called the limit."""
    groups, tile = CACHE_TILES
    out = [Probe("xla matvec", n) for n in larger]
    out += [Probe("pallas dma stream", n, 4 * 2**20, 4) for n in (8 * GIB, *larger)]
    out += [Probe("pallas dma stream", n, 4 * 2**20, 4, REGIONS) for n in (8 * GIB, *larger)]
    return out + [Probe(CACHE, n, groups * tile * 128 * 2, 2) for n in (8 * GIB, *larger)]


def tile_size_probes(nbytes: int = 4 * GIB, chunks=TILE_SIZES, depths=(2, 4)) -> list[Probe]:
    """The DMA stream of ``nbytes`` in each of ``chunks`` (bytes a copy) at each of ``depths`` (copies in flight): the
    read rate of tiles as small as the kernel's smallest, beside :func:`probes`' 1-8 MiB (python -m mk tpu-measure
    --parts hbm runs :func:`probes` and :func:`further_probes`; these are asked for by name, mk.measure.tpu_runs.run's
    ``hbm_probes``)."""
    return [Probe("pallas dma stream", nbytes, c, d) for c in chunks for d in depths]


def probe_read_rate(
    device=None,
    chosen: list[Probe] | None = None,
    steps: int = STEPS,
    budget_s: float = 5.0,
    spec_bandwidth: float | None = None,
    interpret=None,
    out: Path | str | None = TPU_HBM_CSV,
    quiet: bool = False,
) -> pd.DataFrame:
    """Time each probe of ``chosen`` (default :func:`probes` and :func:`further_probes`) on ``device``: host and
    device read rates, each against ``spec_bandwidth`` (bytes/s; the device's data sheet where known); rows appended to
    ``out`` (None: none)."""
    import jax

    device = device or jax.devices()[0]
    chip = known_chip(device)
    spec = spec_bandwidth or (get_chip(chip).hbm_bandwidth if chip else None)
    log, prov, rows = Log(quiet), provenance(device), []
    for p in chosen or probes() + further_probes():
        call, size = p.call(device, interpret)
        cmp = interleaved(
            {"host": call, "device": back_to_back(call, steps)}, "host", budget_s=budget_s, min_rounds=5, warmup=1
        )
        dev = Estimate.of([size * steps / t for t in cmp.raw["device"]], cmp.confidence)
        host = size / cmp.times["host"].median
        rows.append(
            dict(
                prov,
                method=p.label,
                bytes=size,
                chunk_bytes=p.chunk_bytes or None,
                in_flight=p.in_flight or None,
                rounds=cmp.rounds,
                steps_back_to_back=steps,
                host_GBps=round(host / 1e9, 2),
                device_GBps=round(dev.median / 1e9, 2),
                device_low_GBps=round(dev.low / 1e9, 2),
                device_high_GBps=round(dev.high / 1e9, 2),
                spec_GBps=None if spec is None else round(spec / 1e9, 1),
                device_fraction_of_spec=None if spec is None else round(dev.median / spec, 4),
            )
        )
        how = f" ({p.chunk_bytes / 2**20:g} MiB x {p.in_flight})" if p.in_flight else ""
        log(
            f"{p.label} {size / GIB:.2f} GiB{how}: device {dev.median / 1e9:.1f} GB/s "
            f"({dev.low / 1e9:.1f}-{dev.high / 1e9:.1f}), host {host / 1e9:.1f}"
        )
        del call
        release_device_memory(device)
    if out is not None and rows:
        append_csv_rows(rows, Path(out), COLUMNS, "an HBM read-rate row")
    return pd.DataFrame(rows, columns=COLUMNS)
