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

Start-up noise: on a machine with no TPU, loading libtpu (JAX's backend initialisation tries the TPU
when libtpu is installed; :func:`topology` always loads it) asks the TPU VM's metadata for the host's
accelerator type and worker host names and, finding none, prints "could not determine TPU accelerator
type" and an ``E0000 ... INVALID_ARGUMENT`` line to stderr before its logging starts, so no log level
quiets them. :func:`quiet_libtpu`, called when ``mk`` is imported, describes this host to libtpu as the
single host it is instead; on a TPU VM it changes nothing.

Every use of JAX internals that a JAX upgrade may change is in this module (:func:`races_detected`);
tests/test_tpu.py fails loudly when one changes.

JAX is imported inside the functions: ``import mk`` stays light (the command line needs no JAX).
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips are PCI devices of Google's vendor id
# Google PCI devices that are not TPUs (gVNIC network, NVMe disks); any other Google device counts as a
# TPU, so a TPU generation newer than this list is never mistaken for no TPU.
_GOOGLE_NON_TPU_DEVICES = {"0x0042", "0x001f"}
# Variables that describe the TPU host to libtpu; if the user set any, they are theirs.
_LIBTPU_HOST_VARS = (
    "TPU_ACCELERATOR_TYPE",
    "TPU_HOST_BOUNDS",
    "TPU_WORKER_HOSTNAMES",
    "TPU_PROCESS_ADDRESSES",
    "TPU_WORKER_ID",
    "TPU_CHIPS_PER_HOST_BOUNDS",
)

# A TPU's ``device_kind`` as libtpu names each generation -> its row in data/chips.csv (the names JAX's own
# table uses: jax._src.pallas.mosaic.tpu_info); a generation not listed is no known chip.
DEVICE_KINDS = {
    "TPU v5 lite": "tpu-v5e",
    "TPU v5e": "tpu-v5e",
    "TPU v6 lite": "tpu-v6e",
    "TPU v6e": "tpu-v6e",
    "TPU7x": "tpu-v7x",
    "TPU v5": "tpu-v5p",  # as libtpu 0.0.42.1's v5p topologies name their devices
    "TPU v5p": "tpu-v5p",
    "TPU v4": "tpu-v4",
}


def tpu_chips_present() -> bool:
    """Whether this machine may have a TPU chip attached (an ``/dev/accel*`` node, or a Google PCI
    device other than a network card or disk), read from the file system without loading JAX or libtpu."""
    if glob.glob("/dev/accel*"):
        return True
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if Path(vendor).read_text().strip() != GOOGLE_PCI_VENDOR:
                continue
            device = (Path(vendor).parent / "device").read_text().strip()
        except OSError:
            return True  # unreadable: assume a TPU, and leave libtpu's start-up alone
        if device not in _GOOGLE_NON_TPU_DEVICES:
            return True
    return False


def quiet_libtpu() -> None:
    """On a machine with no TPU, tell libtpu it runs on one host (``TPU_HOST_BOUNDS=1,1,1``,
    ``TPU_WORKER_HOSTNAMES=localhost``), so loading it prints no accelerator-type warning and no
    ``E0000 ... INVALID_ARGUMENT`` line; it needs nothing else to compile ahead of time; and lets processes share
    libtpu (``ALLOW_MULTIPLE_LIBTPU_LOAD``), as no TPU needs guarding. Must run before
    libtpu loads (``mk/__init__`` calls it). Does nothing on a TPU VM (the VM's metadata describes it),
    nor when the user describes the host or forces TPU initialisation themselves. Platform choice
    (``JAX_PLATFORMS``) is left alone."""
    if tpu_chips_present() or "JAX_FORCE_TPU_INIT" in os.environ:
        return
    # Two processes starting JAX at once (notebooks run side by side) contend for libtpu's machine-wide lock,
    # and the loser's profiler later prints "Failed to create TPU profiler" errors; with no TPU to guard, share it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if any(v in os.environ for v in _LIBTPU_HOST_VARS):
        return
    os.environ["TPU_HOST_BOUNDS"] = "1,1,1"
    os.environ["TPU_WORKER_HOSTNAMES"] = "localhost"


