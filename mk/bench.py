"""The decode benchmark: time an engine's compiled step at a context and batch, count its kernels,
set it against the measured speed of light, and append a row with its provenance to
``data/measured/bench.csv``.

The step is timed at position ``context - 1`` of a cache sized to ``context``, so it reads the
KV cache ``mk.sol`` counts for that context. Decode time does not depend on what the cache holds
(the shapes are fixed and masked), so the cache is left zero rather than filled by a prefill.
"""

from __future__ import annotations

import csv
import datetime
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp

from . import profiling
from .chips import DATA_DIR
from .config import Gemma4Config
from .files import write_atomic
from .sol import bytes_per_token

MEASURED_DIR = DATA_DIR / "measured"
BENCH_CSV = MEASURED_DIR / "bench.csv"
COLUMNS = (
    "date",
    "device",
    "backend",
    "jax_version",
    "engine",
    "model",
    "dtype",
    "context",
    "batch",
    "steps",
    "step_ms",
    "spread",
    "tokens_per_s",
    "tokens_per_s_total",
    "kernels_per_step",
    "bytes_per_token",
    "bandwidth_GBps",
    "sol_tokens_per_s",
    "sol_fraction",
    "weights",
)
# The data type a run's arrays use, and the mk.sol policy that counts its bytes.
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


def provenance(device=None) -> dict:
    """Where and when a measurement was taken: date (UTC), device, backend and JAX version."""
    device = device or jax.devices()[0]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": profiling.device_name(device),
        "backend": device.platform,
        "jax_version": jax.__version__,
    }


def append_row(row: dict, path: Path = BENCH_CSV) -> Path:
    """Append ``row`` to the CSV at ``path`` atomically: the whole file is rewritten to a temporary
    name in the same folder and renamed over the old one, so a crash leaves the old file or the new."""
    path = Path(path)
    missing = [c for c in COLUMNS if c not in row]
    extra = [c for c in row if c not in COLUMNS]
    if missing or extra:
        raise ValueError(f"a bench row needs exactly the columns {COLUMNS}; missing {missing}, unexpected {extra}")
    rows = []
    if path.exists():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != COLUMNS:
                raise ValueError(
                    f"{path} has columns {reader.fieldnames}, expected {list(COLUMNS)}: "
                    "move the old file aside (it was written by another version of mk)"
                )
            rows = list(reader)
    rows.append(row)

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
            f.flush()
            os.fsync(f.fileno())

    write_atomic(path, write)
    return path


@dataclass(frozen=True)
class BenchResult:
    """One benchmark run: the step timing, kernels, bytes and the measured speed of light."""

    cfg: Gemma4Config
    engine: str
    dtype: str
    context: int
    batch: int
    timing: profiling.Timing
    kernels: profiling.KernelCount
    bytes_per_token: float
    bandwidth: profiling.Bandwidth
    weights: str  # "random (seed N)" or the checkpoint's path
    provenance: dict

    @property
    def step_s(self) -> float:
        return self.timing.median_s

    @property
    def sol_fraction(self) -> float:
        return profiling.sol_fraction(self.step_s, self.bytes_per_token, self.bandwidth.best)

    def row(self) -> dict:
        sol_step = self.bytes_per_token / self.bandwidth.best
        return {
            **self.provenance,
            "engine": self.engine,
            "model": self.cfg.name,
            "dtype": self.dtype,
            "context": self.context,
            "batch": self.batch,
            "steps": len(self.timing.times_s),
            "step_ms": round(self.step_s * 1e3, 4),
            "spread": round(self.timing.spread, 4),
            "tokens_per_s": round(1 / self.step_s, 2),
            "tokens_per_s_total": round(self.batch / self.step_s, 2),
            "kernels_per_step": self.kernels.total,
            "bytes_per_token": int(self.bytes_per_token),
            "bandwidth_GBps": round(self.bandwidth.best / 1e9, 3),
            "sol_tokens_per_s": round(1 / sol_step, 2),
            "sol_fraction": round(self.sol_fraction, 4),
            "weights": self.weights,
        }

    def text(self) -> str:
        r = self.row()
        return "\n".join(
            [
                f"{r['model']} / {r['engine']} on {r['device']}, {r['dtype']}, context {r['context']}, "
                f"batch {r['batch']} (measured {r['date']}, JAX {r['jax_version']})",
                f"  step              {r['step_ms']:10.3f} ms  (median of {r['steps']}, IQR {r['spread']:.1%})",
                f"  tokens/s/user     {r['tokens_per_s']:10.1f}",
                f"  tokens/s total    {r['tokens_per_s_total']:10.1f}",
                f"  kernels per step  {r['kernels_per_step']:10.0f}  (compiled program)",
                f"  bytes per token   {r['bytes_per_token'] / 1e6:10.1f} MB  (modelled, mk.sol '{r['dtype']}')",
                f"  bandwidth         {r['bandwidth_GBps']:10.2f} GB/s  (measured, {self.bandwidth.best_probe})",
                f"  speed of light    {r['sol_tokens_per_s']:10.1f} tok/s  -> {r['sol_fraction']:.1%} reached",
            ]
        )


