"""The TensorCore's clock, measured on the chip (``python -m mk tpu-measure --parts clock``).

The timing model turns the megakernel's scheduled bundles into time at data/chips.csv's clock, a rate derived from
cited figures, never measured. A core issues one bundle a cycle unless it waits on a copy or a semaphore, so a kernel
that never waits is issue-bound: its device time is its bundles over the clock. :func:`resident_kernel` is such a
kernel: its operands are copied into VMEM once, before its body, which then runs a loop of ``trips`` iterations of one
kind of work (a matrix product against a resident 512 x 512 bf16 tile, the megakernel's kind of product; or vector work,
a norm's kind) without a copy. libtpu's schedule of it, compiled ahead of time (mk.measure.bundles), gives its issued
bundles; the chip gives its device time (``STEPS_BACK_TO_BACK`` calls back to back, waited on once). Two trip counts,
timed interleaved, give the clock as their bundles' difference over their times' difference (the call's fixed costs
cancel). Rows go to data/measured/tpu_clock.csv."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pandas as pd

from ..files import append_csv_rows
from ..progress import Log
from ..tpu import interpret_params
from .bundles import final_bundles, issued_bundles, parse_bundles
from .harness import CHIP_PROVENANCE, chip_provenance
from .loop import back_to_back, interleaved
from .steps import traced_digest

KINDS = ("matmul", "vector", "elementwise")
TRIPS = (2_000, 20_000)
ROWS, WIDTH = 8, 512
STEPS_BACK_TO_BACK = 10
COLUMNS = (*CHIP_PROVENANCE, "program_digest", "kind", "trips", "bundles", "steps_back_to_back", "rounds", "device_us",
           "device_low_us", "device_high_us", "bundles_over_time_GHz", "clock_GHz", "clock_low_GHz", "clock_high_GHz",
           "assumed_clock_GHz")  # fmt: skip
_COMPILE = """
from mk.measure.chip_clock import compile_resident
compile_resident({kind!r}, {trips}, {chip!r})
"""


def kernel_name(kind: str, trips: int) -> str:
    return f"resident_{kind}_{trips}"


def resident_kernel(kind: str, trips: int, interpret: bool = False):
    """A Pallas kernel of ``x [ROWS, WIDTH] f32, w [WIDTH, WIDTH] bf16`` -> ``[ROWS, WIDTH] f32`` (the module's
    docstring): ``trips`` iterations of ``kind``'s work, each on the last's result (nothing to hoist or drop);
    ``interpret``: in Pallas TPU interpret mode (a CPU's check of its values, no TPU's time)."""
    from jax.experimental import pallas as pl

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def body(w_ref, i, acc):
        if kind == "matmul":
            return jnp.dot(acc.astype(jnp.bfloat16), w_ref[...], preferred_element_type=jnp.float32) * 0.5
        if kind == "elementwise":  # the vector unit's plain arithmetic: no reduction across lanes, no transcendental
            return acc * 0.5 + 1.0
        scale = jax.lax.rsqrt(jnp.mean(acc * acc, axis=-1, keepdims=True) + 1e-6)
        return acc * scale + 1e-3

    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = jax.lax.fori_loop(0, trips, lambda i, acc: body(w_ref, i, acc), x_ref[...])

    out = jax.ShapeDtypeStruct((ROWS, WIDTH), jnp.float32)
    params = dict(interpret=interpret_params()) if interpret else {}
    return pl.pallas_call(kernel, out_shape=out, name=kernel_name(kind, trips), **params)


def _shapes():
    return (jax.ShapeDtypeStruct((ROWS, WIDTH), jnp.float32), jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.bfloat16))


def compile_resident(kind: str, trips: int, chip: str = "tpu-v5e"):
    """The kernel compiled ahead of time for ``chip`` (needs libtpu, no TPU)."""
    from ..tpu import aot_compile

    return aot_compile(resident_kernel(kind, trips), chip, *_shapes())


def scheduled_bundles(kind: str, trips: int, chip: str = "tpu-v5e") -> float:
    """Bundles one call of the kernel issues in libtpu's schedule for ``chip`` (its loop at its constant bound)."""
    text = final_bundles(_COMPILE.format(kind=kind, trips=trips, chip=chip), kernel_name(kind, trips))
    return issued_bundles(parse_bundles(text))


def measure(kinds=KINDS, trips=TRIPS, out: Path | str | None = None, assumed_hz: float | None = None,
            budget_s: float = 10.0, quiet: bool = False, interpret: bool = False,
            chip: str = "tpu-v5e") -> pd.DataFrame:  # fmt: skip
    """Each kind at each trip count: scheduled bundles (libtpu's schedule for ``chip``, the chip the kernels run on),
    device time, and the clock the two trip counts give (the module's docstring); rows appended to ``out``.
    ``interpret``: the kernels in interpret mode (a CPU's check of the rows, no TPU's clock)."""
    log, device = Log(quiet), jax.devices()[0]
    keep = chip_provenance(device)
    rows = []
    for kind in kinds:
        bundles = {n: scheduled_bundles(kind, n, chip) for n in trips}
        log(f"{kind}: scheduled bundles " + ", ".join(f"{n} trips {b:,.0f}" for n, b in bundles.items()))
        x = jnp.ones((ROWS, WIDTH), jnp.float32)
        w = (jnp.eye(WIDTH, dtype=jnp.float32) * 0.5).astype(jnp.bfloat16)
        calls, programs = {}, {}
        for n in trips:
            f = jax.jit(resident_kernel(kind, n, interpret))
            jax.block_until_ready(f(x, w))
            calls[f"{n} trips"] = back_to_back(lambda f=f: f(x, w), STEPS_BACK_TO_BACK)
            programs[n] = traced_digest(f, x, w)
        cmp = interleaved(calls, f"{trips[0]} trips", budget_s=budget_s, min_rounds=5)
        lo, hi = trips[0], trips[-1]
        clock = cmp.rate(f"{lo} trips", f"{hi} trips", bundles[hi] - bundles[lo], STEPS_BACK_TO_BACK)
        for n in trips:
            t = cmp.times[f"{n} trips"]
            rows.append(dict(
                keep, program_digest=programs[n], kind=kind, trips=n, bundles=bundles[n],
                steps_back_to_back=STEPS_BACK_TO_BACK, rounds=cmp.rounds, device_us=t.median / STEPS_BACK_TO_BACK * 1e6,
                device_low_us=t.low / STEPS_BACK_TO_BACK * 1e6, device_high_us=t.high / STEPS_BACK_TO_BACK * 1e6,
                bundles_over_time_GHz=bundles[n] / (t.median / STEPS_BACK_TO_BACK) / 1e9, clock_GHz=clock.median / 1e9,
                clock_low_GHz=clock.low / 1e9, clock_high_GHz=clock.high / 1e9,
                assumed_clock_GHz=None if assumed_hz is None else assumed_hz / 1e9,
            ))  # fmt: skip
        log(f"{kind}: clock {clock.median / 1e9:.4f} GHz [{clock.low / 1e9:.4f}, {clock.high / 1e9:.4f}]")
    if out is not None:
        append_csv_rows(rows, Path(out), COLUMNS, "a clock row")
    return pd.DataFrame(rows, columns=list(COLUMNS))