def on_tpu() -> bool:
    import jax

    return jax.default_backend() == "tpu"


def libtpu_version() -> str:
    """The installed libtpu's version (its package was libtpu-nightly before libtpu), "none" without one."""
    from importlib import metadata

    for name in ("libtpu", "libtpu-nightly"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "none"


def host_device():
    """This host's first CPU device, or ``None`` where JAX runs without its CPU backend (JAX_PLATFORMS=tpu)."""
    import jax

    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        return None


def interpret_params(detect_races: bool = False):
    """``None`` (compile with Mosaic) on a TPU, else TPU interpret-mode parameters. DMAs run when started, as a
    chip's do: the interpreter's default runs one only when something waits on its semaphore, so a DMA started and
    never waited on (which halts a chip's core) never signals and goes unseen (:func:`semaphores_left`)."""
    if on_tpu():
        return None
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.InterpretParams(detect_races=detect_races, dma_execution_mode="eager")


def races_detected() -> bool:
    """Whether Pallas's TPU interpreter saw a race in the kernels run with ``detect_races`` since the
    last :func:`reset_interpreter`.

    JAX has no public API for this: the interpreter prints each race and records it in its module
    state (``interpret_pallas_call.races``, ``None`` until a race-checking kernel runs, then an object
    whose ``races_found`` is a bool). This is the only place mk reads it; if a JAX version moves or
    reshapes it, this raises a RuntimeError naming that version rather than answering wrongly."""
    import jax

    where = "jax._src.pallas.mosaic.interpret.interpret_pallas_call.races"
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    except ImportError as e:
        raise RuntimeError(
            f"mk.tpu.races_detected: JAX {jax.__version__} has no {where.rsplit('.', 1)[0]} "
            f"({e}); the race record moved, update mk/tpu.py for this JAX version"
        ) from e
    if not hasattr(ipc, "races"):
        raise RuntimeError(
            f"mk.tpu.races_detected: JAX {jax.__version__} has no {where}; the interpreter's "
            "race record moved, update mk/tpu.py for this JAX version"
        )
    state = ipc.races
    if state is None:
        return False
    found = getattr(state, "races_found", None)
    if not isinstance(found, bool):
        raise RuntimeError(
            f"mk.tpu.races_detected: in JAX {jax.__version__}, {where} is a "
            f"{type(state).__name__} whose races_found is {found!r}, not a bool; the race "
            "record changed shape, update mk/tpu.py for this JAX version"
        )
    return found


# Pallas's TPU interpreter prints this line (it does not raise) for each semaphore a kernel leaves nonzero at its exit,
# a DMA started and never waited on, say, where a real chip's core halts: JAX's wording, read here only
_LEFT_NONZERO = re.compile(r"^Semaphore \S+ has non-zero count for .* at kernel exit.*$", re.MULTILINE)


def semaphores_left(output: str) -> list[str]:
    """The interpreter's lines in ``output`` (a kernel's printed output) for semaphores it left nonzero at its exit."""
    return _LEFT_NONZERO.findall(output)


def reset_interpreter() -> None:
    """Clear the interpreter's simulated memory and race state (needed after an exception)."""
    from jax.experimental.pallas import tpu as pltpu

    pltpu.reset_tpu_interpret_mode_state()


# A chip compiles as one of a 2x2 slice (libtpu refuses 1x1; a v5p's is 2x2x1, a host's four); a slice of 8 as the 2x4
# it is.
TOPOLOGIES = {
    "tpu-v5e": "v5e:2x2",
    "tpu-v6e": "v6e:2x2",
    "tpu-v5p": "v5p:2x2x1",
    "tpu-v5e-8": "v5e:2x4",
    "tpu-v6e-8": "v6e:2x4",
}


def topology(chip: str):
    """A TPU topology description for ``chip``: ``tpu-v5e``, ``tpu-v6e`` or their 8-chip slices (:data:`TOPOLOGIES`),
    or a topology as libtpu names it (``v5e:4x4``, ``v5p:2x2x2``; past one host too: its devices carry each host's
    ``process_index``); needs libtpu."""
    from jax.experimental import topologies

    # libtpu takes a machine-wide lock by default; compiling ahead of time touches no TPU, so
    # several processes (parallel tests, notebooks) may hold it together.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if chip not in TOPOLOGIES and ":" not in chip:
        raise ValueError(f"no AOT topology for {chip!r}; known: {', '.join(TOPOLOGIES)}, or a name like v5e:4x4")
    name = TOPOLOGIES.get(chip, chip)
    try:
        return topologies.get_topology_desc(platform="tpu", topology_name=name)
    except Exception as e:  # libtpu missing or refusing: say how to get it
        raise RuntimeError(
            f"cannot describe a {name} TPU topology ({e}); AOT compilation needs "
            "libtpu: pip install 'jax[tpu]' matching your jax version"
        ) from e


def aot_compile(fn, chip: str, *shapes, donate_argnums=(), compiler_options: dict | None = None):
    """Compile ``fn`` (one chip's program, e.g. a decode step) for each chip of a small ``chip``
    slice, ahead of time on this machine. ``shapes`` are one chip's ``jax.ShapeDtypeStruct``s
    (pytrees); every chip gets the same (replicated) inputs, so the per-chip program is exactly
    ``fn``'s. Returns the compiled object."""
    return aot_trace(fn, chip, *shapes, donate_argnums=donate_argnums).lower().compile(compiler_options)


def aot_trace(fn, chip: str, *shapes, donate_argnums=()):
    """What :func:`aot_compile` compiles, traced only (a ``jax.stages.Traced``: its jaxpr, no compile)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    topo = topology(chip)
    mesh = Mesh(np.array(topo.devices), ("x",))
    replicated = NamedSharding(mesh, P())
    specs = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated), shapes)
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
    return jax.jit(mapped, donate_argnums=donate_argnums).trace(*specs)


def probe_vmem(chip: str, nbytes: int = 200 * 2**20) -> int | None:
    """VMEM per core of ``chip`` as libtpu's compiler states it when refusing a kernel with an
    ``nbytes`` scratch buffer (``None`` if that compiled: the VMEM is larger)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, o_ref, buf):
        buf[0:8, :] = x_ref[...]
        o_ref[...] = buf[0:8, :]

    def f(x):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            scratch_shapes=[pltpu.VMEM((nbytes // 512, 128), jnp.float32)],
            compiler_params=pltpu.CompilerParams(vmem_limit_bytes=nbytes + 2**20),
        )(x)

    try:
        aot_compile(f, chip, jax.ShapeDtypeStruct((8, 128), jnp.float32))
    except Exception as e:  # libtpu reports the refusal as a runtime error with the sizes in it
        m = re.search(r"would exceed memory \(size=(\d+)\)", str(e))
        if m is None:
            raise
        return int(m.group(1))
    return None


def start_multi_host() -> int:
    """Start JAX's multi-controller runtime (``jax.distributed.initialize()``, which on a TPU slice finds the other
    hosts from the TPU VM's metadata), so that ``jax.devices()`` lists every host's chips; every host must run the
    same program. Returns the number of processes; refuses, in one line, where none is started or there is only
    this one (nothing to join). Call before anything else touches JAX's devices."""
    import jax

    try:
        jax.distributed.initialize()
    except Exception as e:  # no slice to join (no TPU VM metadata, no coordinator given)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"--multi-host: JAX's multi-controller runtime did not start ({first}); run the same command on every "
            "host of a multi-host TPU slice (gcloud compute tpus tpu-vm ssh NAME --worker=all --command=...), or "
            "leave --multi-host out on one host"
        ) from None
    if jax.process_count() == 1:
        jax.distributed.shutdown()
        raise ValueError("--multi-host: this is the only process (a one-host slice); leave --multi-host out")
    return jax.process_count()
