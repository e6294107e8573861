"""Memory bandwidth probes, so a step time can be set against this device's own measured limit (the
fraction of the speed of light): a full sum (XLA's reduction) and a matrix-vector product (the library GEMV
a decode step's weight reads use), each streaming an array once. Timing them is mk.measure's (the loop, the
bench's probe in the step's own rounds, and ``mk.measure.cpu.dtype_table``'s ratios between data types)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

DEFAULT_PROBE_BYTES = 512 * 2**20  # far beyond any CPU cache, small beside an accelerator's memory
PROBES = {"reduce_sum": jnp.sum, "matvec": jnp.matmul}


def probe_calls(nbytes: int, dtype=jnp.float32, device=None) -> tuple[dict, int]:
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
    calls, size = probe_calls(nbytes, dtype, device)
    return calls["matvec"], size


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


def fraction_of_sol(step_s: float, bytes_per_step: float, bandwidth: float) -> float:
    """The speed of light's step time (bytes / bandwidth) over the measured step time."""
    if step_s <= 0 or bytes_per_step <= 0 or bandwidth <= 0:
        raise ValueError(
            f"step_s, bytes_per_step and bandwidth must be positive, got {step_s}, {bytes_per_step}, {bandwidth}"
        )
    return bytes_per_step / bandwidth / step_s
