"""One DMA alone, timed on the chip (``python -m mk tpu-measure --parts dma``): how long a copy from HBM into VMEM takes
from its start to its wait's return when nothing else is in flight, by size.

The timing model charges a weight tile its bytes at the chip's read rate and nothing for the time between a copy's
start and its first byte: a copy issued while others are moving is hidden behind them, but one issued when the stream
has run dry (or read while the core waits: a user's first KV tile, the route's ids) costs that time too. A step
whose MoE layers read past their bytes (notebook 12) has such moments every layer. :func:`round_trip_kernel` issues
``trips`` copies of ``nbytes`` one after another, each waited on before the next starts, alternating between two
regions of its HBM input; two trip counts, timed interleaved (``STEPS_BACK_TO_BACK`` calls back to back, waited on
once), give one copy's time as their times' difference over their trips' (the call's fixed costs cancel). Over sizes,
a copy's time is a latency plus its bytes at the rate one copy alone reaches. Rows go to data/measured/tpu_dma.csv."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import pandas as pd

from ..files import append_csv_rows
from ..progress import Log
from ..tpu import interpret_params
from .harness import CHIP_PROVENANCE, chip_provenance
from .loop import back_to_back, interleaved
from .steps import traced_digest

LANES = 128  # bf16 rows of one lane tile: a copy of n bytes is n / 256 rows
SIZES = (2**12, 2**16, 2**19, 2**22)  # 4 KiB (a serial read's size) to 4 MiB (a weight tile's)
TRIPS = (200, 2_000)
STEPS_BACK_TO_BACK = 10
COLUMNS = (*CHIP_PROVENANCE, "program_digest", "nbytes", "trips", "steps_back_to_back", "rounds", "device_us",
           "device_low_us", "device_high_us", "copy_us", "copy_low_us", "copy_high_us", "copy_GBps")  # fmt: skip


def _rows(nbytes: int) -> int:
    rows = nbytes // (2 * LANES)
    if rows < 16 or rows % 16 or rows * 2 * LANES != nbytes:
        raise ValueError(f"a copy of {nbytes} bytes is not whole (16, 128) bf16 tiles: give a multiple of 4 KiB")
    return rows


def round_trip_kernel(nbytes: int, trips: int, interpret: bool = False):
    """A Pallas kernel of ``x [2 * rows, 128] bf16`` (HBM) -> ``[16, 128] f32``: ``trips`` copies of ``nbytes`` into one
    VMEM buffer, each started after the last one's wait, from the two halves of ``x`` in turn, each copy's first tile
    summed so no copy can be dropped; ``interpret``: in Pallas TPU interpret mode (a CPU's check of its values)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    rows = _rows(nbytes)
    if trips < 1:
        raise ValueError(f"trips must be positive, got {trips}")

    def kernel(x_hbm, o_ref, buf, sem):
        def body(i, acc):
            copy = pltpu.make_async_copy(x_hbm.at[pl.ds(pl.multiple_of(i % 2 * rows, 16), rows)], buf, sem.at[0])
            copy.start()
            copy.wait()
            return acc + buf[0:16, :].astype(jnp.float32)

        o_ref[...] = jax.lax.fori_loop(0, trips, body, jnp.zeros((16, LANES), jnp.float32))

    params = dict(interpret=interpret_params()) if interpret else {}
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((16, LANES), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
        scratch_shapes=[pltpu.VMEM((rows, LANES), jnp.bfloat16), pltpu.SemaphoreType.DMA((1,))],
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=nbytes + 8 * 2**20),
        name=f"dma_round_trip_{nbytes}_{trips}",
        **params,
    )


def per_copy_us(per_s) -> list[float]:
    """One copy's time in us (low, median, high) from copies a second (``per_s``: low, median, high). Where two trip
    counts' times are too close to tell apart (a busy host's interpreted run), the rate's interval reaches zero or
    below: the copy's time then has no upper bound (inf), and no value at all where the median rate is not positive."""
    high = 1e6 / per_s.low if per_s.low > 0 else math.inf
    median = 1e6 / per_s.median if per_s.median > 0 else math.nan
    return [1e6 / per_s.high if per_s.high > 0 else math.nan, median, high]


def measure(sizes=SIZES, trips=TRIPS, out: Path | str | None = None, budget_s: float = 5.0, quiet: bool = False,
            interpret: bool = False) -> pd.DataFrame:  # fmt: skip
    """Each size at each trip count: device time a call, and one copy's time from the two trip counts (the module's
    docstring) with its 95% interval; rows appended to ``out``. ``interpret``: the kernels in interpret mode (a CPU's
    check of the rows, no chip's time)."""
    log, device = Log(quiet), jax.devices()[0]
    keep, rows = chip_provenance(device), []
    lo, hi = trips[0], trips[-1]
    for nbytes in sizes:
        x = jax.device_put(jnp.ones((2 * _rows(nbytes), LANES), jnp.bfloat16), device)
        calls, programs = {}, {}
        for n in trips:
            f = jax.jit(round_trip_kernel(nbytes, n, interpret))
            jax.block_until_ready(f(x))
            calls[f"{n} trips"] = back_to_back(lambda f=f, x=x: f(x), STEPS_BACK_TO_BACK)
            programs[n] = traced_digest(f, x)
        cmp = interleaved(calls, f"{lo} trips", budget_s=budget_s, min_rounds=5)
        per_s = cmp.rate(f"{lo} trips", f"{hi} trips", hi - lo, STEPS_BACK_TO_BACK)  # copies a second
        copy = per_copy_us(per_s)
        for n in trips:
            t = cmp.times[f"{n} trips"]
            rows.append(dict(
                keep, program_digest=programs[n], nbytes=nbytes, trips=n, steps_back_to_back=STEPS_BACK_TO_BACK,
                rounds=cmp.rounds, device_us=t.median / STEPS_BACK_TO_BACK * 1e6,
                device_low_us=t.low / STEPS_BACK_TO_BACK * 1e6, device_high_us=t.high / STEPS_BACK_TO_BACK * 1e6,
                copy_us=copy[1], copy_low_us=copy[0], copy_high_us=copy[2], copy_GBps=nbytes / copy[1] / 1e3,
            ))  # fmt: skip
        log(f"one copy of {nbytes / 1024:g} KiB alone: {copy[1]:.3f} us [{copy[0]:.3f}, {copy[2]:.3f}]")
    if out is not None and rows:
        append_csv_rows(rows, Path(out), COLUMNS, "a DMA round-trip row")
    return pd.DataFrame(rows, columns=list(COLUMNS))
