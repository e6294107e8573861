"""Memory bandwidth probes, so a step time can be set against this device's own measured limit (the
fraction of the speed of light): a full sum (XLA's reduction) and a matrix-vector product (the library GEMV
a decode step's weight reads use), each streaming an array once."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

DEFAULT_PROBE_BYTES = 512 * 2**20  # far beyond any CPU cache, small beside an accelerator's memory
PROBES = {"reduce_sum": jnp.sum, "matvec": jnp.matmul}


def _probe_calls(nbytes: int, dtype=jnp.float32, device=None) -> tuple[dict, int]:
    """No-argument calls of each probe over one array of about ``nbytes`` (and a vector for the GEMV),
    and the bytes the array holds."""
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
    calls = {}
    for name, f in PROBES.items():
        f = jax.jit(f)
        calls[name] = (lambda f=f: f(x)) if name == "reduce_sum" else (lambda f=f: f(x, v))
    return calls, int(x.nbytes)


def gemv_probe(nbytes: int = DEFAULT_PROBE_BYTES, device=None, dtype=jnp.float32):
    """A no-argument call streaming an array of ``nbytes`` once through a matrix-vector product (the
    kernel a decode step's weight reads use), and the bytes it reads: to time beside a step, interleaved."""
    calls, size = _probe_calls(nbytes, dtype, device)
    return calls["matvec"], size


def probe_table(nbytes: int, dtypes: dict, budget_s: float = 20.0):
    """How fast this device streams each data type through both probes, every (dtype, probe) pair
    interleaved in one run (mk.profiling.interleaved): one row per pair with its bandwidth's median and
    95% interval in GB/s. Another data type's probe shows how fast the device streams that type through
    the same kernels (XLA:CPU's BF16 GEMV is far slower than its F32 one: the way to choose a CPU type)."""
    import pandas as pd

    from .compare import Estimate, interleaved

    calls, sizes = {}, {}
    for name, dtype in dtypes.items():
        probes, size = _probe_calls(nbytes, dtype)
        for probe, call in probes.items():
            calls[f"{name} {probe}"], sizes[f"{name} {probe}"] = call, size
    first = next(iter(calls))
    cmp = interleaved(calls, first, budget_s=budget_s, precise=lambda times: False, max_rounds=50)
    out = []
    for key in calls:
        d, p = key.split(" ")
        bw = Estimate.of([sizes[key] / t for t in cmp.raw[key]], cmp.confidence)
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
