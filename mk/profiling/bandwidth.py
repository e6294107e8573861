"""A memory bandwidth probe, so a step time can be set against this device's own measured limit (the
fraction of the speed of light)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from .timing import time_call

DEFAULT_PROBE_BYTES = 512 * 2**20  # far beyond any CPU cache, small beside an accelerator's memory


@dataclass(frozen=True)
class Bandwidth:
    """Read bandwidth measured on one device: the best of several kernels that stream an array once."""

    device: str
    nbytes: int
    by_probe: dict[str, float]  # bytes/s, best run of each probe

    @property
    def best(self) -> float:
        return max(self.by_probe.values())

    @property
    def best_probe(self) -> str:
        return max(self.by_probe, key=self.by_probe.get)

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "nbytes": self.nbytes,
            "bandwidth_Bps": self.best,
            "best_probe": self.best_probe,
            "by_probe_Bps": dict(self.by_probe),
            "kind": "measured (best of runs of each probe)",
        }


def measure_bandwidth(nbytes: int = DEFAULT_PROBE_BYTES, runs: int = 5, device=None, dtype=jnp.float32) -> Bandwidth:
    """Measure how fast this device reads memory, in bytes/s.

    Two read-only kernels over an array of ``nbytes`` (f32 by default): a full sum (XLA's reduction) and a
    matrix-vector product (the library GEMV a decode step's weight reads use). Each probe's best
    run counts, and the better probe is the device's measured limit: taking the best keeps the
    fraction of the speed of light computed against it honest (never flattered by a slow probe).
    Another ``dtype`` measures how fast the device streams that type through the same kernels
    (XLA:CPU's BF16 GEMV is far slower than its F32 one: the way to choose a CPU data type).
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 2**20:
        raise ValueError(
            f"nbytes must be an integer of at least 1 MiB (use hundreds of MiB so the array "
            f"does not fit in a cache), got {nbytes!r}"
        )
    device = device or jax.devices()[0]
    cols = 4096
    rows = max(1, nbytes // (jnp.dtype(dtype).itemsize * cols))
    x = jax.device_put(jnp.ones((rows, cols), dtype), device)
    v = jax.device_put(jnp.ones((cols,), dtype), device)
    probes = {"reduce_sum": (jax.jit(jnp.sum), (x,)), "matvec": (jax.jit(jnp.matmul), (x, v))}
    by_probe = {}
    for name, (f, args) in probes.items():
        t = time_call(lambda: f(*args), warmup=1, runs=runs)
        by_probe[name] = x.nbytes / t.min_s
    return Bandwidth(device_name(device), int(x.nbytes), by_probe)


def gemv_probe(nbytes: int = DEFAULT_PROBE_BYTES, device=None, dtype=jnp.float32):
    """A no-argument call streaming an array of ``nbytes`` once through a matrix-vector product (the
    kernel a decode step's weight reads use), and the bytes it reads: to time beside a step, interleaved."""
    device = device or jax.devices()[0]
    cols = 4096
    rows = max(1, nbytes // (jnp.dtype(dtype).itemsize * cols))
    x = jax.device_put(jnp.ones((rows, cols), dtype), device)
    v = jax.device_put(jnp.ones((cols,), dtype), device)
    f = jax.jit(jnp.matmul)
    return (lambda: f(x, v)), int(x.nbytes)


def device_name(device=None) -> str:
    """A readable name for a device; for a CPU, the processor model and its core count."""
    device = device or jax.devices()[0]
    if device.platform != "cpu":
        return f"{device.platform}: {device.device_kind}"
    model = "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu: {model} ({os.cpu_count()} cores)"


def sol_fraction(step_s: float, bytes_per_step: float, bandwidth: float) -> float:
    """The speed of light's step time (bytes / bandwidth) over the measured step time."""
    if step_s <= 0 or bytes_per_step <= 0 or bandwidth <= 0:
        raise ValueError(
            f"step_s, bytes_per_step and bandwidth must be positive, got {step_s}, {bytes_per_step}, {bandwidth}"
        )
    return bytes_per_step / bandwidth / step_s


def probe_table(nbytes: int, dtypes: dict, budget_s: float = 20.0):
    """How fast this device streams each data type through both probes (a full sum, a GEMV), every
    (dtype, probe) pair interleaved in one run (mk.profiling.interleaved): one row per pair with its
    bandwidth's median and 95% interval, in bytes/s."""
    import pandas as pd

    from .compare import Estimate, interleaved

    calls, sizes = {}, {}
    for name, dtype in dtypes.items():
        cols = 4096
        rows = max(1, nbytes // (jnp.dtype(dtype).itemsize * cols))
        x, v = jnp.ones((rows, cols), dtype), jnp.ones((cols,), dtype)
        for probe, f, args in (("reduce_sum", jax.jit(jnp.sum), (x,)), ("matvec", jax.jit(jnp.matmul), (x, v))):
            calls[(name, probe)] = lambda f=f, args=args: f(*args)
            sizes[(name, probe)] = x.nbytes
    keys = list(calls)
    cmp = interleaved(
        {f"{d} {p}": calls[(d, p)] for d, p in keys},
        f"{keys[0][0]} {keys[0][1]}",
        budget_s=budget_s,
        precise=lambda times: False,
        max_rounds=50,
    )
    out = []
    for d, p in keys:
        bw = Estimate.of([sizes[(d, p)] / t for t in cmp.raw[f"{d} {p}"]], cmp.confidence)
        out.append(
            dict(
                dtype=d,
                probe=p,
                GBps=bw.median / 1e9,
                low_GBps=bw.low / 1e9,
                high_GBps=bw.high / 1e9,
                rounds=cmp.rounds,
            )
        )
    return pd.DataFrame(out)
