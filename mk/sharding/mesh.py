"""Meshes: a one-axis mesh of C chips over the simulated CPU devices, a TPU slice's chips, several
hosts of a pod slice (after ``jax.distributed.initialize()``, ``jax.devices()`` lists every host's
chips), or a TPU topology's devices for compiling ahead of time. The same call builds each. And how the
plain-JAX reference's arrays lie on such a mesh (``gspmd_sharding``)."""

from __future__ import annotations

import os

import numpy as np

from ..units import positive_int


def make_mesh(chips: int, devices=None, axis: str = "x"):
    """A ``jax.sharding.Mesh`` of ``chips`` devices along ``axis``. ``devices``: the devices to use
    (default ``jax.devices()``, every host's in a multi-host run); their number must be ``chips``."""
    import jax
    from jax.sharding import Mesh

    positive_int("chips", chips)
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) != chips:
        kind = devices[0].platform if devices else "no"
        raise ValueError(
            f"a mesh of {chips} chips needs {chips} devices, but {len(devices)} {kind} device(s) are given. "
            f"On a CPU, call mk.sharding.simulate_chips({chips}) before JAX starts (it sets XLA_FLAGS="
            f"--xla_force_host_platform_device_count={chips} and NPROC), or pass devices=jax.devices()[:{chips}]; "
            f"on TPUs, use a slice of {chips} chips, or call jax.distributed.initialize() first on every host "
            "of a pod slice"
        )
    return Mesh(np.array(devices), (axis,))


def torus_order(devices) -> list:
    """``devices`` in the order a setup over a torus numbers its chips (mk.megakernel.collective: a torus
    dimension's group is chips ``stride`` apart, the first dimension's consecutive): by their coordinates, the first
    fastest. Devices without coordinates (the simulated CPU ones) keep their order."""
    devices = list(devices)
    if not all(hasattr(d, "coords") for d in devices):
        return devices
    return sorted(devices, key=lambda d: tuple(reversed(tuple(d.coords))))


def simulate_chips(chips: int) -> None:
    """On a machine without accelerators, have JAX's CPU backend present ``chips`` devices, each run on
    its own thread: the interpret-mode kernel's collectives need every chip in the kernel at once, and
    XLA:CPU runs at most ``NPROC`` (default: the cores) device programs together, so with fewer cores
    than chips they wait for each other forever. Call before JAX starts its backends (the first array or
    ``jax.devices()``); later it changes nothing (``make_mesh`` then says what is missing)."""
    flag = "--xla_force_host_platform_device_count"
    flags = os.environ.get("XLA_FLAGS", "")
    if flag not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}={chips}".strip()
    if int(os.environ.get("NPROC", "0") or 0) < 2 * chips:
        os.environ["NPROC"] = str(2 * chips)


def gspmd_sharding(mesh, shape: tuple[int, ...]):
    """How an array of ``shape`` lies on a one-axis ``mesh`` of C chips when XLA's GSPMD partitioner is left
    to cut the program that reads it (the reference over a slice): split on its largest axis that C divides
    (the last of equals), else replicated on every chip."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    (axis,) = mesh.axis_names
    best = None
    for i, n in enumerate(shape):
        if n % mesh.size == 0 and (best is None or n >= shape[best]):
            best = i
    return NamedSharding(mesh, P(*(axis if i == best else None for i in range(len(shape)))))
