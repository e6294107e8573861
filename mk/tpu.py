"""The TPU side of the kernel: which backend runs it, when Pallas runs in interpret mode, and
ahead-of-time compilation for TPU topologies on a machine without a TPU.

Interpret mode is chosen by backend only: on a TPU the kernel compiles with Mosaic; anywhere else
(the CPU in CI, a GPU) it runs in Pallas's TPU interpreter, which simulates DMAs, semaphores and
VMEM and, with ``detect_races``, checks every DMA against the reads and writes around it.

AOT: with libtpu installed (``jax[tpu]``), ``jax.experimental.topologies`` describes a TPU slice
without one; lowering a step inside ``jax.shard_map`` over that topology's devices and calling
``.compile()`` runs libtpu's real Mosaic compiler, which refuses bad layouts, primitives with no
TPU lowering and VMEM overflow. libtpu refuses the single-chip ``v5e:1x1`` topology, so the
smallest topology used here is ``2x2``.
"""

from __future__ import annotations

import jax
from jax.experimental.pallas import tpu as pltpu


def on_tpu() -> bool:
    return jax.default_backend() == "tpu"


def interpret_params(detect_races: bool = False):
    """``None`` (compile with Mosaic) on a TPU, else TPU interpret-mode parameters."""
    if on_tpu():
        return None
    return pltpu.InterpretParams(detect_races=detect_races)


def races_detected() -> bool:
    """Whether the interpreter saw a race in the kernels run since the last reset."""
    # No public API for this yet: the interpreter prints races and records them in this module state.
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    return ipc.races is not None and bool(ipc.races.races_found)


def reset_interpreter() -> None:
    """Clear the interpreter's simulated memory and race state (needed after an exception)."""
    pltpu.reset_tpu_interpret_mode_state()


TOPOLOGIES = {"tpu-v5e": "v5e:2x2", "tpu-v6e": "v6e:2x2"}


def topology(chip: str):
    """A TPU topology description for ``chip`` (``tpu-v5e`` or ``tpu-v6e``); needs libtpu."""
    import os

    from jax.experimental import topologies
    # libtpu takes a machine-wide lock by default; compiling ahead of time touches no TPU, so
    # several processes (parallel tests, notebooks) may hold it together.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if chip not in TOPOLOGIES:
        raise ValueError(f"no AOT topology for {chip!r}; known: {', '.join(TOPOLOGIES)}")
    try:
        return topologies.get_topology_desc(platform="tpu", topology_name=TOPOLOGIES[chip])
    except Exception as e:  # libtpu missing or refusing: say how to get it
        raise RuntimeError(f"cannot describe a {TOPOLOGIES[chip]} TPU topology ({e}); AOT compilation needs "
                           "libtpu: pip install 'jax[tpu]' matching your jax version") from e


def aot_compile(fn, chip: str, *shapes, donate_argnums=(), compiler_options: dict | None = None):
    """Compile ``fn`` (one chip's program, e.g. a decode step) for each chip of a small ``chip``
    slice, ahead of time on this machine. ``shapes`` are one chip's ``jax.ShapeDtypeStruct``s
    (pytrees); every chip gets the same (replicated) inputs, so the per-chip program is exactly
    ``fn``'s. Returns the compiled object."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    topo = topology(chip)
    mesh = Mesh(np.array(topo.devices), ("x",))
    replicated = NamedSharding(mesh, P())
    specs = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated), shapes)
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
    return jax.jit(mapped, donate_argnums=donate_argnums).lower(*specs).compile(compiler_options)


def probe_vmem(chip: str, nbytes: int = 200 * 2 ** 20) -> int | None:
    """VMEM per core of ``chip`` as libtpu's compiler states it when refusing a kernel with an
    ``nbytes`` scratch buffer (``None`` if that compiled: the VMEM is larger)."""
    import re

    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref, buf):
        buf[0:8, :] = x_ref[...]
        o_ref[...] = buf[0:8, :]

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                              scratch_shapes=[pltpu.VMEM((nbytes // 512, 128), jnp.float32)],
                              compiler_params=pltpu.CompilerParams(vmem_limit_bytes=nbytes + 2 ** 20))(x)
    try:
        aot_compile(f, chip, jax.ShapeDtypeStruct((8, 128), jnp.float32))
    except Exception as e:  # libtpu reports the refusal as a runtime error with the sizes in it
        m = re.search(r"would exceed memory \(size=(\d+)\)", str(e))
        if m is None:
            raise
        return int(m.group(1))
    return None
