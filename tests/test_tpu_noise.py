"""No libtpu start-up noise on a machine without a TPU: importing mk describes the host to libtpu
(mk.tpu.quiet_libtpu), so neither the command line, JAX's backend initialisation nor an AOT topology
prints libtpu's "could not determine TPU accelerator type" or ``E0000 ... INVALID_ARGUMENT`` lines."""

import importlib.util
import os
import subprocess
import sys

import pytest

from mk import tpu

NOISE = (
    "E0000",
    "INVALID_ARGUMENT",
    "TPU accelerator type",
    "worker hostname",
    "Logging before InitGoogle",
    "IProgress not found",
    "TPU profiler",
)

pytestmark = pytest.mark.skipif(tpu.tpu_chips_present(), reason="a TPU is attached: libtpu has real metadata")


def _user_env() -> dict[str, str]:
    # A fresh process, as a user starts one: without the host description and the shared libtpu lock this
    # test process's own `import mk` put in the environment, and with JAX free to try the TPU backend
    # (ci/test.sh sets JAX_PLATFORMS=cpu).
    drop = {*tpu._LIBTPU_HOST_VARS, "JAX_PLATFORMS", "ALLOW_MULTIPLE_LIBTPU_LOAD"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(*args: str) -> subprocess.CompletedProcess:
    # Several tests' processes may load libtpu at once (parallel tests): that is the next test's subject.
    env = {**_user_env(), "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env)


def _noise(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(n in line for n in NOISE)]


def test_cli_sol_prints_no_libtpu_noise():
    r = _run("-m", "mk", "sol", "--model", "gemma4-26b-a4b", "--chip", "tpu-v5e-8", "--context", "1024")
    assert r.returncode == 0, r.stderr
    assert _noise(r.stderr) == [], r.stderr


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (the noise is its own)")
def test_backend_start_and_aot_topology_print_no_libtpu_noise():
    work = "import jax; jax.devices(); from mk.tpu import topology; topology('tpu-v5e')"
    bare = _run("-c", "import jax; jax.devices()")  # the same start without mk: libtpu's noise is there
    if not _noise(bare.stderr):
        pytest.skip("this libtpu starts quietly on its own; mk.tpu.quiet_libtpu may no longer be needed")
    r = _run("-c", f"import mk; {work}")
    assert r.returncode == 0, r.stderr
    assert _noise(r.stderr) == [], r.stderr


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (the noise is its own)")
def test_two_processes_starting_at_once_trace_without_libtpu_noise():
    # Two notebooks start side by side: both start JAX (libtpu's machine-wide lock), then take a profiler
    # trace (notebook 02's kernel count). Without a shared lock, one of them logs "Failed to create TPU profiler".
    work = (
        "import mk, tempfile, time, jax, jax.numpy as jnp; f = jax.jit(lambda x: x * 2); f(jnp.ones(3)); "
        "time.sleep(2); d = tempfile.mkdtemp(); jax.profiler.start_trace(d); f(jnp.ones(3)).block_until_ready(); "
        "jax.profiler.stop_trace()"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", work], env=_user_env(), stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for p in procs:
        err = p.communicate(timeout=300)[1]
        assert p.returncode == 0, err
        assert _noise(err) == [], err
