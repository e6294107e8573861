"""Memory bandwidth probes, so a step time can be set against this device's own measured limit (the
fraction of the speed of light): a full sum (XLA's reduction) and a matrix-vector product (the library GEMV
a decode step's weight reads use), each streaming an array once. Timing them is mk.measure's (the loop, the
bench's probe in the step's own rounds, and ``mk.measure.cpu.dtype_table``'s ratios between data types); on a TPU also a
Pallas kernel that streams an array through VMEM with copies in flight, as the megakernel streams its weights
(``dma_stream_call``), for the chip's read rate (mk.measure.hbm)."""

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


def dma_stream_call(nbytes: int, chunk_bytes: int, in_flight: int, device=None, interpret=None, streams: int = 1):
    """A Pallas kernel that reads an HBM array of about ``nbytes`` once into VMEM, ``chunk_bytes`` a copy with
    ``in_flight`` copies outstanding (each chunk's wait followed by the next copy's start, as the megakernel streams its
    weights), touching a vector of every chunk; and the bytes it reads. With ``streams`` > 1 the array is that many
    far-apart regions read side by side, one chunk of each in turn (several DMA streams at once). ``interpret``: Pallas
    TPU interpreter parameters (off a TPU). A no-argument call, to time."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    cols = 1024  # bf16: 2 KiB a row
    rows = chunk_bytes // (2 * cols)
    chunks = nbytes // (rows * 2 * cols)
    chunks -= chunks % streams  # each region the same chunks
    if rows < 16 or rows % 16 or chunks < in_flight or in_flight < 1 or streams < 1:
        raise ValueError(
            f"a DMA stream needs chunks of whole 16-row tiles ({chunk_bytes} bytes a chunk gives {rows} rows of "
            f"{cols} bf16), at least as many chunks as copies in flight ({chunks} < {in_flight}) and a stream or more"
        )
    per_stream = chunks // streams
    device = device or jax.devices()[0]
    x = jax.device_put(jnp.ones((chunks * rows, cols), jnp.bfloat16), device)

    def kernel(x_hbm, out, buf, sems):
        def copy(i):
            slot, start = i % in_flight, ((i % streams) * per_stream + i // streams) * rows  # region i % streams
            return pltpu.make_async_copy(x_hbm.at[pl.ds(start, rows)], buf.at[slot], sems.at[slot])

        for i in range(in_flight):
            copy(i).start()

        def body(i, acc):
            copy(i).wait()
            acc = acc + buf[i % in_flight, 0:16, 0:128].astype(jnp.float32)

            @pl.when(i + in_flight < chunks)
            def _():
                copy(i + in_flight).start()

            return acc

        out[...] = jax.lax.fori_loop(0, chunks, body, jnp.zeros((16, 128), jnp.float32))

    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
        scratch_shapes=[pltpu.VMEM((in_flight, rows, cols), jnp.bfloat16), pltpu.SemaphoreType.DMA((in_flight,))],
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=in_flight * chunk_bytes + 8 * 2**20),
        **(dict(interpret=interpret) if interpret is not None else {}),
    )
    f = jax.jit(call)
    return (lambda: f(x)), int(x.nbytes)


def cache_tiles_call(nbytes: int, groups: int, tile: int, in_flight: int = 2, device=None, interpret=None, lanes=128):
    """A Pallas kernel that reads a K and a V cache of about ``nbytes`` together as the megakernel's attention does:
    each cache [groups, positions, lanes] bf16, a tile the ``tile`` positions of every group (``groups`` blocks of
    ``tile`` x ``lanes``, a whole row of positions apart), the K and the V tile of one step in flight together,
    ``in_flight`` tiles deep; and the bytes it reads. A no-argument call, to time."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    tile_bytes = groups * tile * lanes * 2
    tiles = nbytes // (2 * tile_bytes)
    if tile % 16 or lanes % 128 or tiles < in_flight or in_flight < 1:
        raise ValueError(
            f"cache tiles need whole 16-position tiles of whole 128-lane groups, and at least as many tiles as are in "
            f"flight: {tile} positions x {lanes} lanes, {tiles} tiles, {in_flight} in flight"
        )
    device = device or jax.devices()[0]
    k, v = (jax.device_put(jnp.ones((groups, tiles * tile, lanes), jnp.bfloat16), device) for _ in range(2))

    def kernel(k_hbm, v_hbm, out, kbuf, vbuf, sems):
        def copies(i):
            slot, at = i % in_flight, pl.ds(pl.multiple_of(i * tile, tile), tile)
            return (pltpu.make_async_copy(k_hbm.at[:, at, :], kbuf.at[slot], sems.at[0, slot]),
                    pltpu.make_async_copy(v_hbm.at[:, at, :], vbuf.at[slot], sems.at[1, slot]))  # fmt: skip

        for i in range(in_flight):
            for c in copies(i):
                c.start()

        def body(i, acc):
            for c in copies(i):
                c.wait()
            slot = i % in_flight
            acc = acc + (kbuf[slot, 0, 0:16, 0:128] + vbuf[slot, 0, 0:16, 0:128]).astype(jnp.float32)

            @pl.when(i + in_flight < tiles)
            def _():
                for c in copies(i + in_flight):
                    c.start()

            return acc

        out[...] = jax.lax.fori_loop(0, tiles, body, jnp.zeros((16, 128), jnp.float32))

    scratch = [pltpu.VMEM((in_flight, groups, tile, lanes), jnp.bfloat16) for _ in range(2)]
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)] * 2,
        scratch_shapes=[*scratch, pltpu.SemaphoreType.DMA((2, in_flight))],
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=2 * in_flight * tile_bytes + 8 * 2**20),
        **(dict(interpret=interpret) if interpret is not None else {}),
    )
    f = jax.jit(call)
    return (lambda: f(k, v)), int(k.nbytes + v.nbytes)


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