def decode_call(
    step,
    params: dict,
    cfg: Gemma4Config,
    context: int,
    batch: int,
    dtype: str,
    knockout=frozenset(),
    program: bool = False,
) -> Callable[[], jax.Array]:
    """A no-argument call that runs one decode step of ``batch`` users at position ``context - 1``
    of a zero cache of ``context`` positions, threading the (donated) cache from call to call.

    ``program=True`` runs the step as :func:`step_program`, kept as ``call.program``: the program
    ``compiled_kernels(call.program, *call.args())`` counts (compiled once, shared with the calls),
    and whose instruction names a profiler trace of the call shows.
    """
    from .reference import init_cache

    prepare = getattr(step, "prepare", None)
    if prepare is not None:  # the engine's own layout, made once outside the timed (and jitted) step
        params = prepare(params, cfg)
    prog = step_program(step, cfg, knockout) if program else None
    if program:

        def step(p, _cfg, cache, t, i, _knockout):
            return prog(p, cache, t, i)

    tokens = jnp.zeros((batch,), jnp.int32)
    pos = jnp.asarray(context - 1, jnp.int32)
    state = {"cache": init_cache(cfg, batch, context, DTYPES[dtype])}

    def call():
        logits, state["cache"] = step(params, cfg, state["cache"], tokens, pos, knockout)
        return logits

    call.args = lambda: (params, state["cache"], tokens, pos)  # for compiling the same step
    call.program = prog
    return call


def step_program(step, cfg: Gemma4Config, knockout=frozenset()):
    """The decode step as one jitted program with the cache donated, as an engine runs it."""
    return jax.jit(lambda p, c, t, i: step(p, cfg, c, t, i, knockout), donate_argnums=(1,))


def run_bench(
    cfg: Gemma4Config,
    context: int,
    batch: int = 1,
    steps: int = 10,
    dtype: str = "f32",
    engine: str = "reference",
    params: dict | None = None,
    weights: str | None = None,
    bandwidth: profiling.Bandwidth | None = None,
    warmup: int = 2,
    seed: int = 0,
) -> BenchResult:
    """Benchmark ``engine``'s decode step for ``cfg`` at ``context`` positions and ``batch`` users.

    ``params`` default to random weights (seeded: timing does not depend on the values);
    ``bandwidth`` to a fresh probe of this device. ``steps`` timed steps follow ``warmup`` untimed ones.
    """
    from .generate import get_step
    from .weights import random_params

    for name, v in (("context", context), ("batch", batch), ("steps", steps)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    step = get_step(engine, cfg)
    if params is None:
        params, weights = random_params(cfg, seed, DTYPES[dtype]), f"random (seed {seed})"
    call = decode_call(step, params, cfg, context, batch, dtype, program=True)
    timing = profiling.time_call(call, warmup=warmup, runs=steps)
    kernels = profiling.compiled_kernels(call.program, *call.args())
    bandwidth = bandwidth or profiling.measure_bandwidth()
    return BenchResult(
        cfg,
        engine,
        dtype,
        context,
        batch,
        timing,
        kernels,
        bytes_per_token(cfg, context, batch, dtype).total,
        bandwidth,
        weights or "given",
        provenance(),
    )
